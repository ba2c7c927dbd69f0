"""Greedy and beam search: the same tokens as `transformers` generate() on the same GPT-2
weights, exact search when the beam is wide enough, and beam search escaping greedy's traps."""

import itertools
import math

import pytest
import torch

from pretrain.export.gpt2 import to_hf
from pretrain.export.hf import write_hf_model
from pretrain.models.build import build_encoder
from pretrain.models.generation import beam_search, greedy_search, sequence_log_prob
from pretrain.models.gpt import CachedDecoderStep, KeyValueCache

transformers = pytest.importorskip("transformers")

VOCAB_SIZE, PAD = 20, 1
# A wide initialisation makes the next-token distributions peaked, so EOS is often chosen.
MODEL_CFG = {
    "name": "gpt_gen",
    "_target_": "pretrain.models.gpt.GPTModel",
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 2,
    "n_inner": None,
    "n_positions": 32,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.3,
}
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, tuple[torch.nn.Module, torch.nn.Module]]:
    """seed -> (our GPTModel, transformers GPT2LMHeadModel with the same weights)."""
    out = {}
    for seed in SEEDS:
        torch.manual_seed(seed)
        ours = build_encoder(MODEL_CFG, VOCAB_SIZE, PAD).eval()
        state_dict = {f"encoder.{k}": v for k, v in ours.state_dict().items()}
        runtime = {"vocab_size": VOCAB_SIZE, "pad_token_id": PAD}
        directory = tmp_path_factory.mktemp(f"gpt_gen_{seed}")
        write_hf_model(
            to_hf(state_dict, {"model": MODEL_CFG, "model_runtime": runtime}), directory, None
        )
        out[seed] = (ours, transformers.GPT2LMHeadModel.from_pretrained(directory).eval())
    return out


def step_of(model: torch.nn.Module, cached: bool = False):
    """Next-token logits recomputed from the whole prefix, or from a key/value cache."""
    if cached:
        return CachedDecoderStep(model)
    return lambda ids: model.logits(model(ids)[:, -1])


def prompts(seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB_SIZE, (3, 4), generator=torch.Generator().manual_seed(seed))


