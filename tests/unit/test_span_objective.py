"""SpanBERT: truncated geometric span lengths (also measured on the real stream), span invariants, span-boundary targets, the SBO
head and loss, and the config checks."""

import numpy as np
import pytest
import torch
from conftest import tiny_module_config
from test_unit_masking import (
    CLS,
    MASK_ID,
    SPECIAL,
    VOCAB,
    assert_80_10_10_per_unit,
    candidates_of,
    corrupt,
    group_ids,
    make_word_batch,
    masked_batches,
    whole_groups,
)

from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import IGNORE_INDEX, word_start_flags
from pretrain.data.span_masking import (
    sample_lengths,
    select_spans,
    truncated_geometric_probabilities,
)
from pretrain.data.vocab import Vocabulary
from pretrain.models.heads import SpanBoundaryHead
from pretrain.objectives.span import SpanBert, SpanCorruption

P, MAX_WORDS = 0.2, 10


def truncated_geometric_law(p: float, m: int) -> tuple[np.ndarray, float]:
    """Law and mean of G ~ Geometric(p) on 1, 2, ... conditioned on G <= m (SpanBERT's
    sampler): P(k) = p (1-p)^(k-1) / (1 - (1-p)^m) for k = 1..m, whose mean is
    1/p - m (1-p)^m / (1 - (1-p)^m)."""
    k = np.arange(1, m + 1)
    law = p * (1 - p) ** (k - 1) / (1 - (1 - p) ** m)
    mean = float((k * law).sum())
    assert mean == pytest.approx(1 / p - m * (1 - p) ** m / (1 - (1 - p) ** m))
    return law, mean


def test_span_lengths_are_truncated_geometric():
    law, mean = truncated_geometric_law(P, MAX_WORDS)
    # SpanBERT's figures: mean 3.8 words, 3.0% of spans at 10 words (nothing piled up there)
    assert law.sum() == pytest.approx(1.0) and mean == pytest.approx(3.7971, abs=1e-4)
    assert law[-1] == pytest.approx(0.0301, abs=1e-4)
    np.testing.assert_allclose(truncated_geometric_probabilities(P, MAX_WORDS), law)
    n = 100_000
    lengths = sample_lengths(np.random.default_rng(0).random(n), law)
    assert lengths.min() == 1 and lengths.max() == MAX_WORDS
    counts = np.bincount(lengths, minlength=MAX_WORDS + 1)[1:]
    expected = law * n
    assert ((counts - expected) ** 2 / expected).sum() < 27.88  # chi-square 9 dof, 99.9%
    variance = float((np.arange(1, MAX_WORDS + 1) ** 2 * law).sum() - mean**2)
    assert abs(lengths.mean() - mean) < 4 * np.sqrt(variance / n)
    uniform = np.random.default_rng(0).random(1000)
    assert sample_lengths(uniform, truncated_geometric_probabilities(1.0, MAX_WORDS)).max() == 1


