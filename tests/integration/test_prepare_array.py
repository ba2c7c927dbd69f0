"""The prepare array (`data_pipelines.slices`) at scale: a merge that rewrites nothing (the
slices' shards linked under new names, their records carried over), and an upload to S3 that
resumes where a failed one stopped."""

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from conftest import three_file_corpus
from storage_servers import S3_ENV, make_bucket, moto_server

from data_pipelines import slices
from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings
from data_pipelines.slices import merge_slices, prepare_slice, prepare_tokenizer, work_dir
from pretrain.data.shard_format import MANIFEST_FILE, load_manifest, read_documents
from pretrain.storage import StorageError, filesystem

BUCKET = "corpora"


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
    """Every document of the corpus at `root`, in order, as comparable tuples (without its
    key: a piece that does not start its file keys its documents by the piece's name)."""
    documents = [d for path in load_manifest(root).shard_paths for d in read_documents(path)]
    assert len({d["key"] for d in documents}) == len(documents)  # keys unique
    return [(d["ids"].tolist(), d["sents"].tolist(), d["words"].tolist()) for d in documents]


def test_the_merge_holds_the_documents_and_counts_of_one_run(tmp_path):
    inputs = three_file_corpus(tmp_path / "text")
    single = prepare(settings(inputs, tmp_path / "single"), progress=False)
    cfg = settings(inputs, tmp_path / "sliced")
    sliced(cfg, 2)  # part1.txt cut in the middle; each slice's last shard is short
    merged = merge_slices(cfg)
    assert corpus_documents(merged) == corpus_documents(single)
    one, many = (json.loads((p / MANIFEST_FILE).read_text()) for p in (single, merged))
    for key in ("format_version", "tokenizer", "dtype", "counts", "sources", "config"):
        assert many[key] == one[key], key
    documents = [s["documents"] for s in many["shards"]]
    assert sum(documents) == 300 and max(documents) == 40 and len(documents) == 9
    assert (merged / "tokenizer" / "tokenizer.json").read_bytes() == (
        single / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    assert not work_dir(cfg).exists()


def test_the_merge_reads_no_shard(tmp_path):
    """Each slice's shards overwritten with zeros of the same size: a merge that read them
    would fail to decode them, one that hashed them would record other sha256s; this one
    lists them with the slices' records, as links to the very files."""
    cfg = settings(three_file_corpus(tmp_path / "text"), tmp_path / "out")
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


@pytest.fixture(scope="module")
def s3():
    """The endpoint of a moto S3 server with bucket `corpora`, for the module."""
    with moto_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        yield endpoint


def test_a_failed_upload_resumes_with_the_files_not_yet_there(s3, tmp_path, monkeypatch, capfd):
    """The merge into s3:// fails after 5 uploads (every later put raises): no manifest at
    the URL and the slices kept; the same merge again sends only the other files, the
    manifest last, then removes the slices."""
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    url = f"s3://{BUCKET}/resumed"
    cfg = settings(three_file_corpus(tmp_path / "text"), url)
    sliced(cfg, 3)
    fs = filesystem(url)  # the instance the upload uses (cached), its put_file patched
    real_put = fs.put_file
    puts: list[list[str]] = [[], []]
    lock = threading.Lock()

    def put_file(lpath, rpath, *args, fail_after=None, **kwargs):
        with lock:
            if fail_after is not None and len(puts[0]) >= fail_after:
                raise RuntimeError("injected: the connection dropped")
            puts[0 if fail_after is not None else 1].append(rpath.rsplit("resumed/", 1)[1])
        return real_put(lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(fs, "put_file", lambda *a, **k: put_file(*a, fail_after=5, **k))
    with pytest.raises(StorageError, match="injected"):
        merge_slices(cfg)
    assert len(puts[0]) == 5
    assert not fs.exists(f"{url}/{MANIFEST_FILE}")
    assert len(list(work_dir(cfg).glob("slice-*"))) == 3

    monkeypatch.setattr(fs, "put_file", lambda *a, **k: put_file(*a, **k))
    assert merge_slices(cfg) == url
    assert puts[1][-1] == MANIFEST_FILE  # written last
    assert not set(puts[0]) & set(puts[1])  # nothing sent twice
    manifest = json.loads(fs.cat_file(f"{url}/{MANIFEST_FILE}"))
    names = [s["name"] for s in manifest["shards"]]
    assert set(names) <= set(puts[0]) | set(puts[1])
    for shard in manifest["shards"]:
        assert hashlib.sha256(fs.cat_file(f"{url}/{shard['name']}")).hexdigest() == shard["sha256"]
    assert not work_dir(cfg).exists()
    assert "resumed, 5 of" in capfd.readouterr().err


def planted_corpus(root: Path) -> tuple[list[str], int]:
    """8 JSONL files of distinct documents, with exact and near duplicates (one word
    changed) of documents of other files planted in each; returns (paths, planted)."""
    import random

    rng = random.Random(1)
    vocabulary = ["".join(rng.choices("abcdefghijklmnop", k=6)) for _ in range(3000)]
    originals = [" ".join(rng.choices(vocabulary, k=120)) for _ in range(160)]
    files: list[list[str]] = [originals[i * 20 : (i + 1) * 20] for i in range(8)]
    planted = 0
    for i in range(8):
        for k in range(3):
            source = originals[((i + 3) % 8) * 20 + k]  # a document of another file
            words = source.split()
            words[60 + k] = "changed"
            files[i].insert(5 + 4 * k, source if k == 0 else " ".join(words))
            planted += 1
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, texts in enumerate(files):
        path = root / f"part{i}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        paths.append(str(path))
    return paths, planted


def array_run(inputs: list[str], out_dir: Path, count: int) -> Path:
    cfg = settings(inputs, out_dir, filters=["exact_dedup", "near_dedup"])
    prepare_tokenizer(cfg)
    for index in range(count):
        slices.prepare_dedup_signatures(cfg, index, count)
    slices.prepare_dedup(cfg, count)
    for index in range(count):
        prepare_slice(cfg, index, count, progress=False)
    return merge_slices(cfg)


def test_dedup_across_8_slices_keeps_the_documents_of_one_task(tmp_path):
    inputs, planted = planted_corpus(tmp_path / "text")
    one = array_run(inputs, tmp_path / "one", 1)
    eight = array_run(inputs, tmp_path / "eight", 8)
    assert corpus_documents(eight) == corpus_documents(one)
    filters = json.loads((eight / MANIFEST_FILE).read_text())["filters"]
    assert filters["dedup_scope"] == "global"
    assert filters["exact_dedup"]["removed"] == 8 and filters["near_dedup"]["removed"] == 16
    assert filters["documents_in"] == 160 + planted
    assert filters["documents_kept"] == 160 == load_manifest(eight).counts["documents"]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def fail_once(monkeypatch: pytest.MonkeyPatch, owner, name: str, call: int) -> None:
    """`owner.name` raises at its `call`-th call (an interrupted task), then works again."""
    real, calls = getattr(owner, name), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise RuntimeError(f"killed in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_every_step_interrupted_and_rerun_gives_the_bytes_of_an_uninterrupted_run(
    tmp_path, monkeypatch, capfd
):
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    from data_pipelines import global_dedup, shard_writer

    inputs, _ = planted_corpus(tmp_path / "text")
    out = tmp_path / "out"
    reference = tree_bytes(array_run(inputs, out, 4))
    shutil.rmtree(out)
    cfg = settings(inputs, out, filters=["exact_dedup", "near_dedup"])
    with monkeypatch.context() as patch:  # the tokenizer job killed while it trains
        fail_once(patch, slices, "make_tokenizer", 1)
        with pytest.raises(RuntimeError, match="killed"):
            prepare_tokenizer(cfg)
    prepare_tokenizer(cfg)
    prepare_tokenizer(cfg)
    with monkeypatch.context() as patch:  # task 1 killed mid-way through its signatures
        fail_once(patch, MinhashDedupSignature, "get_signature", 60)
        with pytest.raises(RuntimeError, match="killed"):
            for index in range(4):
                slices.prepare_dedup_signatures(cfg, index, 4)
    for index in range(4):
        slices.prepare_dedup_signatures(cfg, index, 4)
    with monkeypatch.context() as patch:  # killed after datatrove's buckets and clusters
        fail_once(patch, global_dedup, "_first_of_each_cluster", 1)
        with pytest.raises(RuntimeError, match="killed"):
            slices.prepare_dedup(cfg, 4)
    slices.prepare_dedup(cfg, 4)
    slices.prepare_dedup(cfg, 4)
    for index in range(2):
        prepare_slice(cfg, index, 4, progress=False)
    with monkeypatch.context() as patch:  # task 2 killed while writing its shards
        fail_once(patch, shard_writer.ShardWriter, "write_batch", 1)
        with pytest.raises(RuntimeError, match="killed"):
            prepare_slice(cfg, 2, 4, progress=False)
    for index in range(4):
        prepare_slice(cfg, index, 4, progress=False)
    with monkeypatch.context() as patch:  # killed once out_dir is written, before the cleanup
        fail_once(patch, slices, "publish", 1)
        with pytest.raises(RuntimeError, match="killed"):
            merge_slices(cfg)
    assert merge_slices(cfg) == out
    assert tree_bytes(out) == reference
    err = capfd.readouterr().err
    assert "tokenizer: resumed" in err
    assert "dedup signatures of slice 0 of 4: resumed" in err
    assert "dedup of 4 slices: resumed" in err
    assert "slice 0 of 4: resumed" in err
    assert "merge: resumed" in err
