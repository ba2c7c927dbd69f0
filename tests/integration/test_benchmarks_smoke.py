"""Every script in benchmarks/ runs to its table at tiny sizes (issue 51 item 10: bench_model.py
failed at start for weeks after the model configs moved, and nothing noticed). Each script runs
in this process (`runpy`, as `python benchmarks/<script> ARGS` would, its imports shared), on
the small prepared corpus where it reads one; the test asserts it returned and printed a
line of its table. Times are never asserted. A new script needs an entry in SMOKES,
in COVERED_ELSEWHERE naming the test file that runs it, or in NOT_RUN with the reason
(tests/unit/test_benchmarks_listed.py fails otherwise)."""

import os
import runpy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

# script -> (arguments, a line of its table); {shards}: the prepared corpus, {tmp}: a scratch dir
SMOKES: dict[str, tuple[list[str], str]] = {
    "bench_model.py": (
        "--sizes bert_tiny --batch-size 2 --seq-len 16 --vocab-size 300 --repeats 1".split(),
        "HF BertForMaskedLM",
    ),
    "bench_budget.py": (
        "--sizes bert_tiny --batch-size 2 --seq-len 16 --vocab-size 300 --rounds 2".split(),
        "budget + metrics (the objective's step)",
    ),
    "bench_masking.py": (
        "--sequences 64 --batch-size 16 --max-length 32 --vocab-size 300 --repeats 1".split(),
        "DataCollatorForLanguageModeling",
    ),
    "bench_nonfinite_check.py": ("--model bert_tiny --repeats 2".split(), "one foreach pass"),
    "bench_checkpoint.py": ("--model bert_tiny --repeats 1".split(), "loop blocked per save"),
    "bench_padding.py": (
        "--shards {shards} --lengths 64 --batch-size 8 --batches 2".split(),
        "padding",
    ),
    "bench_resume.py": (
        "--megabytes 0.05 --docs-per-shard 10 --work-dir {tmp} --repeats 1 "
        "--tokenizer-from {shards}".split(),
        "re-read / seek",
    ),
    "bench_stream.py": (
        "{shards} --repeats 1 --objectives mlm --batch-size 8".split(),
        "sha256",
    ),
    "bench_stream_objectives.py": (  # --sources: each also on a mixture (issue 55)
        "{shards} --repeats 1 --objectives mlm,span --batch-size 8 --sources {shards},{shards}".split(),
        "span: 2 sources / 1 source",
    ),
    "int8_cpu.py": ("32 1 fp32,ao".split(), "x of fp32"),
    "loaders.py": (  # ours, and LitData / Mosaic / webdataset where they import; in the main
        # process and through one worker (2 workers start the same code twice: 40 -> 25 s)
        "--megabytes 0.2 --seq-len 64 --batch-size 4 --batches 3 --vocab-size 300 "
        "--wds-samples 32 --repeats 1 --workers 0,1 --work-dir {tmp}".split(),
        "| ours | ",
    ),
    "prepare.py": (
        "--megabytes 0.05 --kinds short --vocab-size 300 --num-proc 1 --work-dir {tmp}".split(),
        "physical MB",
    ),
    "prepare_scale.py": (  # 0.1 MB, 2 tasks at a time; the side by side on 0.05 MB
        "0.1 2 --workers 2 --compare-megabytes 0.05".split(),
        "recall 1.00, precision 1.00",
    ),
    "remote_stream.py": (
        "{shards} --repeats 1 --partitions 2 --bounded-epochs 1 --prefetch-shards 1".split(),
        "s3 bounded",
    ),
    "compare_objectives.py": (
        "--only mlm --steps 2 --shards {shards} --runs-dir {tmp}".split(),
        "| objective | held-out MLM accuracy |",
    ),
    "compression.py": (
        "--teacher {tmp}/teacher --models {tmp}/int8 --tasks --rounds 1 --seq-len 16".split(),
        "| teacher |",
    ),
    "fidelity.py": (
        "--only mlm --batches 1 --no-write --english {shards}".split(),
        "| objective | statistic | paper | measured |",
    ),
    "memory.py": (
        "--demos demo --steps 4 --every 2 --from-step 2 --png {tmp}/memory.png "
        "-- data.shards_dir={shards}".split(),
        "| demo |",
    ),
    "scale_sim.py": (
        "--shards {shards} --batches 3 --repeats 1 --table-shards 100,200 --ranks 3".split(),
        "| ranks: 3 ranks",
    ),
    "bench_zero_memory.py": (
        "--hidden 32 --layers 1 --vocab 100 --stages 3".split(),
        "DeepSpeed est. MB",
    ),
    "budget.py": (
        "--only mlm --budget-s 0 --warm-steps 1 --calibration-steps 1 --shards {shards} "
        "--runs-dir {tmp}/runs --tasks builtin_order --no-publish --eval-overrides "
        "eval.epochs=1 eval.probe_epochs=1 eval.task.train_size=16 eval.task.dev_size=8".split(),
        "| MLM (RoBERTa-style) | 1 |",
    ),
    "vs_hf_pretraining.py": (  # both sides 1 s and 3 steps, one tiny fit of one task
        "--smoke --shards {shards} --out-dir {tmp}".split(),
        "| demo | 0.0166667 min | transformers | ",
    ),
}

