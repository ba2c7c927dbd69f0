"""Input sources: which files a list of inputs names, and the raw documents in each.

An input is a file, a directory (every file under it, recursively, sorted by path), a glob
(`corpus/**/*.jsonl`, matches sorted) or `builtin` (the corpus that ships with Python). Files:
- plain text (any other suffix): documents are separated by blank lines;
- JSONL (`.jsonl`, `.json`): one document per line, its text in a configurable field;
- either one gzipped (`.gz` after the suffix).
Files are read line by line in binary and each line is decoded as UTF-8; a line that does
not decode (or, in JSONL, is not a JSON object) is skipped and counted, and one warning per
file names it with the count.
"""

import glob
import gzip
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from data_pipelines.builtin_corpus import BUILTIN, builtin_documents

_GLOB_CHARS = frozenset("*?[")
JSONL_SUFFIXES = (".jsonl", ".json")


class SourceError(ValueError):
    """An input cannot be read; the message names it and says what to do."""


class UndecodableLinesWarning(UserWarning):
    """Some lines of an input file were not UTF-8 (or not JSON) and were skipped."""


@dataclass
class SourceStats:
    """What was read from one source: documents (all, including empty ones) and skipped lines."""

    path: str
    documents: int = 0
    undecodable_lines: int = 0


@dataclass(frozen=True)
class RawDocument:
    """One document as read: the source it came from, its index in that source (0-based,
    counting every document), and its text."""

    source: str
    index: int
    text: str


def expand_inputs(inputs: list[str]) -> list[str]:
    """Source names (`builtin` or file paths) that `inputs` name, in input order, each path
    once (first occurrence wins). Raises SourceError for a missing path, a glob without
    matches or an empty directory."""
    names: dict[str, None] = {}  # ordered set
    for item in inputs:
        if item == BUILTIN:
            found = [BUILTIN]
        elif _GLOB_CHARS & set(item):
            found = sorted(p for p in glob.glob(item, recursive=True) if Path(p).is_file())
            if not found:
                raise SourceError(f"inputs: the glob {item!r} matches no file")
        elif Path(item).is_dir():
            root = Path(item)
            found = sorted(
                (str(p) for p in root.rglob("*") if p.is_file() and not _hidden(p, root)),
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


def _open_binary(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")  # noqa: SIM115


def _decoded_lines(path: str, stats: SourceStats) -> Iterator[str]:
    """Lines of `path` without line ends; undecodable ones are counted and skipped."""
    try:
        with _open_binary(path) as f:
            for raw in f:
                try:
                    yield raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError:
                    stats.undecodable_lines += 1
    except (OSError, EOFError) as error:  # unreadable file, corrupt or truncated gzip
        raise SourceError(
            f"{path}: cannot be read ({error}); fix or remove it from inputs"
        ) from error


def _text_documents(path: str, stats: SourceStats) -> Iterator[str]:
    lines: list[str] = []
    for line in _decoded_lines(path, stats):
        if line.strip():
            lines.append(line)
        elif lines:
            yield "\n".join(lines)
            lines = []
    if lines:
        yield "\n".join(lines)


def _jsonl_documents(path: str, stats: SourceStats, text_field: str) -> Iterator[str]:
    for number, line in enumerate(_decoded_lines(path, stats), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            stats.undecodable_lines += 1
            continue
        text = record.get(text_field)
        if not isinstance(text, str):
            raise SourceError(
                f"{path}:{number}: no string field {text_field!r} "
                f"(fields: {sorted(record)}); set text_field to the field that holds the text"
            )
        yield text


def read_source(
    name: str, stats: SourceStats, text_field: str = "text", warn: bool = True
) -> Iterator[str]:
    """Texts of the documents of one source, in order; `stats` is updated as they are read.
    With `warn`, one UndecodableLinesWarning names the file if lines were skipped."""
    if name == BUILTIN:
        for _, text in builtin_documents():
            stats.documents += 1
            yield text
        return
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(JSONL_SUFFIXES):
        documents = _jsonl_documents(name, stats, text_field)
    else:
        documents = _text_documents(name, stats)
    for text in documents:
        stats.documents += 1
        yield text
    if warn and stats.undecodable_lines:
        warnings.warn(
            f"{name}: skipped {stats.undecodable_lines} undecodable line(s) "
            "(not UTF-8, or not a JSON object in JSONL)",
            UndecodableLinesWarning,
            stacklevel=2,
        )


def read_raw_documents(
    names: list[str], stats: list[SourceStats], text_field: str = "text", warn: bool = True
) -> Iterator[RawDocument]:
    """Every document of the sources `names` in order; `stats[i]` is filled for `names[i]`."""
    for name, source_stats in zip(names, stats, strict=True):
        for index, text in enumerate(read_source(name, source_stats, text_field, warn)):
            yield RawDocument(name, index, text)
