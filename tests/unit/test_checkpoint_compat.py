"""`pretrain.checkpoint.compat`: every version's weight names map onto the objective's and the
task's, and an objective's `Losses` trains on its named loss only."""

import pytest
import torch

from pretrain.checkpoint.compat import objective_state_dict, task_state_dict
from pretrain.checkpoint.safety import OBJECTIVE_CLASSES, shipped_objective_classes
from pretrain.errors import ConfigError
from pretrain.objectives.base import Losses
from pretrain.objectives.configs import objective_schemas
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
    schemas = {schema._target_ for schema in objective_schemas().values()}
    assert shipped_objective_classes(tmp_path) == schemas | {"a.b.New"}


def test_a_zero_model_state_file_of_the_first_layout_is_read_under_the_tasks_names():
    from collections import OrderedDict

    from pretrain.checkpoint.compat import zero_state_with_task_names

    weight, bias = torch.zeros(4, 2), torch.zeros(4)
    first = {
        "module": {"encoder.dense.weight": weight, "nsp_head.bias": bias},
        "param_shapes": [OrderedDict([("encoder.dense.weight", (4, 2))]), {"nsp_head.bias": (4,)}],
        "shared_params": {"mlm_head.decoder.weight": "encoder.word_embeddings.weight"},
        "buffer_names": [],
    }
    state, renamed = zero_state_with_task_names(first)
    assert renamed
    assert list(state["module"]) == [
        "objective.encoder.dense.weight",
        "objective.sentence_head.bias",
    ]
    assert [list(group) for group in state["param_shapes"]] == [
        ["objective.encoder.dense.weight"],
        ["objective.sentence_head.bias"],
    ]
    assert state["shared_params"] == {
        "objective.mlm_head.decoder.weight": "objective.encoder.word_embeddings.weight"
    }
    shard = {"optimizer_state_dict": {"param_slice_mappings": [{"encoder.dense.weight": 0}]}}
    shard, renamed = zero_state_with_task_names(shard)
    assert renamed
    assert shard["optimizer_state_dict"]["param_slice_mappings"] == [
        {"objective.encoder.dense.weight": 0}
    ]
    today = {"module": {"objective.encoder.dense.weight": weight}, "param_shapes": [{}]}
    assert zero_state_with_task_names(today) == (today, False)


def test_a_first_layout_zero_directory_of_another_parameter_order_is_refused_in_one_line():
    from pretrain.runtime.strategies import check_parameter_order

    ours = [("objective.encoder.a", (4, 2)), ("objective.encoder.b", (4,))]
    check_parameter_order(
        "old.ckpt", [{"objective.encoder.a": (4, 2)}, {"objective.encoder.b": (4,)}], ours
    )
    swapped = [{"objective.encoder.b": (4,)}, {"objective.encoder.a": (4, 2)}]
    with pytest.raises(ConfigError) as refused:
        check_parameter_order("old.ckpt", swapped, ours)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("old.ckpt: a ZeRO checkpoint of an older version")
    assert "pretrain-export old.ckpt <dir>" in message and "init_from=<dir>" in message
