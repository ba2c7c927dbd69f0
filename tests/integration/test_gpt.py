"""GPT-2 style causal LM: the model is causal and padding-safe, the export matches
`transformers.GPT2LMHeadModel` (logits and loss) and round-trips losslessly, the configs
check their keys and count GPT-2 small's 124M parameters, and `experiment=gpt_demo` trains
end to end with a falling loss, exports, previews and generates."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain.cli.params import parameter_counts
from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary
from pretrain.export import ExportError, export_checkpoint, import_hf_model
from pretrain.export.gpt2 import from_hf, to_hf
from pretrain.export.hf import HFModel, write_hf_model
from pretrain.objectives.causal_lm import CausalLanguageModel, CausalLMCorruption

transformers = pytest.importorskip("transformers")

VOCAB = Vocabulary(size=37, pad=3, unk=0, cls=1, sep=2, mask=4)  # pad deliberately not 0
# Non-default values everywhere, so a field the export forgets shows up as a mismatch.
MODEL_CFG = {
    "name": "gpt_test",
    "_target_": "pretrain.models.gpt.GPTModel",
    "n_embd": 48,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": 80,
    "n_positions": 24,
    "resid_pdrop": 0.15,
    "embd_pdrop": 0.2,
    "attn_pdrop": 0.3,
    "layer_norm_epsilon": 1e-6,
    "initializer_range": 0.08,
}
RUN_CONFIG = {
    "seed": 0,
    "model": MODEL_CFG,
    "objective": {"_target_": "pretrain.objectives.causal_lm.CausalLanguageModel"},
    "data": {"format": "full_sentences", "max_seq_length": 20},
    "model_runtime": {"vocab_size": VOCAB.size, "pad_token_id": VOCAB.pad},
}


def padded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 20) ids and attention mask: one full row, two right-padded rows."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB.size, (3, 20), generator=generator)
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 13:] = 0
    mask[2, 6:] = 0
    return ids.masked_fill(mask == 0, VOCAB.pad), mask


@pytest.fixture(scope="module")
def module() -> CausalLanguageModel:
    torch.manual_seed(0)
    return CausalLanguageModel(RUN_CONFIG, VOCAB).eval()


@pytest.fixture(scope="module")
def hf_dir(module, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gpt2_hf")
    write_hf_model(to_hf(module.state_dict(), RUN_CONFIG), directory, None)
    return directory


def test_model_is_causal_and_ignores_right_padding(module):
    encoder = module.encoder
    ids, mask = padded_batch()
    with torch.no_grad():
        hidden = encoder(ids, mask)
        changed = ids.clone()
        changed[:, 9] = (changed[:, 9] + 1) % VOCAB.size
        after = encoder(changed, mask)
        unpadded = encoder(ids[1:2, :13])  # row 1 without its padding, plain causal kernel
    assert torch.allclose(hidden[:, :9], after[:, :9], atol=1e-6)  # the past ignores the future
    assert not torch.allclose(hidden[0, 9:], after[0, 9:], atol=1e-3)
    assert torch.allclose(hidden[1, :13], unpadded[0], atol=1e-5)
    assert torch.isfinite(hidden).all()


def test_export_matches_transformers_logits_and_loss(module, hf_dir):
    reference = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    assert reference.config.n_inner == 80 and reference.config.attn_pdrop == 0.3
    ids, mask = padded_batch(1)
    batch = CausalLMCorruption()(
        {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, epoch=0
    )
    labels = torch.from_numpy(batch["labels"])
    with torch.no_grad():
        ours = module.encoder.logits(module.encoder(ids, mask))
        theirs = reference(input_ids=ids, attention_mask=mask, labels=labels)
        loss = module({"input_ids": ids, "attention_mask": mask, "labels": labels})["loss"]
    real = mask.bool()
    assert (ours - theirs.logits)[real].abs().max() < 1e-5
    assert abs(float(loss) - float(theirs.loss)) < 1e-5


def test_round_trip_is_lossless(module, hf_dir, tmp_path):
    model_cfg, state_dict = import_hf_model(hf_dir)
    assert {k: model_cfg[k] for k in MODEL_CFG if k != "name"} == {
        k: v for k, v in MODEL_CFG.items() if k != "name"
    }
    again = to_hf(state_dict, {**RUN_CONFIG, "model": model_cfg})
    first = to_hf(module.state_dict(), RUN_CONFIG)
    assert again.config == first.config
    assert again.weights.keys() == first.weights.keys()
    for name, tensor in first.weights.items():
        assert torch.equal(again.weights[name], tensor), name
    # and the imported weights load into a fresh module and give the same outputs
    fresh = CausalLanguageModel({**RUN_CONFIG, "model": model_cfg}, VOCAB).eval()
    fresh.load_pretrained(state_dict, str(hf_dir))
    ids, mask = padded_batch(2)
    with torch.no_grad():
        assert torch.equal(fresh.encoder(ids, mask), module.encoder(ids, mask))


def test_import_refuses_other_gpt2_variants(hf_dir):
    model_cfg, state_dict = import_hf_model(hf_dir)
    hf = to_hf(state_dict, {**RUN_CONFIG, "model": model_cfg})
    with pytest.raises(ExportError, match="activation_function"):
        from_hf(HFModel({**hf.config, "activation_function": "relu"}, hf.weights))


def test_gpt_small_has_gpt2s_124m_parameters():
    model = validate(compose_config(["model=gpt_small"])).model
    ours = parameter_counts(
        {k: getattr(model, k) for k in ("_target_", *MODEL_CFG) if k != "name"}, 50257
    )
    config = transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12
    )
    with torch.device("meta"):
        reference = transformers.GPT2LMHeadModel(config)
    unique = {id(p): p.numel() for p in reference.parameters()}  # tied lm_head counted once
    assert ours["total"] == sum(unique.values()) == 124_439_808
    assert ours["embeddings"] == (50257 + 1024) * 768


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model=gpt_tiny", "model.n_head=3"], "model.n_embd"),
        (["model=gpt_tiny", "model.attn_pdrop=1.5"], "model.attn_pdrop"),
        (
            [
                "model=gpt_tiny",
                "objective=causal_lm",
                "data=full_sentences",
                "data.max_seq_length=512",
            ],
            "data.max_seq_length",
        ),
        (["model=gpt_tiny", "objective=causal_lm", "data=segment_pair"], "data.format"),
    ],
)
def test_bad_settings_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(overrides))
    assert str(error.value).startswith(key)


def test_corruption_labels_every_real_token_and_no_padding():
    ids, mask = padded_batch(3)
    batch = CausalLMCorruption()({"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, 0)
    labels = batch["labels"]
    assert np.array_equal(labels[mask.numpy() == 1], ids.numpy()[mask.numpy() == 1])
    assert (labels[mask.numpy() == 0] == IGNORE_INDEX).all()
    assert np.array_equal(batch["input_ids"], ids.numpy())  # nothing corrupted


# ---- end to end: train through experiment=gpt_demo, export, generate, preview ----


def demo_overrides(shards_dir: Path, run_dir: Path) -> list[str]:
    return [
        "experiment=gpt_demo",
        f"data.shards_dir={shards_dir}",
        f"run_dir={run_dir}",
        "logger=csv",
        "data.max_seq_length=48",
        "data.batch_size=8",
        "data.num_workers=0",
        "data.shuffle_buffer_documents=50",
        "model.n_embd=48",
        "model.n_positions=64",
        "model.resid_pdrop=0",
        "model.embd_pdrop=0",
        "model.attn_pdrop=0",
        "optim.optimizer.lr=3e-3",
        "optim.warmup_steps=3",
        "trainer.max_steps=25",
        "trainer.log_every_n_steps=1",
        "trainer.checkpoint_every_n_steps=25",
        "trainer.enable_progress_bar=false",
    ]


@pytest.fixture(scope="module")
def trained_run(prepared_corpus, tmp_path_factory) -> Path:
    from pretrain.runtime.run import train

    run_dir = tmp_path_factory.mktemp("gpt_demo") / "run"
    train(compose_config(demo_overrides(prepared_corpus, run_dir)))
    return run_dir


@pytest.mark.slow
def test_gpt_demo_trains_with_falling_loss(trained_run):
    with open(next(trained_run.glob("csv/version_*/metrics.csv"))) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/lm_loss")]
    loss = [float(r["train/lm_loss"]) for r in rows]
    assert len(loss) == 25
    assert np.log(1500) - 0.3 < loss[0] < np.log(1500) + 0.3  # starts near uniform
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 0.7, loss


@pytest.mark.slow
def test_checkpoint_exports_and_generates(trained_run, tmp_path, capsys):
    from pretrain.cli.generate import generate_text, load_for_generation

    ckpt = trained_run / "checkpoints" / "last.ckpt"
    out = export_checkpoint(ckpt, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["n_embd"] == 48
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("[SEP]")
    reference = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    module, _ = load_for_generation(ckpt)
    ids = torch.tensor(
        [
            [
                config["bos_token_id"],
                *tokenizer("the value of", add_special_tokens=False)["input_ids"],
            ]
        ]
    )
    with torch.no_grad():
        expected = reference.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=config["pad_token_id"],
        )
    continuation = tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
    for source in (ckpt, out):  # a checkpoint and the exported directory generate alike
        module, tok = load_for_generation(source)
        assert generate_text(module, tok, "the value of", max_new_tokens=8) == continuation
    from pretrain.cli.generate import main

    capsys.readouterr()  # what the command prints, not what loading printed before it
    status = main([str(out), "--text", "the value of", "--num-beams", "3", "--max-new-tokens", "6"])
    assert status == 0 and capsys.readouterr().out.startswith("the value of => ")


def test_generate_refuses_an_mlm_checkpoint_directory(tmp_path, capsys):
    from pretrain.cli.generate import main

    # (a BERT directory generates: UniLM's export, under the seq2seq mask)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main([str(tmp_path), "--text", "hello"]) == 2
    assert "model_type 'roberta' has no generating objective" in capsys.readouterr().err


def test_preview_shows_plain_text_for_the_causal_lm(prepared_corpus):
    from tokenizers import Tokenizer

    from pretrain.runtime.preview import preview_records, render

    records, tokenizer_dir, pair_task = preview_records(
        [
            f"data.shards_dir={prepared_corpus}",
            "experiment=gpt_demo",
            "data.max_seq_length=32",
            "data.num_workers=0",
        ],
        2,
    )
    text = render(records[0], Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json"), pair_task)
    assert "next-token targets" in text and "<" not in text.split("\n")[1]
    assert text.split("\n")[1].strip().startswith("[CLS]")


def test_causal_lm_refuses_a_bidirectional_encoder():
    bert = {
        "name": "b",
        "_target_": "pretrain.models.bert.BertEncoder",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
    with pytest.raises(ConfigError, match="decoder-only"):
        CausalLanguageModel({**RUN_CONFIG, "model": bert}, VOCAB)
