"""`pretrain`: the Hydra main of training. `pretrain experiment=demo model=bert_mini ...`

Exit statuses: 0 finished; 2 config or data error (also a changed config in a run directory
that holds another run's checkpoint); 3 non-finite loss under trainer.nonfinite=stop; 4 a
collective timed out; 75 preempted: a complete checkpoint was saved and the run is not
finished (run the same command again to resume). See `pretrain.run.run_or_exit`.

Importing this module first holds SLURM's preemption signals (`pretrain.job_signals`): one
that comes while torch loads and the config is composed is kept for the first step boundary
instead of ending the process. A launcher that imports it to run `main` (submitit unpickling
the job) installs its own handlers afterwards, as before.
"""

from pretrain.job_signals import hold_preemption_signals

hold_preemption_signals()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from pretrain.paths import CONF_DIR  # noqa: E402
from pretrain.run import run_or_exit  # noqa: E402


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_or_exit(cfg)


if __name__ == "__main__":
    main()
