"""`make demo-eval`: the `make demo` model and a same-size random encoder fine-tuned on a
built-in task with the same recipe, side by side: the `make demo` export when there is one
(exports/demo-bert), else (a fresh clone, CI) the export of a tiny encoder, which exercises the
same path."""

import json
from pathlib import Path

import pytest

from pretrain.eval.demo import RECIPES, compare, main, table
from pretrain.paths import REPO_ROOT

pytest.importorskip("transformers")
DEMO_EXPORT = REPO_ROOT / "exports" / "demo-bert"
# 200 training and 100 dev examples, 3 epochs: about 20 s of CPU per encoder fine-tuned.
SMALL = ["eval.task.train_size=200", "eval.task.dev_size=100", "eval.epochs=3"]


@pytest.fixture
def demo_export(tiny_encoder_checkpoint: Path, tmp_path: Path) -> Path:
    if DEMO_EXPORT.is_dir():
        return DEMO_EXPORT
    from pretrain.export import export_checkpoint

    return export_checkpoint(tiny_encoder_checkpoint, tmp_path / "hf")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["finetune", "probe"])
def test_demo_model_and_random_encoder_side_by_side(demo_export, tmp_path, mode):
    results = compare(
        "builtin_order",
        [f"encoder.path={demo_export}", f"out_dir={tmp_path}", *SMALL],
        mode=mode,
        seed=1,
    )
    assert set(results) == {"pretrained", "random"}
    for init, result in results.items():
        written = json.loads(
            (tmp_path / "eval" / f"builtin_order-{mode}-{init}-seed1.json").read_text()
        )
        assert written == result and written["init"] == init
        assert len(written["predictions"]) == 100
        # the same recipe for both inits: the mode's, the seed given, which also draws the
        # task's examples
        assert written["settings"]["mode"] == RECIPES[mode][0].split("=")[1]
        assert written["settings"]["pooling"] == "mean" and written["settings"]["seed"] == 1
        assert written["settings"]["task"]["seed"] == 1
    # the two encoders are different models: their dev predictions differ
    assert results["pretrained"]["predictions"] != results["random"]["predictions"]
    scores = [[results[i]["metrics"]["accuracy"]] for i in ("pretrained", "random")]
    printed = table([("builtin_order", "accuracy", mode, *scores)])
    assert printed.splitlines()[2].startswith(
        f"| builtin_order | accuracy | {mode} | {scores[0][0]:.3f} ± 0.000 |"
    )


def test_a_refused_setting_is_one_line_not_a_traceback(demo_export, tmp_path, capsys):
    argv = ["--tasks", "builtin_order", "--modes", "probe", "--seeds", "0"]
    argv += [f"encoder.path={demo_export}", f"out_dir={tmp_path}", "eval.pooling=max"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("pretrain.eval.demo: error: eval.pooling = 'max': must be one of")
    assert not any(line.startswith("Traceback") for line in error)
