"""Collectives a training step makes, counted per optimizer step on each rank (issue 54 item 3):
`CollectiveCounter` wraps `torch.distributed`'s collectives (all_reduce, broadcast, barrier,
all_gather, gather, scatter, reduce and their object forms) and the `Work` an asynchronous
one returns. A collective blocks the host when it is synchronous, or when its `Work` is waited
in the optimizer step that launched it (before its lag of a step). Collectives made by
`collectives.sum_on_device` are ordered on the accelerator's stream (NCCL does not block the
host); on the CPU every tensor is a host tensor, so they are told apart by the function, as
tests/multiprocess/host_reads.py tells the host-side code. DDP's gradient buckets are reduced
by its C++ reducer, which the wrappers do not see. `CountingMLM` (objective._target_, with
dist_helpers' RECORDING_MLM overrides) adds the counter at the first batch and writes `counts<rank>.json` to PRETRAIN_TEST_RECORD_DIR: per
step, the blocking collectives (by name), the device-ordered ones, the asynchronous launches
and their waits (the step each was waited in)."""

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import lightning as L
import torch.distributed as dist
from dist_helpers import RecordingMLM

from pretrain.cluster import collectives

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce",
    "reduce_scatter_tensor",
    "all_gather_object",
    "broadcast_object_list",
)


def on_device_stream() -> bool:
    """Whether `collectives.sum_on_device` is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is collectives.sum_on_device.__code__:
            return True
        frame = frame.f_back
    return False


class CountedWork:
    """An asynchronous collective's `Work`, whose waits are recorded."""

    def __init__(self, work, counter: "CollectiveCounter", name: str, step: int):
        self._work, self._counter, self._name, self._step = work, counter, name, step

    def wait(self, *args, **kwargs):
        self._counter.waited(self._name, self._step)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._work, name)


class CollectiveCounter(L.Callback):
    """Counts collectives per optimizer step (`step`: the trainer's global step at the call)."""

    def __init__(self) -> None:
        self.step = 0
        self.counts: dict[int, dict[str, list]] = defaultdict(
            lambda: {"blocking": [], "device": [], "launched": [], "waited": []}
        )
        self._saved = {name: getattr(dist, name) for name in COLLECTIVES}
        for name, original in self._saved.items():
            setattr(dist, name, self._wrap(name, original))

    def _wrap(self, name: str, original):
        def collective(*args, **kwargs):
            if kwargs.get("async_op"):
                self.counts[self.step]["launched"].append(name)
                return CountedWork(original(*args, **kwargs), self, name, self.step)
            kind = "device" if on_device_stream() else "blocking"
            self.counts[self.step][kind].append(name)
            return original(*args, **kwargs)

        return collective

    def waited(self, name: str, launched: int) -> None:
        """A `Work` launched at step `launched` is waited now: blocking within its step."""
        self.counts[self.step]["waited"].append([name, launched])
        if launched == self.step:
            self.counts[self.step]["blocking"].append(f"{name}.wait")

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.step = trainer.global_step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.step = trainer.global_step  # after the optimizer step: the next step's

    def on_train_end(self, trainer, module) -> None:
        self.step = trainer.global_step

    def teardown(self, trainer, module, stage: str) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        path = Path(os.environ["PRETRAIN_TEST_RECORD_DIR"]) / f"counts{trainer.global_rank}.json"
        path.write_text(json.dumps({str(step): c for step, c in sorted(self.counts.items())}))


class CountingMLM(RecordingMLM):
    """dist_helpers' recording MLM (its faults too) whose run counts its collectives
    (`CollectiveCounter`, added at the first batch, after the launch's first agreement)."""

    def start_batch(self, task: L.LightningModule, batch: dict, batch_idx: int) -> None:
        super().start_batch(task, batch, batch_idx)
        callbacks = task.trainer.callbacks
        if not any(isinstance(c, CollectiveCounter) for c in callbacks):
            callbacks.insert(0, CollectiveCounter())
