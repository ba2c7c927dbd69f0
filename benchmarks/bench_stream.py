"""Stream throughput per core: how fast one process reads prepared shards, side by side for
each shards directory given. Two stages are timed, each in this one process (one thread):

- `read`: `read_documents` over every shard (what the shard format costs);
- `stream`: the training stream of one epoch (segment pairs of 128 tokens, batch 32, MLM
  corruption), as one data-loader worker runs it;
- `sha256`: hashing every shard, the check every shard passes before its documents are used
  (part of both stages above); its share of the `stream` time is printed.

Prints documents/s, tokens/s and shard MB/s. Prepare the directories first, e.g. with
`pretrain-data prepare` (built-in corpus: long documents; `make data/builtin/manifest.json`)
or `benchmarks/prepare.py --keep`.

Then, on the first directory, every objective's stream against `transformers`'
DataCollatorForLanguageModeling, one process, one thread (`bench_stream_objectives.py`):
(a) tar shards -> masked batch / the HF collator alone, (b) our collation + masking alone /
the HF collator (its whole-word mode for wwm and ernie). `--objectives none` skips it; a
few objectives (`--objectives ngram,span`) make a quick run.

    .venv/bin/python benchmarks/bench_stream.py data/builtin [more shards dirs...] [--repeats 3] \
        [--objectives all|none|mlm_nsp,ngram,...]
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from pretrain.config import compose_config, validate  # noqa: E402
from pretrain.data.reading import effective_partitions, stream_spec  # noqa: E402
from pretrain.data.shard_format import file_sha256, load_manifest, read_documents  # noqa: E402
from pretrain.data.stream import EpochStream  # noqa: E402
from pretrain.data.vocab import load_vocabulary  # noqa: E402
from pretrain.objectives.mlm import MaskedLMCorruption  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_stream_objectives  # noqa: E402


def time_read(paths: list[str]) -> tuple[float, int, int]:
    """Seconds, documents and tokens of reading every document of `paths`."""
    start = time.perf_counter()
    documents = tokens = 0
    for path in paths:
        for document in read_documents(path):
            documents += 1
            tokens += len(document["ids"])
    return time.perf_counter() - start, documents, tokens


def time_stream(paths: list[str], tokenizer_dir: str) -> tuple[float, int, int]:
    """Seconds, batches and tokens (non-padding) of one epoch of the training stream."""
    vocab = load_vocabulary(tokenizer_dir)
    corruption = MaskedLMCorruption(
        seed=1, vocab_size=vocab.size, mask_token_id=vocab.mask, special_ids=vocab.special_ids
    )
    manifest = load_manifest(Path(paths[0]).parent)
    partitions = effective_partitions(64, sum(shard["documents"] for shard in manifest.shards))
    spec = stream_spec(  # the default run's settings
        validate(compose_config()),
        shard_paths=tuple(paths),
        vocab=vocab,
        corruption=corruption,
        shard_tokens=tuple(shard["tokens"] for shard in manifest.shards),
        stream_partitions=partitions,  # as a training run of this corpus has them
    )
    start = time.perf_counter()
    batches = tokens = 0
    for batch in EpochStream(spec, epoch=0):
        batches += 1
        tokens += int(batch["attention_mask"].sum())
    return time.perf_counter() - start, batches, tokens


def _time(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards_dirs", nargs="+")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    bench_stream_objectives.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'shards dir':<32} {'stage':<7} {'docs/s':>10} {'tokens/s':>12} {'MB/s':>8}")
    for shards_dir in args.shards_dirs:
        manifest = load_manifest(shards_dir)
        paths = [str(p) for p in manifest.shard_paths]
        shard_mb = sum(s["bytes"] for s in manifest.shards) / 1e6
        read = min((time_read(paths) for _ in range(args.repeats)), key=lambda r: r[0])
        stream = min(
            (time_stream(paths, str(manifest.tokenizer_dir)) for _ in range(args.repeats)),
            key=lambda r: r[0],
        )
        hashing = min(_time(lambda: [file_sha256(p) for p in paths]) for _ in range(args.repeats))  # noqa: B023
        name = os.path.basename(os.path.normpath(shards_dir))
        seconds, documents, tokens = read
        print(
            f"{name:<32} {'read':<7} {documents / seconds:>10,.0f} {tokens / seconds:>12,.0f} "
            f"{shard_mb / seconds:>8.1f}"
        )
        seconds, _, tokens = stream
        print(
            f"{name:<32} {'stream':<7} {documents / seconds:>10,.0f} {tokens / seconds:>12,.0f} "
            f"{shard_mb / seconds:>8.1f}"
        )
        print(
            f"{name:<32} {'sha256':<7} {documents / hashing:>10,.0f} {tokens / hashing:>12,.0f} "
            f"{shard_mb / hashing:>8.1f}  ({100 * hashing / seconds:.2f}% of the stream's time)"
        )

    if args.objectives != "none":
        names = bench_stream_objectives.parse_names(args.objectives)
        print(f"\nstream vs transformers' collator, {args.shards_dirs[0]}, one thread:")
        rows = bench_stream_objectives.run(args.shards_dirs[0], names, args)
        bench_stream_objectives.print_table(rows)


if __name__ == "__main__":
    main()
