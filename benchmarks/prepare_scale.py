"""The prepare array at scale (issue 53 item 6): an array of TASKS tasks, each step run as the
SLURM array runs it (`python -m data_pipelines.cli <step>` in its own process, one after
another here: the local executor), over a generated JSONL corpus of very unequal files with
exact and near duplicates planted across files; and the merge alone on 1,000 and 10,000
shards.

Prints a markdown table: per step, wall seconds (all its tasks), the largest task's peak RSS,
and the projection in CPU-hours per TB of input; dedup recall against the one-task run (the
documents a one-task array removes that the TASKS-task one removes too); the merge's time for
1,000 and 10,000 shards.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prepare_scale.py [megabytes] [tasks]
"""

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


def write_corpus(root: Path, megabytes: float, files: int = 24) -> tuple[list[str], int]:
    """`files` JSONL files of geometric sizes, `megabytes` in all; 2% of the documents are
    copies (half exact, half with one word changed) of documents of another file."""
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
    planted = 0
    for i, texts in enumerate(documents):
        other = documents[(i + files // 2) % files]
        for k in range(max(1, len(texts) // 50)):
            words = other[k % len(other)].split()
            if k % 2:
                words[len(words) // 2] = "changed"
            texts.insert(rng.randrange(len(texts)), " ".join(words))
            planted += 1
    root.mkdir(parents=True)
    paths = []
    for i, texts in enumerate(documents):
        path = root / f"part{i:02d}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        paths.append(str(path))
    return paths, planted


def run_step(args: list[str], cwd: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of one `pretrain-data` step in its own process."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "data_pipelines.cli", *args],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{args[0]} failed: {process.stderr.read()[-2000:]}")
    return time.perf_counter() - start, usage.ru_maxrss // 1024


def array(paths: list[str], out_dir: Path, tasks: int) -> dict[str, tuple[float, int]]:
    """Each step of a `tasks`-task array over `paths`: {step: (seconds, peak MB)}."""
    common = [
        f"inputs=[{','.join(paths)}]",
        f"out_dir={out_dir}",
        FILTERS,
        "tokenizer.vocab_size=8000",
        "tokenizer.train_megabytes=4",
        "num_proc=1",
    ]
    steps = {"tokenizer": [["prepare-tokenizer", *common]]}
    steps["signatures"] = [["dedup-signatures", str(i), str(tasks), *common] for i in range(tasks)]
    steps["dedup"] = [["dedup", str(tasks), *common]]
    steps["slices"] = [["prepare-slice", str(i), str(tasks), *common] for i in range(tasks)]
    steps["merge"] = [["merge", *common]]
    figures = {}
    for step, commands in steps.items():
        runs = [run_step(command, out_dir.parent) for command in commands]
        figures[step] = (sum(r[0] for r in runs), max(r[1] for r in runs))
    return figures


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


def main() -> None:
    megabytes = float(sys.argv[1]) if len(sys.argv) > 1 else 16
    tasks = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    root = Path(tempfile.mkdtemp(prefix="prepare-scale-"))
    try:
        paths, planted = write_corpus(root / "corpus", megabytes)
        size = sum(Path(p).stat().st_size for p in paths)
        figures = array(paths, root / "many", tasks)
        array(paths, root / "one", 1)  # the reference: one task
        kept = [json.loads((root / d / "manifest.json").read_text()) for d in ("many", "one")]
        removed = [
            sum(m["filters"][f]["removed"] for f in ("exact_dedup", "near_dedup")) for m in kept
        ]
        print(
            f"corpus: {size / 1e6:.1f} MB in {len(paths)} files, {planted} planted copies; {tasks} tasks\n"
        )
        print("| step | tasks | wall s (all tasks) | peak RSS MB (largest task) | CPU-h per TB |")
        print("|---|---|---|---|---|")
        for step, (seconds, peak) in figures.items():
            count = tasks if step in ("signatures", "slices") else 1
            print(
                f"| {step} | {count} | {seconds:.1f} | {peak} | {seconds / 3600 * 1e12 / size:.0f} |"
            )
        print(
            f"\nremoved: {removed[0]} ({tasks} tasks), {removed[1]} (one task); same counts: "
            f"{kept[0]['counts'] == kept[1]['counts']}; recall {min(removed) / max(1, removed[1]):.2f}"
        )
        for shards in (1000, 10000):
            print(f"merge of {shards} shards: {merge_time(shards, root / f'merge-{shards}'):.3f} s")
        print(
            f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
