"""Where the project's files live.

`CONF_DIR` is the primary Hydra config directory of `pretrain`, `pretrain-data` and
`pretrain-params`: `pretrain/conf` inside the package. In a source checkout that is a link to
the top-level `conf/` (the one source of the configs; an editable install reads it live); a
wheel or a plain `pip install .` carries a copy (pyproject.toml, package-data). Where the link
did not survive (a checkout without symlinks) the checkout's `conf/` is used directly.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]  # the source checkout; meaningless in an installed package
_SHIPPED = PACKAGE_DIR / "conf"
CONF_DIR = _SHIPPED.resolve() if _SHIPPED.is_dir() else REPO_ROOT / "conf"
