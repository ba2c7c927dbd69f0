"""Export to Hugging Face: the exported directory loads with transformers and gives our outputs."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pretrain.export import ExportError, export_checkpoint
from pretrain.export.bert import bert_to_hf_state_dict
from pretrain.models.build import build_encoder
from pretrain.models.heads import MaskedLMHead, NextSentenceHead

transformers = pytest.importorskip("transformers")

WORDS = [
    "[UNK]",
    "[PAD]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "dog",
    "ran",
]
WORDS += ["##s", "##ed", "a", "big", "small", "house", "tree", "bird", "fly", "##ing", "to", "and"]
PAD_ID = WORDS.index("[PAD]")  # deliberately not 0
# Non-default values everywhere, so a field the export forgets shows up as a mismatch.
MODEL_CFG = {
    "name": "bert_test",
    "_target_": "pretrain.models.bert.BertEncoder",
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 80,
    "max_position_embeddings": 24,
    "type_vocab_size": 3,
    "hidden_dropout_prob": 0.25,
    "attention_probs_dropout_prob": 0.35,
    "layer_norm_eps": 1e-6,
    "initializer_range": 0.07,
}


class FakeLightningModule(torch.nn.Module):
    """Holds the modules under the prefixes the lead's LightningModule uses, plus an unrelated one."""

    def __init__(self, nsp: bool = True) -> None:
        super().__init__()
        self.encoder = build_encoder(MODEL_CFG, len(WORDS), PAD_ID)
        self.mlm_head = MaskedLMHead(
            48, len(WORDS), MODEL_CFG["layer_norm_eps"], self.encoder.word_embeddings
        )
        self.sentence_head = NextSentenceHead(48) if nsp else None
        self.loss_weights = torch.nn.Linear(2, 1)  # another prefix, which the export must ignore

    def outputs(self, input_ids, token_type_ids, attention_mask):
        hidden = self.encoder(input_ids, token_type_ids, attention_mask)
        nsp = self.sentence_head(hidden) if self.sentence_head is not None else None
        return self.mlm_head(hidden), nsp


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tokenizer = Tokenizer(
        models.WordPiece({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]")
    )
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", WORDS.index("[CLS]")), ("[SEP]", WORDS.index("[SEP]"))],
    )
    tokenizer.decoder = decoders.WordPiece()
    fast = transformers.BertTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    directory = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(directory)
    return directory


def make_checkpoint(
    path: Path, tokenizer_dir: Path, nsp: bool = True, seed: int = 0
) -> FakeLightningModule:
    """Save a checkpoint in the lead's format from a model with every weight randomised."""
    torch.manual_seed(seed)
    module = FakeLightningModule(nsp=nsp)
    with (
        torch.no_grad()
    ):  # LayerNorms and biases start at 1/0: move them so their mapping is tested
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    config = {
        "model": dict(MODEL_CFG),
        "model_runtime": {"vocab_size": len(WORDS), "pad_token_id": PAD_ID},
        "data": {"tokenizer_dir": str(tokenizer_dir), "max_seq_length": 20},
        "objective": {
            "name": "mlm_nsp" if nsp else "mlm",
            "_target_": "pretrain.objectives.mlm.MaskedLanguageModel",
        },
    }
    torch.save(
        {"state_dict": module.state_dict(), "config": config, "global_step": 7, "epoch": 0}, path
    )
    return module.eval()


def random_batch(seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, len(WORDS), (4, 20), generator=generator)
    token_type_ids = torch.randint(0, 3, (4, 20), generator=generator)
    attention_mask = torch.ones(4, 20, dtype=torch.long)
    attention_mask[1, 14:] = 0
    attention_mask[2, 5:] = 0
    input_ids[attention_mask == 0] = PAD_ID
    return input_ids, token_type_ids, attention_mask


