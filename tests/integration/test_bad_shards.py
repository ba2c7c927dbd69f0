"""A shard changed on disk after it was made (same size, so only its sha256 tells) stops a
run with one line naming it, or, under data.bad_shards=skip, is left out whole and said so;
data.verify_shards=true finds it before training starts. The data is never touched."""

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cpu_run_overrides, damage_first_shard, first_shard_read
from zygote import run_pretrain

from pretrain.config import compose_config
from pretrain.data.datamodule import open_corpus
from pretrain.data.shard_format import ShardError, read_documents
from pretrain.data.stream import EpochStream
from pretrain.runtime.run import build_stream


@pytest.fixture
def damaged_corpus(prepared_corpus, tmp_path) -> tuple[Path, Path, set[str]]:
    """(shards dir, the damaged shard, its document keys before): `damage_first_shard` of a
    copy of the small corpus."""
    target = tmp_path / "corpus"
    shutil.copytree(prepared_corpus, target)
    shard = first_shard_read(target)
    keys = {document["key"] for document in read_documents(shard)}
    damage_first_shard(target)
    return target, shard, keys


def run_cli(corpus: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    overrides = cpu_run_overrides(corpus, run_dir, "data.num_workers=2", *extra)
    return run_pretrain(overrides, run_dir.parent, timeout=300)


def test_a_changed_shard_stops_the_run_with_one_line_naming_it(damaged_corpus, tmp_path):
    corpus, shard, _ = damaged_corpus
    before = shard.read_bytes()
    result = run_cli(corpus, tmp_path / "run", "trainer.max_steps=100")
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(shard) in errors[0] and "sha256 differs" in errors[0]
    assert "Traceback" not in result.stderr
    assert shard.read_bytes() == before  # the data is left as it was


def test_skip_policy_leaves_the_whole_shard_out_and_says_so(damaged_corpus):
    corpus, shard, keys = damaged_corpus
    config = compose_config(cpu_run_overrides(corpus, Path("unused"), "data.bad_shards=skip"))
    _, spec, _ = build_stream(config)
    trained = {
        key.rsplit(":", 1)[0]
        for rank in range(2)
        for batch in EpochStream(replace(spec, rank=rank, world_size=2), epoch=0)
        for key in batch["keys"]
    }
    assert trained and not trained & keys
    with pytest.raises(ShardError, match="sha256 differs"):  # the default policy: an error
        list(EpochStream(replace(spec, bad_shards="error"), epoch=0))


def test_skip_policy_trains_to_the_end_and_warns(damaged_corpus, tmp_path):
    corpus, shard, _ = damaged_corpus
    result = run_cli(corpus, tmp_path / "run", "trainer.max_steps=10", "data.bad_shards=skip")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"data.bad_shards=skip: left out {shard}: sha256 differs" in result.stderr


def test_verify_shards_refuses_before_training(damaged_corpus, tmp_path):
    corpus, shard, _ = damaged_corpus
    result = run_cli(corpus, tmp_path / "run", "data.verify_shards=true")
    assert result.returncode == 2
    assert f"data.verify_shards: {shard}: sha256 differs" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    config = compose_config(
        cpu_run_overrides(corpus, Path("unused"), "data.verify_shards=true", "data.bad_shards=skip")
    )
    _, spec, _ = build_stream(config)
    assert str(shard) not in spec.shard_paths and len(spec.shard_paths) == 5


def test_a_manifest_vocab_size_that_is_not_the_tokenizers_is_refused(prepared_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(prepared_corpus, corpus)
    manifest = json.loads((corpus / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] += 7
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="gives vocab_size .* has .* tokens"):
        open_corpus(corpus)
