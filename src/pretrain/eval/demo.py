"""`make demo-eval`: the `make demo` model against a randomly initialised encoder of the same
size on built-in tasks, fine-tuned and as a frozen probe, each over several seeds with the
same recipe for both, as mean +- standard deviation side by side. A seed draws everything
random in a fit: the task's examples (each seed another sample of the task), the random
encoder's weights, the head and the batch order.

    python -m pretrain.eval.demo [--tasks builtin_order ...] [--modes finetune probe]
                                 [--seeds 0 1 2] [hydra overrides ...]

Overrides apply to every run, after the recipe (e.g. `encoder.path=exports/demo-bert
eval.epochs=3`). Results are written as `eval/<task>-<mode>-<init>-seed<seed>.json` under the
encoder's run directory (`out_dir=` to change it)."""

import argparse
import statistics
import sys

from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.errors import ConfigError, report_error
from pretrain.eval.config import register_eval_schema

# Tasks a short pretraining helps with: word order (a sentence with its words shuffled or
# reversed, a sentence after its predecessor with its words shuffled) and words that do not
# fit their neighbours (a quarter of a sentence's, or half of a next sentence's, words
# replaced); the others (builtin_next, builtin_overlap, builtin_qa, builtin_replaced_qa,
# builtin_replaced) run with --tasks.
DEMO_TASKS = (
    "builtin_order",
    "builtin_reversed",
    "builtin_next_order",
    "builtin_corrupted",
    "builtin_continuation",
)
MAIN_METRIC = {
    "classification": "accuracy",
    "pair": "accuracy",
    "regression": "pearson",
    "qa": "f1",
    "tagging": "accuracy",
}
# One recipe per mode, the same for both inits, 1400 training examples each, both reading the
# mean over the tokens (an MLM-only encoder never trained its [CLS]) of every layer's output,
# concatenated. The probe freezes the encoder and fits a linear head for 100 epochs on those
# features standardized by their mean and deviation over the training set (the layers differ
# in scale), as linear probes usually are (its encoder runs once per example, the head alone
# per epoch: at 10 epochs it had not converged). Fine-tuning, as BERT's, reads the features
# as they are: it starts from a head fitted on the frozen encoder (LP-FT), then trains every
# weight for 5 epochs at 1e-3, a small model's rate (from a random head it pulled the
# pretrained features away from what a linear head reads: on builtin_corrupted the
# fine-tuned encoder scored below its own probe). 5 epochs, near BERT's 2-4: at 10 the
# random encoder learnt the surface cue of which words end a sentence (builtin_reversed,
# random 0.55-0.81 between seeds) and the comparison measured that more than pretraining.
# Standardized features also for fine-tuning helped the random encoder more
# (builtin_reversed +0.041 against +0.110); benchmarks/RESULTS.md has both.
RECIPES = {
    "finetune": [
        "eval.mode=finetune",
        "eval.probe_epochs=100",
        "eval.probe_lr=3e-2",
        "eval.layers=concat_all",
        "eval.pooling=mean",
        "eval.lr=1e-3",
        "eval.batch_size=32",
        "eval.epochs=5",
        "eval.dropout=0.1",
    ],
    "probe": [
        "eval.mode=features",
        "eval.standardize=true",
        "eval.layers=concat_all",
        "eval.pooling=mean",
        "eval.lr=3e-2",
        "eval.batch_size=64",
        "eval.epochs=100",
        "eval.dropout=0.0",
    ],
}
# Training and dev examples per task (a dev accuracy's standard error is about 0.022 with 500)
# and tokens per example (sentences of 6 to 24 words; pairs of two)
SIZES = ["eval.task.train_size=1400", "eval.task.dev_size=500", "eval.max_seq_length=64"]
INITS = ("pretrained", "random")


