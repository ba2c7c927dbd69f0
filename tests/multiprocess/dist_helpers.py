"""Test-only objective for multi-process runs (`objective._target_=dist_helpers.RecordingMLM`
with `tests/` on PYTHONPATH): the MLM module that records, per rank, the sample keys and loss
of every micro-batch and, at the end, its skipped steps, learning-rate scheduler steps and a
checksum of its parameters; it can force a NaN loss on one rank at one step.

Environment: PRETRAIN_TEST_RECORD_DIR (where rank<r>.jsonl files go), PRETRAIN_TEST_NAN_STEP
and PRETRAIN_TEST_NAN_RANK (optimizer step and rank whose loss is multiplied by NaN)."""

import json
import os
from pathlib import Path

import torch

from pretrain.objectives.mlm import MaskedLanguageModel


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


class RecordingMLM(MaskedLanguageModel):
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        nan_step = int(os.environ.get("PRETRAIN_TEST_NAN_STEP", "-1"))
        nan_rank = int(os.environ.get("PRETRAIN_TEST_NAN_RANK", "0"))
        if self.global_step == nan_step and self.global_rank == nan_rank:
            loss = loss * float("nan")  # NaN loss and NaN gradients, this rank only
        _record(
            self.global_rank,
            {"step": self.global_step, "keys": list(batch["keys"]), "loss": float(loss)},
        )
        return loss

    def on_train_end(self) -> None:
        scheduler = self.lr_schedulers()
        checksum = sum(
            float(getattr(p, "ds_tensor", p).detach().double().sum()) for p in self.parameters()
        )
        _record(
            self.global_rank,
            {
                "end": True,
                "skipped_steps": self.skipped_steps,
                "scheduler_steps": scheduler.last_epoch,
                "param_checksum": checksum,
            },
        )
