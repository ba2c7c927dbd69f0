"""Teacher vs every compressed model, one table (and a PNG): parameters, bytes on disk, CPU
latency at batch 1 x 128 tokens and throughput at batch 32 x 128 tokens (the models timed in
turn, round after round, so a noisy machine slows them alike; ratios over the teacher), and
downstream accuracy with `pretrain-eval`'s fitting on built-in tasks (features mode: the
encoder frozen, a head trained on its last layer, so an int8 model is scored as it runs).

    .venv/bin/python benchmarks/compression.py --teacher exports/demo-bert \
        --models exports/demo-compressed/* --png benchmarks/figures/compression.png

A directory with `quantized.pt` is loaded int8 (torchao); one whose config.json has
`pruned_heads` is timed as the physically smaller encoder (`pretrain.compress.prune`), the
others with `transformers.AutoModel` (a MobileBERT student as transformers' MobileBERT).
Beside torchao's int8 the table times the teacher quantized by torch's own dynamic int8
(`torch.ao.quantization.quantize_dynamic`, deprecated but still shipped: fbgemm/oneDNN int8
GEMMs with VNNI) under each `--engines` `torch.backends.quantized.engine`, and with
`--compile` the teacher and every torchao int8 model under `torch.compile` (inductor; its
compile time is excluded). `distilled` is a task-distilled student's dev accuracy with its
own distilled classifier (compression.json). Never a test: times are printed, never asserted.
"""

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

DEFAULT_TASKS = ("builtin_order", "builtin_next")


@dataclass
class Row:
    """One model of the table: its name, how it runs, its encoder (ids, types, mask) ->
    hidden states, and its measured figures."""

    name: str
    runtime: str
    encoder: nn.Module
    directory: Path
    params: int = 0
    nonzero: int = 0
    disk_bytes: int = 0
    latency_ms: float = 0.0
    throughput: float = 0.0
    distilled: str = "-"


class OursLastHidden(nn.Module):
    """A pretrain encoder as (ids, types, mask) -> (batch, seq, hidden)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, token_type_ids, attention_mask):
        return self.encoder(input_ids, token_type_ids, attention_mask)


def load_row(directory: Path, name: str | None = None) -> Row:
    """The Row of a Hugging Face / pretrain-compress directory (see the module docstring)."""
    from pretrain.compress.prune import load_head_pruned
    from pretrain.compress.quantize import (
        LastHiddenState,
        is_quantized,
        load_hf_masked_lm,
        load_quantized,
    )

    config = json.loads((directory / "config.json").read_text())
    name = name or directory.name
    if is_quantized(directory):
        model = load_quantized(directory)
        encoder, runtime, weights = (
            LastHiddenState(model.base_model),
            "HF + torchao int8",
            "quantized.pt",
        )
    elif config.get("pruned_heads"):
        encoder, runtime = (
            OursLastHidden(load_head_pruned(directory).encoder),
            "pretrain, heads removed",
        )
        weights = "model.safetensors"
    else:
        encoder = LastHiddenState(load_hf_masked_lm(directory).base_model)
        runtime, weights = "HF", "model.safetensors"
    tensors = list(encoder.state_dict().values())
    row = Row(name, runtime, encoder.eval(), directory)
    row.params = sum(p.numel() for p in encoder.parameters())
    row.nonzero = sum(
        int((t.dequantize() if hasattr(t, "dequantize") else t).count_nonzero())
        for t in tensors
        if t.is_floating_point() or hasattr(t, "dequantize")
    )
    row.disk_bytes = (directory / weights).stat().st_size
    report = directory / "compression.json"
    if report.is_file() and "task_accuracy" in (figures := json.loads(report.read_text())):
        row.distilled = f"{figures['task_accuracy']:.3f} ({figures['task']})"
    return row


class InEngine(nn.Module):
    """A torch dynamic-int8 encoder run with `torch.backends.quantized.engine` = `engine`."""

    def __init__(self, encoder: nn.Module, engine: str) -> None:
        super().__init__()
        self.encoder, self.engine = encoder, engine

    def forward(self, *inputs):
        torch.backends.quantized.engine = self.engine
        return self.encoder(*inputs)


def torch_int8_row(teacher: Path, engine: str, scratch: Path) -> Row:
    """The teacher with every Linear dynamic int8 by `torch.ao.quantization.quantize_dynamic`
    (int8 weights prepacked for `engine`, activations quantized per batch at run time)."""
    import warnings

    from pretrain.compress.quantize import LastHiddenState, load_hf_masked_lm

    torch.backends.quantized.engine = engine
    model = load_hf_masked_lm(teacher).base_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    path = scratch / f"torch_int8_{engine}.pt"
    torch.save(quantized.state_dict(), path)
    row = Row(f"teacher int8 (torch.ao, {engine})", f"torch dynamic int8, {engine}", None, teacher)
    row.encoder = InEngine(LastHiddenState(quantized), engine).eval()
    row.params = sum(p.numel() for p in model.parameters())
    row.nonzero, row.disk_bytes = row.params, path.stat().st_size
    return row


def compiled_row(row: Row) -> Row:
    """`row` run under `torch.compile` (a copy of the Row sharing its figures of size)."""
    from dataclasses import replace

    return replace(
        row,
        name=f"{row.name}, compiled",
        runtime=f"{row.runtime}, torch.compile",
        encoder=torch.compile(row.encoder),
    )


def teacher_in_pretrain(directory: Path) -> Row:
    """The teacher run by this project's encoder: the baseline of the rows that run so."""
    from pretrain.compress.encoders import load_model

    row = load_row(directory, "teacher")
    row.name, row.runtime = "teacher (pretrain)", "pretrain"
    row.encoder = OursLastHidden(load_model(directory).model.encoder).eval()
    return row


