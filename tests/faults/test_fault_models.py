"""`init_from` and resuming with another model than the checkpoint's: the family, the
vocabulary size (another tokenizer) and the weight shapes are compared before any weight is
loaded, and the difference is one line (not torch's "Error(s) in loading state_dict")."""

import pytest
from conftest import prepare_small_corpus
from test_train import tiny_overrides

from data_pipelines.prepare_config import TokenizerSettings
from pretrain.checkpoint.relaunch import model_differences
from pretrain.config import compose_config
from pretrain.runtime.run import run_or_exit


@pytest.fixture(scope="module")
def other_vocabulary_corpus(tmp_path_factory):
    """The small corpus with a vocabulary of at most 900 tokens instead of 1500."""
    tokenizer = TokenizerSettings(vocab_size=900, lowercase=True, min_frequency=2)
    return prepare_small_corpus(tmp_path_factory.mktemp("vocab900"), tokenizer=tokenizer)


@pytest.fixture(scope="module")
def bert_checkpoint(prepared_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bert") / "run"
    run_or_exit(compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=1")))
    return run_dir / "checkpoints" / "last.ckpt"


def refused_line(cfg, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(cfg)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Error(s) in loading" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_init_from_another_vocabulary(bert_checkpoint, other_vocabulary_corpus, tmp_path, capsys):
    cfg = compose_config(
        tiny_overrides(other_vocabulary_corpus, tmp_path / "run", f"init_from={bert_checkpoint}")
    )
    line = refused_line(cfg, capsys)
    assert line.startswith(f"error: init_from={bert_checkpoint}: another model than this run's")
    assert "vocabulary size 1500 -> " in line and "weight shape(s) differ" in line


def test_init_from_another_family(bert_checkpoint, prepared_corpus, tmp_path, capsys):
    overrides = tiny_overrides(
        prepared_corpus, tmp_path / "run", "model=albert_tiny", f"init_from={bert_checkpoint}"
    )
    line = refused_line(compose_config(overrides), capsys)
    assert "model family BertEncoder -> AlbertEncoder" in line


def test_resume_on_another_vocabulary(prepared_corpus, other_vocabulary_corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_or_exit(compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=1")))
    for resume in ("resume=auto", "resume=force"):
        cfg = compose_config(
            tiny_overrides(other_vocabulary_corpus, run_dir, "trainer.max_steps=2", resume)
        )
        line = refused_line(cfg, capsys)
        assert line.startswith(f"error: resume from {run_dir / 'checkpoints' / 'last.ckpt'}: ")
        assert "vocabulary size 1500 -> " in line


def test_model_differences_name_each_kind():
    bert = {"_target_": "pretrain.models.bert.BertEncoder", "hidden_size": 32, "name": "a"}
    same = model_differences(
        {"model": bert, "model_runtime": {"vocab_size": 10}},
        {"model": {**bert, "name": "b"}, "model_runtime": {"vocab_size": 10}},
        {"encoder.w": (10, 32)},
        {"encoder.w": (10, 32)},
    )
    assert same == []
    wider = model_differences(
        {"model": bert}, {"model": {**bert, "hidden_size": 64}}, {"w": (2, 32)}, {"w": (2, 64)}
    )
    assert wider == ["model.hidden_size 32 -> 64", "1 weight shape(s) differ: w (2, 32) -> (2, 64)"]
