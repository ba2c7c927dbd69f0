"""`--help` of the Hydra apps (`pretrain`, `pretrain-eval`), printed without Hydra's help.

Hydra's `--help` lists the config groups by deep-copying its config repository once per group
and option kind (about a hundred copies of the schemas: a second of CPU time on the 2-core
development machine, more than the rest of start-up). This help lists the groups from the
config directory instead, then prints the config composed with the command's overrides, as
Hydra's does; `--hydra-help` is still Hydra's own. Neither torch nor Lightning is imported.
"""

from pathlib import Path

HELP_FLAGS = ("--help", "-h")


def wants_help(argv: list[str]) -> bool:
    """True when the command line asks for the app's help (`--help`/`-h`, not `--hydra-help`)."""
    return any(arg in HELP_FLAGS for arg in argv) and "--hydra-help" not in argv


def config_groups(conf_dir: Path) -> dict[str, list[str]]:
    """Config group (its folder under `conf_dir`, e.g. `model`) -> its options (YAML file
    names without the suffix), both sorted; Hydra's own `hydra/...` groups left out."""
    groups: dict[str, list[str]] = {}
    for path in sorted(conf_dir.rglob("*.yaml")):
        group = path.parent.relative_to(conf_dir).as_posix()
        if group != "." and group.split("/")[0] != "hydra":
            groups.setdefault(group, []).append(path.stem)
    return groups


def app_help(prog: str, summary: str, config_name: str, argv: list[str]) -> str:
    """The help text of `prog`: `summary`, its config groups and the config `config_name`
    composed with the overrides in `argv` (arguments that are not flags). Raises Hydra's or
    OmegaConf's error for an override that does not compose."""
    from omegaconf import OmegaConf

    from pretrain.config import compose_config
    from pretrain.paths import CONF_DIR

    overrides = [arg for arg in argv if not arg.startswith("-")]
    cfg = compose_config(overrides, config_name=config_name)
    groups = "\n".join(
        f"{group}: {', '.join(options)}" for group, options in config_groups(CONF_DIR).items()
    )
    return (
        f"{summary.strip()}\n\n"
        f"== Configuration groups ==\nCompose your configuration from those groups "
        f"(group=option)\n\n{groups}\n\n"
        f"== Config ==\nOverride anything in the config (foo.bar=value)\n\n"
        f"{OmegaConf.to_yaml(cfg)}\n"
        f"Hydra's flags (--cfg job, -m, --info, ...): {prog} --hydra-help"
    )


def print_app_help(prog: str, summary: str, config_name: str, argv: list[str]) -> int:
    """Print `app_help` and return 0, or the composition error on one line and return 2."""
    import sys

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        print(app_help(prog, summary, config_name, argv))
    except (HydraException, OmegaConfBaseException) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    return 0
