"""Our pretraining against transformers' own recipe for the same minutes (issue 57).

For each model (the demo's BERT, bert_mini) and wall-clock budget, two processes start at the
same time, each pinned to a core of its own (`taskset -c 0` / `-c 1`, one thread each, so a
shared machine's contention hits both alike), each stopped at its first optimizer step past
the budget counted from its own process start:
  (a) `pretrain experiment=demo ... trainer.max_time_s=B`, then `pretrain-export` (untimed);
  (b) benchmarks/hf_mlm_recipe.py: run_mlm.py's recipe (datasets' grouped texts,
      BertForMaskedLM from the same config, DataCollatorForLanguageModeling, Trainer).
Both get the same corpus and tokenizer (data/builtin as `make demo` prepares it, its last shard
held out), optimizer (AdamW, betas, eps, weight decay 0.01 but biases and LayerNorms), peak
learning rate, warm-up, batch size, sequence length and max_steps (the demo's 1200 steps a
minute of budget; the schedule decays to 0 there, whichever step the budget ends at).
Then this script scores both exported directories alike: held-out MLM loss on the held-out
shard's documents with one fixed set of masks, and `pretrain.eval.demo`'s recipe on the
built-in tasks (pretrained encoder only), each seed one fit, as mean +- std.

    python benchmarks/vs_hf_pretraining.py [--budgets-min 2 5] [--models demo bert_mini]
        [--seeds 0 1 2] [--modes finetune probe] [--tasks ...] [--out-dir runs/vs_hf] [--smoke]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RECIPE = REPO / "benchmarks" / "hf_mlm_recipe.py"
STEPS_PER_MINUTE = 1200  # the demo's schedule: 2400 steps in its ~2 minutes on an idle core
MODELS = {
    "demo": [],
    # the demo as it was before filled sentences (RESULTS, issue 57)
    "demo_full_sentences": ["data=full_sentences"],
    # BERT-mini (4 layers, 256 wide) at a peak rate of 1e-3 on both sides: at the demo's 3e-3
    # neither side left the token-frequency plateau in 15 minutes (RESULTS, issue 57)
    "bert_mini": [
        *("model=bert_mini", "model.hidden_size=256", "model.intermediate_size=1024"),
        "optim.optimizer.lr=1e-3",
    ],
}
SMOKE_EVAL = ["eval.epochs=1", "eval.probe_epochs=1", "eval.task.train_size=16"]
SMOKE_EVAL += ["eval.task.dev_size=8"]


def run_overrides(model: str, shards: Path) -> list[str]:
    """The demo's composition for `model` on the corpus at `shards`, its last shard held out."""
    return ["experiment=demo", *MODELS[model], f"data.shards_dir={shards}", "data.holdout_shards=1"]


def shard_paths(shards: Path) -> list[Path]:
    """The corpus's shards in manifest order (the run holds out the last)."""
    manifest = json.loads((shards / "manifest.json").read_text())
    return [shards / entry["name"] for entry in manifest["shards"]]


def write_inputs(model: str, shards: Path, work: Path) -> dict:
    """The recipe's inputs under `work`: config.json of our composed model (BertForMaskedLM,
    export.bert.hf_config) and the training documents' texts as JSON lines: the built-in
    corpus's own text for a `builtin` corpus, else the shard's ids decoded. Returns the run
    config's optim and data settings the recipe must share."""
    from transformers import AutoTokenizer

    from pretrain.config import compose_config
    from pretrain.data.shard_format import read_documents
    from pretrain.export.bert import hf_config

    cfg = compose_config(run_overrides(model, shards))
    tokenizer = AutoTokenizer.from_pretrained(shards / "tokenizer")
    config = hf_config(cfg.model, len(tokenizer), tokenizer.pad_token_id, ("BertForMaskedLM",))
    (work / "config").mkdir(parents=True, exist_ok=True)
    (work / "config" / "config.json").write_text(json.dumps(config, indent=1))
    manifest = json.loads((shards / "manifest.json").read_text())
    builtin = [source["path"] for source in manifest["sources"]] == ["builtin"]
    if builtin:
        from data_pipelines.builtin_corpus import builtin_documents

        texts = [text for _, text in builtin_documents()]
    with open(work / "texts.jsonl", "w", encoding="utf-8") as out:
        for path in shard_paths(shards)[:-1]:
            for doc in read_documents(str(path)):
                index = int(doc["key"].rsplit("_", 1)[1])
                text = texts[index] if builtin else tokenizer.decode(doc["ids"])
                out.write(json.dumps({"text": text}) + "\n")
    optimizer = cfg.optim.optimizer
    return {
        "lr": optimizer.lr,
        "warmup_steps": cfg.optim.warmup_steps,
        "batch_size": cfg.data.batch_size,
        "max_seq_length": cfg.data.max_seq_length,
        "weight_decay": optimizer.weight_decay,
        "adam_epsilon": optimizer.eps,
    }


