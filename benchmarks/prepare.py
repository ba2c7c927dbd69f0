"""`pretrain-data prepare` against the tokenizer it exists to run, side by side in one run.

Generates a plain-text corpus (default 100 MB) twice, once of short documents (about 190
bytes, a web-forum post) and once of long ones (about 20 KB, an article), from the built-in
corpus's paragraphs drawn at random, trains one tokenizer on the first (timed on its own),
then on each corpus, with the same cores:

- `encode_batch`: the fast tokenizer's own batch encoding of every document's text, in
  batches of 1,000 documents (all cores: the tokenizer's own threads);
- `prepare`: `pretrain-data prepare` with that tokenizer (`tokenizer.path`), `num_proc`
  processes (default: all cores), from reading the text to the manifest;

and prints MB of text per second for both (and for `encode_batch_fast`, which skips offsets
and word ids: prepare uses it for WordPiece, whose word starts follow from the ids) and the
ratio of prepare's time to encode_batch's, and the shards' bytes against
the physical size of their content (ids at the manifest dtype, int32 sentence ends, one bit
per token for word starts, an int64 offset per document and per sentence list). Targets
(benchmarks/RESULTS.md): prepare within 1.5x of encode_batch's time, shards within 1.15x of
the physical size.

    .venv/bin/python benchmarks/prepare.py [--megabytes 100] [--repeats 1] [--num-proc N] [--work-dir DIR] [--keep]

Needs about 3x --megabytes of disk per kind (text, shards) in --work-dir; about 2 minutes per
10 MB on 2 cores.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DOCUMENT_BYTES = {"short": 190, "long": 20_000}


def builtin_paragraphs() -> list[str]:
    """The built-in corpus's paragraphs (lines), about 2 MB of English."""
    from data_pipelines.builtin_corpus import builtin_documents

    return [line for _, text in builtin_documents() for line in text.split("\n") if line.strip()]


