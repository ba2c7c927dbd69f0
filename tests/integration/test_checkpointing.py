"""A crash while writing a checkpoint never leaves a corrupt one to resume from; `resume=auto`
takes the newest complete checkpoint; a changed config never silently continues another run."""

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_train import tiny_overrides
from zygote import run_pretrain

from pretrain.checkpoint import atomic, resume
from pretrain.checkpoint.atomic import AtomicCheckpointIO, replace_directory
from pretrain.checkpoint.relaunch import check_relaunch, config_changes, refused_changes
from pretrain.checkpoint.resume import find_resume_checkpoint, set_aside_checkpoints
from pretrain.config import compose_config
from pretrain.data.shard_format import load_manifest
from pretrain.errors import ConfigError
from pretrain.runtime.run import train


def save(path: Path, step: int) -> Path:
    AtomicCheckpointIO().save_checkpoint({"global_step": step, "weights": torch.ones(3)}, path)
    return path


def deepspeed_dir(path: Path, step: int, *, latest: bool = True, states: bool = True) -> Path:
    """A ZeRO checkpoint directory as DeepSpeed writes it: `latest` names the tag folder that
    holds rank 0's model states (with Lightning's client state: global_step)."""
    (path / "tag").mkdir(parents=True)
    if states:
        torch.save({"global_step": step}, path / "tag" / "mp_rank_00_model_states.pt")
    if latest:
        (path / "latest").write_text("tag")
    return path


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save(tmp_path / "checkpoints" / "last.ckpt", 1)

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # killed while writing

    monkeypatch.setattr(atomic.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["global_step"] == 1
    assert (path.parent / "last.ckpt.partial").exists()
    # resuming ignores and removes the partial file
    assert find_resume_checkpoint(tmp_path, "auto") == str(path)
    assert not (path.parent / "last.ckpt.partial").exists()


def test_the_directory_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    synced: list[tuple[Path, list[str]]] = []
    real = atomic.fsync_directory

    def record(directory):
        synced.append((Path(directory), sorted(p.name for p in Path(directory).iterdir())))
        real(directory)

    monkeypatch.setattr(atomic, "fsync_directory", record)
    save(tmp_path / "last.ckpt", 1)
    assert synced == [(tmp_path, ["last.ckpt"])]  # after the rename, without the .partial
    synced.clear()
    written = deepspeed_dir(tmp_path / "ds.ckpt.partial", 2)
    replace_directory(written, tmp_path / "ds.ckpt")
    assert (tmp_path, ["ds.ckpt", "last.ckpt"]) in synced  # the rename of the directory
    assert (written / "tag", ["mp_rank_00_model_states.pt"]) in synced  # its files first


def test_resume_modes(tmp_path):
    assert find_resume_checkpoint(tmp_path, "auto") is None  # nothing yet: start
    assert find_resume_checkpoint(tmp_path, "never") is None
    with pytest.raises(FileNotFoundError, match="resume="):
        find_resume_checkpoint(tmp_path, str(tmp_path / "missing.ckpt"))


def test_auto_takes_the_newest_complete_checkpoint_by_its_stored_step(tmp_path, capsys):
    directory = tmp_path / "checkpoints"
    last = save(directory / "last.ckpt", 5)
    save(directory / "step-0000004.ckpt", 4)
    newer = save(directory / "step-0000007.ckpt", 7)
    assert find_resume_checkpoint(tmp_path, "auto") == str(newer)  # not last.ckpt
    os.utime(newer, (0, 0))  # an old mtime changes nothing: the stored step decides
    assert find_resume_checkpoint(tmp_path, "force") == str(newer)
    # a truncated newer file (copied in part, a full disk before atomic writes): skipped
    truncated = directory / "step-0000009.ckpt"
    truncated.write_bytes(newer.read_bytes()[:100])
    assert find_resume_checkpoint(tmp_path, "auto") == str(newer)
    assert f"skipping unreadable checkpoint {truncated}" in capsys.readouterr().out
    # ZeRO directories count only when complete: `latest` and rank 0's states readable
    deepspeed_dir(directory / "step-0000010.ckpt", 10, latest=False)  # interrupted
    deepspeed_dir(directory / "step-0000011.ckpt", 11, states=False)  # a shard missing
    assert find_resume_checkpoint(tmp_path, "auto") == str(newer)
    complete = deepspeed_dir(directory / "step-0000012.ckpt", 12)
    assert find_resume_checkpoint(tmp_path, "auto") == str(complete)
    save(last, 12)  # a tie: last.ckpt
    assert find_resume_checkpoint(tmp_path, "auto") == str(last)


def test_config_changes_lists_what_differs():
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


def test_a_key_added_since_the_checkpoint_counts_at_its_default(prepared_corpus):
    """A checkpoint saved before a key existed (here data.bad_shards, trainer.max_skipped_steps)
    resumes when the key keeps its default, and is refused when the key is set otherwise."""
    from pretrain.config import plain_config, validate, with_schema_defaults

    current = plain_config(validate(compose_config([f"data.shards_dir={prepared_corpus}"])))
    saved = copy.deepcopy(current)
    del saved["data"]["bad_shards"], saved["trainer"]["max_skipped_steps"]
    del saved["data"]["stream_partitions"]  # one that may not change between launches
    unfilled = refused_changes(saved, current)  # the new key counts as changed
    assert unfilled == [
        f"data.stream_partitions: '<unset>' -> {current['data']['stream_partitions']}"
    ]
    saved = with_schema_defaults(saved)
    assert refused_changes(saved, current) == []
    current["data"]["format"] = "full_sentences"
    current["trainer"]["max_skipped_steps"] = 5  # may change anyway
    assert refused_changes(saved, current) == ["data.format: 'segment_pair' -> 'full_sentences'"]
    current["seed"] = 7  # its own values are kept: a changed one is refused
    assert "seed: 1234 -> 7" in refused_changes(saved, current)


def plain(**changes) -> dict:
    """A plain run config's keys that the relaunch check reads, with `changes` ("a.b": v)."""
    config = {
        "seed": 1,
        "run_dir": "runs/a",
        "resume": "auto",
        "init_from": None,
        "optim": {"optimizer": {"lr": 1e-3}},
        "data": {"batch_size": 8, "global_batch_size": None, "num_workers": 0},
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "num_nodes": 1,
            "accumulate_grad_batches": 1,
            "max_steps": 10,
            "log_every_n_steps": 10,
            "enable_progress_bar": True,
        },
        "logger": {"wandb": True},
    }
    for key, value in changes.items():
        *path, last = key.split(".")
        section = config
        for name in path:
            section = section[name]
        section[last] = value
    return config