def inputs(vocab_size: int, batch: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    """(ids, types, mask) of `batch` x `seq_len` random non-special tokens."""
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(5, vocab_size, (batch, seq_len), generator=generator)
    return ids, torch.zeros_like(ids), torch.ones_like(ids)


@torch.no_grad()
def time_rows(rows: list[Row], vocab_size: int, rounds: int, seq_len: int) -> None:
    """Fill latency_ms (median, batch 1) and throughput (sequences/s, batch 32): every row
    once per round, `rounds` rounds after a warm-up."""
    single, batch = inputs(vocab_size, 1, seq_len), inputs(vocab_size, 32, seq_len)
    times = {row.name: ([], []) for row in rows}
    for round_index in range(rounds + 1):
        for row in rows:
            for sample, store in ((single, 0), (batch, 1)):
                start = time.perf_counter()
                row.encoder(*sample)
                if round_index:  # round 0 warms up
                    times[row.name][store].append(time.perf_counter() - start)
    for row in rows:
        row.latency_ms = 1000 * statistics.median(times[row.name][0])
        row.throughput = 32 / statistics.median(times[row.name][1])


def accuracy(row: Row, task_name: str, epochs: int) -> float:
    """Dev accuracy of a features-mode head on `task_name` over the row's frozen encoder."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from pretrain.config import compose_config
    from pretrain.eval.config import register_eval_schema
    from pretrain.eval.encoder import LoadedEncoder
    from pretrain.eval.run import fit_and_score, load_task

    register_eval_schema()
    cfg = compose_config(
        [f"eval={task_name}", "eval.mode=features", f"eval.epochs={epochs}"], "evaluate"
    )
    run = OmegaConf.to_object(cfg)
    tokenizer = AutoTokenizer.from_pretrained(str(row.directory), local_files_only=True)
    model = HiddenStatesOf(row.encoder, row)
    loaded = LoadedEncoder(model, tokenizer, "bert", row.directory)
    scored = fit_and_score(loaded, load_task(run.eval.task), run.eval)
    return float(scored["metrics"]["accuracy"])


class HiddenStatesOf(nn.Module):
    """`pretrain.eval.encoder.HiddenStates`'s interface over a row's encoder: only its last
    layer is returned, repeated, which is what `eval.layers=last` reads."""

    def __init__(self, encoder: nn.Module, row: Row) -> None:
        super().__init__()
        self.encoder = encoder
        config = json.loads((row.directory / "config.json").read_text())
        self.hidden_size = int(config["hidden_size"])
        self.num_layers = int(config["num_hidden_layers"])
        self.encoder.requires_grad_(False)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        types = batch.get("token_type_ids", torch.zeros_like(batch["input_ids"]))
        with torch.no_grad():
            hidden = self.encoder(batch["input_ids"], types, batch["attention_mask"])
        return (hidden,) * (self.num_layers + 1)


def table(rows: list[Row], scores: dict[str, dict[str, float]], tasks: list[str]) -> str:
    """The Markdown table, ratios over the first row (the teacher)."""
    base = rows[0]
    names = ["model", "runs as", "parameters", "nonzero", "MB on disk", "size ratio"]
    names += ["ms (1 x 128)", "speed-up", "seq/s (32 x 128)", "ratio", *tasks, "distilled"]
    lines = [
        "| " + " | ".join(names) + " |",
        "|" + "---|" * 2 + "---:|" * (8 + len(tasks)) + "---|",
    ]
    for row in rows:
        cells = [row.name, row.runtime, f"{row.params:,}", f"{row.nonzero:,}"]
        cells += [f"{row.disk_bytes / 1e6:.2f}", f"{base.disk_bytes / row.disk_bytes:.2f}x"]
        cells += [f"{row.latency_ms:.2f}", f"{base.latency_ms / row.latency_ms:.2f}x"]
        cells += [f"{row.throughput:.1f}", f"{row.throughput / base.throughput:.2f}x"]
        cells += [f"{scores[row.name][t]:.3f}" for t in tasks] + [row.distilled]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw(rows: list[Row], scores: dict, tasks: list[str], path: Path) -> None:
    """A PNG of the size, speed and accuracy ratios over the teacher, one bar group per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = rows[0]
    series = {
        "size (teacher / model)": [base.disk_bytes / r.disk_bytes for r in rows],
        "speed-up, batch 1": [base.latency_ms / r.latency_ms for r in rows],
        "throughput, batch 32": [r.throughput / base.throughput for r in rows],
        **{
            f"accuracy {t} / teacher's": [
                scores[r.name][t] / max(scores[base.name][t], 1e-9) for r in rows
            ]
            for t in tasks
        },
    }
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=label)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(
        [x + 0.4 - width / 2 for x in range(len(rows))],
        [r.name for r in rows],
        rotation=20,
        ha="right",
    )
    ax.set_ylabel("ratio over the teacher")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> str:
    """Parse the arguments, measure, print (and return) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True, help="the uncompressed HF directory")
    parser.add_argument(
        "--models",
        type=Path,
        nargs="+",
        required=True,
        help="compressed directories (pretrain-compress out_dir)",
    )
    parser.add_argument(
        "--tasks",
        nargs="*",
        default=list(DEFAULT_TASKS),
        help="built-in pretrain-eval tasks (none: skip accuracy)",
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs of each task head")
    parser.add_argument("--rounds", type=int, default=10, help="timing rounds")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per timed sequence")
    parser.add_argument("--png", type=Path, default=None, help="write the figure here")
    parser.add_argument(
        "--engines",
        nargs="*",
        default=["x86", "onednn"],
        help="torch.backends.quantized engines of the torch dynamic-int8 teacher rows",
    )
    parser.add_argument(
        "--compile", action="store_true", help="add torch.compile rows (minutes of compiling)"
    )
    args = parser.parse_args(argv)
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    import tempfile

    rows = [load_row(args.teacher, "teacher")] + [load_row(d) for d in args.models]
    if any(row.runtime.startswith("pretrain") for row in rows):  # its own baseline beside it
        rows.insert(1, teacher_in_pretrain(args.teacher))
    scratch = Path(tempfile.mkdtemp(prefix="compression-"))
    supported = torch.backends.quantized.supported_engines
    rows += [torch_int8_row(args.teacher, e, scratch) for e in args.engines if e in supported]
    if args.compile:
        rows += [compiled_row(r) for r in rows if r.name == "teacher" or "torchao" in r.runtime]
    vocab_size = json.loads((args.teacher / "config.json").read_text())["vocab_size"]
    time_rows(rows, vocab_size, args.rounds, args.seq_len)
    scores = {row.name: {t: accuracy(row, t, args.epochs) for t in args.tasks} for row in rows}
    text = table(rows, scores, args.tasks)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(text)
    if args.png:
        draw(rows, scores, args.tasks, args.png)
        print(f"Figure: {args.png}")
    return text


if __name__ == "__main__":
    main()
