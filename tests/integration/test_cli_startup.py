"""The command-line tools answer `--help`, `--cfg job`, `pretrain-data info` and a shipped
model's `pretrain-params` without importing torch, Lightning, DeepSpeed,
transformers, wandb or matplotlib:
those load only when a run, an evaluation or a report needs them.

One fresh interpreter runs every command in turn (its own modules, not this test process's)
and reports what each printed and which of the heavy packages were imported by the end."""

import json
import subprocess
import sys
from pathlib import Path

HEAVY_PACKAGES = ("torch", "lightning", "deepspeed", "transformers", "wandb", "matplotlib")

COMMANDS = r"""
import contextlib, io, json, sys

def call(name, main, argv):
    sys.argv = [name, *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            status = main()
        except SystemExit as stop:
            status = stop.code
    results[" ".join([name, *argv])] = [status or 0, out.getvalue()]

results = {}
shards_dir, heavy_names = sys.argv[1], sys.argv[2].split(",")
from pretrain.cli.train import main as train
from pretrain.cli.evaluate import main as evaluate
from pretrain.cli.params import main as params
from pretrain.eval.compare import main as compare
from data_pipelines.cli import main as data

call("pretrain", train, ["--help", "model=bert_base"])
call("pretrain-eval", evaluate, ["--help"])
call("pretrain-params", lambda: params(["--help"]), ["--help"])
call("pretrain-params", lambda: params(["model=bert_base"]), ["model=bert_base"])  # stored counts
call("pretrain-compare", lambda: compare(["--help"]), ["--help"])
call("pretrain-data", lambda: data(["info", "--help"]), ["info", "--help"])
call("pretrain-data", lambda: data(["info", shards_dir]), ["info", shards_dir])
call("pretrain", train, ["--cfg", "job", "model=bert_mini"])  # last: Hydra stays initialised
heavy = sorted(name for name in heavy_names if name in sys.modules)
print(json.dumps({"results": results, "heavy": heavy}))
"""


def test_help_cfg_and_info_import_no_heavy_package(prepared_corpus: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS, str(prepared_corpus), ",".join(HEAVY_PACKAGES)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    results = report["results"]
    assert {command: status for command, (status, _) in results.items()} == dict.fromkeys(
        results, 0
    )
    train_help = results["pretrain --help model=bert_base"][1]
    models = next(line for line in train_help.splitlines() if line.startswith("model: "))
    assert "bert_base" in models.split(", ")  # the groups and their options
    assert "hidden_size: 768" in train_help  # the config composed with the override
    assert "Exit statuses" in train_help
    assert "\neval: builtin_" in results["pretrain-eval --help"][1]  # the eval group listed
    assert "usage: pretrain-params" in results["pretrain-params --help"][1]
    assert "paper count    109.48M  109,482,240" in results["pretrain-params model=bert_base"][1]
    assert "pretrain-data info <shards_dir>" in results["pretrain-data info --help"][1]
    assert f"documents          {300:,}" in results[f"pretrain-data info {prepared_corpus}"][1]
    assert "name: bert_mini" in results["pretrain --cfg job model=bert_mini"][1]
    assert report["heavy"] == []


def test_help_with_a_bad_override_names_it() -> None:
    from pretrain.cli.help import print_app_help

    assert print_app_help("pretrain", "usage", "train", ["--help", "model=no_such_model"]) == 2


def test_config_groups_are_the_conf_folders() -> None:
    from pretrain.cli.help import config_groups
    from pretrain.paths import CONF_DIR

    groups = config_groups(CONF_DIR)
    assert groups["trainer"] == sorted(path.stem for path in (CONF_DIR / "trainer").glob("*.yaml"))
    assert "bert_base" in groups["model"]
    assert not [group for group in groups if group.startswith("hydra")]
