"""The encoder-decoder model (models/seq2seq.py): causal decoding, padding, sinusoids, the
paper sizes, config checks; and the Transformer demo training end to end."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from test_objectives_train import logged
from test_train import tiny_overrides

from pretrain.cli.params import parameter_counts
from pretrain.config import ConfigError, compose_config, validate
from pretrain.models.seq2seq import EncoderDecoder, TiedLMHead, sinusoidal_table
from pretrain.runtime.run import train

TINY = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 40,
    "dropout": 0.0,
}
TRANSFORMER = {
    "position_embedding": "sinusoidal",
    "activation": "relu",
    "scale_embedding": True,
    "layernorm_embedding": False,
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def model(**settings) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(vocab_size=50, pad_token_id=0, **{**TINY, **settings}).eval()


@pytest.mark.parametrize("shape", [{}, TRANSFORMER], ids=["bart", "transformer"])
def test_decoder_is_causal_and_padding_is_invisible(shape):
    net = model(**shape)
    source = torch.randint(5, 50, (2, 9))
    target = torch.randint(5, 50, (2, 7))
    out = net(source, None, target)
    changed = target.clone()
    changed[:, 4:] = torch.randint(5, 50, (2, 3))
    # positions before 4 do not see the later decoder tokens
    torch.testing.assert_close(net(source, None, changed)[:, :4], out[:, :4])
    assert not torch.allclose(net(source, None, changed)[:, 4:], out[:, 4:])
    # padding after the source and target changes nothing at the real positions
    padded_source = torch.cat([source, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    source_mask = torch.cat([torch.ones(2, 9), torch.zeros(2, 3)], dim=1).long()
    padded_target = torch.cat([target, torch.zeros(2, 2, dtype=torch.long)], dim=1)
    target_mask = torch.cat([torch.ones(2, 7), torch.zeros(2, 2)], dim=1).long()
    padded = net(padded_source, source_mask, padded_target, target_mask)
    torch.testing.assert_close(padded[:, :7], out, atol=1e-5, rtol=1e-5)


def test_decoder_reads_the_encoder_output():
    net = model()
    target = torch.randint(5, 50, (1, 5))
    a = net(torch.randint(5, 50, (1, 6)), None, target)
    b = net(torch.randint(5, 50, (1, 6)), None, target)
    assert not torch.allclose(a, b)


def test_sinusoids_and_embedding_scale_match_the_paper():
    table = sinusoidal_table(50, 16)
    pos, i = 7, 3
    assert table[pos, i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 8 + i].item() == pytest.approx(
        math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6
    )
    net = model(**TRANSFORMER)
    ids = torch.tensor([[7, 8, 9]])
    expected = net.embeddings.word_embeddings(ids) * math.sqrt(32) + sinusoidal_table(40, 32)[:3]
    torch.testing.assert_close(net.embeddings(ids, "encoder"), expected)
    assert "embeddings.sinusoids" not in net.state_dict()  # fixed, not a weight


def test_output_projection_is_tied_to_the_shared_embeddings():
    net = model()
    head = TiedLMHead(net.word_embeddings)
    assert head.decoder.weight is net.word_embeddings.weight
    hidden = torch.randn(3, 32)
    torch.testing.assert_close(head(hidden), hidden @ net.word_embeddings.weight.T)


def test_too_long_inputs_name_the_setting():
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model()(torch.ones(1, 41, dtype=torch.long), None, torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize(
    ("name", "vocab", "millions", "tolerance"),
    [
        ("transformer_base", 37000, 65, 0.04),  # Vaswani et al. Table 3: 65M
        ("bart_base", 50265, 140, 0.01),  # BART-base: ~140M
        ("bart_large", 50265, 400, 0.03),  # BART-large: ~400M
    ],
)
def test_paper_parameter_counts(name, vocab, millions, tolerance):
    cfg = OmegaConf.to_container(compose_config([f"model={name}"]).model, resolve=True)
    assert cfg["reference_vocab_size"] == vocab
    total = parameter_counts(cfg, vocab)["total"]
    assert abs(total / 1e6 - millions) / millions < tolerance, total


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.position_embedding=rotary", "model.position_embedding"),
        ("model.activation=swish", "model.activation"),
        ("model.encoder_attention_heads=5", "model.d_model"),
        ("model.dropout=1.5", "model.dropout"),
        ("objective.text_infilling=1.2", "objective.text_infilling"),
        ("objective.label_smoothing=-0.1", "objective.label_smoothing"),
    ],
)
def test_bad_settings_name_their_key(override, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["model=bart_tiny", "objective=bart", override]))
    assert str(error.value).startswith(key)


def test_experiments_compose():
    for name, model_name, objective in [
        ("bart_base", "bart_base", "bart"),
        ("bart_demo", "bart_tiny", "bart"),
        ("mass_demo", "bart_tiny", "mass"),
        ("transformer_demo", "transformer_tiny", "transformer"),
    ]:
        config = validate(compose_config([f"experiment={name}"]))
        assert (config.model.name, config.objective.name) == (model_name, objective)
    transformer = validate(compose_config(["experiment=transformer_demo"]))
    assert transformer.objective.label_smoothing == 0.1
    assert transformer.model.position_embedding == "sinusoidal"


def train_tiny(shards_dir, run_dir, *overrides: str) -> None:
    """30 steps of an experiment at tiny sizes; loss logged every step."""
    train(
        compose_config(
            [
                *(o for o in tiny_overrides(shards_dir, run_dir) if not o.startswith("model=")),
                *overrides,
                "data=full_sentences",
                "trainer.max_steps=30",
                "trainer.log_every_n_steps=1",
                "data.num_workers=0",
            ]
        )
    )


def assert_loss_falls(run_dir, drop: float = 0.3) -> list[float]:
    loss = logged(run_dir, "train/loss")
    assert len(loss) == 30
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - drop, loss
    return loss


@pytest.mark.slow
def test_transformer_demo_trains_with_falling_loss(prepared_corpus, tmp_path):
    run_dir = tmp_path / "transformer"
    train_tiny(prepared_corpus, run_dir, "experiment=transformer_demo")
    assert_loss_falls(run_dir)
    assert logged(run_dir, "train/nll")  # unsmoothed cross-entropy is logged beside the loss
