"""Import from Hugging Face: export -> import -> export is lossless for every family, and a run
initialised from an exported directory (`init_from=<dir>`) starts from its weights."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import step_losses, tiny_overrides

from pretrain.config import ConfigError, compose_config
from pretrain.data.vocab import load_vocabulary
from pretrain.export import ExportError, export_checkpoint, import_hf_model
from pretrain.models.build import build_encoder
from pretrain.models.heads import MaskedLMHead
from pretrain.runtime.run import train

transformers = pytest.importorskip("transformers")

# Non-default sizes everywhere, so a key the export or import forgets shows up.
COMMON = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 80,
    "max_position_embeddings": 40,
    "hidden_dropout_prob": 0.15,
    "attention_probs_dropout_prob": 0.05,
    "initializer_range": 0.03,
}
FAMILIES = {
    "bert": {
        "_target_": "pretrain.models.bert.BertEncoder",
        **COMMON,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-7,
    },
    "roberta": {
        "_target_": "pretrain.models.roberta.RobertaEncoder",
        **COMMON,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
    },
    "distilbert": {
        "_target_": "pretrain.models.distilbert.DistilBertEncoder",
        **COMMON,
        "layer_norm_eps": 1e-12,
    },
}
MASKED_LM = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "distilbert": "DistilBertForMaskedLM",
}


class EncoderWithHead(torch.nn.Module):
    """The encoder and MLM head under the prefixes the objective modules use."""

    def __init__(self, model_cfg: dict, vocab_size: int, pad_token_id: int) -> None:
        super().__init__()
        self.encoder = build_encoder(model_cfg, vocab_size, pad_token_id)
        self.mlm_head = MaskedLMHead(
            model_cfg["hidden_size"],
            vocab_size,
            model_cfg["layer_norm_eps"],
            self.encoder.word_embeddings,
        )

    def logits(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids, torch.zeros_like(input_ids), attention_mask)
        return self.mlm_head(hidden)


def family_config(family: str) -> dict:
    return {"name": f"{family}_test", **FAMILIES[family]}


def save_checkpoint(
    path: Path, module: torch.nn.Module, model_cfg: dict, tokenizer_dir: Path
) -> None:
    """A checkpoint in the format `pretrain` writes (state_dict + plain config)."""
    vocab = load_vocabulary(tokenizer_dir)
    config = {
        "model": dict(model_cfg),
        "model_runtime": {"vocab_size": vocab.size, "pad_token_id": vocab.pad},
        "data": {"tokenizer_dir": str(tokenizer_dir), "max_seq_length": 32},
        "objective": {"name": "mlm", "_target_": "pretrain.objectives.mlm.MaskedLanguageModel"},
    }
    torch.save({"state_dict": module.state_dict(), "config": config, "global_step": 3}, path)


def make_family_checkpoint(
    path: Path, model_cfg: dict, tokenizer_dir: Path, seed: int = 0
) -> EncoderWithHead:
    """Save a checkpoint of an encoder + MLM head with every weight randomised; returns the
    module in eval mode."""
    vocab = load_vocabulary(tokenizer_dir)
    torch.manual_seed(seed)
    module = EncoderWithHead(model_cfg, vocab.size, vocab.pad)
    with torch.no_grad():  # move LayerNorms and biases off 1/0 so their mapping is tested
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    save_checkpoint(path, module, model_cfg, tokenizer_dir)
    return module.eval()


def padded_batch(vocab_size: int, pad_token_id: int, seed: int = 0, seq: int = 20):
    """(4, seq) random ids of real tokens (no pad id) with rows padded from 14, 5 and 1."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (4, seq), generator=generator)
    attention_mask = torch.ones(4, seq, dtype=torch.long)
    for row, length in ((1, 14), (2, 5), (3, 1)):
        attention_mask[row, length:] = 0
    input_ids[attention_mask == 0] = pad_token_id
    return input_ids, attention_mask


