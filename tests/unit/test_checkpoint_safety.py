"""A crafted run directory, checkpoint or stored config never runs code (issue 12 item 3):
pickles are loaded weights_only (DeepSpeed's directories too), stored `_target_`s must be
this project's classes; each refusal is one line naming the file."""

import os
from pathlib import Path

import pytest
import torch

from pretrain.checkpoint.atomic import AtomicCheckpointIO
from pretrain.checkpoint.resume import checkpoint_step, newest_checkpoint, saved_config
from pretrain.checkpoint.safety import (
    ALLOWED_TARGETS,
    UnsafeCheckpointError,
    check_resume_strategy,
    check_stored_targets,
    load_weights_only,
    weights_only_loading,
)
from pretrain.cli import generate
from pretrain.errors import ConfigError
from pretrain.export import ExportError, read_checkpoint
from pretrain.paths import CONF_DIR


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def crafted_zero_dir(path: Path, marker: Path) -> Path:
    """A `last.ckpt/` that looks like DeepSpeed's: `latest` names a tag whose rank-0 model
    states file is a pickle that would run a command."""
    (path / "tag").mkdir(parents=True)
    state = {"global_step": 99, "config": {}, "x": Payload(marker)}
    torch.save(state, path / "tag" / "mp_rank_00_model_states.pt")
    (path / "latest").write_text("tag")
    return path


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


def test_a_crafted_zero_directory_is_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "ran"
    checkpoints = tmp_path / "run" / "checkpoints"
    last = crafted_zero_dir(checkpoints / "last.ckpt", marker)

    assert newest_checkpoint(checkpoints) is None  # resume=auto skips it, named
    out = capsys.readouterr().out.splitlines()
    warning = next(line for line in out if line.startswith("warning: skipping"))
    assert warning.startswith(f"warning: skipping unreadable checkpoint {last}")
    assert "posix.system" in warning
    for read in (checkpoint_step, saved_config):
        with pytest.raises(UnsafeCheckpointError) as refused:
            read(last)
        assert str(last / "tag") in one_line(refused.value)
    with pytest.raises(ExportError) as refused:  # export, init_from, teacher: consolidation
        read_checkpoint(last)
    assert "refused" in one_line(refused.value)
    assert not marker.exists()
    assert torch.load is not None and torch.load.__module__ == "torch.serialization"


def test_a_crafted_ckpt_file_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "last.ckpt"
    torch.save({"global_step": 1, "state_dict": {}, "x": Payload(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as refused:  # Lightning's resume reads through it
        AtomicCheckpointIO().load_checkpoint(path)
    assert str(path) in one_line(refused.value)
    assert "weights_only=False" not in str(refused.value)
    with pytest.raises(ExportError) as refused:
        read_checkpoint(path)
    one_line(refused.value)
    assert generate.main([str(path), "--text", "hello"]) == 2
    assert not marker.exists()


def test_a_zero_directory_resumes_only_under_deepspeed(tmp_path):
    directory = crafted_zero_dir(tmp_path / "last.ckpt", tmp_path / "ran")
    with pytest.raises(ConfigError, match="strategy.name=auto") as refused:
        check_resume_strategy(directory, "auto")
    one_line(refused.value)
    check_resume_strategy(directory, "deepspeed")
    check_resume_strategy(tmp_path / "step.ckpt", "auto")  # a file: any strategy


def test_deepspeed_bookkeeping_classes_load_and_torch_load_is_restored(tmp_path):
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    assert deepspeed
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    state = {
        "zero_stage": ZeroStageEnum.gradients,
        "loss_scaler": LossScaler(1.0),
        "slices": {"w": fragment_address(numel=4, start=0)},
        "w": torch.ones(4),
    }
    torch.save(state, path)
    original = torch.load
    with weights_only_loading():
        loaded = torch.load(path, map_location="cpu", weights_only=False)  # as DeepSpeed asks
        assert torch.load is not original
    assert torch.load is original
    assert loaded["zero_stage"] == ZeroStageEnum.gradients
    assert load_weights_only(path)["slices"]["w"].numel == 4


def stored_checkpoint(path: Path, **config_changes) -> Path:
    config = {
        "model": {"_target_": "pretrain.models.bert.BertEncoder", "hidden_size": 32},
        "objective": {"_target_": "pretrain.objectives.causal_lm.CausalLanguageModel"},
        "optim": {"optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True}},
        "model_runtime": {"vocab_size": 10, "pad_token_id": 0},
        "data": {"tokenizer_dir": str(path.parent)},
    }
    for section, value in config_changes.items():
        config[section] = value
    torch.save({"state_dict": {"encoder.w": torch.ones(2)}, "config": config}, path)
    return path


@pytest.mark.parametrize(
    ("section", "value", "key"),
    [
        ("model", {"_target_": "os.system", "command": "touch {marker}"}, "model._target_"),
        (
            "model",
            {
                "_target_": "pretrain.models.bert.BertEncoder",
                "hidden_size": {"_target_": "shutil.copy", "src": "{source}", "dst": "{marker}"},
            },
            "model.hidden_size._target_",
        ),
        ("objective", {"_target_": "shutil.copy"}, "objective._target_"),
        ("data", {"tokenizer_dir": {"_target_": "os.system"}}, "data.tokenizer_dir._target_"),
    ],
)
def test_a_stored_config_names_only_our_classes(tmp_path, capsys, section, value, key):
    marker, source = tmp_path / "ran", tmp_path / "source"
    source.write_text("x")

    def fill(node):
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        return node.format(marker=marker, source=source) if isinstance(node, str) else node

    path = stored_checkpoint(tmp_path / "crafted.ckpt", **{section: fill(value)})
    with pytest.raises(ExportError) as refused:
        read_checkpoint(path)
    assert f"{path}: the stored config's {key}" in one_line(refused.value)
    assert generate.main([str(path), "--text", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and key in err
    assert not marker.exists()


def test_the_allow_list_holds_every_class_our_configs_name():
    import yaml

    for group, key in (
        ("model", "model"),
        ("objective", "objective"),
        ("optim", "optim.optimizer"),
    ):
        for path in sorted((Path(CONF_DIR) / group).glob("*.yaml")):
            node = yaml.safe_load(path.read_text()) or {}
            node = node.get("optimizer", {}) if group == "optim" else node
            target = node.get("_target_")
            if target is not None:
                assert target in ALLOWED_TARGETS[f"{key}._target_"], (
                    f"{path}: add {target} to pretrain.checkpoint.safety's allow-list"
                )
    check_stored_targets(
        {"model": {"_target_": "pretrain.models.bert.BertEncoder"}, "optim": {}}, "x.ckpt"
    )
