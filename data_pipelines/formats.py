"""The formats corpora ship in: which one a file is, and its documents' texts.

A file's format comes from its suffix and is checked against its first bytes (magic): a file
whose bytes are another format's (a `.jsonl` that is Parquet, a `.txt` that is zstd) is
refused in one line naming the file, the format its bytes show and the supported formats.

| suffix | format | a document is |
|---|---|---|
| `.parquet` | Parquet (pyarrow), read one row group at a time | a row's `text_field` |
| `.arrow` | Arrow IPC, file or stream (what `datasets` writes), batch by batch | a row's `text_field` |
| a directory with `state.json` | a `datasets` `save_to_disk` directory: its Arrow files in order | a row's `text_field` |
| `.jsonl`, `.json`, `.ndjson` | JSON lines | a line's `text_field` |
| `.csv`, `.tsv` | CSV/TSV with a header row (quoting, multi-line fields) | a row's `text_field` |
| `.tar` | WebDataset: members grouped by key (the name up to its first dot) | a sample's `.txt`, else its `.json`'s `text_field` |
| anything else | plain UTF-8 text | a run of lines between blank lines |

JSONL, CSV/TSV, tar and text may be compressed: `.gz`, `.zst` (`.zstd`), `.xz` or `.bz2` after
the suffix. Every format is read as a stream (memory bounded by a row group, a record batch
or a line, whatever the file's size), through `sources.open_input`, the one place a source's
bytes are opened.
"""

import bz2
import csv
import gzip
import io
import json
import lzma
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from data_pipelines.inputs import (
    DATASETS_STATE,
    READ_BYTES,
    STREAM_ERRORS,
    SourceError,
    ZstdReader,
    document_id,
    missing_id_field,
    open_input,
)

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".bz2": "bz2"}
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
MAGIC = (  # (format, offset, bytes); the first that matches names what a file's bytes are
    ("gzip", 0, b"\x1f\x8b"),
    ("zstd", 0, b"\x28\xb5\x2f\xfd"),
    ("xz", 0, b"\xfd7zXZ\x00"),
    ("bz2", 0, b"BZh"),
    ("parquet", 0, b"PAR1"),
    ("arrow", 0, b"ARROW1"),
    ("arrow", 0, b"\xff\xff\xff\xff"),  # IPC stream: a continuation marker, then the schema
    ("tar", 257, b"ustar"),
)
SUPPORTED = (
    "parquet, arrow (IPC file or stream), datasets save_to_disk directory, jsonl, csv, tsv, "
    "tar (WebDataset .txt/.json members), text; jsonl/csv/tsv/tar/text also as "
    ".gz/.zst/.xz/.bz2"
)


def is_datasets_dir(path: str | Path) -> bool:
    """Whether `path` is a directory written by `datasets`' `save_to_disk` (has state.json)."""
    return Path(path).is_dir() and (Path(path) / DATASETS_STATE).is_file()


def detect_format(name: str) -> tuple[str, str | None]:
    """(format, compression) of the source `name` by its suffix (see the module docstring):
    format one of parquet, arrow, datasets, jsonl, csv, tsv, tar, text; compression one of
    gzip, zstd, xz, bz2 or None."""
    if is_datasets_dir(name):
        return "datasets", None
    lower = name.lower()
    compression = None
    for suffix, kind in COMPRESSIONS.items():
        if lower.endswith(suffix):
            compression, lower = kind, lower[: -len(suffix)]
            break
    if lower.endswith(".tgz"):
        return "tar", "gzip"
    for fmt, suffixes in (
        ("parquet", (".parquet",)),
        ("arrow", (".arrow",)),
        ("jsonl", JSONL_SUFFIXES),
        ("csv", (".csv",)),
        ("tsv", (".tsv",)),
        ("tar", (".tar",)),
    ):
        if lower.endswith(suffixes):
            return fmt, compression
    return "text", compression


def magic_format(head: bytes) -> str | None:
    """The format that the first bytes `head` (512 or more, when the file has them) show, or
    None for bytes of no known binary format (text)."""
    for fmt, offset, magic in MAGIC:
        if head[offset : offset + len(magic)] == magic:
            if fmt == "bz2" and not _bz2_block(head):
                continue  # text that happens to start with "BZh"
            return fmt
    return None


def _bz2_block(head: bytes) -> bool:
    """Whether `head` goes on as bzip2 does after "BZh": a block size digit, then the block
    magic (pi's digits) or the end-of-stream magic of an empty stream."""
    return head[3:4] in [b"%d" % n for n in range(1, 10)] and head[4:10] in (
        bytes.fromhex("314159265359"),
        bytes.fromhex("177245385090"),
    )


def _mismatch(name: str, named: str, found: str | None) -> SourceError:
    shown = found or "text (no known magic bytes)"
    return SourceError(
        f"{name}: its suffix says {named}, its first bytes are {shown}; rename it to the "
        f"suffix of what it holds (supported: {SUPPORTED})"
    )


