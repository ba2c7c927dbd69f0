"""Which mask attention gets (issue 58 item 6): no mask for a batch without padding, so SDPA
may take FlashAttention (which takes none), decided on the host where the batch is built; the
same outputs as with the all-ones mask. FlexAttention's block masks built once per shape."""

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn import functional as F

from pretrain.config import compose_config
from pretrain.data.vocab import Vocabulary
from pretrain.models import document_attention
from pretrain.models.build import build_encoder
from pretrain.models.unpadding import encoder_mask, mark_padding
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.runtime.task import PretrainingTask

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = Vocabulary(size=300, pad=0, unk=1, cls=2, sep=3, mask=4)


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every scaled_dot_product_attention call (the real one runs)."""
    calls, real = [], F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def batch_of(lengths: list[int], seq: int = 16) -> dict:
    generator = torch.Generator().manual_seed(0)
    mask = (torch.arange(seq) < torch.tensor(lengths)[:, None]).long()  # (batch, seq)
    ids = torch.randint(5, 300, (len(lengths), seq), generator=generator) * mask
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def mlm_task() -> PretrainingTask:
    config = OmegaConf.to_container(compose_config(["model=bert_tiny"]), resolve=True)
    config["model"] |= {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    return PretrainingTask(MaskedLanguageModel(config, VOCAB)).eval()


def test_an_unpadded_batch_reaches_sdpa_without_a_mask_with_the_same_outputs(sdpa_calls):
    task = mlm_task()
    full = batch_of([16, 16])
    with torch.no_grad():
        masked = task.objective.encode(dict(full))  # no host flag: the all-ones mask
        assert all(call["attn_mask"] is not None for call in sdpa_calls)
        sdpa_calls.clear()
        host = task.host_batch(dict(full))
        assert host["has_padding"] is False
        unmasked = task.objective.encode(host)
    assert sdpa_calls and all(call["attn_mask"] is None for call in sdpa_calls)
    torch.testing.assert_close(unmasked, masked, atol=1e-6, rtol=0)


def test_a_padded_batch_keeps_its_mask(sdpa_calls):
    task = mlm_task()
    host = task.host_batch(batch_of([16, 9]))
    assert host["has_padding"] is True
    with torch.no_grad():
        task.objective.encode(host)
    assert sdpa_calls and all(call["attn_mask"] is not None for call in sdpa_calls)


def test_gpt_without_padding_takes_the_causal_kernel_with_the_same_outputs(sdpa_calls):
    config = OmegaConf.to_container(compose_config(["model=gpt_tiny"]).model, resolve=True)
    torch.manual_seed(0)
    gpt = build_encoder(config | {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}, 300, 0)
    batch = batch_of([16, 16])
    with torch.no_grad():
        masked = gpt(batch["input_ids"], attention_mask=batch["attention_mask"])
        sdpa_calls.clear()
        unmasked = gpt(batch["input_ids"], attention_mask=encoder_mask(mark_padding(batch)))
    assert all(c["attn_mask"] is None and c["is_causal"] for c in sdpa_calls)
    torch.testing.assert_close(unmasked, masked, atol=1e-6, rtol=0)


def test_a_batch_on_the_device_or_with_query_masks_is_not_marked():
    three_d = {"attention_mask": torch.ones(2, 4, 4)}
    assert "has_padding" not in mark_padding(three_d)
    assert encoder_mask(three_d) is three_d["attention_mask"]


@pytest.mark.skipif(not document_attention.flex_available(), reason="torch without flex")
def test_a_block_mask_is_built_once_per_shape(monkeypatch):
    from torch.nn.attention import flex_attention

    built, real = [], flex_attention.create_block_mask
    monkeypatch.setattr(
        flex_attention, "create_block_mask", lambda *a, **k: built.append(a) or real(*a, **k)
    )
    document_attention.static_block_mask.cache_clear()
    cpu = torch.device("cpu")
    first = document_attention.block_mask(None, 8, 256, cpu)
    assert document_attention.block_mask(None, 8, 256, cpu) is first and len(built) == 1
    document_attention.block_mask(None, 8, 384, cpu)  # another length: another mask
    assert len(built) == 2


@pytest.mark.skipif(not document_attention.flex_available(), reason="torch without flex")
def test_document_block_masks_of_one_shape_compile_once():
    """Masks over packed documents differ per batch; compiled (as on CUDA), the builder
    captures one graph for every batch of a shape, not a graph per call."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cpu = torch.device("cpu")
    for seed in range(3):
        keys = torch.randint(0, 3, (2, 256), generator=torch.Generator().manual_seed(seed))
        keys = keys.sort(dim=-1).values  # documents numbered along each row
        document_attention.block_mask(keys, 8, 256, cpu, compile_backend="eager")
    stats = torch._dynamo.utils.counters["stats"]
    assert stats["unique_graphs"] == 1 and stats["calls_captured"] > 0
