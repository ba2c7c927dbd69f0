"""Corpora in the formats they ship in: every format written with its real library, read back
as the same documents, prepared to the same shards as JSONL; suffix/magic mismatches and
corrupt files give one line naming the file."""

import bz2
import csv
import gzip
import io
import json
import lzma
import re
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import small_english_documents

from data_pipelines.formats import SUPPORTED, detect_format
from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings
from data_pipelines.sources import (
    SourceError,
    SourceStats,
    expand_inputs,
    read_records,
    read_source,
)
from data_pipelines.tokenizer import save_tokenizer, train_tokenizer
from pretrain.data.shard_format import load_manifest, read_documents


def tricky_documents() -> list[str]:
    """40 documents of prose plus ones with what breaks naive CSV: commas, quotes, tabs,
    multi-line fields and blank lines inside a document."""
    documents = small_english_documents(40)
    documents[3] = 'He said, "quote, with commas", and left.\nA second line.'
    documents[7] = "Line one\n\nafter a blank line\n\n\nand three"
    documents[11] = 'Tab\there; a "lonely quote and, comma'
    documents[13] = "Ünïcödé — “curly” quotes, and emoji 🚀."
    return documents


def compress(data: bytes, kind: str) -> bytes:
    return {
        "gz": gzip.compress,
        "zst": zstandard.ZstdCompressor().compress,
        "xz": lzma.compress,
        "bz2": bz2.compress,
    }[kind](data)