def test_what_may_change_between_launches():
    saved = plain()
    allowed = plain(
        **{
            "trainer.max_steps": 20,
            "trainer.log_every_n_steps": 1,
            "trainer.enable_progress_bar": False,
            "logger.wandb": False,
            "data.num_workers": 2,
            "run_dir": "runs/b",
            "resume": "force",
        }
    )
    assert refused_changes(saved, allowed) == []
    assert refused_changes(saved, plain(**{"optim.optimizer.lr": 2e-3})) == [
        "optim.optimizer.lr: 0.001 -> 0.002"
    ]
    # more ranks: allowed only when the global batch stays the same
    assert refused_changes(saved, plain(**{"trainer.devices": 2})) == [
        "trainer.devices: 1 -> 2 (global batch 8 -> 16 samples per step)"
    ]
    fixed = {"data.global_batch_size": 16}
    assert refused_changes(plain(**fixed), plain(**fixed, **{"trainer.devices": 2})) == []
    # another micro-batch and accumulation: allowed only when the global batch stays the same
    halves = {"data.batch_size": 4, "trainer.accumulate_grad_batches": 2}
    assert refused_changes(saved, plain(**halves)) == []
    assert refused_changes(saved, plain(**{"data.batch_size": 4})) == [
        "data.batch_size: 8 -> 4 (global batch 8 -> 4 samples per step)"
    ]
    # a data key the schema no longer has (an older version's) does not hide the global batch
    old = plain(**fixed)
    old["data"]["retired_key"] = 1
    assert refused_changes(old, plain(**fixed, **{"trainer.devices": 2})) == [
        "data.retired_key: 1 -> '<unset>'"
    ]


