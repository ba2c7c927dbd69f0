"""`prepare`: inputs -> tokenizer -> shards -> [span annotations] -> manifest, written
atomically.

Everything is written into `.<out_dir name>.partial` beside `out_dir` and renamed into place
only when complete, so an interrupted run leaves no half-written dataset (the partial
directory of an interrupted run is removed by the next one). A non-empty `out_dir` is replaced
only with `overwrite=true`, and only once its replacement is complete.
"""

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer

from data_pipelines.annotate import annotate_corpus
from data_pipelines.builtin_corpus import builtin_documents
from data_pipelines.cleaning import CleaningStats, clean_documents
from data_pipelines.document_encoding import default_num_proc, encode_corpus
from data_pipelines.prepare_config import PrepareConfig, PrepareError
from data_pipelines.publish import check_remote_out_dir, local_out_dir, publish
from data_pipelines.shard_writer import ShardWriter
from data_pipelines.sources import (
    BUILTIN,
    RawDocument,
    SourceStats,
    expand_inputs,
    read_raw_documents,
    read_source,
)
from data_pipelines.text import normalize_many
from data_pipelines.tokenizer import (
    copy_tokenizer,
    is_lowercase,
    save_tokenizer,
    tokenizer_sha256,
    train_tokenizer,
)
from pretrain.data.shard_format import FORMAT_VERSION, MANIFEST_FILE, ids_dtype
from pretrain.storage import is_url

TOKENIZER_DIR = "tokenizer"
NORMALIZE_BATCH_CHARS = 1 << 20  # characters of training text normalized at once


