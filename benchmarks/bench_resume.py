"""Time to the first batch of a resumed epoch, seeking against re-reading, side by side.

A checkpoint stores how many global samples of the epoch were trained and where each
canonical partition stands (`stream.partition_sequences`: its chunk and the position of the
chunk's first document). A resume seeks there: it reads only each partition's current chunk
(and the shard it starts in). The reference is the resume without positions (checkpoints
made before them): read and format every document of the epoch before the position.

Makes (or reuses) a corpus of short documents from the built-in corpus's paragraphs with
`--docs-per-shard` documents per shard (default: a few hundred shards), walks the epoch once
(untimed) to record the positions at 1%, 50% and 99% of it, then times, in this one process
(one thread), the first batch of `EpochStream` at each, both ways.

    .venv/bin/python benchmarks/bench_resume.py [--megabytes 5] [--work-dir DIR] [--repeats 3] \
        [--tokenizer-from data/builtin]
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from prepare import write_corpus  # noqa: E402

from pretrain.config import compose_config, validate  # noqa: E402
from pretrain.data.positions import next_position  # noqa: E402
from pretrain.data.reading import effective_partitions  # noqa: E402
from pretrain.data.reading import stream_spec as run_stream_spec  # noqa: E402
from pretrain.data.shard_format import load_manifest  # noqa: E402
from pretrain.data.stream import EpochStream, StreamSpec, rank_sequences  # noqa: E402
from pretrain.data.vocab import load_vocabulary  # noqa: E402
from pretrain.objectives.mlm import MaskedLMCorruption  # noqa: E402

FRACTIONS = (0.01, 0.5, 0.99)


def make_corpus(
    work_dir: Path, megabytes: float, docs_per_shard: int, tokenizer_from: Path
) -> Path:
    """Shards of about `megabytes` MB of short documents (the tokenizer of the shards dir
    `tokenizer_from`: the built-in corpus's unless told), made once in `work_dir`."""
    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings

    shards = work_dir / "shards"
    if (shards / "manifest.json").is_file():
        return shards
    work_dir.mkdir(parents=True, exist_ok=True)
    text = work_dir / "short.txt"
    write_corpus(text, megabytes, 190)
    tokenizer = load_manifest(tokenizer_from).tokenizer_dir
    config = PrepareConfig(
        inputs=[str(text)],
        out_dir=str(shards),
        tokenizer=TokenizerSettings(path=str(tokenizer)),
        docs_per_shard=docs_per_shard,
    )
    return prepare(config, progress=False)


def stream_spec(shards_dir: Path) -> StreamSpec:
    """FULL-SENTENCES of 128 tokens, batch 32, MLM corruption, the run's partitions."""
    manifest = load_manifest(shards_dir)
    vocab = load_vocabulary(manifest.tokenizer_dir)
    corruption = MaskedLMCorruption(
        seed=1, vocab_size=vocab.size, mask_token_id=vocab.mask, special_ids=vocab.special_ids
    )
    documents = sum(shard["documents"] for shard in manifest.shards)
    return run_stream_spec(
        validate(compose_config(["objective=mlm", "data=full_sentences"])),
        shard_paths=tuple(str(p) for p in manifest.shard_paths),
        vocab=vocab,
        corruption=corruption,
        shard_tokens=tuple(shard["tokens"] for shard in manifest.shards),
        stream_partitions=effective_partitions(64, documents),
    )


def positions_at(spec: StreamSpec, samples: list[int]) -> dict[int, dict]:
    """{samples: {partition: resume}} at each of `samples` (one walk over the epoch)."""
    wanted, positions, found = sorted(samples), {}, {}
    for i, sequence in enumerate(rank_sequences(spec, 0)):
        while wanted and wanted[0] == i:
            found[wanted.pop(0)] = dict(positions)
        if not wanted:
            break
        positions[sequence["mark"].partition] = next_position(sequence["mark"])
    return found


def first_batch_seconds(spec: StreamSpec, start: int, positions: dict | None) -> float:
    began = time.perf_counter()
    next(iter(EpochStream(spec, 0, start, positions=positions)))
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=5.0)
    parser.add_argument("--docs-per-shard", type=int, default=50)
    parser.add_argument("--work-dir", default="/tmp/pretrain-bench-resume")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many")
    parser.add_argument(
        "--tokenizer-from", type=Path, default=Path("data/builtin"), help="a shards dir"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    shards = make_corpus(
        Path(args.work_dir), args.megabytes, args.docs_per_shard, args.tokenizer_from
    )
    spec = stream_spec(shards)
    epoch = sum(1 for _ in rank_sequences(spec, 0))
    manifest = load_manifest(shards)
    print(
        f"{len(manifest.shards)} shards, {sum(s['documents'] for s in manifest.shards):,} "
        f"documents, {spec.stream_partitions} partitions, an epoch of {epoch:,} sequences"
    )
    starts = [int(fraction * epoch) for fraction in FRACTIONS]
    found = positions_at(spec, starts)
    print(f"{'resume at':>10} {'seek (s)':>10} {'re-read (s)':>12} {'re-read / seek':>15}")
    for fraction, start in zip(FRACTIONS, starts, strict=True):
        seek = min(first_batch_seconds(spec, start, found[start]) for _ in range(args.repeats))
        reread = min(first_batch_seconds(spec, start, None) for _ in range(args.repeats))
        print(f"{fraction:>10.0%} {seek:>10.3f} {reread:>12.3f} {reread / seek:>14.1f}x")


if __name__ == "__main__":
    main()
