"""ELECTRA: the encoder with factorised embeddings, the replaced-token-detection objective
(sampling statistics, labels, gradients), the paper configurations and parameter counts,
export to Hugging Face (parity with `transformers`, round trip, init_from) and training."""

import csv
import json
from pathlib import Path

import pytest
import torch
from test_export import PAD_ID, WORDS, random_batch, tokenizer_dir  # noqa: F401 (fixture)
from test_train import tiny_overrides

from pretrain.cli.params import parameter_counts
from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary
from pretrain.export import electra as electra_export
from pretrain.export import export_checkpoint, import_hf_model
from pretrain.export.hf import OBJECTIVE_KEY, read_hf_model
from pretrain.models.electra import generator_config
from pretrain.objectives.electra import ElectraModule, sample_replacements
from pretrain.objectives.predictions import gather_targets
from pretrain.runtime.run import initialise_from, train

transformers = pytest.importorskip("transformers")

VOCAB = Vocabulary(
    size=len(WORDS),
    pad=PAD_ID,
    unk=WORDS.index("[UNK]"),
    cls=WORDS.index("[CLS]"),
    sep=WORDS.index("[SEP]"),
    mask=WORDS.index("[MASK]"),
)
# Non-default values everywhere, so a field the export forgets shows up as a mismatch.
MODEL_CFG = {
    "name": "electra_test",
    "_target_": "pretrain.models.electra.ElectraEncoder",
    "embedding_size": 16,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 24,
    "type_vocab_size": 3,
    "hidden_dropout_prob": 0.25,
    "attention_probs_dropout_prob": 0.35,
    "layer_norm_eps": 1e-6,
    "initializer_range": 0.07,
}
OBJECTIVE_CFG = {
    "name": "electra",
    "_target_": "pretrain.objectives.electra.ElectraModule",
    "pair_task": "none",
    "generator_size_fraction": 0.5,
    "discriminator_weight": 50.0,
    "temperature": 1.0,
}


def run_config(tokenizer: Path | None = None, **model: object) -> dict:
    return {
        "seed": 0,
        "model": {**MODEL_CFG, **model},
        "objective": dict(OBJECTIVE_CFG),
        "model_runtime": {"vocab_size": len(WORDS), "pad_token_id": PAD_ID},
        "data": {"tokenizer_dir": str(tokenizer), "max_seq_length": 20},
    }


def perturbed_module(config: dict, seed: int = 0) -> ElectraModule:
    """An ElectraModule with every weight moved off its initialisation (LayerNorms, biases)."""
    torch.manual_seed(seed)
    module = ElectraModule(config, VOCAB)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return module.eval()


