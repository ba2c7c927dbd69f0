"""A ModernBERT export is the model the checkpoint trained: config.json's special-token ids
are the exported tokenizer's (not ModernBertConfig's 50281/50282), and a checkpoint saved in
the first phase of a context-extension schedule carries that phase's global RoPE theta, so
transformers gives the logits the run's model gave at that step."""

import json

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.export import export_checkpoint, read_checkpoint
from pretrain.runtime.run import prepare_run, train

transformers = pytest.importorskip("transformers")

PHASES = (
    "model=modernbert_tiny",
    "model.local_attention=16",
    "objective=mlm",
    "data=full_sentences",
    "data.num_workers=0",
    "optim=stable_adamw",
    "optim.warmup_steps=1",
    "trainer.gradient_clip_val=null",
    # a first phase at theta 10k far longer than the run, then the model's 160k
    "+objective.stages=[{until_tokens:1000000,global_rope_theta:10000},{}]",
)


def test_a_first_phase_checkpoint_exports_its_theta_and_the_tokenizers_ids(
    prepared_corpus, tmp_path
):
    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(prepared_corpus, run_dir, *PHASES, "trainer.max_steps=2")
    train(compose_config(overrides))
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    out = export_checkpoint(checkpoint, tmp_path / "hf")

    saved = json.loads((out / "config.json").read_text())
    assert saved["rope_parameters"]["full_attention"]["rope_theta"] == 10000.0
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert saved["cls_token_id"] == saved["bos_token_id"] == tokenizer.cls_token_id
    assert saved["sep_token_id"] == saved["eos_token_id"] == tokenizer.sep_token_id
    assert saved["pad_token_id"] == tokenizer.pad_token_id
    assert max(saved[f"{k}_token_id"] for k in ("cls", "sep", "bos", "eos")) < len(tokenizer)

    model = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="sdpa")
    batch = tokenizer(
        ["a long sentence " * 12, "a [MASK] short one."], return_tensors="pt", padding=True
    )
    _, task, _ = prepare_run(
        compose_config(cpu_run_overrides(prepared_corpus, tmp_path / "o", *PHASES))
    )
    module = task.objective
    module.load_state_dict(read_checkpoint(checkpoint)[0])
    module.eval()
    theta = torch.full((2,), 10000.0)  # what the rows of the first phase carry
    with torch.no_grad():
        hidden = module.encoder(
            batch["input_ids"], None, batch["attention_mask"], global_rope_theta=theta
        )
        ours = module.mlm_head(hidden)
        theirs = model.eval()(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert batch["input_ids"].shape[1] > 40  # global layers see positions theta changes
    torch.testing.assert_close(theirs[real], ours[real], rtol=0, atol=1e-5)
