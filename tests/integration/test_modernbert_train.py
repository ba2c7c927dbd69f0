"""ModernBERT through the real run: a short MLM run (30% masking, StableAdamW, wsd) trains,
exports to a directory that transformers loads as ModernBertForMaskedLM with our logits, and
initialises a new run (`init_from`); a resumed run trains what an uninterrupted one trains;
and its steps between log steps never wait for the device."""

import csv
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.export import export_checkpoint, read_checkpoint
from pretrain.runtime.run import initialise_from, prepare_run, train

transformers = pytest.importorskip("transformers")

MODERNBERT = (
    "model=modernbert_tiny",
    "model.local_attention=16",  # local layers differ from global ones at 64 tokens
    "objective=mlm",
    "objective.mlm_probability=0.3",
    "data=full_sentences",
    "data.document_masks=true",  # packed documents never attend to each other
    "data.num_workers=0",
)
RECIPE = ("optim=stable_adamw", "optim.warmup_steps=2", "trainer.gradient_clip_val=null")


def config(shards_dir: Path, run_dir: Path, *extra: str):
    return compose_config(cpu_run_overrides(shards_dir, run_dir, *MODERNBERT, *extra))


def test_trains_exports_loads_in_transformers_and_initialises_a_run(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    train(config(prepared_corpus, run_dir, *RECIPE, "trainer.max_steps=4"))
    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(
        out, attn_implementation="sdpa", output_loading_info=True
    )
    assert type(model).__name__ == "ModernBertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    texts = ["a long sentence " * 12, "a [MASK] short one."]  # 50 tokens and padding
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    _, task, _ = prepare_run(config(prepared_corpus, tmp_path / "ours", *RECIPE))
    module = task.objective  # the objective holds the encoder and heads, under our names
    state_dict, _ = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    module.load_state_dict(state_dict)
    module.eval()
    with torch.no_grad():
        ours = module.mlm_head(module.encoder(batch["input_ids"], None, batch["attention_mask"]))
        theirs = model.eval()(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert batch["input_ids"].shape[1] > 40 and not real.all()
    torch.testing.assert_close(theirs[real], ours[real], rtol=0, atol=1e-5)
    assert ours[real].std() > 0.1

    _, fresh, _ = prepare_run(
        config(prepared_corpus, tmp_path / "init", *RECIPE, f"init_from={out}")
    )
    initialise_from(fresh.objective, str(out))
    loaded = fresh.objective.state_dict()
    assert all(torch.equal(loaded[key], state_dict[key]) for key in state_dict)


def losses(run_dir: Path) -> dict[int, float]:
    """{step: train/loss} from every CSV log of the run directory."""
    found = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("train/loss"):
                    found[int(row["step"])] = float(row["train/loss"])
    return found


def test_a_resumed_run_trains_what_an_uninterrupted_one_trains(prepared_corpus, tmp_path):
    common = (*RECIPE, "optim.schedule_steps=6", "trainer.log_every_n_steps=1")
    whole = tmp_path / "whole"
    train(config(prepared_corpus, whole, *common, "trainer.max_steps=6"))
    parts = tmp_path / "parts"
    train(config(prepared_corpus, parts, *common, "trainer.max_steps=3"))
    train(config(prepared_corpus, parts, *common, "trainer.max_steps=6"))
    want, got = losses(whole), losses(parts)
    assert sorted(want) == sorted(got) == list(range(6))
    assert [got[s] for s in range(6)] == pytest.approx([want[s] for s in range(6)], abs=1e-5)
    assert want[5] < want[0]  # it learns
