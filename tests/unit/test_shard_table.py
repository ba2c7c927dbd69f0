"""The shard table a data-loader worker holds as compact arrays (issue 54 item 1): the same
paths, shares and records as the Python objects they replace, a few MB at 100,000 shards."""

import hashlib
import pickle

import pytest

from pretrain.data.datamodule import open_corpus, split_holdout
from pretrain.data.reading import _shard_sharing
from pretrain.data.shard_format import load_manifest
from pretrain.data.shard_table import ShardPaths, ShardSharing
from pretrain.storage.corpus import ShardRecords, StorageSpec


def test_shard_paths_give_back_the_paths_in_order():
    paths = ["/data/a/shard-2.tar", "/data/a/shard-10.tar", "/other/x.tar", "rel/y.tar"]
    table = pickle.loads(pickle.dumps(ShardPaths(paths)))
    assert list(table) == paths and len(table) == 4
    assert table[1] == paths[1] and table[-1] == paths[-1]
    assert table == tuple(paths) and hash(table) == hash(ShardPaths(paths))


def test_sharing_arrays_hold_each_shards_readers_and_units():
    shares = [(3, {0: 2}), (0, {1: 1, 0: 1}), (2, {2: 2}), (1, {1: 1, 2: 1})]
    sharing = ShardSharing(shares)
    assert [sharing[o] for o in range(len(sharing))] == shares
    assert sharing.places(1).tolist() == [1, 3]
    assert sharing.places(5).tolist() == []


def test_records_find_every_shard_by_name():
    triples = [
        (f"shard-{i}.tar", 100 + i, hashlib.sha256(bytes([i])).hexdigest()) for i in range(50)
    ]
    triples.append(("zeros.tar", 7, "00" * 32))  # a digest ending in zero bytes keeps them
    spec = pickle.loads(pickle.dumps(StorageSpec(url="s3://b/c", root="/tmp/c", shards=triples)))
    assert isinstance(spec.shards, ShardRecords)
    for name, size, sha in triples:
        assert spec.record(name) == (size, sha)
    with pytest.raises(KeyError):
        spec.record("missing.tar")


def test_a_worker_holds_under_20_mb_of_shard_table_at_100k_shards():
    shards = 100_000
    paths = ShardPaths(
        [f"/scratch/cache/corpus-0123456789ab/shard-{i:06d}.tar" for i in range(shards)]
    )
    records = ShardRecords(
        [
            (f"shard-{i:06d}.tar", 10**8, hashlib.sha256(str(i).encode()).hexdigest())
            for i in range(shards)
        ]
    )
    sharing = _shard_sharing(0, 0, 64, shards, tuple(range(1, shards + 1)))
    held = paths.nbytes() + records.nbytes() + sharing.nbytes()
    assert held < 20 << 20, held
    assert len(pickle.dumps((paths, records, sharing))) < 20 << 20


def test_shard_paths_and_counts_from_the_table_are_the_manifests(prepared_corpus):
    corpus = open_corpus(prepared_corpus)
    manifest = corpus.manifest
    training, heldout = split_holdout(corpus, 2)
    assert "shard_paths" not in manifest.__dict__  # no Path a shard was built
    paths = [str(path) for path in load_manifest(prepared_corpus).shard_paths]
    assert list(training) == paths[:-2] and list(heldout) == paths[-2:]
    assert hash(training) == hash(ShardPaths(paths[:-2]))
    assert hash(manifest.shard_path_table) == hash(ShardPaths(paths))
    picked = manifest.shard_path_table.take([4, 0, 2])
    assert list(picked) == [paths[4], paths[0], paths[2]]
    assert hash(picked) == hash(ShardPaths([paths[4], paths[0], paths[2]]))
    assert list(pickle.loads(pickle.dumps(ShardPaths(picked)))) == list(picked)
    assert len(manifest.shard_path_table.take([])) == 0
    records = load_manifest(prepared_corpus).shards  # counts from the arrays, as the records
    assert manifest.shard_counts([4, 0, 2]) == (
        tuple(records[i]["tokens"] for i in (4, 0, 2)),
        sum(records[i]["documents"] for i in (4, 0, 2)),
    )
