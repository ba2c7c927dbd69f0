"""What a rank and its data-loader workers cost as a run grows (issue 54), in one table:

- `stream`: one rank's training stream (MLM, batches of --batch-size x 128 tokens) served by
  1 and 2 data-loader workers, each building only its share of the batches (the training
  path: `StepAlignedLoader`, `stream.worker_batches`) against every worker reading all the
  rank's sequences and keeping every W-th batch (before issue 54, a plain DataLoader over
  the same stream). From the first batch on (worker start-up left out): batches per CPU
  second of the busiest worker (the rate free cores give: workers run in parallel and the
  slowest paces the round-robin) and batches/s of wall time (on a loaded machine, what else
  runs decides it), each against one worker. Target: 2 workers >= 1.8x one.
- `table`: a worker's shard table at 1k, 10k and 100k shards (synthetic manifests of
  --blocks blocks a shard): the paths, tokens, storage records and one epoch's sharing a
  worker holds, as Python objects (before issue 54, beside the manifest every process
  parsed) and as compact arrays (`data/shard_table.py`, `storage.ShardRecords`), in MB
  (tracemalloc), plus the node's shard table the worker maps (`data/manifest_table.py`,
  page cache shared by the node's processes); and the start-up seconds of a rank: before,
  parse the manifest and deal the shards to 64 partitions; now, the node's first process
  parses, checks and writes the table (`open_manifest`) and records the manifest's
  identity; a later rank whose stat of the manifest matches it maps the table without
  reading the manifest (beside it, a rank that hashes it: no record), checks repeats,
  builds its `ShardPaths` from the table's names and deals the shards. Target: <= 20 MB a
  worker at 100k, linear.
- `ranks`: the ranks of a simulated --ranks-rank run (default 512; data.stream_partitions
  left at its default) each build their stream, whose first samples must tile the global
  order: the check of any world size without planning.

    .venv/bin/python benchmarks/scale_sim.py --shards DIR [--batches 200] [--batch-size 32] \
        [--repeats 3] [--ranks 512]

DIR: a prepared corpus (`pretrain-data prepare`, or the tests' small one); the stream reads
up to --batches batches of its first epoch.
"""

import argparse
import gc
import hashlib
import json
import os
import pickle
import tempfile
import time
import tracemalloc
from dataclasses import replace
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from pretrain.config import compose_config  # noqa: E402
from pretrain.data import manifest_table  # noqa: E402
from pretrain.data.loader import StepAlignedLoader, is_end_of_epoch  # noqa: E402
from pretrain.data.node_manifest import open_manifest  # noqa: E402
from pretrain.data.reading import _shard_sharing  # noqa: E402
from pretrain.data.stream import EpochStream, rank_sequences  # noqa: E402
from pretrain.runtime.run import build_stream  # noqa: E402
from pretrain.storage.corpus import ShardRecords  # noqa: E402


def corpus_spec(shards: str, batch_size: int):
    """The stream of the default MLM run on `shards`, 128 tokens a row."""
    overrides = [f"data.shards_dir={shards}", "data.max_seq_length=128"]
    _, spec, _ = build_stream(compose_config([*overrides, f"data.batch_size={batch_size}"]))
    return spec


