"""The order a chunk's sequences leave a partition in (`stream.shuffled_sequences`): a uniform
random permutation, which under a context-extension stage trades only sequences of one
length."""

import numpy as np

from pretrain.data.stream import shuffled_sequences


def test_every_sequence_once_and_each_place_as_likely():
    n, draws = 8, 4000
    places = np.zeros(n, dtype=int)
    made = [{"i": i} for i in range(n)]
    for seed in range(draws):
        shuffled = shuffled_sequences(made, np.random.default_rng(seed), None)
        assert sorted(s["i"] for s in shuffled) == list(range(n))
        places[[s["i"] for s in shuffled].index(0)] += 1
    expected = draws / n
    chi_square = float(((places - expected) ** 2 / expected).sum())
    assert chi_square < 24.32, places  # chi-square, 7 degrees of freedom, p = 0.001


def test_adjacent_pieces_are_parted_as_often_as_chance():
    n, draws = 20, 2000
    made = [{"i": i} for i in range(n)]
    kept = 0
    for seed in range(draws):
        order = [s["i"] for s in shuffled_sequences(made, np.random.default_rng(seed), None)]
        kept += sum(b == a + 1 for a, b in zip(order, order[1:], strict=False))
    # E[pairs made one after the other that stay so] = (n - 1) / n for a uniform permutation
    assert abs(kept / draws - (n - 1) / n) < 0.1


def test_a_stage_boundary_keeps_every_place_its_length():
    lengths = [64] * 5 + [128] * 4
    made = [{"i": i, "length": length} for i, length in enumerate(lengths)]
    moved = set()
    for seed in range(50):
        shuffled = shuffled_sequences(made, np.random.default_rng(seed), lengths.__getitem__)
        assert [s["length"] for s in shuffled] == lengths
        assert sorted(s["i"] for s in shuffled) == list(range(9))
        moved |= {place for place, s in enumerate(shuffled) if s["i"] != place}
    assert moved == set(range(9))  # both runs are shuffled, not kept in place
