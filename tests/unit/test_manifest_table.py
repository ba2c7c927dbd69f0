"""The manifest parsed once per node into a shard table of arrays that the other ranks and
workers map (issue 54 item 1): the same records as the manifest, never a stale or damaged
table, never unpickled."""

import json
import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from pretrain.data import manifest_table
from pretrain.data.manifest_table import node_table, read_table
from pretrain.data.node_manifest import open_manifest
from pretrain.data.shard_checks import repeated_shards
from pretrain.data.shard_format import ShardError, load_manifest, read_documents
from pretrain.data.shard_table import ShardPaths


def not_parsed(data: bytes):
    raise AssertionError("the manifest was parsed again")


def test_the_table_holds_the_manifests_records(prepared_corpus, tmp_path):
    parsed = load_manifest(prepared_corpus)
    opened = open_manifest(prepared_corpus, tmp_path)
    assert [dict(record) for record in opened.shards] == parsed.shards
    assert opened.shards[-1] == parsed.shards[-1] and opened.shards[1:3] == parsed.shards[1:3]
    assert opened.shard_paths == parsed.shard_paths
    assert opened.shard_documents == parsed.shard_documents
    assert opened.content_sha256 == parsed.content_sha256
    assert opened.raw == {k: v for k, v in parsed.raw.items() if k != "shards"}
    assert opened.table.repeats() == repeated_shards(parsed.shards) == {}
    table = opened.table
    assert all(table.find(s["name"]) == i for i, s in enumerate(parsed.shards))
    assert table.find("shard-999999.tar") is None


def test_other_processes_map_the_table_without_parsing(prepared_corpus, tmp_path):
    first = open_manifest(prepared_corpus, tmp_path)
    again = node_table(prepared_corpus / "manifest.json", tmp_path, not_parsed)
    assert again.directory == first.table.directory
    assert isinstance(again.arrays["bytes"], np.memmap)


def test_a_damaged_table_is_rebuilt_and_never_unpickled(prepared_corpus, tmp_path):
    directory = open_manifest(prepared_corpus, tmp_path).table.directory
    expected = load_manifest(prepared_corpus).shards
    # an object array (a pickle inside .npy) in place of the sizes: refused, rebuilt
    sizes = np.empty(len(expected), dtype=object)
    np.save(directory / "bytes.npy", sizes, allow_pickle=True)
    assert read_table(directory, directory.name) is None
    assert list(open_manifest(prepared_corpus, tmp_path).shards) == expected
    # a truncated array, then a header naming another manifest: rebuilt each time
    (directory / "tokens.npy").write_bytes((directory / "tokens.npy").read_bytes()[:-8])
    assert list(open_manifest(prepared_corpus, tmp_path).shards) == expected
    header = json.loads((directory / "header.json").read_text())
    (directory / "header.json").write_text(json.dumps({**header, "manifest_sha256": "0" * 64}))
    assert list(open_manifest(prepared_corpus, tmp_path).shards) == expected


