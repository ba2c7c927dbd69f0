"""`pretrain-data prepare` against the tokenizer it exists to run, side by side in one run.

Generates a corpus (default 100 MB) twice, once of short documents (about 190 bytes, a
web-forum post) and once of long ones (about 20 KB, an article), from the built-in corpus's
paragraphs drawn at random, written as `--input-format` (text, jsonl, jsonl.zst, parquet,
csv), then on each, with the same cores:

- `+training`: `pretrain-data prepare` from scratch, the tokenizer trained as prepare trains
  it (on `tokenizer.train_megabytes`, default 20 MB, of the text), from reading the input to
  the manifest;
- `encode_batch`: that tokenizer's own batch encoding of every document's text, in batches
  of 1,000 documents (all cores: the tokenizer's own threads; the text already in memory);
- `train_from_iterator`: the tokenizers library training the same WordPiece pipeline on the
  text prepare trains on (the first `tokenizer.train_megabytes` MB), its own threads on
  every core: with `encode_batch`, what the tokenizer alone takes to train and encode;
- `prepare`: `pretrain-data prepare` with that tokenizer (`tokenizer.path`), `num_proc`
  processes (default: all cores);
- `+filters` (with `--filters exact_dedup,quality,...`): the same with those filters;

and prints MB of text per second (also for `encode_batch_fast`, which skips offsets and word
ids: prepare uses it for WordPiece, whose word starts follow from the ids), prepare's time
over encode_batch's, prepare-with-training's over train_from_iterator's + encode_batch's
(and, bracketed, over encode_batch's alone), in wall-clock and in CPU seconds, and the
shards' bytes against the physical size of their content (ids at the manifest dtype, int32
sentence ends, one bit per token for word starts, an int64 offset per document and per
sentence list). Targets (benchmarks/RESULTS.md): prepare, the training included, within
1.5x of the tokenizer's own time on the same text and cores; shards within 1.15x of the
physical size.

    .venv/bin/python benchmarks/prepare.py [--megabytes 100] [--repeats 1] [--num-proc N]
        [--input-format text] [--filters F,...] [--work-dir DIR] [--keep]

Needs about 3x --megabytes of disk per kind (text, shards) in --work-dir; about 3 minutes per
10 MB on 2 cores.
"""

import argparse
import os
import shutil
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
    """The documents of a corpus (any input format), as prepare's reader gives them."""
    from data_pipelines.sources import SourceStats, read_source

    return list(read_source(str(path), SourceStats(str(path))))


def clocks() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its finished children)."""
    t = os.times()
    return time.perf_counter(), t.user + t.system + t.children_user + t.children_system


def since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since `start` (from `clocks`). CPU time is what load from other
    processes on the machine does not inflate: ratios of it compare work on the same cores."""
    now = clocks()
    return now[0] - start[0], now[1] - start[1]


