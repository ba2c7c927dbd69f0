"""The unpadded encoder path (pretrain/models/unpadding.py, issue 14 item 4): the same outputs
and gradients as the padded path on heavily padded batches, for every family that has it, and
a bounded set of unpadded row counts."""

import pytest
import torch

from pretrain.config import compose_config, validate
from pretrain.errors import ConfigError
from pretrain.models.build import build_encoder
from pretrain.models.unpadding import (
    UNPADDED_BUCKETS,
    unpadded_index,
    unpadded_inputs,
    unpadded_widths,
    unpadding,
    with_unpadded_index,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
FAMILIES = {
    "bert": {"_target_": "pretrain.models.bert.BertEncoder"},
    "roberta": {
        "_target_": "pretrain.models.roberta.RobertaEncoder",
        "max_position_embeddings": 66,
        "type_vocab_size": 2,
    },
    "albert": {"_target_": "pretrain.models.albert.AlbertEncoder", "embedding_size": 16},
    "electra": {"_target_": "pretrain.models.electra.ElectraEncoder", "embedding_size": 16},
    "distilbert": {"_target_": "pretrain.models.distilbert.DistilBertEncoder"},
}
PAD = 1


def padded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 rows of 48 positions, about 70% padding: row lengths 48, 1, 3 and 2..20."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([48, 1, 3, *torch.randint(2, 21, (5,), generator=generator).tolist()])
    mask = (torch.arange(48) < lengths[:, None]).long()  # (batch, seq)
    ids = torch.randint(5, 90, (8, 48), generator=generator).masked_fill(mask == 0, PAD)
    types = (torch.arange(48) >= lengths[:, None] // 2).long() * mask
    return ids, types, mask


def encoders(family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(padded, unpadded) encoders of `family` holding the same weights."""
    config = SIZES | FAMILIES[family]
    torch.manual_seed(0)
    padded = build_encoder(config | {"unpad": "false"}, 90, PAD)
    unpadded = build_encoder(config | {"unpad": "true"}, 90, PAD)
    unpadded.load_state_dict(padded.state_dict())
    return padded.train(), unpadded.train()


@pytest.mark.parametrize("family", FAMILIES)
def test_unpadded_outputs_and_gradients_equal_the_padded_path(family):
    padded, unpadded = encoders(family)
    ids, types, mask = padded_batch()
    real = mask.bool()
    assert real.float().mean() < 0.4  # heavy padding
    weights = torch.randn(32, generator=torch.Generator().manual_seed(1))
    outputs, losses = [], []
    for encoder in (padded, unpadded):
        hidden = encoder(ids, types, mask)  # (batch, seq, hidden)
        loss = (hidden[real] * weights).tanh().mean()
        loss.backward()
        outputs.append(hidden[real])
        losses.append(loss)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-6)
    for (name, a), b in zip(padded.named_parameters(), unpadded.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        assert (b.grad - a.grad).abs().max() <= 1e-5 * max(1, a.grad.abs().max()), name
    assert max(p.grad.abs().max() for p in padded.parameters()) > 1e-2  # gradients flow


def test_unpadded_row_counts_are_few_buckets_that_hold_every_real_token():
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        mask = (
            torch.rand(32, 128, generator=generator) < torch.rand(32, 1, generator=generator)
        ).long()
        layout = unpadding(mask, mask.bool()[:, None, None, :])
        real = int(mask.sum())
        rows = layout.index.numel()
        seen.add(rows)
        assert real <= rows <= real + 256  # the step for 32 x 128 is 256 tokens
        positions = layout.index[:real]
        assert mask.view(-1)[positions].all()  # the real tokens first, each once, in order
        assert torch.equal(positions, mask.view(-1).nonzero().squeeze(1))
        assert len(set(layout.index.tolist())) == rows
    assert seen <= set(unpadded_widths(32 * 128)) and len(seen) > 4
    for grid in (8, 64, 32 * 128, 32 * 512, 7 * 72, 1000 * 8):
        widths = unpadded_widths(grid)
        assert len(widths) <= UNPADDED_BUCKETS and widths[-1] == grid
        assert all(w % 8 == 0 for w in widths) and list(widths) == sorted(set(widths))
    assert unpadded_widths(32 * 128)[:2] == (256, 512)


def test_model_unpad_is_checked_and_reaches_the_encoder():
    assert validate(compose_config(["model.unpad=true"])).model.unpad == "true"  # a YAML bool
    assert validate(compose_config([])).model.unpad == "auto"
    with pytest.raises(ConfigError, match="model.unpad"):
        validate(compose_config(["model.unpad=sometimes"]))
    assert build_encoder(SIZES | FAMILIES["bert"] | {"unpad": True}, 90, 0).unpad == "true"
    xlnet = {"_target_": "pretrain.models.xlnet.XLNetEncoder", "d_model": 32, "n_layer": 1}
    with pytest.raises(ConfigError, match="model.unpad=true: XLNetEncoder has no unpadded path"):
        build_encoder({**xlnet, "unpad": "true"}, 90, 0)
    build_encoder({**xlnet, "unpad": "auto"}, 90, 0)  # auto: the padded path, no error


def test_the_index_computed_on_the_host_before_the_transfer_gives_the_same_outputs():
    padded, unpadded = encoders("electra")
    ids, types, mask = padded_batch(seed=2)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    padded.unpad = "auto"  # padded on the CPU, unpadded on CUDA
    assert "unpadded_index" not in with_unpadded_index({"attention_mask": mask}, padded, cpu)
    assert "unpadded_index" in with_unpadded_index({"attention_mask": mask}, padded, cuda)
    full = {"attention_mask": torch.ones_like(mask)}  # nothing to drop: stays padded
    assert "unpadded_index" not in with_unpadded_index(full, padded, cuda)
    batch = with_unpadded_index({"attention_mask": mask}, unpadded, cpu)  # model.unpad=true
    assert torch.equal(batch["unpadded_index"], unpadded_index(mask))
    real = mask.bool()
    with torch.no_grad():
        expected = padded(ids, types, mask)[real]  # auto on the CPU: the padded path
        given = unpadded(ids, types, mask, **unpadded_inputs(batch))[real]
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)
