"""Collectives the run itself makes (outside the strategy's gradient all-reduce), and what
happens when one never completes.

Every collective waits at most `trainer.collective_timeout_s` (the process group's timeout,
given to Lightning's DDP and DeepSpeed strategies): a rank that is stuck or dead makes the
others fail with a timeout instead of holding the job's nodes until its time limit.
`collective_failure` turns that into an error naming the step; `run_or_exit` exits with
status 4, and the local ranks Lightning started are stopped with it (under SLURM, srun's
--kill-on-bad-exit ends the job's other tasks).
"""

import datetime
import re
import signal

import torch
import torch.distributed as dist

_TIMEOUT = re.compile(r"timed out|timeout|connection closed|connection reset|broken pipe", re.I)


class CollectiveTimeout(RuntimeError):
    """A collective got no answer from the other ranks within trainer.collective_timeout_s."""


_HOST_GROUP: dict[str, object] = {}


def host_group(timeout_s: float) -> object | None:
    """A process group for host-side agreements: the default group when it is gloo, else a
    gloo group made once (collectively, the first time every rank calls this)."""
    if dist.get_backend() == "gloo":
        return None
    if "group" not in _HOST_GROUP:
        timeout = datetime.timedelta(seconds=timeout_s)
        _HOST_GROUP["group"] = dist.new_group(backend="gloo", timeout=timeout)
    return _HOST_GROUP["group"]


def reduce_on_host(value: int, op: dist.ReduceOp, timeout_s: float) -> int:
    """An integer reduced over all ranks (`op`: MIN, SUM), on the host; itself alone when
    the run has one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=op, group=host_group(timeout_s))
    return int(tensor.item())


def collective_failure(error: BaseException, trainer, timeout_s: float) -> CollectiveTimeout | None:
    """A `CollectiveTimeout` naming the step when `error` is a collective that timed out or
    lost its peers in a multi-rank run (the local ranks Lightning launched are killed, so
    none is left waiting), else None."""
    if trainer.world_size < 2 or not isinstance(error, RuntimeError):
        return None
    if not _TIMEOUT.search(str(error)):
        return None
    launcher = getattr(trainer.strategy, "launcher", None)
    if launcher is not None and hasattr(launcher, "kill"):
        launcher.kill(signal.SIGKILL)  # ranks started by this process (Lightning's launcher)
    return CollectiveTimeout(
        f"rank {trainer.global_rank}: a collective got no answer from the other ranks within "
        f"trainer.collective_timeout_s={timeout_s:g} s at step {trainer.global_step} (epoch "
        f"{trainer.current_epoch}); a rank is stuck or died (see its log). The run stops "
        f"instead of hanging; resume it from its last checkpoint ({type(error).__name__}: "
        f"{str(error).splitlines()[0][:200]})"
    )
