"""Teacher vs every compressed model as the file it ships, one table (and a PNG): where it
loads, parameters, bytes of the shipped file, CPU latency at batch 1 x 128 tokens and
throughput at batch 32 x 128 tokens of the whole masked-LM model (logits) in its runtime,
each (file size too) over the teacher in the same runtime, and downstream accuracy with its
retention of the teacher's margin over random weights.

    .venv/bin/python benchmarks/compression.py --teacher exports/demo-bert \
        --models exports/demo-compressed/* --png benchmarks/figures/compression.png

A row is the directory's shipped file (pretrain.compress.artifacts): `model.ts` (int8,
TorchScript), else `model.pt2` (head-pruned, torch.export), else `model.safetensors`
(transformers). Its "loads in" cell is filled by loading that file in a new interpreter that
cannot import `pretrain` and checking its logits against this process's (`load_fresh`).
The teacher is timed in each runtime a row uses: as transformers loads it, traced to
TorchScript, exported with torch.export; speed ratios are over that baseline (the models
timed in turn, round after round, so a noisy machine slows them alike).

Accuracy is `pretrain-eval`'s probe recipe (pretrain.eval.demo: frozen encoder, a linear head
on standardized mean-pooled features, 1400 training and 500 dev examples) on the last layer,
`--seeds` seeds, mean over seeds; "random" is the teacher's architecture with random weights
(a fresh draw per seed), and retention = (model - random) / (teacher - random). A head-pruned
row's features are those of the smaller model in this project's encoder (the program returns
logits alone; the tests show both give the same logits). `distilled` is a task-distilled
student's dev accuracy with its own distilled classifier (compression.json). Never a test:
times are printed, never asserted.
"""

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

DEFAULT_TASKS = ("builtin_order", "builtin_reversed")


@dataclass
class Row:
    """One shipped file of the table: its name, the file, the runtime that loads it, the model
    as loaded (ids, types, mask -> logits), its last-layer states for accuracy, the row whose
    speed it is compared with, and its measured figures."""

    name: str
    artifact: Path
    runtime: str
    logits: Callable
    hidden: Callable
    baseline: str = "teacher"
    params: int = 0
    nonzero: int = 0
    loads_in: str = "-"
    latency_ms: float = 0.0
    throughput: float = 0.0
    distilled: str = "-"
    scores: dict[str, list[float]] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return self.artifact.parent


def counts(model: nn.Module) -> tuple[int, int]:
    """(parameters, nonzero parameters) of `model`, a tied weight counted once."""
    unique = {t.data_ptr(): t for t in model.parameters()}
    return sum(t.numel() for t in unique.values()), sum(
        int(t.count_nonzero()) for t in unique.values()
    )


def load_row(artifact: Path, name: str, teacher: "Row | None" = None) -> Row:
    """The Row of a shipped file (see the module docstring); an int8 TorchScript's counts
    are its teacher's (the same weights, one byte each: torch keeps them packed, outside
    `parameters()`)."""
    from pretrain.compress.artifacts import RUNTIMES, load_artifact
    from pretrain.compress.prune import load_head_pruned

    model = load_artifact(artifact)
    row = Row(name, artifact, RUNTIMES[artifact.name], model, None)
    if artifact.suffix == ".ts":
        row.hidden, row.baseline = model.hidden_states, "teacher (TorchScript)"
        row.params, row.nonzero = teacher.params, teacher.nonzero
        return row
    if artifact.suffix == ".pt2":
        row.baseline = "teacher (torch.export)"
        small = load_head_pruned(artifact.parent)
        row.hidden = small.encoder
    else:
        row.hidden = model.hidden_states
    row.params, row.nonzero = counts(model)
    report = artifact.parent / "compression.json"
    if report.is_file() and "task_accuracy" in (figures := json.loads(report.read_text())):
        row.distilled = f"{figures['task_accuracy']:.3f} ({figures['task']})"
    return row


def teacher_rows(teacher: Path, runtimes: set[str], scratch: Path) -> list[Row]:
    """The teacher as transformers loads it, and traced or exported for each other runtime in
    `runtimes` (file suffixes .ts, .pt2), written to `scratch`."""
    from pretrain.compress.artifacts import (
        PROGRAM,
        SAFETENSORS,
        TORCHSCRIPT,
        MaskedLMLogits,
        save_program,
        save_torchscript,
    )
    from pretrain.compress.quantize import load_hf_masked_lm

    base = load_row(teacher / SAFETENSORS, "teacher")
    rows = [base]
    model = load_hf_masked_lm(teacher)
    vocab, positions = model.config.vocab_size, model.config.max_position_embeddings
    if ".ts" in runtimes:
        row = load_row(save_torchscript(model, scratch / TORCHSCRIPT, vocab), "", base)
        row.name, row.baseline = "teacher (TorchScript)", "teacher (TorchScript)"
        row.params, row.nonzero, rows = base.params, base.nonzero, rows + [row]
    if ".pt2" in runtimes:
        path = save_program(MaskedLMLogits(model), scratch / PROGRAM, vocab, positions)
        row = Row("teacher (torch.export)", path, "torch (torch.export)", None, base.hidden)
        row.logits = torch.export.load(path).module()
        row.baseline, row.params, row.nonzero = row.name, base.params, base.nonzero
        rows.append(row)
    return rows


