"""Every objective composes and trains end to end through the real pipeline with a falling
loss (and its own extra loss or sentence task logged)."""

import csv

import pytest
from test_train import tiny_overrides

from pretrain.config import ConfigError, compose_config, validate
from pretrain.runtime.run import train

# objective -> (data group, settings it adds to MaskedLMConfig with their paper values)
OBJECTIVES = {
    "wwm": ("segment_pair", {"pair_task": "nsp"}),
    "ngram": ("segment_pair", {"max_ngram": 3}),
    "ernie": ("segment_pair", {"pair_task": "nsp"}),
    "span": (
        "full_sentences",
        {"pair_task": "none", "span_geometric_p": 0.2, "span_max_words": 10},
    ),
    "unilm": (  # the paper's 1/3 bidirectional, 1/6 each direction, 1/3 seq2seq
        "segment_pair",
        {"pair_task": "none", "bidirectional_weight": 2.0, "left_to_right_weight": 1.0}
        | {"right_to_left_weight": 1.0, "seq2seq_weight": 2.0},
    ),
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_objective_config_composes_with_paper_defaults(objective):
    data, settings = OBJECTIVES[objective]
    config = validate(compose_config([f"objective={objective}", f"data={data}"])).objective
    assert config.name == objective
    assert config.mlm_probability == 0.15
    assert (config.mask_token_probability, config.random_token_probability) == (0.8, 0.1)
    for key, value in settings.items():
        assert getattr(config, key) == value, key


def test_bad_max_ngram_names_its_key():
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["objective=ngram", "objective.max_ngram=0"]))
    assert str(error.value).startswith("objective.max_ngram")


def logged(run_dir, column: str) -> list[float]:
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return [float(r[column]) for r in csv.DictReader(f) if r.get(column)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("objective", "data", "extra_metric"),
    [
        ("wwm", "segment_pair", "train/nsp_loss"),
        ("ngram", "segment_pair", "train/nsp_loss"),
        ("ernie", "segment_pair", "train/nsp_loss"),
        ("span", "full_sentences", "train/sbo_loss"),
        ("sop", "segment_pair", "train/sop_loss"),
        ("structbert", "segment_pair", "train/word_order_loss"),
        ("mlm_nsp", "sentence_pair", "train/nsp_loss"),
        ("unilm", "segment_pair", "train/mlm_accuracy"),  # one cloze loss, no sentence task
    ],
)
def test_objective_trains_with_falling_loss(
    prepared_corpus, tmp_path, objective, data, extra_metric
):
    run_dir = tmp_path / objective
    train(
        compose_config(
            tiny_overrides(
                prepared_corpus,
                run_dir,
                f"objective={objective}",
                f"data={data}",
                "trainer.max_steps=35",
                "trainer.log_every_n_steps=1",
            )
        )
    )
    loss = logged(run_dir, "train/loss")
    assert len(loss) == 35
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 0.5, loss
    mlm = logged(run_dir, "train/mlm_loss")
    assert sum(mlm[-5:]) / 5 < sum(mlm[:5]) / 5 - 0.3, mlm
    extra = logged(run_dir, extra_metric)
    assert len(extra) == 35 or objective == "structbert"  # a batch may have no shuffled trigram
    if objective == "structbert":
        assert len(logged(run_dir, "train/three_way_loss")) == 35
    if objective == "span":  # the span boundary objective learns too
        assert sum(extra[-5:]) / 5 < sum(extra[:5]) / 5 - 0.3, extra
        assert not _has_column(run_dir, "train/nsp_loss")  # single segments, no sentence task


def _has_column(run_dir, column: str) -> bool:
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return column in (csv.DictReader(f).fieldnames or [])
