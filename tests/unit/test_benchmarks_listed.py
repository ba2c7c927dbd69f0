"""Every script in benchmarks/ has a smoke run (issue 51 item 10): an entry in
tests/integration/test_benchmarks_smoke.py's SMOKES, a test file of COVERED_ELSEWHERE that
names it, or a reason in NOT_RUN. A new benchmark without one fails here, so it cannot rot
unnoticed as bench_model.py did."""

from pathlib import Path

import test_benchmarks_smoke as smoke

REPO = Path(__file__).resolve().parents[2]


def test_every_benchmark_script_has_a_smoke_run():
    scripts = {p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    listed = smoke.SMOKES.keys() | smoke.COVERED_ELSEWHERE.keys() | smoke.NOT_RUN.keys()
    missing = sorted(scripts - listed)
    assert not missing, (
        f"benchmarks/{missing[0]}: no smoke run; add it to SMOKES in "
        "tests/integration/test_benchmarks_smoke.py (tiny arguments, a line of its table)"
    )
    assert not listed - scripts, f"listed but not in benchmarks/: {sorted(listed - scripts)}"


def test_each_script_is_listed_once_and_its_other_test_names_it():
    tables = (smoke.SMOKES, smoke.COVERED_ELSEWHERE, smoke.NOT_RUN)
    assert sum(len(t) for t in tables) == len(set().union(*tables))
    gpu_check = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    for script, test_file in smoke.COVERED_ELSEWHERE.items():
        text = (REPO / test_file).read_text()
        runs_it = script in text or ("gpu_check.sh" in text and f"benchmarks/{script}" in gpu_check)
        assert runs_it, f"{test_file} does not run benchmarks/{script}"
