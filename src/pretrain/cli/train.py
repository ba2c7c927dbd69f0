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

import difflib  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import pretrain.config  # noqa: E402, F401 - registers the schema train.yaml names
from pretrain.cli.help import print_app_help, wants_help  # noqa: E402
from pretrain.cluster.local_ranks import follow_launcher  # noqa: E402
from pretrain.cluster.process_exit import console_script  # noqa: E402
from pretrain.errors import ConfigError, write_line  # noqa: E402
from pretrain.paths import CONF_DIR  # noqa: E402


def missing_corpus(shards_dir: str) -> str | None:
    """Why the local corpus `data.shards_dir` cannot be trained on (no directory, or no
    manifest.json in it), found before torch and Lightning load; None when it has a manifest
    or is a URL (the storage layer opens those)."""
    from pretrain.storage import is_url  # torch- and fsspec-free

    if is_url(shards_dir):
        return None
    path = Path(shards_dir)
    if (path / "manifest.json").is_file():
        return None
    what = "no manifest.json in it" if path.is_dir() else "no such directory"
    return (
        f"data.shards_dir={shards_dir}: {what}; prepare a corpus there "
        f"(pretrain-data prepare inputs=[...] out_dir={shards_dir}) or point at one"
    )


def run_training(cfg: DictConfig) -> None:
    """The task Hydra runs (and a submitit job unpickles, by reference to this module)."""
    try:
        pretrain.config.check_known_keys(cfg)  # torch-free: a misspelled key comes first
        pretrain.config.check_component_sections(cfg)  # torch-free: then a bad value
    except ConfigError as error:
        write_line(f"error: {error}")
        sys.exit(2)
    if not cfg.data.sources and (problem := missing_corpus(str(cfg.data.shards_dir))):
        write_line(f"error: {problem}")
        sys.exit(2)
    from pretrain.runtime.run import run_or_exit  # torch and Lightning load here, signals held

    run_or_exit(cfg)


hydra_main = hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")(
    run_training
)


def main() -> None:
    """The console script: `--help` prints the groups and the composed config
    (`pretrain.cli.help`), anything else goes to Hydra. A local rank started by another
    `pretrain` process (Lightning's launcher) ends when that process dies
    (`pretrain.cluster.local_ranks`)."""
    follow_launcher()
    if wants_help(sys.argv[1:]):
        summary = "\n\n".join(__doc__.split("\n\n")[:2])  # usage and exit statuses
        sys.exit(print_app_help("pretrain", summary, "train", sys.argv[1:]))
    reporting = "HYDRA_FULL_ERROR" not in os.environ  # set: the user wants Hydra's traceback
    if reporting:
        os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors instead of exiting 1
    try:
        hydra_main()
    except Exception as error:
        if not reporting:
            raise
        sys.exit(report_launch_error(error))


def report_launch_error(error: Exception) -> int:
    """Report an error that reached Hydra (the run itself reports its own, `run_or_exit`) and
    return the exit status: Hydra's and OmegaConf's own errors (an unknown config group or
    option, an override that does not parse, a value of the wrong type) in one line
    (`one_line`), status 2; a filesystem fault creating the run directory in one line, status
    2; anything else is raised again (its traceback, status 1)."""
    from hydra.errors import CompactHydraException, HydraException
    from omegaconf.errors import OmegaConfBaseException

    from pretrain.errors import filesystem_error, report_error

    if isinstance(error, CompactHydraException | HydraException | OmegaConfBaseException):
        text = str(error)
        if isinstance(error.__cause__, OmegaConfBaseException):
            text += "\n" + str(error.__cause__)
        write_line(f"error: {one_line(text)}")
        return 2
    fault = filesystem_error(
        error, "creating the run directory", "run the same command again (or set run_dir=...)"
    )
    if fault is None:
        raise error
    report_error(fault)
    return 2


# Lines of Hydra's and OmegaConf's messages that say nothing about the command line
_NOISE = ("full_key:", "reference_type=", "object_type=", "Config search path:", "provider=")


def one_line(message: str) -> str:
    """Hydra's or OmegaConf's several-line `message` as one line: its lines joined by "; ",
    a list of available options (one per indented line) as "a, b, c", and the lines that
    describe Hydra's internals (the config search path, OmegaConf's key types) left out; an
    option a group lacks is followed by the closest it has (`closest_option`)."""
    parts: list[str] = []
    options: list[str] = []
    for line in message.splitlines():
        text = line.strip()
        if not text or text.startswith(_NOISE):
            continue
        if line.startswith("\t") and parts and parts[-1].endswith(":"):
            options.append(text)  # an option listed under "Available options in 'model':"
            continue
        if options:
            parts[-1] += " " + ", ".join(options)
            options = []
        parts.append(text)
    if options:
        parts[-1] += " " + ", ".join(options)
    if (guess := closest_option(message)) is not None:
        missing = next(i for i, part in enumerate(parts) if "Could not find" in part)
        parts[missing] += f" (did you mean {guess}?)"
    return "; ".join(part.removesuffix(".") for part in parts)


_MISSING = re.compile(r"Could not find '(?P<group>[^']+)/(?P<name>[^/']+)'")


def closest_option(message: str) -> str | None:
    """For Hydra's message that a group has no option of that name ("Could not find
    'model/bert_tinyy'" and the group's "Available options" listed one per indented line):
    the closest listed option as an override, "model=bert_tiny" (difflib), or None when the
    message is another or no option is close."""
    found = _MISSING.search(message)
    if found is None:
        return None
    _, _, options = message.partition("Available options in ")
    listed = []
    for line in options.splitlines()[1:]:  # after the header, to the next unindented line
        if not line.startswith("\t"):
            break
        listed.append(line.strip())
    close = difflib.get_close_matches(found["name"], listed, n=1)
    return f"{found['group']}={close[0]}" if close else None


console_main = console_script(main)  # `main`, then the process ends (pretrain.cluster.process_exit)


if __name__ == "__main__":
    console_main()
