"""A crash while writing a checkpoint never leaves a corrupt one to resume from."""

import pytest
import torch

from pretrain import checkpointing
from pretrain.checkpointing import AtomicCheckpointIO, find_resume_checkpoint


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1, "weights": torch.ones(3)}, path)

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # killed while writing

    monkeypatch.setattr(checkpointing.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "weights": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert (path.parent / "last.ckpt.partial").exists()
    # resuming ignores and removes the partial file
    assert find_resume_checkpoint(tmp_path, "auto") == str(path)
    assert not (path.parent / "last.ckpt.partial").exists()


def test_resume_modes(tmp_path):
    assert find_resume_checkpoint(tmp_path, "auto") is None  # nothing yet: start
    assert find_resume_checkpoint(tmp_path, "never") is None
    with pytest.raises(FileNotFoundError, match="resume="):
        find_resume_checkpoint(tmp_path, str(tmp_path / "missing.ckpt"))


def test_config_changes_lists_what_differs():
    from pretrain.checkpointing import config_changes

    saved = {"resume": "auto", "optim": {"lr": 1e-4, "betas": [0.9, 0.999]}, "seed": 1}
    current = {
        "resume": "never",
        "optim": {"lr": 2e-4, "betas": [0.9, 0.999]},
        "seed": 1,
        "extra": True,
    }
    assert config_changes(saved, current) == [
        "extra: '<unset>' -> True",
        "optim.lr: 0.0001 -> 0.0002",
    ]
    assert config_changes(saved, saved) == []
