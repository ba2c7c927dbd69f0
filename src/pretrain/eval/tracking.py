"""An evaluation's result in the pretraining run's wandb group: one wandb run per result
(job_type `eval`, named after the result), in the project and group the pretraining run
logged to, offline unless an API key is configured (as pretraining's logger does).

Which project and group: read from the pretraining run's saved config (its newest
`csv/version_*/hparams.yaml`, the file `pretrain-compare` reads): `logger.project`,
`logger.group` or else `experiment_name`. An export directory has no such file: its
results go to the project `pretrain`, group `eval`."""

from pathlib import Path
from typing import Any

WANDB_CHOICES = ("auto", "always", "never")
DEFAULT_PROJECT, DEFAULT_GROUP = "pretrain", "eval"


def pretraining_logger(run_dir: Path) -> dict[str, Any]:
    """{wandb: did the pretraining run log to wandb, project, group, mode (auto, offline,
    online)} from the run's saved config; wandb False, project `pretrain`, group `eval`, mode
    auto where there is none."""
    from pretrain.eval.compare import read_config

    config = read_config(run_dir) if run_dir.is_dir() else {}
    return {
        "wandb": bool(config.get("logger.wandb", False)),
        "project": config.get("logger.project") or DEFAULT_PROJECT,
        "group": config.get("logger.group") or config.get("experiment_name") or DEFAULT_GROUP,
        "mode": config.get("logger.mode") or "auto",
    }


def should_log(choice: str, run_dir: Path) -> bool:
    """`wandb` = auto: log when the pretraining run in `run_dir` logged to wandb; always;
    never."""
    if choice not in WANDB_CHOICES:
        raise ValueError(f"wandb = {choice!r}: must be one of {', '.join(WANDB_CHOICES)}")
    return choice == "always" or (choice == "auto" and pretraining_logger(run_dir)["wandb"])


def wandb_metrics(result: dict[str, Any]) -> dict[str, float]:
    """`eval/<task>/<metric>` -> value of a result (the keys its wandb summary gets)."""
    return {f"eval/{result['task']}/{name}": value for name, value in result["metrics"].items()}


def log_to_wandb(result: dict[str, Any], name: str, run_dir: Path, save_dir: Path) -> Path:
    """Log `result` (an evaluate() result) as a wandb run `name` in the pretraining run's
    project and group, its files under `save_dir/wandb`; in the pretraining run's
    `logger.mode` (auto: online when WANDB_API_KEY is set, else offline). Returns the wandb
    run's local directory."""
    import wandb

    from pretrain.runtime.trainer import own_wandb_service

    where = pretraining_logger(run_dir)
    mode = own_wandb_service(where["mode"])
    save_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=where["project"],
        group=where["group"],
        job_type="eval",
        name=name,
        dir=str(save_dir.resolve()),
        mode=mode,
        config={k: result[k] for k in ("task", "kind", "encoder", "init", "settings")},
        tags=[result["task"], result["init"], result["settings"]["mode"]],
    )
    metrics = wandb_metrics(result)
    run.log(metrics)
    run.summary.update(metrics)
    local_dir = Path(run.dir).parent
    run.finish()
    wandb.teardown()  # wait until wandb-core has written and closed the run's files
    return local_dir