def time_encode_batch(
    tokenizer_json: Path, texts: list[str], method: str = "encode_batch", batch: int = 1000
) -> float:
    """(wall, CPU) seconds the fast tokenizer's `encode_batch` (or `encode_batch_fast`: no offsets) takes
    over `texts`, `batch` documents a call, with its own threads on every core (the text
    already in memory)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    encode = getattr(tokenizer, method)
    start = clocks()
    for i in range(0, len(texts), batch):
        encode(texts[i : i + batch], add_special_tokens=False)
    return since(start)


def time_train_from_iterator(
    texts: list[str], vocab_size: int, train_megabytes: float | None
) -> tuple[float, float]:
    """(wall, CPU) seconds of the tokenizers library training the same WordPiece pipeline
    (BertNormalizer, BertPreTokenizer, vocabulary `vocab_size`, pairs seen twice) with its own
    `train_from_iterator` on the text prepare trains on: the first documents up to
    `train_megabytes` MB (all of them for a smaller corpus), with its threads on every core."""
    from tokenizers import trainers

    from data_pipelines.tokenizer import SPECIAL_TOKENS, build_tokenizer

    budget = int(train_megabytes * 1e6) if train_megabytes else None
    chosen, size = [], 0
    for text in texts:
        if budget is not None and size >= budget:
            break
        chosen.append(text)
        size += len(text.encode("utf-8"))
    tokenizer = build_tokenizer(lowercase=True)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    start = clocks()
    tokenizer.train_from_iterator(chosen, trainer=trainer)
    return since(start)


def write_input(corpus: Path, input_format: str) -> Path:
    """The text corpus `corpus` rewritten as `input_format` (text: as it is; jsonl,
    jsonl.zst, parquet, csv: one record per document, the text in `text`)."""
    if input_format == "text":
        return corpus
    texts = read_texts(corpus)
    path = corpus.with_suffix(f".{input_format}")
    if input_format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts}), path, row_group_size=10_000)
    elif input_format == "csv":
        import csv

        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text"])
            writer.writerows([t] for t in texts)
    else:
        import json

        data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode("utf-8")
        if input_format == "jsonl.zst":
            import zstandard

            data = zstandard.ZstdCompressor().compress(data)
        path.write_bytes(data)
    corpus.unlink()
    return path


def time_prepare(
    corpus: Path,
    tokenizer_dir: Path | None,
    out: Path,
    num_proc: int,
    vocab_size: int = 8000,
    filters: list[str] | None = None,
    train_megabytes: float | None = None,
) -> tuple[float, float]:
    """(wall, CPU) seconds of `pretrain-data prepare` of `corpus`, from reading the input to the
    manifest: with the tokenizer in `tokenizer_dir`, or (None) training one as prepare does
    (`tokenizer.train_megabytes` of text), with the cleaning `filters`."""
    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings

    budget = {"train_megabytes": train_megabytes} if train_megabytes else {}
    tokenizer = (
        TokenizerSettings(path=str(tokenizer_dir))
        if tokenizer_dir
        else TokenizerSettings(vocab_size=vocab_size, **budget)
    )
    cfg = PrepareConfig(
        inputs=[str(corpus)],
        out_dir=str(out),
        tokenizer=tokenizer,
        num_proc=num_proc,
        overwrite=True,
        filters=list(filters or []),
    )
    start = clocks()
    prepare(cfg, progress=False)
    return since(start)


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
    parser.add_argument(
        "--input-format", default="text", choices=("text", "jsonl", "jsonl.zst", "parquet", "csv")
    )
    parser.add_argument("--filters", default="", help="also time prepare with these filters")
    parser.add_argument(
        "--train-megabytes",
        type=float,
        default=None,
        help="tokenizer.train_megabytes (default: prepare's); a 10 MB corpus with 2 is a "
        "scale model of a 100 MB one with the default 20",
    )
    args = parser.parse_args()
    from data_pipelines.document_encoding import default_num_proc
    from data_pipelines.prepare_config import TokenizerSettings

    num_proc = args.num_proc or default_num_proc()
    default_train_megabytes = TokenizerSettings().train_megabytes
    filters = [f for f in args.filters.split(",") if f]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in args.kinds.split(","):
        text_corpus = work / f"{kind}.txt"
        documents = write_corpus(text_corpus, args.megabytes, DOCUMENT_BYTES[kind])
        megabytes = text_corpus.stat().st_size / 1e6
        corpus = write_input(text_corpus, args.input_format)
        texts = read_texts(corpus)
        shards, trained = work / f"shards-{kind}", work / f"trained-{kind}"
        keys = ("encode", "fast", "train", "prepare", "trained", "filtered")
        best = {key: (float("inf"), float("inf")) for key in keys}
        for _ in range(args.repeats):  # alternating, best of each: load spikes hit both alike
            timing = {
                "trained": time_prepare(
                    corpus,
                    None,
                    trained,
                    num_proc,
                    args.vocab_size,
                    train_megabytes=args.train_megabytes,
                )
            }
            tokenizer_json = trained / "tokenizer" / "tokenizer.json"
            timing["encode"] = time_encode_batch(tokenizer_json, texts)
            timing["fast"] = time_encode_batch(tokenizer_json, texts, "encode_batch_fast")
            timing["train"] = time_train_from_iterator(
                texts, args.vocab_size, args.train_megabytes or default_train_megabytes
            )
            timing["prepare"] = time_prepare(corpus, trained / "tokenizer", shards, num_proc)
            if filters:
                timing["filtered"] = time_prepare(
                    corpus, trained / "tokenizer", work / "filtered", num_proc, filters=filters
                )
            for key, (wall, cpu) in timing.items():
                best[key] = (min(best[key][0], wall), min(best[key][1], cpu))
        del texts
        manifest = json.loads((shards / "manifest.json").read_text())
        shard_bytes = sum(shard["bytes"] for shard in manifest["shards"])
        rows.append((kind, documents, megabytes, best, shard_bytes / 1e6, physical_bytes(manifest)))
        if not args.keep:
            shutil.rmtree(shards)
            shutil.rmtree(trained)
            shutil.rmtree(work / "filtered", ignore_errors=True)
            corpus.unlink()
    print(
        f"prepare with {num_proc} processes, the tokenizers library with its threads; "
        f"{os.cpu_count()} cores; input {args.input_format}. Ratios: prepare / encode_batch; "
        "+training: prepare training its tokenizer / (train_from_iterator + encode_batch), "
        "[/ encode_batch alone]"
    )
    print(
        f"{'documents':<10} {'count':>9} {'MB':>5} {'encode_batch':>13} {'_fast':>7} "
        f"{'train s':>8} {'prepare':>8} | wall: {'ratio':>6} {'+training':>10}"
        + (f" {'+filters':>9}" if filters else "")
        + f" | CPU: {'ratio':>6} {'+training':>10} {'[alone]':>8}"
        + (f" {'+filters':>9}" if filters else "")
        + f" | {'shard MB':>9} {'physical MB':>12} {'size ratio':>11}"
    )
    for kind, documents, mb, best, shard_mb, physical in rows:
        wall = {key: value[0] for key, value in best.items()}
        cpu = {key: value[1] for key, value in best.items()}

        def trained(t: dict) -> float:
            return t["trained"] / (t["train"] + t["encode"])

        print(
            f"{kind:<10} {documents:>9,} {mb:>5.0f} {mb / wall['encode']:>8.2f} MB/s "
            f"{mb / wall['fast']:>7.2f} {wall['train']:>8.1f} {mb / wall['prepare']:>8.2f} | "
            f"      {wall['prepare'] / wall['encode']:>5.2f}x {trained(wall):>9.2f}x"
            + (f" {wall['filtered'] / wall['encode']:>8.2f}x" if filters else "")
            + f" |      {cpu['prepare'] / cpu['encode']:>5.2f}x {trained(cpu):>9.2f}x"
            + f" {cpu['trained'] / cpu['encode']:>7.2f}x"
            + (f" {cpu['filtered'] / cpu['encode']:>8.2f}x" if filters else "")
            + f" | {shard_mb:>9.1f} {physical / 1e6:>12.1f} {shard_mb * 1e6 / physical:>10.3f}x"
        )
    if not args.keep and args.work_dir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
