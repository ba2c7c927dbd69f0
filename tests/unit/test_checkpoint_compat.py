"""`pretrain.checkpoint.compat`: every version's weight names map onto the objective's and the
task's, and an objective's `Losses` trains on its named loss only."""

import pytest
import torch

from pretrain.checkpoint.compat import objective_state_dict, task_state_dict
from pretrain.checkpoint.safety import OBJECTIVE_CLASSES, shipped_objective_classes
from pretrain.objectives.base import Losses
from pretrain.objectives.configs import OBJECTIVE_SCHEMAS
from pretrain.paths import CONF_DIR

W = torch.zeros(1)


def test_old_and_new_names_map_onto_the_objectives_and_the_tasks():
    old = {"encoder.a": W, "mlm_head.b": W, "nsp_head.classifier.weight": W}
    new = {"objective.encoder.a": W, "objective.mlm_head.b": W}
    new["objective.sentence_head.classifier.weight"] = W
    wanted = {"encoder.a", "mlm_head.b", "sentence_head.classifier.weight"}
    assert set(objective_state_dict(old)) == set(objective_state_dict(new)) == wanted
    assert set(task_state_dict(old)) == set(task_state_dict(new)) == set(new)
    assert task_state_dict(task_state_dict(old)).keys() == new.keys()  # idempotent
    assert objective_state_dict(old)["encoder.a"] is W  # the tensors themselves, not copies


def test_losses_trains_on_its_loss_and_reads_as_the_logged_scalars():
    loss, diagnostic = torch.tensor(2.0), torch.tensor(5.0)
    losses = Losses(loss, {"mlm_loss": loss, "probe_loss": diagnostic})
    assert losses.loss is loss  # a metric named *_loss never enters the gradient
    assert list(losses) == ["mlm_loss", "probe_loss", "loss"]
    assert losses["loss"] is loss and dict(losses)["probe_loss"] is diagnostic
    with pytest.raises(ValueError, match="Losses.loss"):
        Losses(loss, {"loss": loss})


def test_every_shipped_objective_is_allowed_in_a_stored_config(tmp_path):
    assert OBJECTIVE_CLASSES == shipped_objective_classes(CONF_DIR)
    assert "pretrain.objectives.span.SpanBert" in OBJECTIVE_CLASSES
    (tmp_path / "objective").mkdir()
    (tmp_path / "objective" / "new.yaml").write_text("# New.\nname: new\n_target_: a.b.New\n")
    schemas = {schema._target_ for schema in OBJECTIVE_SCHEMAS.values()}
    assert shipped_objective_classes(tmp_path) == schemas | {"a.b.New"}
