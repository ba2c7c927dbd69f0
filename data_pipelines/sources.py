"""Input sources: which files a list of inputs names, and the raw documents in each.

An input is a file, a directory (every file under it, recursively, sorted by path; a
`datasets` save_to_disk directory is one source), a glob (`corpus/**/*.jsonl`, matches
sorted) or `builtin` (the corpus that ships with Python). Which format a file is (Parquet,
Arrow, JSONL, CSV/TSV, WebDataset tar, plain text; compressed with gzip, zstd, xz or bz2) is
told by its suffix and checked by its first bytes: see `data_pipelines.formats`. Every
source's bytes are opened by `open_input`, the one place that knows where bytes live.
Text and JSONL are read line by line in binary and each line is decoded as UTF-8. What
happens to a line that does not decode (or, in JSONL, is not a JSON object) is the
`undecodable` policy (CSV: `error` raises, the others decode with U+FFFD):
- `error` (the default): SourceError naming the file, the first bad line and how many there
  are (the rest of the file is scanned to count them);
- `skip`: the line is dropped and counted (`undecodable_lines`), one warning per file;
- `replace`: undecodable bytes become U+FFFD and the line is kept, counted
  (`replaced_lines`); a JSONL line that is still not a JSON object is dropped and counted.
A text or JSONL file holding a NUL byte is binary (or UTF-16): always refused, naming it.
"""

import functools
import glob
import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from data_pipelines import formats, pieces
from data_pipelines.builtin_corpus import BUILTIN, builtin_documents
from data_pipelines.inputs import DATASETS_STATE, STREAM_ERRORS, SourceError

_GLOB_CHARS = frozenset("*?[")
UNDECODABLE_POLICIES = ("error", "skip", "replace")


class UndecodableLinesWarning(UserWarning):
    """Some lines of an input file were not UTF-8 (or not JSON) and were skipped."""


@dataclass
class SourceStats:
    """What was read from one source: documents (all, including empty ones), lines dropped
    (`undecodable_lines`) and lines decoded with U+FFFD replacements (`replaced_lines`)."""

    path: str
    documents: int = 0
    undecodable_lines: int = 0
    replaced_lines: int = 0


@functools.lru_cache(maxsize=1024)
def _source_prefix(source: str) -> str:
    return hashlib.sha1(pieces.key_source(source).encode("utf-8")).hexdigest()[:8]


def document_key(source: str, index: int) -> str:
    """Stable, unique sample key: 8 hex digits of sha1(source name) and the document's index
    in its source. Has no dots, as WebDataset keys must not."""
    return f"{_source_prefix(source)}_{index:08d}"


@dataclass(frozen=True)
class RawDocument:
    """One document as read: the source it came from, its index in that source (0-based,
    counting every document), its text and, with `id_field`, its id as the source holds it."""

    source: str
    index: int
    text: str
    id: str | None = None

    @property
    def key(self) -> str:
        """How shards and statistics name the document: its id, else `document_key`."""
        return self.id if self.id is not None else document_key(self.source, self.index)


