"""benchmarks/budget.py --merge: the families of two `--only` processes, joined into one
table in FAMILIES' order; mixed budgets or seeds, or a family twice, are refused."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import budget  # noqa: E402

NAMES = [name for name, *_ in budget.FAMILIES]


def result(name: str, budget_s: float = 150.0, seed: int = 0) -> dict:
    scores = {m: {t: (0.7, 0.5) for t in budget.DEMO_TASKS} for m in budget.RECIPES}
    return {
        "name": name,
        "steps": 100,
        "s_per_step": 0.05,
        "mlm_loss": 5.5,
        "trained_s": 200.0,
        "eval": scores,
        "budget_s": budget_s,
        "seed": seed,
    }


def log(path: Path, *results: dict) -> Path:
    """A process's output: training chatter around its JSON lines."""
    lines = ["step 20/40 (50%), loss 6.1570", *(json.dumps(r) for r in results), "| family |"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_two_processes_output_is_one_table_in_family_order(tmp_path):
    first = log(tmp_path / "a.log", result(NAMES[3]), result(NAMES[0]))
    second = log(tmp_path / "b.log", result(NAMES[2], seed=0), result(NAMES[1]))
    results, budget_s, seed = budget.merged([first, second])
    assert [r["name"] for r in results] == NAMES
    assert (budget_s, seed) == (150.0, 0)
    rows = budget.table(results, budget_s, seed).splitlines()[4:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == NAMES
    assert all("+20.0" in row for row in rows)  # 0.7 - 0.5 in accuracy points


@pytest.mark.parametrize(
    "lines",
    [
        [result(NAMES[0]), result(NAMES[0])],  # a family twice
        [result(NAMES[0]), result(NAMES[1], seed=1)],  # another seed
        [result(NAMES[0]), result(NAMES[1], budget_s=300.0)],  # another budget
        [{k: v for k, v in result(NAMES[0]).items() if k != "seed"}],  # printed before --merge
        [result("BERT-large")],  # not a family
        [],  # no results at all
    ],
)
def test_outputs_that_do_not_make_one_table_are_refused(tmp_path, lines):
    with pytest.raises(SystemExit, match="--merge"):
        budget.merged([log(tmp_path / "a.log", *lines)])
