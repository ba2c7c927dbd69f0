"""Test-only objectives for multi-process runs (`objective._target_=dist_helpers.RecordingMLM`,
or `RecordingXLNet`, `RecordingUniLM`, with `tests/` on PYTHONPATH): an objective that records, per rank, the sample keys and loss
of every micro-batch and, at the end, its skipped steps, learning-rate scheduler steps, epoch
tails and a checksum of its parameters; it can inject faults at one optimizer step of one rank.

Environment: PRETRAIN_TEST_RECORD_DIR (where rank<r>.jsonl files go); faults, each at the
steps PRETRAIN_TEST_<FAULT>_STEP (one, or several separated by commas) of rank
PRETRAIN_TEST_<FAULT>_RANK (default 0): NAN (the loss is multiplied by NaN), SIGTERM (the rank
sends itself SIGTERM, as a preemption does), HANG (the rank sleeps for an hour, as a stuck
rank would), HOLD (the rank waits until a preemption signal has come: a job that SLURM
signals after a delay is still training then, whatever the machine's speed; not in a
requeued SLURM job, SLURM_RESTART_COUNT > 0, which gets no further signal).
`HangingWorkerMLM` also hangs a data-loader worker (`worker_faults`)."""

import json
import os
import signal
import time
from pathlib import Path

import lightning as L
from worker_faults import HangingMLMCorruption

from pretrain.cluster.preemption import PreemptionCheckpoint
from pretrain.data.loader import predicted_tokens
from pretrain.objectives.base import Losses
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.objectives.unilm import UniLM
from pretrain.objectives.xlnet import PermutationLanguageModel

RECORDING_MLM = (  # overrides of a run whose ranks record what they train (`RecordingMLM`)
    "model.hidden_dropout_prob=0",
    "model.attention_probs_dropout_prob=0",
    "objective=mlm",
    "objective._target_=dist_helpers.RecordingMLM",
    "data=full_sentences",
)


def _record(rank: int, entry: dict) -> None:
    directory = os.environ.get("PRETRAIN_TEST_RECORD_DIR")
    if directory:
        with open(Path(directory) / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_records(directory: Path) -> dict[int, list[dict]]:
    """{rank: [entries in order]} from a record directory."""
    return {
        int(path.stem.removeprefix("rank")): [json.loads(line) for line in path.open()]
        for path in sorted(Path(directory).glob("rank*.jsonl"))
    }


class EndRecord(L.Callback):
    """At the end of fit: the task's skipped steps, epoch tails, scheduler steps and a
    checksum of its parameters (ZeRO-3: this rank's partitions)."""

    def on_train_end(self, trainer: L.Trainer, task: L.LightningModule) -> None:
        checksum = sum(
            float(getattr(p, "ds_tensor", p).detach().double().sum()) for p in task.parameters()
        )
        _record(
            task.global_rank,
            {
                "end": True,
                "skipped_steps": task.skipped_steps,
                "loaders": task.loaders,
                "scheduler_steps": task.lr_schedulers().last_epoch,
                "param_checksum": checksum,
            },
        )


class Recording:
    """Mixin over an objective: records each trained micro-batch and injects faults (see the
    module doc); adds `EndRecord` to the trainer at the first batch."""

    def start_batch(self, task: L.LightningModule, batch: dict, batch_idx: int) -> None:
        super().start_batch(task, batch, batch_idx)
        if not any(isinstance(c, EndRecord) for c in task.trainer.callbacks):
            task.trainer.callbacks.append(EndRecord())
        object.__setattr__(self, "_task", task)  # not a submodule

    def _fault(self, name: str) -> bool:
        steps = os.environ.get(f"PRETRAIN_TEST_{name}_STEP", "-1").split(",")
        rank = int(os.environ.get(f"PRETRAIN_TEST_{name}_RANK", "0"))
        return str(self._task.global_step) in steps and self._task.global_rank == rank

    def _hold_until_preempted(self) -> None:
        preemption = next(
            c for c in self._task.trainer.callbacks if isinstance(c, PreemptionCheckpoint)
        )
        while preemption.received is None:
            time.sleep(0.05)  # polls the flag the signal handler sets

    def forward(self, batch: dict) -> Losses:
        losses = super().forward(batch)
        task = getattr(self, "_task", None)
        if task is None or not self.training:  # not a training step (held-out evaluation)
            return losses
        loss = losses.loss
        if self._fault("NAN"):
            loss = loss * float("nan")  # NaN loss and NaN gradients, this rank only
        if self._fault("SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
        if self._fault("HANG"):
            time.sleep(3600)
        if self._fault("HOLD") and int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0:
            self._hold_until_preempted()
        _record(
            task.global_rank,
            {
                "step": task.global_step,
                "epoch": task.current_epoch,
                "keys": list(batch["keys"]),
                "loss": float(loss),
                "tokens": predicted_tokens(batch),  # what the loss is the mean over
            },
        )
        return Losses(loss, losses.metrics)


class RecordingMLM(Recording, MaskedLanguageModel):
    """MLM (and MLM with a pair task: objective=mlm_nsp or sop) that records."""


class HangingWorkerMLM(RecordingMLM):
    """RecordingMLM whose data-loader worker hangs (`worker_faults`: the environment)."""

    corruption_class = HangingMLMCorruption


class RecordingXLNet(Recording, PermutationLanguageModel):
    """XLNet's permutation LM (with memory under data=xlnet_memory) that records."""


class RecordingUniLM(Recording, UniLM):
    """UniLM's four attention masks that records."""