def cpu_seconds(pids: list[int]) -> list[float]:
    """CPU seconds (user + system) each of the processes `pids` has used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / ticks)
    return out


def batches_per_second(spec, workers: int, shares: bool, limit: int) -> tuple[float, float, int]:
    """(batches/s from the first batch on, batches per CPU second of the busiest worker over
    the same span, batches read) of one rank's stream. The second is what free cores give
    (workers run in parallel, the slowest paces the round-robin); on a loaded machine the
    first depends on what else runs."""
    stream = EpochStream(spec, 0, errors_as_batches=True)
    options = dict(num_workers=workers, generator=torch.Generator().manual_seed(0))
    if shares:
        loader = StepAlignedLoader(stream, full_batch=spec.batch_size, **options)
    else:
        loader = DataLoader(stream, batch_size=None, **options)
    batches, first, source = 0, None, None
    iterator = iter(loader)
    source = loader._source if shares else iterator  # the DataLoader iterator: its workers
    pids = [worker.pid for worker in source._workers]
    for batch in iterator:
        if is_end_of_epoch(batch):
            break
        if first is None:
            first, cpu_first = time.perf_counter(), cpu_seconds(pids)
        batches += 1
        if batches > limit:
            break
    seconds = time.perf_counter() - first
    busiest = max(b - a for a, b in zip(cpu_first, cpu_seconds(pids), strict=True))
    if shares:
        loader.close()
    else:
        iterator._shutdown_workers()
    # a few batches may take less than the clock tick /proc counts CPU in: no figure then
    per_cpu_second = (batches - 1) / busiest if busiest > 0 else float("nan")
    return (batches - 1) / seconds, per_cpu_second, batches - 1


def ratio(value: float, base: float) -> float:
    """value / base; nan where the base was too short to measure (0, a smoke run's)."""
    return value / base if base > 0 else float("nan")


def stream_rows(spec, limit: int, repeats: int) -> list[tuple[str, str, str]]:
    """The four ways, each the best of `repeats` runs taken in turn (a loaded machine)."""
    ways = [(shares, workers) for shares in (True, False) for workers in (1, 2)]
    best: dict[tuple[bool, int], tuple[float, float, int]] = {}
    for _ in range(repeats):
        for way in ways:
            wall, cpu, batches = batches_per_second(spec, way[1], way[0], limit)
            old = best.get(way, (0.0, 0.0, 0))
            best[way] = (max(old[0], wall), max(old[1], cpu), batches)
    base_wall, base_cpu = best[(True, 1)][:2]
    rows = []
    for (shares, workers), (wall, cpu, batches) in best.items():
        how = "own share" if shares else "all read, every W-th kept"
        rows.append(
            (
                f"stream, {workers} worker(s), {how}",
                f"{cpu:.1f} batches per busiest worker's CPU s; {wall:.1f} batches/s wall "
                f"({batches} batches)",
                f"{ratio(cpu, base_cpu):.2f}x 1 worker (wall {ratio(wall, base_wall):.2f}x)",
            )
        )
    return rows


def synthetic_manifest(shards: int, blocks: int) -> dict:
    """A format-2 manifest of `shards` shards of `blocks` blocks, as prepare writes them."""

    def digest(*parts) -> str:
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    records = [
        {
            "name": f"shard-{i:06d}.tar",
            "documents": 600 * blocks + i % 97,
            "tokens": 2_000_000 * blocks + i % 1009,
            "bytes": 64_000_000 + i,
            "sha256": digest(i),
            "blocks": [
                {
                    "documents": 600 + (i % 97 if b == 0 else 0),
                    "tokens": 2_000_000 + (i % 1009 if b == 0 else 0),
                    "sha256": digest(i, b),
                }
                for b in range(blocks)
            ],
        }
        for i in range(shards)
    ]
    return {
        "format_version": 2,
        "tokenizer": {"dir": "tokenizer", "sha256": digest("tok"), "vocab_size": 30522},
        "dtype": "uint16",
        "counts": {
            "documents": sum(r["documents"] for r in records),
            "tokens": sum(r["tokens"] for r in records),
        },
        "shards": records,
    }


def load_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def held_mb(build) -> tuple[float, object]:
    """(MB that `build()`'s result holds, by tracemalloc, the result)."""
    tracemalloc.start()
    result = build()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held / 2**20, result


def timed(build) -> tuple[float, object]:
    """(seconds `build()` took, its result)."""
    start = time.perf_counter()
    result = build()
    return time.perf_counter() - start, result


def rank_start(root: str, home: str, partitions: int) -> tuple:
    """What a rank builds at start from the node's table (`open_manifest`): the repeats
    check, the shard paths and tokens, one epoch's sharing among `partitions` readers."""
    manifest = open_manifest(root, home)
    manifest.table.repeats()
    paths = manifest.shard_path_table.take(range(len(manifest.table)))  # as split_holdout
    tokens = tuple(manifest.table.arrays["tokens"].tolist())
    sharing = _shard_sharing.__wrapped__(0, 0, partitions, len(tokens), tokens)
    return manifest, paths, tokens, sharing


def table_rows(
    sizes: list[int], blocks: int, repeats: int, partitions: int = 64
) -> list[tuple[str, str, str]]:
    """The `table` rows at each of `sizes` shards (synthetic manifests of `blocks` blocks a
    shard); a later rank's start-up the best of `repeats`."""
    rows = []
    for shards in sizes:
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "manifest.json")
            with open(path, "w") as f:
                json.dump(synthetic_manifest(shards, blocks), f)
            parse_s, _ = timed(partial(load_json, path))
            parsed_mb, manifest = held_mb(partial(load_json, path))
            records = manifest["shards"]
            tokens = tuple(r["tokens"] for r in records)
            triples = [(r["name"], r["bytes"], r["sha256"]) for r in records]
            before_s, sharing = timed(
                partial(_shard_sharing.__wrapped__, 0, 0, partitions, shards, tokens)
            )
            before = (  # a Python object a shard (and the records' dict), as before issue 54
                tuple(os.path.join(work, r["name"]) for r in records),
                tokens,
                tuple(triples),
                {n: (b, h) for n, b, h in triples},
                list(sharing),
            )
            del manifest, records
            home = os.path.join(work, "tables")
            # the manifest was written long before the run: its identity may be recorded now
            manifest_table.SETTLED_NS = 0
            first_s, _ = timed(partial(open_manifest, work, home))  # parse, check, write
            hashed_s = rank_s = float("inf")  # the best of `repeats`, in turn
            gc.collect()
            gc.freeze()  # the objects above are not a rank's: its collections skip them
            for _ in range(repeats):
                # a rank that hashes the manifest (no identity record yet; it records one) ...
                os.remove(manifest_table.identity_path(Path(path).resolve(), Path(home)))
                seconds, _ = timed(partial(rank_start, work, home, partitions))
                hashed_s = min(hashed_s, seconds)
                # ... and a later one, whose stat of the manifest matches the record: no read
                seconds, (opened, paths, tokens, sharing) = timed(
                    partial(rank_start, work, home, partitions)
                )
                rank_s = min(rank_s, seconds)
            gc.unfreeze()
            table = opened.table
            mapped_mb = sum(a.nbytes for a in table.arrays.values()) / 2**20
            after = (
                paths,
                tokens,
                ShardRecords.from_sorted(
                    table.arrays["sorted_names"],
                    table.arrays["bytes"][table.arrays["name_order"]],
                    table.arrays["sha256"][table.arrays["name_order"]],
                ),
                sharing,
            )
            # what a worker holds: the table unpickled in it (the sharing it computes, the same)
            before_mb, _ = held_mb(partial(pickle.loads, pickle.dumps(before)))
            after_mb, _ = held_mb(partial(pickle.loads, pickle.dumps(after)))
        rows.append(
            (
                f"table, {shards:,} shards",
                f"worker {after_mb:.1f} MB + {mapped_mb:.0f} MB mapped, shared by the node "
                f"(was {before_mb:.1f} MB + manifest parsed {parsed_mb:.0f} MB)",
                f"rank start-up {rank_s:.2f} s ({hashed_s:.2f} s hashing the manifest), the "
                f"node's first {first_s:.2f} s (was {parse_s + before_s:.2f} s, parse "
                f"{parse_s:.2f} s)",
            )
        )
    return rows


