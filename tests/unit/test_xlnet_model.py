"""XLNet: parity with `transformers.XLNetLMHeadModel` (content stream, query stream with
perm_mask/target_mapping, with and without memory, with padding, with bi_data), lossless
round trip, memory detached and masked, paper parameter counts."""

import json

import numpy as np
import pytest
import torch
import transformers

from pretrain.cli.params import parameter_counts
from pretrain.export.hf import import_hf_model, write_hf_model
from pretrain.export.xlnet import to_hf
from pretrain.models.build import build_encoder
from pretrain.models.xlnet import XLNetLMHead
from pretrain.objectives.xlnet import PermutationCorruption

VOCAB, PAD = 97, 0
MODEL = {
    "name": "xlnet_test",
    "_target_": "pretrain.models.xlnet.XLNetEncoder",
    "d_model": 32,
    "n_layer": 2,
    "n_head": 4,
    "d_inner": 64,
    "ff_activation": "gelu",
    "attn_type": "bi",
    "mem_len": 6,
    "reuse_len": 4,
    "bi_data": False,
    "clamp_len": -1,
    "dropout": 0.1,
    "layer_norm_eps": 1e-12,
    "initializer_range": 0.2,  # large weights make differences visible
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(our encoder, our LM head, HF XLNetLMHeadModel loaded from the export dir, the dir)."""
    torch.manual_seed(0)
    encoder = build_encoder(MODEL, VOCAB, PAD).eval()
    head = XLNetLMHead(VOCAB)
    torch.nn.init.normal_(head.bias)
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    state["lm_head.bias"] = head.bias.detach()
    config = {"model": MODEL, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": PAD}}
    directory = tmp_path_factory.mktemp("xlnet_hf")
    write_hf_model(to_hf(state, config), directory, None)
    hf = transformers.XLNetLMHeadModel.from_pretrained(directory).eval()
    return encoder, head, hf, directory, state


def _batch(batch=3, seq=10, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, seq), generator=gen)
    types = torch.zeros(batch, seq, dtype=torch.long)
    types[:, seq // 2 :] = 1
    types[:, -1] = 2
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, -3:] = 0  # padding in the batch
    ids[1, -3:] = PAD
    return ids, types, mask


def _perm(batch, seq, num_predict, seed=2):
    """A random factorization order per row: perm_mask (batch, seq, seq) and target_mapping of
    the last num_predict positions in that order."""
    gen = torch.Generator().manual_seed(seed)
    perm_mask = torch.zeros(batch, seq, seq)
    mapping = torch.zeros(batch, num_predict, seq)
    for b in range(batch):
        order = torch.randperm(seq - 3 if b == 1 else seq, generator=gen)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))
        perm_mask[b, : len(order), : len(order)] = (rank[None, :] >= rank[:, None]).float()
        for m, position in enumerate(order[-num_predict:]):
            mapping[b, m, position] = 1.0
    return perm_mask, mapping


def _logits(encoder, head, **inputs):
    out = encoder(**inputs)
    hidden = out.query if out.query is not None else out.content
    return head(hidden, encoder.word_embeddings.weight), out


def test_content_stream_matches_transformers(exported):
    encoder, head, hf, _, _ = exported
    ids, types, mask = _batch()
    with torch.no_grad():
        ours, _ = _logits(encoder, head, input_ids=ids, token_type_ids=types, attention_mask=mask)
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)


def _query_stream_parity(encoder, head, hf, ids, types, mask, perm_mask, mapping):
    """Our query-stream logits for the permutation `perm_mask` and targets `mapping` equal
    transformers' XLNetLMHeadModel's; returns ours."""
    with torch.no_grad():
        ours, _ = _logits(
            encoder, head, input_ids=ids, token_type_ids=types, attention_mask=mask,
            perm_mask=perm_mask, target_mapping=mapping,
        )  # fmt: skip
        theirs = hf(
            input_ids=ids, token_type_ids=types, attention_mask=mask,
            perm_mask=perm_mask, target_mapping=mapping,
        ).logits  # fmt: skip
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    return ours


def test_query_stream_matches_transformers(exported):
    encoder, head, hf, _, _ = exported
    ids, types, mask = _batch()
    perm_mask, mapping = _perm(3, 10, 3)
    ours = _query_stream_parity(encoder, head, hf, ids, types, mask, perm_mask, mapping)
    assert ours.shape == (3, 3, VOCAB)


def test_memory_matches_transformers_and_is_detached(exported):
    encoder, head, hf, _, _ = exported
    first, types, _ = _batch(seed=3)
    second, _, _ = _batch(seed=4)
    perm_mask, mapping = _perm(3, 10, 2, seed=5)
    with torch.no_grad():
        ref = hf(input_ids=first, token_type_ids=types, use_mems=True)
    out = encoder(first, types, use_mems=True)
    assert len(out.mems) == MODEL["n_layer"]
    for ours, theirs in zip(out.mems, ref.mems, strict=True):
        assert ours.shape == (3, MODEL["reuse_len"], MODEL["d_model"])
        assert not ours.requires_grad and ours.grad_fn is None
        torch.testing.assert_close(ours, theirs.transpose(0, 1), atol=1e-5, rtol=1e-5)
    assert out.mems_mask.all() and out.mems_mask.shape == (3, MODEL["reuse_len"])
    with torch.no_grad():
        inputs = dict(token_type_ids=types, perm_mask=perm_mask, target_mapping=mapping)
        ours, out2 = _logits(
            encoder, head, input_ids=second, mems=out.mems, use_mems=True, **inputs
        )
        hf_mems = [m.transpose(0, 1) for m in out.mems]
        theirs = hf(input_ids=second, mems=hf_mems, use_mems=True, **inputs)
    torch.testing.assert_close(ours, theirs.logits, atol=1e-5, rtol=1e-5)
    # memory grows to mem_len: the last 6 of (4 old + 4 reused) tokens
    for ours_mem, theirs_mem in zip(out2.mems, theirs.mems, strict=True):
        assert ours_mem.shape[1] == MODEL["mem_len"]
        torch.testing.assert_close(ours_mem, theirs_mem.transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_masked_memory_is_ignored(exported):
    """A memory slot with mems_mask False changes nothing: row 0 with its memory fully masked
    equals row 0 encoded without memory."""
    encoder, head, _, _, _ = exported
    ids, types, _ = _batch(seed=6)
    out = encoder(ids, types, use_mems=True)
    mems_mask = torch.ones(3, MODEL["reuse_len"], dtype=torch.bool)
    mems_mask[0] = False
    with torch.no_grad():
        with_mem = encoder(ids, types, mems=out.mems, mems_mask=mems_mask).content
        alone = encoder(ids, types).content
    torch.testing.assert_close(with_mem[0], alone[0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(with_mem[1], alone[1], atol=1e-3)


def test_round_trip_is_lossless(exported, tmp_path):
    _, _, _, directory, state = exported
    model_cfg, weights = import_hf_model(directory)
    assert {k: v for k, v in model_cfg.items() if k != "name"} == {
        k: v for k, v in MODEL.items() if k != "name"
    }
    assert set(weights) == set(state)
    for key, tensor in state.items():
        assert torch.equal(weights[key], tensor), key
    config = {"model": model_cfg, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": PAD}}
    write_hf_model(to_hf(weights, config), tmp_path, None)
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(
        (directory / "config.json").read_text()
    )


@pytest.mark.parametrize(
    ("name", "millions"),
    [("xlnet_base", 116.7), ("xlnet_large", 360.3)],
)
def test_paper_sizes(name, millions):
    """XLNet-Base/Large with its 32000-token SentencePiece vocabulary: HF's released models
    have 116.7M / 360.3M parameters (the paper's "same size as BERT" ~110M / ~340M, plus the
    relative-attention weights)."""
    from pretrain.config import compose_config

    cfg = compose_config([f"model={name}"])
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.model, resolve=True)
    counts = parameter_counts(model, model["reference_vocab_size"])
    assert counts["total"] / 1e6 == pytest.approx(millions, abs=0.1)
    assert counts["embeddings"] == 32000 * model["d_model"] + model["d_model"]


def test_query_stream_matches_transformers_with_the_two_part_memory_order(exported):
    """The corruption's memory-format perm_mask (reuse part permuted on its own and blocked
    from the rest) gives the same predictions here and in transformers."""
    encoder, head, hf, _, _ = exported
    ids, types, mask = _batch()
    batch = {
        "input_ids": ids.numpy().copy(),
        "attention_mask": mask.numpy().copy(),
        "keys": ["a", "b", "c"],
        "new_document": np.zeros(3, bool),
    }
    corruption = PermutationCorruption(
        seed=0, special_ids=(PAD,), partial_prediction_k=3, reuse_len=MODEL["reuse_len"]
    )
    out = corruption(batch, epoch=0)
    perm_mask = torch.from_numpy(out["perm_mask"]).float()
    assert perm_mask[:, : MODEL["reuse_len"], MODEL["reuse_len"] :].all()
    mapping = torch.from_numpy(out["target_mapping"]).float()  # transformers wants floats
    _query_stream_parity(encoder, head, hf, ids, types, mask, perm_mask, mapping)


def test_bi_data_matches_transformers_with_memory(exported, tmp_path):
    """model.bi_data: the second half of the batch gets backward relative positions, as
    transformers' XLNet with bi_data=True (exported so): the same content and query streams
    and memory over two segments; the first half is what the model without bi_data gives."""
    plain, head, _, _, state = exported
    model = MODEL | {"bi_data": True}
    encoder = build_encoder(model, VOCAB, PAD).eval()
    encoder.load_state_dict(plain.state_dict())
    config = {"model": model, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": PAD}}
    write_hf_model(to_hf(state, config), tmp_path, None)
    assert json.loads((tmp_path / "config.json").read_text())["bi_data"] is True
    assert import_hf_model(tmp_path)[0]["bi_data"] is True
    hf = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    ids, types, mask = _batch(batch=4)
    perm_mask, mapping = _perm(4, 10, 3)
    ours = _query_stream_parity(encoder, head, hf, ids, types, mask, perm_mask, mapping)
    with torch.no_grad():
        alone, _ = _logits(
            plain, head, input_ids=ids, token_type_ids=types, attention_mask=mask,
            perm_mask=perm_mask, target_mapping=mapping,
        )  # fmt: skip
    torch.testing.assert_close(ours[:2], alone[:2], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours[2:], alone[2:], atol=1e-3)  # backward positions
    second, _, _ = _batch(batch=4, seed=7)
    with torch.no_grad():
        out = encoder(ids, types, mask, use_mems=True)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, use_mems=True)
        torch.testing.assert_close(
            head(out.content, encoder.word_embeddings.weight), ref.logits, atol=1e-5, rtol=1e-5
        )
        inputs = dict(token_type_ids=types, perm_mask=perm_mask, target_mapping=mapping)
        ours, _ = _logits(encoder, head, input_ids=second, mems=out.mems, **inputs)
        theirs = hf(input_ids=second, mems=ref.mems, **inputs).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