def assert_logits_match(module: EncoderWithHead, hf_model, vocab_size: int, pad: int) -> None:
    """Our MLM logits equal the Hugging Face model's at every real token, to 1e-5 in fp32."""
    input_ids, attention_mask = padded_batch(vocab_size, pad)
    with torch.no_grad():
        ours = module.logits(input_ids, attention_mask)
        theirs = hf_model(input_ids=input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    torch.testing.assert_close(theirs[real], ours[real], rtol=0, atol=1e-5)
    assert ours[real].abs().max() > 0.1  # not trivially equal zeros


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_loads_in_transformers_with_our_logits(family, prepared_corpus, tmp_path):
    tokenizer_dir = prepared_corpus / "tokenizer"
    vocab = load_vocabulary(tokenizer_dir)
    module = make_family_checkpoint(tmp_path / "last.ckpt", family_config(family), tokenizer_dir)
    out = export_checkpoint(tmp_path / "last.ckpt", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (family, [MASKED_LM[family]])
    model_class = getattr(transformers, MASKED_LM[family])
    hf, info = model_class.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert_logits_match(module, hf.eval(), vocab.size, vocab.pad)
    assert transformers.AutoTokenizer.from_pretrained(out).pad_token_id == vocab.pad


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_import_export_is_lossless(family, prepared_corpus, tmp_path):
    tokenizer_dir = prepared_corpus / "tokenizer"
    model_cfg = family_config(family)
    original = make_family_checkpoint(tmp_path / "a.ckpt", model_cfg, tokenizer_dir, seed=1)
    first = export_checkpoint(tmp_path / "a.ckpt", tmp_path / "first")
    imported_cfg, state_dict = import_hf_model(first)
    for key, value in model_cfg.items():  # every size comes back (the name says "imported")
        assert key == "name" or imported_cfg[key] == value, key
    for name, tensor in original.state_dict().items():  # every weight, under our names
        torch.testing.assert_close(state_dict[name], tensor, rtol=0, atol=0)
    vocab = load_vocabulary(tokenizer_dir)
    rebuilt = EncoderWithHead(imported_cfg, vocab.size, vocab.pad)
    rebuilt.load_state_dict(state_dict, strict=True)
    save_checkpoint(tmp_path / "b.ckpt", rebuilt, imported_cfg, tokenizer_dir)
    second = export_checkpoint(tmp_path / "b.ckpt", tmp_path / "second")
    assert (first / "config.json").read_text() == (second / "config.json").read_text()
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_bert_pretraining_heads_round_trip(prepared_corpus, tmp_path):
    """A BertForPreTraining directory (MLM + NSP) written by transformers itself imports with
    both heads, under our names."""
    tokenizer_dir = prepared_corpus / "tokenizer"
    vocab = load_vocabulary(tokenizer_dir)
    config = transformers.BertConfig(
        vocab_size=vocab.size,
        pad_token_id=vocab.pad,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=40,
        max_position_embeddings=48,
    )
    torch.manual_seed(0)
    reference = transformers.BertForPreTraining(config).eval()
    reference.save_pretrained(tmp_path / "hf")
    model_cfg, state_dict = import_hf_model(tmp_path / "hf")
    assert model_cfg["_target_"] == "pretrain.models.bert.BertEncoder"
    assert (model_cfg["hidden_size"], model_cfg["intermediate_size"]) == (32, 40)
    torch.testing.assert_close(
        state_dict["sentence_head.classifier.weight"], reference.cls.seq_relationship.weight
    )
    torch.testing.assert_close(
        state_dict["encoder.layers.1.attention.qkv.weight"][32:64],
        reference.bert.encoder.layer[1].attention.self.key.weight,
    )
    assert (
        state_dict["mlm_head.decoder.weight"]
        is state_dict["encoder.embeddings.word_embeddings.weight"]
    )


def test_import_of_an_unknown_family_names_the_file(tmp_path):
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)
    transformers.GPT2Model(config).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(
        (tmp_path / "config.json").read_text().replace('"gpt2"', '"not_a_family"')
    )
    with pytest.raises(ExportError, match="config.json: model_type 'not_a_family'"):
        import_hf_model(tmp_path)


def first_step_loss(run_dir: Path) -> float:
    return step_losses(run_dir)[0]


@pytest.mark.slow
def test_init_from_a_hf_directory_continues_from_its_weights(prepared_corpus, tmp_path):
    """A BERT trained here, exported, then used as `init_from`: the new run's first loss equals
    that of a run initialised from the checkpoint itself, far below a fresh model's."""
    common = ("trainer.log_every_n_steps=1", "optim.optimizer.lr=1e-3")
    trained = tmp_path / "trained"
    train(compose_config(tiny_overrides(prepared_corpus, trained, "trainer.max_steps=30", *common)))
    ckpt = trained / "checkpoints" / "last.ckpt"
    hf_dir = export_checkpoint(ckpt, tmp_path / "hf")
    losses = {}
    for name, extra in (
        ("fresh", []),
        ("hf", [f"init_from={hf_dir}"]),
        ("ckpt", [f"init_from={ckpt}"]),
    ):
        run_dir = tmp_path / name
        overrides = tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=1", *common, *extra)
        train(compose_config(overrides))
        losses[name] = first_step_loss(run_dir)
    assert losses["hf"] == pytest.approx(losses["ckpt"], abs=1e-4), losses
    assert losses["hf"] < losses["fresh"] - 1.0, losses


def test_init_from_a_directory_of_another_size_names_the_key(prepared_corpus, tmp_path):
    tokenizer_dir = prepared_corpus / "tokenizer"
    make_family_checkpoint(tmp_path / "a.ckpt", family_config("bert"), tokenizer_dir)
    hf_dir = export_checkpoint(tmp_path / "a.ckpt", tmp_path / "hf")
    overrides = tiny_overrides(prepared_corpus, tmp_path / "run", "trainer.max_steps=1")
    with pytest.raises(ConfigError, match=r"init_from=.*model\.hidden_size 48 -> 128"):
        train(compose_config([*overrides, f"init_from={hf_dir}"]))
