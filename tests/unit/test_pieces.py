"""Slices by bytes (`data_pipelines.pieces`): 30 files of very unequal sizes (text, JSONL,
Parquet row groups, tar samples, a gzip file that stays whole) cut for 64 tasks of stored
bytes within 2x of each other, whose pieces read in order give every document once."""

import gzip
import io
import json
import random
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_pipelines.pieces import parse_piece, piece_bytes, plan_pieces
from data_pipelines.sources import SourceStats, read_raw_documents


def paragraph(rng: random.Random) -> str:
    words = [rng.choice(("alpha", "beta", "gamma", "delta", "épsilon", "zeta")) for _ in range(30)]
    lines = [" ".join(words[i : i + rng.randint(3, 12)]) for i in range(0, 30, 10)]
    return "\n".join(lines)


def unequal_files(root: Path) -> list[str]:
    """30 inputs from about 200 bytes to 1.5 MB: text (multi-line documents), JSONL, one
    Parquet file of 40 row groups, one tar of 300 samples, one small gzip JSONL."""
    rng = random.Random(0)
    names = []
    for i in range(27):
        documents = [paragraph(rng) for _ in range(1 + int(1.38**i))]
        if i % 2:
            path = root / f"f{i:02d}.jsonl"
            path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
        else:
            path = root / f"f{i:02d}.txt"
            path.write_text("\n\n".join(documents) + "\n")
        names.append(str(path))
    table = pa.table({"text": [paragraph(rng) for _ in range(4000)]})
    pq.write_table(table, root / "g.parquet", row_group_size=100)
    with tarfile.open(root / "h.tar", "w") as tar:
        for k in range(300):
            data = paragraph(rng).encode()
            info = tarfile.TarInfo(f"s{k:05d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with gzip.open(root / "i.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"text": paragraph(rng)}) + "\n" for _ in range(20)))
    return [*names, str(root / "g.parquet"), str(root / "h.tar"), str(root / "i.jsonl.gz")]


def texts(names: list[str]) -> list[str]:
    stats = [SourceStats(n) for n in names]
    return [d.text for d in read_raw_documents(names, stats)]


def test_thirty_unequal_files_cut_for_64_tasks_within_twice_each_other(tmp_path):
    names = unequal_files(tmp_path)
    sizes = [Path(n).stat().st_size for n in names]
    assert len(names) == 30 and max(sizes) > 1000 * min(sizes)
    tasks = plan_pieces(names, 64)
    shares = [sum(piece_bytes(n) for n in task) for task in tasks]
    assert min(shares) > 0 and max(shares) <= 2 * min(shares), shares
    pieces = [n for task in tasks for n in task]
    units = {parse_piece(n).unit for n in pieces if parse_piece(n)}
    assert units == {"bytes", "row_groups", "members"}
    assert str(tmp_path / "i.jsonl.gz") in pieces  # gzip cannot be entered mid-stream: whole
    assert texts(pieces) == texts(names)


def test_a_cut_inside_a_document_leaves_it_to_the_piece_it_starts_in(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\n\nthree\nfour\n\nfive\n")
    size = path.stat().st_size
    for count in range(1, size + 1):  # every cut point, and more tasks than documents
        pieces = [n for task in plan_pieces([str(path)], count) for n in task]
        assert texts(pieces) == ["one\ntwo", "three\nfour", "five"], pieces