def masked_batch(module: ElectraModule, seed: int = 3, rows: int = 4) -> dict:
    """A padded batch corrupted by the objective's own transform (15% masked)."""
    input_ids, token_type_ids, attention_mask = random_batch(seed)
    input_ids, token_type_ids, attention_mask = (
        t.repeat(rows // 4, 1) for t in (input_ids, token_type_ids, attention_mask)
    )
    input_ids = torch.where(  # no special tokens inside the text
        (input_ids < 5) & attention_mask.bool(), input_ids + 5, input_ids
    )
    batch = {
        "input_ids": input_ids.numpy(),
        "token_type_ids": token_type_ids.numpy(),
        "attention_mask": attention_mask.numpy(),
        "keys": [f"doc{i}" for i in range(len(input_ids))],
    }
    batch = ElectraModule.build_corruption(module.config, VOCAB)(batch, epoch=0)
    return {k: torch.as_tensor(v) for k, v in batch.items() if k != "keys"}


# --- configs and parameter counts -------------------------------------------------------

PAPER = {  # Clark et al. 2020, Table 6 (and Table 1 for the parameters)
    "electra_small": dict(batch=128, steps=1_000_000, lr=5e-4, seq=128, fraction=1 / 4, mask=0.15),
    "electra_base": dict(batch=256, steps=766_000, lr=2e-4, seq=512, fraction=1 / 3, mask=0.15),
    "electra_large": dict(batch=2048, steps=400_000, lr=2e-4, seq=512, fraction=1 / 4, mask=0.25),
}
PUBLISHED_PARAMETERS = {"electra_small": 14e6, "electra_base": 110e6, "electra_large": 335e6}
# The released generators (google/electra-*-generator) of base and large: hidden, heads, FFN.
RELEASED_GENERATORS = {"electra_base": (256, 4, 1024), "electra_large": (256, 4, 1024)}


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_experiment_configs_follow_the_paper(experiment):
    paper = PAPER[experiment]
    config = validate(compose_config([f"experiment={experiment}"]))
    assert config.model.name == experiment and config.objective.name == "electra"
    assert config.data.global_batch_size == paper["batch"]
    assert config.trainer.max_steps == paper["steps"]
    assert config.optim.optimizer["lr"] == paper["lr"]
    assert config.optim.warmup_steps == 10_000
    assert config.data.max_seq_length == paper["seq"]
    assert config.objective.generator_size_fraction == pytest.approx(paper["fraction"], abs=1e-6)
    assert config.objective.mlm_probability == paper["mask"]
    assert config.objective.discriminator_weight == 50.0
    if experiment == "electra_small":
        assert (config.model.embedding_size, config.model.hidden_size) == (128, 256)


@pytest.mark.parametrize("model", sorted(PUBLISHED_PARAMETERS))
def test_parameter_counts_match_transformers_and_the_paper(model):
    cfg = validate(compose_config([f"model={model}", "objective=electra"]))
    plain = dict(vars(cfg.model))
    counts = parameter_counts(plain, cfg.model.reference_vocab_size)
    sizes = {
        k: v for k, v in plain.items() if k not in ("name", "_target_", "reference_vocab_size")
    }
    with torch.device("meta"):
        reference = transformers.ElectraModel(
            transformers.ElectraConfig(vocab_size=cfg.model.reference_vocab_size, **sizes)
        )
    assert counts["total"] == sum(p.numel() for p in reference.parameters())
    assert counts["embeddings"] == sum(p.numel() for p in reference.embeddings.parameters())
    # The paper rounds (small: 13.5M printed as 14M).
    assert abs(counts["total"] - PUBLISHED_PARAMETERS[model]) / PUBLISHED_PARAMETERS[model] < 0.04
    if model in RELEASED_GENERATORS:
        fraction = PAPER[model]["fraction"]
        generator = generator_config(plain, fraction, 1.0)
        sizes = tuple(
            generator[k] for k in ("hidden_size", "num_attention_heads", "intermediate_size")
        )
        assert sizes == RELEASED_GENERATORS[model]
        assert generator["num_hidden_layers"] == plain["num_hidden_layers"]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("objective.generator_size_fraction=0", "objective.generator_size_fraction"),
        ("objective.generator_size_fraction=1.5", "objective.generator_size_fraction"),
        ("objective.discriminator_weight=0", "objective.discriminator_weight"),
        ("objective.temperature=-1", "objective.temperature"),
        ("objective.pair_task=nsp", "objective.pair_task"),
        ("model.embedding_size=0", "model.embedding_size"),
    ],
)
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["model=electra_tiny", "objective=electra", override]))
    assert str(error.value).startswith(key)


def test_non_electra_model_and_impossible_generator_are_refused():
    config = run_config()
    config["model"] = {**MODEL_CFG, "_target_": "pretrain.models.bert.BertEncoder"}
    config["model"].pop("embedding_size")
    with pytest.raises(ConfigError, match="model._target_"):
        ElectraModule(config, VOCAB)
    config = run_config()
    config["objective"]["generator_size_fraction"] = 25 / 32  # 25 features, 3 heads of 8
    with pytest.raises(ConfigError, match="objective.generator_size_fraction"):
        ElectraModule(config, VOCAB)
    config = run_config()
    config["objective"]["generator_layer_fraction"] = 0.1  # 0.2 of a layer
    with pytest.raises(ConfigError, match="objective.generator_size_fraction"):
        ElectraModule(config, VOCAB)


# --- the objective: sampling, labels, gradients ------------------------------------------


def test_samples_follow_the_generator_distribution():
    torch.manual_seed(0)
    logits = torch.randn(4, 6) * 2
    draws = 20_000
    rng = torch.Generator().manual_seed(1)
    samples = sample_replacements(logits.repeat(draws, 1), generator=rng).view(draws, 4)
    frequencies = torch.stack([torch.bincount(samples[:, i], minlength=6) for i in range(4)])
    expected = torch.softmax(logits, -1)
    bound = 4 * (expected * (1 - expected) / draws).sqrt() + 1e-3  # 4 sigma
    assert ((frequencies / draws - expected).abs() < bound).all()
    hot = sample_replacements(logits * 0 + torch.arange(6.0), temperature=0.05, generator=rng)
    assert (hot == 5).all()  # low temperature: the most likely token


