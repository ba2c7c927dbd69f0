"""Under DeepSpeed bf16 the batch's numbers reach the model in float32 (issue 58 item 4):
Lightning's DeepSpeed precision plugin casts every floating batch tensor to bf16, which made a
stage's RoPE theta 160,000 into 159,744 and rounded a micro-batch's loss-token count; the
run's plugin (`strategies.DeepSpeedPrecisionKeepingFloat32`) leaves those fields alone."""

import numpy as np
import torch

from pretrain.config import compose_config, validate
from pretrain.data.loader import LOSS_TOKENS_KEY, weigh_step
from pretrain.data.stages import PROGRESS_KEY, ROPE_THETA_KEY, StagedCorruption
from pretrain.runtime.trainer import build_trainer


def staged_batch() -> dict:
    """A batch of two rows, one in each stage of a context extension (thetas 10k, 160k), with
    its loss tokens weighed as for token-budget batches (1,003: not a bf16 number)."""

    def stage(batch: dict, epoch: int) -> dict:
        return {"input_ids": np.ones((2, 4), np.int64), "features": np.full((2, 4), 1.003)}

    staged = StagedCorruption((stage, stage), until_tokens=(100,), rope_thetas=(1e4, 1.6e5))
    numpy = staged({"keys": [0, 1], PROGRESS_KEY: np.array([0, 500])}, epoch=0)
    batch = {key: torch.as_tensor(value) for key, value in numpy.items()}
    batch["attention_mask"] = torch.ones(1, 1003, dtype=torch.long)
    weigh_step([batch])
    batch.pop("attention_mask")
    return batch


def test_bf16_deepspeed_keeps_theta_and_loss_tokens_in_float32(tmp_path) -> None:
    overrides = ["trainer=cpu", "strategy=deepspeed_zero2", "trainer.precision=bf16-mixed"]
    trainer = build_trainer(validate(compose_config(overrides)), tmp_path)
    batch = staged_batch()
    assert batch[ROPE_THETA_KEY].dtype == torch.float32  # as the stage mapper makes it

    converted = trainer.precision_plugin.convert_input(batch)  # Lightning's training loop
    assert converted[ROPE_THETA_KEY].dtype == torch.float32
    assert converted[ROPE_THETA_KEY].tolist() == [10000.0, 160000.0]  # bf16: 159,744
    assert converted[LOSS_TOKENS_KEY].dtype == torch.float32
    assert converted[LOSS_TOKENS_KEY].item() == 1003.0  # bf16: 1,004
    # activations are still cast to the engine's dtype; integer fields are never cast
    assert converted["features"].dtype == torch.bfloat16
    assert converted["input_ids"].dtype == torch.int64
    assert list(converted) == list(batch)
