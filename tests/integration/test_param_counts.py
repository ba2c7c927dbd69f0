"""`pretrain-params`: parameter counts of composed model configs, without allocating weights,
and the papers' way of counting (the [CLS] pooler where the paper counts it). Here, not in
tests/unit: the stored table's check composes every shipped model config (about 20 s)."""

import json

import pytest
import torch
import transformers

from pretrain.cli.params import main, model_info, read_table, shipped_counts
from pretrain.models.heads import NextSentenceHead


@pytest.mark.parametrize("name", ["bert_base", "bert_large"])
def test_bert_counts_equal_transformers(name):
    info = model_info([f"model={name}"])
    sizes = {"bert_base": (768, 12, 12, 3072), "bert_large": (1024, 24, 16, 4096)}[name]
    hidden, layers, heads, inner = sizes
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
    )
    with torch.device("meta"):
        reference = transformers.BertModel(config, add_pooling_layer=False)
    assert info["total"] == sum(p.numel() for p in reference.parameters())
    assert info["embeddings"] == sum(p.numel() for p in reference.embeddings.parameters())
    assert info["rest"] == info["total"] - info["embeddings"]
    with torch.device("meta"):
        pooled = transformers.BertModel(config, add_pooling_layer=True)
    assert info["paper_total"] == sum(p.numel() for p in pooled.parameters())
    assert info["paper_total"] == info["total"] + info["pooler"]


@pytest.mark.parametrize(("name", "paper_millions"), [("albert_base", 12), ("albert_large", 18)])
def test_albert_paper_counts_round_to_table_1(name, paper_millions):
    # ALBERT (Lan et al., Table 1): 12M / 18M; the encoder alone is 11.09M / 17.09M
    info = model_info([f"model={name}"])
    assert round(info["paper_total"] / 1e6) == paper_millions, info
    assert round(info["total"] / 1e6) == paper_millions - 1
    assert info["paper_counts"].startswith("encoder + [CLS] pooler")
    with torch.device("meta"):
        head = NextSentenceHead({"albert_base": 768, "albert_large": 1024}[name])
    assert info["pooler"] == sum(p.numel() for p in head.pooler.parameters())  # SOP's pooler


def test_albert_base_paper_count_equals_transformers_with_pooler():
    info = model_info(["model=albert_base"])
    config = transformers.AlbertConfig(
        vocab_size=30000,
        embedding_size=128,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
    )
    with torch.device("meta"):
        with_pooler = transformers.AlbertModel(config, add_pooling_layer=True)
        without = transformers.AlbertModel(config, add_pooling_layer=False)
    assert info["paper_total"] == sum(p.numel() for p in with_pooler.parameters()) == 11_683_584
    assert info["total"] == sum(p.numel() for p in without.parameters())


@pytest.mark.parametrize("name", ["distilbert", "xlnet_base", "bart_base", "gpt_small"])
def test_papers_without_a_pooler_count_the_model_alone(name):
    info = model_info([f"model={name}"])
    assert info["pooler"] == 0 and info["paper_total"] == info["total"]
    assert "no pooler" in info["paper_counts"]


def test_json_output_and_vocabulary_override(capsys):
    assert main(["model=bert_tiny", "vocab_size=1000", "--format", "json"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert main(["model=bert_tiny", "vocab_size=2000", "--format", "json"]) == 0
    large = json.loads(capsys.readouterr().out)
    assert small["vocab_size"] == 1000
    # 1000 more rows of 128 features in the word embeddings, nothing else changes
    assert large["embeddings"] - small["embeddings"] == 1000 * 128
    assert large["rest"] == small["rest"]


def test_table_and_bad_value(capsys):
    assert main(["model=bert_base"]) == 0
    table = capsys.readouterr().out
    total = model_info(["model=bert_base"])["total"]
    assert "bert_base" in table and f"{total:,}" in table
    paper = model_info(["model=bert_base"])["paper_total"]
    assert f"paper count    109.48M  {paper:,}" in table  # first row, the paper's way
    assert "paper count = encoder + [CLS] pooler; pretraining heads not counted" in table
    assert main(["model=bert_base", "model.num_attention_heads=5"]) == 2
    assert "model.hidden_size" in capsys.readouterr().err


def test_stored_table_equals_a_fresh_count_of_every_shipped_model():
    # param_counts.json answers the shipped configs without torch; it must be what a build gives
    stored = read_table()
    assert stored == shipped_counts(), "stale: run `python -m pretrain.cli.params --write-table`"
    assert {"bert_base", "albert_xxlarge", "xlnet_large", "bart_large"} <= set(stored)


def test_an_override_is_counted_not_read_from_the_table():
    # half the layers: half the "rest" (each layer's weights), the embeddings unchanged
    full, half = (
        model_info(["model=bert_base"]),
        model_info(["model=bert_base", "model.num_hidden_layers=6"]),
    )
    assert half["rest"] * 2 == full["rest"] and half["embeddings"] == full["embeddings"]