def test_replaced_fraction_equals_generator_error_rate_and_labels_are_exact():
    module = perturbed_module(run_config())
    batch = masked_batch(module, rows=32)  # about 70 masked tokens
    selected = batch["labels"] != IGNORE_INDEX
    batch["labels"][selected] = torch.where(torch.arange(int(selected.sum())) % 3 == 0, 6, 5)
    with torch.no_grad():  # the generator puts about half its mass on "the" (5), half on "cat" (6)
        module.generator_head.bias[5:7] += 12.0
        full_logits, positions = module.generate(batch)  # (rows * width, vocab), (rows, width)
    real = positions.flatten() >= 0  # the slots that hold a masked position
    logits, targets = full_logits[real], gather_targets(batch["labels"], positions)[real]
    error_rate = 1 - torch.softmax(logits, -1).gather(1, targets[:, None]).mean()
    assert 0.3 < error_rate < 0.7
    original = torch.where(selected, batch["labels"], batch["input_ids"])
    replaced_total, draws = 0.0, 200
    for _ in range(draws):
        replaced_ids, labels = module.replace(batch, full_logits, positions)
        assert torch.equal(labels, replaced_ids != original)
        assert not labels[~selected].any()
        assert torch.equal(replaced_ids[~selected], batch["input_ids"][~selected])
        replaced_total += float(labels[selected].float().mean())
    n = draws * int(selected.sum())
    sigma = (error_rate * (1 - error_rate) / n).sqrt()
    assert abs(replaced_total / draws - error_rate) < 4 * sigma


def test_losses_and_metrics_of_a_batch():
    module = perturbed_module(run_config())
    batch = masked_batch(module, rows=8)
    out = module(batch)
    expected = out["mlm_loss"] + 50.0 * out["discriminator_loss"]
    torch.testing.assert_close(out["loss"], expected)
    for key in (
        "generator_accuracy",
        "replaced_fraction",
        "discriminator_accuracy_replaced",
        "discriminator_accuracy_original",
    ):
        assert 0 <= float(out[key]) <= 1, key
    assert float(out["replaced_fraction"]) > 0.5  # an untrained generator is mostly wrong
    # padding does not count: changing what stands at padded positions changes nothing
    padded = batch["attention_mask"] == 0
    other = {**batch, "input_ids": batch["input_ids"].masked_fill(padded, 7)}
    torch.manual_seed(5)
    first = module(batch)
    torch.manual_seed(5)
    second = module(other)
    torch.testing.assert_close(first["discriminator_loss"], second["discriminator_loss"])


def test_no_gradient_reaches_the_generator_from_the_discriminator_loss():
    module = perturbed_module(run_config()).train()
    assert module.generator.embeddings is module.encoder.embeddings  # one shared module
    batch = masked_batch(module, rows=8)
    module(batch)["discriminator_loss"].backward()
    generator_only = [
        (name, p)
        for name, p in module.named_parameters()
        if name.startswith(("generator.layers", "generator.embeddings_project", "generator_head"))
    ]
    assert generator_only
    for name, parameter in generator_only:
        assert parameter.grad is None or not parameter.grad.any(), name
    assert module.encoder.word_embeddings.weight.grad.any()  # shared: the discriminator trains it
    assert module.encoder.layers[0].attention.qkv.weight.grad.any()
    module.zero_grad(set_to_none=True)
    module(batch)["mlm_loss"].backward()
    for name, parameter in module.named_parameters():
        if name.startswith(("encoder.layers", "discriminator_head")):
            assert parameter.grad is None or not parameter.grad.any(), name
    assert module.generator.layers[0].attention.qkv.weight.grad.any()


# --- export, parity, round trip, init_from ----------------------------------------------


@pytest.fixture(scope="module", params=[16, 32], ids=["factorised", "unfactorised"])
def exported(request, tmp_path_factory, tokenizer_dir):  # noqa: F811
    root = tmp_path_factory.mktemp("electra_export")
    config = run_config(tokenizer_dir, embedding_size=request.param)
    module = perturbed_module(config)
    torch.save({"state_dict": module.state_dict(), "config": config}, root / "last.ckpt")
    return module, export_checkpoint(root / "last.ckpt", root / "hf"), root


def test_discriminator_matches_electra_for_pretraining(exported):
    module, out, _ = exported
    hf, info = transformers.ElectraForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    input_ids, token_type_ids, attention_mask = random_batch(seed=4)
    with torch.no_grad():
        ours = module.discriminator_head(module.encoder(input_ids, token_type_ids, attention_mask))
        theirs = hf.eval()(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).logits
    real = attention_mask.bool()
    torch.testing.assert_close(theirs[real], ours[real], rtol=0, atol=1e-5)
    assert ours.abs().max() > 0.01