def commands(model: str, shards: Path, work: Path, budget_s: float, steps: int, settings: dict):
    """{side: argv} of the two training processes, each pinned to its own core, one thread."""
    ours = [
        *("taskset", "-c", "0", str(BIN / "pretrain")),
        *run_overrides(model, shards),
        *("trainer.val_check_interval=null", "trainer.num_threads=1"),
        *("logger.wandb=false", "trainer.enable_progress_bar=false"),
        f"trainer.max_time_s={budget_s}",
        f"trainer.max_steps={steps}",
        f"run_dir={work / 'ours'}",
    ]
    hf = [
        *("taskset", "-c", "1", sys.executable, str(RECIPE)),
        *("--texts", str(work / "texts.jsonl"), "--config-dir", str(work / "config")),
        *("--tokenizer-dir", str(shards / "tokenizer"), "--out-dir", str(work / "hf")),
        *("--max-steps", str(steps), "--max-time-s", str(budget_s)),
        *(f"--{key.replace('_', '-')}={value}" for key, value in settings.items()),
    ]
    return {"ours": ours, "hf": hf}


def run_side_by_side(argvs: dict[str, list[str]], work: Path) -> None:
    """Starts every command at once (OMP_NUM_THREADS=1), logs to work/<side>.log, waits."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    processes = {}
    for side, argv in argvs.items():
        print(f"$ OMP_NUM_THREADS=1 {' '.join(argv)}", flush=True)
        log = open(work / f"{side}.log", "w")  # noqa: SIM115 (closed below)
        processes[side] = (
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env),
            log,
        )
    for side, (process, log) in processes.items():
        status = process.wait()
        log.close()
        if status != 0:
            tail = (work / f"{side}.log").read_text()[-2000:]
            raise SystemExit(
                f"{side} exited {status}; its log {work / f'{side}.log'} ends:\n{tail}"
            )


def ours_reached(run_dir: Path, batch_size: int) -> tuple[int, int]:
    """(optimizer steps, tokens) of our run: its final step, and its non-padding tokens at
    its last logged row scaled to that step (packed rows hold a few pads)."""
    import csv

    step = json.loads((run_dir / "run_state.json").read_text())["step"]
    rows = list(csv.DictReader(open(next((run_dir / "csv").glob("*/metrics.csv")))))
    rows = [r for r in rows if r.get("train/tokens_seen")]
    if not rows:
        return step, step * batch_size
    last = rows[-1]
    return step, round(float(last["train/tokens_seen"]) * step / (int(last["step"]) + 1))


def heldout_batches(shards: Path, seq_len: int, seed: int = 57):
    """The held-out shard's documents as one stream of ids cut into [CLS] ... [SEP] rows of
    `seq_len`, with fixed masks (15% of the inner tokens: 80% [MASK], 10% random, 10% kept).
    Returns (input_ids, labels) tensors, labels -100 where nothing is predicted."""
    import torch
    from transformers import AutoTokenizer

    from pretrain.data.shard_format import read_documents

    tokenizer = AutoTokenizer.from_pretrained(shards / "tokenizer")
    ids = [i for doc in read_documents(str(shard_paths(shards)[-1])) for i in doc["ids"].tolist()]
    inner = seq_len - 2
    rows = torch.tensor(ids[: len(ids) // inner * inner]).view(-1, inner)  # (rows, inner)
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.rand(rows.shape, generator=generator) < 0.15
    draw = torch.rand(rows.shape, generator=generator)
    random_ids = torch.randint(len(tokenizer), rows.shape, generator=generator)
    inputs = rows.clone()
    inputs[chosen & (draw < 0.8)] = tokenizer.mask_token_id
    swap = chosen & (draw >= 0.8) & (draw < 0.9)
    inputs[swap] = random_ids[swap]
    labels = torch.where(chosen, rows, torch.full_like(rows, -100))

    def framed(x, cls, sep):
        n = len(x)
        return torch.cat([torch.full((n, 1), cls), x, torch.full((n, 1), sep)], dim=1)

    return (
        framed(inputs, tokenizer.cls_token_id, tokenizer.sep_token_id),
        framed(labels, -100, -100),
    )


def heldout_losses(model_dir: Path, inputs, labels, batch_size: int = 64):
    """The exported model's cross-entropy on every masked held-out token, in order (a
    tensor): their mean is the held-out loss; two models' differences pair token by token."""
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    losses = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            x, y = inputs[start : start + batch_size], labels[start : start + batch_size]
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none"
            )
            losses.append(loss[y.flatten() != -100])
    return torch.cat(losses)


