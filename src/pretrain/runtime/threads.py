"""How many CPU threads a training process's torch operators use (`trainer.num_threads`).

torch's default is one thread per core of the machine. When other processes share those
cores (other runs, the test suite, a colleague's job), every intra-op thread pool then has
more threads than it gets cores, each operator waits on its slowest, descheduled thread, and
a step can take 20 times longer. A run takes the cores it may use, split between the
training processes of a node; data-loader workers use one thread each
(pretrain.data.worker_processes.init_data_worker)."""

import os
from collections.abc import Mapping


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask: `taskset`, a SLURM or container
    CPU set), not every core of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS)
        return os.cpu_count() or 1


def training_threads(
    num_threads: int | None, devices: object = 1, environ: Mapping[str, str] = os.environ
) -> int:
    """Threads per training process: `num_threads` when set; else OMP_NUM_THREADS when it is
    set to a positive number (a job script's, the tests'); else the available cores split
    between the node's training processes: `devices` of them when an integer (`trainer.devices`,
    one process each), else 1; at least 1 thread each."""
    if num_threads is not None:
        return num_threads
    exported = environ.get("OMP_NUM_THREADS", "").strip()
    if exported.isdigit() and int(exported) >= 1:
        return int(exported)
    processes = devices if isinstance(devices, int) and devices >= 1 else 1
    return max(1, available_cores() // processes)


def set_training_threads(num_threads: int | None, devices: object = 1) -> int:
    """Set torch's intra-op threads for this process (`training_threads`); returns them."""
    import torch

    threads = training_threads(num_threads, devices)
    torch.set_num_threads(threads)
    return threads


def loader_workers(num_workers: int, remote_corpus: bool, cores: int | None = None) -> int:
    """Data-loader worker processes a training process starts: `num_workers`
    (`data.num_workers`), but none where the process may run on one core only (`cores`,
    default `available_cores()`: `taskset`, a one-CPU SLURM task or container) and the corpus
    is local: a worker would share that core with training, buys no parallelism, and starts a
    second interpreter (the forkserver's torch import) before the first batch. A corpus at a
    URL keeps its workers (they overlap the network's waits). The batches are the same with
    any number of workers (the stream's order never depends on them)."""
    if num_workers and not remote_corpus and (cores or available_cores()) == 1:
        return 0
    return num_workers