def expand_inputs(inputs: list[str]) -> list[str]:
    """Source names (`builtin` or file paths) that `inputs` name, in input order, each path
    once (first occurrence wins). Raises SourceError for a missing path, a glob without
    matches or an empty directory."""
    names: dict[str, None] = {}  # ordered set
    for item in inputs:
        if item == BUILTIN:
            found = [BUILTIN]
        elif pieces.parse_piece(item) is not None:  # part of a file (a prepare array task's)
            found = [item]
        elif _GLOB_CHARS & set(item):
            found = sorted(p for p in glob.glob(item, recursive=True) if Path(p).is_file())
            if not found:
                raise SourceError(f"inputs: the glob {item!r} matches no file")
        elif Path(item).is_dir() and (Path(item) / DATASETS_STATE).is_file():
            found = [item]  # a datasets save_to_disk directory: one source
        elif Path(item).is_dir():
            root = Path(item)
            saved = {p.parent for p in root.rglob(DATASETS_STATE) if not _hidden(p, root)}
            found = sorted(
                (
                    str(p)
                    for p in root.rglob("*")
                    if (p in saved or (p.is_file() and not saved.intersection(p.parents)))
                    and not _hidden(p, root)
                ),
                key=lambda p: Path(p).relative_to(root).as_posix(),
            )
            if not found:
                raise SourceError(f"inputs: the directory {item!r} holds no file")
        elif Path(item).is_file():
            found = [item]
        else:
            raise SourceError(
                f"inputs: {item!r} is neither a file, a directory, a glob with "
                f"matches nor {BUILTIN!r}; check the path (relative to {Path.cwd()})"
            )
        names.update(dict.fromkeys(n for n in found if n not in names))
    return list(names)


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _decoded_lines(
    stream: IO[bytes], path: str, stats: SourceStats, policy: str = "error"
) -> Iterator[str]:
    """Lines of the bytes `stream` of `path` without line ends, undecodable ones handled as
    `policy` says (see the module docstring); a line holding a NUL byte makes the file binary
    (SourceError). The stream is closed at the end."""
    first_bad = 0
    try:
        with stream as f:
            for number, raw in enumerate(f, start=1):
                if b"\0" in raw:
                    raise SourceError(
                        f"{path}: line {number} holds a NUL byte: a binary (or UTF-16) file, "
                        "not UTF-8 text; remove it from inputs (or convert it to UTF-8)"
                    )
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    if policy == "replace":
                        stats.replaced_lines += 1
                        line = raw.decode("utf-8", errors="replace")
                    else:
                        stats.undecodable_lines += 1
                        first_bad = first_bad or number
                        continue
                if not first_bad or policy != "error":
                    yield line.rstrip("\r\n")
    except STREAM_ERRORS as error:  # corrupt or truncated compression
        raise SourceError(
            f"{path}: cannot be read ({error}); fix or remove it from inputs"
        ) from error
    if first_bad and policy == "error":
        raise SourceError(
            f"{path}: line {first_bad} is not UTF-8 ({stats.undecodable_lines} such line(s) in "
            f"all); convert the file (e.g. iconv -f latin1 -t utf-8), or set "
            "undecodable=skip (drop them) or undecodable=replace (decode them with U+FFFD)"
        )


def _text_documents(stream: IO[bytes], path: str, stats: SourceStats, policy: str) -> Iterator[str]:
    lines: list[str] = []
    for line in _decoded_lines(stream, path, stats, policy):
        if line.strip():
            lines.append(line)
        elif lines:
            yield "\n".join(lines)
            lines = []
    if lines:
        yield "\n".join(lines)


