"""Downstream evaluation, part 3: feature-based mode (frozen encoder) and what the head
reads: the last, second-to-last, last four or all layers, a learned scalar mix; [CLS],
XLNet's last token or the mean over real tokens."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pretrain.errors import ConfigError
from pretrain.eval.builtin_tasks import builtin_task
from pretrain.eval.config import EvalConfig, TaskConfig
from pretrain.eval.encoder import load_encoder
from pretrain.eval.heads import LayerSelection, pool, summary_positions
from pretrain.eval.run import fit_and_score

pytest.importorskip("transformers")


def states(count: int = 4) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 5, 3, generator=generator) for _ in range(count))


def test_layer_choices_read_the_named_layers():
    hidden = states()
    assert torch.equal(LayerSelection("last", 4, 3)(hidden), hidden[3])
    assert torch.equal(LayerSelection("second_to_last", 4, 3)(hidden), hidden[2])
    concat = LayerSelection("concat_last4", 4, 3)
    assert concat.output_size == 12
    assert torch.equal(concat(hidden)[..., 3:6], hidden[1])
    every = LayerSelection("concat_all", 3, 3)  # embeddings and 2 layers
    assert every.output_size == 9
    assert torch.equal(every(hidden[:3]), torch.cat(hidden[:3], dim=-1))
    mix = LayerSelection("scalar_mix", 4, 3)
    torch.testing.assert_close(mix(hidden), torch.stack(hidden).mean(0))  # equal weights at 0
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.0, 0.0, 50.0, 0.0]))
        mix.gamma.fill_(2.0)
    torch.testing.assert_close(mix(hidden), 2 * hidden[2])
    with pytest.raises(ConfigError, match="eval.layers = 'concat_last4': needs 4"):
        LayerSelection("concat_last4", 3, 3)


def test_pooling_skips_padding_and_finds_the_summary_token():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float).reshape(2, 4, 1)  # (batch, seq, 1)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert pool(hidden, right, "mean").flatten().tolist() == [1.0, 4.5]
    assert pool(hidden, left, "mean").flatten().tolist() == [2.0, 6.5]
    assert pool(hidden, right, "cls").flatten().tolist() == [0.0, 4.0]
    assert summary_positions(right, last_token=True).tolist() == [2, 1]
    assert summary_positions(left, last_token=True).tolist() == [3, 3]
    assert pool(hidden, right, "cls", last_token=True).flatten().tolist() == [2.0, 5.0]
    changed = hidden.clone()
    changed[0, 3] = 100.0  # a padding position
    assert torch.equal(pool(changed, right, "mean"), pool(hidden, right, "mean"))


def small_settings(**values) -> EvalConfig:
    base = {"max_seq_length": 32, "doc_overlap_tokens": 8, "epochs": 1, "batch_size": 16}
    return EvalConfig(task=TaskConfig(name="builtin_order"), **{**base, "lr": 1e-3, **values})


@pytest.fixture(scope="module")
def order_task():
    return builtin_task("builtin_order", train_size=48, dev_size=16)


def encoder_weights(loaded) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in loaded.model.state_dict().items()}


@pytest.mark.parametrize(
    ("layers", "pooling"),
    [
        ("scalar_mix", "mean"),
        ("concat_last4", "cls"),
        ("concat_all", "mean"),
        ("second_to_last", "mean"),
    ],
)
def test_features_mode_trains_the_head_and_leaves_the_encoder(
    tiny_encoder_checkpoint, order_task, layers, pooling
):
    loaded = load_encoder(tiny_encoder_checkpoint)
    before = encoder_weights(loaded)
    result = fit_and_score(
        loaded, order_task, small_settings(mode="features", layers=layers, pooling=pooling)
    )
    after = encoder_weights(loaded)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert len(result["predictions"]) == 16
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0


def test_finetune_mode_trains_the_encoder(tiny_encoder_checkpoint, order_task):
    loaded = load_encoder(tiny_encoder_checkpoint)
    before = encoder_weights(loaded)
    fit_and_score(loaded, order_task, small_settings(mode="finetune", layers="last"))
    after = encoder_weights(loaded)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("encoder.layer.0" in k for k in changed) and any("embeddings" in k for k in changed)


@pytest.mark.parametrize("standardize", [False, True])
def test_finetune_after_a_probe_starts_from_the_probes_head(
    tiny_encoder_checkpoint, order_task, monkeypatch, standardize
):
    """LP-FT (`probe_epochs`): the head is fitted on the frozen encoder first; fine-tuning
    at a learning rate too small to move a weight then gives the probe's dev logits (a random
    head does not; with `standardize`, the probe's standardization comes along), and at the
    usual rate it trains the encoder."""
    import pretrain.eval.run as run

    logits = []
    score = run._score
    monkeypatch.setattr(run, "_score", lambda *a: logits.append(a[2]) or score(*a))

    def fit(settings, loaded=None):
        fit_and_score(loaded or load_encoder(tiny_encoder_checkpoint), order_task, settings)
        return logits[-1]

    probe = small_settings(mode="features", layers="concat_all", pooling="mean", epochs=4)
    probe = replace(probe, lr=3e-2, dropout=0.0, standardize=standardize)
    lpft = replace(probe, mode="finetune", probe_epochs=4, probe_lr=3e-2, lr=1e-12)
    probed = fit(probe)
    torch.testing.assert_close(fit(lpft), probed, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(fit(replace(lpft, probe_epochs=0)), probed, atol=1e-3)
    loaded = load_encoder(tiny_encoder_checkpoint)
    before = encoder_weights(loaded)
    fit(replace(lpft, lr=1e-3), loaded)
    assert any(not torch.equal(before[k], v) for k, v in encoder_weights(loaded).items())


def family_dir(tmp_path, tiny_encoder_checkpoint, config) -> Path:
    """A Hugging Face directory of a random tiny model of another family, with the tiny
    checkpoint's tokenizer files."""
    from transformers import AutoModel

    from pretrain.export.output_dir import copy_tokenizer_files

    torch.manual_seed(0)
    directory = tmp_path / config.model_type
    AutoModel.from_config(config).save_pretrained(directory)
    tokenizer_dir = torch.load(tiny_encoder_checkpoint, weights_only=True)["config"]["data"]
    copy_tokenizer_files(tokenizer_dir["tokenizer_dir"], directory)
    return directory


