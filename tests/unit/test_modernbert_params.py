"""`pretrain-params` for the ModernBERT family: the published counts (ModernBERT-base 149M,
large 395M, within 1%), each equal to transformers' ModernBertModel of the same sizes, and
NeoBERT's encoder (its paper's ~250M includes an untied 30,522 x 768 decoder)."""

import pytest
import torch
import transformers

from pretrain.cli.params import main, model_info


@pytest.mark.parametrize(
    ("name", "millions", "sizes"),
    [
        ("modernbert_base", 149, (768, 22, 12, 1152)),
        ("modernbert_large", 395, (1024, 28, 16, 2624)),
    ],
)
def test_published_counts_within_one_percent_and_equal_transformers(name, millions, sizes):
    info = model_info([f"model={name}"])
    assert abs(info["paper_total"] / 1e6 - millions) / millions < 0.01, info
    assert info["pooler"] == 0 and info["paper_total"] == info["total"]
    hidden, layers, heads, inner = sizes
    config = transformers.ModernBertConfig(
        vocab_size=50368,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
    )
    with torch.device("meta"):
        reference = transformers.ModernBertModel(config)
    assert info["total"] == sum(p.numel() for p in reference.parameters())
    assert info["embeddings"] == sum(p.numel() for p in reference.embeddings.parameters())


def test_neobert_count_with_its_untied_decoder_is_the_papers_250m():
    info = model_info(["model=neobert"])
    assert info["vocab_size"] == 30522
    decoder = 30522 * 768 + 30522  # NeoBERT's LM head: weight and bias, not tied
    assert abs((info["total"] + decoder) / 1e6 - 250) / 250 < 0.025, info
    layer = 4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768  # attention, SwiGLU, two RMSNorms
    assert info["total"] == 30522 * 768 + 28 * layer + 768  # + the final norm


def test_cli_prints_149m(capsys):
    assert main(["model=modernbert_base"]) == 0
    out = capsys.readouterr().out
    assert "149.01M" in out and "modernbert_base" in out
