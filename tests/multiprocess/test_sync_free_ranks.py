"""No host synchronisation in a training step on 2 gloo ranks (issue 58 item 5): DDP's step
under tests/multiprocess/host_reads.py's `HostReads` (no `item`, `bool`, `tolist` of a tensor,
no `torch.tensor(..., device=...)`, no barrier) from each step's start to the next's, log steps
and the launch's first step excepted. Before the fix the preemption check
(`strategy.reduce_boolean_decision`: a device tensor, an all-reduce, `bool()`), Lightning's
per-batch SIGTERM broadcast (`.item()`) and `strategy.reduce`'s barrier (progress counts, the
non-finite flag) all ran in every step."""

import json
from pathlib import Path

from conftest import cpu_run_overrides
from zygote import recorded_launch

STEPS, EVERY = 10, 5


def test_ddp_steps_between_log_steps_never_wait_for_the_host(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(
        prepared_corpus,
        run_dir,
        "objective=mlm",
        "objective._target_=host_reads.GuardedMLM",
        "data=full_sentences",
        "strategy=ddp",
        "trainer.devices=2",
        "data.global_batch_size=32",  # 2 ranks x 8 x 2 micro-batches: accumulation too
        f"trainer.max_steps={STEPS}",
        f"trainer.log_every_n_steps={EVERY}",
        "trainer.checkpoint_every_n_steps=100",
        "+optim.optimizer.fused=true",  # skips non-finite steps on the device, as on CUDA
    )
    result = recorded_launch(overrides, run_dir, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    records = Path(f"{run_dir}-records")
    guarded = [s for s in range(1, STEPS - 1) if (s + 1) % EVERY != 0]
    for rank in (0, 1):
        assert json.loads((records / f"guard{rank}.json").read_text()) == sorted(guarded * 2)
