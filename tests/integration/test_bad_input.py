"""Bad data reaches the user as a clear error naming the file, before training starts."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.data.datamodule import open_corpus
from pretrain.data.shard_format import ShardError

PRETRAIN = str(Path(sys.executable).parent / "pretrain")


@pytest.fixture
def corpus_copy(prepared_corpus, tmp_path) -> Path:
    target = tmp_path / "corpus"
    shutil.copytree(prepared_corpus, target)
    return target


def first_shard(corpus: Path) -> Path:
    return corpus / json.loads((corpus / "manifest.json").read_text())["shards"][0]["name"]


def test_missing_shard_is_named(corpus_copy):
    shard = first_shard(corpus_copy)
    shard.unlink()
    with pytest.raises(ShardError, match=shard.name):
        open_corpus(corpus_copy)


def test_truncated_shard_is_named(corpus_copy):
    shard = first_shard(corpus_copy)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=shard.name):
        open_corpus(corpus_copy)


def test_tokenizer_of_another_corpus_is_refused(corpus_copy, tmp_path):
    other = tmp_path / "other-tokenizer"
    shutil.copytree(corpus_copy / "tokenizer", other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, different ids
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ShardError, match="tokenizer"):
        open_corpus(corpus_copy, other)


def test_missing_corpus_tells_how_to_prepare_it(tmp_path):
    with pytest.raises(ShardError, match="data.shards_dir"):
        open_corpus(tmp_path / "nowhere")


def test_cli_fails_before_training_and_keeps_the_data(corpus_copy, tmp_path):
    shard = first_shard(corpus_copy)
    shard.write_bytes(shard.read_bytes()[:1000])
    before = sorted(p.name for p in corpus_copy.iterdir())
    result = subprocess.run(
        [PRETRAIN, f"data.shards_dir={corpus_copy}", f"run_dir={tmp_path}/run", "logger=csv"],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang, not a speed check
    )
    assert result.returncode == 2
    assert shard.name in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in corpus_copy.iterdir()) == before
    assert not (tmp_path / "run" / "checkpoints").exists()
