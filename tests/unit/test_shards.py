"""Reading shards: the manifest contract, document invariants and every failure mode."""

import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_raw_shard

from data_pipelines import cli
from data_pipelines.shard_format_v1 import write_v1_shard
from data_pipelines.shard_writer import ShardWriter, TokenizedDocument
from pretrain.data.shard_format import (
    FORMAT_VERSION,
    ShardError,
    check_shards,
    check_tokenizer,
    decode_keys,
    encode_keys,
    file_sha256,
    ids_dtype,
    load_manifest,
    read_documents,
    verify_shards,
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
        set(s) == {"name", "documents", "tokens", "bytes", "sha256", "blocks"}
        for s in manifest.shards
    )
    assert all(
        sum(b["documents"] for b in s["blocks"]) == s["documents"]
        and sum(b["tokens"] for b in s["blocks"]) == s["tokens"]
        for s in manifest.shards
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


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda m: m["shards"].append(m["shards"][0]), "is listed more than once"),
        (lambda m: m.update(dtype="uint8"), "dtype uint8 cannot hold the ids of vocab_size"),
        (lambda m: m["counts"].update(documents=1), "counts.documents is 1 but its shards hold"),
        (lambda m: m["counts"].update(tokens=7), "counts.tokens is 7 but its shards hold"),
    ],
)
def test_a_manifest_that_contradicts_itself_is_named(corpus_copy, change, said):
    path = _rewrite_manifest(corpus_copy, change)
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": .*" + said):
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


def _member_offsets(path: Path) -> tuple[list[tuple[str, int, int]], int]:
    """(name, header offset, data offset) of the members, and where the end marker starts."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    last = members[-1]
    end = last.offset_data + last.size + (-last.size % 512)
    return [(m.name, m.offset, m.offset_data) for m in members], end


@pytest.fixture(scope="module")
def blocked_shard(prepared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 300 documents of the prepared corpus in one shard of blocks of about 2,000 tokens
    (about 20 blocks), with a manifest beside it."""
    out = tmp_path_factory.mktemp("blocked")
    documents = [
        TokenizedDocument(d["key"], "", d["ids"].astype(np.uint16), d["sents"], d["words"])
        for path in load_manifest(prepared_corpus).shard_paths
        for d in read_documents(path)
    ]
    with ShardWriter(out, docs_per_shard=1000, tokens_per_block=2000) as writer:
        for document in documents:
            writer.write(document)
    raw = json.loads((prepared_corpus / "manifest.json").read_text())
    raw["shards"] = writer.shards
    (out / "manifest.json").write_text(json.dumps(raw))
    shutil.copytree(prepared_corpus / "tokenizer", out / "tokenizer")
    return out / writer.shards[0]["name"]


def _documents(path: Path, start: int = 0) -> list[tuple]:
    return [
        (d["key"], d["ids"].tolist(), d["sents"].tolist(), d["words"].tolist())
        for d in read_documents(path, start)
    ]


def test_blocks_round_trip_and_seek_by_document_count(blocked_shard, prepared_corpus):
    manifest = load_manifest(blocked_shard.parent)
    blocks = manifest.block_documents(0)
    assert len(blocks) >= 10 and sum(blocks) == 300
    every = _documents(blocked_shard)
    original = [
        (d["key"], d["ids"].tolist(), d["sents"].tolist(), d["words"].tolist())
        for path in load_manifest(prepared_corpus).shard_paths
        for d in read_documents(path)
    ]
    assert every == original
    first_of_block = int(np.cumsum(blocks)[2])
    for start in (1, first_of_block - 1, first_of_block, first_of_block + 1, 299, 300, 400):
        assert _documents(blocked_shard, start) == every[start:]
    assert manifest.locate_document(first_of_block) == (0, first_of_block)
    corpus = load_manifest(prepared_corpus)
    assert corpus.locate_document(0) == (0, 0) and corpus.locate_document(51) == (1, 1)
    with pytest.raises(IndexError):
        corpus.locate_document(300)


