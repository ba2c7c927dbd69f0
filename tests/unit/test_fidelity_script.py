"""benchmarks/fidelity.py on a few real batches of the test corpus: its figures come out
(ELECTRA's all-[MASK] split, ERNIE's phrases masked whole from the phrase level on), so the
script keeps working as the stream changes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import fidelity  # noqa: E402


def figures(rows) -> dict[tuple[str, str], str]:
    return {(name, statistic): measured for name, statistic, _, measured in rows}


def test_fidelity_figures_on_a_few_batches(prepared_annotated_corpus):
    electra = figures(fidelity.run_electra(prepared_annotated_corpus, None, 3))
    name = "ELECTRA (generator input)"
    assert electra[(name, "[MASK] / random / unchanged")] == "100.0% / 0.0% / 0.0%"
    assert 14 <= float(electra[(name, "masked tokens")].rstrip("%")) <= 16
    ernie = figures(fidelity.run_ernie(prepared_annotated_corpus, None, 3))
    for level in ("phrase", "entity"):
        whole = ernie[(f"ERNIE ({level} level)", "phrases of 2+ words masked in part")]
        assert whole.startswith("0.0% of ") and int(whole.split()[-1]) > 10
    assert ernie[("ERNIE (entity level)", "units cut inside a word")] == "0.0%"
