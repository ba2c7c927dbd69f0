"""Our loader against the ones users pick instead (issue 54 item 6), in one process on the
same tokens: MLM batches of --batch-size x --seq-len from local shards, each way in the main
process (0 workers: one core's work alone) and with 1 and 2 data-loader workers.

- `ours`: `pretrain-data prepare` shards read by the training stream (`EpochStream` under
  `StepAlignedLoader`, its forkserver workers as the datamodule starts them; `objective=mlm
  data=full_sentences`: whole sentences packed across documents, 15% 80/10/10).
- `ours_7_tensors`: the same, its workers handing each batch over as 7 tensors (a
  shared-memory segment each), as before `data/batch_wire.py` (one buffer of bytes, integers
  narrowed); `--only ours,ours_7_tensors` compares the two.
- `litdata`: LitData's `optimize()` (tokens written per document, `TokensLoader` blocks of
  --seq-len, its documented pre-training way) read by its `StreamingDataset` /
  `StreamingDataLoader`.
- `mosaic`: Mosaic streaming's `MDSWriter` (one int32 array of --seq-len a sample) read by
  its `StreamingDataset` under a torch DataLoader.
- `webdataset`: `webdataset.TarWriter` (one .npy a sample, shards of --wds-samples) read by
  `WebDataset` under a torch DataLoader.

Theirs pack as run_mlm.py's group_texts does (each document tokenized with [CLS]/[SEP] by the
corpus's own tokenizer as a HF fast tokenizer, concatenated, cut into --seq-len blocks) and mask
with transformers' DataCollatorForLanguageModeling (15%, 80/10/10); every way shuffles. A
library that does not import is skipped with a line saying so. Printed: conversion seconds
(ours: `prepare` with the tokenizer given, so no training; theirs: tokenize + pack + write,
one process), and batches/s from the first batch on (worker start-up left out), the best of
--repeats rounds, with batches/s and real (non-padding) tokens/s a worker, the machine's load
average before and after; then ours against the best of theirs at each worker count.

`--remote s3` measures the same again from moto's S3 server on 127.0.0.1 (`loaders_s3.py`):
each way's converted files uploaded (upload seconds printed), each read by its own S3 client
with an empty cache every round (webdataset: over HTTP, curl), its figures beside the local
ones, and the seconds to the first batch.

    .venv/bin/python benchmarks/loaders.py [--megabytes 8] [--batches 150] [--workers 0,1,2] \
        [--repeats 2] [--only ours,litdata,mosaic,webdataset] [--work-dir DIR] [--remote s3]
"""

import argparse
import contextlib
import os
import random
import re
import shutil
import sys
import tempfile
import time
import types
from importlib import util
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import default_convert  # noqa: E402

from data_pipelines.builtin_corpus import builtin_documents  # noqa: E402
from data_pipelines.prepare import prepare  # noqa: E402
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings  # noqa: E402
from pretrain.config import compose_config  # noqa: E402
from pretrain.data.loader import StepAlignedLoader, is_end_of_epoch  # noqa: E402
from pretrain.data.shard_format import load_manifest  # noqa: E402
from pretrain.data.stream import EpochStream  # noqa: E402
from pretrain.data.worker_processes import worker_context  # noqa: E402
from pretrain.runtime.run import build_stream  # noqa: E402

WAYS = ("ours", "ours_7_tensors", "litdata", "mosaic", "webdataset")
OURS = ("ours", "ours_7_tensors")


def write_corpus(path: Path, megabytes: float) -> list[str]:
    """The built-in corpus's documents, reshuffled copies until `megabytes` MB, written as
    plain text (documents split by blank lines, none inside one); returns the documents."""
    base = [re.sub(r"\n\s*\n", "\n", text).strip() for _, text in builtin_documents()]
    base = [text for text in base if text]
    documents, size, rng = [], 0, random.Random(0)
    while size < megabytes * 1e6:
        for text in rng.sample(base, len(base)):
            documents.append(text)
            size += len(text.encode()) + 2
            if size >= megabytes * 1e6:
                break
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return documents