def _check_out_dir(out_dir: Path, overwrite: bool, names: list[str]) -> None:
    """Refuse an out_dir whose replacement would lose data: a file, a non-empty directory
    without overwrite, one that is not a prepared corpus, or one holding inputs."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PrepareError(f"out_dir={out_dir}: is a file; choose a directory path")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise PrepareError(
            f"out_dir={out_dir}: exists and is not empty; choose another out_dir, "
            "or pass overwrite=true to replace it"
        )
    if not (out_dir / MANIFEST_FILE).is_file():
        raise PrepareError(
            f"out_dir={out_dir}: holds files but no {MANIFEST_FILE}, so it is not a "
            "prepared corpus and overwrite=true will not delete it; choose another out_dir"
        )
    inside = [n for n in names if Path(n).resolve().is_relative_to(out_dir)]
    if inside:
        raise PrepareError(
            f"out_dir={out_dir}: holds the inputs {inside[:3]}; choose another out_dir"
        )


def cleaned_documents(
    cfg: PrepareConfig, documents: Iterable[RawDocument]
) -> tuple[Iterator[RawDocument], CleaningStats]:
    """The `documents` that `cfg.filters` keep, in order, and the cleaning statistics they
    fill as they pass."""
    cleaning = CleaningStats(tuple(cfg.filters), cfg.filter)
    num_proc = cfg.num_proc or default_num_proc()
    return clean_documents(documents, cfg.filters, cfg.filter, cleaning, num_proc), cleaning


def stored_bytes(name: str) -> int:
    """Bytes a source takes where it is stored (compressed or not; a directory: its files;
    `builtin`: its text)."""
    if name == BUILTIN:
        return sum(len(text.encode("utf-8")) for _, text in builtin_documents())
    path = Path(name)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def source_quotas(sizes: list[int], megabytes: float | None) -> list[int | None]:
    """Bytes of text the tokenizer is trained on from each source of stored `sizes`: None
    (all of it) without a budget or when the sources hold no more than `megabytes` MB; else
    the budget shared in proportion to the stored sizes."""
    total = sum(sizes)
    if megabytes is None or total <= megabytes * 1e6:
        return [None] * len(sizes)
    return [int(megabytes * 1e6 * size / total) for size in sizes]


def training_documents(cfg: PrepareConfig, names: list[str]) -> Iterator[RawDocument]:
    """The raw documents the tokenizer is trained on: every document, or, for a corpus of more
    than `tokenizer.train_megabytes` MB, the first documents of each source up to its quota
    (`source_quotas`): the budget is read, not the whole corpus."""
    sizes = [stored_bytes(name) for name in names]
    quotas = source_quotas(sizes, cfg.tokenizer.train_megabytes)
    for name, quota in zip(names, quotas, strict=True):
        texts = read_source(name, SourceStats(name), cfg.text_field, False, cfg.undecodable)
        for index, text in enumerate(texts):
            if quota is not None and quota <= 0:
                break
            yield RawDocument(name, index, text)
            if quota is not None:
                quota -= len(text.encode("utf-8"))


def _training_texts(cfg: PrepareConfig, names: list[str]) -> Iterator[str]:
    """Normalized documents for tokenizer training: `training_documents`, of them those the
    filters keep (a silent pass over the sources)."""
    documents, _ = cleaned_documents(cfg, training_documents(cfg, names))
    batch: list[str] = []
    size = 0
    for document in documents:  # normalized a batch of about 1 MB at a time
        batch.append(document.text)
        size += len(document.text)
        if size >= NORMALIZE_BATCH_CHARS:
            yield from filter(None, normalize_many(batch))
            batch, size = [], 0
    yield from filter(None, normalize_many(batch))


def _training_texts_source(cfg: PrepareConfig, names: list[str]) -> Callable[[], Iterable[str]]:
    """What the trainer calls for its texts (it reads them twice): with a budget
    (`tokenizer.train_megabytes`), the texts read once and kept in memory (at most the
    budget, plus a document per source); without one, a new pass over the sources each time."""
    if cfg.tokenizer.train_megabytes is None:
        return lambda: _training_texts(cfg, names)
    texts = list(_training_texts(cfg, names))
    return lambda: texts


def make_tokenizer(cfg: PrepareConfig, names: list[str], out_dir: Path) -> Tokenizer:
    """Train the tokenizer on the sources `names` (or copy `cfg.tokenizer.path`) and save it
    in `out_dir`."""
    if cfg.tokenizer.path:
        return copy_tokenizer(cfg.tokenizer.path, out_dir)
    settings = cfg.tokenizer
    tokenizer = train_tokenizer(
        _training_texts_source(cfg, names),
        settings.vocab_size,
        settings.lowercase,
        settings.min_frequency,
        kind=settings.kind,
    )
    save_tokenizer(tokenizer, out_dir)
    return tokenizer


def _input_bytes(names: list[str]) -> int | None:
    """Bytes of text in the sources `names` (None when a source is compressed or columnar,
    whose file size is not its text's)."""
    from data_pipelines.formats import detect_format
    from data_pipelines.pieces import parse_piece, piece_bytes, source_path

    for name in names:
        fmt, compression = detect_format(source_path(name)) if name != BUILTIN else ("text", None)
        if compression is not None or fmt in ("parquet", "arrow", "datasets", "tar"):
            return None
    return sum(
        sum(len(text.encode("utf-8")) for _, text in builtin_documents())
        if name == BUILTIN
        else Path(name).stat().st_size
        if parse_piece(name) is None
        else piece_bytes(name)
        for name in names
    )


def write_corpus(
    cfg: PrepareConfig,
    names: list[str],
    tokenizer: Tokenizer,
    out_dir: Path,
    progress: bool | None = None,
    allow_empty: bool = False,
    deduplicate=None,
) -> dict:
    """Tokenize the sources `names` into shards in `out_dir` (in `cfg.num_proc` processes);
    returns the counts, sources and shards sections of the manifest. Raises PrepareError if
    no document has any token (unless `allow_empty`: a prepare array's task may get none).
    `deduplicate` (a prepare array's global dedup, `global_dedup.GlobalRemovals`) drops
    documents after the filters; its record is kept as the `dedup` section."""
    stats = [SourceStats(name) for name in names]
    per_source = {name: {"documents": 0, "empty_documents": 0} for name in names}
    counts = dict.fromkeys(
        ("documents", "sentences", "tokens", "empty_documents", "undecodable_lines"), 0
    )
    dtype = ids_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    documents, cleaning = cleaned_documents(
        cfg,
        read_raw_documents(
            names, stats, cfg.text_field, undecodable=cfg.undecodable, id_field=cfg.id_field
        ),
    )
    if deduplicate is not None:
        documents = deduplicate(documents)
    chunks = encode_corpus(
        documents,
        tokenizer,
        dtype,
        cfg.num_proc,
        cfg.segmenter,
        total_bytes=_input_bytes(names),
        progress=progress,
    )
    with ShardWriter(out_dir, cfg.docs_per_shard, cfg.tokens_per_block) as writer:
        for documents, encoded in chunks:
            writer.write_batch(encoded.batch)
            for document, tokens in zip(documents, encoded.tokens.tolist(), strict=True):
                per_source[document.source]["documents" if tokens else "empty_documents"] += 1
            counts["documents"] += len(encoded.batch)
            counts["empty_documents"] += len(documents) - len(encoded.batch)
            counts["sentences"] += int(encoded.sentences.sum())
            counts["tokens"] += len(encoded.batch.ids)
    counts["undecodable_lines"] = sum(s.undecodable_lines for s in stats)
    if counts["documents"] == 0 and not allow_empty:
        raise PrepareError(
            f"inputs={cfg.inputs}: no document holds any text "
            f"({counts['empty_documents']} empty, {counts['undecodable_lines']} undecodable lines)"
        )
    sources = [
        {"path": s.path, **per_source[s.path], "undecodable_lines": s.undecodable_lines}
        for s in stats
    ]
    if cfg.undecodable == "replace":  # recorded only where the policy can replace
        counts["replaced_lines"] = sum(s.replaced_lines for s in stats)
        for source, s in zip(sources, stats, strict=True):
            source["replaced_lines"] = s.replaced_lines
    corpus = {"counts": counts, "sources": sources, "shards": writer.shards}
    if cfg.filters:
        corpus["filters"] = cleaning.record()
    if deduplicate is not None:
        corpus["dedup"] = deduplicate.record()
    return corpus


def build_manifest(
    cfg: PrepareConfig, tokenizer: Tokenizer, tokenizer_dir: Path, corpus: dict
) -> dict:
    """The manifest.json content (see `pretrain.data.shard_format`); no timestamps, so the same input
    gives the same bytes."""
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": {
            "dir": TOKENIZER_DIR,
            "sha256": tokenizer_sha256(tokenizer_dir),
            "vocab_size": vocab_size,
            "lowercase": is_lowercase(tokenizer),
        },
        "dtype": ids_dtype(vocab_size),
        "segmenter": _segmenter_record(cfg.segmenter),
        **corpus,
        "config": cfg.content_dict(),
    }


