"""No host barrier in the step (issue 54 item 3), on 2 gloo ranks with DDP and accumulation:
in steady state an optimizer step makes no collective that blocks the host (counted by
tests/multiprocess/collective_counts.py), and exactly one small asynchronous all-reduce (the
next step's agreement: epoch end, bad data, loss tokens, preemption flags), waited at the next
step's start; a signal to one rank, which rides in it, saves every rank within the documented
bound. Before, each step made two blocking all-reduces on the host: the epoch-end agreement
(`epoch_end.agree_on_step`) at its start and the preemption flag at its end (which saved at
the end of the step the signal came in)."""

import json
from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from dist_helpers import RECORDING_MLM, read_records
from zygote import recorded_launch

STEPS, SIGNALLED = 12, 5  # rank 1 gets SIGTERM during step 5


@pytest.mark.slow
def test_steady_state_steps_make_no_blocking_collective(prepared_corpus, tmp_path):
    """Counted per step on each rank; the signal to rank 1 during step 5, summed at step 6's
    start and read at step 7's, saves every rank at step 7's end (the documented bound:
    within two steps of the one it came in)."""
    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(
        prepared_corpus,
        run_dir,
        *RECORDING_MLM,
        "objective._target_=collective_counts.CountingMLM",
        "strategy=ddp",
        "trainer.devices=2",
        "data.global_batch_size=32",  # 2 ranks x 8 x 2 micro-batches: accumulation too
        f"trainer.max_steps={STEPS}",
        "trainer.log_every_n_steps=4",
        "trainer.checkpoint_every_n_steps=100",
        "+optim.optimizer.fused=true",  # skips non-finite steps on the device, as on CUDA
    )
    env = {"PRETRAIN_TEST_SIGTERM_STEP": str(SIGNALLED), "PRETRAIN_TEST_SIGTERM_RANK": "1"}
    result = recorded_launch(overrides, run_dir, env, timeout=900)
    assert result.returncode == 75, result.stdout[-4000:] + result.stderr[-4000:]
    saved = SIGNALLED + 3  # saved at the end of step SIGNALLED + 2: that many steps done
    assert f"preempted at step {saved} of {STEPS}" in result.stdout + result.stderr
    records = Path(f"{run_dir}-records")
    trained = read_records(records)
    for rank in (0, 1):
        assert sorted({e["step"] for e in trained[rank] if "step" in e}) == list(range(saved))
        counts = {
            int(s): c for s, c in json.loads((records / f"counts{rank}.json").read_text()).items()
        }
        # the launch's first step agreed before the counter came; every later one is steady
        # (the run stays inside its first epoch: an epoch's first step agrees blocking); the
        # checkpoint's save after the last step is not
        steady = range(1, saved)
        assert {s: counts[s]["blocking"] for s in steady} == {s: [] for s in steady}, rank
        for step in steady:
            assert counts[step]["launched"] == ["all_reduce"], (rank, step)  # one, async
        for step in steady[1:]:  # (step 0's was launched before the counter came)
            assert counts[step]["waited"] == [["all_reduce", step - 1]], (rank, step)
        assert counts[saved]["waited"] == [["all_reduce", saved - 1]]  # none left in flight
