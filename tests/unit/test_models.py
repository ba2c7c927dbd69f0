"""BertEncoder and its heads: shapes, masking, dropout, gradients, tying, init, sizes vs HF."""

import pytest
import torch
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.models.bert import BertEncoder
from pretrain.models.build import build_encoder, count_parameters
from pretrain.models.configs import BertEncoderConfig
from pretrain.models.heads import MaskedLMHead, NextSentenceHead

VOCAB = 97
PAD = 3
SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
    type_vocab_size=2,
)
# Google's released BERT sizes: layers, hidden; heads = hidden / 64, feed-forward = 4 * hidden.
GOOGLE_SIZES = {
    "bert_tiny": (2, 128),
    "bert_mini": (4, 256),
    "bert_small": (4, 512),
    "bert_medium": (8, 512),
    "bert_base": (12, 768),
    "bert_large": (24, 1024),
}


def make_model(**overrides) -> torch.nn.ModuleDict:
    torch.manual_seed(0)
    encoder = BertEncoder(VOCAB, pad_token_id=PAD, **{**SMALL, **overrides})
    hidden = encoder.hidden_size
    return torch.nn.ModuleDict(
        {
            "encoder": encoder,
            "mlm_head": MaskedLMHead(hidden, VOCAB, 1e-12, encoder.word_embeddings),
            "nsp_head": NextSentenceHead(hidden),
        }
    )


