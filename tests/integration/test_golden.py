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

import contextlib
import csv
import json
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import ENGLISH_ENTITIES, cpu_run_overrides, prepare_small_corpus

from data_pipelines.prepare_config import EntitySettings, PhraseSettings
from pretrain.config import compose_config
from pretrain.runtime.run import train

GOLDEN_DIR = Path(__file__).parents[1] / "golden"
REGENERATE = os.environ.get("REGENERATE_GOLDEN") == "1"
STEPS = 5
RELATIVE_TOLERANCE = 1e-5
# a KL of two nearly equal distributions (0.0024) rounds by ~1e-7 across CPUs' kernels
ABSOLUTE_TOLERANCE = 1e-6

# case -> (corpus fixture of this module, overrides); "{teacher}" is replaced by the teacher checkpoint's path
BERT_PAIR = ("model=bert_tiny", "data=segment_pair")
SEQ2SEQ = ("model=bart_tiny", "data=full_sentences")
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "mlm_nsp": ("golden_corpus", ("objective=mlm_nsp", *BERT_PAIR)),
    "mlm": (
        "golden_corpus",
        ("objective=mlm", "model=roberta_tiny", "data=full_sentences", "optim=roberta_adam"),
    ),
    "wwm": ("golden_corpus", ("objective=wwm", *BERT_PAIR)),
    "ngram": (
        "golden_corpus",
        ("objective=ngram", "objective.pair_task=sop", "model=albert_tiny", "data=segment_pair")
        + ("optim=lamb", "+optim.optimizer._convert_=all"),
    ),
    "ernie": ("golden_annotated_corpus", ("objective=ernie", *BERT_PAIR)),
    "span": ("golden_corpus", ("objective=span", "model=bert_tiny", "data=full_sentences")),
    "sop": ("golden_corpus", ("objective=sop", *BERT_PAIR)),
    "structbert": ("golden_corpus", ("objective=structbert", *BERT_PAIR)),
    "electra": (
        "golden_corpus",
        ("objective=electra", "objective.generator_size_fraction=0.5", "model=electra_tiny")
        + ("data=segment_pair",),
    ),
    "distillation": (
        "golden_corpus",
        ("objective=distillation", "objective.teacher={teacher}", "model=distilbert")
        + ("model.hidden_size=128", "model.num_hidden_layers=1", "model.num_attention_heads=2")
        + ("model.intermediate_size=512", "data=full_sentences"),
    ),
    "xlnet": (
        "golden_corpus",
        ("objective=xlnet", "model=xlnet_tiny", "data=full_sentences", "data.format=xlnet_memory")
        + ("data.stream_partitions=null",),  # one partition per memory slot
    ),
    "xlnet_pair": (
        "golden_corpus",
        ("objective=xlnet", "model=xlnet_tiny", "data=full_sentences", "data.format=xlnet_pair"),
    ),
    "bart": ("golden_corpus", ("objective=bart", *SEQ2SEQ)),
    "transformer": (
        "golden_corpus",
        ("objective=transformer", "model=transformer_base", "model.d_model=64")
        + ("model.encoder_layers=1", "model.decoder_layers=1", "model.encoder_attention_heads=2")
        + ("model.decoder_attention_heads=2", "model.encoder_ffn_dim=128")
        + ("model.decoder_ffn_dim=128", "data=full_sentences"),
    ),
    "mass": ("golden_corpus", ("objective=mass", *SEQ2SEQ)),
    "causal_lm": (
        "golden_corpus",
        ("objective=causal_lm", "model=gpt_tiny", "data=full_sentences"),
    ),
    "unilm": ("golden_corpus", ("objective=unilm", *BERT_PAIR)),
    "modernbert": (
        "golden_corpus",
        ("objective=mlm", "objective.mlm_probability=0.3", "model=modernbert_tiny")
        + ("model.local_attention=16", "data=full_sentences", "optim=stable_adamw"),
    ),
}
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


def prepare_golden_corpus(root: Path, **settings) -> Path:
    """`prepare_small_corpus` under `root` with its source named `corpus.txt` (relative):
    document keys hash the source's name and seed every mask, so the shards of the session's
    `prepared_corpus` (an absolute temporary path) differ from run to run; these do not."""
    with contextlib.chdir(root):
        return prepare_small_corpus(root, inputs=["corpus.txt"], **settings)


@pytest.fixture(scope="module")
def golden_corpus(tmp_path_factory) -> Path:
    """The session's `prepared_corpus`, with path-independent document keys."""
    return prepare_golden_corpus(tmp_path_factory.mktemp("golden_corpus"))


@pytest.fixture(scope="module")
def golden_annotated_corpus(tmp_path_factory) -> Path:
    """The session's `prepared_annotated_corpus`, with path-independent document keys."""
    return prepare_golden_corpus(
        tmp_path_factory.mktemp("golden_annotated_corpus"),
        phrases=PhraseSettings(enabled=True),
        entities=EntitySettings(path=str(ENGLISH_ENTITIES)),
    )


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
    stored_overrides = list(CASES[case][1])
    if REGENERATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        record = {"case": case, "overrides": stored_overrides, "steps": STEPS, "losses": losses}
        path.write_text(json.dumps(record, indent=1) + "\n")
        return
    assert path.is_file(), f"{path}: no golden curve; run `make golden` and commit it"
    golden = json.loads(path.read_text())
    assert golden["overrides"] == stored_overrides, (
        f"{case}: the case's overrides changed since {path} was made; run `make golden`"
    )
    assert_close(case, losses, golden["losses"])
