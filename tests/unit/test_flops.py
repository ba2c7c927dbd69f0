"""The FLOP model (`pretrain.models.flops`, issue 14 item 1) against a count of the matrix products
of one forward and backward pass of each family's tiny model (torch's FlopCounterMode, with
the math attention kernel, whose matmuls it sees), and the device peaks MFU uses."""

import pytest
import torch
from hydra.utils import get_class
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from pretrain.config import compose_config, validate
from pretrain.data.vocab import Vocabulary
from pretrain.models.flops import device_peak_tflops, precision_kind, training_flops

VOCAB = Vocabulary(size=500, pad=0, unk=1, cls=2, sep=3, mask=4)
SMALL_DISTILBERT = (
    "model=distilbert",
    "model.hidden_size=32",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.intermediate_size=64",
)
FAMILIES = {
    "bert mlm+nsp": ("model=bert_tiny", "objective=mlm_nsp", "data=segment_pair"),
    "albert sop": ("model=albert_tiny", "objective=sop", "data=segment_pair"),
    "roberta mlm": ("model=roberta_tiny", "objective=mlm", "data=full_sentences"),
    "spanbert sbo": ("model=bert_tiny", "objective=span", "data=full_sentences"),
    "structbert": ("model=bert_tiny", "objective=structbert", "data=segment_pair"),
    "unilm": ("model=bert_tiny", "objective=unilm", "data=segment_pair"),
    "electra": ("model=electra_tiny", "objective=electra", "data=full_sentences"),
    "gpt causal lm": ("model=gpt_tiny", "objective=causal_lm", "data=full_sentences"),
    "distilbert mlm": (*SMALL_DISTILBERT, "objective=mlm", "data=full_sentences"),
    "bart": ("model=bart_tiny", "objective=bart", "data=full_sentences"),
    "mass": ("model=bart_tiny", "objective=mass", "data=full_sentences"),
}
SEQ2SEQ = ("bart", "mass")


def tiny_module(*overrides: str) -> torch.nn.Module:
    run = validate(compose_config(["data.max_seq_length=32", *overrides]))
    return get_class(run.objective._target_)(run, VOCAB)


def masked_batch(batch_size: int = 4, seq_len: int = 32, predicted: int = 5) -> dict:
    """A batch of real tokens (no padding), `predicted` positions a row to predict, and what
    the sentence, span-boundary and word-order heads read."""
    ids = torch.randint(5, VOCAB.size, (batch_size, seq_len), generator=torch.Generator())
    labels = torch.full_like(ids, -100)
    labels[:, 1 : 1 + predicted] = ids[:, 1 : 1 + predicted]
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids),
        "labels": labels,
        "next_sentence_label": torch.zeros(batch_size, dtype=torch.long),
        "span_left": torch.zeros_like(ids),
        "span_right": torch.full_like(ids, predicted + 1),
        "span_position": torch.zeros_like(ids),
        "shuffle_labels": labels.clone(),
        "lm_kind": torch.arange(batch_size) % 4,  # UniLM: each of its four attention masks
    }


def seq2seq_batch(batch_size: int = 4, source: int = 32, target: int = 24) -> dict:
    """Encoder inputs of `source` real tokens, decoder inputs and labels of `target`."""
    ids = torch.randint(5, VOCAB.size, (batch_size, source), generator=torch.Generator())
    decoder = ids[:, :target].clone()
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "decoder_input_ids": decoder,
        "decoder_attention_mask": torch.ones_like(decoder),
        "labels": decoder.clone(),
    }


def counted_flops(module: torch.nn.Module, batch: dict) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        module(batch)["loss"].backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_flop_model_matches_the_counted_matmuls(family: str) -> None:
    torch.manual_seed(0)
    module = tiny_module(*FAMILIES[family])
    batch = seq2seq_batch() if family in SEQ2SEQ else masked_batch()
    modelled = float(training_flops(module, batch))
    assert module.forward_flops(batch) is not None  # a formula, not the 6N fallback
    assert modelled == pytest.approx(counted_flops(module, batch), rel=0.02)