# script -> the test file that runs it (gpu_check.sh --smoke runs the three scripts it calls)
COVERED_ELSEWHERE: dict[str, str] = {
    "gpu_check.sh": "tests/integration/test_gpu_check.py",
    "gpu_bench.py": "tests/integration/test_gpu_check.py",
    "sync_check.py": "tests/integration/test_gpu_check.py",
    "bench_local_attention.py": "tests/integration/test_gpu_check.py",
    "hf_mlm_recipe.py": "tests/integration/test_benchmarks_smoke.py",  # vs_hf_pretraining.py's
    "loaders_s3.py": "tests/integration/test_loaders_s3.py",  # loaders.py --remote s3's module
}
# script -> why no test runs it whole (kept short: each is a decision, not an oversight)
NOT_RUN: dict[str, str] = {
    "fidelity_corpora.py": "a module of fidelity.py (its corpora), no command of its own",
}


@pytest.fixture
def restored_process_state(monkeypatch):
    """The environment, argv, sys.path and torch's thread count as before the script ran (the
    scripts set OMP_NUM_THREADS, S3 variables, their own sys.path entries, one thread)."""
    import torch

    environment, threads = dict(os.environ), torch.get_num_threads()
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield
    os.environ.clear()
    os.environ.update(environment)
    torch.set_num_threads(threads)


def tiny_teacher_and_int8(work: Path) -> None:
    """compression.py's inputs: a tiny BertForMaskedLM as `work/teacher` (random weights) and
    it quantized to int8 by pretrain-compress's own functions as `work/int8`."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from pretrain.compress.quantize import quantize_dynamic_int8, save_quantized

    torch.manual_seed(0)
    sizes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = BertConfig(vocab_size=200, intermediate_size=64, max_position_embeddings=32, **sizes)
    BertForMaskedLM(config).save_pretrained(work / "teacher")
    model = quantize_dynamic_int8(BertForMaskedLM.from_pretrained(work / "teacher").eval())
    save_quantized(model, work / "teacher", work / "int8")


# script -> what it reads, made in its scratch dir before it runs
INPUTS = {"compression.py": tiny_teacher_and_int8}


def budget_published() -> tuple[str, bytes]:
    """RESULTS.md's `budget` block and benchmarks/figures/budget.png: budget.py's smoke run
    (--no-publish) must leave both as they were."""
    text = (BENCHMARKS / "RESULTS.md").read_text()
    block = text[text.index("<!-- budget:begin -->") : text.index("<!-- budget:end -->")]
    return block, (BENCHMARKS / "figures" / "budget.png").read_bytes()


# script -> what it must leave as it was (read before and after it runs)
UNCHANGED = {"budget.py": budget_published}


@pytest.mark.parametrize("script", sorted(SMOKES))
def test_benchmark_prints_its_table(
    script, prepared_corpus, tmp_path, monkeypatch, capsys, restored_process_state
):
    arguments, table_line = SMOKES[script]
    work = tmp_path / "work"
    if script in INPUTS:
        INPUTS[script](work)
    filled = [a.format(shards=prepared_corpus, tmp=work) for a in arguments]
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), *filled])
    monkeypatch.chdir(tmp_path)
    unchanged = UNCHANGED.get(script, lambda: None)
    before = unchanged()
    runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    printed = capsys.readouterr().out
    assert table_line in printed, printed[-3000:]
    assert unchanged() == before, f"benchmarks/{script} changed what its smoke must leave"
