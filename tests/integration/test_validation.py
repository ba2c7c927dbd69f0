"""Held-out curves (pretrain.runtime.validation): `val/*` logged during training equal a direct
computation on the same held-out batches with the checkpoint of that step; every objective
family reports its own held-out metrics; evaluation leaves the training's state alone."""

import csv
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_train import tiny_overrides

from pretrain.checkpoint.compat import objective_state_dict
from pretrain.config import compose_config, validate
from pretrain.data.masking import IGNORE_INDEX
from pretrain.runtime.heldout import heldout_accuracy
from pretrain.runtime.run import build_stream, train
from pretrain.runtime.task import PretrainingTask
from pretrain.runtime.validation import heldout_batches, heldout_spec, means_of, metric_sums


def val_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """{step: {val/*: value}} from the run's CSV log."""
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return {
            int(row["step"]): {k: float(v) for k, v in row.items() if k.startswith("val/") and v}
            for row in csv.DictReader(f)
            if row.get("val/loss")
        }


@torch.no_grad()
def direct_metrics(module, batches: list[dict]) -> dict[str, float]:
    """MLM loss (F.cross_entropy on the masked positions), MLM accuracy
    (`evaluate.heldout_accuracy`) and NSP loss of each batch, averaged over batches."""
    module.eval()
    totals = {"mlm_loss": 0.0, "mlm_accuracy": 0.0, "nsp_loss": 0.0, "nsp_accuracy": 0.0}
    for batch in batches:
        hidden = module.encoder(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        )  # (batch, seq, hidden)
        selected = batch["labels"] != IGNORE_INDEX
        logits = module.mlm_head(hidden[selected])  # (n_masked, vocab)
        totals["mlm_loss"] += float(F.cross_entropy(logits, batch["labels"][selected]))
        accuracy = heldout_accuracy(module, [batch])
        totals["mlm_accuracy"] += accuracy["mlm_accuracy"]
        totals["nsp_accuracy"] += accuracy["sentence_accuracy"]
        sentence = module.sentence_head(hidden)
        totals["nsp_loss"] += float(F.cross_entropy(sentence, batch["next_sentence_label"]))
    return {k: v / len(batches) for k, v in totals.items()}


@pytest.mark.slow
def test_val_metrics_equal_a_direct_computation_with_the_checkpoint_of_the_step(
    prepared_corpus, tmp_path
):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        prepared_corpus,
        run_dir,
        "trainer.max_steps=5",
        "trainer.checkpoint_every_n_steps=2",
        "trainer.keep_checkpoints=5",
        "data.holdout_shards=1",
        "trainer.val_check_interval=2",
        "trainer.val_batches=3",
    )
    train(compose_config(overrides))
    rows = val_rows(run_dir)
    assert sorted(rows) == [2, 4, 5]  # every 2 optimizer steps, and the last
    run, spec, module_class = build_stream(compose_config(overrides))
    batches = heldout_batches(heldout_spec(run, spec), 3)
    assert len(batches) == 3
    held_out = {str(p) for p in heldout_spec(run, spec).shard_paths}
    assert held_out.isdisjoint(spec.shard_paths)  # never trained on
    for step, checkpoint in ((2, "step-0000002.ckpt"), (5, "last.ckpt")):
        module = module_class(run, spec.vocab)
        state = torch.load(run_dir / "checkpoints" / checkpoint, weights_only=True)
        module.load_state_dict(objective_state_dict(state["state_dict"]))
        direct = direct_metrics(module, batches)
        logged = rows[step]
        for key, value in direct.items():
            assert logged[f"val/{key}"] == pytest.approx(value, abs=1e-5), (step, key)
        assert logged["val/loss"] == pytest.approx(direct["mlm_loss"] + direct["nsp_loss"], 1e-5)
        assert logged["val/mlm_perplexity"] == pytest.approx(math.exp(direct["mlm_loss"]), 1e-5)
    assert rows[2]["val/mlm_loss"] != rows[5]["val/mlm_loss"]  # the model changed in between


@pytest.mark.parametrize(
    ("experiment", "expected"),
    [
        ("electra_demo", {"generator_accuracy", "discriminator_loss", "mlm_perplexity"}),
        ("gpt_demo", {"lm_loss", "lm_accuracy", "lm_perplexity"}),
        ("bart_demo", {"nll", "accuracy", "lm_perplexity"}),
        ("xlnet_demo", {"plm_loss", "plm_accuracy", "plm_perplexity"}),
    ],
)
def test_each_family_reports_its_heldout_metrics_without_touching_training_state(
    prepared_corpus, experiment, expected
):
    overrides = [
        f"experiment={experiment}",
        f"data.shards_dir={prepared_corpus}",
        "data.holdout_shards=1",
        "data.batch_size=2",
        "data.max_seq_length=64",
    ]
    run, spec, module_class = build_stream(compose_config(overrides))
    module = PretrainingTask(module_class(run, spec.vocab))
    batches = heldout_batches(heldout_spec(run, spec), 2)
    assert len(batches) == 2
    rng = torch.get_rng_state()
    first = means_of({k: float(v) for k, v in metric_sums(module, batches, run.seed).items()})
    again = means_of({k: float(v) for k, v in metric_sums(module, batches, run.seed).items()})
    assert torch.equal(torch.get_rng_state(), rng) and module.training
    assert first == again  # fixed masks, fixed sampling: the same numbers every time
    assert {f"val/{key}" for key in expected | {"loss"}} <= set(first)
    assert all(math.isfinite(value) for value in first.values())


def test_val_settings_are_checked():
    from pretrain.config import ConfigError

    with pytest.raises(ConfigError, match="trainer.val_check_interval"):
        validate(compose_config(["trainer.val_check_interval=0"]))


def logged_at(run_dir: Path, column: str) -> list[tuple[int, float]]:
    """(step, value) of `column` over every launch's CSV log, in order."""
    found = []
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            found += [
                (int(r["step"]), float(r[column])) for r in csv.DictReader(f) if r.get(column)
            ]
    return found


@pytest.mark.slow
def test_a_resumed_run_logs_the_uninterrupted_runs_val_metrics_and_progress(
    prepared_corpus, tmp_path
):
    def run(run_dir: Path, *extra: str) -> None:
        overrides = tiny_overrides(
            prepared_corpus,
            run_dir,
            "trainer.max_steps=4",
            "trainer.log_every_n_steps=2",
            "trainer.checkpoint_every_n_steps=2",
            "trainer.keep_checkpoints=5",
            "data.holdout_shards=1",
            "trainer.val_check_interval=2",
            "trainer.val_batches=2",
            *extra,
        )
        train(compose_config(overrides))

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run(whole)
    run(resumed, f"resume={whole / 'checkpoints' / 'step-0000002.ckpt'}")
    for column in ("val/loss", "val/mlm_accuracy", "train/tokens_seen", "train/samples_seen"):
        before = dict(logged_at(whole, column))
        after = dict(logged_at(resumed, column))
        # val/* after steps 2 and 4; counts in the training rows of steps 1 and 3
        # (log_every_n_steps=2), which count their own batch; the resumed launch logs the
        # later ones only (step 2 is not evaluated again)
        assert sorted(before) == ([2, 4] if column.startswith("val/") else [1, 3])
        assert sorted(after) == sorted(before)[1:], column
        assert after == pytest.approx({step: before[step] for step in after}, abs=1e-6), column
    assert logged_at(whole, "train/samples_seen") == [(1, 16.0), (3, 32.0)]
