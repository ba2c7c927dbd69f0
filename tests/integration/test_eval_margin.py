"""What pretraining is for: a BERT pretrained with MLM on the tests' small corpus beats a
random encoder of the same size on the built-in `builtin_corrupted` task, for every seed
tried, by a margin (same recipe for both: `conf/eval/builtin_corrupted.yaml`, a linear probe
of the frozen encoder on every layer's mean-pooled output, embeddings included, concatenated;
1400 training and 1000 dev examples).

Accuracy margins measured (Python 3.11), seeds 0, 1, 2, 3, 4, in four runs of this test's
pretraining (400 steps, then extended to 1200 with the learning rate warmed up again; the runs
are not bit-identical, the random encoders are): +0.102, +0.069, +0.105, +0.075, +0.072;
+0.101, +0.071, +0.101, +0.065, +0.058; +0.113, +0.076, +0.073, +0.060, +0.061; +0.099,
+0.078, +0.070, +0.057, +0.060 (pretrained 0.710-0.750, random 0.630-0.671). Seeds 5-9
(first run, not asserted): +0.067, +0.089, +0.068, +0.078, +0.049. One 1200-step run (a single
warm-up): +0.098, +0.072, +0.095, +0.069, +0.072. Shorter pretraining is not enough: 400
steps gave +0.077, +0.056, +0.035, +0.045, +0.027, a 600-step run +0.075, +0.056, +0.050,
+0.018, +0.038. Nor is the last layer alone (same sizes, no dropout): +0.03 to +0.09. The old
recipe (400/200 examples, the last layer, batch 16, lr 1e-2, 20 epochs, dropout 0.1) gave
+0.010, +0.100, +0.105 on seeds 0-2. The pair and QA tasks show no margin at these budgets.

About 3 minutes of one idle core (pretraining 2, the 10 probes 1), 4.5 on a loaded machine:
it runs only with PRETRAIN_LONG_TESTS=1."""

import os
from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.eval.config import register_eval_schema

pytest.importorskip("transformers")
register_eval_schema()
SEEDS = (0, 1, 2, 3, 4)
MARGIN = 0.04  # accuracy, every seed; measured smallest: +0.057 (seed 3)
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
    os.environ.get("PRETRAIN_LONG_TESTS") != "1", reason="3 to 5 minutes: PRETRAIN_LONG_TESTS=1"
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
