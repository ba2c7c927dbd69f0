"""Held-out curves under DDP (2 CPU ranks, gloo): each rank evaluates its strided share of
the held-out batches and the sums are all-reduced, so `val/*` at a step equal a direct
single-process computation on all the batches with that step's checkpoint."""

import pytest
import torch
from conftest import cpu_run_overrides
from test_validation import direct_metrics, val_rows
from zygote import run_pretrain

from pretrain.checkpoint.compat import objective_state_dict
from pretrain.config import compose_config
from pretrain.runtime.run import build_stream
from pretrain.runtime.validation import heldout_batches, heldout_spec

VAL_BATCHES = 4  # 2 per rank


@pytest.mark.slow
def test_val_metrics_under_ddp_reduce_over_ranks(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(
        prepared_corpus,
        run_dir,
        "strategy=ddp",
        "data.num_workers=0",
        "data.holdout_shards=1",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        f"trainer.val_batches={VAL_BATCHES}",
        "optim.warmup_steps=1",
        "optim.optimizer.lr=1e-3",
        batch_size=4,
    )
    result = run_pretrain(
        [*overrides, "trainer.devices=2"],
        tmp_path,
        {"OMP_NUM_THREADS": "1"},
        timeout=1800,  # a guard against a hang, not a speed check
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logged = val_rows(run_dir)
    assert sorted(logged) == [2]  # written once (rank 0)
    run, spec, module_class = build_stream(compose_config(overrides))
    batches = heldout_batches(heldout_spec(run, spec), VAL_BATCHES)
    module = module_class(run, spec.vocab)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    module.load_state_dict(objective_state_dict(state["state_dict"]))
    direct = direct_metrics(module, batches)  # all 4 batches, one process
    one_rank = direct_metrics(module, batches[::2])  # what rank 0 alone saw
    for key, value in direct.items():
        assert logged[2][f"val/{key}"] == pytest.approx(value, abs=1e-5), key
    assert logged[2]["val/mlm_loss"] != pytest.approx(one_rank["mlm_loss"], abs=1e-5)
