"""Loading a checkpoint imports DeepSpeed only when the file names one of its classes: a DDP
run's resume and export never pay its import (1.5 s a process, issue 57's CI time)."""

import subprocess
import sys

import pytest
import torch

FRESH_LOADS = """
import io, sys
from pretrain.checkpoint.safety import UnsafeCheckpointError, load_weights_only
plain, bookkeeping, function = sys.argv[1:]
assert load_weights_only(plain)["w"].sum() == 4
assert "deepspeed" not in sys.modules, "a plain checkpoint imported DeepSpeed"
with open(bookkeeping, "rb") as f:  # a file object is read again from where it stood
    f.read(0)
    assert load_weights_only(io.BytesIO(f.read()))["slices"]["w"].numel == 4
assert "deepspeed" in sys.modules
try:
    load_weights_only(function)
except UnsafeCheckpointError as error:
    assert "\\n" not in str(error)
    print("refused:", error)
"""


def test_deepspeed_is_imported_only_for_a_file_that_names_its_classes(tmp_path):
    """A DDP run's resume and export never pay DeepSpeed's import (1.5 s a process); a ZeRO
    file's bookkeeping classes still load, in a process that had not imported DeepSpeed; any
    other DeepSpeed global is refused in one line."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.utils import see_memory_usage
    from deepspeed.utils.tensor_fragment import fragment_address

    paths = [tmp_path / f"{name}.pt" for name in ("plain", "bookkeeping", "function")]
    torch.save({"w": torch.ones(4)}, paths[0])
    torch.save({"slices": {"w": fragment_address(numel=4, start=0)}}, paths[1])
    torch.save({"f": see_memory_usage}, paths[2])
    done = subprocess.run(
        [sys.executable, "-c", FRESH_LOADS, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refusal = [line for line in done.stdout.splitlines() if line.startswith("refused: ")]
    assert len(refusal) == 1 and str(paths[2]) in refusal[0], done.stdout
    assert "deepspeed.runtime.utils.see_memory_usage" in refusal[0]
