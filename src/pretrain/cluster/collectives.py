"""Collectives the run itself makes (outside the strategy's gradient all-reduce), and what
happens when one never completes.

Every collective waits at most `trainer.collective_timeout_s` (the process group's timeout):
a rank that is stuck or dead makes the others fail with a timeout instead of holding the
job's nodes until its time limit. Until the ranks have met (the launch's first step agreed),
they wait `trainer.startup_timeout_s` instead, when longer: the process group is made with
it (given to Lightning's DDP and DeepSpeed strategies), and `ranks_met` sets the shorter
wait on it and on the host group, so a rank that starts late on a loaded node is waited for
while one stuck mid-run is found soon.
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
    """A collective got no answer from the other ranks within the wait in force."""


_HOST_GROUP: dict[str, object] = {}
# The waits of this process's run (`use_timeouts`), and whether its ranks have met
_TIMEOUTS: dict[str, float | bool] = {"startup_s": 600.0, "collective_s": 600.0, "met": False}


def use_timeouts(startup_s: float, collective_s: float) -> float:
    """Record the run's waits (trainer.startup_timeout_s, trainer.collective_timeout_s); the
    process group's timeout until the ranks meet: the longer of the two."""
    _TIMEOUTS.update(startup_s=startup_s, collective_s=collective_s, met=False)
    return max(startup_s, collective_s)


def timeout_in_force() -> tuple[str, float]:
    """(config key, seconds) of the wait a collective gets now."""
    if _TIMEOUTS["met"] or _TIMEOUTS["collective_s"] >= _TIMEOUTS["startup_s"]:
        return "trainer.collective_timeout_s", float(_TIMEOUTS["collective_s"])
    return "trainer.startup_timeout_s", float(_TIMEOUTS["startup_s"])


def ranks_met() -> None:
    """Every rank has reached the launch's first step: from now on collectives wait
    trainer.collective_timeout_s (the default group and the host group, where they exist)."""
    if _TIMEOUTS["met"]:
        return
    _TIMEOUTS["met"] = True
    if not (dist.is_available() and dist.is_initialized()):
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    timeout = datetime.timedelta(seconds=float(_TIMEOUTS["collective_s"]))
    _set_pg_timeout(timeout)  # the default group
    if "group" in _HOST_GROUP:
        _set_pg_timeout(timeout, _HOST_GROUP["group"])


def host_group() -> object | None:
    """A process group for host-side agreements: the default group when it is gloo, else a
    gloo group made once (collectively, the first time every rank calls this), with the
    wait in force."""
    if dist.get_backend() == "gloo":
        return None
    if "group" not in _HOST_GROUP:
        timeout = datetime.timedelta(seconds=timeout_in_force()[1])
        _HOST_GROUP["group"] = dist.new_group(backend="gloo", timeout=timeout)
    return _HOST_GROUP["group"]


def reduce_on_host(value: int | list[int], op: dist.ReduceOp) -> int | list[int]:
    """An integer, or a list of them reduced element-wise in one all-reduce, over all ranks
    (`op`: MIN, SUM), on the host; itself alone when the run has one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor(value if isinstance(value, list) else [value], dtype=torch.int64)
    dist.all_reduce(tensor, op=op, group=host_group())
    return tensor.tolist() if isinstance(value, list) else int(tensor.item())


class LaggedSum:
    """A few integers summed over all ranks by one all-reduce that does not block the host:
    `launch` starts it on the host group (`async_op=True`) and returns at once; `result`,
    called a step later, waits for it (by then every rank has launched it, so in steady state
    the wait finds it done) and returns the sums. One process: the values themselves."""

    def __init__(self) -> None:
        self._work: dist.Work | None = None
        self._values: torch.Tensor | list[int] | None = None

    @property
    def pending(self) -> bool:
        """Whether a sum was launched and not read yet."""
        return self._values is not None

    def launch(self, values: list[int]) -> None:
        """Start summing `values` over all ranks (every rank launches the same length)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            self._values = list(values)
            return
        tensor = torch.tensor(values, dtype=torch.int64)
        self._work = dist.all_reduce(
            tensor, op=dist.ReduceOp.SUM, group=host_group(), async_op=True
        )
        self._values = tensor

    def result(self) -> list[int] | None:
        """The sums of the last `launch` (waiting for them when not done), or None when
        nothing is pending."""
        values, work = self._values, self._work
        self._values = self._work = None
        if work is not None:
            work.wait()
        return values.tolist() if isinstance(values, torch.Tensor) else values


def sum_on_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over all ranks, in place, on its device: one all-reduce, ordered on the
    device's stream, without Lightning's `strategy.reduce` barrier before it (a barrier that
    blocks the host under NCCL); itself when the run has one process."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def group_timeout_s() -> float | None:
    """The default process group's wait as the group holds it (what `ranks_met` set), in
    seconds; None where it cannot be read (no group, or no CPU backend in it)."""
    from torch.distributed.distributed_c10d import _get_default_group

    try:
        backend = _get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout.total_seconds()
    except (AttributeError, RuntimeError, ValueError):
        return None


def collective_failure(error: BaseException, trainer) -> CollectiveTimeout | None:
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
    key, timeout_s = timeout_in_force()
    held = group_timeout_s()
    group = "" if held is None else f" (the process group's wait: {held:g} s)"
    return CollectiveTimeout(
        f"rank {trainer.global_rank}: a collective got no answer from the other ranks within "
        f"{key}={timeout_s:g} s{group} at step {trainer.global_step} (epoch "
        f"{trainer.current_epoch}); a rank is stuck or died (see its log). The run stops "
        f"instead of hanging; resume it from its last checkpoint ({type(error).__name__}: "
        f"{str(error).splitlines()[0][:200]})"
    )