def test_distilbert_and_xlnet_directories_load_and_xlnet_fits(
    tiny_encoder_checkpoint, order_task, tmp_path
):
    from transformers import DistilBertConfig, XLNetConfig

    vocab = load_encoder(tiny_encoder_checkpoint).tokenizer.vocab_size
    configs = [
        DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64),
        XLNetConfig(vocab_size=vocab, d_model=32, n_layer=2, n_head=2, d_inner=64),
    ]
    for config in configs:
        loaded = load_encoder(family_dir(tmp_path, tiny_encoder_checkpoint, config))
        assert loaded.model_type == config.model_type
        batch = dict(loaded.tokenizer(["the class", "a"], padding=True, return_tensors="pt"))
        states = loaded.model(batch)
        assert len(states) == 3 and states[-1].shape[:2] == batch["input_ids"].shape
        if config.model_type == "xlnet":  # pooled at its last token
            result = fit_and_score(loaded, order_task, small_settings(mode="features"))
            assert len(result["predictions"]) == 16


def test_features_mode_runs_the_encoder_once_per_example(
    tiny_encoder_checkpoint, order_task, monkeypatch
):
    """48 training and 16 dev examples, 3 epochs: the encoder reads 64 rows, not 3 * 48 + 16;
    over CACHED_STATES_BYTES it runs per batch."""
    import pretrain.eval.run as run

    loaded = load_encoder(tiny_encoder_checkpoint)
    rows = []
    loaded.model.register_forward_hook(lambda _, args, out: rows.append(len(args[0]["input_ids"])))
    fit_and_score(loaded, order_task, small_settings(mode="features", epochs=3))
    assert sum(rows) == 48 + 16
    rows.clear()
    monkeypatch.setattr(run, "CACHED_STATES_BYTES", 0)
    fit_and_score(loaded, order_task, small_settings(mode="features", epochs=3))
    assert sum(rows) == 3 * 48 + 16


