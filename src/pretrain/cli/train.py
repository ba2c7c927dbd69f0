"""`pretrain`: the Hydra main of training. `pretrain experiment=demo model=bert_mini ...`

Exit statuses: 0 finished; 2 config or data error (Hydra's own too: an unknown group or
option, a value of the wrong type, a key the schema has no place for; also a changed config in
a run directory that holds another run's checkpoint); 3 non-finite loss under
trainer.nonfinite=stop; 4 a collective timed out; 75 preempted: a complete checkpoint was
saved and the run is not finished (run the same command again to resume). See
`pretrain.runtime.run.run_or_exit`.

Importing this module first holds SLURM's preemption signals (`pretrain.cluster.signals`): one
that comes while torch loads and the config is composed is kept for the first step boundary
instead of ending the process. A launcher that imports it to run `main` (submitit unpickling
the job) installs its own handlers afterwards, as before.

Importing it registers the config schema (`pretrain.config`) but loads neither torch nor
Lightning: `pretrain --help` and `pretrain --cfg job` stay fast; `pretrain.runtime.run` (torch,
Lightning, the objectives) is imported when a run starts.
"""

from pretrain.cluster.signals import hold_preemption_signals

hold_preemption_signals()

import sys  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import pretrain.config  # noqa: E402, F401 - registers the schema train.yaml names
from pretrain.cli.help import print_app_help, wants_help  # noqa: E402
from pretrain.paths import CONF_DIR  # noqa: E402


def run_training(cfg: DictConfig) -> None:
    """The task Hydra runs (and a submitit job unpickles, by reference to this module)."""
    from pretrain.runtime.run import run_or_exit  # torch and Lightning load here, signals held

    run_or_exit(cfg)


hydra_main = hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")(
    run_training
)


def main() -> None:
    """The console script: `--help` prints the groups and the composed config
    (`pretrain.cli.help`), anything else goes to Hydra."""
    if wants_help(sys.argv[1:]):
        summary = "\n\n".join(__doc__.split("\n\n")[:2])  # usage and exit statuses
        sys.exit(print_app_help("pretrain", summary, "train", sys.argv[1:]))
    try:
        hydra_main()
    except SystemExit as stop:
        if stop.code == 1 and is_hydra_error(stop.__context__):
            sys.exit(2)  # Hydra printed it: a config error, exit status 2 as for ours
        raise


def is_hydra_error(error: BaseException | None) -> bool:
    """Whether `error` (what Hydra reported before exiting 1) is Hydra's or OmegaConf's own:
    an unknown config group or option, an override that does not parse, a value of the wrong
    type; not an error the training raised."""
    from hydra.errors import CompactHydraException, HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(error, CompactHydraException | HydraException | OmegaConfBaseException)


if __name__ == "__main__":
    main()
