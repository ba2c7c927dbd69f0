"""`pretrain-generate` on an export of a model never trained to generate: an MLM-only BERT's
export records its objective in config.json, and generation from it is refused with one line
naming that objective, unless --allow-any-objective."""

import json
import shutil

import pytest
from conftest import cpu_run_overrides

from pretrain.cli.generate import main
from pretrain.config import compose_config
from pretrain.export import export_checkpoint
from pretrain.runtime.run import train

MLM = "pretrain.objectives.mlm.MaskedLanguageModel"


@pytest.fixture(scope="module")
def mlm_export(prepared_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm_export")
    overrides = ("objective=mlm", "objective.pair_task=none", "trainer.max_steps=1")
    train(compose_config(cpu_run_overrides(prepared_corpus, root / "run", *overrides)))
    return export_checkpoint(root / "run" / "checkpoints" / "last.ckpt", root / "hf")


def test_the_export_records_its_objective(mlm_export):
    assert json.loads((mlm_export / "config.json").read_text())["pretrain_objective"] == MLM


def test_an_mlm_export_is_refused_in_one_line_naming_its_objective(mlm_export, capsys):
    assert main([str(mlm_export), "--text", "the python"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and MLM in lines[0] and "--allow-any-objective" in lines[0]


def test_a_bert_export_that_records_no_objective_is_refused(mlm_export, tmp_path, capsys):
    older = shutil.copytree(mlm_export, tmp_path / "older")  # an older export, or a published one
    config = json.loads((older / "config.json").read_text())
    del config["pretrain_objective"]
    (older / "config.json").write_text(json.dumps(config))
    assert main([str(older), "--text", "the python"]) == 2
    assert "records no objective" in capsys.readouterr().err


def test_allow_any_objective_generates_anyway(mlm_export, capsys):
    argv = [str(mlm_export), "--text", "the python", "--max-new-tokens", "3"]
    assert main([*argv, "--allow-any-objective"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("the python => ")
