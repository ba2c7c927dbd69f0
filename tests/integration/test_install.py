"""A non-editable install works from any directory: the configs ship inside the package.

A wheel is built from a copy of this checkout and installed, without its dependencies, into
a fresh venv; the dependencies come from the test environment's site-packages through a
`.pth` path line (whose own `.pth` files, among them the editable `pretrain` finder, are not
run). No network. Every command runs from an unrelated temporary directory.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from pretrain.paths import CONF_DIR, REPO_ROOT

pytestmark = pytest.mark.slow

BUILD_INPUTS = ("pyproject.toml", "README.md", "src", "data_pipelines", "conf")


def run(command: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `command` in `cwd` with no PYTHONPATH; fail with its output when it fails."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a copy of this checkout (links kept, as git checks them out)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        path = REPO_ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(path, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    pip = [sys.executable, "-m", "pip"]
    run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root / "dist", "."], source
    )
    (built,) = (root / "dist").glob("pretrain-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh venv with the wheel installed (not editable)."""
    venv = tmp_path_factory.mktemp("venv")
    run([sys._base_executable, "-m", "venv", "--clear", "--without-pip", venv], venv)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python]
    run([*pip, "install", "-q", "--no-deps", "--no-index", wheel], venv)
    # Dependencies: this environment's site-packages as plain path lines, after the venv's own.
    site_packages = run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site_packages) / "zz_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    return venv / "bin"


def test_wheel_carries_every_config(wheel):
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("pretrain/conf/")}
    expected = {
        f"pretrain/conf/{path.relative_to(CONF_DIR).as_posix()}"
        for path in CONF_DIR.rglob("*")
        if path.suffix in (".yaml", ".md")
    }
    assert len(expected) > 50 and shipped == expected


def test_installed_commands_run_from_another_directory(installed, prepared_corpus, tmp_path):
    where = run(
        [installed / "python", "-c", "import pretrain.paths as p; print(p.CONF_DIR)"], tmp_path
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.parent.resolve()), where.stdout

    counts = run([installed / "pretrain-params", "model=bert_base"], tmp_path).stdout
    assert "108,891,648" in counts  # BERT-Base with its 30522-token vocabulary

    summary = run([installed / "pretrain-data", "info", prepared_corpus], tmp_path).stdout
    assert "documents" in summary

    corpus = f"data.shards_dir={prepared_corpus}"
    preview = [installed / "pretrain-data", "preview", "experiment=demo", corpus, "n=1"]
    assert "[CLS]" in run(preview, tmp_path).stdout

    train = [
        installed / "pretrain",
        "experiment=demo",
        "trainer.max_steps=2",
        corpus,
        "data.num_workers=0",
        "data.max_seq_length=64",
        "data.batch_size=4",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    run(train, tmp_path)
    assert (tmp_path / "runs" / "demo").is_dir()  # relative to the working directory
    assert list((tmp_path / "runs" / "demo").glob("*/checkpoints/last.ckpt"))


def test_a_user_config_directory_extends_the_shipped_ones(installed, tmp_path):
    """Hydra's search path: the user's directory adds options to the shipped groups."""
    user = tmp_path / "my_conf"
    (user / "model").mkdir(parents=True)
    (user / "model" / "bert_deeper.yaml").write_text(
        "defaults:\n  - bert_tiny\n  - _self_\nname: bert_deeper\nnum_hidden_layers: 4\n"
    )
    search = f"hydra.searchpath=[file://{user}]"
    counts = run([installed / "pretrain-params", search, "model=bert_deeper"], tmp_path).stdout
    assert "model bert_deeper" in counts
    composed = run(
        [installed / "pretrain", "--config-dir", user, "model=bert_deeper", "--cfg", "job"],
        tmp_path,
    ).stdout
    assert "name: bert_deeper" in composed and "num_hidden_layers: 4" in composed
