"""How a run ended, as people and reports read it: run_state.json written and read back as
data, the report's wording, pretrain-eval's warning for an unfinished run's checkpoint, the
progress lines printed with the progress bar off, and the parameter table without FLOPs."""

import logging

import pytest
import torch

from pretrain.eval.encoder import unfinished_run_warning
from pretrain.runtime.run_state import (
    RUN_STATE_FILE,
    describe_run_state,
    read_run_state,
    write_run_state,
)
from pretrain.runtime.trainer import ParameterSummary, format_duration, step_line


def test_run_state_round_trips_and_is_described(tmp_path):
    write_run_state(tmp_path, "preempted", 246, 1000)
    record = read_run_state(tmp_path)
    assert record == {"state": "preempted", "step": 246, "max_steps": 1000}
    assert describe_run_state(record) == "preempted (step 246 of 1000)"
    write_run_state(tmp_path, "running", 0, 1000)  # a launch killed outright leaves this
    assert describe_run_state(read_run_state(tmp_path)) == "running or killed (step 0 of 1000)"
    write_run_state(tmp_path, "finished", 1000, 1000)
    assert describe_run_state(read_run_state(tmp_path)) == "finished"
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(ValueError, match="must be one of"):
        write_run_state(tmp_path, "done", 1, 1)


@pytest.mark.parametrize(
    "content",
    ['{"state": "finished", "step": "1000", "max_steps": 1000}', '{"state": "won"}', "[1]", "{"],
)
def test_a_run_state_that_is_not_a_valid_record_is_not_trusted(tmp_path, content):
    (tmp_path / RUN_STATE_FILE).write_text(content)
    assert read_run_state(tmp_path) is None
    # without a record, the logged step against the config's max_steps
    assert describe_run_state(None, 40, 100) == "unfinished (step 40 of 100)"
    assert describe_run_state(None, 100, 100) == "finished"
    assert describe_run_state(None, None, 100) == "unknown"


def checkpoint(path, step: int, max_steps: int):
    torch.save({"global_step": step, "config": {"trainer": {"max_steps": max_steps}}}, path)
    return path


def test_eval_warns_in_one_line_for_an_unfinished_runs_checkpoint(tmp_path):
    warning = unfinished_run_warning(checkpoint(tmp_path / "last.ckpt", 246, 1000))
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"warning: {tmp_path / 'last.ckpt'} is from an unfinished run")
    assert "(step 246 of 1000)" in warning
    assert unfinished_run_warning(checkpoint(tmp_path / "done.ckpt", 1000, 1000)) is None
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    assert unfinished_run_warning(tmp_path / "bad.ckpt") is None  # the export names it


def test_progress_lines_say_step_loss_rate_and_eta():
    assert format_duration(12.4) == "12s"
    assert format_duration(259) == "4m19s"
    assert format_duration(3720) == "1h02m"
    line = step_line(120, 1000, torch.tensor(6.213), 3.4)
    assert line == "step 120/1000 (12%), loss 6.2130, 3.40 steps/s, ETA 4m19s"
    assert step_line(5, 10, None, 0.0) == "step 5/10 (50%), 0.00 steps/s, ETA ?"


def test_parameter_table_has_no_flops(caplog):
    data = [
        (" ", ["0"]),
        ("Name", ["encoder"]),
        ("Type", ["BertEncoder"]),
        ("Params", ["1.2 K"]),
        ("Mode", ["train"]),
        ("FLOPs", ["0"]),
    ]
    with caplog.at_level(logging.INFO):
        ParameterSummary.summarize(data, 1200, 1200, 0.0048, {"train": 1, "eval": 0}, total_flops=0)
    table = caplog.text
    assert "Total params" in table and "BertEncoder" in table
    assert "FLOPs" not in table and "Flops" not in table
