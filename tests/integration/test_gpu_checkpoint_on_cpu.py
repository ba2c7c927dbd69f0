"""A checkpoint written on a GPU is read on any host (issue 58 item 3): every read of a
checkpoint maps its tensors to the CPU, so `resume=auto` continues a checkpoint whose
storages are tagged `cuda:0` on a host without CUDA instead of skipping it as unreadable."""

import csv
from pathlib import Path

import pytest
import torch
from test_nonfinite import tiny_config

from pretrain.runtime.run import run_or_exit


def retag_as_cuda(path: Path) -> None:
    """Rewrite the checkpoint file `path` as a GPU run would have saved it: the same
    contents, every storage's location tag `cuda:0` (torch's serialization stores it per
    storage, and restores it there unless a map_location says otherwise)."""
    state = torch.load(path, weights_only=True, map_location="cpu")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host without CUDA")
def test_resume_auto_continues_a_gpu_checkpoint_on_a_cpu_host(prepared_corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    schedule = "optim.schedule_steps=4"  # the schedule runs on past the first launch
    first = ["trainer.max_steps=2", "trainer.checkpoint_every_n_steps=2", schedule]
    run_or_exit(tiny_config(prepared_corpus, run_dir, *first))
    checkpoints = sorted((run_dir / "checkpoints").glob("*.ckpt"))
    assert {p.name for p in checkpoints} == {"last.ckpt", "step-0000002.ckpt"}
    for path in checkpoints:
        retag_as_cuda(path)
    with pytest.raises(RuntimeError, match="CUDA"):  # the tags hold: torch's default fails
        torch.load(checkpoints[0], weights_only=True)
    capsys.readouterr()

    run_or_exit(tiny_config(prepared_corpus, run_dir, "trainer.max_steps=4", schedule))
    out = capsys.readouterr().out
    assert "skipping unreadable checkpoint" not in out
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 4
    rows = csv.DictReader(open(sorted(run_dir.glob("csv/version_*/metrics.csv"))[-1]))
    steps = sorted({int(r["step"]) for r in rows if r.get("train/loss")})
    assert steps[0] == 2  # the second launch continued from step 2, not from scratch