@pytest.mark.parametrize(
    "kind, layers, pooling, standardize",
    [
        ("pair", "scalar_mix", "mean", False),
        ("pair", "concat_all", "cls", False),
        ("qa", "scalar_mix", "mean", False),
        ("pair", "concat_all", "mean", True),
        ("qa", "concat_all", "mean", True),
    ],
)
def test_cached_hidden_states_give_the_uncached_results(
    tiny_encoder_checkpoint, kind, layers, pooling, standardize
):
    """Features mode runs the frozen encoder once per example, not once per epoch (a pair
    task's states pooled before they are cached); the head sees the same vectors, so
    predictions and metrics equal the per-batch path's."""
    name = {"pair": "builtin_continuation", "qa": "builtin_replaced_qa"}[kind]
    task = builtin_task(name, train_size=32, dev_size=16)
    settings = small_settings(
        mode="features", layers=layers, pooling=pooling, epochs=2, standardize=standardize
    )
    results = [
        fit_and_score(load_encoder(tiny_encoder_checkpoint), task, settings, cache_states=cache)
        for cache in (True, False)
    ]
    assert results[0]["predictions"] == results[1]["predictions"]
    assert results[0]["metrics"] == pytest.approx(results[1]["metrics"])


@pytest.mark.parametrize("pooling", [None, "mean"])
def test_feature_statistics_are_the_mean_and_deviation_of_what_the_head_reads(
    tiny_encoder_checkpoint, pooling
):
    """Over real tokens only (padding left out) or over pooled vectors; from cached states
    or from the encoder, the same."""
    from pretrain.eval.encoder import feature_statistics, with_hidden_states
    from pretrain.eval.features import text_features

    loaded = load_encoder(tiny_encoder_checkpoint)
    task = builtin_task("builtin_continuation", train_size=24, dev_size=8)
    rows = text_features(loaded.tokenizer, task.train, 32)
    cached = with_hidden_states(loaded.model, rows, 5, pooling)
    states, mask = cached.tensors["hidden_states"], cached.tensors["attention_mask"].bool()
    assert not mask.all() or pooling  # padding present to be left out
    picked = states.permute(0, 2, 1, 3)[mask]  # (real tokens or rows, states, hidden)
    mean, std = picked.mean(0), picked.std(0, unbiased=False)
    for source in (cached, rows):
        got = feature_statistics(loaded.model, source, 7, pooling)
        torch.testing.assert_close(got[0], mean, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got[1], std, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "name, layers, standardize, dropout",
    [
        ("builtin_order", "concat_all", True, 0.0),
        ("builtin_continuation", "scalar_mix", False, 0.1),
        ("builtin_replaced_qa", "concat_all", True, 0.1),
    ],
)
def test_the_plain_features_loop_gives_lightnings_logits(
    tiny_encoder_checkpoint, monkeypatch, name, layers, standardize, dropout
):
    """A features-mode fit on the CPU runs a plain torch loop (`run._fit_features`); with a
    callback it runs Lightning's. Same batches, steps and draws (dropout included): the same
    logits, bit for bit, whether the states are cached or not."""
    import lightning as L

    from pretrain.eval import run

    plain_fits = []
    fit_features = run._fit_features
    monkeypatch.setattr(run, "_fit_features", lambda *a: plain_fits.append(1) or fit_features(*a))
    task = builtin_task(name, train_size=40, dev_size=16)
    settings = small_settings(
        mode="features", layers=layers, epochs=3, standardize=standardize, dropout=dropout
    )
    for cache in (True, False):
        fits = []
        for callbacks in (None, [L.Callback()]):
            loaded = load_encoder(tiny_encoder_checkpoint)
            L.seed_everything(0, verbose=False)
            train, dev = (
                run._features(loaded, task, part, settings) for part in (task.train, task.dev)
            )
            module, logits = run._fit(
                loaded, task, settings, train, dev, "cpu", cache, None, callbacks
            )
            fits.append((logits, module.head.weight.detach().clone()))
        assert torch.equal(fits[0][0], fits[1][0]) and torch.equal(fits[0][1], fits[1][1])
    assert len(plain_fits) == 2  # the fits without a callback, cached and not
