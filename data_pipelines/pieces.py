"""Pieces of input files, so that the tasks of a prepare array get about the same bytes
whatever the number and sizes of the files.

A piece is named `<path>::<unit>=<start>-<stop>` and read as a source of its own:
- `bytes` (plain text and JSONL, uncompressed): byte offsets; the piece holds the documents
  whose first line starts in [start, stop) (a text document runs to its blank line, past
  `stop` if need be), so pieces cut anywhere hold every document exactly once;
- `row_groups` (Parquet): row groups start .. stop - 1;
- `members` (uncompressed tar): the WebDataset samples whose first member's header lies in
  [start, stop) (byte offsets of sample starts, found by reading the headers).
Compressed files (gzip, zstd, xz, bz2: their streams cannot be entered in the middle), CSV/TSV
(a quoted field may hold a line end), Arrow files and datasets directories stay whole.

The documents of a piece that starts a file are keyed as the whole file's are; those of
a later piece are keyed by the piece's name (their index counts from the piece's start).
"""

import io
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from data_pipelines import formats
from data_pipelines.builtin_corpus import BUILTIN

PIECE = re.compile(
    r"^(?P<path>.+)::(?P<unit>bytes|row_groups|members)=(?P<start>\d+)-(?P<stop>\d+)$"
)
SCAN_BYTES = 1 << 16


@dataclass(frozen=True)
class Piece:
    """Part `start` .. `stop` (in `unit`s, see the module docstring) of the file `path`."""

    path: str
    unit: str
    start: int
    stop: int

    @property
    def name(self) -> str:
        """The source name that stands for this piece in inputs and manifests."""
        return f"{self.path}::{self.unit}={self.start}-{self.stop}"


@dataclass(frozen=True)
class Unit:
    """A run of a file that one task reads: `bytes` of it, and how it may be cut: `unit` is
    `bytes` (anywhere), `row_groups`/`members` (at `start`, in those units) or `whole`."""

    path: str
    unit: str
    start: int
    stop: int
    bytes: int


def parse_piece(name: str) -> Piece | None:
    """The Piece that the source name `name` stands for, or None for a whole source."""
    found = PIECE.match(name)
    if found is None or not Path(found["path"]).is_file():
        return None
    return Piece(found["path"], found["unit"], int(found["start"]), int(found["stop"]))


def source_path(name: str) -> str:
    """The file a source name reads (a piece's file, else the name itself)."""
    piece = parse_piece(name)
    return name if piece is None else piece.path


def key_source(name: str) -> str:
    """The name its documents' keys are made from: a piece that starts its file keys them as
    the whole file's, a later one by its own name."""
    piece = parse_piece(name)
    return name if piece is None or piece.start > 0 else piece.path


def file_units(name: str) -> list[Unit]:
    """How the source `name` may be cut, as units in order (one per Parquet row group and per
    tar sample, one for a text/JSONL file or an uncut source)."""
    if name == BUILTIN:
        return [Unit(name, "whole", 0, 0, 1)]
    fmt, compression = formats.detect_format(name)
    size = sum(p.stat().st_size for p in Path(name).rglob("*")) if fmt == "datasets" else 0
    size = size or (os.path.getsize(name) if Path(name).is_file() else 1)
    if compression is None and fmt in ("text", "jsonl"):
        return [Unit(name, "bytes", 0, size, size)]
    if compression is None and fmt == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(name).metadata
        groups = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
        scale = size / max(1, sum(groups))  # stored (compressed) bytes, roughly
        return [Unit(name, "row_groups", g, g + 1, int(b * scale)) for g, b in enumerate(groups)]
    if compression is None and fmt == "tar":
        starts = _sample_starts(name)
        ends = starts[1:] + [size]
        return [Unit(name, "members", s, e, e - s) for s, e in zip(starts, ends, strict=True)]
    return [Unit(name, "whole", 0, 0, size)]


def _sample_starts(name: str) -> list[int]:
    """Byte offsets of the headers that start each WebDataset sample of the tar `name`."""
    starts, key = [], None
    with tarfile.open(name, "r:") as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            member_key = member.name[: len(member.name) - len(base)] + base.split(".")[0]
            if member_key != key:
                starts.append(member.offset)
                key = member_key
    return starts or [0]