def prepare_ours(text: Path, out_dir: Path, vocab_size: int, tokenizer: str | None) -> Path:
    """`pretrain-data prepare` of `text` into `out_dir` (one process); returns the shards dir."""
    settings = TokenizerSettings(vocab_size=vocab_size, path=tokenizer)
    config = PrepareConfig(
        inputs=[str(text)], out_dir=str(out_dir), tokenizer=settings, num_proc=1, overwrite=True
    )
    return Path(prepare(config, progress=False))


def hf_tokenizer(tokenizer_dir: Path):
    """The corpus's tokenizer as a transformers fast tokenizer."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(tokenizer_dir), model_max_length=1 << 30)


def document_ids(documents: list[str], tokenizer, chunk: int = 1000):
    """Each document's ids with [CLS]/[SEP] (run_mlm's tokenize_function), int32."""
    for start in range(0, len(documents), chunk):
        for ids in tokenizer(documents[start : start + chunk])["input_ids"]:
            yield np.asarray(ids, dtype=np.int32)


def packed_blocks(documents: list[str], tokenizer, seq_len: int):
    """run_mlm's group_texts: the documents' ids concatenated, cut into `seq_len` blocks (the
    remainder dropped)."""
    buffer = np.zeros(0, dtype=np.int32)
    for ids in document_ids(documents, tokenizer):
        buffer = np.concatenate([buffer, ids])
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            buffer = buffer[seq_len:]


class MaskedBatch:
    """collate_fn: samples -> transformers' MLM batch (15%, 80/10/10), picklable."""

    def __init__(self, tokenizer, key: str | None = None):
        from transformers import DataCollatorForLanguageModeling

        self.collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
        self.key = key

    def __call__(self, samples) -> dict:
        if self.key is not None:
            samples = [sample[self.key] for sample in samples]
        return self.collator([torch.as_tensor(np.asarray(s, dtype=np.int64)) for s in samples])


def _litdata_tokens(path: str, tokenizer_dir: str = ""):
    tokenizer = hf_tokenizer(Path(tokenizer_dir))
    documents = Path(path).read_text(encoding="utf-8").split("\n\n")
    for ids in document_ids(documents, tokenizer):
        yield torch.from_numpy(ids)


def convert(way: str, text: Path, documents: list[str], tokenizer_dir: Path, out: Path, args):
    """Write `way`'s format of the corpus under `out`."""
    tokenizer = hf_tokenizer(tokenizer_dir)
    if way == "litdata":
        from functools import partial

        from litdata import optimize
        from litdata.streaming.item_loader import TokensLoader

        optimize(  # litdata's LLM pre-training recipe: token arrays, blocks cut when read
            fn=partial(_litdata_tokens, tokenizer_dir=str(tokenizer_dir)),
            inputs=[str(text)],
            output_dir=str(out),
            chunk_size=args.seq_len * 2048,
            item_loader=TokensLoader(),
            num_workers=1,
            verbose=False,
        )
    elif way == "mosaic":
        from streaming import MDSWriter

        with MDSWriter(out=str(out), columns={"input_ids": "ndarray:int32"}) as writer:
            for block in packed_blocks(documents, tokenizer, args.seq_len):
                writer.write({"input_ids": block})
    elif way == "webdataset":
        import webdataset

        out.mkdir(parents=True)
        writer = None
        for index, block in enumerate(packed_blocks(documents, tokenizer, args.seq_len)):
            if index % args.wds_samples == 0:
                if writer is not None:
                    writer.close()
                writer = webdataset.TarWriter(str(out / f"{index // args.wds_samples:05d}.tar"))
            writer.write({"__key__": f"{index:09d}", "input_ids.npy": block})
        writer.close()


