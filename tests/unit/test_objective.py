"""The MLM objective module: BERT's optimizer recipe and loss only at masked positions."""

import pytest
import torch
from conftest import tiny_module_config
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.data.vocab import Vocabulary
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.runtime.schedule import warmup_then_decay
from pretrain.runtime.task import PretrainingTask

VOCAB = Vocabulary(size=300, pad=0, unk=1, cls=2, sep=3, mask=4)


def make_module(nsp: bool = True) -> MaskedLanguageModel:
    defaults = OmegaConf.to_container(compose_config(), resolve=True)
    config = tiny_module_config(
        {"pair_task": "nsp" if nsp else "none"},
        optim={
            "optimizer": {
                "_target_": "torch.optim.AdamW",
                "_partial_": True,
                "lr": 1e-3,
                "betas": [0.9, 0.999],
                "eps": 1e-6,
                "weight_decay": 0.01,
            },
            "schedule": "linear",
            "warmup_steps": 10,
        },
        trainer={**defaults["trainer"], "max_steps": 100},
        data={**defaults["data"], "max_seq_length": 64},
        strategy=defaults["strategy"],
    )
    return MaskedLanguageModel(config, VOCAB)


def test_weight_decay_spares_biases_and_layer_norms():
    module = make_module()
    optimizer = PretrainingTask(module).configure_optimizers()["optimizer"]
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert optimizer.defaults["betas"] == (0.9, 0.999) and optimizer.defaults["eps"] == 1e-6
    names = {id(p): n for n, p in module.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert all(
        n.endswith("bias") or "LayerNorm" in n or "norm" in n.lower() for n in no_decay_names
    )
    assert any("embeddings.word_embeddings" in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(module.parameters()))


def test_linear_warmup_then_linear_decay():
    factor = warmup_then_decay(10, 100, "linear")
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(55) == pytest.approx(0.5) and factor(100) == 0.0
    assert warmup_then_decay(10, 100, "constant")(80) == 1.0


def test_loss_counts_only_masked_positions():
    torch.manual_seed(0)
    module = make_module().eval()
    ids = torch.randint(5, VOCAB.size, (3, 12))
    batch = {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids),
        "labels": torch.full_like(ids, -100),
        "next_sentence_label": torch.tensor([0, 1, 0]),
    }
    batch["labels"][0, 3] = 17
    batch["labels"][2, 5] = 42
    with torch.no_grad():
        out = module(batch)
        hidden = module.encoder(ids, batch["token_type_ids"], batch["attention_mask"])
        logits = module.mlm_head(hidden[[0, 2], [3, 5]])
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([17, 42]))
    torch.testing.assert_close(out["mlm_loss"], expected)
    assert out["loss"] == pytest.approx(float(out["mlm_loss"] + out["nsp_loss"]))
    with torch.no_grad():
        assert "nsp_loss" not in make_module(nsp=False).eval()(batch)


def test_heldout_accuracy_counts_predictions():
    from pretrain.runtime.heldout import heldout_accuracy

    torch.manual_seed(0)
    module = make_module().eval()
    ids = torch.randint(5, VOCAB.size, (4, 10))
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    batch = {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids),
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1, 1, 0]),
    }
    with torch.no_grad():
        hidden = module.encoder(ids, batch["token_type_ids"], batch["attention_mask"])
        expected = (module.mlm_head(hidden[:, 2]).argmax(-1) == ids[:, 2]).float().mean().item()
        sentence = (
            (module.sentence_head(hidden).argmax(-1) == batch["next_sentence_label"])
            .float()
            .mean()
            .item()
        )
    result = heldout_accuracy(module, [batch, batch])
    assert result["predictions"] == 8
    assert result["mlm_accuracy"] == pytest.approx(expected)
    assert result["sentence_accuracy"] == pytest.approx(sentence)