def test_padding_and_unused_positions_are_not_model_flops() -> None:
    module = tiny_module(*FAMILIES["bert mlm+nsp"])
    full = masked_batch(seq_len=16)
    padded = {key: value.clone() for key, value in full.items()}
    for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
        padded[key] = torch.cat([full[key], torch.zeros_like(full[key])], dim=1)  # 16 pads
    padded["labels"][:, 16:] = -100
    assert float(training_flops(module, padded)) == float(training_flops(module, full))
    # the sparse MLM head runs on the prediction slots only: 5 slots cost less than 10
    fewer, more = masked_batch(predicted=5), masked_batch(predicted=10)
    vocab_flops = 3 * 2 * 4 * 5 * 128 * VOCAB.size  # 5 more slots a row x (h -> vocab)
    transform = 3 * 2 * 4 * 5 * 128 * 128
    difference = float(training_flops(module, more)) - float(training_flops(module, fewer))
    assert difference == vocab_flops + transform


@pytest.mark.parametrize(
    "overrides", [("model=xlnet_tiny",), ("model=xlnet_base", "model.n_layer=1")]
)
def test_xlnet_two_streams_within_a_few_percent(overrides: tuple[str, ...]) -> None:
    """On the padded shape, the relative attention's position and segment terms and the
    query stream's one-hot mapping included; the 3 x forward rule counts a backward for the
    few products whose other input needs no gradient (relative positions, the mapping)."""
    module = tiny_module(*overrides, "objective=xlnet", "data=xlnet_pair")
    batch_size, seq_len, predict = 4, 32, 5
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB.size, (batch_size, seq_len), generator=generator)
    mapping = torch.zeros(batch_size, predict, seq_len)
    mapping[:, torch.arange(predict), 10 + torch.arange(predict)] = 1  # (batch, predict, seq)
    batch = {
        "input_ids": ids,
        "token_type_ids": (torch.arange(seq_len) >= 16).long().expand(batch_size, -1),
        "attention_mask": torch.ones_like(ids),
        "perm_mask": torch.rand(batch_size, seq_len, seq_len, generator=generator) > 0.5,
        "target_mapping": mapping,
        "target_labels": ids[:, 10 : 10 + predict].clone(),
    }
    modelled = float(training_flops(module, batch))
    assert modelled == pytest.approx(counted_flops(module, batch), rel=0.03)


def test_an_objective_without_a_formula_falls_back_to_6n() -> None:
    module = tiny_module(*FAMILIES["roberta mlm"])
    module.forward_flops = lambda batch: None
    batch = {"attention_mask": torch.ones(2, 8, dtype=torch.long)}
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert float(training_flops(module, batch)) == 6 * trainable * 16


def test_device_peaks() -> None:
    assert precision_kind("bf16-mixed") == "bf16"
    assert precision_kind("16-mixed") == "fp16"
    assert precision_kind("32-true") == "fp32"
    peak, source = device_peak_tflops("32-true", torch.device("cpu"))
    assert peak is None and "trainer.peak_tflops" in source  # no MFU against a moving peak


def test_distillation_counts_the_frozen_teacher_forward_once(tmp_path) -> None:
    teacher = tiny_module("model=bert_tiny", "model.num_hidden_layers=4", "objective=mlm")
    config = {**teacher.config, "model_runtime": {"vocab_size": VOCAB.size, "pad_token_id": 0}}
    config["data"] = {**config["data"], "tokenizer_dir": str(tmp_path)}
    path = tmp_path / "teacher.ckpt"
    torch.save({"state_dict": teacher.state_dict(), "config": config, "global_step": 0}, path)
    student = tiny_module(
        "model=bert_tiny",
        "objective=distillation",
        f"objective.teacher={path}",
        "data=full_sentences",
    )
    batch = masked_batch()
    assert float(training_flops(student, batch)) == pytest.approx(
        counted_flops(student, batch), rel=0.02
    )
