"""Every objective family for the same CPU time (Cramming-style): which one does a fixed amount
of training time best buy, held out and downstream?

    .venv/bin/python benchmarks/budget.py [--budget-s 150] [--only mlm electra] [--seed 0]
    .venv/bin/python benchmarks/budget.py --merge a.log b.log   # `--only` runs' output, joined
    .venv/bin/python benchmarks/budget.py --only mlm --budget-s 1 --warm-steps 2 \
        --calibration-steps 2 --tasks builtin_order --shards DIR --runs-dir DIR --no-publish \
        --eval-overrides eval.epochs=1 eval.task.train_size=32   # a smoke run (the tests')

Each family trains the `make demo` encoder size (64 features, 2 layers; ELECTRA's
discriminator at the same sizes, its own encoder class) at the demo's batch, sequence length
and warm-up, on the built-in corpus minus its last shard, for the same time on one thread:
its seconds per optimizer step are measured first (`--calibration-steps` after a start-up of
`--warm-steps`, read from `train/elapsed_s`), then it trains `budget / (seconds per step)` steps
with its schedule fitted to them, so a family whose step costs twice as much (ELECTRA runs a
generator too) trains half the steps. Scored:
- held out: the objective's own MLM cross-entropy on that shard (`val/mlm_loss`; ELECTRA's is
  its small generator's, SpanBERT's is over its span masks, MLM + NSP's over sentence pairs:
  compare within a kind);
- downstream: the exported encoder on `make demo-eval`'s tasks with its two recipes,
  fine-tuned and as a frozen probe (pretrain.eval.demo; one seed), pretrained − random
  weights of the same architecture, accuracy points.

Measure on a quiet machine: a family calibrated while other work runs gets fewer steps. The
table and a PNG (benchmarks/figures/budget.png) go into benchmarks/RESULTS.md between the
`budget` markers. On 2 cores, two processes of `--only` (two families each, one per core)
take half the time; each prints a JSON line per family, and `--merge` writes the table and
figure from their saved output. `compare_objectives.py` compares more masking variants at another recipe
(MLM accuracy only); `bench_budget.py` is about the static prediction budget's step time.
"""

import argparse
import json
import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from pretrain.config import compose_config
from pretrain.eval.compare import read_metrics
from pretrain.eval.demo import DEMO_TASKS, INITS, RECIPES, compare

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "builtin"
RUNS = ROOT / "runs" / "budget"
FIGURE = ROOT / "benchmarks" / "figures" / "budget.png"
# (name, objective, data format, overrides): the families, each with the input it was made for
FAMILIES = [
    ("MLM (RoBERTa-style)", "mlm", "full_sentences", []),
    ("MLM + NSP (BERT)", "mlm_nsp", "segment_pair", []),
    # a half-width generator at a third of the demo's rate: at a quarter width and 3e-3 the
    # discriminator called every token original (RESULTS, "A third task for issue 37")
    (
        "ELECTRA (replaced-token detection)",
        "electra",
        "full_sentences",
        [
            "model=electra_tiny",
            "model.embedding_size=64",
            "objective.generator_size_fraction=0.5",
            "optim.optimizer.lr=1e-3",
        ],
    ),
    ("SpanBERT (span masking + SBO)", "span", "full_sentences", []),
]
WARM_STEPS, CALIBRATION_STEPS = 20, 60
BEGIN, END = "<!-- budget:begin -->", "<!-- budget:end -->"


def last_value(run_dir: Path, key: str) -> float:
    """The last logged value of `key` in a run's CSV logs."""
    values = read_metrics(run_dir).get(key)
    if not values:
        raise SystemExit(f"{run_dir}: no {key} logged")
    return values[max(values)]


def family_config(
    objective: str, fmt: str, overrides: list[str], shards: Path, run_dir: Path, steps: int
):
    """The demo's training config for one family on `shards` (its last shard held out),
    `steps` optimizer steps into `run_dir` (emptied first)."""
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier run's logs would join this one's
    return compose_config(
        [
            "experiment=demo",
            f"objective={objective}",
            f"data={fmt}",
            f"data.shards_dir={shards}",
            "data.holdout_shards=1",
            f"run_dir={run_dir}",
            "resume=never",
            "logger=csv",
            f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}",
            f"trainer.checkpoint_every_n_steps={steps}",
            "trainer.enable_progress_bar=false",
            "trainer.num_threads=1",
            *overrides,
        ]
    )


