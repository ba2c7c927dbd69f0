"""The `${sweep_suffix:}` resolver: what tells the points of a Hydra sweep apart in their
run names."""


def sweep_suffix() -> str:
    """`-<the job's overrides>` inside a job of a Hydra sweep (`pretrain -m ...`), else "".

    The default `run_name` ends with it, so every point of a sweep gets its own run directory
    (the same one again when the job is requeued) instead of resuming another point's run.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return ""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or not hydra_cfg.job.override_dirname:
        return ""
    return "-" + hydra_cfg.job.override_dirname.replace("/", "_")  # one directory level
