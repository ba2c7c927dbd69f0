"""`make demo-eval`: the `make demo` model against a randomly initialised encoder of the same
size, each fine-tuned on built-in tasks with the same recipe, scores side by side.

    python -m pretrain.eval.demo [--tasks builtin_next builtin_order ...] [hydra overrides ...]

Overrides apply to every run (e.g. `encoder.path=exports/demo-bert eval.epochs=5`). Results
are written as `eval/<task>-<init>.json` under the encoder's run directory (`out_dir=` to
change it)."""

import argparse

from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.eval.config import register_eval_schema

DEMO_TASKS = (
    "builtin_corrupted",
    "builtin_order",
    "builtin_next",
    "builtin_continuation",
    "builtin_overlap",
    "builtin_replaced",
    "builtin_qa",
    "builtin_replaced_qa",
)
MAIN_METRIC = {
    "classification": "accuracy",
    "pair": "accuracy",
    "regression": "pearson",
    "qa": "f1",
    "tagging": "f1",
}


def compare(task: str, overrides: list[str]) -> dict[str, dict]:
    """{init: result} of fine-tuning the pretrained and a random encoder on the built-in
    `task` with the same config (`overrides` on top of `eval=<task>`)."""
    from pretrain.eval.run import evaluate

    register_eval_schema()
    results = {}
    for init in ("pretrained", "random"):
        cfg = compose_config(
            [f"eval={task}", *overrides, f"encoder.init={init}", f"result_name={task}-{init}"],
            "evaluate",
        )
        results[init] = evaluate(OmegaConf.to_object(cfg))[0]
    return results


def table(rows: list[tuple[str, str, float, float]]) -> str:
    """A Markdown table: task, metric, pretrained, random, difference."""
    lines = [
        "| task | metric | pretrained | random | difference |",
        "|---|---|---|---|---|",
    ]
    for task, metric, pretrained, random in rows:
        lines.append(
            f"| {task} | {metric} | {pretrained:.3f} | {random:.3f} | {pretrained - random:+.3f} |"
        )
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(tasks, Hydra overrides) of the command line, in either order: argparse would count
    the overrides after `--tasks a b` among the tasks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(DEMO_TASKS))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    tasks = [task for task in args.tasks if "=" not in task]
    return tasks, [task for task in args.tasks if "=" in task] + args.overrides


def main(argv: list[str] | None = None) -> None:
    tasks, overrides = parse_arguments(argv)
    rows = []
    for task in tasks:
        results = compare(task, overrides)
        metric = MAIN_METRIC[results["pretrained"]["kind"]]
        scores = [results[init]["metrics"][metric] for init in ("pretrained", "random")]
        rows.append((task, metric, *scores))
        print(f"{task}: pretrained {scores[0]:.3f}, random {scores[1]:.3f} ({metric})", flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