def seconds_per_step(
    objective: str,
    fmt: str,
    overrides: list[str],
    shards: Path,
    runs: Path,
    warm_steps: int = WARM_STEPS,
    calibration_steps: int = CALIBRATION_STEPS,
) -> float:
    """A family's training seconds per optimizer step, between its `warm_steps`-th step and
    `calibration_steps` later (start-up, the first loader and validation left out); its
    calibration run goes under `runs/calibration`."""
    from pretrain.runtime.run import train

    run_dir = runs / "calibration" / objective
    total = warm_steps + calibration_steps
    every = math.gcd(warm_steps, calibration_steps)  # both ends logged (20 by default)
    logged = [*overrides, f"trainer.log_every_n_steps={every}"]
    train(family_config(objective, fmt, logged, shards, run_dir, total + 1))
    elapsed = read_metrics(run_dir)["train/elapsed_s"]
    first, last = warm_steps - 1, total - 1
    return (elapsed[last] - elapsed[first]) / (last - first)


def pretrain_family(
    objective: str, fmt: str, overrides: list[str], steps: int, shards: Path, run_dir: Path
) -> Path:
    """Train one family for `steps` steps into `run_dir`; returns its exported encoder's
    directory."""
    from pretrain.export import export_checkpoint
    from pretrain.runtime.run import train

    train(family_config(objective, fmt, overrides, shards, run_dir, steps))
    return export_checkpoint(run_dir / "checkpoints" / "last.ckpt", run_dir / "hf", overwrite=True)


