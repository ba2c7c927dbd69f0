"""One table from many evaluation results (a sweep over checkpoints or runs)."""

import json

from pretrain.eval.results import result_files, results_table


def write_result(path, task, metrics, init="pretrained"):
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "task": task,
        "encoder": "e",
        "init": init,
        "settings": {"mode": "finetune"},
        "metrics": metrics,
    }
    path.write_text(json.dumps(result))


def test_table_has_one_row_per_result_and_a_column_per_metric(tmp_path):
    write_result(tmp_path / "runs/a/eval/builtin_next.json", "builtin_next", {"accuracy": 0.61234})
    write_result(
        tmp_path / "runs/b/eval/builtin_next.json", "builtin_next", {"accuracy": 0.5}, "random"
    )
    write_result(tmp_path / "runs/b/eval/qa.json", "builtin_qa", {"exact_match": 12.0, "f1": 30.5})
    (tmp_path / "runs/b/other.json").write_text("{}")  # not in an eval/ folder: not a result
    files = result_files([tmp_path / "runs"])
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "runs/a/eval/builtin_next.json",
        "runs/b/eval/builtin_next.json",
        "runs/b/eval/qa.json",
    ]
    lines = results_table(files).splitlines()
    assert lines[0] == "| result | task | encoder | init | mode | accuracy | exact_match | f1 |"
    assert lines[2] == "| builtin_next | builtin_next | e | pretrained | finetune | 0.6123 |  |  |"
    assert lines[4] == "| qa | builtin_qa | e | pretrained | finetune |  | 12 | 30.5 |"
