"""Teacher vs every compressed model as the file it ships, one table (and a PNG): where it
loads, parameters, bytes of the shipped file, CPU latency at batch 1 x 128 tokens and
throughput at batch 32 x 128 tokens of the whole masked-LM model (logits) in its runtime,
each (file size too) over the teacher in the same runtime; then the retention table:
downstream accuracy after fine-tuning, kept of the teacher's (pretrain.compress.retention).

    .venv/bin/python benchmarks/compression.py --teacher exports/demo-bert \
        --models exports/demo-compressed/* --png benchmarks/figures/compression.png

A row is the directory's shipped file (pretrain.compress.artifacts): `model.ts` (int8,
TorchScript), else `model.pt2` (head-pruned, torch.export), else `model.safetensors`
(transformers). Its "loads in" cell is filled by loading that file in a new interpreter that
cannot import `pretrain` and checking its logits against this process's (`load_fresh`).
The teacher is timed in each runtime a row uses: as transformers loads it, traced to
TorchScript, exported with torch.export; speed ratios are over that baseline (the models
timed in turn, round after round, so a noisy machine slows them alike).

Accuracy is pretrain.compress.retention's: every model fine-tuned with `pretrain-eval`'s
demo recipe (pretrain.eval.demo) on `--tasks` over `--seeds`, beside the teacher and random
weights; pruned models keep their zeros, int8 is the fine-tuned teacher made int8 (`--tasks`
with no task skips it). `distilled` is a task-distilled student's dev accuracy with its own
distilled classifier (compression.json). Never a test: times are printed, never asserted.
"""

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pretrain.compress import retention
from pretrain.compress.retention import DEFAULT_SEEDS, DEFAULT_TASKS


@dataclass
class Row:
    """One shipped file of the table: its name, the file, the runtime that loads it, the model
    as loaded (ids, types, mask -> logits), the row whose speed it is compared with, and its
    measured figures."""

    name: str
    artifact: Path
    runtime: str
    logits: Callable
    baseline: str = "teacher"
    params: int = 0
    nonzero: int = 0
    loads_in: str = "-"
    latency_ms: float = 0.0
    throughput: float = 0.0
    distilled: str = "-"

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

    model = load_artifact(artifact)
    row = Row(name, artifact, RUNTIMES[artifact.name], model)
    if artifact.suffix == ".ts":
        row.baseline = "teacher (TorchScript)"
        row.params, row.nonzero = teacher.params, teacher.nonzero
        return row
    if artifact.suffix == ".pt2":
        row.baseline = "teacher (torch.export)"
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
        row = Row("teacher (torch.export)", path, "torch (torch.export)", None)
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


def table(rows: list[Row]) -> str:
    """The Markdown table; size and speed ratios over the teacher in the row's runtime."""
    by_name = {row.name: row for row in rows}
    teacher = rows[0]
    names = ["model", "loads in", "parameters", "nonzero", "MB (file)", "size ratio"]
    names += ["ms (1 x 128)", "speed-up", "seq/s (32 x 128)", "ratio"]
    names += ["distilled"]
    lines = ["| " + " | ".join(names) + " |", "|---|---|" + "---:|" * (len(names) - 2)]
    for row in rows:
        base = by_name.get(row.baseline, teacher)
        size = row.artifact.stat().st_size
        cells = [row.name, row.loads_in, f"{row.params:,}", f"{row.nonzero:,}"]
        cells += [f"{size / 1e6:.2f}", f"{base.artifact.stat().st_size / size:.2f}x"]
        cells += [f"{row.latency_ms:.2f}", f"{base.latency_ms / row.latency_ms:.2f}x"]
        cells += [f"{row.throughput:.1f}", f"{row.throughput / base.throughput:.2f}x"]
        lines.append("| " + " | ".join(cells + [row.distilled]) + " |")
    return "\n".join(lines)


def draw(rows: list[Row], path: Path) -> None:
    """A PNG of size and speed, each over the teacher in the row's runtime."""
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
        default=None,
        help=f"built-in pretrain-eval tasks (default {' '.join(DEFAULT_TASKS)}; none: skip accuracy)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument("--rounds", type=int, default=10, help="timing rounds")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per timed sequence")
    parser.add_argument("--png", type=Path, default=None, help="write the figure here")
    args = parser.parse_args(argv)
    tasks = DEFAULT_TASKS if args.tasks is None else args.tasks
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
    text = f"torch {torch.__version__}, {torch.get_num_threads()} threads\n" + table(rows)
    print(text, flush=True)
    if args.png:
        draw(rows, args.png)
        print(f"Figure: {args.png}")
    if tasks:  # the retention table: every model fine-tuned, beside the teacher and random
        models = [path.parent for path in shipped]
        scored = retention.score_models(args.teacher, models, list(tasks), args.seeds)
        print(retention.table(scored))
        text += "\n\n" + retention.table(scored)
    return text


if __name__ == "__main__":
    main()
