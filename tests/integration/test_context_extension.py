"""A context-extension phase through the stage schedule (`objective.stages[k].max_seq_length`
and `.global_rope_theta`): ModernBERT trains 3 steps on rows of at most 64 tokens with a global
RoPE theta of 10k, then on rows of up to 128 tokens with the model's 160k; the stream's rows
and thetas follow the stages, the encoder's per-row theta is the model's theta, and a run
resumed in the second phase trains what an uninterrupted one trains."""

import csv
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.data.stream import EpochStream
from pretrain.errors import ConfigError
from pretrain.runtime.run import prepare_run, train

pytestmark = pytest.mark.usefixtures("one_thread")

# 12 samples of 64 tokens (3 steps of 4), then samples of 128
STAGES = "+objective.stages=[{until_tokens:768,max_seq_length:64,global_rope_theta:10000},{}]"
RUN = (
    "model=modernbert_tiny",
    "model.local_attention=16",
    "objective=mlm",
    "objective.mlm_probability=0.3",
    "data=full_sentences",
    "data.num_workers=0",
    "data.max_seq_length=128",
    "data.batch_size=4",
    STAGES,
    "optim=stable_adamw",
    "optim.schedule=constant",
    "optim.warmup_steps=2",
    "trainer.gradient_clip_val=null",
    "trainer.log_every_n_steps=1",
)


def config(shards_dir: Path, run_dir: Path, *extra: str):
    return compose_config(cpu_run_overrides(shards_dir, run_dir, *RUN, *extra))


def losses(run_dir: Path) -> dict[int, float]:
    """{step: train/loss} from every CSV log of the run directory."""
    found = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("train/loss"):
                    found[int(row["step"])] = float(row["train/loss"])
    return found


def test_the_stream_and_the_encoder_follow_the_phases(prepared_corpus, tmp_path):
    _, task, datamodule = prepare_run(config(prepared_corpus, tmp_path / "run"))
    batches = EpochStream(datamodule.spec, 0)
    first = [batch for _, batch in zip(range(5), batches, strict=False)]
    for batch in first[:3]:  # the short phase
        assert batch["attention_mask"].sum(1).max() <= 64
        assert torch.equal(batch["global_rope_theta"], torch.full((4,), 10000.0))
    for batch in first[3:]:  # the long phase, at the model's theta
        assert torch.equal(batch["global_rope_theta"], torch.full((4,), 160000.0))
    assert max(int(b["attention_mask"].sum(1).max()) for b in first[3:]) > 64
    encoder = task.objective.encoder.eval()
    batch = first[0]
    with torch.no_grad():
        staged = encoder(batch["input_ids"], None, batch["attention_mask"],
                         global_rope_theta=batch["global_rope_theta"])  # fmt: skip
        default = encoder(batch["input_ids"], None, batch["attention_mask"])
        encoder.config.global_rope_theta = 10000.0
        set_by_config = encoder(batch["input_ids"], None, batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(staged[real], set_by_config[real], rtol=0, atol=1e-6)
    assert (staged[real] - default[real]).abs().max() > 1e-4


def test_a_run_resumed_in_the_long_phase_trains_what_an_uninterrupted_one_trains(
    prepared_corpus, tmp_path
):
    train(config(prepared_corpus, tmp_path / "whole", "trainer.max_steps=6"))
    parts = tmp_path / "parts"
    train(config(prepared_corpus, parts, "trainer.max_steps=4"))
    train(config(prepared_corpus, parts, "trainer.max_steps=6"))
    want, got = losses(tmp_path / "whole"), losses(parts)
    assert sorted(want) == sorted(got) == list(range(6))
    assert [got[s] for s in range(6)] == pytest.approx([want[s] for s in range(6)], abs=1e-5)


@pytest.mark.parametrize(
    "stage,named",
    [
        ("{until_tokens:768,max_seq_length:256}", "max_seq_length.*from 8 to"),
        ("{until_tokens:768,global_rope_theta:10000}", "global_rope_theta.*no RoPE theta"),
    ],
)
def test_a_phase_is_checked_against_the_run(prepared_corpus, tmp_path, stage, named):
    model = "model=bert_tiny" if "rope" in stage else "model=modernbert_tiny"
    overrides = cpu_run_overrides(
        prepared_corpus, tmp_path, model, "objective=mlm", "data=full_sentences",
        "data.max_seq_length=128", f"+objective.stages=[{stage},{{}}]",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=rf"objective.stages\[0\].{named}"):
        prepare_run(compose_config(overrides))
