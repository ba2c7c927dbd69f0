"""benchmarks/memory.py's growth figures: one logged point against robust levels (issue 18's
"no more than 5% from step 300 to step 3,000")."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import memory  # noqa: E402


def rows(totals: list[float], every: int = 100) -> list[tuple[int, float, float, float]]:
    """(step, main, workers, total) rows logged every `every` steps, the total split 2:1."""
    return [(every * (i + 1) - 1, t * 2 / 3, t / 3, t) for i, t in enumerate(totals)]


def test_a_transient_last_point_is_not_growth():
    flat = rows([1.0] * 29 + [1.06])  # the last sample caught a step's transient allocations
    assert memory.growth(flat, 300) == pytest.approx(0.06)
    level, trend = memory.robust_growth(flat, 300)
    assert level == pytest.approx(0.0) and abs(trend) < 0.02  # the line leans 1.2%


def test_a_steady_rise_is_reported_by_every_figure():
    rising = rows([1.0 + 0.01 * i for i in range(30)])  # +1% of the start a logged step
    level, trend = memory.robust_growth(rising, 300)
    start = rising[2][3]  # step 299: after 300 optimizer steps
    assert memory.growth(rising, 300) == pytest.approx(rising[-1][3] / start - 1)
    assert trend == pytest.approx(rising[-1][3] / start - 1, rel=1e-6)  # a line fits exactly
    assert level == pytest.approx(rising[-3][3] / rising[4][3] - 1)  # medians of 5 points
    assert level > 0.2
