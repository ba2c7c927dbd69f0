"""Data-loader workers of every epoch of a launch start from the forkserver, not from the
(growing) main process: every epoch's workers are children of the same small server, which
was started with the job's preemption signals blocked."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset

from pretrain.cluster.signals import PREEMPTION_SIGNALS
from pretrain.data.worker_processes import worker_context


class WhoAmI(IterableDataset):
    """Yields (worker pid, its parent's pid, whether every preemption signal is blocked) once
    per worker."""

    def __iter__(self):
        blocked = set(PREEMPTION_SIGNALS) <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
        yield torch.tensor([os.getpid(), os.getppid(), int(blocked)])


def epoch_workers(context) -> list[list[int]]:
    loader = DataLoader(WhoAmI(), batch_size=None, num_workers=2, multiprocessing_context=context)
    return [batch.tolist() for batch in loader]


def test_every_epochs_workers_are_forked_by_the_same_server_with_signals_blocked():
    assert worker_context(0) is None  # no workers: the DataLoader's own default
    context = worker_context(2)
    assert context.get_start_method() == "forkserver"
    first, second = epoch_workers(context), epoch_workers(context)
    servers = {parent for _, parent, _ in first + second}
    assert len(servers) == 1 and os.getpid() not in servers  # not forked from this process
    assert {pid for pid, _, _ in first}.isdisjoint(pid for pid, _, _ in second)  # new workers
    assert all(blocked for _, _, blocked in first + second)  # before any worker_init_fn ran
    # the main process keeps its signals
    assert not set(PREEMPTION_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_fresh_process_starts_its_forkserver_with_sigterm_blocked(tmp_path):
    """The launch's first loader starts the forkserver in a process whose multiprocessing
    resource tracker is not running yet (starting that one unblocks SIGTERM): the workers
    still start with every preemption signal blocked, so a job's SIGTERM cannot end them or
    the forkserver before `ignore_in_data_worker` runs, and the tracker blocks or ignores
    them too (a job's USR1 ended it, and the next one was told to forget unknown names)."""
    script = tmp_path / "first_loader.py"
    script.write_text(
        "from multiprocessing import resource_tracker\n"
        "from test_worker_processes import WhoAmI, epoch_workers, signals_held, worker_context\n"
        "if __name__ == '__main__':\n"
        "    print(all(blocked for _, _, blocked in epoch_workers(worker_context(2))))\n"
        "    print(signals_held(resource_tracker._resource_tracker._pid))\n"
    )
    result = run_script(script)
    assert result.stdout.split() == ["True", "True"], result.stderr[-3000:]


def run_script(script: Path) -> subprocess.CompletedProcess:
    """`python script` in a fresh process that can import this test module."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )


def signals_held(pid: int) -> bool:
    """Whether process `pid` blocks or ignores every preemption signal (/proc/<pid>/status)."""
    status = dict(line.split(":\t") for line in open(f"/proc/{pid}/status").read().splitlines())
    held = int(status["SigBlk"], 16) | int(status["SigIgn"], 16)
    return all(held >> (signum - 1) & 1 for signum in PREEMPTION_SIGNALS)


def test_workers_do_not_run_the_entry_script_again(tmp_path):
    """The forkserver imports the entry script once ("__main__" in its preload); a worker
    forked from it finds the script imported and runs nothing of it (before, every worker
    of every epoch ran the whole script, its imports included: the standard library's
    forkserver never got the script's path)."""
    ran = tmp_path / "ran_in"
    script = tmp_path / "entry.py"
    script.write_text(
        "import os\n"
        f"with open({str(ran)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "from test_worker_processes import epoch_workers, worker_context\n"
        "if __name__ == '__main__':\n"
        "    context = worker_context(2)\n"
        "    print(os.getpid(), os.getpid())\n"
        "    for pid, parent, _ in epoch_workers(context) + epoch_workers(context):\n"
        "        print(pid, parent)\n"
    )
    result = run_script(script)
    (main, _), *workers = [tuple(map(int, line.split())) for line in result.stdout.splitlines()]
    assert len(workers) == 4, result.stderr[-3000:]
    servers = {parent for _, parent in workers}
    assert len(servers) == 1 and main not in servers
    # once in the main process, once in the forkserver; in none of the 4 workers
    assert sorted(map(int, ran.read_text().split())) == sorted({main, *servers})
