"""A checkpoint written when the objective was itself the LightningModule (tests/data/
legacy_run, weights under `encoder.*`, `mlm_head.*`, `sentence_head.*`) still resumes, exports
and initialises a run, with the numbers that code gave (its `reference.json`)."""

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from pretrain.checkpoint.compat import task_state_dict
from pretrain.checkpoint.safety import load_weights_only
from pretrain.config import compose_config
from pretrain.data.vocab import load_vocabulary
from pretrain.export.hf import export_checkpoint
from pretrain.runtime.run import initialise_from, train
from pretrain.runtime.task import PretrainingTask

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parents[1] / "data" / "legacy_run"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())
# the overrides the fixture was trained with (see its README), less the paths and the length
OVERRIDES = (
    "logger=csv",
    "trainer=cpu",
    "model=bert_tiny",
    "model.hidden_size=16",
    "model.num_hidden_layers=1",
    "model.num_attention_heads=2",
    "model.intermediate_size=32",
    "model.max_position_embeddings=32",
    "objective=mlm_nsp",
    "data=segment_pair",
    "data.max_seq_length=32",
    "data.batch_size=4",
    "data.shuffle_buffer_documents=20",
    "trainer.enable_progress_bar=false",
    "data.holdout_shards=0",
    "optim.schedule_steps=8",
    "optim.warmup_steps=1",
    "optim.optimizer.lr=1e-2",
    "trainer.log_every_n_steps=1",
)


@pytest.fixture
def legacy_checkpoint(tmp_path: Path) -> Path:
    """A copy of the fixture's checkpoint whose config names the fixture's corpus copied
    under `tmp_path` (the run moved; nothing else of the checkpoint changes)."""
    shards = shutil.copytree(FIXTURE / "shards", tmp_path / "shards")
    checkpoint = load_weights_only(FIXTURE / "last.ckpt", map_location="cpu")
    checkpoint["config"]["data"]["shards_dir"] = str(shards)
    checkpoint["config"]["data"]["tokenizer_dir"] = str(shards / "tokenizer")
    path = tmp_path / "legacy" / "last.ckpt"
    path.parent.mkdir()
    torch.save(checkpoint, path)
    return path


def test_the_fixture_is_under_the_old_names_and_maps_onto_the_task(legacy_checkpoint):
    checkpoint = load_weights_only(legacy_checkpoint, map_location="cpu")
    names = {key.split(".")[0] for key in checkpoint["state_dict"]}
    assert names == {"encoder", "mlm_head", "sentence_head"}
    vocab = load_vocabulary(Path(checkpoint["config"]["data"]["tokenizer_dir"]))
    task = PretrainingTask.from_config(checkpoint["config"], vocab)
    task.load_state_dict(task_state_dict(checkpoint["state_dict"]), strict=True)
    assert torch.equal(
        task.objective.encoder.word_embeddings.weight,
        checkpoint["state_dict"]["encoder.embeddings.word_embeddings.weight"],
    )


def test_a_legacy_checkpoint_resumes_with_the_losses_the_old_code_gave(legacy_checkpoint):
    shards = legacy_checkpoint.parents[1] / "shards"
    run_dir = legacy_checkpoint.parents[1] / "resumed"
    overrides = [
        *OVERRIDES,
        f"data.shards_dir={shards}",
        f"run_dir={run_dir}",
        f"resume={legacy_checkpoint}",
        "trainer.max_steps=4",
    ]
    train(compose_config(overrides))
    rows = [
        row
        for path in sorted((run_dir / "csv").rglob("metrics.csv"))
        for row in csv.DictReader(path.open())
        if row.get("train/loss")
    ]
    resumed = {int(row["step"]): float(row["train/loss"]) for row in rows}
    assert sorted(resumed) == [2, 3]  # the steps after the checkpoint's
    for step, loss in resumed.items():
        assert loss == pytest.approx(REFERENCE["resumed_losses"][str(step)], rel=1e-6), step


def test_a_legacy_checkpoint_exports_the_same_hugging_face_model(legacy_checkpoint, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = export_checkpoint(legacy_checkpoint, tmp_path / "export")
    model = transformers.AutoModelForPreTraining.from_pretrained(out).eval()
    ids = torch.tensor(REFERENCE["input_ids"])
    types = torch.tensor([[0] * 6 + [1] * (ids.shape[1] - 6)])
    with torch.no_grad():
        outputs = model(input_ids=ids, token_type_ids=types)
    first = outputs.prediction_logits[0, 1, :8]
    assert torch.allclose(first, torch.tensor(REFERENCE["prediction_logits_first"]), atol=1e-6)
    total = float(outputs.prediction_logits.double().sum())
    assert total == pytest.approx(REFERENCE["prediction_logits_sum"], rel=1e-6)
    sentence = torch.tensor(REFERENCE["seq_relationship_logits"])
    assert torch.allclose(outputs.seq_relationship_logits, sentence, atol=1e-6)


def test_a_legacy_checkpoint_initialises_a_new_run(legacy_checkpoint):
    checkpoint = load_weights_only(legacy_checkpoint, map_location="cpu")
    config = checkpoint["config"]
    vocab = load_vocabulary(Path(config["data"]["tokenizer_dir"]))
    torch.manual_seed(1)  # other initial weights than the checkpoint's
    task = PretrainingTask.from_config(config, vocab)
    initialise_from(task.objective, str(legacy_checkpoint))
    ours = task.objective.state_dict()
    for key, saved in checkpoint["state_dict"].items():
        assert torch.equal(ours[key], saved), key