def test_a_relaunch_may_move_the_corpus_to_a_copy_of_it(prepared_corpus, tmp_path):
    """A copy of the corpus (its manifest's content hash the same, wherever it lies) may
    replace it; a corpus with other shards there is refused in one line."""
    copy_dir = tmp_path / "copy"
    shutil.copytree(prepared_corpus, copy_dir)
    other_dir = tmp_path / "other"
    shutil.copytree(prepared_corpus, other_dir)
    manifest = json.loads((other_dir / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = "0" * 64  # the same tokenizer, another first shard
    (other_dir / "manifest.json").write_text(json.dumps(manifest))

    def launch(corpus: Path, shards_dir: str) -> dict:
        return plain(
            **{
                "data.shards_dir": shards_dir,
                "data.tokenizer_dir": str(corpus / "tokenizer"),
                "data_runtime": {"corpus_sha256": load_manifest(corpus).content_sha256},
            }
        )

    saved = launch(prepared_corpus, str(prepared_corpus))
    moved = launch(copy_dir, "s3://bucket/corpus")  # a URL's mirror is such a copy
    assert refused_changes(saved, moved) == []
    check_relaunch(saved, moved, "last.ckpt", "auto")
    other = launch(other_dir, "s3://bucket/other")
    with pytest.raises(ConfigError) as refused:
        check_relaunch(saved, other, "last.ckpt", "auto")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("data.shards_dir: ")
    assert "holds another corpus than the checkpoint was trained on" in message
    # a checkpoint that records no corpus hash: a moved corpus is a change like any other
    older = {key: value for key, value in saved.items() if key != "data_runtime"}
    assert [line.split(":")[0] for line in refused_changes(older, moved)] == [
        "data.shards_dir",
        "data.tokenizer_dir",
    ]


def test_a_refused_relaunch_says_what_differs_and_how_to_proceed(capsys):
    saved, changed = plain(), plain(**{"optim.optimizer.lr": 2e-3, "seed": 2})
    with pytest.raises(ConfigError) as refused:
        check_relaunch(saved, changed, "runs/a/checkpoints/last.ckpt", "auto")
    message = str(refused.value)
    for part in ("optim.optimizer.lr: 0.001 -> 0.002", "seed: 1 -> 2", "run_name=", "resume=never"):
        assert part in message
    assert "resume=force" in message and "trainer.max_steps" in message
    check_relaunch(saved, changed, "runs/a/checkpoints/last.ckpt", "force")  # continues
    assert "seed: 1 -> 2" in capsys.readouterr().out
    # init_from: fine when it is the run's own (a requeue), an error otherwise, even forced
    started = plain(init_from="hf/bert")
    check_relaunch(started, plain(init_from="hf/bert"), "last.ckpt", "auto")
    check_relaunch(started, plain(), "last.ckpt", "auto")
    for mode in ("auto", "force"):
        with pytest.raises(ConfigError, match="init_from=other: the run directory already"):
            check_relaunch(started, plain(init_from="other"), "last.ckpt", mode)


def test_never_sets_the_old_checkpoints_aside(tmp_path):
    assert set_aside_checkpoints(tmp_path) is None
    save(tmp_path / "checkpoints" / "step-0000900.ckpt", 900)
    previous = set_aside_checkpoints(tmp_path)
    assert previous == tmp_path / "checkpoints.previous"
    assert (previous / "step-0000900.ckpt").is_file()
    assert find_resume_checkpoint(tmp_path, "auto") is None  # never mixed with the new run


def pretrain_cli(*overrides: str) -> subprocess.CompletedProcess:
    return run_pretrain(list(overrides), Path.cwd(), timeout=300)


@pytest.mark.slow
def test_a_changed_command_never_silently_continues_another_run(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    first = pretrain_cli(*tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2"))
    assert first.returncode == 0, first.stderr[-3000:]
    hydra_config = (run_dir / ".hydra" / "config.yaml").read_bytes()
    checkpoints = sorted((run_dir / "checkpoints").iterdir())

    changed = tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=4", "seed=7")
    refused = pretrain_cli(*changed)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "seed: 1234 -> 7" in refused.stderr and "resume=force" in refused.stderr
    assert (run_dir / ".hydra" / "config.yaml").read_bytes() == hydra_config  # untouched
    assert sorted((run_dir / "checkpoints").iterdir()) == checkpoints

    last = run_dir / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match="init_from="):
        train(compose_config([*tiny_overrides(prepared_corpus, run_dir), f"init_from={last}"]))

    # allowed changes continue the run: more steps (past the end of the linear decay: with
    # optim.extend), workers, logging
    allowed = (
        "trainer.max_steps=3",
        "optim.extend=rewarm",
        "data.num_workers=1",
        "trainer.log_every_n_steps=1",
    )
    train(compose_config(tiny_overrides(prepared_corpus, run_dir, *allowed)))
    assert torch.load(last, weights_only=True)["global_step"] == 3
    # resume=never starts over beside the old run's checkpoints, set aside
    train(compose_config([*tiny_overrides(prepared_corpus, run_dir, *changed), "resume=never"]))
    assert torch.load(last, weights_only=True)["config"]["seed"] == 7
    previous = run_dir / "checkpoints.previous" / "last.ckpt"
    assert torch.load(previous, weights_only=True)["global_step"] == 3
    shutil.rmtree(run_dir)


def test_step_names_are_ordered_by_number_past_seven_digits(tmp_path):
    directory = tmp_path / "checkpoints"
    for step in (9_999_999, 10_000_000, 999_999, 100_000_001):
        save(directory / f"step-{step:07d}.ckpt", step)
    names = [path.name for path in resume.step_checkpoints(directory)]
    assert names == [
        "step-0999999.ckpt",
        "step-9999999.ckpt",
        "step-10000000.ckpt",
        "step-100000001.ckpt",
    ]
    save(directory / "last.ckpt", 10_000_000)
    assert find_resume_checkpoint(tmp_path, "auto") == str(directory / "step-100000001.ckpt")


def crash_at_rename(monkeypatch, source_suffix: str) -> None:
    """The next os.replace of a path ending in `source_suffix` is a crash (the process dies
    there); the other renames happen."""
    real = os.replace

    def replace(source, target):
        if str(source).endswith(source_suffix):
            raise KeyboardInterrupt
        real(source, target)

    monkeypatch.setattr(atomic.os, "replace", replace)


@pytest.mark.parametrize("previous", [True, False])
def test_a_crash_between_the_two_renames_loses_no_zero_checkpoint(tmp_path, monkeypatch, previous):
    """Replacing last.ckpt/ (a ZeRO directory) renames the old one aside, then the new one
    into place: killed in between, the next resume finishes the replacement (the new one,
    complete, was marked so before the renames), whether or not there was an old one."""
    directory = tmp_path / "checkpoints"
    final = directory / "last.ckpt"
    if previous:
        deepspeed_dir(final, 5)
    written = deepspeed_dir(directory / "last.ckpt.partial", 8)
    crash_at_rename(monkeypatch, ".partial")
    with pytest.raises(KeyboardInterrupt):
        replace_directory(written, final)
    monkeypatch.undo()
    assert not final.exists() and written.is_dir()  # the state the crash left
    assert (directory / "last.ckpt.replaced").is_dir() == previous
    assert find_resume_checkpoint(tmp_path, "auto") == str(final)
    assert resume.checkpoint_step(final) == 8
    assert sorted(p.name for p in directory.iterdir()) == ["last.ckpt"]


def test_an_unfinished_write_falls_back_to_the_replaced_checkpoint(tmp_path, monkeypatch):
    """A `.partial` directory without the mark (some rank had not written its part) is never
    resumed from; the previous last.ckpt, renamed aside, comes back."""
    directory = tmp_path / "checkpoints"
    deepspeed_dir(directory / "last.ckpt.replaced", 5)
    deepspeed_dir(directory / "last.ckpt.partial", 8)  # `latest` written, not marked complete
    assert find_resume_checkpoint(tmp_path, "auto") == str(directory / "last.ckpt")
    assert resume.checkpoint_step(directory / "last.ckpt") == 5
    assert sorted(p.name for p in directory.iterdir()) == ["last.ckpt"]