def downstream(encoder: str, tasks, modes, seeds, overrides, out_dir: str) -> dict:
    """{"task mode": [score per seed]} of pretrain.eval.demo's recipe on `encoder` (pretrained
    only), each fit's result under `out_dir`/eval; a fit whose result is there is not redone."""
    from omegaconf import OmegaConf

    from pretrain.config import compose_config
    from pretrain.eval.config import register_eval_schema
    from pretrain.eval.demo import RECIPES, SIZES
    from pretrain.eval.run import evaluate

    register_eval_schema()
    scores = {}
    for task in tasks:
        for mode in modes:
            for seed in seeds:
                done = Path(out_dir) / "eval" / f"{task}-{mode}-seed{seed}.json"
                if done.is_file():  # a fit an earlier (cut-short) scoring finished
                    scores.setdefault(f"{task} {mode}", []).append(main_score(done))
                    continue
                cfg = compose_config(
                    [f"eval={task}", *RECIPES[mode], *SIZES, f"eval.task.seed={seed}"]
                    + [*overrides, f"encoder.path={encoder}", "encoder.init=pretrained"]
                    + [f"eval.seed={seed}", f"out_dir={out_dir}"]
                    + [f"result_name={task}-{mode}-seed{seed}"],
                    "evaluate",
                )
                evaluate(OmegaConf.to_object(cfg))
                scores.setdefault(f"{task} {mode}", []).append(main_score(done))
    return scores


def main_score(result_file: Path) -> float:
    """The main metric (pretrain.eval.demo's MAIN_METRIC) of one fit's result file."""
    from pretrain.eval.demo import MAIN_METRIC

    result = json.loads(result_file.read_text())
    metric = MAIN_METRIC[result["kind"]]
    return result["metrics"][
        metric if metric in result["metrics"] else next(iter(result["metrics"]))
    ]


def mean_std(values: list[float]) -> str:
    """'mean ± sample std' with 3 decimals (std 0 for one value)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {std:.3f}"


def downstream_side_by_side(dirs: dict[str, Path], args, work: Path) -> dict[str, dict]:
    """{side: downstream scores}: one process a side at once, pinned as in training; a smoke
    run's in this process, one after the other (process starts cost more than its fits)."""
    if args.smoke:
        fits = (args.tasks, args.modes, args.seeds, SMOKE_EVAL)
        return {
            side: downstream(str(model_dir), *fits, str(work / f"{model_dir.name}-eval"))
            for side, model_dir in dirs.items()
        }
    argvs = {}
    for core, (side, model_dir) in enumerate(dirs.items()):
        argvs[f"{side}-eval"] = [
            *("taskset", "-c", str(core), sys.executable, __file__),
            *("--downstream-of", str(model_dir), "--scores", str(work / f"{side}-scores.json")),
            *("--tasks", *args.tasks, "--modes", *args.modes),
            *("--seeds", *map(str, args.seeds), *(["--smoke"] if args.smoke else [])),
        ]
    run_side_by_side(argvs, work)
    return {side: json.loads((work / f"{side}-scores.json").read_text()) for side in dirs}


