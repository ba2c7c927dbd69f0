"""RoBERTa: positions offset past the padding index, paper sizes, the recipe, end-to-end
training on a byte-level BPE corpus and the export to `RobertaForMaskedLM`."""

import json
from pathlib import Path

import pytest
import torch
from conftest import prepare_small_corpus
from test_import import (
    EncoderWithHead,
    assert_logits_match,
    family_config,
    make_family_checkpoint,
)
from test_objectives_train import logged
from test_train import tiny_overrides

from data_pipelines.prepare_config import TokenizerSettings
from pretrain.checkpoint.compat import objective_state_dict
from pretrain.cli.params import model_info
from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.vocab import load_vocabulary
from pretrain.export import ExportError, export_checkpoint
from pretrain.models.bert import BertEncoder
from pretrain.models.roberta import RobertaEncoder, roberta_position_ids
from pretrain.runtime.run import train

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bpe_corpus(tmp_path_factory) -> Path:
    """The small English corpus with a cased byte-level BPE vocabulary (RoBERTa's kind)."""
    root = tmp_path_factory.mktemp("bpe_corpus")
    tokenizer = TokenizerSettings(kind="bytelevel_bpe", vocab_size=1200, lowercase=False)
    return prepare_small_corpus(root, tokenizer=tokenizer)


def test_position_ids_count_real_tokens_from_past_the_pad_id():
    ids = torch.tensor([[7, 8, 9, 0, 0], [0, 0, 5, 6, 0]])
    assert roberta_position_ids(ids, 0).tolist() == [[1, 2, 3, 0, 0], [0, 0, 1, 2, 0]]
    ids = torch.tensor([[7, 8, 1, 1]])
    assert roberta_position_ids(ids, 1).tolist() == [[2, 3, 1, 1]]


def _left_padding_changes_outputs(encoder_class, pad: int) -> float:
    torch.manual_seed(0)
    encoder = encoder_class(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=1,
        pad_token_id=pad,
    ).eval()
    real = torch.tensor([[11, 12, 13, 14, 15]])
    padded = torch.cat([torch.full((1, 3), pad), real], dim=1)
    mask = (padded != pad).long()
    with torch.no_grad():
        alone = encoder(real)
        shifted = encoder(padded, attention_mask=mask)[:, 3:]
    return float((alone - shifted).abs().max())


@pytest.mark.parametrize("pad", [0, 1])
def test_left_padding_does_not_move_positions(pad):
    """Positions count real tokens only: padding before a sequence changes nothing of it
    (it does for BERT, whose positions are 0..seq-1)."""
    assert _left_padding_changes_outputs(RobertaEncoder, pad) < 1e-5
    assert _left_padding_changes_outputs(BertEncoder, pad) > 1e-2


@pytest.mark.parametrize(
    ("model", "published", "hidden"), [("roberta_base", 125e6, 768), ("roberta_large", 355e6, 1024)]
)
def test_paper_parameter_counts(model, published, hidden):
    """RoBERTa-base ~125M, large ~355M parameters (Liu et al., 2019) with the 50,265-token BPE."""
    info = model_info([f"model={model}"])
    assert info["vocab_size"] == 50265
    assert abs(info["total"] - published) / published < 0.01, info
    # words + 514 positions + 1 token type, and the embedding LayerNorm
    assert info["embeddings"] == (50265 + 514 + 1) * hidden + 2 * hidden


def test_recipe_is_the_papers():
    config = validate(compose_config(["experiment=roberta_base"]))
    assert config.model.name == "roberta_base" and config.model.type_vocab_size == 1
    assert config.data.format == "full_sentences" and config.objective.pair_task == "none"
    assert (config.data.max_seq_length, config.data.global_batch_size) == (512, 8192)
    assert (config.trainer.max_steps, config.optim.warmup_steps) == (500_000, 24_000)
    optimizer = config.optim.optimizer
    assert optimizer["lr"] == 6e-4
    assert list(optimizer["betas"]) == [0.9, 0.98] and optimizer["eps"] == 1e-6


def test_sequences_longer_than_512_are_refused():
    with pytest.raises(ConfigError, match=r"^data\.max_seq_length = 513.*512 positions"):
        validate(
            compose_config(
                [
                    "model=roberta_base",
                    "objective=mlm",
                    "data=full_sentences",
                    "data.max_seq_length=513",
                ]
            )
        )


def test_a_sentence_pair_head_cannot_be_exported(prepared_corpus, tmp_path):
    tokenizer_dir = prepared_corpus / "tokenizer"
    make_family_checkpoint(tmp_path / "a.ckpt", family_config("roberta"), tokenizer_dir)
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=True)
    checkpoint["state_dict"]["nsp_head.classifier.weight"] = torch.zeros(2, 48)
    torch.save(checkpoint, tmp_path / "a.ckpt")
    with pytest.raises(ExportError, match="objective=mlm"):
        export_checkpoint(tmp_path / "a.ckpt", tmp_path / "hf")


@pytest.mark.slow
def test_roberta_demo_trains_and_exports(bpe_corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        bpe_corpus,
        run_dir,
        "experiment=roberta_demo",
        "model=roberta_tiny",
        "data.num_workers=0",
        "trainer.max_steps=30",
        "trainer.log_every_n_steps=1",
        "optim.warmup_steps=5",
    )
    train(compose_config(overrides))
    loss = logged(run_dir, "train/loss")
    # it learns: 0.49-0.63 nats in 30 steps, depending on the masks (keys hash the corpus path)
    assert len(loss) == 30 and sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 0.3, loss
    assert not any("nsp" in name for name in _columns(run_dir))

    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["max_position_embeddings"] == 514
    vocab = load_vocabulary(bpe_corpus / "tokenizer")
    module = EncoderWithHead(ckpt["config"]["model"], vocab.size, vocab.pad)
    module.load_state_dict(objective_state_dict(ckpt["state_dict"]), strict=False)
    hf = transformers.RobertaForMaskedLM.from_pretrained(out).eval()
    assert_logits_match(module.eval(), hf, vocab.size, vocab.pad)

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(
        ["Lists are mutable.", "A tuple is not."], padding=True, return_tensors="pt"
    )
    assert tokenizer.pad_token_id == vocab.pad and tokenizer.mask_token == "[MASK]"
    with torch.no_grad():
        ours = module.logits(encoded["input_ids"], encoded["attention_mask"])
        theirs = hf(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
    real = encoded["attention_mask"].bool()
    torch.testing.assert_close(theirs[real], ours[real], rtol=0, atol=1e-5)


def _columns(run_dir: Path) -> list[str]:
    import csv

    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return csv.DictReader(f).fieldnames or []
