"""The retention table's computation (pretrain.compress.retention), not its figures: a student
identical to the teacher keeps 100% of the teacher's accuracy and margin; a weight-pruned model
is fine-tuned with its zeros held at zero; an int8 directory scores the fine-tuned teacher made
int8; the arithmetic of retention and margin kept. Tiny models and tasks (seconds)."""

import shutil

import lightning as L
import pytest
import torch
from conftest import tiny_module_config
from safetensors.torch import load_file, save_file

from pretrain.compress.encoders import EncoderWithMLM, write_hf_directory
from pretrain.compress.quantize import load_hf_masked_lm, quantize_dynamic_int8, save_quantized
from pretrain.compress.retention import (
    KeepZeros,
    QuantizeBeforePredict,
    finetune_accuracy,
    margin_kept,
    retention,
    score_models,
    table,
)
from pretrain.data.vocab import load_vocabulary

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

# A small fit: 96 training and 48 dev examples, 2 probe epochs then 1 of fine-tuning
SMALL = (
    "eval.task.train_size=96",
    "eval.task.dev_size=48",
    "eval.probe_epochs=2",
    "eval.epochs=1",
)
PRUNED = "bert.encoder.layer.0.intermediate.dense.weight"


@pytest.fixture(scope="module")
def teacher(prepared_corpus, tmp_path_factory):
    tokenizer = prepared_corpus / "tokenizer"
    vocab = load_vocabulary(tokenizer)
    # conftest's tiny encoder, its weights drawn wider (a teacher whose logits are not flat)
    config = {**tiny_module_config({})["model"], "name": "teacher", "initializer_range": 0.05}
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("retention") / "teacher"
    return write_hf_directory(EncoderWithMLM(config, vocab), tokenizer, vocab, out)


def pruned_copy(teacher, out):
    """The teacher with every other weight of one Linear set to zero."""
    shutil.copytree(teacher, out)
    weights = load_file(out / "model.safetensors")
    weights[PRUNED] = weights[PRUNED].clone()
    weights[PRUNED].view(-1)[::2] = 0.0
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


class Spy(L.Callback):
    """What the fit left: the encoder's weights after training, its modules at prediction."""

    def on_train_end(self, trainer, pl_module) -> None:
        self.weights = {n: p.detach().clone() for n, p in pl_module.encoder.named_parameters()}

    def on_predict_end(self, trainer, pl_module) -> None:
        self.modules = dict(pl_module.encoder.named_modules())


def test_an_identical_student_keeps_everything(teacher, tmp_path):
    student = shutil.copytree(teacher, tmp_path / "student")
    int8 = tmp_path / "int8"
    save_quantized(quantize_dynamic_int8(load_hf_masked_lm(teacher)), teacher, int8)
    rows = score_models(teacher, [student, int8], ["builtin_order"], [0], SMALL)
    names = [row.name for row in rows]
    assert names == ["teacher", "student", "int8", "random weights"]
    assert rows[2].how == "teacher fine-tuned, then int8"
    teacher_scores, student_scores = (row.scores["builtin_order"] for row in rows[:2])
    assert student_scores == teacher_scores  # the same weights, seeds and recipe
    assert retention(student_scores, teacher_scores) == 1.0
    assert rows[0].how == "fine-tuned" and rows[-1].how.startswith("teacher's architecture")
    assert "| student | fine-tuned | " in table(rows)


def test_a_pruned_model_stays_pruned_while_fine_tuned(teacher, tmp_path):
    pruned = pruned_copy(teacher, tmp_path / "pruned")
    zeros = load_file(pruned / "model.safetensors")[PRUNED] == 0
    name = "model." + PRUNED.removeprefix("bert.")
    before = load_file(teacher / "model.safetensors")[PRUNED]
    kept, free = Spy(), Spy()
    finetune_accuracy(pruned, "builtin_order", 0, callbacks=(KeepZeros(), kept), overrides=SMALL)
    finetune_accuracy(pruned, "builtin_order", 0, callbacks=(free,), overrides=SMALL)
    assert bool((kept.weights[name][zeros] == 0).all())
    assert bool((kept.weights[name][~zeros] != before[~zeros]).any())  # the rest is fine-tuned
    assert bool((free.weights[name][zeros] != 0).any())  # without KeepZeros they grow back


def test_int8_scores_the_fine_tuned_model_quantized(teacher):
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    spy = Spy()
    callbacks = (QuantizeBeforePredict(), spy)
    accuracy = finetune_accuracy(teacher, "builtin_order", 0, callbacks=callbacks, overrides=SMALL)
    assert 0.0 <= accuracy <= 1.0
    query = spy.modules["model.encoder.layer.0.attention.self.query"]
    assert isinstance(query, Int8Linear)  # the dev set was predicted by the int8 encoder


def test_retention_and_margin_arithmetic():
    teacher, random = [0.80, 0.90], [0.50, 0.50]
    assert retention([0.85, 0.85], teacher) == pytest.approx(1.0)
    assert retention([0.50, 0.50], teacher) == pytest.approx(0.5 / 0.85)
    assert margin_kept([0.85, 0.85], teacher, random) == pytest.approx(1.0)
    assert margin_kept([0.50, 0.50], teacher, random) == pytest.approx(0.0)
    assert margin_kept([0.675, 0.675], teacher, random) == pytest.approx(0.5)
    assert margin_kept([0.6], [0.5], [0.5]) != margin_kept([0.6], [0.5], [0.5])  # nan
