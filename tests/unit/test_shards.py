"""Reading shards: the manifest contract, document invariants and every failure mode."""

import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_raw_shard

from pretrain.data.shard_format import (
    FORMAT_VERSION,
    ShardError,
    check_shards,
    check_tokenizer,
    file_sha256,
    ids_dtype,
    load_manifest,
    read_documents,
)


@pytest.fixture
def corpus_copy(prepared_corpus: Path, tmp_path: Path) -> Path:
    """A private copy of the prepared corpus that a test may damage."""
    return Path(shutil.copytree(prepared_corpus, tmp_path / "corpus")).resolve()


def _rewrite_manifest(root: Path, change) -> Path:
    path = root / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    return path


def test_manifest_follows_the_contract(prepared_corpus):
    manifest = load_manifest(prepared_corpus)
    raw = json.loads((prepared_corpus / "manifest.json").read_text())
    assert manifest.format_version == raw["format_version"] == FORMAT_VERSION
    assert manifest.root == prepared_corpus.resolve() and manifest.raw == raw
    assert manifest.tokenizer_dir == prepared_corpus.resolve() / "tokenizer"
    assert manifest.tokenizer_sha256 == file_sha256(manifest.tokenizer_dir / "tokenizer.json")
    assert (
        manifest.vocab_size
        == len((manifest.tokenizer_dir / "vocab.txt").read_text().splitlines())
        <= 1500
    )
    assert manifest.dtype == "uint16" and raw["tokenizer"]["lowercase"] is True
    assert set(manifest.counts) == {
        "documents",
        "sentences",
        "tokens",
        "empty_documents",
        "undecodable_lines",
    }
    assert [p.name for p in manifest.shard_paths] == [f"shard-{i:06d}.tar" for i in range(6)]
    assert all(
        set(s) == {"name", "documents", "tokens", "bytes", "sha256"} for s in manifest.shards
    )
    assert all(set(s) >= {"path", "documents", "undecodable_lines"} for s in raw["sources"])
    check_shards(manifest, verify_sha256=True)
    check_tokenizer(manifest, manifest.tokenizer_dir)


def test_documents_match_manifest_counts_and_invariants(prepared_corpus):
    manifest = load_manifest(prepared_corpus)
    keys, sentences, tokens = [], 0, 0
    for shard, path in zip(manifest.shards, manifest.shard_paths, strict=True):
        documents = list(read_documents(path))
        assert len(documents) == shard["documents"] == 50
        assert sum(len(d["ids"]) for d in documents) == shard["tokens"]
        for d in documents:
            ids, sents, words = d["ids"], d["sents"], d["words"]
            assert (ids.dtype, sents.dtype, words.dtype) == (np.int64, np.int32, np.bool_)
            assert ids.shape == words.shape and ids.ndim == 1 and len(ids) > 0
            assert np.all(np.diff(sents) > 0) and sents[0] > 0 and sents[-1] == len(ids)
            assert words[0] and words[sents[:-1]].all()  # every sentence starts a word
            assert ids.min() >= 5 and ids.max() < manifest.vocab_size  # no special token is stored
            assert "." not in d["key"]
            keys.append(d["key"])
            sentences += len(sents)
            tokens += len(ids)
    assert len(keys) == len(set(keys)) == manifest.counts["documents"] == 300
    assert (sentences, tokens) == (manifest.counts["sentences"], manifest.counts["tokens"])
    assert keys == sorted(keys)  # one source: keys follow document order


def test_words_mark_wordpiece_word_starts(prepared_corpus):
    vocab = (prepared_corpus / "tokenizer/vocab.txt").read_text().splitlines()
    continuations = 0
    for document in read_documents(load_manifest(prepared_corpus).shard_paths[0]):
        tokens = [vocab[i] for i in document["ids"]]
        assert document["words"].tolist() == [not t.startswith("##") for t in tokens]
        continuations += len(tokens) - int(document["words"].sum())
    assert continuations > 100


@pytest.mark.parametrize(
    "vocab_size, dtype",
    [(200, "uint8"), (256, "uint8"), (257, "uint16"), (65536, "uint16"), (65537, "uint32")],
)
def test_ids_dtype_is_the_smallest_that_holds_every_id(vocab_size, dtype):
    assert ids_dtype(vocab_size) == dtype