def test_a_changed_manifest_gets_its_own_table(prepared_corpus, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(prepared_corpus, shards)
    before = open_manifest(shards, tmp_path / "tables")
    path = shards / "manifest.json"
    raw = json.loads(path.read_text())
    raw["shards"][0]["documents"] -= 1
    raw["shards"][0]["blocks"][-1]["documents"] -= 1
    raw["counts"]["documents"] -= 1
    path.write_text(json.dumps(raw))
    after = open_manifest(shards, tmp_path / "tables")
    assert after.table.directory != before.table.directory
    assert after.shards[0]["documents"] == before.shards[0]["documents"] - 1
    # the lowered count is refused by whoever reads the shard, naming it
    with pytest.raises(ShardError, match="shard-000000.tar: holds .* the manifest says"):
        next(read_documents(after.shard_paths[0]))


def test_a_bad_manifest_is_refused_naming_it(prepared_corpus, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(prepared_corpus, shards)
    (shards / "manifest.json").write_text("{not json")
    with pytest.raises(ShardError, match=r"manifest.json: not valid JSON"):
        open_manifest(shards, tmp_path / "tables")


def test_shard_paths_carry_the_table_to_workers(prepared_corpus, tmp_path, monkeypatch):
    opened = open_manifest(prepared_corpus, tmp_path)
    paths = ShardPaths([str(p) for p in opened.shard_paths])
    monkeypatch.setattr(manifest_table, "_REGISTERED", {})  # a worker's empty registry
    assert manifest_table.registered_table(opened.root) is None
    pickle.loads(pickle.dumps(paths))
    assert manifest_table.registered_table(opened.root) == str(opened.table.directory)


def counted_reads(monkeypatch, manifest) -> list:
    """The reads of `manifest`'s bytes from now on (Path.read_bytes, as node_table reads)."""
    reads, read_bytes = [], Path.read_bytes

    def counting(self):
        if self == manifest:
            reads.append(self)
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", counting)
    return reads


def test_a_later_process_maps_the_table_without_reading_the_manifest(
    prepared_corpus, tmp_path, monkeypatch
):
    shards, tables = tmp_path / "shards", tmp_path / "tables"
    shutil.copytree(prepared_corpus, shards)
    manifest = shards.resolve() / "manifest.json"
    record = manifest_table.identity_path(manifest, tables)
    # a manifest changed within SETTLED_NS is not trusted by identity; the copy above changed it
    # well within an hour however loaded the machine (the default 2 s is not: CI's load)
    monkeypatch.setattr(manifest_table, "SETTLED_NS", 3600 * 10**9)
    open_manifest(shards, tables)
    assert not record.exists()
    monkeypatch.setattr(manifest_table, "SETTLED_NS", 0)
    first = open_manifest(shards, tables)  # verifies the table: records the identity
    assert json.loads(record.read_text())["manifest_sha256"] == first.table.directory.name
    reads = counted_reads(monkeypatch, manifest)
    again = node_table(manifest, tables, not_parsed)
    assert reads == [] and again.directory == first.table.directory
    # a record of odd content is never trusted: the manifest is hashed, the record rewritten
    for odd in (
        "{not json",
        "[]",
        json.dumps({**json.loads(record.read_text()), "manifest_sha256": "../../elsewhere"}),
        record.read_text().replace('"size": ', '"size": 1'),
    ):
        record.write_text(odd)
        assert node_table(manifest, tables, not_parsed).directory == first.table.directory
        assert len(reads) == 1
        reads.clear()
    assert node_table(manifest, tables, not_parsed).directory == first.table.directory
    assert reads == []


def test_a_manifest_rewritten_in_place_at_its_size_is_hashed_again(
    prepared_corpus, tmp_path, monkeypatch
):
    shards, tables = tmp_path / "shards", tmp_path / "tables"
    shutil.copytree(prepared_corpus, shards)
    manifest = shards.resolve() / "manifest.json"
    monkeypatch.setattr(manifest_table, "SETTLED_NS", 0)
    before = open_manifest(shards, tables)
    assert manifest_table.identity_path(manifest, tables).exists()
    identity = manifest_table.file_identity(manifest.stat())
    original = manifest.read_bytes()
    raw = json.loads(original)
    raw["shards"][0]["documents"] += 1  # 50 -> 51: the same size, blocks no longer add up
    changed = json.dumps(raw, indent=2).encode() + original[len(original.rstrip()) :]
    assert len(changed) == len(original) and changed != original
    time.sleep(0.05)  # past the file system's timestamp tick (a few ms)
    with open(manifest, "r+b") as f:  # in place: the same inode, size and device
        f.write(changed)
    assert manifest_table.file_identity(manifest.stat()) != identity
    with pytest.raises(ShardError, match=r"manifest.json: .*blocks of shard-000000.tar"):
        open_manifest(shards, tables)
    time.sleep(0.05)
    manifest.write_bytes(original)  # put back: hashed again, the first table mapped
    assert open_manifest(shards, tables).table.directory == before.table.directory
