"""The stage a checkpoint was saved in (`pretrain.export.stage`): from the data stream's
position saved beside the weights, by the stream's own progress rule, and the model settings
(a context-extension phase's RoPE theta) an export must then carry."""

from pretrain.export.stage import DATA_STATE, config_at_checkpoint, stage_at_checkpoint

CONFIG = {
    "model": {"name": "modernbert_tiny", "global_rope_theta": 160000.0},
    "data": {"max_seq_length": 64},
    "objective": {"stages": [{"until_tokens": 1024, "global_rope_theta": 10000.0}, {}]},
}


def position(samples: int, epoch: int = 0, epoch_tokens: int = 0) -> dict:
    return {DATA_STATE: {"epoch": epoch, "samples": samples, "epoch_tokens": epoch_tokens}}


def test_the_last_trained_sample_decides_the_stage():
    assert stage_at_checkpoint(CONFIG, position(16)) == 0  # samples 0..15: tokens 0..960
    assert stage_at_checkpoint(CONFIG, position(17)) == 1  # sample 16 starts at 1024
    assert stage_at_checkpoint(CONFIG, position(0)) == 0


def test_a_first_phase_checkpoint_exports_the_first_phase_theta():
    assert config_at_checkpoint(CONFIG, position(8))["model"]["global_rope_theta"] == 10000.0
    assert config_at_checkpoint(CONFIG, position(40))["model"]["global_rope_theta"] == 160000.0
    assert CONFIG["model"]["global_rope_theta"] == 160000.0  # the run's config is not changed


def test_shorter_first_phase_rows_count_their_own_length():
    staged = {**CONFIG, "objective": {"stages": [{"until_tokens": 1024, "max_seq_length": 32}, {}]}}
    assert stage_at_checkpoint(staged, position(32)) == 0  # 32 rows of 32 tokens: 0..992
    assert stage_at_checkpoint(staged, position(33)) == 1


def test_later_epochs_need_the_epochs_tokens_else_the_last_stage():
    assert stage_at_checkpoint(CONFIG, position(2, epoch=1, epoch_tokens=512)) == 0
    assert stage_at_checkpoint(CONFIG, position(2, epoch=2, epoch_tokens=512)) == 1
    assert stage_at_checkpoint(CONFIG, position(2, epoch=1)) is None  # older checkpoints
    assert stage_at_checkpoint(CONFIG, {}) is None
    assert config_at_checkpoint(CONFIG, {})["model"]["global_rope_theta"] == 160000.0
