"""Process hygiene under real signals: a run killed with SIGKILL (the OOM killer, a node agent)
mid-step or inside a checkpoint's write leaves no process behind (forkserver, data-loader
workers, resource tracker), and the same command resumes it exactly; the resource tracker
killed under a run is one warning line, not a traceback per semaphore."""

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_helpers import Launch, marked_processes, run_to_end
from test_train import step_losses, tiny_overrides

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")

MAX_STEPS = 12
RUN = (
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.checkpoint_every_n_steps=4",
    "trainer.log_every_n_steps=1",
    "data.num_workers=2",
)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_sigkill_mid_step_and_mid_save_leaves_no_process_and_resumes_exactly(
    prepared_corpus, tmp_path
):
    reference = tmp_path / "reference"
    run_to_end(tiny_overrides(prepared_corpus, reference, *RUN), tmp_path)

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(prepared_corpus, run_dir, *RUN)
    checkpoints = run_dir / "checkpoints"

    # 1. SIGKILL mid-step, after the step-4 checkpoint, its workers running
    first = Launch(overrides, tmp_path)
    first.wait_for(lambda: (checkpoints / "step-0000004.ckpt").is_file())
    first.wait_for(lambda: len(marked_processes(first.marker)) >= 4)  # + forkserver, tracker
    first.kill()
    assert first.survivors_after(10) == []

    # 2. SIGKILL inside the write of the step-8 checkpoint: it writes into a pipe the test
    # reads from, so the kill comes while torch.save is writing it
    second = Launch(overrides, tmp_path)
    second.wait_for(lambda: any(line.startswith("Resuming from") for line in second.lines))
    fifo = checkpoints / "step-0000008.ckpt.partial"
    os.mkfifo(fifo)  # after the resume has cleaned up leftovers, long before step 8
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        second.wait_for(lambda: select.select([reader], [], [], 0)[0] != [])
        assert len(os.read(reader, 1 << 16)) > 0  # the checkpoint's first bytes
        second.kill()
    finally:
        os.close(reader)
    assert second.survivors_after(10) == []
    assert not (checkpoints / "step-0000008.ckpt").exists()

    # 3. the same command again: resumes from step 4 and ends as if never stopped
    third = run_to_end(overrides, tmp_path)
    assert any(f"Resuming from {checkpoints}" in line for line in third.lines)
    assert third.survivors_after(10) == []
    assert not list(checkpoints.glob("*.partial"))
    expected, resumed = step_losses(reference), step_losses(run_dir)
    assert {step: resumed[step] for step in range(4, MAX_STEPS)} == {
        step: expected[step] for step in range(4, MAX_STEPS)
    }
    for key, value in weights(reference).items():
        torch.testing.assert_close(weights(run_dir)[key], value, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_the_resource_tracker_killed_under_a_run_is_one_warning_line(prepared_corpus, tmp_path):
    # 40 steps: the tracker dies seconds before the data loader frees its semaphores
    overrides = tiny_overrides(prepared_corpus, tmp_path / "run", *RUN, "trainer.max_steps=40")
    launch = Launch(overrides, tmp_path)

    def tracker() -> list[int]:
        found = marked_processes(launch.marker)
        return [pid for pid, command in found if "resource_tracker" in command]

    launch.wait_for(lambda: tracker() and len(marked_processes(launch.marker)) >= 5)
    # the run stands still until its tracker is gone (its zombie is not listed), so the run's
    # next message to it finds it dead, never dying
    os.kill(launch.process.pid, signal.SIGSTOP)
    try:
        killed = tracker()[0]
        os.kill(killed, signal.SIGKILL)
        launch.wait_for(lambda: killed not in tracker())
        assert not (tmp_path / "run" / "checkpoints" / "step-0000040.ckpt").exists()
    finally:
        os.kill(launch.process.pid, signal.SIGCONT)
    assert launch.process.wait(timeout=600) == 0
    stderr = launch.stderr.read_text()
    assert "Traceback" not in stderr and "KeyError" not in stderr, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if "resource tracker" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: multiprocessing's resource")
    assert "resource_tracker" not in stderr  # the standard library's own warning, silenced
    assert launch.survivors_after(10) == []


DYING_TRACKER = """
import os, signal, multiprocessing
from multiprocessing import resource_tracker
from pretrain.cluster.resource_tracking import start_resource_tracker

start_resource_tracker()
tracker = resource_tracker._resource_tracker
os.kill(tracker._pid, signal.SIGKILL)
os.waitpid(tracker._pid, 0)
probe = tracker._check_alive
answers = iter([True])  # the first probe finds it still alive: killed, not yet gone
tracker._check_alive = lambda: next(answers, None) or probe()
lock = multiprocessing.get_context("forkserver").Lock()  # registers its semaphore
del lock  # and forgets it
print(tracker._pid)
"""


def test_a_tracker_the_standard_library_finds_dead_is_reported_once():
    """The tracker dies between the wrapper's probe and the message the standard library
    sends: the relaunch happens inside the standard library, and is still one line."""
    done = subprocess.run(
        [sys.executable, "-c", DYING_TRACKER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "tracker" in line]
    assert lines == [
        "warning: multiprocessing's resource tracker died; a new one is started "
        f"(pid {done.stdout.strip()}; named semaphores of the old one are still removed as "
        "they are freed)"
    ], done.stderr