def margins(
    encoder: Path, seed: int, tasks: Sequence[str] = DEMO_TASKS, extra: Sequence[str] = ()
) -> dict[str, dict[str, tuple[float, float]]]:
    """{mode: {task: (pretrained, random) dev accuracy}} with `make demo-eval`'s recipes, then
    the Hydra overrides `extra` (e.g. `eval.epochs=1` for a smoke run)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    overrides = [f"encoder.path={encoder}", "wandb=never", *extra]
    for mode in RECIPES:
        out[mode] = {}
        for task in tasks:
            results = compare(task, overrides, mode, seed)
            out[mode][task] = tuple(results[init]["metrics"]["accuracy"] for init in INITS)
    return out


def scored_tasks(results: list[dict]) -> list[str]:
    """The downstream tasks the results were scored on, in their order (DEMO_TASKS unless
    `--tasks` chose others)."""
    return list(results[0]["eval"][next(iter(RECIPES))]) if results else list(DEMO_TASKS)


def table(results: list[dict], budget_s: float, seed: int) -> str:
    """The Markdown table (with its caption) of the families' results."""
    tasks = scored_tasks(results)
    short = [t.removeprefix("builtin_") for t in tasks]
    columns = [f"{t} ({m})" for m in RECIPES for t in short]
    lines = [
        f"{budget_s:.0f} s of training per family on one thread (its steps from its measured "
        "time per step; `trained s`: its logged training time, epoch ends and validation "
        "included); held out: the built-in corpus's last shard; downstream: dev accuracy "
        f"points pretrained − random weights, seed {seed} (`make demo-eval`'s recipes).",
        "",
        f"| family | steps | s/step | trained s | held-out MLM loss | {' | '.join(columns)} |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(columns),
    ]
    for r in results:
        cells = [
            f"{100 * (p - q):+.1f}" for m in RECIPES for p, q in (r["eval"][m][t] for t in tasks)
        ]
        lines.append(
            f"| {r['name']} | {r['steps']} | {r['s_per_step']:.3f} | {r['trained_s']:.0f} | "
            f"{r['mlm_loss']:.3f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def figure(results: list[dict], path: Path) -> None:
    """Held-out loss, and each mode's margins over random weights, one bar per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(RECIPES), figsize=(14, 4))
    axes[0].barh([r["name"] for r in results], [r["mlm_loss"] for r in results])
    axes[0].set_xlabel("held-out MLM loss (nats; lower is better)")
    width = 0.8 / len(results)
    tasks = scored_tasks(results)
    short = [t.removeprefix("builtin_") for t in tasks]
    for axis, mode in zip(axes[1:], RECIPES, strict=True):
        for i, r in enumerate(results):
            values = [100 * (p - q) for p, q in (r["eval"][mode][t] for t in tasks)]
            axis.bar([t + i * width for t in range(len(short))], values, width, label=r["name"])
        axis.axhline(10, color="grey", linestyle="--", linewidth=0.8)
        axis.set_xticks([t + 0.4 - width / 2 for t in range(len(short))], short, fontsize=8)
        axis.set_ylabel(f"{mode}: pretrained − random (accuracy points)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget-s", type=float, default=150.0, help="training seconds each")
    parser.add_argument("--only", nargs="*", help="objectives to run (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the downstream fits' seed")
    parser.add_argument("--merge", nargs="+", type=Path, help="`--only` runs' saved output")
    parser.add_argument("--shards", type=Path, default=CORPUS, help="the prepared corpus")
    parser.add_argument("--runs-dir", type=Path, default=RUNS, help="the families' runs")
    parser.add_argument("--warm-steps", type=int, default=WARM_STEPS, help="before timing")
    parser.add_argument("--calibration-steps", type=int, default=CALIBRATION_STEPS)
    parser.add_argument("--tasks", nargs="+", default=list(DEMO_TASKS), help="downstream")
    parser.add_argument(
        "--eval-overrides", nargs="+", default=[], help="Hydra overrides of every fit"
    )
    parser.add_argument(
        "--no-publish", action="store_true", help="print the table only (no RESULTS.md, PNG)"
    )
    args = parser.parse_args()
    if min(args.warm_steps, args.calibration_steps) < 1:
        parser.error("--warm-steps and --calibration-steps must be at least 1")
    if args.merge:
        results, budget_s, seed = merged(args.merge)
        if args.no_publish:
            print(table(results, budget_s, seed))
        else:
            publish(results, budget_s, seed)
        return
    results = []
    for name, objective, fmt, overrides in FAMILIES:
        if args.only and objective not in args.only:
            continue
        s_per_step = seconds_per_step(
            objective,
            fmt,
            overrides,
            args.shards,
            args.runs_dir,
            args.warm_steps,
            args.calibration_steps,
        )
        steps = max(args.warm_steps, round(args.budget_s / s_per_step))
        run_dir = args.runs_dir / objective
        encoder = pretrain_family(objective, fmt, overrides, steps, args.shards, run_dir)
        result = {
            "name": name,
            "steps": steps,
            "s_per_step": s_per_step,
            "mlm_loss": last_value(run_dir, "val/mlm_loss"),
            "trained_s": last_value(run_dir, "train/elapsed_s"),
            "eval": margins(encoder, args.seed, args.tasks, args.eval_overrides),
            "budget_s": args.budget_s,
            "seed": args.seed,
        }
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.only or args.no_publish:
        print(table(results, args.budget_s, args.seed))
    else:
        publish(results, args.budget_s, args.seed)


def publish(results: list[dict], budget_s: float, seed: int) -> None:
    """Print the table, draw the figure and put both into RESULTS.md between the markers."""
    text = table(results, budget_s, seed)
    print(text)
    figure(results, FIGURE)
    path = ROOT / "benchmarks" / "RESULTS.md"
    current = path.read_text()
    block = f"{BEGIN}\n{text}\n\n![budget](figures/{FIGURE.name})\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(
        pattern.sub(block, current) if BEGIN in current else current + "\n" + block + "\n"
    )


def merged(logs: list[Path]) -> tuple[list[dict], float, int]:
    """(results in FAMILIES' order, budget seconds, seed) from the JSON lines that `--only`
    runs printed among their other output; refused when a family comes twice or the runs'
    budgets or seeds differ."""
    results = [
        json.loads(line)
        for log in logs
        for line in log.read_text(encoding="utf-8").splitlines()
        if line.startswith('{"name": ')
    ]
    names = [r["name"] for r in results]
    order = [name for name, *_ in FAMILIES]
    if not names or len(set(names)) < len(names) or not set(names) <= set(order):
        raise SystemExit(f"--merge: families {names}: each must be one of {order}, once")
    settings = {(r.get("budget_s"), r.get("seed")) for r in results}
    if len(settings) != 1 or None in next(iter(settings)):
        raise SystemExit(
            f"--merge: the runs' (budget seconds, seed) must be given and equal: {settings}"
        )
    budget_s, seed = settings.pop()
    return sorted(results, key=lambda r: order.index(r["name"])), budget_s, seed


if __name__ == "__main__":
    main()
