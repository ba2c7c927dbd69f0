"""Every objective family for the same budget (Cramming-style): which one does a fixed amount
of CPU work best buy, held out and downstream?

    .venv/bin/python benchmarks/budget.py [--tokens 1048576] [--only mlm electra]

The budget is tokens processed (optimizer steps x batch x sequence length), not seconds: on
a machine others share the clock says more about their jobs than about the objective. Every
family trains the same encoder (the `make demo` architecture, bert_tiny) at the demo's batch,
sequence length, learning rate and warm-up, its steps = budget / (batch x seq), on the
built-in corpus minus its last shard, and is scored
- held out: the objective's own MLM cross-entropy on that shard (`val/mlm_loss`; ELECTRA's is
  its small generator's, SpanBERT's is over its span masks: compare within a family's kind);
- downstream: the exported encoder as a frozen probe on built-in tasks, the recipe of
  `make demo-eval` (pretrain.eval.demo, mode probe, one seed), against random weights.
The FLOPs per token differ little (ELECTRA adds a quarter-width generator; NSP, SBO and the
discriminator heads are small), so equal tokens is close to equal compute.

The table and a PNG (benchmarks/figures/budget.png) go into benchmarks/RESULTS.md between the
`budget` markers. `compare_objectives.py` compares more masking variants at another recipe
(MLM accuracy only); `bench_budget.py` is about the static prediction budget's step time.
"""

import argparse
import csv
import json
import re
from pathlib import Path

from pretrain.config import compose_config
from pretrain.eval.demo import INITS, RECIPES, SIZES
from pretrain.runtime.run import train

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "builtin"
RUNS = ROOT / "runs" / "budget"
FIGURE = ROOT / "benchmarks" / "figures" / "budget.png"
# ELECTRA's discriminator at bert_tiny's sizes (its own encoder class: embeddings projected)
ELECTRA_AS_BERT_TINY = [
    "model=electra_tiny",
    "model.embedding_size=128",
    "model.hidden_size=128",
    "model.intermediate_size=512",
]
# (name, objective, data format, overrides): the families, each with the input it was made for
FAMILIES = [
    ("MLM (RoBERTa-style)", "mlm", "full_sentences", []),
    ("MLM + NSP (BERT)", "mlm_nsp", "segment_pair", []),
    ("ELECTRA (replaced-token detection)", "electra", "full_sentences", ELECTRA_AS_BERT_TINY),
    ("SpanBERT (span masking + SBO)", "span", "full_sentences", []),
]
TASKS = ("builtin_order", "builtin_corrupted", "builtin_continuation")
BATCH, SEQ = 64, 64  # the demo's (conf/experiment/demo.yaml)
DEMO_TOKENS = 500 * BATCH * SEQ  # the demo's budget: 500 steps
BEGIN, END = "<!-- budget:begin -->", "<!-- budget:end -->"


def steps_for(tokens: int, batch: int = BATCH, seq: int = SEQ) -> int:
    """Optimizer steps that process `tokens` tokens at `batch` sequences of `seq` tokens."""
    return max(1, tokens // (batch * seq))


def last_value(metrics_csv: Path, key: str) -> float:
    """The last logged value of `key` in a Lightning CSV log."""
    with open(metrics_csv) as f:
        values = [row[key] for row in csv.DictReader(f) if row.get(key)]
    if not values:
        raise SystemExit(f"{metrics_csv}: no {key} logged")
    return float(values[-1])


def pretrain_family(objective: str, fmt: str, overrides: list[str], steps: int) -> Path:
    """Train one family for `steps` steps; returns its exported encoder's directory."""
    from pretrain.export import export_checkpoint

    run_dir = RUNS / objective
    cfg = compose_config(
        [
            "experiment=demo",
            f"objective={objective}",
            f"data={fmt}",
            f"data.shards_dir={CORPUS}",
            "data.holdout_shards=1",
            f"run_dir={run_dir}",
            "resume=never",
            "logger=csv",
            f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}",
            f"trainer.checkpoint_every_n_steps={steps}",
            f"optim.warmup_steps={max(1, steps // 10)}",
            "trainer.enable_progress_bar=false",
            *overrides,
        ]
    )
    train(cfg)
    return export_checkpoint(run_dir / "checkpoints" / "last.ckpt", run_dir / "hf", overwrite=True)


