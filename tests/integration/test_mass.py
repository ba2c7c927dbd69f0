"""MASS: the batch its corruption builds (fragment-only targets, decoder aligned with the
encoder) and the demo training end to end with a falling loss."""

import numpy as np
import pytest
import torch
from test_noise import MASK, VOCAB, collated
from test_objectives_train import logged
from test_seq2seq import assert_loss_falls, train_tiny

from pretrain.config import ConfigError, compose_config, validate
from pretrain.objectives.mass import MassCorruption


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_mass_batch_predicts_only_the_fragment():
    batch = collated()
    original, lengths = batch["input_ids"].copy(), batch["attention_mask"].sum(axis=1)
    out = MassCorruption(seed=0, pad_id=VOCAB.pad, mask_id=MASK)(batch, epoch=0)
    assert out["input_ids"].shape == out["decoder_input_ids"].shape == out["labels"].shape
    for row, n in enumerate(lengths):
        predicted = out["labels"][row] != -100
        assert predicted.sum() == round(0.5 * (n - 2))  # half the body, [CLS]/[SEP] excluded
        np.testing.assert_array_equal(out["labels"][row, predicted], original[row, predicted])
        np.testing.assert_array_equal(out["input_ids"][row, predicted], MASK)
        np.testing.assert_array_equal(
            out["input_ids"][row, :n][~predicted[:n]], original[row, :n][~predicted[:n]]
        )
        assert (out["decoder_input_ids"][row, :n][~predicted[:n]] == MASK).all()


def test_fragment_fraction_is_checked():
    with pytest.raises(ConfigError, match="^objective.fragment_fraction"):
        validate(
            compose_config(["model=bart_tiny", "objective=mass", "objective.fragment_fraction=1"])
        )


@pytest.mark.slow
def test_mass_demo_trains_with_falling_loss(prepared_corpus, tmp_path):
    run_dir = tmp_path / "mass"
    train_tiny(prepared_corpus, run_dir, "experiment=mass_demo")
    assert_loss_falls(run_dir)
    assert logged(run_dir, "train/accuracy")


def test_preview_shows_encoder_input_and_decoder_target(prepared_corpus):
    from tokenizers import Tokenizer

    from pretrain.data.preview import preview_records, render

    overrides = ["experiment=mass_demo", f"data.shards_dir={prepared_corpus}", "data.num_workers=0"]
    records, tokenizer_dir, _ = preview_records(overrides, 2)
    text = render(records[0], Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json"))
    encoder, target = text.split("\n")[1:]
    assert encoder.strip().startswith("encoder: [CLS]") and "[MASK]" in encoder
    shown = target.split()[1:]
    assert len(shown) == len(records[0]["labels"])
    assert sum(word != "_" for word in shown) >= len(shown) // 3  # about half the body