def _check_magic(name: str, head: bytes, expected: str) -> None:
    """SourceError unless `head` shows `expected` (text: no binary magic at all)."""
    found = magic_format(head)
    if expected in ("jsonl", "csv", "tsv", "text"):
        if found is not None:
            raise _mismatch(name, expected, found)
    elif found != expected:
        raise _mismatch(name, expected, found)


def open_stream(name: str, fmt: str, compression: str | None) -> IO[bytes]:
    """The decompressed bytes of the file `name`, its compression's and its format's magic
    checked (SourceError naming the file on a mismatch)."""
    raw = open_input(name)
    try:
        head = raw.peek(512)[:512] if hasattr(raw, "peek") else b""
        if compression is not None:
            if magic_format(head) != compression:
                raise _mismatch(name, f"{fmt} compressed with {compression}", magic_format(head))
            stream = {
                "gzip": lambda: gzip.GzipFile(fileobj=raw, mode="rb"),
                "zstd": lambda: io.BufferedReader(ZstdReader(raw), READ_BYTES),
                "xz": lambda: lzma.LZMAFile(raw, "rb"),
                "bz2": lambda: bz2.BZ2File(raw, "rb"),
            }[compression]()
            try:
                head = stream.peek(512)[:512]
            except STREAM_ERRORS as error:
                raise SourceError(
                    f"{name}: cannot be decompressed ({error}); fix or remove it"
                ) from error
        else:
            stream = raw
        _check_magic(name, head, fmt)
        return stream
    except BaseException:
        raw.close()
        raise


def _field(record: dict, text_field: str, where: str) -> str:
    text = record.get(text_field)
    if text is None:
        return ""
    if not isinstance(text, str):
        raise SourceError(
            f"{where}: field {text_field!r} is {type(text).__name__}, not text; set "
            "text_field to the field that holds the text"
        )
    return text


def _missing_field(where: str, text_field: str, fields: list[str]) -> SourceError:
    return SourceError(
        f"{where}: no field {text_field!r} (fields: {fields}); set text_field to the field "
        "that holds the text"
    )


def csv_documents(
    stream: IO[bytes],
    name: str,
    text_field: str,
    delimiter: str,
    policy: str,
    id_field: str | None = None,
) -> Iterator[tuple[str, str | None]]:
    """(`text_field`, `id_field` or None) of each row of a CSV (or TSV, `delimiter="\\t"`)
    with a header row; quoted fields may hold delimiters, quotes ("") and line breaks."""
    errors = "strict" if policy == "error" else "replace"
    text = io.TextIOWrapper(stream, encoding="utf-8", errors=errors, newline="")
    csv.field_size_limit(1 << 30)
    reader = csv.DictReader(text, delimiter=delimiter, strict=True)
    try:
        if reader.fieldnames is None:
            return
        if text_field not in reader.fieldnames:
            raise _missing_field(f"{name}: header", text_field, list(reader.fieldnames))
        if id_field is not None and id_field not in reader.fieldnames:
            raise missing_id_field(f"{name}: header", id_field, list(reader.fieldnames))
        for row in reader:
            where = f"{name}:{reader.line_num}"
            yield row[text_field] or "", id_field and document_id(row[id_field], id_field, where)
    except csv.Error as error:
        raise SourceError(
            f"{name}:{reader.line_num}: not valid CSV ({error}); fix the quoting"
        ) from error
    except UnicodeDecodeError as error:
        raise SourceError(
            f"{name}: not UTF-8 near line {reader.line_num} ({error.reason}); convert it, "
            "or set undecodable=replace"
        ) from error


def tar_documents(stream: IO[bytes], name: str, text_field: str) -> Iterator[tuple[str, None]]:
    """One document per WebDataset sample of a tar stream, in member order: the text of its
    `.txt` member, else the `text_field` of its `.json` member (samples with neither are
    skipped)."""
    key, members = None, {}
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                member_key = member.name[: len(member.name) - len(base)] + base.split(".")[0]
                suffix = base[len(base.split(".")[0]) :].lower()
                if member_key != key:
                    if members:
                        yield _sample_text(members, name, key, text_field), None
                    key, members = member_key, {}
                if suffix in (".txt", ".json"):
                    members[suffix] = tar.extractfile(member).read()
            if members:
                yield _sample_text(members, name, key, text_field), None
    except tarfile.TarError as error:
        raise SourceError(f"{name}: not a readable tar ({error}); fix or remove it") from error


def _sample_text(members: dict[str, bytes], name: str, key: str | None, text_field: str) -> str:
    where = f"{name}: sample {key!r}"
    try:
        if ".txt" in members:
            return members[".txt"].decode("utf-8")
        record = json.loads(members[".json"])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SourceError(f"{where}: not UTF-8 text / JSON ({error}); fix the member") from error
    if not isinstance(record, dict):
        raise SourceError(f"{where}: its .json is not an object; fix the member")
    if text_field not in record:
        raise _missing_field(where, text_field, sorted(record))
    return _field(record, text_field, where)


