"""benchmarks/gpu_check.sh --smoke runs the GPU check's whole path on a CPU (issue 14 item 7):
tiny BERT and RoBERTa against transformers' models with the same weights, the exported logits,
and DDP vs ZeRO-2 runs of `pretrain`, into one table."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_CHECKS = (  # benchmarks/gpu_check.sh's ALL
    "cuda sync_check gpu_bench ddp deepspeed_zero2 compile unpadded resume apex local_attention"
).split()


@pytest.mark.slow
def test_gpu_check_smoke_runs_end_to_end(prepared_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.md"
    environment = {
        **os.environ,
        "VENV": str(Path(sys.executable).parent.parent),
        "SHARDS": str(prepared_corpus),
        "WORK": str(tmp_path / "work"),
        "OUT": str(out),
        "OMP_NUM_THREADS": "1",
    }
    (tmp_path / "work").mkdir()
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--smoke"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # every check the GPU run runs reports one line (sync_check runs below, apex needs apex)
    verdicts = dict(
        line.removeprefix("== check ").split(": ", 1)
        for line in done.stdout.splitlines()
        if line.startswith("== check ")
    )
    assert set(verdicts) == set(GPU_CHECKS), verdicts
    skipped = {name for name, verdict in verdicts.items() if verdict.startswith("skipped")}
    assert skipped <= {"sync_check", "apex"} and all(
        verdicts[name] == "ok" for name in set(GPU_CHECKS) - skipped
    ), verdicts
    table = out.read_text()
    for family, reference in (
        ("bert_tiny", "BertForMaskedLM"),
        ("roberta_tiny", "RobertaForMaskedLM"),
    ):
        assert f"| {family} | 32 | ours, torch AdamW |" in table
        assert f"| {family} | 32 | transformers {reference} |" in table
        gap = next(
            line for line in table.splitlines() if line.startswith(f"| {family} | 32 | exported")
        )
        assert float(gap.split("|")[4]) < 1e-4  # same weights, fp32: the same logits
    assert "| bert_tiny | 32 | ours, compiled |" in table
    rows = {row.split("|")[1].strip(): row.split("|") for row in table.splitlines() if "|" in row}
    for run in ("ddp", "deepspeed_zero2", "compile", "unpadded", "resume"):
        assert float(rows[run][2].replace(",", "")) > 0  # tokens/s the run logged
    assert rows["resume"][5] == rows["ddp"][5]  # resumed from ddp's step 2: its last loss


def test_no_objectives_training_step_has_an_operator_that_syncs_on_cuda(
    prepared_corpus: Path,
) -> None:
    """The GPU check's first part on a CPU (issue 18 item 2): a few steps of every objective,
    a NaN gradient planted in one, under `HostSyncOps` (boolean-mask indexing, nonzero,
    .item(), ... stopped), the NaN step skipped with the weights kept."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "sync_check.py"), "--device", "cpu"]
        + ["--shards", str(prepared_corpus)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    objectives = [line.split()[0] for line in lines if line.split()[1:2] == ["ok"]]
    sys.path.insert(0, str(REPO / "benchmarks"))
    from sync_check import OBJECTIVES  # every objective (xlnet_pair for XLNet's pair format)

    assert set(objectives) == set(OBJECTIVES) and {"mlm_nsp", "xlnet", "unilm"} <= set(OBJECTIVES)
