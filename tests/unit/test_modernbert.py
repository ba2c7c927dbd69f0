"""The ModernBERT encoder: the same logits as transformers' ModernBertForMaskedLM after the
export (fp32, padded batches, local and global layers), packed rows equal to the documents
encoded alone, the unpadded path equal to SDPA on the padded grid, and the import that is the
export's inverse. (FlexAttention, compiled on first use, in tests/integration.)"""

import pytest
import torch

from pretrain.errors import ConfigError
from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.export.modernbert import from_hf, to_hf
from pretrain.models.heads import MaskedLMHead
from pretrain.models.modernbert import ModernBertEncoder

VOCAB, PAD = 97, 0
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "intermediate_size": 48,
    "local_attention": 8,  # a 4-token half window: local layers differ from global at 20 tokens
    "global_attn_every_n_layers": 3,
    "attention_backend": "sdpa",
}


def model_config(**overrides) -> dict:
    """A tiny `model` config group as a run config stores it."""
    return {
        "name": "modernbert_test",
        "_target_": "pretrain.models.modernbert.ModernBertEncoder",
        "max_position_embeddings": 64,
        "hidden_activation": "gelu",
        "norm": "layer_norm",
        "norm_eps": 1e-5,
        "embedding_norm": True,
        "global_rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "embedding_dropout": 0.0,
        "attention_dropout": 0.0,
        "mlp_dropout": 0.0,
        "initializer_range": 0.02,
        "initializer_cutoff_factor": 2.0,
        **TINY,
        **overrides,
    }


def build(seed: int = 0, **overrides) -> tuple[ModernBertEncoder, MaskedLMHead, dict]:
    """Our encoder and bias-free MLM head with random (non-trivial) weights, and its config."""
    torch.manual_seed(seed)
    cfg = model_config(**overrides)
    settings = {k: v for k, v in cfg.items() if k not in ("name", "_target_")}
    encoder = ModernBertEncoder(VOCAB, PAD, **settings).eval()
    head = MaskedLMHead(32, VOCAB, 1e-5, encoder.word_embeddings, bias=False).eval()
    with torch.no_grad():  # norms and the decoder bias away from their initial 1 and 0
        for parameter in [*encoder.parameters(), *head.parameters()]:
            if parameter.ndim == 1:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return encoder, head, cfg


def state_dict(encoder, head) -> dict:
    return {
        **{f"encoder.{k}": v for k, v in encoder.state_dict().items()},
        **{f"mlm_head.{k}": v for k, v in head.state_dict().items()},
    }


def hf_model(encoder, head, cfg):
    """transformers' ModernBertForMaskedLM holding our exported weights."""
    transformers = pytest.importorskip("transformers")
    exported = to_hf(
        state_dict(encoder, head),
        {"model": cfg, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": PAD}},
    )
    config = transformers.ModernBertConfig(**exported.config, attn_implementation="sdpa")
    model = transformers.ModernBertForMaskedLM(config).eval()
    missing, unexpected = model.load_state_dict(exported.weights, strict=False)
    assert not unexpected and not [k for k in missing if "inv_freq" not in k]
    return model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 20) ids and attention mask: one full row, one of 13 tokens then padding."""
    ids = torch.randint(1, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 13:] = 0
    return ids.masked_fill(mask == 0, PAD), mask


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_logits_match_transformers_on_padded_batches(activation):
    encoder, head, cfg = build(hidden_activation=activation)
    model = hf_model(encoder, head, cfg)
    ids, mask = padded_batch()
    with torch.no_grad():
        ours = head(encoder(ids, attention_mask=mask))
        theirs = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() < 1e-5
    assert ours[real].std() > 0.1  # the comparison is of real, varied logits


def test_local_layers_matter_and_all_global_differs():
    encoder, head, _ = build()
    everywhere, *_ = build(global_attn_every_n_layers=1)
    ids, mask = padded_batch()
    with torch.no_grad():
        local = encoder(ids, attention_mask=mask)
        glob = everywhere(ids, attention_mask=mask)
    assert (local - glob).abs().max() > 1e-3


def packed_inputs():
    """Three documents of 7, 5 and 6 tokens packed in one row of 20 (2 of padding)."""
    lengths = (7, 5, 6)
    docs = [
        torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths
    ]
    ids = torch.full((1, 20), PAD)
    ids[0, :18] = torch.cat(docs)
    document_ids = torch.tensor([[0] * 7 + [1] * 5 + [2] * 6 + [3, 3]])
    mask = torch.ones(1, 20, dtype=torch.long)
    mask[0, 18:] = 0
    return docs, ids, mask, document_ids


@pytest.mark.parametrize("backend", ["sdpa"])  # flex: tests/integration/test_modernbert_flex.py
def test_packed_rows_equal_documents_encoded_alone(backend):
    encoder, _, _ = build(attention_backend=backend)
    docs, ids, mask, document_ids = packed_inputs()
    with torch.no_grad():
        packed = encoder(ids, attention_mask=mask, document_ids=document_ids)[0]
        start = 0
        for doc in docs:
            alone = encoder(doc[None])[0]
            assert (packed[start : start + len(doc)] - alone).abs().max() < 1e-5
            start += len(doc)
        unmasked = encoder(ids, attention_mask=mask)[0]  # one document: attends across
    assert (unmasked[7:12] - packed[7:12]).abs().max() > 1e-3


@pytest.mark.parametrize("backend,unpad", [("sdpa", "true")])  # flex: test_modernbert_flex.py
def test_flex_and_unpadded_paths_equal_the_padded_sdpa_grid(backend, unpad):
    encoder, *_ = build()
    other, *_ = build(attention_backend=backend)
    other.unpad = unpad
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = encoder(ids, attention_mask=mask)
        got = other(ids, attention_mask=mask)
    real = mask.bool()
    assert (expected[real] - got[real]).abs().max() < 1e-5


def test_import_inverts_the_export():
    encoder, head, cfg = build()
    exported = to_hf(
        state_dict(encoder, head),
        {"model": cfg, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": PAD}},
    )
    model_cfg, weights = from_hf(HFModel(exported.config, exported.weights))
    ours = state_dict(encoder, head)
    assert set(weights) == set(ours)
    assert all(torch.equal(weights[k], ours[k]) for k in ours)
    wanted = {k: v for k, v in cfg.items() if k not in ("name", "attention_backend")}
    assert {k: model_cfg[k] for k in wanted} == wanted


def test_neobert_settings_are_refused_by_the_export():
    encoder, head, cfg = build(norm="rms_norm", embedding_norm=False, hidden_activation="silu")
    with pytest.raises(ExportError, match="NeoBERT"):
        to_hf(
            state_dict(encoder, head),
            {"model": cfg, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": PAD}},
        )


def test_flex_training_off_cuda_is_refused_with_the_key():
    encoder, *_ = build(attention_backend="flex")
    ids, mask = padded_batch()
    with pytest.raises(ConfigError, match="model.attention_backend"):
        encoder.train()(ids, attention_mask=mask)