def test_generator_matches_electra_for_masked_lm(exported):
    module, out, _ = exported
    hf, info = transformers.ElectraForMaskedLM.from_pretrained(
        out / "generator", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    input_ids, token_type_ids, attention_mask = random_batch(seed=6)
    with torch.no_grad():
        ours = module.generator_head(module.generator(input_ids, token_type_ids, attention_mask))
        theirs = hf.eval()(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).logits
    real = attention_mask.bool()
    torch.testing.assert_close(theirs[real], ours[real], rtol=0, atol=1e-5)
    # the two exported models share their embeddings, as in training
    discriminator = transformers.ElectraForPreTraining.from_pretrained(out)
    torch.testing.assert_close(
        hf.electra.embeddings.word_embeddings.weight,
        discriminator.electra.embeddings.word_embeddings.weight,
    )


def test_configs_and_tokenizers(exported, tokenizer_dir):  # noqa: F811
    module, out, _ = exported
    generator = module.generator_model_config
    for directory, architecture, sizes in (
        (out, "ElectraForPreTraining", module.config["model"]),
        (out / "generator", "ElectraForMaskedLM", generator),
    ):
        config = json.loads((directory / "config.json").read_text())
        assert config["architectures"] == [architecture] and config["model_type"] == "electra"
        for key in electra_export.SIZE_KEYS:
            assert config[key] == sizes[key], key
        assert (config["vocab_size"], config["pad_token_id"]) == (len(WORDS), PAD_ID)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        original = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        text = "the cats sat on a big mat"
        assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
        assert tokenizer.mask_token_id == VOCAB.mask
    assert generator["hidden_size"] == 16 and generator["num_attention_heads"] == 2
    assert generator["embedding_size"] == module.config["model"]["embedding_size"]
    has_projection = any("embeddings_project" in k for k in read_hf_model(out).weights)
    assert has_projection == (module.config["model"]["embedding_size"] != 32)


def test_round_trip_is_lossless(exported):
    module, out, _ = exported
    for directory in (out, out / "generator"):
        original = read_hf_model(directory)
        model_cfg, state_dict = import_hf_model(directory)
        config = {**module.config, "model": model_cfg}
        again = electra_export.to_hf(state_dict, config)
        assert set(again.weights) == set(original.weights)
        for name, tensor in original.weights.items():
            assert torch.equal(again.weights[name], tensor), name
        # what the directory's writer adds: the weights' dtype, the objective trained
        written = {k: v for k, v in original.config.items() if k not in ("dtype", OBJECTIVE_KEY)}
        assert again.config == written


def test_init_from_an_export_restores_both_models(exported):
    module, out, _ = exported
    fresh = ElectraModule(module.config, VOCAB)
    initialise_from(fresh, str(out))
    ours, theirs = module.state_dict(), fresh.state_dict()
    assert set(ours) == set(theirs)
    for key, tensor in ours.items():
        assert torch.equal(theirs[key], tensor), key
    mismatched = {**module.config, "objective": {**OBJECTIVE_CFG, "generator_size_fraction": 0.25}}
    with pytest.raises(ConfigError, match="generator_size_fraction"):
        initialise_from(ElectraModule(mismatched, VOCAB), str(out))
    shallower = {**module.config, "model": {**module.config["model"], "num_hidden_layers": 1}}
    with pytest.raises(ConfigError, match="model.num_hidden_layers"):
        initialise_from(ElectraModule(shallower, VOCAB), str(out))


# --- end to end ---------------------------------------------------------------------------


def logged(run_dir: Path, column: str) -> list[float]:
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return [float(r[column]) for r in csv.DictReader(f) if r.get(column)]


@pytest.mark.slow
def test_demo_experiment_trains_exports_and_reloads(prepared_corpus, tmp_path):
    run_dir = tmp_path / "electra"
    overrides = tiny_overrides(
        prepared_corpus,
        run_dir,
        "experiment=electra_demo",
        "data.num_workers=0",
        "trainer.max_steps=40",
        "trainer.log_every_n_steps=1",
        "optim.optimizer.lr=2e-3",
    )
    overrides.remove("model=bert_tiny")
    train(compose_config(overrides))
    loss = logged(run_dir, "train/loss")
    assert len(loss) == 40
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 1.0, loss
    mlm = logged(run_dir, "train/mlm_loss")
    assert sum(mlm[-5:]) / 5 < sum(mlm[:5]) / 5 - 0.3, mlm
    for column in (
        "train/discriminator_loss",
        "train/generator_accuracy",
        "train/replaced_fraction",
        "train/discriminator_accuracy_replaced",
        "train/discriminator_accuracy_original",
    ):
        assert len(logged(run_dir, column)) == 40, column
    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    assert transformers.ElectraForPreTraining.from_pretrained(out) is not None
    assert transformers.ElectraForMaskedLM.from_pretrained(out / "generator") is not None
    assert transformers.AutoTokenizer.from_pretrained(out / "generator").mask_token == "[MASK]"