def loader(
    way: str,
    out: Path,
    tokenizer_dir: Path,
    workers: int,
    args,
    remote: str | list[str] | None = None,
    cache: Path | None = None,
):
    """`way`'s data loader of MLM batches over its converted corpus in `out`, or over its
    upload at `remote` (a URL; webdataset's: its tars' URLs) downloaded into the empty
    directory `cache`."""
    collate = MaskedBatch(hf_tokenizer(tokenizer_dir))
    if way in OURS:
        spec = corpus_spec(remote or out, args.batch_size, args.seq_len, cache)
        stream = EpochStream(spec, 0, errors_as_batches=True)
        context = worker_context(workers, spec.corruption)  # the datamodule's: forkserver
        # ours_7_tensors: each tensor its own shared-memory segment, as before batch_wire
        before = {"collate_fn": default_convert} if way == "ours_7_tensors" and workers else {}
        return StepAlignedLoader(
            stream,
            full_batch=args.batch_size,
            num_workers=workers,
            multiprocessing_context=context,
            **before,
        )
    if way == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming.item_loader import TokensLoader

        dataset = StreamingDataset(
            remote or str(out),
            cache_dir=str(cache) if remote else None,
            item_loader=TokensLoader(block_size=args.seq_len),
            shuffle=True,
        )
        return StreamingDataLoader(
            dataset,
            batch_size=args.batch_size,
            num_workers=workers,
            collate_fn=collate,
            **fork(workers),
        )
    if way == "mosaic":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        where = {"remote": remote, "local": str(cache)} if remote else {"local": str(out)}
        dataset = StreamingDataset(**where, batch_size=args.batch_size, shuffle=True)
        collate.key = "input_ids"
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=args.batch_size,
            num_workers=workers,
            collate_fn=collate,
            **fork(workers),
        )
    import webdataset

    urls = remote or sorted(str(p) for p in out.glob("*.tar"))
    dataset = webdataset.WebDataset(urls, shardshuffle=len(urls)).shuffle(1000).decode()
    collate.key = "input_ids.npy"
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, num_workers=workers, collate_fn=collate
    )


def corpus_spec(shards: Path | str, batch_size: int, seq_len: int, cache: Path | None = None):
    """The stream of an MLM run (15%, 80/10/10) on `shards` (a dir or URL; `cache`: the run's
    data.cache_dir), rows packed across documents."""
    overrides = [  # packed rows of --seq-len across documents, as group_texts packs
        "objective=mlm",
        "data=full_sentences",
        f"data.shards_dir={shards}",
        f"data.max_seq_length={seq_len}",
        *([f"data.cache_dir={cache}"] if cache else []),
    ]
    _, spec, _ = build_stream(compose_config([*overrides, f"data.batch_size={batch_size}"]))
    return spec


def batches_per_second(
    batches, limit: int, shape: tuple[int, int], started: float | None = None
) -> tuple[float, int, float, float]:
    """(batches/s from the first batch on, batches timed, mean non-padding tokens a row,
    seconds from `started` (a perf_counter reading; default now) to the first batch)."""
    count, first, tokens = 0, None, 0
    started = time.perf_counter() if started is None else started
    for batch in batches:
        if is_end_of_epoch(batch):
            break
        rows, width = batch["input_ids"].shape  # ours: whole sentences, up to seq_len
        assert rows == shape[0] and width <= shape[1], batch["input_ids"].shape
        assert batch["labels"].ne(-100).any()
        if first is None:
            first = time.perf_counter()
            continue
        count += 1
        mask = batch.get("attention_mask")
        tokens += int(mask.sum()) if mask is not None else rows * width
        if count >= limit:
            break
    if count == 0:
        raise SystemExit(f"loaders.py: fewer than 2 batches; raise --megabytes ({shape})")
    speed = count / (time.perf_counter() - first)
    return speed, count, tokens / count / shape[0], first - started


