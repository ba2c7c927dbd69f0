"""The mixing schedule of data.sources (data/mixing.py): exact shares per block, spread evenly,
and located samples that number each source's own order without gaps."""

import numpy as np
import pytest

from pretrain.data.mixing import PhasedMix, block_counts, mix_schedule, source_shares

SHARES = [[0.7, 0.3], [0.5, 0.3, 0.2], [0.13, 0.29, 0.58], [0.01, 0.99], [0.61, 0.27, 0.07, 0.05]]


def sources_of(schedule, samples: int) -> np.ndarray:
    return np.array([schedule.locate(i)[0] for i in range(samples)])


@pytest.mark.parametrize("shares", SHARES)
@pytest.mark.parametrize("block", [100, 1000])
def test_every_window_of_a_block_holds_each_share_within_one_sample(shares, block):
    schedule = mix_schedule([f"s{i}" for i in range(len(shares))], shares, block)
    picks = sources_of(schedule, 10_000)
    for s, share in enumerate(shares):
        assert abs(schedule.counts[s] - share * block) < 1
        seen = np.concatenate([[0], np.cumsum(picks == s)])
        windows = seen[block:] - seen[:-block]  # every window of a block, aligned or not
        assert abs(windows - share * block).max() < 1, s
        assert abs(seen[-1] - share * 10_000) < 10_000 / block
        # shorter windows too: within 2 samples of the share (1 for two sources)
        for length in (7, 33, block // 3):
            short = seen[length:] - seen[:-length]
            assert abs(short - share * length).max() < (1 if len(shares) == 2 else 2)


@pytest.mark.parametrize("shares", SHARES)
def test_each_sources_samples_are_numbered_in_order_and_counted_before_any_sample(shares):
    schedule = mix_schedule([f"s{i}" for i in range(len(shares))], shares, 100)
    located = [schedule.locate(i) for i in range(1234)]
    for s in range(len(shares)):
        assert [k for t, k in located if t == s] == list(range(sum(t == s for t, _ in located)))
    for i in (0, 1, 99, 100, 101, 777, 1234):
        assert schedule.counts_before(i) == tuple(
            sum(t == s for t, _ in located[:i]) for s in range(len(shares))
        )


def test_the_schedule_is_a_function_of_the_shares_and_block_alone():
    """No seed, rank, worker or batch size enters it: two builds agree sample for sample."""
    one = mix_schedule(["a", "b", "c"], [0.5, 0.3, 0.2], 1000)
    two = mix_schedule(["a", "b", "c"], [0.5, 0.3, 0.2], 1000)
    assert np.array_equal(sources_of(one, 5000), sources_of(two, 5000))


def test_shares_from_weights_or_epochs_and_rounding():
    assert source_shares([3, 1], [None, None], [10, 1000]) == [0.75, 0.25]
    assert source_shares([None, None], [1, 2], [300, 100]) == [0.6, 0.4]  # passes x tokens
    assert block_counts([1 / 3, 1 / 3, 1 / 3], 10) == (4, 3, 3)
    with pytest.raises(ValueError, match="'tiny'"):
        mix_schedule(["big", "tiny"], [0.999, 0.001], 100)


def phased(epoch_tokens: int = 64 * 500) -> PhasedMix:
    """Three sources: a 70/30 mix of a, b for 2,000 tokens (samples 0 .. 31 of 64 tokens),
    then b dropped and c added, a and c half and half (objective.stages' source_weights)."""
    names = ["a", "b", "c"]
    first = mix_schedule(names, [0.7, 0.3, 0.0], 10)
    second = mix_schedule(names, [0.5, 0.0, 0.5], 10)
    return PhasedMix((first, second), (2000,), 64, epoch_tokens)


def test_a_mix_per_phase_holds_each_phases_shares_and_continues_each_source():
    mix = phased().of_epoch(0)
    located = [mix.locate(i) for i in range(232)]  # 32 samples of phase 0, 200 of phase 1
    sources = np.array([s for s, _ in located])
    assert mix.starts == (0, 32)  # ceil(2000 / 64)
    assert list(sources[:30]).count(0) == 21 and 2 not in sources[:32]
    assert 1 not in sources[32:] and list(sources[32:]).count(0) == 100  # 50/50 of 200
    for s in range(3):  # each source numbered without gaps across the phase change
        assert [k for src, k in located if src == s] == list(range((sources == s).sum()))
    for i in range(0, 233, 7):
        assert mix.counts_before(i) == tuple(int((sources[:i] == s).sum()) for s in range(3))
    for i, (s, k) in enumerate(located):
        assert mix.index_of(s, k) == i


def test_a_later_epoch_is_in_the_last_phase_from_its_first_sample():
    mix = phased().of_epoch(1)  # progress starts at T = 32,000 tokens > 2,000
    assert mix.starts == (0, 0)
    assert {mix.locate(i)[0] for i in range(100)} == {0, 2}
    short = phased(epoch_tokens=1000).of_epoch(0)  # an epoch shorter than phase 0
    assert short.starts[1] >= 1 << 60 and {short.locate(i)[0] for i in range(100)} == {0, 1}