def jsonl_bytes(documents: list[str]) -> bytes:
    lines = (json.dumps({"id": i, "text": t}, ensure_ascii=False) for i, t in enumerate(documents))
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_formats(root: Path, documents: list[str]) -> dict[str, Path]:
    """The same `documents` in every supported format (text field `text`, an `id` beside it),
    each written with the format's own library; returns {label: path}."""
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    paths["jsonl"] = root / "c.jsonl"
    paths["jsonl"].write_bytes(jsonl_bytes(documents))
    for kind in ("gz", "zst", "xz", "bz2"):
        paths[f"jsonl.{kind}"] = root / f"c.jsonl.{kind}"
        paths[f"jsonl.{kind}"].write_bytes(compress(jsonl_bytes(documents), kind))
    table = pa.table({"id": list(range(len(documents))), "text": documents})
    paths["parquet"] = root / "c.parquet"
    pq.write_table(table, paths["parquet"], row_group_size=7)  # several row groups
    paths["arrow"] = root / "c.arrow"
    with ipc.new_file(str(paths["arrow"]), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=9):
            writer.write_batch(batch)
    paths["datasets"] = _write_datasets_dir(root / "saved", table)
    for label, delimiter in (("csv", ","), ("tsv", "\t")):
        paths[label] = root / f"c.{label}"
        with open(paths[label], "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(["id", "text"])
            writer.writerows(enumerate(documents))
    paths["csv.zst"] = root / "c.csv.zst"
    paths["csv.zst"].write_bytes(compress(paths["csv"].read_bytes(), "zst"))
    paths["tar"] = _write_tar(root / "c.tar", documents)
    return paths


def _write_datasets_dir(directory: Path, table: pa.Table) -> Path:
    """A directory laid out as `datasets.Dataset.save_to_disk` writes it: Arrow IPC stream
    files named in state.json, dataset_info.json beside them."""
    directory.mkdir()
    halves = [table.slice(0, 25), table.slice(25)]
    names = [f"data-{i:05d}-of-00002.arrow" for i in range(2)]
    for name, part in zip(names, halves, strict=True):
        with ipc.new_stream(str(directory / name), part.schema) as writer:
            writer.write_table(part, max_chunksize=10)
    state = {"_data_files": [{"filename": n} for n in names], "_split": None}
    (directory / "state.json").write_text(json.dumps(state))
    (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return directory


def _write_tar(path: Path, documents: list[str]) -> Path:
    """A WebDataset tar: sample i has `.txt` (even i) or `.json` (odd i) and a `.cls`."""
    with tarfile.open(path, "w") as tar:
        for i, text in enumerate(documents):
            members = {"cls": str(i % 3).encode()}
            if i % 2:
                members["json"] = json.dumps({"text": text, "url": "x"}).encode()
            else:
                members["txt"] = text.encode("utf-8")
            for suffix, data in sorted(members.items()):
                info = tarfile.TarInfo(f"shard/{i:06d}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> dict[str, Path]:
    return write_formats(tmp_path_factory.mktemp("formats"), tricky_documents())


def _texts(path: Path, **settings) -> list[str]:
    return list(read_source(str(path), SourceStats(str(path)), **settings))


def test_detection_by_suffix():
    assert detect_format("a/b.jsonl.zst") == ("jsonl", "zstd")
    assert detect_format("b.JSON.gz") == ("jsonl", "gzip")
    assert detect_format("b.csv.bz2") == ("csv", "bz2")
    assert detect_format("b.tsv") == ("tsv", None)
    assert detect_format("b.tar") == ("tar", None)
    assert detect_format("b.parquet") == ("parquet", None)
    assert detect_format("b.arrow") == ("arrow", None)
    assert detect_format("notes.txt.xz") == ("text", "xz")


@pytest.mark.parametrize(
    "label",
    [
        "jsonl",
        "jsonl.gz",
        "jsonl.zst",
        "jsonl.xz",
        "jsonl.bz2",
        "parquet",
        "arrow",
        "datasets",
        "csv",
        "tsv",
        "csv.zst",
        "tar",
    ],
)
def test_every_format_reads_the_same_documents(formats, label):
    assert _texts(formats[label]) == tricky_documents()


def test_a_datasets_directory_is_one_source(formats):
    assert expand_inputs([str(formats["datasets"])]) == [str(formats["datasets"])]
    root = formats["datasets"].parent
    found = expand_inputs([str(root)])
    assert str(formats["datasets"]) in found and not any("/saved/" in name for name in found)
    assert str(formats["parquet"]) in found


def test_csv_is_rows_not_blank_line_paragraphs(formats):
    texts = _texts(formats["csv"])
    assert len(texts) == 40  # not split at blank lines, no header, no row ids
    assert texts[3] == 'He said, "quote, with commas", and left.\nA second line.'
    assert texts[7].count("\n") == 5
    assert "id" not in texts and "0" not in texts


def test_text_field_is_configurable_and_a_missing_one_is_named(formats, tmp_path):
    path = tmp_path / "c.csv"
    path.write_text('body,n\n"a, b",1\n"multi\nline",2\n', encoding="utf-8")
    assert _texts(path, text_field="body") == ["a, b", "multi\nline"]
    for label in ("csv", "parquet", "arrow", "tar", "jsonl"):
        with pytest.raises(SourceError, match="'content'") as error:
            _texts(formats[label], text_field="content")
        assert str(formats[label]) in str(error.value) and "\n" not in str(error.value)


def test_text_that_starts_like_a_magic_number_is_text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("BZh is how this note starts.\n\nPAR1 is not Parquet here.\n")
    assert _texts(path) == ["BZh is how this note starts.", "PAR1 is not Parquet here."]


def test_zstd_text_and_multiple_frames(tmp_path):
    path = tmp_path / "t.txt.zst"
    frames = [compress(b"first doc\n\nsecond doc\n\n", "zst"), compress(b"third doc\n", "zst")]
    path.write_bytes(b"".join(frames))
    assert _texts(path) == ["first doc", "second doc", "third doc"]


@pytest.mark.parametrize(
    "name, content, shown",
    [
        ("c.jsonl", "parquet", "parquet"),
        ("c.txt", "jsonl.zst", "zstd"),
        ("c.parquet", "jsonl", "text"),
        ("c.jsonl.gz", "jsonl.zst", "zstd"),
        ("c.tar", "csv", "text"),
        ("c.arrow", "parquet", "parquet"),
    ],
)
def test_suffix_and_magic_mismatch_is_one_line(formats, tmp_path, name, content, shown):
    path = tmp_path / name
    path.write_bytes(formats[content].read_bytes())
    with pytest.raises(SourceError) as error:
        _texts(path)
    message = str(error.value)
    assert message.startswith(f"{path}:") and "\n" not in message
    assert shown in message.split("first bytes are")[1] and SUPPORTED in message


@pytest.mark.parametrize("label", ["jsonl.zst", "jsonl.gz", "jsonl.xz", "parquet", "csv.zst"])
def test_truncated_or_corrupt_files_give_one_line_naming_the_file(formats, tmp_path, label):
    data = formats[label].read_bytes()
    truncated = tmp_path / formats[label].name
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = tmp_path / ("x" + formats[label].name)
    corrupt.write_bytes(data[:8] + bytes(b ^ 0x5A for b in data[8:]))
    for path in (truncated, corrupt):
        with pytest.raises(SourceError) as error:
            _texts(path)
        assert str(error.value).startswith(f"{path}:") and "\n" not in str(error.value)


def test_each_format_prepares_to_the_same_shards_as_jsonl(formats, tmp_path):
    documents = tricky_documents()
    tokenizer = train_tokenizer(lambda: documents, 600, min_frequency=1)
    tokenizer_dir = save_tokenizer(tokenizer, tmp_path / "tokenizer")

    def prepared(label: str) -> list[tuple]:
        out = prepare(
            PrepareConfig(
                inputs=[str(formats[label])],
                out_dir=str(tmp_path / label),
                tokenizer=TokenizerSettings(path=str(tokenizer_dir)),
                docs_per_shard=16,
                num_proc=1,
            ),
            progress=False,
        )
        manifest = load_manifest(out)
        counts = {k: v for k, v in manifest.counts.items()}
        docs = [
            (d["ids"].tolist(), d["sents"].tolist(), d["words"].tolist())
            for path in manifest.shard_paths
            for d in read_documents(path)
        ]
        return [counts, docs]

    expected = prepared("jsonl")
    assert expected[0]["documents"] == 40
    for label in ("parquet", "datasets", "csv", "tar", "jsonl.zst"):
        assert prepared(label) == expected, label


ID_FORMATS = ["jsonl", "jsonl.zst", "parquet", "arrow", "datasets", "csv", "tsv", "csv.zst"]


@pytest.mark.parametrize("label", ID_FORMATS)
def test_id_field_reads_each_documents_id(formats, label):
    path = str(formats[label])
    records = list(read_records(path, SourceStats(path), id_field="id"))
    assert [text for text, _ in records] == tricky_documents()
    assert [i for _, i in records] == [str(i) for i in range(40)]  # ints and CSV text alike


@pytest.mark.parametrize("label", ["jsonl", "parquet", "arrow", "datasets", "csv", "tsv"])
def test_a_missing_id_column_is_one_line_naming_the_file_and_column(formats, label):
    path = str(formats[label])
    with pytest.raises(SourceError) as error:
        list(read_records(path, SourceStats(path), id_field="doc_id"))
    message = str(error.value)
    assert "\n" not in message and "'doc_id'" in message and "id column" in message
    named = path if label != "datasets" else str(next(formats[label].glob("*.arrow")))
    assert message.startswith(named + ":") or message.startswith(path + ":")


def test_ids_that_the_shards_cannot_key_are_named_with_their_row(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"id": null, "text": "y"}\n', encoding="utf-8")
    with pytest.raises(SourceError, match=f"^{path}:2: id 'id' is null"):
        list(read_records(str(path), SourceStats(str(path)), id_field="id"))
    table = pa.table({"id": ["a", "b\tc"], "text": ["x", "y"]})
    pq.write_table(table, tmp_path / "c.parquet")
    with pytest.raises(SourceError, match=re.escape("c.parquet: row 1: id 'id' = 'b\\tc'")):
        list(read_records(str(tmp_path / "c.parquet"), SourceStats(""), id_field="id"))


@pytest.mark.parametrize("label", ["tar", "text"])
def test_id_field_on_a_format_without_ids_is_one_line(formats, tmp_path, label):
    path = formats["tar"] if label == "tar" else tmp_path / "c.txt"
    if label == "text":
        path.write_text("a document\n", encoding="utf-8")
    with pytest.raises(SourceError, match=f"^{path}: id_field='id', but a {label} source"):
        list(read_records(str(path), SourceStats(str(path)), id_field="id"))


def test_ids_key_the_shards_and_name_removed_documents(formats, tmp_path):
    """With id_field the shards' keys are the ids (the same documents and keys from Parquet,
    CSV and JSONL), and the filters' statistics name removed documents by id."""
    documents = tricky_documents()
    tokenizer_dir = save_tokenizer(
        train_tokenizer(lambda: documents, 600, min_frequency=1), tmp_path / "tokenizer"
    )

    def prepared(path: Path, out: str, **settings) -> tuple[list, dict]:
        out_dir = prepare(
            PrepareConfig(
                inputs=[str(path)],
                out_dir=str(tmp_path / out),
                tokenizer=TokenizerSettings(path=str(tokenizer_dir)),
                docs_per_shard=16,
                num_proc=1,
                **settings,
            ),
            progress=False,
        )
        manifest = load_manifest(out_dir)
        docs = [
            (d["key"], d["ids"].tolist(), d["words"].tolist())
            for shard in manifest.shard_paths
            for d in read_documents(shard)
        ]
        return docs, json.loads((out_dir / "manifest.json").read_text())

    plain, _ = prepared(formats["jsonl"], "plain")
    keyed, manifest = prepared(formats["jsonl"], "jsonl", id_field="id")
    assert [k for k, *_ in keyed] == [str(i) for i in range(40)]
    assert [rest for _, *rest in keyed] == [rest for _, *rest in plain]
    assert manifest["config"]["id_field"] == "id"
    for label in ("parquet", "csv"):
        assert prepared(formats[label], label, id_field="id")[0] == keyed, label
    copies = tmp_path / "copies.jsonl"
    lines = formats["jsonl"].read_bytes().decode("utf-8").splitlines()
    copied = [json.dumps({"id": f"copy-{i}", "text": documents[i]}) for i in (5, 9)]
    copies.write_text("\n".join(lines + copied) + "\n", encoding="utf-8")
    _, manifest = prepared(copies, "copies", id_field="id", filters=["exact_dedup"])
    assert manifest["filters"]["exact_dedup"]["removed"] == 2
    assert manifest["filters"]["examples"] == {"exact_dedup": ["copy-5", "copy-9"]}


def test_the_cli_reports_a_mismatch_in_one_line_and_exits_2(formats, tmp_path, capsys):
    from data_pipelines import cli

    wrong = tmp_path / "data.jsonl"
    wrong.write_bytes(formats["parquet"].read_bytes())
    status = cli.main(["prepare", f"inputs=[{wrong}]", f"out_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert str(wrong) in err and "parquet" in err and "supported:" in err
    assert not (tmp_path / "out").exists()