def compare_budget(model: str, minutes: float, args) -> dict:
    """Trains both sides for `minutes` of budget, exports ours, scores both; one result row."""
    shards = Path(args.shards).resolve()
    work = Path(args.out_dir).resolve() / f"{model}-{minutes:g}min"
    steps = args.max_steps or round(STEPS_PER_MINUTE * minutes)
    if not args.score_only:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    settings = write_inputs(model, shards, work)
    if not args.score_only:
        run_side_by_side(commands(model, shards, work, minutes * 60, steps, settings), work)
    from pretrain.export.cli import main as export_main

    export = [str(work / "ours/checkpoints/last.ckpt"), str(work / "ours-hf"), "--overwrite"]
    print(f"$ pretrain-export {' '.join(export)}", flush=True)
    if export_main(export) != 0:
        raise SystemExit(f"pretrain-export {' '.join(export)} failed (its message above)")
    dirs = {"ours": work / "ours-hf", "hf": work / "hf"}
    inputs, labels = heldout_batches(shards, settings["max_seq_length"])
    hf_summary = json.loads((work / "hf" / "recipe_summary.json").read_text())
    row = {"model": model, "minutes": minutes, "max_steps": steps}
    row["ours"] = dict(
        zip(("steps", "tokens"), ours_reached(work / "ours", settings["batch_size"]), strict=True)
    )
    row["hf"] = {"steps": hf_summary["steps"], "tokens": hf_summary["tokens"]}
    losses = {side: heldout_losses(model_dir, inputs, labels) for side, model_dir in dirs.items()}
    for side, side_losses in losses.items():
        row[side]["heldout_loss"] = float(side_losses.mean())
    difference = losses["ours"] - losses["hf"]  # the same tokens: paired
    row["heldout_difference"] = [
        float(difference.mean()),
        float(difference.std()) / len(difference) ** 0.5,
    ]
    print(f"{model} {minutes:g} min: {json.dumps(row)}", flush=True)
    if args.tasks:
        for side, scores in downstream_side_by_side(dirs, args, work).items():
            row[side]["downstream"] = scores
    (work / "result.json").write_text(json.dumps(row, indent=1))
    return row


def profile_side_by_side(model: str, seconds: float, args) -> None:
    """Both sides once more under cProfile (`seconds` of budget each, pinned as in the
    comparison), then each profile's functions by cumulative time (pstats)."""
    import pstats

    shards = Path(args.shards).resolve()
    work = Path(args.out_dir).resolve() / f"{model}-profile"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings = write_inputs(model, shards, work)
    steps = args.max_steps or round(STEPS_PER_MINUTE * seconds / 60)
    argvs = commands(model, shards, work, seconds, steps, settings)
    # ours in-process (its console script ends the process before cProfile writes)
    script = work / "pretrain_main.py"
    script.write_text(
        f"import sys\nsys.argv = {['pretrain', *argvs['ours'][4:]]!r}\n"
        "from pretrain.cli.train import main\nmain()\n"
    )
    profile = [sys.executable, "-m", "cProfile", "-o"]
    argvs["ours"] = [*argvs["ours"][:3], *profile, str(work / "ours.prof"), str(script)]
    argvs["hf"][3:4] = [*profile, str(work / "hf.prof")]
    run_side_by_side(argvs, work)
    for side in argvs:
        print(f"## {side}: {work / side}.prof, by cumulative time", flush=True)
        pstats.Stats(str(work / f"{side}.prof")).sort_stats("cumulative").print_stats(40)


def worse(ours: list[float], hf: list[float]) -> bool:
    """Ours' mean below transformers' by more than one standard deviation (the larger of the
    two sides' sample stds; 0 for one seed)."""
    stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in (ours, hf)]
    return statistics.fmean(hf) - statistics.fmean(ours) > max(stds)


