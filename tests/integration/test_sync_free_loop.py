"""No host synchronisation in a training step but on log steps (issue 18 item 2, issue 58
item 5), in the real Lightning loop: a run of each family under benchmarks/sync_check.py's
`HostSyncOps` (the CPU stand-in for CUDA's sync debug mode) and tests/host_reads.py's
`HostReads` (no `item`, `bool`, `tolist` of a tensor, no `torch.tensor(..., device=...)`, no
barrier) from each step's start to the next's, log steps and the launch's first step excepted. The optimizer is torch's fused AdamW, as on CUDA (it takes the
non-finite check's flag as `found_inf`; the unfused one needs the host to decide)."""

import sys
from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from host_reads import StepGuard, on_host_side

from pretrain.config import compose_config
from pretrain.runtime.run import prepare_run
from pretrain.runtime.trainer import build_trainer

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from sync_check import HostSyncOps  # noqa: E402


class DeviceSyncOps(HostSyncOps):
    """`HostSyncOps` outside the data fetch and the batch's host preparation (`on_host_side`:
    host tensors there, as on CUDA)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if on_host_side():
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


STEPS, EVERY = 12, 5


@pytest.mark.parametrize(
    "overrides",
    [
        ("objective=mlm_nsp", "data=segment_pair"),
        ("objective=mlm", "data=full_sentences", "data.global_batch_size=16"),  # accumulation
        # bf16 autocast, as trainer=gpu: clipping with the fused AdamW (no gradient scaler)
        ("objective=mlm", "data=full_sentences", "trainer.precision=bf16-mixed"),
        ("objective=span", "data=full_sentences"),
        ("objective=unilm", "data=segment_pair"),  # (batch, seq, seq) masks built on the device
        ("objective=electra", "model=electra_tiny", "data=segment_pair"),
        ("objective=xlnet", "model=xlnet_tiny", "data=xlnet_memory"),
        ("objective=bart", "model=bart_tiny", "data=full_sentences"),
        ("objective=causal_lm", "model=gpt_tiny", "data=full_sentences"),
        # ModernBERT's local and global layers (fused AdamW: StableAdamW reads the host per step)
        (
            "model=modernbert_tiny",
            "objective=mlm",
            "model.local_attention=16",
            "data=full_sentences",
        ),
    ],
    ids=lambda overrides: "-".join(o.split("=")[1] for o in overrides if "global" not in o)[:40],
)
def test_steps_between_log_steps_never_wait_for_the_device(prepared_corpus, tmp_path, overrides):
    cfg = compose_config(
        cpu_run_overrides(
            prepared_corpus,
            tmp_path,
            *overrides,
            f"trainer.max_steps={STEPS}",
            f"trainer.log_every_n_steps={EVERY}",
            "trainer.checkpoint_every_n_steps=100",
            "+optim.optimizer.fused=true",
        )
    )
    config, module, datamodule = prepare_run(cfg)
    guard = StepGuard(extra=DeviceSyncOps)
    trainer = build_trainer(config, tmp_path, [guard])
    try:
        trainer.fit(module, datamodule=datamodule)  # HostSyncOps raises at a syncing operator
    finally:
        guard.leave()  # even on an error
    assert trainer.global_step == STEPS
    guarded = [s for s in range(1, STEPS - 1) if (s + 1) % EVERY != 0]  # micro-batches' steps
    assert guard.guarded == sorted(guarded * config.batch_plan.accumulate_grad_batches)
    # the first step, the log steps and the last
    assert [step for step, _ in module.loss_history] == [0, 4, 9, 11]