def hit_eos(step, prefix: torch.Tensor) -> int:
    """An EOS id that greedy search reaches in row 0 within 3 tokens, so rows finish early."""
    return int(greedy_search(step, prefix, 3, eos_id=None)[0, -1])


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_matches_transformers_generate(models, seed, cached):
    ours, reference = models[seed]
    prefix, step = prompts(seed), step_of(ours, cached)
    eos = hit_eos(step_of(ours), prefix)
    with torch.no_grad():
        tokens = greedy_search(step, prefix, 12, eos_id=eos, pad_id=PAD)
        expected = reference.generate(
            prefix,
            attention_mask=torch.ones_like(prefix),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=eos,
            pad_token_id=PAD,
        )
    assert (tokens[0, 4:] == eos).any()  # the EOS path is exercised
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("length_penalty", "early_stopping", "cached"),
    [(1.0, True, False), (0.0, True, True), (2.0, False, True), (1.0, "never", False)],
)
def test_beam_search_matches_transformers_generate(
    models, seed, length_penalty, early_stopping, cached
):
    ours, reference = models[seed]
    prefix, step = prompts(seed), step_of(ours, cached)
    eos = hit_eos(step_of(ours), prefix)
    with torch.no_grad():
        tokens = beam_search(
            step, prefix, 3, 12, eos, length_penalty, early_stopping=early_stopping, pad_id=PAD
        )
        expected = reference.generate(
            prefix,
            attention_mask=torch.ones_like(prefix),
            do_sample=False,
            num_beams=3,
            max_new_tokens=12,
            eos_token_id=eos,
            pad_token_id=PAD,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_score_is_at_least_greedys(models, seed):
    ours, _ = models[seed]
    prefix, step = prompts(seed), step_of(ours)
    with torch.no_grad():
        greedy = greedy_search(step, prefix, 6, eos_id=None)
        beam = beam_search(step, prefix, 4, 6, eos_id=None, length_penalty=0.0)
        greedy_score = sequence_log_prob(step, greedy, 4, None)
        beam_score = sequence_log_prob(step, beam, 4, None)
    assert (beam_score >= greedy_score - 1e-5).all(), (beam_score, greedy_score)


def second_order_step(table: torch.Tensor):
    """A toy model: the next-token logits are table[previous-but-one, previous token]."""
    return lambda ids: table[ids[:, -2], ids[:, -1]]


def test_a_wide_beam_finds_the_most_likely_sequence():
    vocab, new = 4, 3
    table = torch.randn(vocab, vocab, vocab, generator=torch.Generator().manual_seed(0)) * 2
    step = second_order_step(table)
    prefix = torch.tensor([[0, 1], [2, 3]])
    # num_beams >= vocab ** (new - 1): no hypothesis is ever pruned, so the search is exact
    beam = beam_search(step, prefix, vocab ** (new - 1), new, eos_id=None, length_penalty=0.0)
    for row in range(2):
        every = torch.tensor(
            [[*prefix[row].tolist(), *c] for c in itertools.product(range(vocab), repeat=new)]
        )
        scores = sequence_log_prob(step, every, 2, None)
        assert torch.equal(beam[row], every[scores.argmax()])
        greedy = greedy_search(step, prefix[row : row + 1], new, eos_id=None)
        assert sequence_log_prob(step, greedy, 2, None) <= scores.max() + 1e-6


def test_beam_search_escapes_a_greedy_trap():
    # After the prefix: token 1 (p=0.55) leads to a flat distribution, token 2 (p=0.45) to an
    # almost certain token 0. Greedy takes 1; two beams find 2, 0 (0.45 x 0.99 > 0.55 / 3).
    def step(ids: torch.Tensor) -> torch.Tensor:
        last = ids[:, -1]
        probs = torch.full((ids.shape[0], 3), 1 / 3)
        probs[last == 3] = torch.tensor([1e-6, 0.55, 0.45])
        probs[last == 2] = torch.tensor([0.99, 0.005, 0.005])
        return probs.log()

    prefix = torch.tensor([[3]])
    greedy = greedy_search(step, prefix, 2, eos_id=None)
    beam = beam_search(step, prefix, 2, 2, eos_id=None, length_penalty=0.0)
    assert greedy[0, 1] == 1 and beam[0, 1:].tolist() == [2, 0]
    assert math.isclose(
        float(sequence_log_prob(step, beam, 1, None)), math.log(0.45 * 0.99), rel_tol=1e-5
    )


def test_greedy_pads_finished_rows_and_stops_when_all_are_done():
    calls = []

    def step(ids: torch.Tensor) -> torch.Tensor:
        calls.append(ids.shape[1])
        logits = torch.zeros(ids.shape[0], 5)
        logits[0, 4] = 1  # row 0 ends at once (EOS = 4)
        logits[1, 2 if ids.shape[1] < 3 else 4] = 1  # row 1 after two tokens
        return logits

    out = greedy_search(step, torch.tensor([[0], [0]]), 10, eos_id=4, pad_id=3)
    assert out.tolist() == [[0, 4, 3, 3], [0, 2, 2, 4]]
    assert len(calls) == 3
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(step, torch.tensor([[0]]), 0, 5, eos_id=4)


def test_cached_decoding_gives_the_full_recomputations_logits(models):
    ours, _ = models[0]
    ids = prompts(0).repeat(1, 3)  # (3, 12)
    with torch.no_grad():
        full = ours.logits(ours(ids))  # (3, 12, vocab)
        cache = KeyValueCache(len(ours.layers))
        first = ours.logits(ours(ids[:, :5], cache=cache))  # prefill 5 positions
        two = ours.logits(ours(ids[:, 5:7], cache=cache))  # 2 at once, causal among them
        steps = [ours.logits(ours(ids[:, t : t + 1], cache=cache)) for t in range(7, 12)]
        cache.reorder(torch.tensor([2, 0, 1]))
        rows = ours.logits(ours(ids[[2, 0, 1], :1], cache=cache))
        reference = ours.logits(ours(torch.cat([ids, ids[:, :1]], dim=1)))[:, -1]
    incremental = torch.cat([first, two, *steps], dim=1)
    assert cache.length == 13
    assert torch.allclose(incremental, full, atol=1e-5)
    assert torch.allclose(rows[:, 0], reference[[2, 0, 1]], atol=1e-5)
    with pytest.raises(ValueError, match="n_positions"):
        ours(ids[:, :1].repeat(1, 20), cache=cache)