def span_units(selected: np.ndarray, unit_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first-token flags, group id per token) of the spans `select` reports, checking that
    each is one contiguous run of selected tokens starting at its unit start."""
    length = selected.shape[1]
    first = selected & (unit_start == np.arange(length))
    units = group_ids(first | ~selected)
    run_start = np.flatnonzero((first | ~selected).ravel()) % length
    np.testing.assert_array_equal(unit_start[selected], run_start[units[selected.ravel()]])
    return first, units


def test_spans_are_whole_words_without_overlap_and_fill_the_budget():
    batch = make_word_batch(2000, 128, seed=11)
    candidates = candidates_of(batch)
    corruption = SpanCorruption(
        seed=7, vocab_size=VOCAB, mask_token_id=MASK_ID, special_ids=SPECIAL
    )
    selected, unit_start = corruption.select(dict(batch), candidates, key_hashes(batch["keys"]), 0)
    assert not (selected & ~candidates).any()
    first, units = span_units(selected, unit_start)
    word_starts = batch["word_starts"]
    assert word_starts[first].all()  # spans start at word starts ...
    after = np.zeros_like(selected)
    after[:, :-1] = selected[:, :-1] & ~(selected[:, 1:] & ~first[:, 1:])  # last token of a span
    next_starts_word = np.zeros_like(selected)
    next_starts_word[:, :-1] = word_starts[:, 1:] | ~candidates[:, 1:]
    assert next_starts_word[after].all()  # ... and end at word ends
    words = group_ids(word_starts)
    chosen, size = whole_groups(selected, words, candidates)
    assert ((chosen == 0) | (chosen == size)).all()
    span_words = np.bincount(units[selected.ravel()], weights=word_starts[selected])
    span_words = span_words[np.bincount(units[selected.ravel()]) > 0]
    assert span_words.min() >= 1 and span_words.max() <= MAX_WORDS
    assert (span_words >= 5).mean() > 0.1  # long spans do occur
    budget = np.maximum(np.rint(candidates.sum(1) * 0.15), 1)
    assert ((selected.sum(1) <= budget) | (first.sum(1) == 1)).all()
    assert selected.sum() / candidates.sum() == pytest.approx(0.15, abs=0.005)
    out = corrupt(SpanCorruption, batch)
    np.testing.assert_array_equal(out["labels"] != IGNORE_INDEX, selected)
    assert_80_10_10_per_unit(batch, out, units)


def test_mean_span_length_matches_the_truncated_geometric():
    # long rows of one-token words: spans are rarely cut short by the row's end, a masked
    # neighbour or the budget; those cuts can only shorten spans, by a few percent here
    n_rows, length = 300, 1024
    candidates = np.ones((n_rows, length), bool)
    candidates[:, [0, -1]] = False
    keys = key_hashes([f"r{i}" for i in range(n_rows)])
    selected, unit_start = select_spans(
        candidates, candidates, keys, seed=3, epoch=0, probability=0.15
    )
    first, _ = span_units(selected, unit_start)
    realized = selected.sum() / first.sum()  # words per span
    _, mean = truncated_geometric_law(P, MAX_WORDS)
    assert 0.88 * mean < realized < mean, (realized, mean)


def real_span_words(cfg, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """Spans of the real stream of `cfg` (every batch of `epochs` epochs), in words, split into
    (ended freely: the next token is an unmasked word of the same run, so the span stopped
    at its drawn length or at the row's budget; stopped by the end of its run of candidates
    or by a span masked before it, so its drawn length was at least what it shows)."""
    free, stopped = [], []
    for epoch in range(epochs):
        for batch, selected, candidates in masked_batches(cfg, 10**6, epoch):
            words = word_start_flags(batch["word_starts"], candidates)
            inside = selected & (batch["span_position"] > 0)  # not a span's first token
            for row, start in np.argwhere(selected & (batch["span_position"] == 0)):
                end = start + 1
                while end < selected.shape[1] and inside[row, end]:
                    end += 1
                n_words = int(words[row, start:end].sum())
                blocked = end == selected.shape[1] or not candidates[row, end] or selected[row, end]
                (stopped if blocked else free).append(n_words)
    return np.array(free), np.array(stopped)


def test_real_stream_span_lengths_follow_spanbert_truncated_geometric(prepared_corpus):
    # long rows, so that the row's budget cuts few spans (about one in 70); the end of a
    # document and earlier spans cut many, which the product-limit (Kaplan-Meier) estimate
    # accounts for: a stopped span of l words says only "drawn length >= l"
    cfg = compose_config(
        [
            f"data.shards_dir={prepared_corpus}",
            "objective=span",
            "data=full_sentences",
            "data.max_seq_length=2048",
            "model.max_position_embeddings=2048",
            "data.batch_size=4",
        ]
    )
    free, stopped = real_span_words(cfg, epochs=3)
    assert free.max() <= MAX_WORDS and stopped.max() <= MAX_WORDS
    free = np.concatenate([free, stopped[stopped == MAX_WORDS]])  # at 10 it is the full length
    stopped = stopped[stopped < MAX_WORDS]
    n = len(free)
    assert n > 3000
    estimate, survival = np.zeros(MAX_WORDS), 1.0
    for k in range(1, MAX_WORDS + 1):
        at_risk = (free >= k).sum() + (stopped > k).sum()
        estimate[k - 1] = survival * (free == k).sum() / at_risk
        survival -= estimate[k - 1]
    law, mean = truncated_geometric_law(P, MAX_WORDS)
    lengths = np.arange(1, MAX_WORDS + 1)
    variance = float((lengths**2 * law).sum() - mean**2)
    # tolerances: 4 standard errors of n spans (n counts only the freely ended ones, so the
    # bound is loose); a clipped geometric (mean 4.46, 13.4% at 10) fails both by far
    assert abs((lengths * estimate).sum() - mean) < 4 * np.sqrt(variance / n), estimate
    assert abs(estimate[-1] - law[-1]) < 4 * np.sqrt(law[-1] * (1 - law[-1]) / n), estimate


def test_span_boundary_targets_line_up_with_spans():
    batch = make_word_batch(300, 96, seed=12)
    candidates = candidates_of(batch)
    out = corrupt(SpanCorruption, batch)
    corruption = SpanCorruption(
        seed=7, vocab_size=VOCAB, mask_token_id=MASK_ID, special_ids=SPECIAL
    )
    selected, unit_start = corruption.select(dict(batch), candidates, key_hashes(batch["keys"]), 0)
    predicted = out["labels"] != IGNORE_INDEX
    np.testing.assert_array_equal(predicted, selected)
    for name in ("span_left", "span_right", "span_position"):
        assert out[name].dtype == np.int64 and out[name].shape == predicted.shape
        assert (out[name][~predicted] == 0).all()
    n_spans = 0
    for row in range(len(batch["keys"])):
        for start in np.flatnonzero(selected[row] & (unit_start[row] == np.arange(96))):
            span = np.flatnonzero(selected[row] & (unit_start[row] == start))
            end = span[-1]
            np.testing.assert_array_equal(span, np.arange(start, end + 1))
            assert (out["span_left"][row, span] == start - 1).all()
            assert (out["span_right"][row, span] == end + 1).all()
            np.testing.assert_array_equal(out["span_position"][row, span], np.arange(len(span)))
            n_spans += 1
    assert n_spans > 600
    # boundaries are real tokens of the row, outside the span ([CLS] at most on the left)
    rows = np.nonzero(predicted)[0]
    left, right = out["span_left"][predicted], out["span_right"][predicted]
    assert (left >= 0).all() and (batch["attention_mask"][rows, right] == 1).all()
    assert (batch["input_ids"][rows, left][left == 0] == CLS).all()


def test_span_boundary_head_shapes_tied_decoder_and_position_clipping():
    embeddings = torch.nn.Embedding(50, 16)
    head = SpanBoundaryHead(16, 8, 1e-12, embeddings, initializer_range=0.02)
    assert head.decoder.weight is embeddings.weight
    left, right = torch.randn(1, 16).expand(5, 16), torch.randn(1, 16).expand(5, 16)
    logits = head(left, right, torch.tensor([0, 1, 7, 8, 100]))
    assert logits.shape == (5, 50)
    torch.testing.assert_close(logits[3], logits[2])  # positions past the table share the last
    torch.testing.assert_close(logits[4], logits[2])
    assert not torch.allclose(logits[0], logits[1])  # the position embedding matters
    other = head(torch.randn(1, 16), right[:1], torch.tensor([0]))
    assert not torch.allclose(other[0], logits[0])  # and so do the boundaries
    with pytest.raises(ValueError, match="hidden_size"):
        SpanBoundaryHead(32, 8, 1e-12, embeddings)


def tiny_span_module(vocab: Vocabulary) -> SpanBert:
    config = tiny_module_config(
        {"pair_task": "none", "sbo_max_span_tokens": 30},
        data={"max_seq_length": 64, "format": "full_sentences"},
        optim={},
        trainer={"max_steps": 10},
    )
    return SpanBert(config, vocab)


def test_sbo_loss_is_added_and_decreases_in_a_few_steps():
    torch.manual_seed(0)
    vocab = Vocabulary(size=300, pad=0, unk=1, cls=2, sep=3, mask=4)
    module = tiny_span_module(vocab)
    assert module.sbo_head.decoder.weight is module.encoder.word_embeddings.weight
    assert module.pair_task == "none" and module.sentence_head is None
    batch = make_word_batch(16, 64, seed=13, vocab=vocab.size)
    corruption = SpanCorruption(
        seed=1, vocab_size=vocab.size, mask_token_id=vocab.mask, special_ids=vocab.special_ids
    )
    batch = corruption(batch, epoch=0)
    tensors = {k: torch.from_numpy(v) for k, v in batch.items() if k != "keys"}
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        out = module(tensors)
        assert out["loss"].item() == pytest.approx((out["mlm_loss"] + out["sbo_loss"]).item())
        losses.append(out["sbo_loss"].item())
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    assert losses[0] == pytest.approx(np.log(vocab.size), abs=0.5)
    assert losses[-1] < losses[0] - 1.0, losses
    # the SBO gradient reaches the boundary hidden states: the encoder learns from it
    module.zero_grad()
    module.extra_losses(module.encoder(tensors["input_ids"]), tensors)["sbo_loss"].backward()
    assert module.encoder.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["objective.span_geometric_p=1.5"], "objective.span_geometric_p"),
        (["objective.span_geometric_p=0"], "objective.span_geometric_p"),
        (["objective.span_max_words=0"], "objective.span_max_words"),
        (["objective.sbo_max_span_tokens=0"], "objective.sbo_max_span_tokens"),
        (["objective.pair_task=nsp"], "objective.pair_task"),
    ],
)
def test_bad_span_settings_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["objective=span", "data=full_sentences", *overrides]))
    assert str(error.value).startswith(key)


@pytest.mark.parametrize("data", ["segment_pair", "sentence_pair"])
def test_span_rejects_pair_formats(data):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["objective=span", f"data.format={data}"]))
    message = str(error.value)
    assert message.startswith("data.format") and "objective=span" in message
    assert "data=full_sentences" in message
