"""Downstream evaluation, part 1: loading an encoder (checkpoint or exported directory) and
the built-in tasks."""

from pathlib import Path

import pytest
import torch

from pretrain.errors import ConfigError
from pretrain.eval.builtin_tasks import BUILTIN_TASKS, builtin_documents_sentences, builtin_task
from pretrain.eval.encoder import load_encoder
from pretrain.eval.tasks import SpanExample, TaggingExample, TextExample
from pretrain.export import export_checkpoint

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def exported_dir(tiny_encoder_checkpoint: Path, tmp_path_factory) -> Path:
    return export_checkpoint(tiny_encoder_checkpoint, tmp_path_factory.mktemp("eval") / "hf")


def _hidden(loaded, text: str) -> tuple[torch.Tensor, ...]:
    batch = loaded.tokenizer(text, return_tensors="pt")
    loaded.model.eval()
    with torch.no_grad():
        return loaded.model(dict(batch))


def test_checkpoint_and_export_load_the_same_encoder(tiny_encoder_checkpoint, exported_dir):
    from_ckpt = load_encoder(tiny_encoder_checkpoint)
    from_dir = load_encoder(exported_dir)
    assert from_ckpt.model_type == from_dir.model_type == "bert"
    assert from_ckpt.run_dir == tiny_encoder_checkpoint.parent.parent
    assert from_dir.run_dir == exported_dir
    first, second = _hidden(from_ckpt, "the class"), _hidden(from_dir, "the class")
    assert len(first) == 4  # embeddings + 3 layers
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b)


def test_random_init_keeps_the_size_and_changes_the_weights(exported_dir):
    pretrained = load_encoder(exported_dir)
    random = load_encoder(exported_dir, init="random", seed=1)
    again = load_encoder(exported_dir, init="random", seed=1)
    assert random.model.hidden_size == pretrained.model.hidden_size == 32
    last = _hidden(random, "the class")[-1]
    assert last.shape == _hidden(pretrained, "the class")[-1].shape
    assert not torch.allclose(last, _hidden(pretrained, "the class")[-1])
    torch.testing.assert_close(last, _hidden(again, "the class")[-1])


def test_bad_encoder_paths_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="encoder.path = .*not found"):
        load_encoder(tmp_path / "missing.ckpt")
    with pytest.raises(ConfigError, match="encoder.init"):
        load_encoder(tmp_path, init="zeros")


def test_bad_probe_settings_name_their_key():
    from pretrain.eval.config import EvalConfig

    with pytest.raises(ConfigError, match="eval.probe_epochs"):
        EvalConfig(probe_epochs=-1)
    with pytest.raises(ConfigError, match="eval.probe_lr"):
        EvalConfig(probe_lr=0)


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_builtin_tasks_are_deterministic_and_well_formed(name):
    task = builtin_task(name, train_size=60, dev_size=30, seed=3)
    again = builtin_task(name, train_size=60, dev_size=30, seed=3)
    other = builtin_task(name, train_size=60, dev_size=30, seed=4)
    assert (len(task.train), len(task.dev)) == (60, 30)
    assert task.train == again.train and task.dev == again.dev
    assert task.train != other.train
    example = task.train[0]
    if task.kind in ("classification", "pair"):
        assert isinstance(example, TextExample)
        labels = [e.label for e in task.train + task.dev]
        assert set(labels) == {0, 1} and 0.3 < sum(labels) / len(labels) < 0.7
        assert (example.text_b is None) == (task.kind == "classification")
    elif task.kind == "regression":
        assert all(0.0 <= e.label <= 1.0 for e in task.train)
        assert len({round(e.label, 2) for e in task.train}) > 5
    elif name == "builtin_replaced_qa":
        for e in task.train:
            ((text, start),) = e.answers  # SQuAD v1.1: every question has one answer
            assert e.context[start : start + len(text)] == text and len(text.split()) == 5
    elif task.kind == "qa":
        assert isinstance(example, SpanExample)
        answered = [e for e in task.train if e.answers]
        assert 0.5 < len(answered) / len(task.train) < 0.85  # about a third unanswerable
        for e in answered:
            text, start = e.answers[0]
            assert e.context[start : start + len(text)] == text
            assert e.context[: start - 1].endswith(e.question)
        assert all(e.question not in e.context for e in task.train if not e.answers)
    else:
        assert isinstance(example, TaggingExample)
        assert all(len(e.words) == len(e.tags) for e in task.train)
        tags = [t for e in task.train for t in e.tags]
        assert 0.05 < sum(tags) / len(tags) < 0.25


def test_continuation_and_replaced_qa_change_only_what_they_say():
    """builtin_continuation's B is A's next sentence, as written or with half of its words
    replaced; builtin_replaced_qa's context is a sentence with its 5-word answer replaced."""
    documents = builtin_documents_sentences()
    pairs = [(a, b.split()) for doc in documents for a, b in zip(doc, doc[1:], strict=False)]
    sentences = [s.split() for doc in documents for s in doc]

    def changed(words: list[str], truth: list[str]) -> list[int]:
        return [i for i, (w, t) in enumerate(zip(words, truth, strict=True)) if w != t]

    for e in builtin_task("builtin_continuation", train_size=60, dev_size=30).train:
        words = e.text_b.split()
        expected = 0 if e.label else round(len(words) / 2)
        assert any(
            len(changed(words, b)) == expected
            for a, b in pairs
            if a == e.text_a and len(b) == len(words)
        )
    for e in builtin_task("builtin_replaced_qa", train_size=60, dev_size=30).train:
        ((text, start),) = e.answers
        words, first = e.context.split(), len(e.context[:start].split())
        span = list(range(first, first + 5))
        assert words[first : first + 5] == text.split()
        assert any(len(s) == len(words) and changed(words, s) == span for s in sentences)
