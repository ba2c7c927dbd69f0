"""benchmarks/memory.py's growth figures: one logged point against robust levels (issue 18's
"no more than 5% from step 300 to step 3,000")."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import memory  # noqa: E402


def rows(totals: list[float], every: int = 100, anon: list[float] | None = None) -> list[tuple]:
    """(step, main, workers, total, anonymous) rows logged every `every` steps, the total split
    2:1, the anonymous pages half the total unless given."""
    anon = anon or [t / 2 for t in totals]
    return [
        (every * (i + 1) - 1, t * 2 / 3, t / 3, t, a)
        for i, (t, a) in enumerate(zip(totals, anon, strict=True))
    ]


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


def test_the_anonymous_pages_are_measured_on_their_own(tmp_path):
    """A step of the file-backed pages (other processes on the machine ended) moves the total,
    not the anonymous pages, which are what a leak grows."""
    totals = [1.0] * 15 + [1.09] * 15
    level, _ = memory.robust_growth(rows(totals, anon=[0.5] * 30), 300)
    anon_level, anon_trend = memory.robust_growth(rows(totals, anon=[0.5] * 30), 300, column=4)
    assert level == pytest.approx(0.09) and anon_level == 0 and anon_trend == pytest.approx(0)
    version = tmp_path / "csv" / "version_0"
    version.mkdir(parents=True)
    (version / "metrics.csv").write_text(
        "step,sys/host_memory_main_gb,sys/host_memory_workers_gb,sys/host_memory_gb,"
        "sys/host_anon_memory_gb,train/loss\n"
        "99,0.5,0.25,0.75,0.4,\n49,,,,,3.0\n199,0.5,0.3,0.8,,\n"
    )  # a training-loss row without memory; a row from before the anonymous figure existed
    read = memory.memory_rows(tmp_path)
    assert [r[:4] for r in read] == [(99, 0.5, 0.25, 0.75), (199, 0.5, 0.3, 0.8)]
    assert read[0][4] == 0.4 and read[1][4] != read[1][4]  # NaN
