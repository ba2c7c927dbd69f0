"""The options tables of the READMEs, generated from `conf/`, so they list what is there.

    python -m pretrain.cli.conf_tables           # rewrite the tables in README.md and conf/README.md
    python -m pretrain.cli.conf_tables --check   # exit 1, naming the files, when a table is stale

Each table sits between two marker comments (`<!-- BEGIN/END options ... -->`) and is
replaced whole; the text around it is written by hand. An option's description is the first
sentence of the comment at the top of its YAML file (`# @package` lines skipped), so a new
config file documents itself by its header comment. Needs a source checkout (README.md).
"""

import argparse
import re
import sys
from pathlib import Path

from pretrain.paths import CONF_DIR, REPO_ROOT

# Groups in the order a reader meets them (the defaults list of train.yaml first); a group
# folder not named here is listed after these.
GROUP_ORDER = (
    "model",
    "objective",
    "data",
    "optim",
    "trainer",
    "strategy",
    "logger",
    "experiment",
    "sweep",
    "sweep_point",
    "hydra/launcher",
)
NO_DESCRIPTION = "—"
MAX_DESCRIPTION = 180  # characters: a longer first sentence is cut after a clause, with " …"
_ABBREVIATIONS = r"(?<!\bal\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<!\bcf\.)"
_SENTENCE_END = re.compile(_ABBREVIATIONS + r"(?<=[.!?])\s+")


def group_options(conf_dir: Path = CONF_DIR) -> dict[str, list[Path]]:
    """{group: its option files, sorted by name} for every folder of `conf_dir` that holds
    YAML files (nested groups as `hydra/launcher`), in `GROUP_ORDER`, then by name."""
    groups: dict[str, list[Path]] = {}
    for path in sorted(conf_dir.rglob("*.yaml")):
        group = path.parent.relative_to(conf_dir).as_posix()
        if group != ".":
            groups.setdefault(group, []).append(path)
    known = [group for group in GROUP_ORDER if group in groups]
    return {group: groups[group] for group in known + sorted(set(groups) - set(known))}


def description(path: Path) -> str:
    """The first sentence of the comment block at the top of the YAML file `path` (one line,
    Markdown table cell safe); `NO_DESCRIPTION` when the file starts without a comment."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(text)
    comment = " ".join(line for line in lines if line)
    if not comment:
        return NO_DESCRIPTION
    sentence = _SENTENCE_END.split(comment, maxsplit=1)[0]
    return shorten(sentence).replace("|", "\\|")


def shorten(sentence: str, limit: int = MAX_DESCRIPTION) -> str:
    """`sentence` cut after its last clause ("; " or ", " outside brackets) that ends within
    `limit` characters, marked " …"; unchanged when short or without such a clause."""
    if len(sentence) <= limit:
        return sentence
    depth, cuts = 0, {";": [], ",": []}
    for index, char in enumerate(sentence[:limit]):
        depth += (char in "([") - (char in ")]")
        if depth == 0 and char in cuts and sentence[index + 1 : index + 2] == " ":
            cuts[char].append(index)
    best = max(cuts[";"] or cuts[","] or [-1])
    return sentence if best < 40 else sentence[:best] + " …"


def options_table(conf_dir: Path = CONF_DIR) -> str:
    """conf/README.md's table: every option of every group with its description."""
    rows = ["| group | option | what it is |", "|---|---|---|"]
    for group, paths in group_options(conf_dir).items():
        for index, path in enumerate(paths):
            label = f"`{group}/` ({len(paths)})" if index == 0 else ""
            rows.append(f"| {label} | `{path.stem}` | {description(path)} |")
    return "\n".join(rows)


def summary_table(conf_dir: Path = CONF_DIR) -> str:
    """README.md's table: every group with the names of its options."""
    rows = ["| group | options |", "|---|---|"]
    for group, paths in group_options(conf_dir).items():
        rows.append(f"| `{group}` | {', '.join(f'`{path.stem}`' for path in paths)} |")
    return "\n".join(rows)


def _markers(name: str) -> tuple[str, str]:
    command = "python -m pretrain.cli.conf_tables"
    return (
        f"<!-- BEGIN options {name}: generated from conf/ by `{command}`; do not edit -->",
        f"<!-- END options {name} -->",
    )


def tables() -> dict[Path, tuple[str, str]]:
    """{README path: (table name, generated table)} of every generated table."""
    return {
        REPO_ROOT / "README.md": ("summary", summary_table()),
        (CONF_DIR / "README.md").resolve(): ("table", options_table()),
    }


def with_table(text: str, name: str, table: str, path: Path) -> str:
    """`text` with the block between the markers of table `name` replaced by `table`."""
    begin, end = _markers(name)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise SystemExit(
            f"{path}: no generated-table markers; put these two lines where the table goes:\n"
            f"{begin}\n{end}"
        )
    return text[: start + len(begin)] + "\n" + table + "\n" + text[stop:]


def stale_files() -> list[Path]:
    """The READMEs whose generated tables differ from what `conf/` gives now."""
    stale = []
    for path, (name, table) in tables().items():
        text = path.read_text(encoding="utf-8")
        if with_table(text, name, table, path) != text:
            stale.append(path)
    return stale


def write_tables() -> list[Path]:
    """Rewrite every stale table in place; returns the files that changed."""
    changed = stale_files()
    for path in changed:
        name, table = tables()[path]
        text = path.read_text(encoding="utf-8")
        path.write_text(with_table(text, name, table, path), encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Write the tables (or, with --check, only report stale ones: exit status 1)."""
    parser = argparse.ArgumentParser(
        prog="python -m pretrain.cli.conf_tables", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="report stale tables, change nothing")
    args = parser.parse_args(argv)
    if not (REPO_ROOT / "README.md").is_file():
        print(f"{REPO_ROOT}: not a source checkout (no README.md)", file=sys.stderr)
        return 2
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"{path}: options table is stale; run python -m pretrain.cli.conf_tables")
        return 1 if stale else 0
    for path in write_tables():
        print(f"rewrote the options table of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