def inputs(vocab_size: int, batch: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    """(ids, types, mask) of `batch` x `seq_len` random non-special tokens."""
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(5, vocab_size, (batch, seq_len), generator=generator)
    return ids, torch.zeros_like(ids), torch.ones_like(ids)


def check_loads(row: Row, vocab_size: int) -> None:
    """Fill `loads_in`: the runtime's name when the file loads in a new interpreter without
    `pretrain` and gives this process's logits (int8 and programs: within 1e-4), else why not."""
    from pretrain.compress.artifacts import INPUT_NAMES, ArtifactError, load_fresh

    sample = dict(zip(INPUT_NAMES, inputs(vocab_size, 2, 32), strict=True))
    try:
        fresh = load_fresh(row.artifact, sample)
    except ArtifactError as error:
        row.loads_in = f"no: {str(error)[-80:]}"
        return
    with torch.no_grad():
        here = row.logits(*sample.values())
    close = torch.allclose(fresh, here, atol=1e-4, rtol=1e-4)
    row.loads_in = row.runtime if close else f"{row.runtime}, other logits"


@torch.no_grad()
def time_rows(rows: list[Row], vocab_size: int, rounds: int, seq_len: int) -> None:
    """Fill latency_ms (median, batch 1) and throughput (sequences/s, batch 32) of every row's
    logits: every row once per round, `rounds` rounds after a warm-up."""
    single, batch = inputs(vocab_size, 1, seq_len), inputs(vocab_size, 32, seq_len)
    times = {row.name: ([], []) for row in rows}
    for round_index in range(rounds + 1):
        for row in rows:
            for sample, store in ((single, 0), (batch, 1)):
                start = time.perf_counter()
                row.logits(*sample)
                if round_index:  # round 0 warms up
                    times[row.name][store].append(time.perf_counter() - start)
    for row in rows:
        row.latency_ms = 1000 * statistics.median(times[row.name][0])
        row.throughput = 32 / statistics.median(times[row.name][1])


class LastLayerStates(nn.Module):
    """`pretrain.eval.encoder.HiddenStates`'s interface over a row's last-layer states: the
    last layer repeated, which is what `eval.layers=last` reads."""

    def __init__(self, hidden: Callable, config: dict) -> None:
        super().__init__()
        self.hidden = hidden
        self.hidden_size = int(config["hidden_size"])
        self.num_layers = int(config["num_hidden_layers"])

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        types = batch.get("token_type_ids", torch.zeros_like(batch["input_ids"]))
        with torch.no_grad():
            states = self.hidden(batch["input_ids"], types, batch["attention_mask"])
        return (states,) * (self.num_layers + 1)


def accuracy(hidden: Callable, directory: Path, task_name: str, seed: int) -> float:
    """Dev accuracy of pretrain.eval.demo's probe recipe (last layer) on `task_name`, `seed`
    drawing the examples and the head, over the frozen `hidden` (ids, types, mask -> states)."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from pretrain.config import compose_config
    from pretrain.eval.config import register_eval_schema
    from pretrain.eval.demo import RECIPES, SIZES
    from pretrain.eval.encoder import LoadedEncoder
    from pretrain.eval.run import fit_and_score, load_task

    register_eval_schema()
    overrides = [f"eval={task_name}", *RECIPES["probe"], *SIZES, "eval.layers=last"]
    overrides += [f"eval.task.seed={seed}", f"eval.seed={seed}"]
    run = OmegaConf.to_object(compose_config(overrides, "evaluate"))
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    config = json.loads((directory / "config.json").read_text())
    loaded = LoadedEncoder(LastLayerStates(hidden, config), tokenizer, "bert", directory)
    return float(fit_and_score(loaded, load_task(run.eval.task), run.eval)["metrics"]["accuracy"])


def random_hidden(teacher: Path, seed: int) -> Callable:
    """The last-layer states of the teacher's architecture with random weights (seed `seed`)."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    from pretrain.compress.artifacts import MaskedLMLogits

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(teacher), local_files_only=True)
    return MaskedLMLogits(AutoModelForMaskedLM.from_config(config).eval()).hidden_states


def score_rows(rows: list[Row], teacher: Path, tasks: list[str], seeds: list[int]) -> Row:
    """Fill the `scores` ({task: per-seed accuracies}) of the teacher and every compressed row
    (not the teacher's other runtimes: the same model); returns the random row."""
    random = Row("random weights", teacher / "config.json", "-", None, None)
    for task in tasks:
        random.scores[task] = [accuracy(random_hidden(teacher, s), teacher, task, s) for s in seeds]
        for row in rows:
            if not row.name.startswith("teacher ("):  # traced or exported: the same model
                row.scores[task] = [accuracy(row.hidden, row.directory, task, s) for s in seeds]
    return random


