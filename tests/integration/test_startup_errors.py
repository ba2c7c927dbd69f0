"""A missing corpus is reported before torch or Lightning load: the one error line and exit
status 2 come in the time Hydra takes to compose, not after a minute of imports; so does an
option a config group lacks, with the closest one it has."""

import subprocess
import sys

import pytest

CODE = """
import sys
from pretrain.cli import train
sys.argv = ["pretrain", *sys.argv[1:]]
try:
    train.main()
except SystemExit as stop:
    loaded = [name for name in ("torch", "lightning", "deepspeed") if name in sys.modules]
    print("exit", stop.code, "loaded:", ",".join(loaded) or "none")
"""


def run(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CODE, *overrides], capture_output=True, text=True, timeout=300
    )


def test_a_missing_corpus_is_one_line_before_torch_loads(tmp_path):
    missing = tmp_path / "nowhere"
    result = run(f"data.shards_dir={missing}", f"run_dir={tmp_path / 'run'}")
    assert result.stdout.strip() == "exit 2 loaded: none"
    assert result.stderr.strip() == (
        f"error: data.shards_dir={missing}: no such directory; prepare a corpus there "
        f"(pretrain-data prepare inputs=[...] out_dir={missing}) or point at one"
    )
    missing.mkdir()  # a directory without a manifest
    result = run(f"data.shards_dir={missing}", f"run_dir={tmp_path / 'run'}")
    assert "no manifest.json in it" in result.stderr
    assert result.stdout.strip() == "exit 2 loaded: none"


@pytest.mark.parametrize(
    ("override", "guess"),
    [
        ("model=bert_tinyy", "model=bert_tiny"),
        ("objective=mlm_nps", "objective=mlm_nsp"),
        ("hydra/launcher=slurmm", "hydra/launcher=slurm"),
        ("optim=zzzzzz", None),  # nothing close: no guess
    ],
)
def test_an_unknown_option_names_the_closest(override, guess, tmp_path):
    result = run(override, f"run_dir={tmp_path / 'run'}")
    assert result.stdout.strip() == "exit 2 loaded: none"
    (line,) = result.stderr.splitlines()
    group, name = override.split("=")
    assert line.startswith("error: In '") and f"Could not find '{group}/{name}'" in line, line
    assert "Available options in " in line
    if guess is None:
        assert "did you mean" not in line, line
    else:
        assert f"Could not find '{group}/{name}' (did you mean {guess}?); " in line, line
