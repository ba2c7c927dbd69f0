"""Distributed training on 2 CPU processes (gloo): DDP, DeepSpeed ZeRO-2 and ZeRO-3.

Every multi-process run launches `python -m pretrain.cli.train trainer.devices=2 ...` (Lightning's
own launcher starts the second rank) with a test-only objective that records each rank's
sample keys and losses (tests/dist_helpers.py) and forces a NaN loss on rank 1 at the last
step. The runs are compared with a single process that trains on exactly the samples both
ranks read, merged into batches of 8 (the same global batch): masks are keyed by sample key,
dropout is off and all start from the same seed, so the curves agree up to how the loss is
averaged (each rank averages over its own masked tokens, the single process over all of them:
a difference of a few thousandths of a nat here), hence a tolerance of 0.05 nats per step while
the loss falls by more than 0.2. DDP, ZeRO-2 and ZeRO-3 do the same arithmetic on the same
micro-batches, so they agree to 2e-3."""

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides
from dist_helpers import RECORDING_MLM, read_records
from torch.utils.data import DataLoader
from zygote import run_pretrain

from pretrain.checkpoint.resume import find_resume_checkpoint
from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.stream import EpochStream

TESTS_DIR = Path(__file__).parent
STEPS = 6
NAN_STEP = STEPS - 1  # the last step: rank 1's loss is NaN, every rank must skip it