def _column_texts(
    table, name: str, text_field: str, id_field: str | None, first_row: int
) -> Iterator[tuple[str, str | None]]:
    """(column `text_field`'s string (None: ""), column `id_field`'s id or None) of each row
    of a pyarrow Table or RecordBatch whose first row is row `first_row` of the file."""
    if text_field not in table.schema.names:
        raise _missing_field(name, text_field, list(table.schema.names))
    if id_field is not None and id_field not in table.schema.names:
        raise missing_id_field(name, id_field, list(table.schema.names))
    import pyarrow as pa

    column = table.column(text_field)
    texts = column.to_pylist()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        if any(text is not None and not isinstance(text, str) for text in texts):
            raise SourceError(
                f"{name}: column {text_field!r} holds {column.type}, not strings; set "
                "text_field to the column that holds the text"
            )
    if id_field is None:
        for text in texts:
            yield text or "", None
        return
    ids = table.column(id_field).to_pylist()
    for row, (text, value) in enumerate(zip(texts, ids, strict=True), start=first_row):
        yield text or "", document_id(value, id_field, f"{name}: row {row}")


def _require_pyarrow(name: str) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as error:
        raise SourceError(
            f"{name}: Parquet and Arrow inputs need pyarrow; pip install 'pretrain[corpora]'"
        ) from error


def parquet_documents(
    name: str, text_field: str, id_field: str | None = None, groups: range | None = None
) -> Iterator[tuple[str, str | None]]:
    """The `text_field` column (and `id_field`'s) of a Parquet file (its row `groups`, default
    all), one row group in memory at a time."""
    _require_pyarrow(name)
    import pyarrow as pa
    import pyarrow.parquet as pq

    stream = open_stream(name, "parquet", None)
    try:
        try:
            parquet = pq.ParquetFile(stream)
        except (pa.ArrowException, OSError) as error:
            raise SourceError(
                f"{name}: not a readable Parquet file ({error}); fix or remove it"
            ) from error
        if text_field not in parquet.schema_arrow.names:
            raise _missing_field(name, text_field, list(parquet.schema_arrow.names))
        if id_field is not None and id_field not in parquet.schema_arrow.names:
            raise missing_id_field(name, id_field, list(parquet.schema_arrow.names))
        columns = [text_field] if id_field is None else [text_field, id_field]
        groups = range(parquet.num_row_groups) if groups is None else groups
        first_row = sum(parquet.metadata.row_group(g).num_rows for g in range(groups.start))
        for group in groups:
            try:
                table = parquet.read_row_group(group, columns=columns)
            except (pa.ArrowException, OSError) as error:
                raise SourceError(
                    f"{name}: row group {group} cannot be read ({error}); fix or remove it"
                ) from error
            yield from _column_texts(table, name, text_field, id_field, first_row)
            first_row += table.num_rows
    finally:
        stream.close()


def arrow_documents(
    name: str, text_field: str, id_field: str | None = None
) -> Iterator[tuple[str, str | None]]:
    """The `text_field` column (and `id_field`'s) of an Arrow IPC file or stream, one record
    batch at a time."""
    _require_pyarrow(name)
    import pyarrow as pa
    import pyarrow.ipc as ipc

    stream = open_stream(name, "arrow", None)
    try:
        try:
            if stream.peek(6)[:6] == b"ARROW1":
                reader = ipc.open_file(pa.PythonFile(stream, mode="r"))
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = iter(ipc.open_stream(pa.PythonFile(stream, mode="r")))
            first_row = 0
            for batch in batches:
                yield from _column_texts(batch, name, text_field, id_field, first_row)
                first_row += batch.num_rows
        except (pa.ArrowException, OSError) as error:
            raise SourceError(
                f"{name}: not a readable Arrow file ({error}); fix or remove it"
            ) from error
    finally:
        stream.close()


def datasets_files(directory: str) -> list[str]:
    """The Arrow files of a `datasets` `save_to_disk` directory, in the order its state.json
    lists them (sorted `*.arrow` when it lists none)."""
    state_path = Path(directory) / DATASETS_STATE
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SourceError(f"{state_path}: not readable JSON ({error}); fix or remove it") from error
    listed = [entry["filename"] for entry in state.get("_data_files", []) if "filename" in entry]
    files = [str(Path(directory) / f) for f in listed] or sorted(
        str(p) for p in Path(directory).glob("*.arrow")
    )
    if not files:
        raise SourceError(f"{directory}: a datasets directory without Arrow files; fix it")
    return files


def columnar_documents(
    name: str, fmt: str, text_field: str, id_field: str | None = None
) -> Iterator[tuple[str, str | None]]:
    """(text, id or None) of the documents of a Parquet file, an Arrow file or a datasets
    directory."""
    if fmt == "parquet":
        yield from parquet_documents(name, text_field, id_field)
    elif fmt == "arrow":
        yield from arrow_documents(name, text_field, id_field)
    else:
        for path in datasets_files(name):
            yield from arrow_documents(path, text_field, id_field)
