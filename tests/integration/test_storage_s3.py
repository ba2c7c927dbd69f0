"""A corpus on an S3-compatible server (moto's, a real S3 HTTP API on 127.0.0.1, started by
the test): `pretrain-data prepare` writes it there (manifest last), `info` and `verify` read
it, and training from s3:// gives the per-step losses of training from the local copy, with
data-loader workers and a cache bounded below the corpus's size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides, small_english_documents, write_text_corpus
from storage_servers import S3_ENV, make_bucket, moto_server
from test_train import step_losses

from pretrain.config import compose_config
from pretrain.runtime.run import build_stream, train
from pretrain.storage import filesystem, publish_corpus
from pretrain.storage.cache import downloads

BUCKET = "corpora"
PREPARE = ("tokenizer.vocab_size=1500", "tokenizer.min_frequency=2", "docs_per_shard=50")


@pytest.fixture(scope="module")
def s3():
    """The endpoint of a moto S3 server with bucket `corpora`, for the module."""
    with moto_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        yield endpoint


def point_at(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """AWS_ENDPOINT_URL and the AWS_* credentials of the server at `endpoint`, set through
    `monkeypatch` (undone with it)."""
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(autouse=True)
def s3_environment(s3, monkeypatch):
    """Each test reaches the module's server the standard way: AWS_ENDPOINT_URL and the AWS_*
    credentials in the environment, set for the test alone (the module's tests may run on
    several workers, between other modules' tests)."""
    point_at(monkeypatch, s3)


def pretrain_data(
    *args: str, cwd: Path, endpoint: str | None = None
) -> subprocess.CompletedProcess:
    """`pretrain-data` in a subprocess; `endpoint`: the S3 server (default: the environment's)."""
    env = os.environ | {"TMPDIR": str(cwd)}
    if endpoint is not None:
        env |= {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}
    return subprocess.run(
        [sys.executable, "-m", "data_pipelines.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def prepare_corpus(
    source: Path, out_dir: str | Path, cwd: Path, endpoint: str | None = None
) -> None:
    """`pretrain-data prepare` of the text file `source` into `out_dir` (local or S3)."""
    result = pretrain_data(
        "prepare", f"inputs=[{source}]", f"out_dir={out_dir}", *PREPARE, cwd=cwd, endpoint=endpoint
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def corpora(s3, build_once):
    """(URL, local copy) of the same corpus: prepared by `pretrain-data prepare` into a local
    directory once for all workers, and published to the module's server."""

    def make(root: Path) -> None:
        source = write_text_corpus(root / "corpus.txt", small_english_documents())
        prepare_corpus(source, root / "local", root)

    local = build_once("s3-local-corpus", make) / "local"
    url = f"s3://{BUCKET}/small"
    with pytest.MonkeyPatch.context() as environment:  # before the tests' own (s3_environment)
        point_at(environment, s3)
        publish_corpus(local, url)
    return url, local


def test_prepare_writes_the_corpus_to_s3_and_info_verify_read_it(corpora, s3, tmp_path):
    _, local = corpora
    url = f"s3://{BUCKET}/prepared-here"
    prepare_corpus(local.parent / "corpus.txt", url, tmp_path, endpoint=s3)  # the same input
    fs = filesystem(url)
    remote = json.loads(fs.cat_file(f"{url}/manifest.json"))
    assert remote == json.loads((local / "manifest.json").read_text())  # the same bytes
    for shard in remote["shards"]:
        assert fs.cat_file(f"{url}/{shard['name']}") == (local / shard["name"]).read_bytes()
    assert not list(Path(tmp_path).glob(".pretrain-staging/*"))
    info = pretrain_data("info", url, cwd=tmp_path)
    assert info.returncode == 0 and "shards" in info.stdout, info.stderr
    verify = pretrain_data("verify", url, cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr
    assert f"{url}: {len(remote['shards'])} shards verified" in verify.stdout
    again = pretrain_data("prepare", "inputs=[builtin]", f"out_dir={url}", cwd=tmp_path)
    assert again.returncode == 2 and "holds a prepared corpus" in again.stderr


def test_a_changed_object_fails_verify_naming_it(corpora, tmp_path):
    url, local = corpora
    fs = filesystem(url)
    copy = f"s3://{BUCKET}/changed"
    publish_corpus(local, copy)
    data = bytearray((local / "shard-000003.tar").read_bytes())
    data[100] ^= 1
    fs.pipe_file(f"{copy}/shard-000003.tar", bytes(data))
    result = pretrain_data("verify", copy, cwd=tmp_path)
    assert result.returncode == 1
    assert (
        f"{copy}/shard-000003.tar: download failed" in result.stderr and "sha256" in result.stderr
    )


@pytest.mark.slow
def test_losses_from_s3_equal_those_from_the_local_copy(corpora, tmp_path):
    url, local = corpora
    shard_bytes = max(
        s["bytes"] for s in json.loads((local / "manifest.json").read_text())["shards"]
    )
    common = (
        "trainer.max_steps=8",
        "trainer.log_every_n_steps=1",
        "data.num_workers=2",
        "data.shuffle_buffer_documents=50",
    )
    train(compose_config(cpu_run_overrides(local, tmp_path / "local", *common)))
    cache = tmp_path / "cache"
    remote = cpu_run_overrides(
        url,
        tmp_path / "s3",
        *common,
        f"data.cache_dir={cache}",
        f"data.cache_limit={int(2.5 * shard_bytes)}",
        # the data-loader workers fork from a forkserver that an earlier test of the session
        # may have started before this module set the AWS_* environment: say it explicitly
        f"+data.storage_options.endpoint_url={os.environ['AWS_ENDPOINT_URL']}",
        f"+data.storage_options.key={S3_ENV['AWS_ACCESS_KEY_ID']}",
        f"+data.storage_options.secret={S3_ENV['AWS_SECRET_ACCESS_KEY']}",
    )
    train(compose_config(remote))
    want, got = step_losses(tmp_path / "local"), step_losses(tmp_path / "s3")
    assert sorted(got) == list(range(8)) and got == want
    fetched = downloads(cache)
    assert fetched and all(name.endswith(".tar") for name, _ in fetched)
    saved = torch.load(tmp_path / "s3" / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["config"]["data"]["shards_dir"] == url  # where its data lives, as given
    tokenizer = tmp_path / "s3" / "tokenizer"  # the run's own copy: the cache may go
    assert saved["config"]["data"]["tokenizer_dir"] == str(tokenizer.resolve())
    assert (tokenizer / "tokenizer.json").read_bytes() == (
        local / "tokenizer" / "tokenizer.json"
    ).read_bytes()


def test_storage_options_reach_the_filesystem(s3, corpora, tmp_path, monkeypatch):
    url, endpoint = corpora[0], s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    overrides = cpu_run_overrides(
        url,
        tmp_path / "run",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"+data.storage_options.endpoint_url={endpoint}",
    )
    spec = build_stream(compose_config(overrides))[1]
    assert spec.storage.url == url and endpoint in spec.storage.options_json


def test_the_slurm_array_prepare_writes_to_s3(corpora, tmp_path, monkeypatch):
    """prepare-tokenizer, two array tasks and merge with out_dir on S3 (staged in the working
    directory, as the array's tasks share it): the documents of a single run."""
    from data_pipelines import slices
    from data_pipelines.prepare_config import compose_prepare_config

    url, local = corpora
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    halves = [work / "a.txt", work / "b.txt"]
    documents = small_english_documents()
    write_text_corpus(halves[0], documents[:150])
    write_text_corpus(halves[1], documents[150:])
    target = f"s3://{BUCKET}/sliced"
    cfg = compose_prepare_config(
        [f"inputs=[{halves[0]},{halves[1]}]", f"out_dir={target}", "num_proc=1", *PREPARE]
    )
    slices.prepare_tokenizer(cfg)
    for index in range(2):
        slices.prepare_slice(cfg, index, 2, progress=False)
    assert slices.merge_slices(cfg) == target
    remote = json.loads(filesystem(target).cat_file(f"{target}/manifest.json"))
    documents = [s["documents"] for s in remote["shards"]]  # each slice's last shard short
    assert sum(documents) == 300 and max(documents) == 50
    assert remote["counts"]["documents"] == 300
    assert not list(work.glob(".pretrain-staging/*"))  # the staging copy and slices removed


def test_a_new_endpoint_in_the_environment_reaches_a_new_server(s3, monkeypatch):
    """A process that read from one S3 endpoint reads from another once AWS_ENDPOINT_URL
    names it (the filesystem is not the one made for the first endpoint, now stopped)."""
    first = filesystem(f"s3://{BUCKET}/")
    first.pipe_file(f"{BUCKET}/where", b"first")
    with moto_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        make_bucket(endpoint, BUCKET)
        second = filesystem(f"s3://{BUCKET}/")
        second.pipe_file(f"{BUCKET}/where", b"second")
        assert second.cat_file(f"{BUCKET}/where") == b"second"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    assert filesystem(f"s3://{BUCKET}/").cat_file(f"{BUCKET}/where") == b"first"
