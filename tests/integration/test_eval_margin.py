"""What pretraining is for: a BERT pretrained with MLM on the tests' small corpus beats a
random encoder of the same size, for every seed tried, by a margin, on one built-in task of
each kind: `builtin_corrupted` (classification), `builtin_continuation` (pair) and
`builtin_replaced_qa` (extractive QA, SQuAD v1.1 style). Same recipe for both encoders, the
task's `conf/eval/<task>.yaml`: the frozen encoder's every layer, embeddings included,
concatenated; a linear head (mean-pooled for the sentence and pair tasks, per token for QA);
1400 training and 1000 dev examples. The frozen encoder runs once per example (features
mode caches its hidden states), so the 18 probes (3 tasks, 3 seeds, 2 encoders) take less than the pretraining.

Margins measured on seeds 0, 1, 2, 3, 4 (Python 3.11; this test's pretraining, 400 steps
then extended to 1200 with the learning rate warmed up again; runs are not bit-identical,
the random encoders are):
- builtin_corrupted, accuracy: +0.100, +0.059, +0.089, +0.088, +0.053 (pretrained
  0.705-0.759, random 0.630-0.671); a second run +0.120, +0.080, +0.098, +0.060, +0.076.
  Earlier, in four runs of the old test with the same
  recipe: +0.057 to +0.113; seeds 5-9 +0.049 to +0.089. Shorter pretraining is not enough
  (400 steps: +0.027 to +0.077), nor is the last layer alone (+0.03 to +0.09).
- builtin_continuation, accuracy: +0.055, +0.076, +0.070, +0.057, +0.039 (pretrained
  0.750-0.788, random 0.696-0.733); a second run +0.077, +0.090, +0.095, +0.059, +0.057;
  a third: +0.046, +0.064, +0.077, +0.051,
  +0.035, and on seeds 5-9 (not asserted) +0.056, +0.071, +0.060, +0.029, +0.082. With a quarter of B's words replaced instead of half: +0.021, +0.024, +0.075,
  +0.023, +0.040; `builtin_next` (B from another topic) shows no margin.
- builtin_replaced_qa, SQuAD F1 (percent): +9.2, +8.4, +8.5, +8.5, +7.1 (pretrained
  50.7-52.2, random 42.2-43.6; exact match about 4 against 2: spans are rarely exact); a
  second run +8.2, +8.9, +8.4, +9.1, +9.3; a third: +8.7, +7.5, +6.5, +9.7, +7.7, and on seeds 5-9 (not asserted) +7.4, +6.8,
  +8.1, +6.4, +3.2 (seed 9: random 49.2, the highest seen). Without an answer for some questions (SQuAD
  v2) the margin did not hold: with a third, both heads answered "no answer" to nearly every
  question (F1 = that third; one replaced word, placed when forced 8% against 4% of the
  time); with a tenth, +8.4, +1.0, +0.6, +5.3, +4.7 (the no-answer call decides the score).

7.7 minutes on a loaded machine (2 cores, load 6 to 8: pretraining 4.1, 30 probes on 5 seeds 3.6),
5.4 at load 3 to 6 (3.1 and 2.4); the old test's pretraining took 2 of the 3 minutes it
needed on one idle core, so about 4 here. The Makefile's test target starts it first
(LONGEST_FIRST)."""

from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.eval.config import register_eval_schema

pytest.importorskip("transformers")
register_eval_schema()
SEEDS = (0, 1, 2)  # asserted on each; 0-4 measured below
MARGINS = {  # task -> (metric, margin asserted on every seed)
    "builtin_corrupted": ("accuracy", 0.04),  # smallest measured: +0.057
    "builtin_continuation": ("accuracy", 0.02),  # smallest measured: +0.035
    "builtin_replaced_qa": ("f1", 3.0),  # SQuAD F1, percent; smallest measured: +6.5
}
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


@pytest.fixture(scope="session")
def pretrained_export(prepared_corpus: Path, build_once) -> Path:
    """The exported encoder of a short MLM pretraining on `prepared_corpus`: 400 steps,
    then extended to 1200 (warmed up again over 20 steps, then decaying to 0); trained once
    for all the tests' workers."""

    def make(root: Path) -> None:
        from pretrain.export import export_checkpoint
        from pretrain.runtime.run import train

        run_dir = root / "run"
        for steps in ("trainer.max_steps=400", "trainer.max_steps=1200 optim.extend=rewarm"):
            overrides = cpu_run_overrides(prepared_corpus, run_dir, *PRETRAINING, *steps.split())
            train(compose_config(overrides))
        export_checkpoint(run_dir / "checkpoints" / "last.ckpt", root / "hf")

    return build_once("eval-margin-pretraining", make) / "hf"


@pytest.mark.slow
def test_pretrained_beats_random_for_every_seed(pretrained_export):
    """Every task of MARGINS in one test (one worker: the pretraining is trained once)."""
    from pretrain.eval.encoder import load_encoder
    from pretrain.eval.run import fit_and_score, load_task

    short = {}
    for task_name, (metric, margin) in MARGINS.items():
        scores = {}
        for seed in SEEDS:
            cfg = compose_config(
                [f"eval={task_name}", f"eval.seed={seed}", f"eval.task.seed={seed}"], "evaluate"
            )
            run = OmegaConf.to_object(cfg)
            task = load_task(run.eval.task)
            scores[seed] = tuple(
                fit_and_score(load_encoder(pretrained_export, init, seed), task, run.eval)[
                    "metrics"
                ][metric]
                for init in ("pretrained", "random")
            )
        print(f"{task_name} {metric} (pretrained, random) per seed:", scores)
        if not all(pretrained - random >= margin for pretrained, random in scores.values()):
            short[task_name] = scores
    assert not short, f"pretrained not ahead by the margin on: {short}"