def overrides(shards_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return cpu_run_overrides(
        shards_dir,
        run_dir,
        *RECORDING_MLM,
        "trainer.log_every_n_steps=1",
        f"trainer.max_steps={STEPS}",
        "trainer.checkpoint_every_n_steps=3",
        "optim.warmup_steps=2",
        "optim.optimizer.lr=2e-3",
        *extra,
        batch_size=4,
    )


def record_env(record_dir: Path) -> dict[str, str]:
    record_dir.mkdir(parents=True, exist_ok=True)
    return {
        "PRETRAIN_TEST_RECORD_DIR": str(record_dir),
        "PRETRAIN_TEST_NAN_STEP": str(NAN_STEP),
        "PRETRAIN_TEST_NAN_RANK": "1",
    }


def launch(shards_dir: Path, run_dir: Path, record_dir: Path, *extra: str) -> dict:
    """Train with 2 CPU processes; returns the records of both ranks."""
    result = run_pretrain(
        [*overrides(shards_dir, run_dir, *extra), "trainer.devices=2"],
        run_dir.parent,
        record_env(record_dir),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return read_records(record_dir)


def step_losses(entries: list[dict]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in entries if "step" in e}


def end_state(entries: list[dict]) -> dict:
    return next(e for e in entries if e.get("end"))


def merge_batches(first: dict, second: dict, pad_id: int) -> dict:
    """One batch of the samples of both (rank 0's first), padded to the longer length."""
    length = max(first["input_ids"].shape[1], second["input_ids"].shape[1])
    merged = {"keys": list(first["keys"]) + list(second["keys"])}
    for key, value in first.items():
        if key == "keys":
            continue
        parts = [value, second[key]]
        if value.ndim == 2:
            fill = {"input_ids": pad_id, "labels": IGNORE_INDEX}.get(key, 0)
            parts = [
                torch.nn.functional.pad(p, (0, length - p.shape[1]), value=fill) for p in parts
            ]
        merged[key] = torch.cat(parts)
    return merged


RUNS = {  # name: the overrides of a 2-process run
    "ddp": ("strategy=ddp",),
    "zero2": ("strategy=deepspeed_zero2",),
    "zero3": ("strategy=deepspeed_zero3",),
    "zero3-resumed": ("strategy=deepspeed_zero3",),  # the same, continued from step 3
}


@pytest.fixture(scope="session")
def distributed_run(prepared_corpus, build_once):
    """`distributed_run(name)`: (run_dir, records) of the 2-process run `name` (RUNS), or of
    the single-process reference ("single"), each trained once per test session."""

    def run(name: str) -> tuple[Path, dict]:
        def make(root: Path) -> None:
            if name == "single":
                single_process_reference(prepared_corpus, root / "run", root / "records")
                return
            extra = RUNS[name]
            if name == "zero3-resumed":
                step3 = run("zero3")[0] / "checkpoints" / "step-0000003.ckpt"
                extra = (*extra, f"resume={step3}")
            launch(prepared_corpus, root / "run", root / "records", *extra)

        root = build_once(f"distributed-{name}", make)
        return root / "run", read_records(root / "records")

    return run


def single_process_reference(shards_dir: Path, run_dir: Path, record_dir: Path) -> None:
    """One process, global batch 8 = the two ranks' micro-batches of 4 merged, same seed."""
    from pretrain.runtime.run import prepare_run
    from pretrain.runtime.trainer import build_trainer

    sys.path.insert(0, str(TESTS_DIR))
    old_env = dict(os.environ)
    os.environ.update(record_env(record_dir) | {"PRETRAIN_TEST_NAN_RANK": "0"})
    try:
        cfg = compose_config(overrides(shards_dir, run_dir, "data.batch_size=8"))
        config, module, datamodule = prepare_run(cfg)
        spec = replace(datamodule.spec, batch_size=4, world_size=2)
        ranks = [iter(EpochStream(replace(spec, rank=r), epoch=0)) for r in (0, 1)]
        batches = [
            merge_batches(next(ranks[0]), next(ranks[1]), spec.vocab.pad) for _ in range(STEPS)
        ]
        trainer = build_trainer(config, run_dir)
        trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    finally:
        os.environ.clear()
        os.environ.update(old_env)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3"])
def test_ranks_read_different_samples(distributed_run, name):
    records = distributed_run(name)[1]
    keys = {
        rank: [k for e in entries if "keys" in e for k in e["keys"]]
        for rank, entries in records.items()
    }
    assert sorted(keys) == [0, 1]
    for rank_keys in keys.values():
        assert len(rank_keys) >= 4 * 3 and len(set(rank_keys)) == len(rank_keys), name
    assert not set(keys[0]) & set(keys[1]), f"{name}: a sample was read by both ranks"


def mean_curve(records: dict) -> dict[int, float]:
    """{step: the mean of the two ranks' losses} of every step but the NaN one."""
    per_rank = [step_losses(records[r]) for r in (0, 1)]
    return {s: (per_rank[0][s] + per_rank[1][s]) / 2 for s in per_rank[0] if s != NAN_STEP}


@pytest.mark.slow
def test_the_ddp_curve_matches_the_single_process_run(distributed_run):
    single = step_losses(distributed_run("single")[1][0])
    assert single[NAN_STEP - 1] < single[0] - 0.2, (
        single
    )  # it learns: the tolerance means something
    ddp = mean_curve(distributed_run("ddp")[1])
    for step in range(NAN_STEP):
        assert ddp[step] == pytest.approx(single[step], abs=0.05), step


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_zero_curves_match_ddp(distributed_run, name):
    zero, ddp = mean_curve(distributed_run(name)[1]), mean_curve(distributed_run("ddp")[1])
    for step in range(NAN_STEP):
        assert zero[step] == pytest.approx(ddp[step], abs=2e-3), step


@pytest.mark.slow
def test_zero3_resumed_from_step_3_continues_as_if_never_stopped(distributed_run):
    zero3 = mean_curve(distributed_run("zero3")[1])
    resumed = mean_curve(distributed_run("zero3-resumed")[1])
    assert sorted(resumed) == list(range(3, NAN_STEP))
    for step in resumed:
        assert resumed[step] == pytest.approx(zero3[step], abs=1e-4), step


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS, "single"])
def test_nonfinite_loss_on_one_rank_skips_the_step_on_every_rank(distributed_run, name):
    records = distributed_run(name)[1]
    for end in [end_state(entries) for entries in records.values()]:
        assert end["skipped_steps"] == 1, (name, end)
        assert end["scheduler_steps"] == STEPS - 1, (name, end)  # schedule: applied steps only
    if name == "ddp":
        ends = [end_state(records[r]) for r in (0, 1)]
        assert ends[0]["param_checksum"] == ends[1]["param_checksum"]  # ranks stay in step