def assert_masked_lm_logits_match(module, hf_model, seed: int) -> None:
    """Our MLM logits equal the Hugging Face model's at every non-padding position."""
    input_ids, token_type_ids, attention_mask = random_batch(seed=seed)
    with torch.no_grad():
        mlm, _ = module.outputs(input_ids, token_type_ids, attention_mask)
        logits = hf_model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).logits
    real = attention_mask.bool()
    torch.testing.assert_close(logits[real], mlm[real], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("export")
    module = make_checkpoint(root / "last.ckpt", tokenizer_dir)
    out = export_checkpoint(root / "last.ckpt", root / "hf")
    return module, out, root


def test_pretraining_logits_match_ours(exported):
    module, out, _ = exported
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hf.eval()
    input_ids, token_type_ids, attention_mask = random_batch()
    with torch.no_grad():
        mlm, nsp = module.outputs(input_ids, token_type_ids, attention_mask)
        output = hf(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )
    real = attention_mask.bool()
    torch.testing.assert_close(output.prediction_logits[real], mlm[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(output.seq_relationship_logits, nsp, rtol=0, atol=1e-5)
    assert mlm.abs().max() > 0.1 and nsp.abs().max() > 0.01  # not trivially equal zeros


def test_masked_lm_loads_and_matches(exported):
    module, out, _ = exported
    hf, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"], info
    assert_masked_lm_logits_match(module, hf.eval(), seed=5)


def test_config_and_tokenizer(exported, tokenizer_dir):
    _, out, _ = exported
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["model_type"] == "bert"
    for key, value in MODEL_CFG.items():
        if not key.startswith(("_", "name")):
            assert config[key] == value, key
    assert (config["vocab_size"], config["pad_token_id"]) == (len(WORDS), PAD_ID)
    hf_config = transformers.AutoConfig.from_pretrained(out)
    assert hf_config.hidden_dropout_prob == 0.25 and hf_config.type_vocab_size == 3
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    original = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    text = ("the cats sat on a big mat", "a small bird flying to the tree")
    assert tokenizer(*text)["input_ids"] == original(*text)["input_ids"]
    assert tokenizer.pad_token_id == PAD_ID
    assert len(tokenizer) == config["vocab_size"]


def test_weights_file_has_tied_names_and_split_qkv(exported):
    module, out, _ = exported
    weights = load_file(out / "model.safetensors")
    torch.testing.assert_close(
        weights["cls.predictions.decoder.weight"], weights["bert.embeddings.word_embeddings.weight"]
    )
    torch.testing.assert_close(
        weights["cls.predictions.decoder.bias"], weights["cls.predictions.bias"]
    )
    qkv = module.encoder.layers[1].attention.qkv.weight.detach()
    parts = [
        weights[f"bert.encoder.layer.1.attention.self.{name}.weight"]
        for name in ("query", "key", "value")
    ]
    torch.testing.assert_close(torch.cat(parts), qkv, rtol=0, atol=0)
    assert not any(name.startswith("loss_weights") for name in weights)


def test_console_script(exported, tmp_path):
    _, out, root = exported
    script = Path(sys.executable).parent / "pretrain-export"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "pretrain.export.cli"]
    target = tmp_path / "cli_export"
    result = subprocess.run(
        [*command, str(root / "last.ckpt"), str(target)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    ours, theirs = load_file(out / "model.safetensors"), load_file(target / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    again = subprocess.run(
        [*command, str(root / "last.ckpt"), str(target)], capture_output=True, text=True
    )
    assert again.returncode == 1 and "--overwrite" in again.stderr
    missing = subprocess.run(
        [*command, str(tmp_path / "nope.ckpt"), str(tmp_path / "x")], capture_output=True, text=True
    )
    assert (
        missing.returncode == 1
        and "nope.ckpt" in missing.stderr
        and "Traceback" not in missing.stderr
    )


def test_overwrite_replaces_only_when_asked(tmp_path, tokenizer_dir):
    make_checkpoint(tmp_path / "a.ckpt", tokenizer_dir, seed=1)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("old export")
    with pytest.raises(ExportError, match="--overwrite"):
        export_checkpoint(tmp_path / "a.ckpt", out)
    assert (out / "stale.txt").exists()
    export_checkpoint(tmp_path / "a.ckpt", out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "hf"]  # no temporary leftovers
    with pytest.raises(ExportError, match="input of the export"):
        export_checkpoint(tmp_path / "a.ckpt", tmp_path, overwrite=True)
    assert (tmp_path / "a.ckpt").exists()


def test_exported_files_are_readable_by_the_group_as_the_umask_says(tmp_path, tokenizer_dir):
    make_checkpoint(tmp_path / "a.ckpt", tokenizer_dir, seed=1)
    previous = os.umask(0o022)
    try:
        out = export_checkpoint(tmp_path / "a.ckpt", tmp_path / "hf")
        os.umask(0o077)
        private = export_checkpoint(tmp_path / "a.ckpt", tmp_path / "private")
    finally:
        os.umask(previous)
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE((private / "model.safetensors").stat().st_mode) == 0o600


def test_mlm_only_checkpoint_exports_masked_lm(tmp_path, tokenizer_dir):
    module = make_checkpoint(tmp_path / "mlm.ckpt", tokenizer_dir, nsp=False, seed=2)
    out = export_checkpoint(tmp_path / "mlm.ckpt", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert_masked_lm_logits_match(
        module, transformers.AutoModelForMaskedLM.from_pretrained(out).eval(), seed=9
    )


@pytest.mark.parametrize("nsp", [True, False])
def test_the_check_loads_the_class_the_export_names_and_fills_a_mask(tmp_path, tokenizer_dir, nsp):
    """`python -m pretrain.export.check` (`make demo`'s last step): every weight of the
    export is loaded, none made up (transformers reports none missing), a [MASK] filled."""
    make_checkpoint(tmp_path / "a.ckpt", tokenizer_dir, nsp=nsp)
    out = export_checkpoint(tmp_path / "a.ckpt", tmp_path / "hf")
    done = subprocess.run(
        [sys.executable, "-m", "pretrain.export.check", str(out), "a [MASK] b"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    name = "BertForPreTraining" if nsp else "BertForMaskedLM"
    assert f"with transformers.{name} and AutoTokenizer" in done.stdout
    assert "'a [MASK] b': [MASK] -> " in done.stdout
    noise = ("MISSING", "Failed to load", "register_constant")  # transformers', torchao's
    assert not [n for n in noise if n in done.stdout + done.stderr], done.stdout + done.stderr


def test_the_check_refuses_what_is_not_an_export_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "architectures": ["Nope"]}')
    done = subprocess.run(
        [sys.executable, "-m", "pretrain.export.check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"pretrain.export.check: error: {tmp_path}/config.json: architecture 'Nope' is unknown "
        "to transformers"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pretrain.export.check", str(tmp_path / "gone")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"pretrain.export.check: error: {tmp_path / 'gone'}: no config.json, not an exported "
        "directory (pretrain-export CKPT DIR writes one)"
    )


def test_bad_checkpoints_name_the_file_and_key(tmp_path, tokenizer_dir):
    with pytest.raises(ExportError, match="missing.ckpt.*not found"):
        export_checkpoint(tmp_path / "missing.ckpt", tmp_path / "out")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExportError, match="garbage.ckpt.*cannot read"):
        export_checkpoint(tmp_path / "garbage.ckpt", tmp_path / "out")
    make_checkpoint(tmp_path / "good.ckpt", tokenizer_dir)
    checkpoint = torch.load(tmp_path / "good.ckpt", weights_only=True)
    torch.save({"state_dict": checkpoint["state_dict"]}, tmp_path / "noconfig.ckpt")
    with pytest.raises(ExportError, match="noconfig.ckpt.*'config'"):
        export_checkpoint(tmp_path / "noconfig.ckpt", tmp_path / "out")
    del checkpoint["config"]["model_runtime"]["pad_token_id"]
    torch.save(checkpoint, tmp_path / "noruntime.ckpt")
    with pytest.raises(ExportError, match="noruntime.ckpt.*model_runtime.pad_token_id"):
        export_checkpoint(tmp_path / "noruntime.ckpt", tmp_path / "out")
    checkpoint = torch.load(tmp_path / "good.ckpt", weights_only=True)
    checkpoint["config"]["data"]["tokenizer_dir"] = str(tmp_path / "gone")
    torch.save(checkpoint, tmp_path / "notok.ckpt")
    with pytest.raises(ExportError, match="gone.*tokenizer"):
        export_checkpoint(tmp_path / "notok.ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_state_dict_mapping_rejects_unknown_keys_and_ignores_other_prefixes():
    torch.manual_seed(0)
    module = FakeLightningModule()
    state = module.state_dict()
    mapped = bert_to_hf_state_dict(state)
    assert not any("loss_weights" in name for name in mapped)
    with pytest.raises(ValueError, match="encoder.extra.weight"):
        bert_to_hf_state_dict({**state, "encoder.extra.weight": torch.zeros(1)})
    untied = {
        **state,
        "mlm_head.decoder.weight": torch.zeros_like(state["mlm_head.decoder.weight"]),
    }
    with pytest.raises(ValueError, match="ties"):
        bert_to_hf_state_dict(untied)
