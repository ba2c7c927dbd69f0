"""Local ranks forked from rank 0 (`pretrain.runtime.fork_launcher`, the default for a CPU run
of the `pretrain` console process) train what ranks started by running the command line
again train (`PRETRAIN_FORK_RANKS=0`, Lightning's way): every micro-batch's samples and loss
on each rank, the weights at the end, and each rank's own log file in the run directory.
Also: `ForkedRank` reports a child's exit status and signal as `subprocess.Popen`
does."""

import os
import signal
import subprocess
import sys

import pytest
from dist_helpers import RECORDING_MLM, read_records
from test_resume_matrix import launch, steps

from pretrain.runtime.fork_launcher import FORK_RANKS, ForkedRank

FORKED = "forked from rank 0"


@pytest.mark.slow
def test_forked_ranks_train_what_ranks_started_anew_train(prepared_corpus, tmp_path):
    records = {}
    for name, fork in (("forked", "1"), ("started", "0")):
        run_dir = tmp_path / name
        result = launch(
            prepared_corpus,
            run_dir,
            *RECORDING_MLM,
            "strategy=ddp",
            "trainer.max_steps=8",
            env={FORK_RANKS: fork},
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        assert (FORKED in result.stdout + result.stderr) == (fork == "1")
        assert (run_dir / "train.log").is_file()
        rank_log = (run_dir / "train_ddp_process_1.log").read_text()
        assert "GLOBAL_RANK: 1" in rank_log and "GLOBAL_RANK: 0" not in rank_log
        records[name] = read_records(tmp_path / f"{name}-records")
    forked, started = records["forked"], records["started"]
    assert sorted(forked) == sorted(started) == [0, 1]
    for rank in (0, 1):
        got, want = steps(forked)[rank], steps(started)[rank]
        assert [(s, k) for s, k, _ in got] == [(s, k) for s, k, _ in want]
        assert [loss for *_, loss in got] == pytest.approx([loss for *_, loss in want], abs=1e-6)
        assert forked[rank][-1]["param_checksum"] == pytest.approx(
            started[rank][-1]["param_checksum"], rel=1e-9
        )


def child(code: str) -> ForkedRank:
    """A child process of this one running `code` in a new interpreter (posix_spawn: no Popen
    to reap it behind ForkedRank's back, and no handler of this process's signals inherited,
    as a fork of a test process holding SLURM's signals would inherit them)."""
    return ForkedRank(os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ))


def test_a_rank_reports_its_exit_as_popen_does():
    done = child("import sys; sys.exit(75)")
    assert done.wait() == 75 and done.poll() == 75 and done.returncode == 75
    waiting = child("import signal; signal.pause()")
    assert waiting.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.wait(timeout=0.2)
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(timeout=30) == -signal.SIGTERM
    waiting.kill()  # already ended: nothing is signalled
    assert waiting.returncode == -signal.SIGTERM
