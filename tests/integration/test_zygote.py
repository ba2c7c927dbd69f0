"""The tests' fork server (tests/zygote.py) runs a launch as the `python -m pretrain.cli.train`
process would: the same output and status for the same arguments, the environment and working
directory of the request, and a launch past its timeout killed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from zygote import run_pretrain


def executed(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pretrain.cli.train", *args],
        cwd=cwd,
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_launch_prints_and_ends_as_the_executed_module(tmp_path):
    (tmp_path / "corpus").mkdir()  # no manifest in it: found relative to the working directory
    cases = [
        ["--cfg", "job", "--resolve", "model=bert_mini", "run_name=${oc.env:LAUNCH_NAME}"],
        ["data.shards_dir=corpus", "model=bert_mini"],
        ["optim.optimizer.lr=abc"],
    ]
    env = {"LAUNCH_NAME": "from-the-request"}
    for args in cases:
        forked, reference = run_pretrain(args, tmp_path, env), executed(args, tmp_path, env)
        assert forked.returncode == reference.returncode, (args, forked.stderr[-2000:])
        assert forked.stdout == reference.stdout, args
        assert forked.stderr.splitlines()[-1:] == reference.stderr.splitlines()[-1:], args
    assert "run_name: from-the-request" in run_pretrain(cases[0], tmp_path, env).stdout
    missing = run_pretrain(cases[1], tmp_path, env)
    assert missing.returncode == 2 and "no manifest.json in it" in missing.stderr


@pytest.mark.slow
def test_a_launch_past_its_timeout_is_killed(prepared_corpus, tmp_path):
    from conftest import cpu_run_overrides
    from dist_helpers import RECORDING_MLM

    args = cpu_run_overrides(prepared_corpus, tmp_path / "run", *RECORDING_MLM)
    (records := tmp_path / "records").mkdir()
    env = {"PRETRAIN_TEST_HOLD_STEP": "1", "PRETRAIN_TEST_RECORD_DIR": str(records)}
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run_pretrain(args, tmp_path, env, timeout=20)  # holds at step 1 until a signal: forever
    with pytest.raises(ProcessLookupError):
        os.kill(expired.value.pid, 0)  # killed and reaped
    assert run_pretrain(["--cfg", "job"], tmp_path).returncode == 0  # the server serves on


def test_a_two_rank_launch_ignores_what_an_in_process_distributed_run_left(
    prepared_corpus, tmp_path, monkeypatch
):
    """What an in-process distributed run leaves in this process's environment (Lightning
    writes it): its MASTER_PORT, here held by another listener, and LOCAL_RANK and the rest.
    A 2-rank launch starts its own rank 1 and rendezvouses on a port of its own: inherited,
    LOCAL_RANK left rank 0 waiting for a rank nobody started (a hang), and the port failed
    with EADDRINUSE."""
    import socket

    from conftest import cpu_run_overrides

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setenv("MASTER_PORT", str(held.getsockname()[1]))
        for name, value in (("LOCAL_RANK", "0"), ("RANK", "0"), ("WORLD_SIZE", "1")):
            monkeypatch.setenv(name, value)
        args = cpu_run_overrides(prepared_corpus, tmp_path / "run", "trainer.max_steps=1")
        ranks = ["strategy=ddp", "trainer.devices=2", "trainer.startup_timeout_s=60"]
        result = run_pretrain([*args, *ranks], tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