def random_ids(batch: int, seq: int, generator_seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(generator_seed)
    return torch.randint(5, VOCAB, (batch, seq), generator=generator)


def test_shapes():
    model = make_model().eval()
    ids = random_ids(3, 11)
    hidden = model["encoder"](ids, torch.ones_like(ids), torch.ones_like(ids))
    assert hidden.shape == (3, 11, 32)
    assert model["mlm_head"](hidden).shape == (3, 11, VOCAB)
    assert model["mlm_head"](hidden[:, :4].reshape(-1, 32)).shape == (12, VOCAB)
    assert model["nsp_head"](hidden).shape == (3, 2)


def test_padding_appended_leaves_real_positions_unchanged():
    model = make_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    ids = random_ids(2, 9)
    types = torch.tensor([[0] * 5 + [1] * 4] * 2)
    with torch.no_grad():
        alone = model["encoder"](ids, types)
        # Pad with real-looking ids, not the pad id: only the mask may hide them.
        padded_ids = torch.cat([ids, random_ids(2, 6, generator_seed=7)], dim=1)
        padded_types = torch.cat([types, torch.ones(2, 6, dtype=torch.long)], dim=1)
        mask = torch.cat([torch.ones(2, 9), torch.zeros(2, 6)], dim=1).long()
        padded = model["encoder"](padded_ids, padded_types, mask)
        unmasked = model["encoder"](padded_ids, padded_types)
    torch.testing.assert_close(padded[:, :9], alone, rtol=0, atol=1e-5)
    assert (unmasked[:, :9] - alone).abs().max() > 1e-3  # without the mask the padding leaks in


def test_rows_of_different_lengths_match_unbatched():
    model = make_model().eval()
    ids = random_ids(3, 8)
    lengths = [8, 5, 2]
    mask = torch.zeros(3, 8, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    with torch.no_grad():
        batched = model["encoder"](ids, attention_mask=mask)
        for row, length in enumerate(lengths):
            alone = model["encoder"](ids[row : row + 1, :length])
            torch.testing.assert_close(batched[row, :length], alone[0], rtol=0, atol=1e-5)


def test_all_padding_row_stays_finite():
    model = make_model().eval()
    ids = random_ids(2, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        hidden = model["encoder"](ids, attention_mask=mask)
    assert torch.isfinite(hidden).all()


def test_eval_is_deterministic_and_train_applies_dropout():
    model = make_model(hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    ids = random_ids(2, 10)
    model.eval()
    with torch.no_grad():
        first, second = model["encoder"](ids), model["encoder"](ids)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    model.train()
    with torch.no_grad():
        noisy = model["encoder"](ids)
    assert (noisy - first).abs().max() > 1e-2


def test_attention_dropout_only_in_training():
    model = make_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    ids = random_ids(2, 10)
    with torch.no_grad():
        train_a, train_b = model["encoder"](ids), model["encoder"](ids)
        model.eval()
        eval_a, eval_b = model["encoder"](ids), model["encoder"](ids)
    assert (train_a - train_b).abs().max() > 1e-3
    torch.testing.assert_close(eval_a, eval_b, rtol=0, atol=0)
    # Without any dropout, train mode equals eval mode: dropout is the only difference.
    quiet = make_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with torch.no_grad():
        train_out = quiet["encoder"](ids)
        eval_out = quiet.eval()["encoder"](ids)
    torch.testing.assert_close(train_out, eval_out, rtol=0, atol=1e-6)


def test_gradients_reach_every_parameter():
    model = make_model()
    ids = random_ids(4, 12)
    types = (torch.arange(12) >= 6).long().expand(4, 12)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 9:] = 0
    hidden = model["encoder"](ids, types, mask)
    masked = torch.zeros(4, 12, dtype=torch.bool)
    masked[:, [2, 7]] = True
    mlm_loss = torch.nn.functional.cross_entropy(model["mlm_head"](hidden[masked]), ids[masked])
    nsp_loss = torch.nn.functional.cross_entropy(
        model["nsp_head"](hidden), torch.tensor([0, 1, 0, 1])
    )
    (mlm_loss + nsp_loss).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


def test_decoder_is_tied_to_word_embeddings():
    model = make_model()
    encoder, head = model["encoder"], model["mlm_head"]
    assert head.decoder.weight is encoder.word_embeddings.weight
    separate = sum(count_parameters(child) for child in model.values())
    assert count_parameters(model) == separate - VOCAB * 32
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    hidden = encoder(random_ids(2, 5))
    head(hidden).sum().backward()
    optimizer.step()
    assert head.decoder.weight is encoder.word_embeddings.weight
    # The logits use the (updated) embedding table: changing it changes them.
    before = head(hidden.detach()).detach()
    with torch.no_grad():
        encoder.word_embeddings.weight[10] += 1.0
    after = head(hidden.detach()).detach()
    changed = (after - before).abs().amax(dim=(0, 1)) > 1e-6
    assert changed.nonzero().flatten().tolist() == [10]


def test_padding_row_gets_no_gradient_from_the_lookup():
    encoder = make_model()["encoder"]
    ids = random_ids(2, 6)
    ids[:, -2:] = PAD
    encoder(ids).sum().backward()
    grad = encoder.word_embeddings.weight.grad
    assert grad[PAD].abs().sum() == 0
    assert grad[ids[0, 0]].abs().sum() > 0


def test_init_statistics_match_bert():
    std = 0.05
    torch.manual_seed(0)
    encoder = BertEncoder(
        2000,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=1024,
        initializer_range=std,
        pad_token_id=PAD,
    )
    head = MaskedLMHead(256, 2000, 1e-12, encoder.word_embeddings, initializer_range=std)
    nsp = NextSentenceHead(256, initializer_range=std)
    for module in (encoder, head, nsp):
        for name, parameter in module.named_parameters():
            values = parameter.detach()
            if name.endswith("norm.weight"):
                assert (values == 1).all(), name
            elif name.endswith("bias"):
                assert (values == 0).all(), name
            elif values.numel() >= 20_000:  # weights: normal(0, std); the sample std is within ~1%
                values = (
                    values[torch.arange(values.shape[0]) != PAD]
                    if "word_embeddings" in name
                    else values
                )
                assert abs(values.std().item() - std) < 0.03 * std, name
                assert abs(values.mean().item()) < 5 * std / values.numel() ** 0.5, name
    assert (encoder.word_embeddings.weight[PAD] == 0).all()


def test_too_long_input_names_max_position_embeddings():
    encoder = make_model()["encoder"]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        encoder(random_ids(1, 41))


@pytest.mark.parametrize("name", sorted(GOOGLE_SIZES))
def test_model_configs_match_google_sizes_and_schema(name):
    cfg = compose_config([f"model={name}"]).model
    layers, hidden = GOOGLE_SIZES[name]
    assert cfg.name == name
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (layers, hidden)
    assert cfg.num_attention_heads == hidden // 64
    assert cfg.intermediate_size == 4 * hidden
    assert cfg.max_position_embeddings == 512
    BertEncoderConfig(
        **OmegaConf.to_container(cfg)
    )  # the lead's schema accepts every key and value
    with torch.device("meta"):
        encoder = build_encoder(cfg, vocab_size=1000, pad_token_id=0)
    assert isinstance(encoder, BertEncoder)
    assert len(encoder.layers) == layers and encoder.hidden_size == hidden


@pytest.mark.parametrize("name", sorted(GOOGLE_SIZES))
def test_parameter_count_equals_hf_bert_for_pretraining(name):
    transformers = pytest.importorskip("transformers")
    layers, hidden = GOOGLE_SIZES[name]
    cfg = compose_config([f"model={name}"]).model
    with torch.device("meta"):  # no memory, no init work: only shapes are counted
        encoder = build_encoder(cfg, vocab_size=30522, pad_token_id=0)
        ours = torch.nn.ModuleList(
            [
                encoder,
                MaskedLMHead(hidden, 30522, 1e-12, encoder.word_embeddings),
                NextSentenceHead(hidden),
            ]
        )
        hf_config = transformers.BertConfig(
            vocab_size=30522,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
        )
        hf = transformers.BertForPreTraining(hf_config)
    hf_count = sum(p.numel() for p in hf.parameters())  # parameters() counts tied ones once
    assert count_parameters(ours) == hf_count
    if name == "bert_base":
        assert 109e6 < hf_count < 111e6
    if name == "bert_large":
        assert 335e6 < hf_count < 340e6


def test_build_encoder_takes_runtime_values_from_arguments():
    cfg = {"name": "x", "_target_": "pretrain.models.bert.BertEncoder", **SMALL}
    encoder = build_encoder(cfg, vocab_size=55, pad_token_id=4)
    assert encoder.word_embeddings.num_embeddings == 55
    assert encoder.word_embeddings.padding_idx == 4
    with pytest.raises(KeyError, match="model.vocab_size"):
        build_encoder({**cfg, "vocab_size": 10}, vocab_size=55, pad_token_id=4)
    with pytest.raises(KeyError, match="_target_"):
        build_encoder(SMALL, vocab_size=55, pad_token_id=4)
    dataclass_cfg = BertEncoderConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64)
    assert build_encoder(dataclass_cfg, vocab_size=55, pad_token_id=0).hidden_size == 32
