"""A 2-rank DDP run (gloo, CPU) whose rank 0, the process the user started and the one that
started rank 1, is killed with SIGKILL mid-step: no process of the run (rank 1, both ranks'
data-loader workers, forkservers and resource trackers) is left 10 s later (rank 1 would
otherwise wait in its next collective until trainer.collective_timeout_s), and the same
command resumes from the last checkpoint exactly (losses and weights of an uninterrupted
run)."""

from pathlib import Path

import pytest
import torch
from fault_helpers import Launch, marked_processes, run_to_end
from test_train import step_losses, tiny_overrides

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")

MAX_STEPS = 16
RUN = (
    "trainer.devices=2",
    "strategy=ddp",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.checkpoint_every_n_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.collective_timeout_s=300",  # far longer than the 10 s the test waits
    "data.num_workers=1",
)
PROCESSES_PER_RANK = 4  # the rank, its forkserver, its resource tracker, its loader's worker


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_sigkill_of_rank_0_ends_every_rank_and_resumes_exactly(prepared_corpus, tmp_path):
    reference = tmp_path / "reference"
    run_to_end(tiny_overrides(prepared_corpus, reference, *RUN), tmp_path)

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(prepared_corpus, run_dir, *RUN)
    first = Launch(overrides, tmp_path)
    first.wait_for(lambda: (run_dir / "checkpoints" / "step-0000004.ckpt").is_file())
    first.wait_for(lambda: len(marked_processes(first.marker)) >= 2 * PROCESSES_PER_RANK)
    first.kill()  # rank 0 only: the test's SIGKILL reaches no other process
    assert first.survivors_after(10) == []

    second = run_to_end(overrides, tmp_path)
    assert any("Resuming from" in line for line in second.lines)
    assert second.survivors_after(10) == []
    expected, resumed = step_losses(reference), step_losses(run_dir)
    assert {step: resumed.get(step) for step in range(4, MAX_STEPS)} == {
        step: expected[step] for step in range(4, MAX_STEPS)
    }
    for key, value in weights(reference).items():
        torch.testing.assert_close(weights(run_dir)[key], value, rtol=0, atol=1e-6)
