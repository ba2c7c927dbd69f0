"""A test-only corruption whose data-loader worker hangs (`dist_helpers.HangingWorkerMLM`):
with PRETRAIN_TEST_WORKER_HANG_BATCHES=N, a worker of local rank
PRETRAIN_TEST_WORKER_HANG_RANK (default 1) corrupts N batches, then blocks for an hour, as a
worker stuck on a dead mount would. A module of its own: the forkserver preloads the
corruption's module, and this one imports nothing the run's workers would not."""

import os
import time
from dataclasses import dataclass

from pretrain.objectives.mlm import MaskedLMCorruption

_batches = [0]  # batches this worker process corrupted


@dataclass(frozen=True)
class HangingMLMCorruption(MaskedLMCorruption):
    """MLM's corruption that hangs in one rank's worker after a number of batches."""

    def __call__(self, batch: dict, epoch: int) -> dict:
        limit = int(os.environ.get("PRETRAIN_TEST_WORKER_HANG_BATCHES", "-1"))
        rank = os.environ.get("PRETRAIN_TEST_WORKER_HANG_RANK", "1")
        if limit >= 0 and os.environ.get("LOCAL_RANK", "0") == rank and _batches[0] >= limit:
            time.sleep(3600)
        _batches[0] += 1
        return super().__call__(batch, epoch)
