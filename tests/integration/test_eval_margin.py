"""What pretraining is for: a BERT pretrained with MLM on the tests' small corpus beats a
random encoder of the same size on the built-in `builtin_corrupted` task, for every seed
tried, by a margin (same recipe: `conf/eval/builtin_corrupted.yaml`, a linear probe of the
frozen encoder).

Measured (400 training and 200 dev examples, seeds 0, 1, 2): this pretraining (400 steps,
then extended to 1200 with the learning rate warmed up again) gave accuracy margins of
+0.010, +0.100 and +0.105 here (+0.055, +0.110 and +0.125 in a first run of the recipe); one
run of 1200 steps (a single warm-up) +0.010, +0.075 and +0.070; 400 steps alone +0.005,
+0.045 and +0.015; the `make demo` model +0.005 (README, Downstream evaluation). Seed 0's
margin is too small: the test fails (issue 16, item 1 open) until a longer pretraining or a
better task makes it hold; it is not marked xfail, so it can tell when it does. The pair and QA tasks show no margin at these budgets yet.

About 5 minutes of CPU on 2 loaded cores (4.5 of them pretraining): it runs only with
PRETRAIN_LONG_TESTS=1."""

import os
from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.eval.config import register_eval_schema

pytest.importorskip("transformers")
register_eval_schema()
SEEDS = (0, 1, 2)
MARGIN = 0.04  # accuracy, every seed; measured smallest: +0.010 (seed 0)
PRETRAINING = (  # a 64-wide, 2-layer BERT: 1200 MLM steps of 32 x 64 tokens
    "objective=mlm",
    "model.hidden_size=64",
    "model.intermediate_size=256",
    "data.batch_size=32",
    "data.num_workers=0",
    "optim.optimizer.lr=3e-3",
    "optim.warmup_steps=20",
    "trainer.log_every_n_steps=100",
)


@pytest.fixture(scope="module")
def pretrained_export(prepared_corpus: Path, tmp_path_factory) -> Path:
    """The exported encoder of a short MLM pretraining on `prepared_corpus`: 400 steps,
    then extended to 1200 (warmed up again over 20 steps, then decaying to 0)."""
    from pretrain.export import export_checkpoint
    from pretrain.run import train

    run_dir = tmp_path_factory.mktemp("margin") / "run"
    for steps in ("trainer.max_steps=400", "trainer.max_steps=1200 optim.extend=rewarm"):
        overrides = cpu_run_overrides(prepared_corpus, run_dir, *PRETRAINING, *steps.split())
        train(compose_config(overrides))
    return export_checkpoint(run_dir / "checkpoints" / "last.ckpt", run_dir.parent / "hf")


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("PRETRAIN_LONG_TESTS") != "1", reason="5 minutes: PRETRAIN_LONG_TESTS=1"
)
def test_pretrained_beats_random_on_corrupted_sentences_for_every_seed(pretrained_export):
    from pretrain.eval.encoder import load_encoder
    from pretrain.eval.run import fit_and_score, load_task

    margins = {}
    for seed in SEEDS:
        cfg = compose_config(
            ["eval=builtin_corrupted", f"eval.seed={seed}", f"eval.task.seed={seed}"],
            "evaluate",
        )
        run = OmegaConf.to_object(cfg)
        task = load_task(run.eval.task)
        scores = {
            init: fit_and_score(load_encoder(pretrained_export, init, seed), task, run.eval)[
                "metrics"
            ]["accuracy"]
            for init in ("pretrained", "random")
        }
        margins[seed] = (scores["pretrained"], scores["random"])
    print("accuracy (pretrained, random) per seed:", margins)
    assert all(pretrained - random >= MARGIN for pretrained, random in margins.values()), margins