def probe(encoder: Path, task: str, init: str, out_dir: Path) -> float:
    """Dev accuracy of the demo's probe recipe on `task` (seed 0)."""
    from omegaconf import OmegaConf

    from pretrain.eval.config import register_eval_schema
    from pretrain.eval.run import evaluate

    register_eval_schema()
    cfg = compose_config(
        [
            f"eval={task}",
            *RECIPES["probe"],
            *SIZES,
            f"encoder.path={encoder}",
            f"encoder.init={init}",
            f"out_dir={out_dir}",
            f"result_name={task}-probe-{init}",
            "wandb=never",
        ],
        "evaluate",
    )
    return evaluate(OmegaConf.to_object(cfg))[0]["metrics"]["accuracy"]


def table(results: list[dict], tokens: int, steps: int) -> str:
    header = " | ".join(TASKS)
    lines = [
        f"bert_tiny, {steps} steps x {BATCH} sequences x {SEQ} tokens = {tokens:,} tokens per "
        "family; held-out: the built-in corpus's last shard; downstream: frozen probe, dev "
        "accuracy (seed 0), random weights in the last row.",
        "",
        f"| family | held-out MLM loss | {header} |",
        "|---|---:|" + "---:|" * len(TASKS),
    ]
    for r in results:
        loss = f"{r['mlm_loss']:.3f}" if r["mlm_loss"] is not None else "—"
        scores = " | ".join(f"{r[task]:.3f}" for task in TASKS)
        lines.append(f"| {r['name']} | {loss} | {scores} |")
    return "\n".join(lines)


def figure(results: list[dict], path: Path) -> None:
    """Held-out loss and probe accuracies side by side, one bar per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    trained = [r for r in results if r["mlm_loss"] is not None]
    left.barh([r["name"] for r in trained], [r["mlm_loss"] for r in trained])
    left.set_xlabel("held-out MLM loss (nats; lower is better)")
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        right.bar(
            [t + i * width for t in range(len(TASKS))],
            [r[task] for task in TASKS],
            width,
            label=r["name"],
        )
    right.set_xticks([t + 0.4 - width / 2 for t in range(len(TASKS))], TASKS, fontsize=8)
    right.set_ylabel("probe dev accuracy")
    right.set_ylim(0.4, 1.0)
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=int, default=DEMO_TOKENS, help="tokens per family (default: the demo's)"
    )
    parser.add_argument("--only", nargs="*", help="objectives to run (default: all)")
    args = parser.parse_args()
    steps = steps_for(args.tokens)
    results = []
    random_done, baseline = False, {}
    for name, objective, fmt, overrides in FAMILIES:
        if args.only and objective not in args.only:
            continue
        encoder = pretrain_family(objective, fmt, overrides, steps)
        (*_, log) = sorted((RUNS / objective / "csv").glob("version_*/metrics.csv"))
        result = {"name": name, "mlm_loss": last_value(log, "val/mlm_loss")}
        for task in TASKS:
            result[task] = probe(encoder, task, INITS[0], RUNS / objective)
        results.append(result)
        print(json.dumps(result), flush=True)
        if not random_done:  # the same architecture, random weights: the floor
            baseline = {"name": "random weights (bert_tiny)", "mlm_loss": None}
            baseline.update({t: probe(encoder, t, INITS[1], RUNS / "random") for t in TASKS})
            random_done = True
    if baseline:
        results.append(baseline)
    text = table(results, steps * BATCH * SEQ, steps)
    print(text)
    if not args.only:
        figure(results, FIGURE)
        path = ROOT / "benchmarks" / "RESULTS.md"
        current = path.read_text()
        block = f"{BEGIN}\n{text}\n\n![budget](figures/{FIGURE.name})\n{END}"
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        path.write_text(
            pattern.sub(block, current) if BEGIN in current else current + "\n" + block + "\n"
        )


if __name__ == "__main__":
    main()
