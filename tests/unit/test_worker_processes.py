"""Data-loader workers of every epoch of a launch start from the forkserver, not from the
(growing) main process: every epoch's workers are children of the same small server, which
was started with the job's preemption signals blocked."""

import os
import signal

import torch
from torch.utils.data import DataLoader, IterableDataset

from pretrain.data.worker_processes import worker_context
from pretrain.job_signals import PREEMPTION_SIGNALS


class WhoAmI(IterableDataset):
    """Yields (worker pid, its parent's pid, whether SIGUSR1 is blocked) once per worker."""

    def __iter__(self):
        blocked = signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
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