def test_missing_or_malformed_manifest(corpus_copy):
    path = corpus_copy / "manifest.json"
    original = path.read_text()
    path.write_text("{not json")
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": not valid JSON"):
        load_manifest(corpus_copy)
    path.write_text(original)
    _rewrite_manifest(corpus_copy, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(
        ShardError,
        match=re.escape(str(path)) + f": format_version is {FORMAT_VERSION + 1}.*prepare",
    ):
        load_manifest(corpus_copy)
    _rewrite_manifest(corpus_copy, lambda m: m.pop("format_version"))
    with pytest.raises(ShardError, match="format_version is None"):
        load_manifest(corpus_copy)
    path.write_text(original)
    _rewrite_manifest(corpus_copy, lambda m: m["tokenizer"].pop("sha256"))
    with pytest.raises(ShardError, match="missing or malformed key 'sha256'"):
        load_manifest(corpus_copy)
    path.unlink()
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": no manifest"):
        load_manifest(corpus_copy)


def test_missing_or_resized_shard_is_named(corpus_copy):
    manifest = load_manifest(corpus_copy)
    third = manifest.shard_paths[2]
    third.unlink()
    with pytest.raises(
        ShardError, match=re.escape(str(third)) + ": shard listed in .*manifest.json is missing"
    ):
        check_shards(manifest)
    with pytest.raises(ShardError, match=re.escape(str(third)) + ": shard not found"):
        list(read_documents(third))
    shutil.copyfile(manifest.shard_paths[0], third)
    with pytest.raises(ShardError, match=re.escape(str(third)) + ": .* bytes, the manifest says"):
        check_shards(manifest)


def _member_offsets(path: Path) -> tuple[list[int], int]:
    """Header offsets of the members, and where the end-of-archive marker starts."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    last = members[-1]
    return [m.offset for m in members], last.offset_data + last.size + (-last.size % 512)


@pytest.mark.parametrize("where", ["half", "member_boundary", "sample_boundary", "end_marker"])
def test_truncated_shard_raises_naming_the_file(corpus_copy, where):
    path = load_manifest(corpus_copy).shard_paths[0]
    data = path.read_bytes()
    offsets, end = _member_offsets(path)  # 3 members per sample: ids, sents, words
    cut = {
        "half": len(data) // 2,
        "member_boundary": offsets[len(offsets) // 2 + 1],
        "sample_boundary": offsets[3 * 20],
        "end_marker": end + 512,
    }[where]
    path.write_bytes(data[:cut])
    read = []
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": .*(truncated|damaged)"):
        for document in read_documents(path):
            read.append(document["key"])
    assert len(read) == 50 if where == "end_marker" else len(read) < 50
    if where in ("half", "sample_boundary"):
        assert len(read) >= 10  # streamed: documents before the cut arrive before the error


def test_garbage_after_the_samples_is_an_error(corpus_copy):
    path = load_manifest(corpus_copy).shard_paths[0]
    data = path.read_bytes()
    _, end = _member_offsets(path)
    path.write_bytes(data[:end] + b"garbage!" * 64 + data[end:])
    with pytest.raises(ShardError, match=re.escape(str(path))):
        list(read_documents(path))


def test_inconsistent_sample_is_an_error(tmp_path):
    path = tmp_path / "bad.tar"
    write_raw_shard(
        path,
        [
            ("k_1.ids.npy", np.arange(5, 9)),
            ("k_1.sents.npy", np.array([2, 3], np.int32)),
            ("k_1.words.npy", np.ones(4, np.uint8)),
        ],
    )
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": sample 'k_1' is inconsistent"):
        list(read_documents(path))


def test_shards_read_with_another_tokenizer_name_both(corpus_copy, tmp_path):
    manifest = load_manifest(corpus_copy)
    other = tmp_path / "other_tokenizer"
    shutil.copytree(manifest.tokenizer_dir, other)
    state = json.loads((other / "tokenizer.json").read_text())
    state["normalizer"]["lowercase"] = False
    (other / "tokenizer.json").write_text(json.dumps(state))
    with pytest.raises(ShardError) as raised:
        check_tokenizer(manifest, other)
    message = str(raised.value)
    assert (
        str(other.resolve() / "tokenizer.json") in message
        and str(corpus_copy / "manifest.json") in message
    )
    assert str(manifest.tokenizer_dir) in message
    with pytest.raises(ShardError, match="no tokenizer.json"):
        check_tokenizer(manifest, tmp_path)
