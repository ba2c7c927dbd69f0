"""A DeepSpeed ZeRO-2 checkpoint directory of the first layout (the objective was the
LightningModule: weights `encoder.*` and heads, not `objective.*`) resumes: DeepSpeed's engine
reads its files under today's names (`pretrain.checkpoint.compat.zero_state_with_task_names`)
and the run continues as the uninterrupted one (the same loss at the next step). The old
directory is made from a fresh one by renaming the names in its model-state file and its
optimizer shard, as the first layout wrote them."""

import csv
import shutil
from collections import OrderedDict
from pathlib import Path

import torch
from conftest import cpu_run_overrides
from zygote import run_pretrain

PREFIX = "objective."
ZERO2 = (
    "objective=mlm",
    "data=full_sentences",
    "strategy=deepspeed_zero2",
    "model.hidden_dropout_prob=0",
    "model.attention_probs_dropout_prob=0",
    "trainer.log_every_n_steps=1",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.keep_checkpoints=3",
)


def launch(shards_dir: Path, run_dir: Path, *extra: str) -> None:
    """`pretrain` on one CPU rank under ZeRO-2; fails the test unless it finishes."""
    overrides = cpu_run_overrides(shards_dir, run_dir, *ZERO2, *extra)
    result = run_pretrain([*overrides, "trainer.devices=1"], run_dir.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "shm_comm" not in result.stdout + result.stderr  # no C++ build for a CPU run


def loss_at(run_dir: Path, step: int) -> float:
    """train/loss of the 1-based optimizer step `step`, from the run's CSV log."""
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    return float(next(r["train/loss"] for r in rows if int(r["step"]) == step - 1))


def old_names(names: dict) -> OrderedDict:
    return OrderedDict((name.removeprefix(PREFIX), value) for name, value in names.items())


def write_first_layout(directory: Path) -> None:
    """Rename the weights of a ZeRO directory's files back to the first layout's names."""
    (model_file,) = directory.glob("checkpoint/mp_rank_*_model_states.pt")
    state = torch.load(model_file, weights_only=False)
    state["module"] = old_names(state["module"])
    state["param_shapes"] = [old_names(group) for group in state["param_shapes"]]
    state["shared_params"] = {
        k.removeprefix(PREFIX): v.removeprefix(PREFIX) for k, v in state["shared_params"].items()
    }
    torch.save(state, model_file)
    for shard in directory.glob("checkpoint/*optim_states.pt"):
        optimizer = torch.load(shard, weights_only=False)
        mappings = optimizer["optimizer_state_dict"]["param_slice_mappings"]
        optimizer["optimizer_state_dict"]["param_slice_mappings"] = [
            old_names(group) for group in mappings
        ]
        torch.save(optimizer, shard)
    written = torch.load(model_file, weights_only=False)["module"]
    assert not any(name.startswith(PREFIX) for name in written)


def test_a_zero2_directory_of_the_first_layout_resumes_as_the_run_would_have(
    prepared_corpus, tmp_path
):
    whole = tmp_path / "whole"
    launch(prepared_corpus, whole, "trainer.max_steps=3")
    old = tmp_path / "old-step-2.ckpt"
    shutil.copytree(whole / "checkpoints" / "step-0000002.ckpt", old)
    write_first_layout(old)
    resumed = tmp_path / "resumed"
    launch(prepared_corpus, resumed, "trainer.max_steps=3", f"resume={old}")
    assert abs(loss_at(resumed, 3) - loss_at(whole, 3)) <= 1e-5