def importable(way: str) -> str | None:
    """None when `way`'s library imports, else why not."""
    module = {
        "ours": None,
        "ours_7_tensors": None,
        "litdata": "litdata",
        "mosaic": "streaming",
        "webdataset": "webdataset",
    }
    if module[way] is None:
        return None
    try:
        __import__(module[way])
    except Exception as error:  # noqa: BLE001 - any failure to import skips the library
        return f"{type(error).__name__}: {error}"
    return None


def stub_torchvision() -> bool:
    """Mosaic streaming's package imports its vision datasets (torchvision), unused for text.
    With torchvision not importable (or built for another torch) and streaming installed,
    stand-in modules in sys.modules let `import streaming` work; run at import, after
    lightning's imports (which look for torchvision), so spawned data-loader workers, which
    import this script first, have them too. Returns whether they were made."""
    if util.find_spec("streaming") is None or "torchvision" in sys.modules:
        return False
    try:
        import torchvision  # noqa: F401

        return False
    except Exception:  # noqa: BLE001 - missing, or built for another torch
        pass
    for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
        del sys.modules[name]
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms"):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__path__ = []
    sys.modules["torchvision.transforms.functional"] = types.ModuleType("functional")
    sys.modules["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})
    sys.modules["torchvision.transforms.functional"].to_tensor = None
    return True


def fork(workers: int) -> dict:
    """Theirs: workers forked, Linux's default (litdata's optimize() sets the process's)."""
    return {"multiprocessing_context": "fork"} if workers else {}


_STAND_IN = stub_torchvision()  # torchvision stand-in modules made (for `import streaming`)


def remove_stand_in() -> None:
    """Take the torchvision stand-in out of sys.modules (a caller's process goes on without
    it)."""
    global _STAND_IN
    if _STAND_IN:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
    _STAND_IN = False


def measure(converted: dict, uploaded: dict, tokenizer_dir: Path, work: Path, args) -> dict:
    """{(way, workers, place): the best of --repeats (batches/s, batches, tokens a row, first
    batch s)}, place None (local) or "s3" (from `uploaded`'s URL, an empty cache each time)."""
    shape = (args.batch_size, args.seq_len)
    places = [None, *(["s3"] if uploaded else [])]
    runs = [(w, int(n), p) for w in converted for n in args.workers.split(",") for p in places]
    measured = {}
    for round_ in range(args.repeats):  # rounds taken in turn: a loaded machine's swings spread
        for way, workers, place in runs:
            remote = uploaded[way][1] if place else None
            cache = work / "cache" / f"{way}-{workers}-{round_}" if place else None
            started = time.perf_counter()
            batches = loader(way, converted[way][1], tokenizer_dir, workers, args, remote, cache)
            result = batches_per_second(batches, args.batches, shape, started)
            if hasattr(batches, "close"):
                batches.close()
            del batches
            key = (way, workers, place)
            measured[key] = max(measured.get(key, result), result)
            if cache is not None:
                shutil.rmtree(cache, ignore_errors=True)
    return measured


def print_local_table(measured: dict, converted: dict, args) -> None:
    """The local rows of `measured` (see `measure`), then ours against the best of theirs."""
    print(
        "| way | convert s | workers | batches/s | per worker | batches | tokens/row "
        "| k tokens/s per worker |"
    )
    print("|---|---|---|---|---|---|---|---|")
    per_worker: dict[tuple[str, int], float] = {}  # real tokens/s a worker
    for (way, workers, place), (speed, count, tokens, _) in measured.items():
        if place is not None:
            continue
        per_worker[(way, workers)] = speed / max(workers, 1) * tokens * args.batch_size
        print(
            f"| {way} | {converted[way][0]:.1f} | {workers} | {speed:.2f} "
            f"| {speed / max(workers, 1):.2f} | {count} | {tokens:.0f} "
            f"| {per_worker[(way, workers)] / 1e3:.0f} |"
        )
    print()
    print_ratios(per_worker)


def print_ratios(per_worker: dict[tuple[str, int], float], where: str = "") -> None:
    """For each worker count, ours against the best of theirs in `per_worker` {(way,
    workers): real tokens/s a worker}, each line prefixed by `where` ("s3, ")."""
    for workers in sorted({w for _, w in per_worker}):
        theirs = {w: s for (w, n), s in per_worker.items() if n == workers and w not in OURS}
        if ("ours", workers) in per_worker and theirs:
            way = max(theirs, key=theirs.get)
            ratio = per_worker[("ours", workers)] / theirs[way]
            print(
                f"{where}{workers} worker(s): ours / the best of theirs ({way}), real tokens/s "
                f"a worker: {ratio:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=8.0, help="text of the corpus")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=150, help="timed batches at most")
    parser.add_argument("--workers", default="0,1,2", help="0: in the main process")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--wds-samples", type=int, default=256, help="samples a tar shard")
    parser.add_argument("--only", default=",".join(WAYS))
    parser.add_argument("--repeats", type=int, default=2, help="best of this many rounds")
    parser.add_argument("--work-dir", help="kept; default a temporary directory")
    parser.add_argument("--remote", choices=["s3"], help="also from moto's S3 server")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="loaders-"))
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as server:
        endpoint = None
        if args.remote == "s3":  # started first: the workers' forkserver inherits its variables
            from loaders_s3 import s3_server

            endpoint = server.enter_context(s3_server())
        run(args, work, endpoint)
    remove_stand_in()
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path, endpoint: str | None) -> None:
    """Convert, (upload to `endpoint`,) measure and print, in `work`."""
    text = work / "corpus.txt"
    documents = write_corpus(text, args.megabytes)
    # the tokenizer, trained once (untimed); every way then uses it
    tokenizer_dir = load_manifest(
        prepare_ours(text, work / "tokenizer-run", args.vocab_size, None)
    ).tokenizer_dir
    print(f"corpus: {text.stat().st_size / 1e6:.1f} MB, {len(documents)} documents")
    if _STAND_IN:
        print("mosaic: torchvision not importable; stand-in modules for streaming.vision's import")
    converted = {}  # way -> (conversion seconds, its directory)
    for way in [w for w in args.only.split(",") if w]:
        why = importable(way)
        if why is not None:
            print(f"{way}: skipped, its library does not import ({why})")
            continue
        out = work / way
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        if way == "ours_7_tensors" and "ours" in converted:
            converted[way] = converted["ours"]  # the same shards, read the same way
            continue
        if way in OURS:
            prepare_ours(text, out, args.vocab_size, str(tokenizer_dir))
        else:
            convert(way, text, documents, tokenizer_dir, out, args)
        converted[way] = (time.perf_counter() - start, out)
    uploaded = {}  # way -> (upload seconds, the URL its reader opens)
    if endpoint is not None:
        from loaders_s3 import upload

        for way, (_, out) in converted.items():
            if way == "ours_7_tensors" and "ours" in uploaded:
                uploaded[way] = uploaded["ours"]  # the same shards
            else:
                uploaded[way] = upload(way, out)
    print(f"load average before measuring: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    measured = measure(converted, uploaded, tokenizer_dir, work, args)
    print(
        f"\nMLM batches of {args.batch_size} x {args.seq_len}, local shards, best of "
        f"{args.repeats}; load average {os.getloadavg()[0]:.2f} at the end:\n"
    )
    print_local_table(measured, converted, args)
    if uploaded:
        from loaders_s3 import print_table

        print(
            f"\nThe same from moto's S3 server on 127.0.0.1 (an empty cache each time), best of "
            f"{args.repeats}, beside the local figures:\n"
        )
        print_table(measured, converted, uploaded, args.batch_size, print_ratios)


if __name__ == "__main__":
    main()
