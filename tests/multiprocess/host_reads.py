"""CUDA's sync-debug semantics emulated on the CPU for a training step (issue 58 item 5):
inside `HostReads`, reading a tensor on the host (`Tensor.item`, `Tensor.__bool__`,
`Tensor.tolist`), copying host values to a device tensor (`torch.tensor(..., device=...)`) and
`torch.distributed.barrier` raise RuntimeError, as each blocks the host on a GPU. The one
exceptions are code whose tensors are host tensors by construction (`HOST_SIDE`): the data
fetch and the batch's host preparation before it moves to the device (Lightning's fetcher, the
data module's `on_before_batch_transfer`) and `collectives.reduce_on_host` and `LaggedSum`
(all-reduces over the CPU group). `StepGuard` applies it from each step's start
to its end, the launch's first step and log steps excepted (they may read back)."""

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher

from pretrain.cluster import collectives
from pretrain.data.datamodule import PretrainingDataModule
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.runtime.progress_log import is_log_step

# functions whose tensors live on the host, wherever they are on the stack
HOST_SIDE = {
    collectives.reduce_on_host.__code__,
    collectives.LaggedSum.launch.__code__,  # the step's agreement, a step ahead
    collectives.LaggedSum.result.__code__,
    PretrainingDataModule.on_before_batch_transfer.__code__,
    _DataFetcher.__next__.__code__,
    _PrefetchDataFetcher.__next__.__code__,
}


def on_host_side() -> bool:
    """Whether a HOST_SIDE function is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in HOST_SIDE:
            return True
        frame = frame.f_back
    return False


class HostReads:
    """The patches, entered and left as a context (not re-entrant)."""

    def __enter__(self) -> "HostReads":
        self._saved = {
            (torch.Tensor, "item"): torch.Tensor.item,
            (torch.Tensor, "__bool__"): torch.Tensor.__bool__,
            (torch.Tensor, "tolist"): torch.Tensor.tolist,
            (torch, "tensor"): torch.tensor,
            (dist, "barrier"): dist.barrier,
        }
        for (owner, name), original in self._saved.items():
            setattr(owner, name, self._refusing(name, original))
        return self

    def __exit__(self, *_: object) -> None:
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)

    @staticmethod
    def _refusing(name: str, original):
        def refuse(*args, **kwargs):
            copies = name != "tensor" or kwargs.get("device") is not None
            if copies and not on_host_side():
                what = "torch.tensor(..., device=...)" if name == "tensor" else name
                raise RuntimeError(f"{what} in a training step: the host waits for the device")
            return original(*args, **kwargs)

        return refuse


class StepGuard(L.Callback):
    """Every micro-batch of a step but the launch's first and the log steps (the run's last
    included) runs under `HostReads` (and `extra`, a context factory, when given), from its
    `on_train_batch_start` to the next one's (or the epoch's end): the module's own batch-end
    hook, which Lightning calls after the callbacks', included. `guarded` lists the steps of
    the guarded micro-batches."""

    def __init__(self, extra=None) -> None:
        self.extra, self.active, self.guarded = extra, [], []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.leave()
        step = trainer.global_step
        if step > 0 and not is_log_step(step + 1, trainer.log_every_n_steps, trainer.max_steps):
            self.active = [HostReads()] + ([self.extra()] if self.extra else [])
            for context in self.active:
                context.__enter__()
            self.guarded.append(step)

    def on_train_epoch_end(self, trainer, module) -> None:
        self.leave()

    def on_exception(self, trainer, module, exception) -> None:
        self.leave()

    def leave(self) -> None:
        """Leave the patches (also after an error inside a step)."""
        for context in reversed(self.active):
            context.__exit__(None, None, None)
        self.active = []


class GuardedMLM(MaskedLanguageModel):
    """MLM whose run trains under `StepGuard` (added to the trainer at the first batch); at the
    end each rank writes its guarded steps to PRETRAIN_TEST_RECORD_DIR/guard<rank>.json."""

    def start_batch(self, task: L.LightningModule, batch: dict, batch_idx: int) -> None:
        super().start_batch(task, batch, batch_idx)
        callbacks = task.trainer.callbacks
        if not any(isinstance(c, StepGuard) for c in callbacks):
            callbacks.insert(0, RecordingGuard())  # first: its batch start runs before others'


class RecordingGuard(StepGuard):
    def on_train_end(self, trainer, module) -> None:
        self.leave()
        path = Path(os.environ["PRETRAIN_TEST_RECORD_DIR"]) / f"guard{trainer.global_rank}.json"
        path.write_text(json.dumps(self.guarded))
