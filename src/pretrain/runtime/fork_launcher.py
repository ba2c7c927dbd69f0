"""Local ranks of a CPU run forked from rank 0 instead of started as new interpreters.

Lightning starts the other local ranks of a one-node run (`trainer.devices=2`, no cluster
launcher) by running the command line again: each rank imports torch, Lightning and
DeepSpeed and composes the config anew, 10-13 s of CPU on a 2-core machine, before the first
collective, while rank 0 waits. `ForkLauncher` forks them from rank 0 at the same point
(`Trainer.fit`, before any process group exists), so they start in milliseconds with the
same modules, config, model and random state a new interpreter would have built. The child
then is the rank Lightning would have started: `LOCAL_RANK` set, Lightning's rank-zero
filter at its rank, its log in `train_ddp_process_<rank>.log` of the run directory (the file
Lightning's command line gives it), ending when rank 0 dies
(`pretrain.cluster.local_ranks.follow_launcher`).

It forks only where that is safe, else it runs the command line as Lightning does:
- every device is the CPU (a CUDA context does not survive a fork);
- this process is a console script that ends itself after `main` (`pretrain.cluster.process_exit`),
  so a forked rank never returns into a caller's code (an in-process `main`, a submitit job);
- one thread (no lock held by another thread can be inherited), no multiprocessing children,
  and one torch thread (an OpenMP pool does not survive a fork);
- `PRETRAIN_FORK_RANKS` is not `0` (the switch back to Lightning's way).
"""

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from pretrain.cluster.local_ranks import follow_launcher
from pretrain.cluster.process_exit import ends_process
from pretrain.lightning_compat import LocalRanksLauncher

FORK_RANKS = "PRETRAIN_FORK_RANKS"  # "0": start local ranks by running the command line again
log = logging.getLogger(__name__)
_POLL_S = 0.05  # how often `ForkedRank.wait` with a timeout looks at the child (seconds)


def can_fork(devices: list[torch.device]) -> bool:
    """True when the local ranks of a run on `devices` may be forked (the module doc)."""
    return (
        os.environ.get(FORK_RANKS) != "0"
        and all(device.type == "cpu" for device in devices)
        and ends_process()
        and threading.active_count() == 1
        and not multiprocessing.active_children()
        and torch.get_num_threads() == 1
    )


class ForkedRank:
    """A local rank forked from this process, with the part of `subprocess.Popen` that
    Lightning's launcher and child-process observer and `wait_for_local_ranks` use: `pid`,
    `returncode` (negative: the signal that ended it), `poll`, `wait`, `send_signal`, `kill`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()  # the observer thread and the main thread both poll

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"local rank (pid {self.pid})", timeout)
            time.sleep(_POLL_S)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkLauncher(LocalRanksLauncher):
    """Lightning's launcher of a one-node run's local ranks, forking them when `can_fork`
    (the module doc) and otherwise running the command line again, as Lightning does."""

    def __init__(self, *args, devices: list[torch.device], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.devices = devices

    def start_local_ranks(self) -> None:
        if not can_fork(self.devices):
            return super().start_local_ranks()
        self.check_can_start_local_ranks()
        self.procs = []
        environment = self.cluster_environment  # the variables Lightning's command line gets
        os.environ["MASTER_ADDR"] = environment.main_address
        os.environ["MASTER_PORT"] = str(environment.main_port)
        os.environ["NODE_RANK"] = str(environment.node_rank())
        os.environ["LOCAL_RANK"] = str(environment.local_rank())
        os.environ["WORLD_SIZE"] = str(self.num_processes * self.num_nodes)
        log.info(
            f"local ranks 1-{self.num_processes - 1} forked from rank 0 "
            f"(pid {os.getpid()}; {FORK_RANKS}=0 starts them as new processes)"
        )
        for stream in (sys.stdout, sys.stderr):  # or each process would write it again
            stream.flush()
        for local_rank in range(1, self.num_processes):
            pid = os.fork()
            if pid == 0:
                self.procs = []
                become_local_rank(local_rank, environment.node_rank() * self.num_processes)
                return None
            self.procs.append(ForkedRank(pid))
        return None


def become_local_rank(local_rank: int, node_offset: int) -> None:
    """In a forked child: be local rank `local_rank` (global rank `node_offset + local_rank`)
    as Lightning's command line would have made it."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    os.environ["LOCAL_RANK"] = str(local_rank)
    rank_zero_only.rank = fabric_rank_zero.rank = node_offset + local_rank
    follow_launcher()
    for handler in logging.getLogger().handlers:  # Hydra's job log: this rank's own file
        if isinstance(handler, logging.FileHandler):
            handler.close()
            path = Path(handler.baseFilename).with_name(f"train_ddp_process_{local_rank}.log")
            handler.baseFilename = str(path)
            handler.stream = handler._open()
