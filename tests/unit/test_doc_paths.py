"""Every relative path that a README or a module docstring names exists (issue 52 item 7).

Read: README.md, every *.md under conf/, src/, slurm/, docker/, data_pipelines/ and
benchmarks/, and the module docstring of every module under src/pretrain. Checked:
- a token that starts at one of the repository's top-level folders or at `pretrain/`
  (`tests/unit/`, `conf/model`, `src/pretrain/data/stream.py`);
- another token with a slash that ends in a source suffix (`data/stream.py`), when its first
  folder is one of the bases below (so `runs/x/last.ckpt` or `.hydra/config.yaml`, a run's
  output, is not a file of this repository);
- a backticked file name (`ARCHITECTURE.md`, `stream.py`): some file of the repository bears it.
A path is found relative to the repository root, the document's own folder, src/ or
src/pretrain/; `*` matches as a glob. Placeholders (`<task>`, `${...}`, `NEW.py`, `DIR/`),
URLs and absolute paths are left alone."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOC_FOLDERS = ("conf", "src", "slurm", "docker", "data_pipelines", "benchmarks")
TOP_FOLDERS = (
    "src",
    "tests",
    "conf",
    "benchmarks",
    "slurm",
    "docker",
    "data_pipelines",
    "pretrain",
)
SOURCE_SUFFIXES = "py|md|yaml|yml|sh|sbatch|toml|cfg"
NAME = r"[\w.*-]+"
PATH = re.compile(
    rf"(?<![\w./:$<>{{}}~-])(?:"
    rf"(?:{NAME}/)+{NAME}\.(?:{SOURCE_SUFFIXES})"  # a/b/c.py
    rf"|(?:{'|'.join(TOP_FOLDERS)})/(?:{NAME}/?)*"  # tests/unit/, conf/model
    rf")(?![\w/<>{{}}$-])"
)
BACKTICKED_FILE = re.compile(rf"`({NAME}\.(?:py|md))`")
PLACEHOLDER = re.compile(r"(^|/)(NEW|NAME|DIR|FILE|PATH|OUT)([_./*]|$)")
REPOSITORY_FILES = {
    path.name
    for folder in (*DOC_FOLDERS, "tests", ".")
    for path in (ROOT / folder).rglob("*")
    if ".venv" not in path.parts and ".git" not in path.parts
}


def documents() -> dict[Path, str]:
    """Each document's path -> its text: the READMEs and .md files, and the docstrings of
    src/pretrain's modules (the module's path standing for its docstring)."""
    docs = {ROOT / "README.md": (ROOT / "README.md").read_text()}
    for folder in DOC_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.md")):
            if ".venv" not in path.parts and "pretrain.egg-info" not in path.parts:
                docs.setdefault(path.resolve(), path.read_text())
    for path in sorted((ROOT / "src" / "pretrain").rglob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if docstring:
            docs[path] = docstring
    return docs


def named_paths(text: str) -> set[str]:
    """The path-like tokens of a text, trailing sentence punctuation removed."""
    found = {match.rstrip(".,;:") for match in PATH.findall(text)}
    found |= set(BACKTICKED_FILE.findall(text))
    return {token for token in found if token and not PLACEHOLDER.search(token)}


def bases(doc: Path) -> list[Path]:
    """The folders a document's relative paths are read from."""
    return [ROOT, doc.parent, ROOT / "src", ROOT / "src" / "pretrain"]


# The top-level folders .gitignore keeps out of the repository (`/runs/`, `/exports/`, ...):
# made by `make demo` and runs, so `runs/demo/...` in a document stays a run's output there.
OUTPUT_FOLDERS = {
    line.strip().strip("/")
    for line in (ROOT / ".gitignore").read_text().splitlines()
    if line.startswith("/") and line.strip().endswith("/")
}


def is_checked(token: str, doc: Path) -> bool:
    """True for a token that must name a file of this repository (module docstring)."""
    first = token.split("/")[0]
    if "/" not in token or first in TOP_FOLDERS:
        return True
    return any(
        (base / first).is_dir() and not (base == ROOT and first in OUTPUT_FOLDERS)
        for base in bases(doc)
    )


def exists(token: str, doc: Path) -> bool:
    """True when `token` names a file or folder from one of the document's bases (a glob when
    it holds `*`), or, a bare file name, a file anywhere in the repository."""
    if "/" not in token:
        return token in REPOSITORY_FILES
    for base in bases(doc):
        if "*" in token:
            if any(base.glob(token.rstrip("/"))):
                return True
        elif (base / token).exists():
            return True
    return False


def missing_paths() -> list[str]:
    """`document: path` for every path a document names that does not exist."""
    missing = []
    for doc, text in documents().items():
        where = doc.relative_to(ROOT)
        tokens = sorted(token for token in named_paths(text) if is_checked(token, doc))
        missing += [f"{where}: {token}" for token in tokens if not exists(token, doc)]
    return missing


def test_named_paths_are_read():
    """The check itself: the kinds of token it must see, and those it must leave alone."""
    text = (
        "see `src/pretrain/data/stream.py`, tests/unit/ and (conf/model), data/stream.py; "
        "`ARCHITECTURE.md`; not https://x.org/a/b.py, /tmp/a/b.py, <run dir>/eval/<task>.json, "
        "src/pretrain/objectives/NEW.py, `run_state.json`"
    )
    assert named_paths(text) == {
        "src/pretrain/data/stream.py",
        "tests/unit/",
        "conf/model",
        "data/stream.py",
        "ARCHITECTURE.md",
    }
    conf_readme, package_readme = (
        ROOT / "conf" / "README.md",
        ROOT / "src" / "pretrain" / "README.md",
    )
    assert not exists("tests/unit/test_objective_schemas.py", conf_readme)
    assert not exists("ARCHITECTURE.md", package_readme)
    assert exists("data/stream.py", package_readme) and exists(
        "objectives/*_config.py", conf_readme
    )
    assert not is_checked("runs/demo/checkpoints/last.yaml", conf_readme)


def test_every_named_path_exists():
    missing = missing_paths()
    assert not missing, "paths named in docs that do not exist:\n" + "\n".join(missing)