def ranks_row(spec, ranks: int) -> tuple[str, str, str]:
    """Ranks 0, 1, R/2 and R-1 of a simulated `ranks`-rank run tile the global order."""
    start = time.perf_counter()
    whole = [s["key"] for s in rank_sequences(spec, 0)]
    checked = 0
    for rank in sorted({0, 1, ranks // 2, ranks - 1}):
        mine = [s["key"] for s in rank_sequences(replace(spec, rank=rank, world_size=ranks), 0)]
        expected = whole[rank::ranks]
        assert mine[: len(expected)] == expected, f"rank {rank} of {ranks}: not the global order"
        checked += len(expected)
    return (
        f"ranks: {ranks} ranks, {spec.stream_partitions} partitions",
        f"4 ranks' streams tile the global order ({checked} samples)",
        f"{time.perf_counter() - start:.1f} s",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", required=True, help="a prepared corpus")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="best of, per row")
    parser.add_argument("--table-shards", default="1000,10000,100000")
    parser.add_argument("--blocks", type=int, default=8, help="blocks a synthetic shard")
    parser.add_argument("--parts", default="stream,table,ranks", help="rows to measure")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(n) for n in args.table_shards.split(",")]
    parts = set(args.parts.split(","))
    spec = corpus_spec(args.shards, args.batch_size) if parts - {"table"} else None
    rows = [
        *(stream_rows(spec, args.batches, args.repeats) if "stream" in parts else []),
        *(table_rows(sizes, args.blocks, args.repeats) if "table" in parts else []),
        *([ranks_row(spec, args.ranks)] if "ranks" in parts else []),
    ]
    print("| what | measured | against |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
