"""Golden loss curves: every objective's first steps on the test corpus, compared with the
values stored in tests/golden/<case>.json (relative tolerance 1e-5; absolute 1e-6 for losses
near zero, such as a student's KL to its teacher, whose rounding is not relative to its value).

Each case is a real run (`pretrain.runtime.run.train`: config composition, stream, objective module,
Lightning Trainer) of a tiny model for `STEPS` optimizer steps, one thread, fixed seed,
single process, no data-loader workers; its per-step losses come from the run's CSV log.
Every other numerics test is relative (resumed == uninterrupted, DDP == one process, "the loss
falls"); these catch a change that shifts every mask or every initial weight.

When a change is meant to alter numerics, regenerate the stored curves and commit them with it:

    make golden    # = REGENERATE_GOLDEN=1 OMP_NUM_THREADS=1 pytest tests/integration/test_golden.py
"""

import csv
import json
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.runtime.run import train

GOLDEN_DIR = Path(__file__).parents[1] / "golden"
REGENERATE = os.environ.get("REGENERATE_GOLDEN") == "1"
STEPS = 5
RELATIVE_TOLERANCE = 1e-5
# a KL of two nearly equal distributions (0.0024) rounds by ~1e-7 across CPUs' kernels
ABSOLUTE_TOLERANCE = 1e-6


def golden_cases(directory: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """case -> (corpus fixture of this module, overrides), read from `directory`'s
    `<case>.json` files: their "overrides" and their "corpus" (default golden_corpus); a
    "{teacher}" in an override is replaced by the teacher checkpoint's path. A new case is a
    json with "case" and "overrides" only, whose losses `make golden` writes in."""
    cases = {}
    for path in sorted(directory.glob("*.json")):
        record = json.loads(path.read_text())
        cases[path.stem] = (record.get("corpus", "golden_corpus"), tuple(record["overrides"]))
    return cases


CASES = golden_cases(GOLDEN_DIR)
# The distillation teacher: a fresh BERT-tiny after a few MLM steps (the mlm_nsp case's model)
TEACHER = ("objective=mlm", "model=bert_tiny", "data=full_sentences")


def run_overrides(shards_dir: Path, run_dir: Path, overrides: tuple[str, ...]) -> list[str]:
    """The shared settings of every golden run, then the case's `overrides`."""
    return cpu_run_overrides(
        shards_dir,
        run_dir,
        "seed=7",
        "resume=never",
        "data.num_workers=0",
        "data.random_document_pool=20",
        "data.shuffle_buffer_documents=20",
        "optim.warmup_steps=2",
        "optim.optimizer.lr=1e-3",
        f"trainer.max_steps={STEPS}",
        "trainer.log_every_n_steps=1",
        *overrides,
        batch_size=4,
    )


def logged_losses(run_dir: Path) -> dict[str, list[float | None]]:
    """Every `train/*loss` column of the run's CSV log, one value per optimizer step (None
    where a step did not log it), as Python floats (repr keeps every digit)."""
    by_step: dict[int, dict[str, str]] = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                losses = {k: v for k, v in row.items() if v and k.endswith("loss")}
                if losses:  # rows of the step's metrics (progress rows hold counts only)
                    by_step.setdefault(int(row["step"]), {}).update(losses)
    assert sorted(by_step) == list(range(STEPS)), sorted(by_step)
    columns = sorted({k for row in by_step.values() for k in row if k.endswith("loss")})
    return {
        column: [float(by_step[s][column]) if column in by_step[s] else None for s in range(STEPS)]
        for column in columns
    }


def run_case(shards_dir: Path, run_dir: Path, overrides: tuple[str, ...]) -> Path:
    """Train one golden run with one torch thread (restored afterwards); returns its run dir."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(compose_config(run_overrides(shards_dir, run_dir, overrides)))
    finally:
        torch.set_num_threads(threads)
    return run_dir


@pytest.fixture(scope="module")
def golden_corpus(prepared_corpus) -> Path:
    """The session's `prepared_corpus` (its document keys do not depend on its path)."""
    return prepared_corpus


@pytest.fixture(scope="module")
def golden_annotated_corpus(prepared_annotated_corpus) -> Path:
    """The session's `prepared_annotated_corpus` (its keys do not depend on its path)."""
    return prepared_annotated_corpus


@pytest.fixture(scope="module")
def teacher_checkpoint(golden_corpus, tmp_path_factory) -> Path:
    run_dir = run_case(golden_corpus, tmp_path_factory.mktemp("golden_teacher"), TEACHER)
    return run_dir / "checkpoints" / "last.ckpt"


def assert_close(case: str, got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want), f"{case}: logged losses {sorted(got)} != {sorted(want)}"
    for column, values in want.items():
        for step, (a, b) in enumerate(zip(got[column], values, strict=True)):
            ok = (a is None and b is None) or (
                a is not None
                and b is not None
                and math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)
            )
            assert ok, (
                f"{case}: {column} at step {step} is {a!r}, the golden value is {b!r}; if the "
                "change is meant to alter numerics, run `make golden` and commit tests/golden/"
            )


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_loss_curve(case, request, tmp_path):
    fixture, overrides = CASES[case]
    if "{teacher}" in " ".join(overrides):
        teacher = request.getfixturevalue("teacher_checkpoint")
        overrides = tuple(o.replace("{teacher}", str(teacher)) for o in overrides)
    shards_dir = request.getfixturevalue(fixture)
    losses = logged_losses(run_case(shards_dir, tmp_path / case, overrides))
    path = GOLDEN_DIR / f"{case}.json"
    golden = json.loads(path.read_text())
    if REGENERATE:
        record = golden | {"case": case, "steps": STEPS, "losses": losses}
        path.write_text(json.dumps(record, indent=1) + "\n")
        return
    assert "losses" in golden, f"{path}: no golden curve; run `make golden` and commit it"
    assert golden.get("steps") == STEPS, f"{path}: made for other steps; run `make golden`"
    assert_close(case, losses, golden["losses"])