def retention(row: Row, teacher: Row, random: Row, task: str) -> float:
    """(row - random) / (teacher - random), mean accuracies over seeds: the share of the
    teacher's margin over random weights that the row keeps."""
    mean = statistics.fmean
    margin = mean(teacher.scores[task]) - mean(random.scores[task])
    return (mean(row.scores[task]) - mean(random.scores[task])) / margin if margin else float("nan")


def table(rows: list[Row], random: Row | None, tasks: list[str]) -> str:
    """The Markdown table; size and speed ratios over the teacher in the row's runtime."""
    by_name = {row.name: row for row in rows}
    teacher = rows[0]
    names = ["model", "loads in", "parameters", "nonzero", "MB (file)", "size ratio"]
    names += ["ms (1 x 128)", "speed-up", "seq/s (32 x 128)", "ratio"]
    names += [f"{t} {c}" for t in tasks for c in ("accuracy", "retention")] + ["distilled"]
    lines = ["| " + " | ".join(names) + " |", "|---|---|" + "---:|" * (len(names) - 2)]
    for row in rows + ([random] if random and tasks else []):
        base = by_name.get(row.baseline, teacher)
        cells = [row.name, row.loads_in]
        if row is random:
            cells += ["-"] * 8
        else:
            size = row.artifact.stat().st_size
            cells += [f"{row.params:,}", f"{row.nonzero:,}", f"{size / 1e6:.2f}"]
            cells += [f"{base.artifact.stat().st_size / size:.2f}x", f"{row.latency_ms:.2f}"]
            cells += [f"{base.latency_ms / row.latency_ms:.2f}x", f"{row.throughput:.1f}"]
            cells += [f"{row.throughput / base.throughput:.2f}x"]
        for task in tasks:
            scores = row.scores.get(task, [])
            spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
            cells.append(f"{statistics.fmean(scores):.3f} ± {spread:.3f}" if scores else "-")
            kept = retention(row, teacher, random, task) if scores and random else None
            cells.append("-" if kept is None else f"{100 * kept:.0f}%")
        lines.append("| " + " | ".join(cells + [row.distilled]) + " |")
    return "\n".join(lines)


def draw(rows: list[Row], tasks: list[str], path: Path) -> None:
    """A PNG of size and speed (over the teacher in the row's runtime) and accuracy ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name, teacher = {row.name: row for row in rows}, rows[0]
    base = [by_name.get(r.baseline, teacher) for r in rows]
    series = {
        "size (teacher / model)": [
            b.artifact.stat().st_size / r.artifact.stat().st_size
            for r, b in zip(rows, base, strict=True)
        ],
        "speed-up, batch 1": [b.latency_ms / r.latency_ms for r, b in zip(rows, base, strict=True)],
        "throughput, batch 32": [
            r.throughput / b.throughput for r, b in zip(rows, base, strict=True)
        ],
        **{
            f"accuracy {t} / teacher's": [  # 0: not scored (the teacher in another runtime)
                statistics.fmean(r.scores.get(t, [0.0])) / statistics.fmean(teacher.scores[t])
                for r in rows
            ]
            for t in tasks
        },
    }
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=label)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ticks = [x + 0.4 - width / 2 for x in range(len(rows))]
    ax.set_xticks(ticks, [r.name for r in rows], rotation=20, ha="right")
    ax.set_ylabel("ratio over the teacher")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> str:
    """Parse the arguments, load, check, time and score every row, print (and return) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True, help="the uncompressed HF directory")
    parser.add_argument(
        "--models", type=Path, nargs="+", required=True, help="pretrain-compress out_dirs"
    )
    parser.add_argument(
        "--tasks",
        nargs="*",
        default=list(DEFAULT_TASKS),
        help="built-in pretrain-eval tasks (none: skip accuracy)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="probe seeds")
    parser.add_argument("--rounds", type=int, default=10, help="timing rounds")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per timed sequence")
    parser.add_argument("--png", type=Path, default=None, help="write the figure here")
    args = parser.parse_args(argv)
    from transformers.utils import logging

    from pretrain.compress.artifacts import shipped_file

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    shipped = [shipped_file(d) for d in args.models if (d / "config.json").is_file()]
    scratch = Path(tempfile.mkdtemp(prefix="compression-"))
    rows = teacher_rows(args.teacher, {path.suffix for path in shipped}, scratch)
    rows += [load_row(path, path.parent.name, rows[0]) for path in shipped]
    vocab_size = json.loads((args.teacher / "config.json").read_text())["vocab_size"]
    for row in rows:
        check_loads(row, vocab_size)
    time_rows(rows, vocab_size, args.rounds, args.seq_len)
    random = score_rows(rows, args.teacher, args.tasks, args.seeds) if args.tasks else None
    text = table(rows, random, args.tasks)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(text)
    if args.png:
        draw(rows, args.tasks, args.png)
        print(f"Figure: {args.png}")
    return text


if __name__ == "__main__":
    main()
