"""Non-finite steps skipped on the device, without a host synchronisation per step.

Deciding on the host whether to apply an optimizer step reads a device flag every step
(`.item()`: the CPU waits for the GPU). Optimizers whose step takes a `found_inf` tensor
(torch's Adam/AdamW with `fused=True`, as `optim.optimizer.fused=true` sets; the ones
GradScaler drives without a sync) skip the update on the device instead: weights, moments
and the step count stay as they were when the flag is set. apex's capturable FusedAdam
(`kernels.optimizer_settings` builds it so) is told through its step's `grad_scaler`
argument, as torch's GradScaler tells it (`device_skip`). The host learns of skipped steps at the next logging step, checkpoint
or the end of fit (`DeviceSkips.settle`, one read), where they are counted, the bounds of
`trainer.nonfinite` are applied and the learning-rate schedule is moved back by the steps
skipped since (until then it ran ahead by that many steps). Other optimizers keep the host
decision of every step (`PretrainingTask.optimizer_step`).
"""

import contextlib
import inspect
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.utils import get_total_norm

if TYPE_CHECKING:
    from pretrain.config import TrainConfig


class NonFiniteError(RuntimeError):
    """A loss or gradient was NaN or infinite and `trainer.nonfinite` is `stop`, or too many
    optimizer steps were skipped for one (`check_skip_bounds`)."""


def skips_on_device(optimizer: object, precision: str) -> bool:
    """Whether `optimizer` (a torch optimizer, or Lightning's wrapper of one) takes a
    `found_inf` tensor, under a precision without a loss scaler (fp16's GradScaler sets that
    tensor itself)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    supported = getattr(optimizer, "_step_supports_amp_scaling", False)
    return bool(supported) and precision not in ("16-mixed", "16")


class FoundInf:
    """What apex's capturable optimizers read from their step's `grad_scaler` (torch's
    GradScaler's two methods): this step's `found_inf` and a loss scale of 1 (no scaler)."""

    def __init__(self, found_inf: torch.Tensor) -> None:
        self.found_inf = found_inf

    def _check_inf_per_device(self, optimizer: object) -> dict:
        devices = {p.device for g in optimizer.param_groups for p in g["params"]}
        return {device: self.found_inf.to(device) for device in devices}

    def _get_scale_async(self) -> torch.Tensor:
        return torch.ones((1,), device=self.found_inf.device)


@contextlib.contextmanager
def device_skip(optimizer: object, found_inf: torch.Tensor) -> Iterator[dict[str, Any]]:
    """Within: `optimizer` (for which `skips_on_device`) skips its step on the device when
    `found_inf` (a float 0/1 device scalar) is set; yields the keyword arguments its `step`
    needs for that. torch's optimizers read a `found_inf` attribute (set here, removed on
    leaving); apex's take `grad_scaler` (`FoundInf`), and their learning rate and step
    count, device tensors, are moved back to the device after a resume loaded them on CPU."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if "grad_scaler" in inspect.signature(inner.step).parameters:  # apex's capturable ones
        for group in inner.param_groups:
            device = group["params"][0].device if group["params"] else None
            for key, value in group.items():
                if isinstance(value, torch.Tensor) and device and value.device != device:
                    group[key] = value.to(device)
        yield {"grad_scaler": FoundInf(found_inf)}
        return
    inner.found_inf = found_inf
    try:
        yield {}
    finally:
        inner.__dict__.pop("found_inf", None)


def clear_gradients(optimizer: object) -> None:
    """Drop the gradients of `optimizer`'s parameters (a skipped step), whatever its
    `zero_grad` takes (apex's takes no `set_to_none`)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    for group in inner.param_groups:
        for parameter in group["params"]:
            parameter.grad = None


def nonfinite_flag(
    loss_flag: torch.Tensor | None,
    parameters: Iterable[torch.nn.Parameter],
    device: torch.device,
    check_gradients: bool = True,
) -> torch.Tensor:
    """A bool scalar on `device`, no host synchronisation: whether `loss_flag` (the step's
    micro-batches had a non-finite loss) is set or, with `check_gradients`, a gradient of
    `parameters` holds an inf or NaN (their largest |value|, one foreach pass, is not
    finite)."""
    bad = torch.zeros((), dtype=torch.bool, device=device)
    if loss_flag is not None:
        bad = bad | loss_flag.to(device)
    grads = [p.grad for p in parameters if p.grad is not None] if check_gradients else []
    if grads:
        bad = bad | ~torch.isfinite(get_total_norm(grads, norm_type=float("inf")))
    return bad


class DeviceSkips:
    """Counters on the device of the optimizer steps skipped (all ranks agreed) since the
    last `settle`: how many, the current run of skipped steps in a row, and its longest."""

    def __init__(self) -> None:
        self._counts: torch.Tensor | None = None  # (skipped, run, longest run) int64

    def record(self, bad_ranks: torch.Tensor) -> torch.Tensor:
        """Count this step's flag (`bad_ranks`: ranks with a non-finite loss or gradient, a
        device scalar); returns the step's `found_inf` (float32 0/1) on the same device."""
        bad = (bad_ranks > 0).to(torch.int64)
        if self._counts is None:
            self._counts = torch.zeros(3, dtype=torch.int64, device=bad.device)
        skipped, run, longest = self._counts.unbind()
        run = (run + 1) * bad
        self._counts = torch.stack((skipped + bad, run, torch.maximum(longest, run)))
        return bad.to(torch.float32)

    def settle(self) -> tuple[int, int, int] | None:
        """(steps skipped, current run in a row, longest run in a row) since the last settle,
        read on the host (a synchronisation: call on logging steps); the counts restart, the
        current run carries on. None when no step was recorded."""
        if self._counts is None:
            return None
        skipped, run, longest = self._counts.tolist()
        self._counts = torch.tensor([0, run, run], dtype=torch.int64, device=self._counts.device)
        return skipped, run, longest


def check_skip_bounds(run: "TrainConfig", step: int, skipped: int, longest: int) -> None:
    """NonFiniteError at optimizer step `step` once `skipped` steps in all reach
    trainer.max_skipped_steps (the run is unstable) or `longest` steps in a row reach
    trainer.max_consecutive_skipped_steps (the run diverged); the message says what to do."""
    budget = run.trainer.max_skipped_steps
    if budget is not None and skipped >= budget:
        raise NonFiniteError(
            f"step {step}: {skipped} optimizer steps skipped for a "
            f"non-finite loss or gradient in all (trainer.max_skipped_steps={budget}): the "
            "run is unstable. Lower optim.optimizer.lr or lengthen the warm-up and resume "
            "from an earlier step-*.ckpt, or raise trainer.max_skipped_steps"
        )
    bound = run.trainer.max_consecutive_skipped_steps
    if bound is not None and longest >= bound:
        raise NonFiniteError(
            f"step {step}: {longest} optimizer steps in a "
            f"row skipped for a non-finite loss or gradient ({skipped} in all; "
            f"trainer.max_consecutive_skipped_steps={bound}): the run diverged. Lower "
            f"optim.optimizer.lr (now {run.optim.optimizer['lr']}) or lengthen the "
            "warm-up, and start over (resume=never) or resume from an earlier step-*.ckpt"
        )