def plan_pieces(names: list[str], count: int) -> list[list[str]]:
    """The source names of each of `count` tasks: the sources `names` in order, laid end to
    end by bytes and cut at every task's share (a text/JSONL file at any byte, a Parquet file
    between row groups, a tar between samples, other files not at all: a whole unit goes to
    the task holding its middle). Task sizes differ by at most one uncuttable unit."""
    units = [unit for name in names for unit in file_units(name)]
    total = sum(u.bytes for u in units)
    tasks: list[list[str]] = [[] for _ in range(count)]
    offset = 0
    for unit in units:
        if unit.unit == "bytes":
            first = offset * count // total
            last = min(count - 1, (offset + unit.bytes - 1) * count // total)
            for task in range(first, last + 1):
                lo = max(offset, -(-task * total // count)) - offset
                hi = min(offset + unit.bytes, -(-(task + 1) * total // count)) - offset
                if hi > lo:
                    tasks[task].append(Piece(unit.path, "bytes", lo, hi).name)
        else:
            task = min(count - 1, (2 * offset + unit.bytes) * count // (2 * total))
            tasks[task].append(_joined(tasks[task], unit))
        offset += unit.bytes
    return tasks


def _joined(names: list[str], unit: Unit) -> str:
    """The name of `unit`, joined to the piece of the same file that ends `names` (removed)
    where it continues it."""
    if unit.unit == "whole":
        return unit.path
    last = parse_piece(names[-1]) if names else None
    if last is not None and last.path == unit.path and last.stop == unit.start:
        names.pop()
        return Piece(unit.path, unit.unit, last.start, unit.stop).name
    return Piece(unit.path, unit.unit, unit.start, unit.stop).name


def piece_bytes(name: str) -> int:
    """Stored bytes of the source `name` that its task reads (a piece's share of its file)."""
    piece = parse_piece(name)
    if piece is None:
        return sum(u.bytes for u in file_units(name))
    if piece.unit == "row_groups":
        return sum(u.bytes for u in file_units(piece.path)[piece.start : piece.stop])
    return piece.stop - piece.start


def _line_start(f: IO[bytes], position: int) -> int:
    """Offset of the start of the line holding byte `position` - 1 (0 at the file's start)."""
    end = position - 1  # the line end before `position`, if it is one, belongs to that line
    while end > 0:
        begin = max(0, end - SCAN_BYTES)
        f.seek(begin)
        found = f.read(end - begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        end = begin
    return 0


def piece_lines(piece: Piece, fmt: str) -> Iterator[bytes]:
    """The raw lines (with their ends) of the documents of a `bytes` piece of a text
    (`fmt` text: documents end at blank lines) or JSONL file (one document a line)."""
    with open(piece.path, "rb") as f:
        position, previous_blank = 0, True
        if piece.start > 0:  # the line holding byte start - 1 belongs to the piece before
            begin = _line_start(f, piece.start)
            f.seek(begin)
            line = f.readline()
            position, previous_blank = begin + len(line), not line.strip()
        f.seek(position)
        inside = fmt == "jsonl" or previous_blank  # whether a document may start here
        for line in f:
            blank = not line.strip()
            if fmt == "jsonl":
                if position >= piece.stop:
                    return
            elif position >= piece.stop and (blank or previous_blank):
                return
            elif not inside:
                inside = blank
                position += len(line)
                previous_blank = blank
                continue
            yield line
            position += len(line)
            previous_blank = blank


class _Lines(io.RawIOBase):
    """The lines of `piece_lines` as a readable stream (what the text readers take)."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines, self._rest = lines, b""

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        while not self._rest:
            self._rest = next(self._lines, b"")
            if not self._rest:
                return 0
        size = min(len(out), len(self._rest))
        out[:size], self._rest = self._rest[:size], self._rest[size:]
        return size


class _Window(io.RawIOBase):
    """Bytes `start` .. `stop` - 1 of the file `path`."""

    def __init__(self, path: str, start: int, stop: int) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed with the stream)
        self._file.seek(start)
        self._left = stop - start

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        data = self._file.read(min(len(out), self._left))
        out[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def open_piece(piece: Piece, fmt: str) -> IO[bytes]:
    """A buffered binary stream of a `bytes` piece's lines or a `members` piece's tar bytes."""
    if piece.unit == "members":
        return io.BufferedReader(_Window(piece.path, piece.start, piece.stop))
    return io.BufferedReader(_Lines(piece_lines(piece, fmt)))
