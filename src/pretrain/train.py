"""`pretrain`: the Hydra main of training. `pretrain experiment=demo model=bert_mini ...`

Exit statuses: 0 finished; 2 config or data error (also a changed config in a run directory
that holds another run's checkpoint); 3 non-finite loss under trainer.nonfinite=stop; 4 a
collective timed out; 75 preempted: a complete checkpoint was saved and the run is not
finished (run the same command again to resume). See `pretrain.run.run_or_exit`.
"""

import hydra
from omegaconf import DictConfig

from pretrain.job_signals import hold_preemption_signals
from pretrain.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def _train(cfg: DictConfig) -> None:
    from pretrain.run import run_or_exit  # torch and Lightning load here, signals held

    run_or_exit(cfg)


def main() -> None:
    """The console script: SLURM's preemption signals are held from here on (a signal during
    start-up is kept for the first step boundary, not fatal), then Hydra composes and runs."""
    hold_preemption_signals()
    import pretrain.config  # noqa: F401 - registers the schema train.yaml names

    _train()


if __name__ == "__main__":
    main()
