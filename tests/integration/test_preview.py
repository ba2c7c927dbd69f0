"""`pretrain-data preview`: what the model will see, as text and as JSON arrays."""

import json
import subprocess
import sys
from pathlib import Path

from pretrain.data.masking import IGNORE_INDEX

PRETRAIN_DATA = str(Path(sys.executable).parent / "pretrain-data")


def run_preview(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PRETRAIN_DATA, "preview", *args], capture_output=True, text=True, timeout=600
    )


def test_preview_json_has_the_raw_arrays(prepared_corpus):
    result = run_preview(
        f"data.shards_dir={prepared_corpus}", "data.max_seq_length=64", "n=5", "--format", "json"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(result.stdout)
    assert len(records) == 5
    for r in records:
        n = len(r["input_ids"])
        assert (
            n <= 64
            and len(r["labels"]) == len(r["token_type_ids"]) == len(r["attention_mask"]) == n
        )
        assert r["next_sentence_label"] in (0, 1)
        assert r["key"] and set(r["token_type_ids"]) == {0, 1}
        predicted = [i for i, label in enumerate(r["labels"]) if label != IGNORE_INDEX]
        assert predicted and len(predicted) < 0.3 * n
    assert len({r["key"] for r in records}) == 5


def test_preview_text_marks_predicted_positions(prepared_corpus):
    result = run_preview(
        f"data.shards_dir={prepared_corpus}", "data=full_sentences", "objective=mlm", "n=3"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("[batch 0]") == 3
    assert (
        "<[MASK]|" in result.stdout
        and "[CLS]" in result.stdout
        and "single segment" in result.stdout
    )


def test_preview_shows_each_objectives_corruption(prepared_corpus):
    result = run_preview(
        f"data.shards_dir={prepared_corpus}", "objective=structbert", "n=12", "--format=json"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(result.stdout)
    assert {r["next_sentence_label"] for r in records} <= {0, 1, 2}
    assert any(label != IGNORE_INDEX for r in records for label in r["shuffle_labels"])
    text = run_preview(f"data.shards_dir={prepared_corpus}", "objective=sop", "n=6")
    assert "A and B swapped" in text.stdout or "A and B in order" in text.stdout
