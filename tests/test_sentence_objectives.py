"""SOP, StructBERT and SENTENCE-PAIR train end to end with a falling loss."""

import csv

import pytest
from test_train import tiny_overrides

from pretrain.config import compose_config
from pretrain.run import train


def logged(run_dir, column: str) -> list[float]:
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return [float(r[column]) for r in csv.DictReader(f) if r.get(column)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("objective", "data", "sentence_metric"),
    [
        ("sop", "segment_pair", "train/sop_loss"),
        ("structbert", "segment_pair", "train/three_way_loss"),
        ("mlm_nsp", "sentence_pair", "train/nsp_loss"),
    ],
)
def test_objective_trains_with_falling_loss(
    prepared_corpus, tmp_path, objective, data, sentence_metric
):
    run_dir = tmp_path / objective
    train(
        compose_config(
            tiny_overrides(
                prepared_corpus,
                run_dir,
                f"objective={objective}",
                f"data={data}",
                "trainer.max_steps=40",
                "trainer.log_every_n_steps=1",
            )
        )
    )
    mlm = logged(run_dir, "train/mlm_loss")
    assert sum(mlm[-5:]) / 5 < sum(mlm[:5]) / 5 - 0.5
    assert len(logged(run_dir, sentence_metric)) == 40
    if objective == "structbert":
        assert logged(run_dir, "train/word_order_loss")