def write_corpus(path: Path, megabytes: float, document_bytes: int, seed: int = 0) -> int:
    """Write a plain-text corpus of about `megabytes` MB to `path`: documents of about
    `document_bytes` bytes (random paragraphs of the built-in corpus, one a line) separated
    by blank lines. Returns the number of documents."""
    paragraphs = builtin_paragraphs()
    rng = np.random.default_rng(seed)
    target, written, documents = int(megabytes * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            lines, size = [], 0
            budget = rng.integers(document_bytes // 2, document_bytes * 3 // 2 + 1)
            while size < budget:
                line = paragraphs[int(rng.integers(len(paragraphs)))]
                if size and size + len(line) > budget * 1.5:
                    line = line[: max(1, budget - size)].rsplit(" ", 1)[0] or line[:40]
                lines.append(line)
                size += len(line) + 1
            text = "\n".join(lines) + "\n\n"
            f.write(text)
            written += len(text.encode("utf-8"))
            documents += 1
    return documents


def read_texts(path: Path) -> list[str]:
    """The documents of a corpus written by `write_corpus`, as prepare's reader splits them."""
    from data_pipelines.sources import SourceStats, read_source

    return list(read_source(str(path), SourceStats(str(path))))


def time_encode_batch(
    tokenizer_json: Path, texts: list[str], method: str = "encode_batch", batch: int = 1000
) -> float:
    """Seconds the fast tokenizer's `encode_batch` (or `encode_batch_fast`: no offsets) takes
    over `texts`, `batch` documents a call, with its own threads on every core (the text
    already in memory)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    encode = getattr(tokenizer, method)
    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        encode(texts[i : i + batch], add_special_tokens=False)
    return time.perf_counter() - start


def time_training(corpus: Path, out: Path, vocab_size: int) -> float:
    """Seconds to train and save prepare's tokenizer on `corpus` (as prepare does)."""
    from data_pipelines.prepare import make_tokenizer
    from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings

    cfg = PrepareConfig(inputs=[str(corpus)], tokenizer=TokenizerSettings(vocab_size=vocab_size))
    start = time.perf_counter()
    make_tokenizer(cfg, [str(corpus)], out)
    return time.perf_counter() - start


def time_prepare(corpus: Path, tokenizer_dir: Path, out: Path, num_proc: int) -> float:
    """Seconds of `pretrain-data prepare` of `corpus` with the tokenizer in `tokenizer_dir`."""
    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings

    cfg = PrepareConfig(
        inputs=[str(corpus)],
        out_dir=str(out),
        tokenizer=TokenizerSettings(path=str(tokenizer_dir)),
        num_proc=num_proc,
        overwrite=True,
    )
    start = time.perf_counter()
    prepare(cfg, progress=False)
    return time.perf_counter() - start


def physical_bytes(manifest: dict) -> int:
    """The content's physical size: ids at the manifest dtype, int32 sentence ends, one bit
    per token of word starts, an int64 offset per document."""
    counts = manifest["counts"]
    tokens = counts["tokens"]
    return (
        np.dtype(manifest["dtype"]).itemsize * tokens
        + 4 * counts["sentences"]
        + -(-tokens // 8)
        + 8 * counts["documents"]
    )


def main() -> None:
    import json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=100.0, help="corpus size per kind")
    parser.add_argument("--num-proc", type=int, default=None, help="default: every core")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--work-dir", default=None, help="default: a temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep corpora and shards")
    parser.add_argument("--kinds", default="short,long")
    parser.add_argument("--repeats", type=int, default=1, help="best of this many, alternating")
    args = parser.parse_args()
    from data_pipelines.document_encoding import default_num_proc

    num_proc = args.num_proc or default_num_proc()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    kinds = args.kinds.split(",")
    rows = []
    tokenizer_dir = work / "tokenizer"
    for kind in kinds:
        corpus = work / f"{kind}.txt"
        documents = write_corpus(corpus, args.megabytes, DOCUMENT_BYTES[kind])
        megabytes = corpus.stat().st_size / 1e6
        if not (tokenizer_dir / "tokenizer.json").is_file():
            trained = time_training(corpus, tokenizer_dir, args.vocab_size)
            print(
                f"tokenizer: trained on the {kind} corpus ({megabytes:.0f} MB) in {trained:.1f} s "
                f"({megabytes / trained:.2f} MB/s), timed apart from prepare",
                file=sys.stderr,
            )
        texts = read_texts(corpus)
        shards = work / f"shards-{kind}"
        encode = fast = seconds = float("inf")
        for _ in range(args.repeats):  # alternating, best of each: load spikes hit both alike
            encode = min(encode, time_encode_batch(tokenizer_dir / "tokenizer.json", texts))
            fast = min(
                fast,
                time_encode_batch(tokenizer_dir / "tokenizer.json", texts, "encode_batch_fast"),
            )
            seconds = min(seconds, time_prepare(corpus, tokenizer_dir, shards, num_proc))
        del texts
        manifest = json.loads((shards / "manifest.json").read_text())
        shard_bytes = sum(shard["bytes"] for shard in manifest["shards"])
        rows.append(
            (
                kind,
                documents,
                megabytes,
                megabytes / encode,
                megabytes / fast,
                megabytes / seconds,
                seconds / encode,
                shard_bytes / 1e6,
                physical_bytes(manifest) / 1e6,
            )
        )
        if not args.keep:
            shutil.rmtree(shards)
            corpus.unlink()
    print(
        f"prepare with {num_proc} processes, encode_batch with its threads; {os.cpu_count()} cores"
    )
    print(
        f"{'documents':<10} {'count':>9} {'MB':>5} {'encode_batch':>13} {'_fast':>7} "
        f"{'prepare':>8} {'time ratio':>11} {'shard MB':>9} {'physical MB':>12} {'size ratio':>11}"
    )
    for kind, documents, mb, encode, fast, prepared, ratio, shard_mb, physical_mb in rows:
        print(
            f"{kind:<10} {documents:>9,} {mb:>5.0f} {encode:>8.2f} MB/s {fast:>7.2f} "
            f"{prepared:>8.2f} {ratio:>10.2f}x {shard_mb:>9.1f} {physical_mb:>12.1f} "
            f"{shard_mb / physical_mb:>10.3f}x"
        )
    if not args.keep and args.work_dir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