def _jsonl_documents(
    stream: IO[bytes],
    path: str,
    stats: SourceStats,
    text_field: str,
    policy: str,
    id_field: str | None = None,
) -> Iterator[tuple[str, str | None]]:
    for number, line in enumerate(_decoded_lines(stream, path, stats, policy), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            if policy == "error":
                raise SourceError(
                    f"{path}:{number}: not a JSON object; fix the line, or set "
                    "undecodable=skip to drop such lines"
                )
            stats.undecodable_lines += 1
            continue
        text = record.get(text_field)
        if not isinstance(text, str):
            raise SourceError(
                f"{path}:{number}: no string field {text_field!r} "
                f"(fields: {sorted(record)}); set text_field to the field that holds the text"
            )
        if id_field is None:
            yield text, None
        elif id_field not in record:
            raise formats.missing_id_field(f"{path}:{number}", id_field, sorted(record))
        else:
            yield text, formats.document_id(record[id_field], id_field, f"{path}:{number}")


def read_source(
    name: str,
    stats: SourceStats,
    text_field: str = "text",
    warn: bool = True,
    undecodable: str = "error",
) -> Iterator[str]:
    """Texts of the documents of one source, in order; `stats` is updated as they are read.
    `undecodable` is the policy for lines that are not UTF-8 (see the module docstring).
    With `warn`, one UndecodableLinesWarning names the file if lines were skipped."""
    for text, _ in read_records(name, stats, text_field, None, warn, undecodable):
        yield text


def read_records(
    name: str,
    stats: SourceStats,
    text_field: str = "text",
    id_field: str | None = None,
    warn: bool = True,
    undecodable: str = "error",
) -> Iterator[tuple[str, str | None]]:
    """(text, id) of the documents of one source, as `read_source` reads them; the id is the
    `id_field` column's (None without `id_field`). SourceError naming the source when it has
    no such column, or its format no ids (plain text, tar, `builtin`)."""
    if id_field is not None:
        fmt = "builtin" if name == BUILTIN else formats.detect_format(pieces.source_path(name))[0]
        if fmt in ("text", "tar", "builtin"):
            raise SourceError(
                f"{name}: id_field={id_field!r}, but a {fmt} source has no id column (ids are "
                "read from Parquet, Arrow, datasets, JSONL and CSV/TSV); set id_field=null"
            )
    if name == BUILTIN:
        for _, text in builtin_documents():
            stats.documents += 1
            yield text, None
        return
    for record in _documents(name, stats, text_field, undecodable, id_field):
        stats.documents += 1
        yield record
    if warn and stats.undecodable_lines:
        warnings.warn(
            f"{name}: skipped {stats.undecodable_lines} undecodable line(s) "
            "(not UTF-8, or not a JSON object in JSONL)",
            UndecodableLinesWarning,
            stacklevel=2,
        )


def _documents(
    name: str, stats: SourceStats, text_field: str, policy: str, id_field: str | None
) -> Iterator[tuple[str, str | None]]:
    """(text, id) of the documents of the file (or datasets directory, or piece of a file:
    `data_pipelines.pieces`) `name`, by its format."""
    piece = pieces.parse_piece(name)
    fmt, compression = formats.detect_format(pieces.source_path(name))
    if piece is not None and piece.unit == "row_groups":
        groups = range(piece.start, piece.stop)
        return formats.parquet_documents(piece.path, text_field, id_field, groups)
    if fmt in ("parquet", "arrow", "datasets"):
        return formats.columnar_documents(name, fmt, text_field, id_field)
    if piece is not None:
        stream = pieces.open_piece(piece, fmt)
    else:
        stream = formats.open_stream(name, fmt, compression)
    if fmt == "jsonl":
        return _jsonl_documents(stream, name, stats, text_field, policy, id_field)
    if fmt in ("csv", "tsv"):
        delimiter = "," if fmt == "csv" else "\t"
        rows = formats.csv_documents(stream, name, text_field, delimiter, policy, id_field)
        return _closing(stream, name, rows)
    if fmt == "tar":
        return _closing(stream, name, formats.tar_documents(stream, name, text_field))
    return ((text, None) for text in _text_documents(stream, name, stats, policy))


def _closing(stream: IO[bytes], name: str, documents: Iterator[tuple]) -> Iterator[tuple]:
    """`documents`, with `stream` closed when they end (or are abandoned), and errors of a
    corrupt or truncated compressed stream turned into SourceError naming it."""
    try:
        yield from documents
    except STREAM_ERRORS as error:
        raise SourceError(f"{name}: cannot be read ({error}); fix or remove it") from error
    finally:
        stream.close()


def read_raw_documents(
    names: list[str],
    stats: list[SourceStats],
    text_field: str = "text",
    warn: bool = True,
    undecodable: str = "error",
    id_field: str | None = None,
) -> Iterator[RawDocument]:
    """Every document of the sources `names` in order (with its `id_field` id); `stats[i]` is
    filled for `names[i]`."""
    for name, source_stats in zip(names, stats, strict=True):
        records = read_records(name, source_stats, text_field, id_field, warn, undecodable)
        for index, (text, document_id) in enumerate(records):
            yield RawDocument(name, index, text, document_id)
