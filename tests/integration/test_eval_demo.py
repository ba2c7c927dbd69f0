"""`make demo-eval`: the `make demo` model and a same-size random encoder fine-tuned on a
built-in task with the same recipe, side by side: the `make demo` export when there is one
(exports/demo-bert), else (a fresh clone, CI) the export of a tiny encoder, which exercises the
same path."""

import json
from pathlib import Path

import pytest

from pretrain.eval.demo import compare, table
from pretrain.paths import REPO_ROOT

pytest.importorskip("transformers")
DEMO_EXPORT = REPO_ROOT / "exports" / "demo-bert"
# 200 training and 100 dev examples, 3 epochs: about 20 s of CPU per encoder.
SMALL = ["eval.task.train_size=200", "eval.task.dev_size=100", "eval.epochs=3"]


@pytest.fixture
def demo_export(tiny_encoder_checkpoint: Path, tmp_path: Path) -> Path:
    if DEMO_EXPORT.is_dir():
        return DEMO_EXPORT
    from pretrain.export import export_checkpoint

    return export_checkpoint(tiny_encoder_checkpoint, tmp_path / "hf")


@pytest.mark.slow
def test_demo_model_and_random_encoder_side_by_side(demo_export, tmp_path):
    results = compare(
        "builtin_order", [f"encoder.path={demo_export}", f"out_dir={tmp_path}", *SMALL]
    )
    assert set(results) == {"pretrained", "random"}
    for init, result in results.items():
        written = json.loads((tmp_path / "eval" / f"builtin_order-{init}.json").read_text())
        assert written == result and written["init"] == init
        assert len(written["predictions"]) == 100
    # the two encoders are different models: their dev predictions differ
    assert results["pretrained"]["predictions"] != results["random"]["predictions"]
    scores = [results[i]["metrics"]["accuracy"] for i in ("pretrained", "random")]
    printed = table([("builtin_order", "accuracy", *scores)])
    assert printed.splitlines()[2].startswith(f"| builtin_order | accuracy | {scores[0]:.3f} |")
