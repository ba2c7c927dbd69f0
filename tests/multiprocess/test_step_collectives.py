"""No host barrier in the step (issue 54 item 3), on 2 gloo ranks with DDP and accumulation:
in steady state an optimizer step makes no collective that blocks the host (counted by
tests/multiprocess/collective_counts.py), and exactly one small asynchronous all-reduce (the
next step's agreement: epoch end, bad data, loss tokens, preemption flags), waited at the next
step's start. Before, each step made two blocking all-reduces on the host: the epoch-end
agreement (`epoch_end.agree_on_step`) at its start and the preemption flag at its end."""

import json
from pathlib import Path

from conftest import cpu_run_overrides
from zygote import recorded_launch

STEPS = 8


def test_steady_state_steps_make_no_blocking_collective(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(
        prepared_corpus,
        run_dir,
        "objective=mlm",
        "objective._target_=collective_counts.CountingMLM",
        "data=full_sentences",
        "strategy=ddp",
        "trainer.devices=2",
        "data.global_batch_size=32",  # 2 ranks x 8 x 2 micro-batches: accumulation too
        f"trainer.max_steps={STEPS}",
        "trainer.log_every_n_steps=4",
        "trainer.checkpoint_every_n_steps=100",
        "+optim.optimizer.fused=true",  # skips non-finite steps on the device, as on CUDA
    )
    result = recorded_launch(overrides, run_dir, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    records = Path(f"{run_dir}-records")
    for rank in (0, 1):
        counts = {
            int(s): c for s, c in json.loads((records / f"counts{rank}.json").read_text()).items()
        }
        # the launch's first step agreed before the counter came; every later one is steady
        # (the run stays inside its first epoch: an epoch's first step agrees blocking)
        steady = range(1, STEPS)
        assert {s: counts[s]["blocking"] for s in steady} == {s: [] for s in steady}, rank
        for step in steady:
            assert counts[step]["launched"] == ["all_reduce"], (rank, step)  # one, async
        for step in steady[1:]:  # (step 0's was launched before the counter came)
            assert counts[step]["waited"] == [["all_reduce", step - 1]], (rank, step)
        assert counts[STEPS]["waited"] == [["all_reduce", STEPS - 1]]  # none left in flight
