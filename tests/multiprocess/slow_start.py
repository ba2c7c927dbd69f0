"""A test-only corruption whose second data-loader worker of a rank starts late
(`SlowStartMLM`): with PRETRAIN_TEST_SLOW_START_DIR set, the first of a rank's workers to
unpickle the corruption goes on at once and the others wait, inside their start (before
they rebuild their queues), until the rank's main process has gone, as a worker descheduled
by a loaded machine would. A module of its own: the forkserver preloads the corruption's
module, and this one imports nothing the run's workers would not."""

import os
import time
from dataclasses import dataclass
from pathlib import Path

from pretrain.objectives.mlm import MaskedLanguageModel, MaskedLMCorruption

WAIT_CAP_S = 120  # a guard: a main process that never ends does not keep a worker for good


def _parent(pid: int) -> int:
    """The parent pid of process `pid` (0 when it has gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass(frozen=True)
class SlowStartMLMCorruption(MaskedLMCorruption):
    """MLM's corruption whose unpickling holds every worker of a rank but the first."""

    def __setstate__(self, state: dict) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        directory = os.environ.get("PRETRAIN_TEST_SLOW_START_DIR")
        if not directory:
            return
        main = _parent(os.getppid())  # a worker's parent is the forkserver, the rank's child
        try:
            os.close(os.open(Path(directory) / f"{main}.first", os.O_CREAT | os.O_EXCL))
            return  # the rank's first worker
        except FileExistsError:
            pass
        deadline = time.monotonic() + WAIT_CAP_S
        while Path(f"/proc/{main}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # polls for the main process's end


class SlowStartMLM(MaskedLanguageModel):
    """MLM whose data-loader workers start as `SlowStartMLMCorruption`'s."""

    corruption_class = SlowStartMLMCorruption