@pytest.mark.slow
def test_zero_checkpoints_consolidate_resume_and_export(distributed_run, tmp_path, monkeypatch):
    import transformers

    from pretrain.checkpoint import safety as checkpoint_safety

    # these runs store the test's recording objective, which the allow-list rightly refuses
    allowed = {**checkpoint_safety.ALLOWED_TARGETS}
    allowed["objective._target_"] = {*allowed["objective._target_"], "dist_helpers.RecordingMLM"}
    monkeypatch.setattr(checkpoint_safety, "ALLOWED_TARGETS", allowed)

    from pretrain.export.checkpoint import read_checkpoint
    from pretrain.export.cli import main as export_main

    ddp_dir, zero2_dir, zero3_dir = (distributed_run(name)[0] for name in ("ddp", "zero2", "zero3"))
    for run_dir in (zero2_dir, zero3_dir):
        last = Path(find_resume_checkpoint(run_dir, "auto"))
        assert last.name == "last.ckpt" and (last / "latest").is_file()
        assert not list(last.parent.glob("*.partial"))
    reference, _ = read_checkpoint(ddp_dir / "checkpoints" / "last.ckpt")
    for run_dir in (zero2_dir, zero3_dir):
        state_dict, config = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
        assert (
            config["model_runtime"]["vocab_size"] > 0 and config["strategy"]["name"] == "deepspeed"
        )
        assert state_dict.keys() == reference.keys()
        for key, value in reference.items():  # the same training under DDP and ZeRO
            torch.testing.assert_close(state_dict[key].float(), value.float(), atol=2e-4, rtol=1e-3)
    out = tmp_path / "hf"
    assert export_main([str(zero3_dir / "checkpoints" / "last.ckpt"), str(out)]) == 0
    model = transformers.AutoModelForMaskedLM.from_pretrained(out)
    exported = model.state_dict()["bert.embeddings.word_embeddings.weight"]
    torch.testing.assert_close(
        exported, reference["encoder.embeddings.word_embeddings.weight"], atol=2e-4, rtol=1e-3
    )


