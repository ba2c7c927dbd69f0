"""The prepare array at scale (issue 53 item 6): an array of TASKS tasks, each step run as the
SLURM array runs it (`python -m data_pipelines.cli <step>` in its own process, `--workers` of
them at a time here: the local executor), over a generated JSONL corpus of very unequal files
with exact and near duplicates planted across files; the merge alone on 1,000 and 10,000
shards; and, side by side in this process on one core, prepare's tokenize + pack (cleaning,
sentence splitting, `encode_texts`, shard blocks) against the same tokenizer's `encode_batch`
over the same documents (up to `--compare-megabytes` of them).

Prints a markdown table: per step, wall seconds (the step, its tasks `--workers` at a time),
CPU seconds (all its tasks), MB of input per CPU second (per core), each task's peak RSS and the
projection in CPU-hours per TB of input; dedup recall and precision on the planted copies (a
pair is caught when one of its two documents is removed; precision: removed documents that
belong to a planted pair); with `--reference`, recall against the one-task run (the documents
a one-task array removes that the TASKS-task one removes too); the merge's time for 1,000 and
10,000 shards; prepare's CPU time over encode_batch's.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/prepare_scale.py [megabytes] [tasks]
        [--workers 1] [--reference] [--compare-megabytes 32] [--compare-text corpus,short,long]
        [--compare-tokenizer tokenizer.json]
"""

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FILTERS = "filters=[exact_dedup,near_dedup]"
# Runs the command after the file name and writes its peak RSS (kB) there: a child's own
# ru_maxrss starts at the RSS of the process that spawned it (this one holds the corpus),
# so it is measured one process further down, under a small parent.
PEAK_OF_CHILD = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
    "sys.exit(code)"
)


