"""Compare the pretraining objectives on the built-in corpus, one command:

    .venv/bin/python benchmarks/compare_objectives.py [--steps 400] [--model bert_tiny] \
        [--only mlm span] [--shards data/compare] [--runs-dir runs/compare]

Every objective trains the same small model for the same number of steps of the same batch
size and sequence length (so about the same number of tokens) on the built-in corpus minus
two held-out shards; then all are scored on those held-out shards with the same plain
token masking (15%, 80/10/10, fixed seed): MLM accuracy, and the accuracy of their sentence
task (NSP / SOP / three-way) where they have one. The table is printed and written into
benchmarks/RESULTS.md between the `objectives` markers.
"""

import argparse
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pretrain.checkpoint.compat import task_state_dict
from pretrain.config import compose_config, validate
from pretrain.data.datamodule import open_corpus, split_holdout
from pretrain.data.reading import StreamSpec, stream_spec
from pretrain.data.stream import EpochStream
from pretrain.objectives.mlm import MaskedLMCorruption
from pretrain.runtime.heldout import heldout_accuracy
from pretrain.runtime.run import prepare_run, train

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "compare"
# (name, objective, data format, extra overrides)
RUNS = [
    ("BERT (MLM + NSP)", "mlm_nsp", "segment_pair", []),
    ("RoBERTa-style MLM, FULL-SENTENCES", "mlm", "full_sentences", []),
    ("MLM, static masking (dupe_factor 10)", "mlm", "full_sentences", ["objective.masking=static"]),
    ("whole-word masking + NSP", "wwm", "segment_pair", []),
    ("n-gram masking + SOP (ALBERT)", "ngram", "segment_pair", ["objective.pair_task=sop"]),
    ("ERNIE phrase/entity masking + NSP", "ernie", "segment_pair", []),
    ("SpanBERT (span masking + SBO)", "span", "full_sentences", []),
    ("MLM + SOP", "sop", "segment_pair", []),
    ("StructBERT (word + 3-way sentence)", "structbert", "segment_pair", []),
]
BEGIN, END = "<!-- objectives:begin -->", "<!-- objectives:end -->"


def prepare_corpus(corpus: Path) -> None:
    """The built-in corpus with phrase annotations, prepared into `corpus` unless there."""
    if (corpus / "manifest.json").is_file():
        return
    subprocess.run(
        [
            str(Path(sys.executable).parent / "pretrain-data"),
            "prepare",
            "inputs=[builtin]",
            f"out_dir={corpus}",
            "docs_per_shard=32",
            "phrases.enabled=true",
        ],
        check=True,
    )


def heldout_batches(
    spec: StreamSpec, paths: tuple[str, ...], fmt: str, pair_task: str
) -> list[dict]:
    """Held-out batches with the same plain token masking for every objective."""
    corruption = MaskedLMCorruption(
        seed=20261129,
        vocab_size=spec.vocab.size,
        mask_token_id=spec.vocab.mask,
        special_ids=spec.vocab.special_ids,
    )
    run = validate(
        compose_config(
            [
                "objective=mlm",  # plain token masking; the default run's NSP needs pairs
                f"data.format={fmt}",
                f"data.max_seq_length={spec.max_seq_length}",
                "data.batch_size=64",
                "data.short_seq_probability=0.0",
                "seed=7",
            ]
        )
    )
    held = replace(  # the objective's sentence task, whatever the default run's
        stream_spec(
            run,
            shard_paths=paths,
            shard_tokens=(),
            stream_partitions=64,
            vocab=spec.vocab,
            corruption=corruption,
        ),
        pair_task=pair_task,
    )
    return list(DataLoader(EpochStream(held, epoch=0), batch_size=None))


def run_one(
    name: str, objective: str, fmt: str, extra: list[str], args: argparse.Namespace
) -> dict:
    run_dir = args.runs_dir / objective / fmt / "-".join(extra).replace("=", "_")
    overrides = [
        f"data.shards_dir={args.shards}",
        "data.holdout_shards=2",
        f"model={args.model}",
        f"objective={objective}",
        f"data={fmt}",
        f"run_dir={run_dir}",
        "resume=never",
        "logger=csv",
        "trainer=cpu",
        f"trainer.max_steps={args.steps}",
        "data.batch_size=32",
        "data.max_seq_length=128",
        "data.short_seq_probability=0.0",
        "optim.optimizer.lr=1e-3",
        "optim.warmup_steps=40",
        "trainer.enable_progress_bar=false",
        f"trainer.checkpoint_every_n_steps={args.steps}",
        *extra,
    ]
    cfg = compose_config(overrides)
    train(cfg)
    config, module, datamodule = prepare_run(cfg)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    module.load_state_dict(task_state_dict(state))  # a checkpoint of any version
    corpus = open_corpus(args.shards)
    _, heldout = split_holdout(corpus, 2)
    spec = datamodule.spec
    result = {
        "name": name,
        **heldout_accuracy(
            module.objective, heldout_batches(spec, heldout, "doc_sentences", "none")
        ),
    }
    task = config.objective.sentence_task
    if task != "none":
        pairs = heldout_batches(spec, heldout, "segment_pair", task)
        result["sentence_accuracy"] = heldout_accuracy(module.objective, pairs)["sentence_accuracy"]
        result["task"] = task
    return result


def table(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"{args.model}, {args.steps} steps x 32 sequences x 128 tokens each, lr 1e-3; held-out: the last 2 "
        "of the built-in corpus's shards (32 documents each), plain 15% token masking.",
        "",
        "| objective | held-out MLM accuracy | sentence task | held-out sentence accuracy |",
        "|---|---:|---|---:|",
    ]
    for r in results:
        sentence = f"{r['sentence_accuracy']:.3f}" if "sentence_accuracy" in r else "—"
        lines.append(
            f"| {r['name']} | {r['mlm_accuracy']:.3f} | {r.get('task', '—')} | {sentence} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--model", default="bert_tiny")
    parser.add_argument("--only", nargs="*", help="objective names to run (default: all)")
    parser.add_argument("--shards", type=Path, default=CORPUS, help="prepared here if missing")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "compare")
    args = parser.parse_args()
    prepare_corpus(args.shards)
    results = [run_one(*run, args) for run in RUNS if not args.only or run[1] in args.only]
    text = table(results, args)
    print(text)
    results_md = ROOT / "benchmarks" / "RESULTS.md"
    current = results_md.read_text()
    block = f"{BEGIN}\n{text}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not args.only:
        results_md.write_text(
            pattern.sub(block, current) if BEGIN in current else current + "\n" + block + "\n"
        )


if __name__ == "__main__":
    main()
