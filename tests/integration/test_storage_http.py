"""A corpus served over plain HTTP by a real server on 127.0.0.1 (a thread of the test, with
fault hooks), read through the shard cache: the same documents in the same order as from the
local copy, under injected 500s, connections cut mid-body and a server restarted mid-read; a
changed object is never used; a warm cache downloads nothing; WebDataset reads the shards."""

import io
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import cpu_run_overrides
from storage_servers import FaultyHTTPServer

from pretrain.config import compose_config
from pretrain.data.reading import read_split
from pretrain.data.shard_format import ShardError, load_manifest
from pretrain.runtime.run import build_stream
from pretrain.storage import StorageError, expand_braces, retry
from pretrain.storage.cache import downloads


@pytest.fixture
def server(prepared_corpus, tmp_path):
    served = FaultyHTTPServer(prepared_corpus).start()
    yield served
    served.stop()


def stream_spec(shards_dir, tmp_path, *extra, attempts: int = 6):
    cfg = compose_config(
        cpu_run_overrides(
            shards_dir,
            tmp_path / "run",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"data.download_attempts={attempts}",
            *extra,
        )
    )
    return build_stream(cfg)[1]


def documents(spec) -> list[tuple[str, list[int]]]:
    """(key, ids) of every document of epoch 3, one reader, in the stream's order."""
    return [(d["key"], d["ids"].tolist()) for _, d in read_split(spec, 3, 0, 1)]


def test_http_corpus_reads_as_the_local_copy_under_faults(prepared_corpus, server, tmp_path):
    local = documents(stream_spec(prepared_corpus, tmp_path / "local"))
    server.faults.fail_every, server.faults.cut_every = 3, 5
    spec = stream_spec(server.url, tmp_path)
    assert spec.storage is not None and spec.shard_paths[0].startswith(str(tmp_path / "cache"))
    assert documents(spec) == local
    shards = len(load_manifest(prepared_corpus).shards)
    assert sorted(name.split("/")[1] for name, _ in downloads(tmp_path / "cache")) == [
        f"shard-{n:06d}.tar" for n in range(shards)
    ]  # each shard downloaded once, though requests failed
    requested = sum(n for path, n in server.faults.paths.items() if path.endswith(".tar"))
    assert requested > shards  # faults were met and retried

    gets = server.faults.gets  # a warm cache: a resume reads without downloading shards
    assert documents(stream_spec(server.url, tmp_path)) == local
    shard_gets = sum(n for p, n in server.faults.paths.items() if p.endswith(".tar"))
    assert shard_gets == requested and server.faults.gets > gets  # only the manifest, tokenizer


def test_a_changed_object_is_never_used(prepared_corpus, server, tmp_path):
    spec = stream_spec(server.url, tmp_path)
    name = "shard-000002.tar"
    changed = bytearray((prepared_corpus / name).read_bytes())
    changed[len(changed) // 2] ^= 0xFF  # same size, another byte
    server.faults.changed[f"/{name}"] = bytes(changed)
    with pytest.raises(ShardError, match=rf"{server.url}/{name}: download failed after 6 .*sha256"):
        documents(spec)
    assert not list((tmp_path / "cache").glob(f"*/{name}"))


def test_a_server_restarted_mid_read_is_waited_for(prepared_corpus, server, tmp_path, monkeypatch):
    local = documents(stream_spec(prepared_corpus, tmp_path / "local"))
    spec = stream_spec(server.url, tmp_path)
    server.stop()  # down after the manifest was read, before any shard
    waits, first = [], threading.Lock()

    def restart_then_wait(seconds: float) -> None:  # the server is back during the first wait
        with first:  # the prefetcher's downloads wait too, in their own threads
            if not waits:
                server.start()
            waits.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(retry, "time", SimpleNamespace(sleep=restart_then_wait))
    assert documents(spec) == local
    assert waits  # refused while down, then answered by the restarted server


def test_a_server_gone_for_good_fails_naming_the_url_and_attempts(server, tmp_path):
    spec = stream_spec(server.url, tmp_path, attempts=3)
    server.stop()
    with pytest.raises(
        ShardError,
        match=r"http://127\.0\.0\.1:\d+/shard-0000\d\d\.tar: "
        r"download failed after 3 attempt\(s\)",
    ):
        documents(spec)


def test_no_manifest_at_the_url_is_one_line(server, tmp_path):
    with pytest.raises((ShardError, StorageError), match=r"/nothing/manifest\.json: no manifest"):
        stream_spec(f"{server.url}/nothing", tmp_path)


def test_webdataset_reads_the_shards_as_blocks_of_documents(prepared_corpus, server):
    import webdataset as wds

    manifest = load_manifest(prepared_corpus)
    pattern = f"{server.url}/shard-{{000000..{len(manifest.shards) - 1:06d}}}.tar"
    assert expand_braces(pattern)[-1].endswith(f"shard-{len(manifest.shards) - 1:06d}.tar")
    samples = list(wds.WebDataset(pattern, shardshuffle=False, empty_check=False))
    blocks = [block for shard in manifest.shards for block in shard["blocks"]]
    assert len(samples) == len(blocks)
    first = samples[0]
    assert {"__key__", "docs.npy", "sents.npy", "ids.npy", "words.npy", "keys.txt"} <= set(first)
    docs = np.load(io.BytesIO(first["docs.npy"]))  # sentences per document of the block
    assert len(docs) == blocks[0]["documents"] and first["__key__"] == "000000"
