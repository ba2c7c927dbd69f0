"""`pretrain-eval`: fine-tune or probe a pretrained encoder on a downstream task and write its
dev-set metrics to `<run dir>/eval/<task>.json`.

    pretrain-eval encoder.path=exports/demo-bert eval=builtin_order
    pretrain-eval encoder.path=runs/x/checkpoints/last.ckpt eval=glue_sst2 eval.task.path=glue/SST-2
    pretrain-eval -m encoder.path=runs/a/checkpoints/last.ckpt,runs/b/checkpoints/last.ckpt

Exit status 2 on a config or data error (one line, naming the key or file and line).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import pretrain.config  # noqa: F401  (the ${sweep_suffix:} resolver)
from pretrain.cli.help import print_app_help, wants_help
from pretrain.cluster.process_exit import console_script
from pretrain.errors import ConfigError
from pretrain.eval.config import register_eval_schema
from pretrain.paths import CONF_DIR

register_eval_schema()


def format_metrics(metrics: dict[str, float]) -> str:
    """`name value` pairs of a result's metrics, 4 significant digits."""
    return "  ".join(f"{name} {value:.4g}" for name, value in metrics.items())


def result_line(result: dict) -> str:
    """`task (init encoder): metrics`, a classifier's majority-class baseline beside them."""
    line = f"{result['task']} ({result['init']} {result['encoder']}): "
    line += format_metrics(result["metrics"])
    baseline = result.get("baseline")
    if baseline:
        line += (
            f"  (majority class {baseline['majority_class']!r}: "
            f"accuracy {baseline['majority_accuracy']:.4g})"
        )
    return line


def constant_warning(result: dict) -> str | None:
    """One line warning that the classifier predicts one class for every dev example (its
    metrics are then the majority baseline's or worse), or None."""
    constant = result.get("constant_prediction")
    if constant is None:
        return None
    return (
        f"pretrain-eval: warning: {result['task']}: every one of the {result['dev_examples']} "
        f"dev examples is predicted {constant!r}: the classifier learnt nothing from the "
        "encoder (try more eval.epochs, another eval.lr, or eval.probe_epochs)"
    )


def evaluate_encoder(cfg: DictConfig) -> Path:
    """The task Hydra runs: evaluate, print the metrics (a classifier's with its majority
    baseline, and a warning when it predicts one class for all) and where they were written;
    returns the result file's path (`pretrain-eval -m` prints one table of them: SweepTable)."""
    from pretrain.eval.formats import TaskFileError
    from pretrain.eval.run import evaluate
    from pretrain.export import ExportError

    try:
        run = OmegaConf.to_object(cfg)
        result, path = evaluate(run)
    except OmegaConfBaseException as error:
        print(f"pretrain-eval: {error.full_key}: {error.msg}", file=sys.stderr)
        sys.exit(2)
    except (ConfigError, TaskFileError, ExportError) as error:
        print(f"pretrain-eval: {error}", file=sys.stderr)
        sys.exit(2)
    print(result_line(result))
    warning = constant_warning(result)
    if warning:
        print(warning, file=sys.stderr)
    print(f"Result: {path}")
    return path


hydra_main = hydra.main(config_path=str(CONF_DIR), config_name="evaluate", version_base="1.3")(
    evaluate_encoder
)


def main() -> None:
    """The console script: `--help` prints the groups and the composed config
    (`pretrain.cli.help`), anything else goes to Hydra."""
    if wants_help(sys.argv[1:]):
        sys.exit(print_app_help("pretrain-eval", __doc__, "evaluate", sys.argv[1:]))
    hydra_main()


console_main = console_script(main)  # `main`, then the process ends (pretrain.cluster.process_exit)


if __name__ == "__main__":
    console_main()
