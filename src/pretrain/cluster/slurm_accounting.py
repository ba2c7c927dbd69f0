"""SLURM clusters without job accounting, as seen by a sweep's submitit launcher.

submitit polls `sacct` for the state of a sweep's jobs. A cluster without job accounting (no
slurmdbd: `slurm/local-cluster`, small clusters) makes every poll fail, and submitit logs
"Bypassing sacct error ..., status may be inaccurate" each time, although it then reads each
job's result from its `.submitit/` folder and the sweep completes all the same. `SlurmAccounting`
(a Hydra callback of every `pretrain -m` run, conf/train.yaml) says so once instead, and
leaves submitit's warning alone where accounting is on (a failing sacct is news there).
Standard library only: Hydra instantiates callbacks before any run.
"""

import logging
import shutil
import subprocess
from typing import Any

from hydra.experimental.callback import Callback

SACCT_WARNING = "Bypassing sacct error"


def accounting_disabled() -> bool:
    """Whether `scontrol show config` says AccountingStorageType=accounting_storage/none
    (False where scontrol is missing or fails: then nothing is known)."""
    if shutil.which("scontrol") is None:
        return False
    try:
        text = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() == "accounting_storage/none"
    return False


def without_sacct_warnings(record: logging.LogRecord) -> bool:
    """A logging filter: False (drop) for submitit's per-poll sacct warning."""
    return SACCT_WARNING not in record.getMessage()


class SlurmAccounting(Callback):
    """In a sweep through the submitit launcher on a cluster without job accounting: one line
    saying where job states come from, and submitit's per-poll sacct warning filtered out."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if "submitit" not in launcher.lower() or "Local" in launcher:
            return
        if not accounting_disabled():
            return
        logging.getLogger("submitit").addFilter(without_sacct_warnings)
        print(
            "SLURM job accounting is disabled on this cluster "
            "(AccountingStorageType=accounting_storage/none): submitit reads each job's "
            "state from its .submitit/ folder instead of sacct (slurm/README.md)",
            flush=True,
        )
