"""MASS: the batch its corruption builds (fragment-only targets, decoder aligned with the
encoder, 80/10/10 on the encoder's fragment measured on the real stream) and the demo
training end to end with a falling loss."""

import numpy as np
import pytest
from test_noise import MASK, VOCAB, collated
from test_objectives_train import logged
from test_seq2seq import assert_loss_falls, train_tiny

from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.stream import EpochStream
from pretrain.objectives.mass import MassCorruption
from pretrain.runtime.run import build_stream

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_mass_batch_predicts_only_the_fragment():
    batch = collated()
    original, lengths = batch["input_ids"].copy(), batch["attention_mask"].sum(axis=1)
    out = MassCorruption(
        seed=0,
        pad_id=VOCAB.pad,
        mask_id=MASK,
        vocab_size=VOCAB.size,
        mask_token_probability=1.0,  # the whole fragment [MASK]
        random_token_probability=0.0,
    )(batch, epoch=0)
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


def test_real_stream_fragment_follows_80_10_10_in_the_encoder(prepared_corpus):
    cfg = compose_config(
        [f"data.shards_dir={prepared_corpus}", "model=bart_tiny", "objective=mass"]
    )
    _, spec, _ = build_stream(cfg)
    vocab_size = spec.vocab.size
    counts = np.zeros(3, np.int64)  # fragment tokens shown as [MASK], unchanged, other
    random_ids = []
    for index, batch in enumerate(EpochStream(spec, epoch=0)):
        if index == 8:
            break
        encoder, decoder = batch["input_ids"].numpy(), batch["decoder_input_ids"].numpy()
        labels = batch["labels"].numpy()
        fragment = labels != -100
        shown, original = encoder[fragment], labels[fragment]
        mask, same = shown == MASK, (shown == original) & (shown != MASK)
        counts += [mask.sum(), same.sum(), (~mask & ~same).sum()]
        random_ids.append(shown[~mask & ~same])
        # the decoder reads the true fragment shifted right, whatever the encoder shows
        rows, cols = np.nonzero(fragment[:, 1:] & fragment[:, :-1])
        np.testing.assert_array_equal(decoder[rows, cols + 1], labels[rows, cols])
    n = counts.sum()
    assert n > 5000
    # a random id is [MASK] or the original with probability 1/vocab_size each
    expected = np.array(
        [0.8 + 0.1 / vocab_size, 0.1 + 0.1 / vocab_size, 0.1 * (1 - 2 / vocab_size)]
    )
    tolerance = 4 * np.sqrt(expected * (1 - expected) / n)  # 4 binomial standard errors
    assert (np.abs(counts / n - expected) < tolerance).all(), (counts / n, tolerance)
    random_ids = np.concatenate(random_ids)
    assert random_ids.min() >= 0 and random_ids.max() < vocab_size
    assert len(np.unique(random_ids)) > 0.5 * len(random_ids)  # spread over the vocabulary


@pytest.mark.parametrize(
    "override", ["objective.mask_token_probability=1.1", "objective.random_token_probability=0.3"]
)
def test_mass_replacement_split_is_checked(override):
    with pytest.raises(ConfigError, match="^objective.(mask|random)_token_probability"):
        validate(compose_config(["model=bart_tiny", "objective=mass", override]))


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

    from pretrain.runtime.preview import preview_records, render

    overrides = ["experiment=mass_demo", f"data.shards_dir={prepared_corpus}", "data.num_workers=0"]
    records, tokenizer_dir, _ = preview_records(overrides, 2)
    text = render(records[0], Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json"))
    encoder, target = text.split("\n")[1:]
    assert encoder.strip().startswith("encoder: [CLS]") and "[MASK]" in encoder
    shown = target.split()[1:]
    assert len(shown) == len(records[0]["labels"])
    assert sum(word != "_" for word in shown) >= len(shown) // 3  # about half the body
