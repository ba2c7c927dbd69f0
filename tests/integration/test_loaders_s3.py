"""benchmarks/loaders.py --remote s3 (benchmarks/loaders_s3.py), its upload and read path at
tiny sizes: moto's S3 server started, each way's converted files uploaded, and each way's
loader reading its upload into an empty cache through its own client (ours and LitData:
AWS_ENDPOINT_URL; Mosaic: S3_ENDPOINT_URL; webdataset: presigned http:// URLs). The whole
script's smoke run (test_benchmarks_smoke.py) stays local: with the conversions and the
worker starts of all five ways it would take minutes."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SHAPE = (4, 64)  # rows, seq_len


@pytest.fixture(scope="module")
def loaders():
    """benchmarks/loaders.py as a module (its torchvision stand-in taken out afterwards)."""
    sys.path.insert(0, str(BENCHMARKS))
    import loaders

    yield loaders
    loaders.remove_stand_in()
    sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def server(loaders):
    """moto's S3 server, this process's environment pointed at it for the module."""
    import os

    from loaders_s3 import s3_server

    environment = dict(os.environ)
    with s3_server() as endpoint:
        yield endpoint
    os.environ.clear()
    os.environ.update(environment)


def first_batches(batches, count: int = 2) -> list[dict]:
    """The first `count` batches of the loader `batches`, then the loader closed."""
    taken = []
    for batch in batches:
        taken.append(batch)
        if len(taken) == count:
            break
    if hasattr(batches, "close"):
        batches.close()
    return taken


def cached_bytes(cache: Path) -> int:
    """Bytes of the files under `cache` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())


def test_ours_reads_its_upload_into_an_empty_cache_as_it_reads_local(
    loaders, server, prepared_corpus, tmp_path
):
    from loaders_s3 import upload

    from pretrain.data.shard_format import load_manifest

    args = SimpleNamespace(batch_size=SHAPE[0], seq_len=SHAPE[1])
    seconds, url = upload("ours", prepared_corpus)
    assert seconds > 0 and url == "s3://loaders/ours"
    tokenizer = load_manifest(prepared_corpus).tokenizer_dir
    cache = tmp_path / "cache"
    remote = first_batches(loaders.loader("ours", prepared_corpus, tokenizer, 0, args, url, cache))
    local = first_batches(loaders.loader("ours", prepared_corpus, tokenizer, 0, args))
    assert cached_bytes(cache) > 0  # read from the server, through data.cache_dir
    for from_s3, from_disk in zip(remote, local, strict=True):  # the same stream
        assert torch.equal(from_s3["input_ids"], from_disk["input_ids"])
        assert torch.equal(from_s3["labels"], from_disk["labels"])


@pytest.mark.parametrize("way", ["mosaic", "webdataset", "litdata"])
def test_theirs_read_their_upload_through_their_own_clients(
    loaders, server, prepared_corpus, tmp_path, way
):
    from loaders_s3 import upload

    from pretrain.data.shard_format import load_manifest

    if loaders.importable(way) is not None:
        pytest.skip(f"{way}: {loaders.importable(way)}")
    args = SimpleNamespace(batch_size=SHAPE[0], seq_len=SHAPE[1], wds_samples=16)
    tokenizer = load_manifest(prepared_corpus).tokenizer_dir
    text = tmp_path / "corpus.txt"
    documents = loaders.write_corpus(text, 0.02)
    out = tmp_path / way
    loaders.convert(way, text, documents, tokenizer, out, args)
    _, remote = upload(way, out)
    cache = tmp_path / "cache"
    batches = first_batches(loaders.loader(way, out, tokenizer, 0, args, remote, cache))
    assert [tuple(b["input_ids"].shape) for b in batches] == [SHAPE, SHAPE]
    assert all(b["labels"].ne(-100).any() for b in batches)
    if way == "webdataset":  # no cache of its own: each tar streamed over HTTP, presigned
        assert all(u.startswith(server) and "Signature=" in u for u in remote)
    else:
        assert cached_bytes(cache) > 0
