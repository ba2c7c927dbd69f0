"""The training stream from object storage against local disk, one process, one thread:
batches/s of one epoch (segment pairs of 128 tokens, batch 32, MLM corruption) read

- `local`: from the shards directory on local disk;
- `s3 cold`: from an S3-compatible server on loopback (moto's, started here), empty cache;
- `s3 warm`: the same again, every shard in the cache;
- `s3 bounded`: from S3 with `data.cache_limit` a fifth of the corpus (so the corpus streams
  through the cache five times over: every shard downloaded, evicted, downloaded again next
  epoch, more often when the limit is below the stream's working set, `--prefetch-shards` + 1
  shards per partition (`--partitions`) plus the 8 a process holds), over `--bounded-epochs` epochs, with the process's RSS sampled every batch (memory
  must stay flat) and the cache's size on disk (must stay within the limit, plus the shards
  in use).

Prints batches/s (the median of `--repeats`), the ratio to local (the median of each
repeat's ratio: local, cold and warm run side by side in each repeat; targets: warm >= 0.95,
cold >= 0.8), the cache's hit rate and the bytes downloaded. Prepares a corpus of
`--megabytes` of text first (40 MB: about 3 minutes on 2 cores), cut at `prepare`'s default
1000 documents a shard, unless a shards dir is given.

    .venv/bin/python benchmarks/remote_stream.py [SHARDS_DIR] [--repeats 3] [--megabytes 40] [--docs-per-shard 1000] \\
        [--partitions 4] [--bounded-epochs 3] [--prefetch-shards 8]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from storage_servers import S3_ENV, make_bucket, moto_server  # noqa: E402

from pretrain.config import compose_config, validate  # noqa: E402
from pretrain.data.datamodule import open_corpus  # noqa: E402
from pretrain.data.reading import StreamSpec, effective_partitions  # noqa: E402
from pretrain.data.reading import stream_spec as run_stream_spec  # noqa: E402
from pretrain.data.stream import EpochStream  # noqa: E402
from pretrain.objectives.mlm import MaskedLMCorruption  # noqa: E402
from pretrain.storage import STATS, publish_corpus  # noqa: E402
from pretrain.storage.cache import cached_entries  # noqa: E402


def prepare_corpus(work: Path, megabytes: float, docs_per_shard: int) -> Path:
    """A corpus of `megabytes` MB of text (documents of about 1 KB: random paragraphs of the
    built-in corpus, `benchmarks/prepare.py`) prepared into `work/shards`."""
    from prepare import write_corpus

    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings

    text = work / "corpus.txt"
    write_corpus(text, megabytes, 1000)
    config = PrepareConfig(
        inputs=[str(text)],
        out_dir=str(work / "shards"),
        tokenizer=TokenizerSettings(vocab_size=8000, lowercase=True),
        docs_per_shard=docs_per_shard,
    )
    return prepare(config, progress=False)


def stream_spec(
    location: str, cache_dir: Path, limit: int | None, partitions: int, prefetch_shards: int = 8
) -> StreamSpec:
    """The stream of the corpus at `location` (a path or URL) as a training run builds it."""
    data = SimpleNamespace(
        cache_dir=str(cache_dir),
        cache_limit=limit,
        prefetch_shards=prefetch_shards,
        download_attempts=5,
        storage_options={},
    )
    corpus = open_corpus(location, None, data)
    vocab, shards = corpus.vocab, corpus.manifest.shards
    return run_stream_spec(  # the default run's settings
        validate(compose_config()),
        shard_paths=tuple(str(p) for p in corpus.manifest.shard_paths),
        vocab=vocab,
        corruption=MaskedLMCorruption(
            seed=1, vocab_size=vocab.size, mask_token_id=vocab.mask, special_ids=vocab.special_ids
        ),
        shard_tokens=tuple(s["tokens"] for s in shards),
        stream_partitions=effective_partitions(partitions, sum(s["documents"] for s in shards)),
        storage=corpus.storage,
    )


def time_epochs(spec: StreamSpec, epochs: range, cache_dir: Path | None = None):
    """(seconds, batches, peak RSS MB, RSS MB after the first epoch's first 10 batches, peak
    cache MB on disk) of reading `epochs` of the stream."""
    process, start = psutil.Process(), time.perf_counter()
    batches, peak, settled, cache_peak = 0, 0.0, None, 0.0
    for epoch in epochs:
        for _ in EpochStream(spec, epoch):
            batches += 1
            rss = process.memory_info().rss / 2**20
            peak = max(peak, rss)
            if batches == 10:
                settled = rss
            if cache_dir is not None and batches % 5 == 0:
                stored = sum(size for _, size, _ in cached_entries(cache_dir)) / 2**20
                cache_peak = max(cache_peak, stored)
    return time.perf_counter() - start, batches, peak, settled or peak, cache_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards_dir", nargs="?")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--megabytes", type=float, default=40, help="of text to prepare")
    parser.add_argument("--docs-per-shard", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4, help="data.stream_partitions")
    parser.add_argument("--bounded-epochs", type=int, default=3)
    parser.add_argument("--prefetch-shards", type=int, default=8, help="data.prefetch_shards")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="remote_stream-"))
    try:
        local = (
            Path(args.shards_dir)
            if args.shards_dir
            else prepare_corpus(work, args.megabytes, args.docs_per_shard)
        )
        with moto_server() as endpoint:
            os.environ.update(S3_ENV)
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            make_bucket(endpoint, "bench")
            url = "s3://bench/corpus"
            publish_corpus(local, url)
            run(local, url, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(local: Path, url: str, work: Path, args) -> None:
    local_spec = stream_spec(str(local), work / "unused", None, args.partitions)
    corpus_bytes = sum(Path(p).stat().st_size for p in local_spec.shard_paths)
    print(
        f"corpus: {len(local_spec.shard_paths)} shards, {corpus_bytes / 2**20:.1f} MB, "
        f"{local_spec.stream_partitions} stream partitions"
    )
    rates: dict[str, list[float]] = {"local": [], "s3 cold": [], "s3 warm": []}
    hits: dict[str, list[tuple[float, float]]] = {"s3 cold": [], "s3 warm": []}
    for repeat in range(args.repeats):
        cache = work / f"cache-{repeat}"
        seconds, batches, *_ = time_epochs(local_spec, range(1))
        rates["local"].append(batches / seconds)
        for label in ("s3 cold", "s3 warm"):
            before = (STATS.hits, STATS.misses, STATS.bytes_downloaded)
            spec = stream_spec(url, cache, None, args.partitions, args.prefetch_shards)
            seconds, batches, *_ = time_epochs(spec, range(1))
            rates[label].append(batches / seconds)
            got, missed = STATS.hits - before[0], STATS.misses - before[1]
            mb = (STATS.bytes_downloaded - before[2]) / 2**20
            hits[label].append((got / max(1, got + missed), mb))
        print(
            f"repeat {repeat}: "
            + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items())
            + " batches/s",
            flush=True,
        )
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{'stream':<12} {'batches/s':>10} {'/ local':>8} {'hit rate':>9} {'MB downloaded':>14}")
    for label, values in rates.items():
        ratio = statistics.median(
            v / local for v, local in zip(values, rates["local"], strict=True)
        )
        hit = statistics.median(h for h, _ in hits.get(label, [(1.0, 0.0)]))
        mb = statistics.median(m for _, m in hits.get(label, [(1.0, 0.0)]))
        rate = statistics.median(values)
        print(f"{label:<12} {rate:>10.1f} {ratio:>8.2f} {hit:>9.2f} {mb:>14.2f}")
    limit = corpus_bytes // 5
    cache = work / "cache-bounded"
    before = (STATS.hits, STATS.misses, STATS.bytes_downloaded, STATS.evicted)
    spec = stream_spec(url, cache, limit, args.partitions, args.prefetch_shards)
    seconds, batches, peak, settled, cache_peak = time_epochs(
        spec, range(args.bounded_epochs), cache
    )
    print(
        f"s3 bounded: cache_limit {limit / 2**20:.2f} MB (corpus / 5), {args.bounded_epochs} "
        f"epochs, {batches / seconds:.1f} batches/s; downloaded "
        f"{(STATS.bytes_downloaded - before[2]) / 2**20:.1f} MB in "
        f"{STATS.misses - before[1]} shards, {STATS.evicted - before[3]} evicted, hit rate "
        f"{(STATS.hits - before[0]) / max(1, STATS.hits - before[0] + STATS.misses - before[1]):.2f}; "
        f"cache on disk at most {cache_peak:.2f} MB; RSS {settled:.0f} MB after 10 batches, "
        f"{peak:.0f} MB at most"
    )


if __name__ == "__main__":
    main()