def write_corpus(
    root: Path, megabytes: float, files: int = 24
) -> tuple[list[str], list[tuple[str, str]]]:
    """`files` JSONL files of geometric sizes, `megabytes` in all; 2% of the documents are
    copies (half exact, half with one word changed) of documents of another file. Returns the
    paths and the planted pairs (copy, original)."""
    rng = random.Random(0)
    vocabulary = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
        for _ in range(20000)
    ]
    weights = [1.3**i for i in range(files)]
    budget = [megabytes * 1e6 * w / sum(weights) for w in weights]
    documents: list[list[str]] = []
    for size in budget:
        texts, total = [], 0
        while total < size:
            text = " ".join(rng.choices(vocabulary, k=rng.randint(80, 400)))
            texts.append(text)
            total += len(text) + 12
        documents.append(texts)
    pairs = []
    for i, texts in enumerate(documents):
        other = documents[(i + files // 2) % files]
        for k in range(max(1, len(texts) // 50)):
            words = other[k % len(other)].split()
            if k % 2:
                words[len(words) // 2] = "changed"
            pairs.append((" ".join(words), other[k % len(other)]))
            texts.insert(rng.randrange(len(texts)), pairs[-1][0])
    root.mkdir(parents=True)
    paths = []
    for i, texts in enumerate(documents):
        path = root / f"part{i:02d}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        paths.append(str(path))
    return paths, pairs


def run_steps(commands: list[list[str]], cwd: Path, workers: int) -> tuple[float, float, list]:
    """Run the `pretrain-data` steps `commands`, each in its own process, `workers` at a time:
    (wall seconds of them all, CPU seconds of them all, peak RSS in MB of each)."""
    start, cpu, peaks = time.perf_counter(), 0.0, [0] * len(commands)
    running: dict[int, tuple[int, subprocess.Popen]] = {}
    waiting = list(enumerate(commands))
    while waiting or running:
        while waiting and len(running) < workers:
            number, args = waiting.pop(0)
            process = subprocess.Popen(
                [sys.executable, "-c", PEAK_OF_CHILD, str(cwd / f".peak-{number}")]
                + [sys.executable, "-m", "data_pipelines.cli", *args],
                cwd=cwd,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            running[process.pid] = (number, process)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        number, process = running.pop(pid)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode:
            raise SystemExit(
                f"{' '.join(commands[number][:3])} failed: {process.stderr.read()[-2000:]}"
            )
        process.stderr.close()
        cpu += usage.ru_utime + usage.ru_stime
        peak = cwd / f".peak-{number}"
        peaks[number] = int(peak.read_text()) // 1024
        peak.unlink()
    return time.perf_counter() - start, cpu, peaks


def common_overrides(paths: list[str], out_dir: Path) -> list[str]:
    """The overrides every step of the array gets."""
    return [
        f"inputs=[{','.join(paths)}]",
        f"out_dir={out_dir}",
        FILTERS,
        "tokenizer.vocab_size=8000",
        "tokenizer.train_megabytes=4",
        "num_proc=1",
    ]


def array(paths: list[str], out_dir: Path, tasks: int, workers: int) -> dict[str, tuple]:
    """Each step of a `tasks`-task array over `paths`, `workers` tasks at a time:
    {step: (wall s, CPU s, [peak MB of each task])}; the dedup's `remove/` files are kept
    beside `out_dir` as `<name>.remove`."""
    from data_pipelines.prepare_config import compose_prepare_config
    from data_pipelines.slices import dedup_dir

    common = common_overrides(paths, out_dir)
    steps = {"tokenizer": [["prepare-tokenizer", *common]]}
    steps["signatures"] = [["dedup-signatures", str(i), str(tasks), *common] for i in range(tasks)]
    steps["dedup"] = [["dedup", str(tasks), *common]]
    steps["slices"] = [["prepare-slice", str(i), str(tasks), *common] for i in range(tasks)]
    steps["merge"] = [["merge", *common]]
    figures = {}
    for step, commands in steps.items():
        figures[step] = run_steps(commands, out_dir.parent, workers)
        if step == "dedup":  # the merge removes the work directory
            work = dedup_dir(compose_prepare_config(common), tasks)
            shutil.copytree(work / "remove", out_dir.parent / f"{out_dir.name}.remove")
    return figures


def removed_texts(paths: list[str], out_dir: Path, tasks: int) -> list[str]:
    """The texts of the documents the array's global dedup removed (its `remove/` files, kept
    by `array`, number each task's documents in order)."""
    import numpy as np

    from data_pipelines.global_dedup import DEDUP_FILTERS, kept_by_rules
    from data_pipelines.prepare_config import compose_prepare_config
    from data_pipelines.slices import slice_inputs

    cfg = compose_prepare_config(common_overrides(paths, out_dir))
    remove = out_dir.parent / f"{out_dir.name}.remove"
    texts = []
    for index in range(tasks):
        numbers = set()
        for name in DEDUP_FILTERS:
            numbers.update(np.fromfile(remove / f"{index:06d}.{name}", "<u4").tolist())
        documents = kept_by_rules(cfg, slice_inputs(cfg, index, tasks))
        texts += [d.text for n, d in enumerate(documents) if n in numbers]
    return texts


def planted_scores(pairs: list[tuple[str, str]], removed: list[str]) -> tuple[float, float]:
    """(recall, precision) of the removals on the planted pairs: a pair is caught when one of
    its documents was removed; precision counts removed documents that belong to a pair."""
    gone = set(removed)
    in_pairs = {text for pair in pairs for text in pair}
    caught = sum(1 for copy, original in pairs if copy in gone or original in gone)
    return caught / max(1, len(pairs)), sum(t in in_pairs for t in removed) / max(1, len(removed))


def merge_time(shards: int, root: Path) -> float:
    """Seconds `merged_corpus` takes to link `shards` shards of 4 slices (empty files with
    records: it reads none of them)."""
    from data_pipelines.prepare_config import PrepareConfig
    from data_pipelines.slices import merged_corpus

    slices = []
    for s in range(4):
        directory = root / f"slice-{s}"
        directory.mkdir(parents=True)
        records = []
        for i in range(shards // 4):
            name = f"shard-{i:06d}.tar"
            (directory / name).write_bytes(b"")
            records.append(
                {
                    "name": name,
                    "documents": 1,
                    "tokens": 1,
                    "bytes": 0,
                    "sha256": "0" * 64,
                    "blocks": [],
                }
            )
        manifest = {
            "tokenizer": {"sha256": "x"},
            "counts": {"documents": len(records)},
            "sources": [],
            "shards": records,
        }
        (directory / "manifest.json").write_text(json.dumps(manifest))
        slices.append(directory)
    partial = root / "merged"
    partial.mkdir()
    start = time.perf_counter()
    merged_corpus(PrepareConfig(filters=[]), slices, "x", partial)
    return time.perf_counter() - start


def corpus_texts(paths: list[str], megabytes: float) -> list[str]:
    """The first documents of `paths` (JSONL, in order), about `megabytes` MB of text."""
    texts, size = [], 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if size >= megabytes * 1e6:
                    return texts
                texts.append(json.loads(line)["text"])
                size += len(texts[-1].encode("utf-8"))
    return texts


def comparison_texts(kind: str, paths: list[str], megabytes: float, work: Path) -> list[str]:
    """The documents of the side by side: `corpus` (the array's, its first `megabytes` MB) or
    `short` / `long` (English paragraphs of the built-in corpus, benchmarks/prepare.py's)."""
    if kind == "corpus":
        return corpus_texts(paths, megabytes)
    import prepare as prepare_benchmark

    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{kind}.txt"
    prepare_benchmark.write_corpus(path, megabytes, prepare_benchmark.DOCUMENT_BYTES[kind])
    texts = prepare_benchmark.read_texts(path)
    path.unlink()
    return texts


def tokenize_side_by_side(tokenizer_json: Path, texts: list[str], work: Path) -> dict[str, float]:
    """CPU seconds, in this process, of the tokenizer's `encode_batch` and `encode_batch_fast`
    (no offsets) over `texts` (1,000 documents a call) and of prepare's tokenize + pack of them (`encode_texts` of 512 kB
    chunks, as a prepare worker does, and the shard writer's blocks and tar members)."""
    import numpy as np
    from tokenizers import Tokenizer

    from data_pipelines.document_encoding import CHUNK_BYTES, encode_texts
    from data_pipelines.prepare_config import PrepareConfig
    from data_pipelines.shard_writer import ShardWriter
    from pretrain.data.shard_format import ids_dtype

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    dtype = ids_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    sizes = np.cumsum([len(t.encode("utf-8")) for t in texts])
    cuts = np.searchsorted(sizes, np.arange(CHUNK_BYTES, sizes[-1] + CHUNK_BYTES, CHUNK_BYTES))
    bounds = [0, *sorted(set(min(len(texts), int(c) + 1) for c in cuts))]
    keys = [f"doc-{i}" for i in range(len(texts))]
    cfg = PrepareConfig()
    seconds = dict.fromkeys(("encode_batch", "encode_batch_fast", "prepare"), float("inf"))
    for round_ in range(2):  # alternating, the best of each
        for method in ("encode_batch", "encode_batch_fast"):
            encode = getattr(tokenizer, method)
            start = time.process_time()
            for i in range(0, len(texts), 1000):
                encode(texts[i : i + 1000], add_special_tokens=False)
            seconds[method] = min(seconds[method], time.process_time() - start)
        out = work / f"shards-{round_}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        start = time.process_time()
        with ShardWriter(out, cfg.docs_per_shard, cfg.tokens_per_block) as writer:
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                writer.write_batch(encode_texts(texts[a:b], keys[a:b], tokenizer, dtype).batch)
        seconds["prepare"] = min(seconds["prepare"], time.process_time() - start)
        shutil.rmtree(out)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("megabytes", type=float, nargs="?", default=16)
    parser.add_argument("tasks", type=int, nargs="?", default=16)
    parser.add_argument("--workers", type=int, default=1, help="array tasks run at a time")
    parser.add_argument(
        "--reference", action="store_true", help="also run the one-task array (recall against it)"
    )
    parser.add_argument(
        "--compare-megabytes", type=float, default=32, help="text for prepare vs encode_batch"
    )
    parser.add_argument(
        "--compare-text",
        default="corpus",
        help="comma-separated: corpus (the array's), short, long (benchmarks/prepare.py's English)",
    )
    parser.add_argument(
        "--compare-tokenizer", help="tokenizer.json for the side by side (default: the array's)"
    )
    args = parser.parse_args()
    # one core for the side by side: the tokenizer's rayon pool takes one thread
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
    megabytes, tasks = args.megabytes, args.tasks
    root = Path(tempfile.mkdtemp(prefix="prepare-scale-"))
    try:
        start = time.perf_counter()
        paths, pairs = write_corpus(root / "corpus", megabytes)
        written = time.perf_counter() - start
        size = sum(Path(p).stat().st_size for p in paths)
        figures = array(paths, root / "many", tasks, args.workers)
        print(
            f"corpus: {size / 1e6:.1f} MB in {len(paths)} files ({written:.0f} s to write), "
            f"{len(pairs)} planted copies; {tasks} tasks, {args.workers} at a time\n"
        )
        print(
            "| step | tasks | wall s | CPU s (all tasks) | MB/s per core | "
            "peak RSS MB per task | CPU-h per TB |"
        )
        print("|---|---|---|---|---|---|---|")
        for step, (wall, cpu, peaks) in figures.items():
            rss = str(peaks[0]) if len(peaks) == 1 else f"{min(peaks)}-{max(peaks)}"
            print(
                f"| {step} | {len(peaks)} | {wall:.1f} | {cpu:.1f} | "
                f"{size / 1e6 / max(cpu, 1e-9):.2f} | {rss} | {cpu / 3600 * 1e12 / size:.0f} |"
            )
        wall = sum(f[0] for f in figures.values())
        cpu = sum(f[1] for f in figures.values())
        print(
            f"| all | | {wall:.1f} | {cpu:.1f} | {size / 1e6 / cpu:.2f} | | "
            f"{cpu / 3600 * 1e12 / size:.0f} |"
        )
        manifest = json.loads((root / "many" / "manifest.json").read_text())
        removed = [manifest["filters"][f]["removed"] for f in ("exact_dedup", "near_dedup")]
        recall, precision = planted_scores(pairs, removed_texts(paths, root / "many", tasks))
        print(
            f"\nplanted: {len(pairs)} pairs, removed {sum(removed)} (exact {removed[0]}, near "
            f"{removed[1]}): recall {recall:.2f}, precision {precision:.2f}"
        )
        if args.reference:
            array(paths, root / "one", 1, 1)
            one = json.loads((root / "one" / "manifest.json").read_text())
            by_one = sum(one["filters"][f]["removed"] for f in ("exact_dedup", "near_dedup"))
            print(
                f"against the one-task run: removed {by_one}; same counts: "
                f"{manifest['counts'] == one['counts']}; "
                f"recall {min(sum(removed), by_one) / max(1, by_one):.2f}"
            )
        for shards in (1000, 10000):
            print(f"merge of {shards} shards: {merge_time(shards, root / f'merge-{shards}'):.3f} s")
        tokenizer_json = args.compare_tokenizer or root / "many" / "tokenizer" / "tokenizer.json"
        print(f"\none core, best of 2, tokenizer {tokenizer_json}:")
        for kind in args.compare_text.split(","):
            texts = comparison_texts(kind, paths, args.compare_megabytes, root / "side")
            text_mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
            seconds = tokenize_side_by_side(Path(tokenizer_json), texts, root / "side")
            print(
                f"- {kind}, {text_mb:.1f} MB ({len(texts)} documents): encode_batch "
                f"{text_mb / seconds['encode_batch']:.2f} MB/s, encode_batch_fast "
                f"{text_mb / seconds['encode_batch_fast']:.2f} MB/s, prepare's tokenize + pack "
                f"{text_mb / seconds['prepare']:.2f} MB/s; prepare / encode_batch (CPU) "
                f"{seconds['prepare'] / seconds['encode_batch']:.2f}x"
            )
        print(
            f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