def test_half_written_zero_checkpoint_is_never_resumed_from(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    complete = checkpoints / "step-0000003.ckpt"
    (complete / "checkpoint").mkdir(parents=True)
    (complete / "latest").write_text("checkpoint")
    # rank 0's states file, where resume=auto reads the stored step
    torch.save({"global_step": 3}, complete / "checkpoint" / "mp_rank_00_model_states.pt")
    (checkpoints / "step-0000006.ckpt" / "checkpoint").mkdir(parents=True)  # no `latest` yet
    (checkpoints / "last.ckpt" / "checkpoint").mkdir(parents=True)  # overwritten in place? never
    (checkpoints / "last.ckpt.partial" / "checkpoint").mkdir(parents=True)  # killed mid-save
    assert find_resume_checkpoint(tmp_path, "auto") == str(complete)
    assert not (checkpoints / "last.ckpt.partial").exists()
    with pytest.raises(FileNotFoundError, match="complete DeepSpeed checkpoint"):
        find_resume_checkpoint(tmp_path, str(checkpoints / "last.ckpt"))
    assert find_resume_checkpoint(tmp_path, str(complete)) == str(complete)


def test_replace_directory_swaps_a_complete_checkpoint_in(tmp_path):
    from pretrain.checkpoint.atomic import replace_directory

    final, written = tmp_path / "last.ckpt", tmp_path / "last.ckpt.partial"
    (final / "checkpoint").mkdir(parents=True)
    (final / "latest").write_text("old")
    written.mkdir()
    (written / "latest").write_text("new")
    replace_directory(written, final)
    assert (final / "latest").read_text() == "new" and not written.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def compose_strategy(*extra: str) -> dict:
    cfg = compose_config(["trainer=cpu", *extra])
    return validate(cfg)


@pytest.mark.parametrize(
    "strategy",
    [
        "ddp",
        "deepspeed_zero1",
        "deepspeed_zero2",
        "deepspeed_zero3",
        "deepspeed_zero2_offload",
        "deepspeed_zero3_offload",
        "deepspeed_zero3_offload_params",
    ],
)
def test_strategy_configs_compose_and_pass_deepspeeds_parser(strategy):

    from pretrain.deepspeed_json import deepspeed_config
    from pretrain.runtime.strategies import CPUDeepSpeedStrategy, build_strategy

    cfg = compose_config(
        ["trainer=cpu", f"strategy={strategy}", "trainer.devices=2", "data.global_batch_size=256"]
    )
    config = validate(cfg)
    built = build_strategy(config)
    if strategy == "ddp":
        assert built.process_group_backend == "gloo"
        return
    assert isinstance(built, CPUDeepSpeedStrategy) and built.process_group_backend == "gloo"
    ds = deepspeed_config(config)
    assert ds["zero_optimization"]["stage"] == int(strategy[len("deepspeed_zero")])
    assert ds["train_micro_batch_size_per_gpu"] == 32 and "gradient_accumulation_steps" not in ds
    assert ("offload_optimizer" in ds["zero_optimization"]) == ("offload" in strategy)
    assert ("offload_param" in ds["zero_optimization"]) == strategy.endswith("params")


def test_bad_deepspeed_values_fail_at_composition_naming_the_strategy():
    with pytest.raises(ConfigError, match="(?s)strategy .*DeepSpeed.s config parser.*bogus"):
        compose_strategy(
            "strategy=deepspeed_zero2", "+strategy.deepspeed.zero_optimization.bogus=1"
        )
    with pytest.raises(ConfigError, match="DeepSpeed's config parser"):
        compose_strategy(
            "strategy=deepspeed_zero2", "+strategy.deepspeed.train_micro_batch_size_per_gpu=-3"
        )
    with pytest.raises(ConfigError, match="strategy.offload_parameters.*zero_stage=3"):
        compose_strategy("strategy=deepspeed_zero2", "strategy.offload_parameters=true")
    with pytest.raises(ConfigError, match="strategy.deepspeed.*global_batch_size"):
        compose_strategy(
            "strategy=deepspeed_zero2", "+strategy.deepspeed.gradient_accumulation_steps=4"
        )
    with pytest.raises(ConfigError, match="strategy.name"):
        compose_strategy("strategy.name=fsdp")


@pytest.mark.slow
def test_zero3_with_optimizer_and_parameter_offload_trains_like_ddp(
    distributed_run, prepared_corpus, tmp_path
):
    """Offload keeps the configured optimizer (zero_force_ds_cpu_optimizer off), so it runs on
    CPU without compiled ops; warm-up is 2 steps, so the first updates match the 6-step runs."""
    offload = launch(
        prepared_corpus,
        tmp_path / "offload",
        tmp_path / "offload-rec",
        "strategy=deepspeed_zero3_offload_params",
        "trainer.max_steps=3",
    )
    ddp = distributed_run("ddp")[1]
    for rank in (0, 1):
        got, want = step_losses(offload[rank]), step_losses(ddp[rank])
        assert sorted(got) == [0, 1, 2]
        for step in got:
            assert got[step] == pytest.approx(want[step], abs=2e-3), (rank, step)
    assert (tmp_path / "offload" / "checkpoints" / "last.ckpt" / "latest").is_file()