def _segmenter_record(name: str) -> dict | None:
    """Which word segmenter (and version: its dictionary shapes the word starts) was used."""
    if name == "none":
        return None
    import jieba

    return {"name": name, "version": jieba.__version__}


def _move_into_place(partial: Path, out_dir: Path) -> None:
    """Rename the complete `partial` to `out_dir`; an existing `out_dir` is removed only after."""
    if not out_dir.exists():
        partial.rename(out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    out_dir.rename(old)
    partial.rename(out_dir)
    shutil.rmtree(old)


def write_prepared(
    cfg: PrepareConfig, out_dir: Path, write: Callable[[Path], tuple[Tokenizer, dict]]
) -> Path:
    """Write a prepared corpus to `out_dir` atomically; returns out_dir. `write(partial)` fills
    the partial directory with the tokenizer and shards and returns (tokenizer, corpus record
    with `counts`, `sources`, `shards`); span annotations (as `cfg` says) and the manifest
    are added, then the directory is moved into place. On failure nothing is left behind."""
    partial = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted run
    partial.mkdir(parents=True)
    try:
        tokenizer, corpus = write(partial)
        corpus["annotations"] = (
            annotate_corpus(
                cfg,
                tokenizer,
                partial,
                corpus["shards"],
                ids_dtype(tokenizer.get_vocab_size(with_added_tokens=True)),
            )
            if cfg.annotates_spans
            else None
        )
        manifest = build_manifest(cfg, tokenizer, partial / TOKENIZER_DIR, corpus)
        (partial / MANIFEST_FILE).write_text(
            json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        _move_into_place(partial, out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def prepare(
    cfg: PrepareConfig, progress: bool | None = None, allow_empty: bool = False, deduplicate=None
) -> Path:
    """Prepare a corpus as `cfg` says; returns the shards directory (`cfg.out_dir`, absolute;
    a URL out_dir as given, once uploaded with its manifest last: `publish`); `allow_empty`:
    a corpus without documents is no error (a prepare array's slice); `deduplicate`: see
    `write_corpus`.
    Raises PrepareError / SourceError / TokenizerError naming the path or key at fault."""
    out_dir = local_out_dir(cfg.out_dir)  # a URL's: a staging dir, uploaded at the end
    names = expand_inputs(cfg.inputs)
    check_remote_out_dir(cfg.out_dir, cfg.overwrite)
    _check_out_dir(out_dir, cfg.overwrite or is_url(cfg.out_dir), names)
    if cfg.entities.path and not Path(cfg.entities.path).is_file():
        raise PrepareError(
            f"entities.path={cfg.entities.path}: no such file; point it at a UTF-8 file with "
            "one entity a line, or set entities.path=null"
        )

    def write(partial: Path) -> tuple[Tokenizer, dict]:
        start = time.perf_counter()
        tokenizer = make_tokenizer(cfg, names, partial / TOKENIZER_DIR)
        middle = time.perf_counter()
        corpus = write_corpus(cfg, names, tokenizer, partial, progress, allow_empty, deduplicate)
        if progress is not False:  # timed apart: training is not tokenizing
            print(
                f"pretrain-data prepare: tokenizer {'copied' if cfg.tokenizer.path else 'trained'} "
                f"in {middle - start:.1f} s, shards written in {time.perf_counter() - middle:.1f} s",
                file=sys.stderr,
            )
        return tokenizer, corpus

    return publish(cfg.out_dir, write_prepared(cfg, out_dir, write))