def compare(
    task: str, overrides: list[str], mode: str = "finetune", seed: int = 0
) -> dict[str, dict]:
    """{init: result} of fitting the pretrained and a random encoder on the built-in `task`
    with the same config: `eval=<task>`, the `mode` recipe (RECIPES), SIZES, then
    `overrides`; `seed` draws the task's training and dev examples (`eval.task.seed`, unless
    `overrides` set it), the random encoder's weights, the head and the batch order."""
    from pretrain.eval.run import evaluate

    register_eval_schema()
    results = {}
    for init in INITS:
        cfg = compose_config(
            [
                f"eval={task}",
                *RECIPES[mode],
                *SIZES,
                f"eval.task.seed={seed}",
                *overrides,
                f"encoder.init={init}",
                f"eval.seed={seed}",
                f"result_name={task}-{mode}-{init}-seed{seed}",
            ],
            "evaluate",
        )
        results[init] = evaluate(OmegaConf.to_object(cfg))[0]
    return results


def mean_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of `values`; the deviation of one value is 0."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def table(rows: list[tuple[str, str, str, list[float], list[float]]]) -> str:
    """A Markdown table of (task, metric, mode, pretrained scores, random scores), the scores
    one per seed in the same seed order: mean +- std of each init, and the difference of the
    means +- the std of the per-seed differences."""
    lines = [
        "| task | metric | mode | pretrained | random | difference |",
        "|---|---|---|---|---|---|",
    ]
    for task, metric, mode, pretrained, random in rows:
        differences = [p - r for p, r in zip(pretrained, random, strict=True)]
        cells = [
            "{:.3f} ± {:.3f}".format(*mean_std(scores))
            for scores in (pretrained, random, differences)
        ]
        cells[2] = "+" + cells[2] if not cells[2].startswith("-") else cells[2]
        lines.append(f"| {task} | {metric} | {mode} | {' | '.join(cells)} |")
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """tasks, modes, seeds and Hydra overrides of the command line, in any order: argparse
    would count the overrides after `--tasks a b` among the tasks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(DEMO_TASKS))
    parser.add_argument("--modes", nargs="+", default=list(RECIPES), help=" | ".join(RECIPES))
    parser.add_argument("--seeds", nargs="+", default=["0", "1", "2"])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = args.overrides
    for name in ("tasks", "modes", "seeds"):  # overrides that followed a list option
        values = getattr(args, name)
        overrides = [v for v in values if "=" in v] + overrides
        setattr(args, name, [v for v in values if "=" not in v])
    args.overrides = overrides
    if not all(seed.isdigit() for seed in args.seeds):
        parser.error(f"--seeds {' '.join(args.seeds)}: each must be a whole number")
    args.seeds = [int(seed) for seed in args.seeds]
    unknown = sorted(set(args.modes) - set(RECIPES))
    if unknown:
        parser.error(f"--modes {' '.join(unknown)}: each must be one of {', '.join(RECIPES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """The table of every task, mode and seed asked for; a config refused (a bad override,
    a layer choice the encoder cannot give) ends it as one line with exit status 2."""
    try:
        rows = compare_all(parse_arguments(argv))
    except ConfigError as error:
        report_error(error, "pretrain.eval.demo")
        sys.exit(2)
    print(table(rows))


def compare_all(args: argparse.Namespace) -> list[tuple[str, str, str, list[float], list[float]]]:
    """`table`'s rows for the parsed command line, one line printed per seed as it ends."""
    rows = []
    for task in args.tasks:
        for mode in args.modes:
            scores: dict[str, list[float]] = {init: [] for init in INITS}
            for seed in args.seeds:
                results = compare(task, args.overrides, mode, seed)
                metrics = results["pretrained"]["metrics"]
                metric = MAIN_METRIC[results["pretrained"]["kind"]]
                metric = metric if metric in metrics else next(iter(metrics))
                for init in INITS:
                    scores[init].append(results[init]["metrics"][metric])
                print(
                    f"{task} {mode} seed {seed}: pretrained {scores['pretrained'][-1]:.3f}, "
                    f"random {scores['random'][-1]:.3f} ({metric})",
                    flush=True,
                )
            rows.append((task, metric, mode, scores["pretrained"], scores["random"]))
    return rows


if __name__ == "__main__":
    main()
