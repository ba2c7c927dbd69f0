"""An objective is added as its own files only: its module, its torch-free schema beside it
and its yaml. Here a toy one (MLM whose loss is scaled by a setting of its own) is written to
a temporary directory that joins the `pretrain.objectives` package (as if its two files sat
in src/pretrain/objectives/) and a config directory on Hydra's search path (as if its yaml
sat in conf/objective/); nothing of the project is edited, and it composes, validates its own
key, and trains."""

import csv
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cpu_run_overrides

from pretrain import objectives
from pretrain.config import ConfigError, compose_config, register_schemas, validate
from pretrain.objectives.configs import objective_schemas
from pretrain.runtime.run import train

pytestmark = pytest.mark.usefixtures("one_thread")

FILES = {
    "objectives/toy_mlm_config.py": '''
        """The toy objective's settings: MLM's, and a scale of its loss."""

        from dataclasses import dataclass

        from pretrain.errors import require
        from pretrain.objectives.configs import objective_schema
        from pretrain.objectives.mlm_config import MaskedLMConfig


        @objective_schema
        @dataclass
        class ToyMaskedLMConfig(MaskedLMConfig):
            name: str = "toy_mlm"
            _target_: str = "pretrain.objectives.toy_mlm.ToyMaskedLM"
            pair_task: str = "none"
            loss_scale: float = 1.0

            def __post_init__(self) -> None:
                super().__post_init__()
                require(self.loss_scale > 0, "objective.loss_scale", self.loss_scale, "must be > 0")
        ''',
    "objectives/toy_mlm.py": '''
        """A toy objective: MLM whose training loss is `objective.loss_scale` times MLM's."""

        from pretrain.objectives.base import Losses
        from pretrain.objectives.mlm import MaskedLanguageModel
        from pretrain.objectives.toy_mlm_config import ToyMaskedLMConfig


        class ToyMaskedLM(MaskedLanguageModel):
            config_class = ToyMaskedLMConfig

            def forward(self, batch: dict) -> Losses:
                losses = super().forward(batch)
                scaled = losses.loss * self.run.objective.loss_scale
                return Losses(scaled, {**losses.metrics, "toy_loss": scaled})
        ''',
    "conf/objective/toy_mlm.yaml": """
        defaults:
          - /schema/objective/toy_mlm@_here_
          - _self_
        loss_scale: 0.5
        """,
}


@pytest.fixture
def toy_objective(tmp_path: Path, monkeypatch) -> str:
    """Write FILES under `tmp_path`, add its `objectives/` to the package's directories and
    register the schemas again (as at import); returns the Hydra search-path override."""
    for name, text in FILES.items():
        path = tmp_path / "toy" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.setattr(
        objectives, "__path__", [*objectives.__path__, str(tmp_path / "toy" / "objectives")]
    )
    register_schemas()
    yield f"hydra.searchpath=[file://{tmp_path / 'toy' / 'conf'}]"
    for module in ("pretrain.objectives.toy_mlm", "pretrain.objectives.toy_mlm_config"):
        sys.modules.pop(module, None)


def test_fixture_objective_needs_no_other_file(toy_objective, prepared_corpus, tmp_path):
    assert "toy_mlm" in objective_schemas()
    searchpath = toy_objective
    config = validate(compose_config([searchpath, "objective=toy_mlm", "data=full_sentences"]))
    assert (config.objective.name, config.objective.loss_scale) == ("toy_mlm", 0.5)
    with pytest.raises(ConfigError, match=r"^objective\.loss_scale"):
        validate(compose_config([searchpath, "objective=toy_mlm", "objective.loss_scale=0"]))
    with pytest.raises(ConfigError, match=r"objective\.not_a_key"):
        validate(compose_config([searchpath, "objective=toy_mlm", "+objective.not_a_key=1"]))

    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(
        prepared_corpus,
        run_dir,
        searchpath,
        "objective=toy_mlm",
        "data=full_sentences",
        "resume=never",
        "data.num_workers=0",
        "trainer.max_steps=3",
        "trainer.log_every_n_steps=1",
        batch_size=4,
    )
    train(compose_config(overrides))
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/toy_loss")]
    assert len(rows) == 3
    for row in rows:  # the module read its schema's own setting from its yaml
        assert float(row["train/toy_loss"]) == pytest.approx(0.5 * float(row["train/mlm_loss"]))
