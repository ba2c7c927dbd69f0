"""`pretrain-params`: parameter counts of composed model configs, without allocating weights."""

import json

import pytest
import torch
import transformers

from pretrain.param_counts import deprecated_main, main, model_info


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
    assert main(["model=bert_base", "model.num_attention_heads=5"]) == 2
    assert "model.hidden_size" in capsys.readouterr().err


def test_old_name_still_works_and_says_so(capsys):
    assert deprecated_main(["model=bert_tiny", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"] == "bert_tiny"
    assert "pretrain-params" in err