def test_keys_are_stored_as_runs_and_read_back_exactly():
    keys = ["ab_0009", "ab_0010", "ab_0012", "x", "y", "k_99", "k_100", "z7", "z8", "3", "4"]
    text = encode_keys(keys)
    assert decode_keys(text) == keys
    assert encode_keys([f"0a1b2c3d_{i:08d}" for i in range(5000)]) == "0a1b2c3d_\t00000000\t5000\n"


def test_shards_are_about_the_size_of_their_content(blocked_shard, tmp_path):
    documents = [
        TokenizedDocument(d["key"], "", d["ids"].astype(np.uint16), d["sents"], d["words"])
        for d in read_documents(blocked_shard)
    ]
    with ShardWriter(tmp_path, docs_per_shard=1000) as writer:  # default blocks
        for document in documents:
            writer.write(document)
    tokens = sum(len(d.ids) for d in documents)
    sentences = sum(len(d.sents) for d in documents)
    physical = 2 * tokens + 4 * sentences + -(-tokens // 8) + 8 * len(documents)
    assert writer.shards[0]["bytes"] <= 1.05 * physical


@pytest.mark.parametrize("where", ["half", "member_boundary", "block_boundary", "end_marker"])
def test_truncated_shard_raises_naming_the_file(blocked_shard, tmp_path, where):
    path = tmp_path / blocked_shard.name
    data = blocked_shard.read_bytes()
    members, end = _member_offsets(blocked_shard)
    cut = {
        "half": len(data) // 2,
        "member_boundary": members[len(members) // 2 + 2][1],
        "block_boundary": [o for n, o, _ in members if n.endswith(".docs.npy")][5],
        "end_marker": end + 512,
    }[where]
    path.write_bytes(data[:cut])
    read = []
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": .*(truncated|damaged)"):
        for document in read_documents(path):
            read.append(document["key"])
    last_block = load_manifest(blocked_shard.parent).block_documents(0)[-1]
    assert len(read) == (300 - last_block if where == "end_marker" else len(read)) < 300
    if where in ("half", "block_boundary"):
        assert len(read) >= 50  # streamed: blocks before the cut arrive before the error


def test_garbage_after_the_blocks_is_an_error(corpus_copy):
    path = load_manifest(corpus_copy).shard_paths[0]
    data = path.read_bytes()
    _, end = _member_offsets(path)
    path.write_bytes(data[:end] + b"garbage!" * 64 + data[end:])
    with pytest.raises(ShardError, match=re.escape(str(path))):
        list(read_documents(path))


def test_changed_byte_fails_the_sha256_check(corpus_copy):
    manifest = load_manifest(corpus_copy)
    path = manifest.shard_paths[1]
    data = bytearray(path.read_bytes())
    members, _ = _member_offsets(path)
    ids_data = next(o for n, _, o in members if n.endswith(".ids.npy"))
    data[ids_data + 200] ^= 1  # a token id changes; every array stays consistent
    path.write_bytes(bytes(data))
    differs = re.escape(str(path)) + ": sha256 differs"
    with pytest.raises(ShardError, match=differs):
        next(read_documents(path))  # before the first document is used
    with pytest.raises(ShardError, match=differs):
        next(read_documents(path, start_document=1))  # a seek reads the whole shard too
    with pytest.raises(ShardError, match=differs):
        verify_shards(manifest)


def test_ids_outside_the_manifest_vocabulary_are_an_error(corpus_copy):
    _rewrite_manifest(corpus_copy, lambda m: m["tokenizer"].update(vocab_size=100))
    path = load_manifest(corpus_copy).shard_paths[0]
    with pytest.raises(ShardError, match=re.escape(f"{path}: member 000000.ids.npy: id ")):
        list(read_documents(path))


def _raw_block(**changes) -> list[tuple[str, object]]:
    members = {
        "docs": np.array([1, 1], np.int32),
        "sents": np.array([2, 4], np.int32),
        "ids": np.arange(5, 9, dtype=np.uint16),
        "words": np.packbits(np.ones(4, bool)),
        "keys": b"k_\t1\t2\n",
    }
    members.update(changes)
    return [
        (f"000000.{name}.{'txt' if name == 'keys' else 'npy'}", value)
        for name, value in members.items()
    ]


@pytest.mark.parametrize(
    "changes, member",
    [
        ({"sents": np.array([2, 5], np.int32)}, "sents.npy"),  # past the ids
        ({"sents": np.array([3, 2], np.int32)}, "sents.npy"),  # not increasing
        ({"docs": np.array([1, 2], np.int32)}, "docs.npy"),  # more sentences than there are
        ({"sents": np.array([2, 4], np.int64)}, "sents.npy"),  # dtype
        ({"words": np.zeros(3, np.uint8)}, "words.npy"),  # bits for 24 tokens
        ({"keys": b"k_\t1\t3\n"}, "keys.txt"),  # 3 keys for 2 documents
        ({"keys": b"k_\t1\n"}, "keys.txt"),  # malformed
    ],
)
def test_inconsistent_block_is_an_error_naming_file_and_member(tmp_path, changes, member):
    path = tmp_path / "bad.tar"
    write_raw_shard(path, _raw_block(**changes))
    with pytest.raises(ShardError, match=re.escape(f"{path}: member 000000.{member}")):
        list(read_documents(path))
    write_raw_shard(path, _raw_block())
    assert [d["key"] for d in read_documents(path)] == ["k_1", "k_2"]


def _format1_copy(corpus: Path, target: Path) -> Path:
    """`corpus` (format 2) rewritten as format 1, as an older checkout prepared it."""
    shutil.copytree(corpus, target)
    raw = json.loads((corpus / "manifest.json").read_text())
    for shard in raw["shards"]:
        path = target / shard["name"]
        documents = [
            TokenizedDocument(
                d["key"],
                "",
                d["ids"].astype(np.uint16),
                d["sents"],
                d["words"].astype(np.uint8),
                d["phrases"] if raw["annotations"] else None,
            )
            for d in read_documents(corpus / shard["name"])
        ]
        write_v1_shard(path, documents)
        shard.pop("blocks")
        shard.update(bytes=path.stat().st_size, sha256=file_sha256(path))
    raw["format_version"] = 1
    raw["config"].pop("tokens_per_block")
    (target / "manifest.json").write_text(json.dumps(raw, indent=2))
    return target


@pytest.mark.parametrize("corpus", ["prepared_corpus", "prepared_chinese_corpus"])
def test_format1_corpus_is_one_line_error_then_upgraded(corpus, tmp_path, capsys, request):
    prepared_corpus = request.getfixturevalue(corpus)  # the Chinese one has span annotations
    old = _format1_copy(prepared_corpus, tmp_path / "old")
    with pytest.raises(ShardError) as raised:
        load_manifest(old)
    message = str(raised.value)
    assert "\n" not in message and f"`pretrain-data upgrade {old.resolve()}`" in message
    with pytest.raises(ShardError, match="format-1 shard .*pretrain-data upgrade"):
        list(read_documents(old / "shard-000000.tar"))
    assert cli.main(["upgrade", str(old)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # originals removed once done
    assert cli.main(["verify", str(old)]) == 0
    shards = [p.name for p in load_manifest(prepared_corpus).shard_paths]
    for name in ("tokenizer/tokenizer.json", *shards):
        assert (old / name).read_bytes() == (prepared_corpus / name).read_bytes(), name
    assert json.loads((old / "manifest.json").read_text()) == json.loads(
        (prepared_corpus / "manifest.json").read_text()
    )
    assert cli.main(["upgrade", str(old)]) == 1
    assert "only format-1 corpora are upgraded" in capsys.readouterr().err


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
