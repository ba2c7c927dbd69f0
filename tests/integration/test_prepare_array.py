"""The prepare array (`data_pipelines.slices`) at scale: a merge that rewrites nothing (the
slices' shards linked under new names, their records carried over), and an upload to S3 that
resumes where a failed one stopped."""

import json
import os
from pathlib import Path

from conftest import small_english_documents, write_text_corpus

from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings
from data_pipelines.slices import merge_slices, prepare_slice, prepare_tokenizer, work_dir
from pretrain.data.shard_format import MANIFEST_FILE, load_manifest, read_documents


def three_files(root: Path) -> list[str]:
    """Three text inputs of 100, 100 and 100 documents."""
    documents = small_english_documents()
    root.mkdir(parents=True, exist_ok=True)
    return [
        str(write_text_corpus(root / f"part{i}.txt", documents[i * 100 : (i + 1) * 100]))
        for i in range(3)
    ]


def settings(inputs: list[str], out_dir: Path | str, **extra) -> PrepareConfig:
    return PrepareConfig(
        inputs=inputs,
        out_dir=str(out_dir),
        tokenizer=TokenizerSettings(vocab_size=1000, min_frequency=2),
        docs_per_shard=40,
        num_proc=1,
        **extra,
    )


def sliced(cfg: PrepareConfig, count: int) -> list[Path]:
    """The tokenizer and `count` slices of `cfg` prepared; returns the slice directories."""
    prepare_tokenizer(cfg)
    return [prepare_slice(cfg, index, count, progress=False) for index in range(count)]


def corpus_documents(root: Path) -> list[tuple]:
    """Every document of the corpus at `root`, in order, as comparable tuples."""
    return [
        (d["key"], d["ids"].tolist(), d["sents"].tolist(), d["words"].tolist())
        for path in load_manifest(root).shard_paths
        for d in read_documents(path)
    ]


def test_the_merge_holds_the_documents_and_counts_of_one_run(tmp_path):
    inputs = three_files(tmp_path / "text")
    single = prepare(settings(inputs, tmp_path / "single"), progress=False)
    cfg = settings(inputs, tmp_path / "sliced")
    sliced(cfg, 2)  # 100 and 200 documents, 40 a shard: 3 + 5 shards, not one run's 8
    merged = merge_slices(cfg)
    assert corpus_documents(merged) == corpus_documents(single)
    one, many = (json.loads((p / MANIFEST_FILE).read_text()) for p in (single, merged))
    for key in ("format_version", "tokenizer", "dtype", "counts", "sources", "config"):
        assert many[key] == one[key], key
    assert [s["documents"] for s in many["shards"]] == [40, 40, 20, 40, 40, 40, 40, 40]
    assert (merged / "tokenizer" / "tokenizer.json").read_bytes() == (
        single / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    assert not work_dir(cfg).exists()


def test_the_merge_reads_no_shard(tmp_path):
    """Each slice's shards overwritten with zeros of the same size: a merge that read them
    would fail to decode them, one that hashed them would record other sha256s; this one
    lists them with the slices' records, as links to the very files."""
    cfg = settings(three_files(tmp_path / "text"), tmp_path / "out")
    records, inodes = [], []
    for directory in sliced(cfg, 3):
        for shard in json.loads((directory / MANIFEST_FILE).read_text())["shards"]:
            path = directory / shard["name"]
            path.write_bytes(bytes(path.stat().st_size))
            records.append({k: v for k, v in shard.items() if k != "name"})
            inodes.append(path.stat().st_ino)
    merged = merge_slices(cfg)
    shards = json.loads((merged / MANIFEST_FILE).read_text())["shards"]
    assert [{k: v for k, v in s.items() if k != "name"} for s in shards] == records
    assert [s["name"] for s in shards] == [f"shard-{i:06d}.tar" for i in range(len(records))]
    assert [os.stat(merged / s["name"]).st_ino for s in shards] == inodes
