"""`trainer.compile`: every model family's objective module compiles in place (torch.compile)
and trains its golden loss curve; a compiled run checkpoints, resumes and exports under the
eager parameter names.

With the `eager` backend TorchDynamo captures each family's forward pass (no graph may fail
to trace) and runs the captured graphs as they are, dropout draws included, so a compiled
run gives the stored eager golden curve (tests/golden, relative tolerance 1e-5). `aot_eager`
also traces the backward pass (AOTAutograd); it may order dropout's draws differently, so
it is compared with an eager run without dropout. Inductor's generated kernels draw dropout
from their own generator and take about a minute of CPU per model here: they are timed on a
GPU by `benchmarks/gpu_check.sh` (compile on/off)."""

import csv
import json

import pytest
import torch
import transformers
from test_golden import (  # noqa: F401 (golden_corpus, teacher_checkpoint: fixtures)
    ABSOLUTE_TOLERANCE,
    CASES,
    GOLDEN_DIR,
    RELATIVE_TOLERANCE,
    assert_close,
    golden_corpus,
    logged_losses,
    run_case,
    teacher_checkpoint,
)

from pretrain.export import export_checkpoint

COMPILED = ("trainer.compile=true", "trainer.compile_backend=eager")
# one golden case per model family, and SpanBERT's SBO head
FAMILY_CASES = (
    "mlm_nsp",  # BERT
    "mlm",  # RoBERTa
    "ngram",  # ALBERT
    "span",  # BERT + SBO
    "electra",
    "distillation",  # DistilBERT
    "xlnet",
    "bart",
    "mass",
    "transformer",
    "causal_lm",  # GPT
)
# AOTAutograd's backward trace, checked on BERT (BART's trace costs several times more)
NO_DROPOUT = {
    "mlm_nsp": ("model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0"),
}


def golden_losses(case: str) -> dict:
    return json.loads((GOLDEN_DIR / f"{case}.json").read_text())["losses"]


def case_overrides(case: str, request) -> tuple:
    """(corpus, overrides) of the golden `case`, its teacher's path filled in."""
    fixture, overrides = CASES[case]
    if "{teacher}" in " ".join(overrides):
        teacher = request.getfixturevalue("teacher_checkpoint")
        overrides = tuple(o.replace("{teacher}", str(teacher)) for o in overrides)
    return request.getfixturevalue(fixture), overrides


@pytest.mark.slow
@pytest.mark.parametrize("case", FAMILY_CASES)
def test_a_compiled_run_gives_the_golden_curve(case, request, tmp_path):
    corpus, overrides = case_overrides(case, request)
    torch._dynamo.reset()
    losses = logged_losses(run_case(corpus, tmp_path / case, (*overrides, *COMPILED)))
    assert_close(case, losses, golden_losses(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NO_DROPOUT))
def test_aot_autograd_gives_the_eager_losses_without_dropout(case, request, tmp_path):
    corpus, overrides = case_overrides(case, request)
    overrides = (*overrides, *NO_DROPOUT[case])
    eager = logged_losses(run_case(corpus, tmp_path / "eager", overrides))
    torch._dynamo.reset()
    aot = ("trainer.compile=true", "trainer.compile_backend=aot_eager")
    compiled = logged_losses(run_case(corpus, tmp_path / "aot", (*overrides, *aot)))
    assert_close(case, compiled, eager)
    assert eager != logged_losses(run_case(corpus, tmp_path / "dropout", CASES[case][1]))


def step_losses(run_dir) -> dict[int, float]:
    rows = csv.DictReader(open(next(run_dir.glob("csv/version_*/metrics.csv"))))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


@pytest.mark.slow
def test_a_compiled_run_resumes_and_exports_under_the_eager_names(request, tmp_path):
    corpus, overrides = case_overrides("mlm_nsp", request)
    overrides = (*overrides, *COMPILED, "trainer.checkpoint_every_n_steps=3")
    torch._dynamo.reset()
    first = run_case(corpus, tmp_path / "first", overrides)
    step3 = first / "checkpoints" / "step-0000003.ckpt"
    names = list(torch.load(step3, map_location="cpu", weights_only=False)["state_dict"])
    assert names and not [n for n in names if "_orig_mod" in n]
    resumed = run_case(corpus, tmp_path / "resumed", (*overrides, f"resume={step3}"))
    golden = golden_losses("mlm_nsp")["train/loss"]
    assert sorted(step_losses(resumed)) == [3, 4]
    for step, loss in step_losses(resumed).items():
        assert loss == pytest.approx(
            golden[step], rel=RELATIVE_TOLERANCE, abs=ABSOLUTE_TOLERANCE
        ), step
    out = export_checkpoint(first / "checkpoints" / "last.ckpt", tmp_path / "hf")
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_trainer_compile_captures_the_training_step(prepared_corpus, tmp_path):
    """trainer.compile=true reaches torch.compile: TorchDynamo captures frames of the step
    (the compiled module is the one the step calls, inside DDP's forward)."""
    from conftest import cpu_run_overrides

    from pretrain.config import compose_config
    from pretrain.runtime.run import train

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    overrides = ("trainer.max_steps=2", "strategy=ddp", "trainer.devices=1", *COMPILED)
    train(compose_config(cpu_run_overrides(prepared_corpus, tmp_path, *overrides, batch_size=4)))
    stats = torch._dynamo.utils.counters["stats"]
    assert stats["calls_captured"] > 0 and stats["unique_graphs"] > 0, dict(stats)


def test_gpu_bench_compiled_row_runs_compiled():
    """benchmarks/gpu_bench.py's "ours, compiled" model: its step's encoder and head captured
    by TorchDynamo (a compiled ModuleDict is never called, so its step would run eager)."""
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_model import make_batch, our_step_static_budget
    from gpu_bench import build_pair, compiled_copy

    args = argparse.Namespace(vocab_size=30522, mask_probability=0.15, seed=0)
    args.batch_size, args.seq_len = 2, 16
    _, ours, _ = build_pair("bert_tiny", args, torch.device("cpu"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = compiled_copy(ours, "eager")
    our_step_static_budget(compiled, make_batch(args)).backward()
    stats = torch._dynamo.utils.counters["stats"]
    assert stats["calls_captured"] > 0 and stats["unique_graphs"] >= 2, dict(stats)