def goal_met(row: dict) -> bool:
    """Issue 57's goal at one budget: a lower held-out loss than transformers' recipe (the
    paired difference below 0) and no built-in task's score worse beyond one std (`worse`)."""
    scores = row["ours"].get("downstream", {})
    tasks_hold = not any(worse(ours, row["hf"]["downstream"][k]) for k, ours in scores.items())
    return row["heldout_difference"][0] < 0 and tasks_hold


def tables(rows: list[dict]) -> str:
    """Markdown: steps, tokens and held-out loss of each side with the paired difference;
    then each task's scores, a difference worse beyond one std in bold; then the goal."""
    lines = [
        "| model | budget | side | optimizer steps | tokens | held-out MLM loss | ours − theirs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mean, error = row["heldout_difference"]
        for side, name in (("ours", "ours"), ("hf", "transformers")):
            r = row[side]
            paired = f"{mean:+.3f} ± {error:.3f}" if side == "ours" else ""
            lines.append(
                f"| {row['model']} | {row['minutes']:g} min | {name} | {r['steps']} | "
                f"{r['tokens']:,} | {r['heldout_loss']:.3f} | {paired} |"
            )
    lines += [
        "",
        "| model | budget | task | mode | ours | transformers | ours − theirs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for key, ours in row["ours"].get("downstream", {}).items():
            hf = row["hf"]["downstream"][key]
            task, mode = key.split()
            difference = f"{statistics.fmean(ours) - statistics.fmean(hf):+.3f}"
            if worse(ours, hf):
                difference = f"**{difference}**"
            lines.append(
                f"| {row['model']} | {row['minutes']:g} min | {task} | {mode} | "
                f"{mean_std(ours)} | {mean_std(hf)} | {difference} |"
            )
    lines.append("")
    for row in rows:
        verdict = "met" if goal_met(row) else "NOT met"
        lines.append(f"goal at {row['model']} {row['minutes']:g} min: {verdict}")
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --smoke: a 1 s budget, 3 steps, one tiny fit of one task, 1 seed."""
    from pretrain.eval.demo import DEMO_TASKS, RECIPES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets-min", nargs="+", type=float, default=[2.0, 5.0])
    p.add_argument("--models", nargs="+", default=["demo"], choices=sorted(MODELS))
    p.add_argument("--shards", default=str(REPO / "data" / "builtin"))
    p.add_argument("--out-dir", default=str(REPO / "runs" / "vs_hf"))
    p.add_argument("--tasks", nargs="*", default=list(DEMO_TASKS))
    p.add_argument("--modes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--max-steps", type=int, default=None, help="default: 1200 a budget minute")
    p.add_argument("--profile-s", type=float, default=None, help="profile a run of each instead")
    p.add_argument("--score-only", action="store_true", help="score the runs already in --out-dir")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--downstream-of", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scores", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke and not args.downstream_of:
        args.budgets_min, args.max_steps, args.seeds = [1 / 60], 3, [0]
        args.tasks, args.modes = args.tasks[:1], ["finetune"]
    return args


def main(argv: list[str] | None = None) -> None:
    """Every model and budget asked for, then the tables."""
    args = parse_arguments(argv)
    if args.downstream_of:  # one side's downstream fits, in a process of its own
        overrides = SMOKE_EVAL if args.smoke else []
        out = str(Path(args.scores).parent / f"{Path(args.downstream_of).name}-eval")
        scores = downstream(args.downstream_of, args.tasks, args.modes, args.seeds, overrides, out)
        Path(args.scores).write_text(json.dumps(scores))
        return
    shards = Path(args.shards)
    if not (shards / "manifest.json").is_file():
        raise SystemExit(f"{shards}/manifest.json: no prepared corpus there; run `make demo`")
    if args.profile_s:
        return profile_side_by_side(args.models[0], args.profile_s, args)
    rows = [compare_budget(m, b, args) for m in args.models for b in args.budgets_min]
    print(tables(rows))


if __name__ == "__main__":
    main()
