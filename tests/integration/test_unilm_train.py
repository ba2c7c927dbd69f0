"""UniLM end to end: a tiny run trains and resumes as an uninterrupted run; its checkpoint
exports as a BERT that `transformers` loads with our logits under each of the four
attention masks; `pretrain-generate` writes a seq2seq target from it, the same tokens as
greedy decoding of the exported model under the seq2seq mask, and from the exported
directory too."""

import shutil

import pytest
import torch
from test_train import step_losses, tiny_overrides

from pretrain.cli.generate import generate_text, load_for_generation, main
from pretrain.config import compose_config
from pretrain.data.lm_kinds import BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ
from pretrain.export import export_checkpoint
from pretrain.objectives.unilm import UniLM, unilm_attention_mask
from pretrain.runtime.run import train

transformers = pytest.importorskip("transformers")

COMMON = (
    "objective=unilm",
    "data=segment_pair",
    "trainer.max_steps=12",
    "trainer.checkpoint_every_n_steps=6",
    "trainer.log_every_n_steps=1",
    "trainer.keep_checkpoints=5",
)
SOURCE = "the python interpreter reads"


@pytest.fixture(scope="module")
def unilm_run(prepared_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("unilm") / "full"
    train(compose_config(tiny_overrides(prepared_corpus, run_dir, *COMMON)))
    return run_dir


@pytest.mark.slow
def test_a_resumed_run_trains_what_the_uninterrupted_run_trains(
    unilm_run, prepared_corpus, tmp_path
):
    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(
        unilm_run / "checkpoints" / "step-0000006.ckpt", resumed_dir / "checkpoints" / "last.ckpt"
    )
    train(compose_config(tiny_overrides(prepared_corpus, resumed_dir, *COMMON)))
    full, resumed = step_losses(unilm_run), step_losses(resumed_dir)
    assert sorted(resumed) == list(range(6, 12))
    for step in resumed:  # the same samples, kinds and masks, the same weights
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


def hf_masked_lm(unilm_run, tmp_path):
    out = export_checkpoint(unilm_run / "checkpoints" / "last.ckpt", tmp_path / "hf")
    hf, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"], info
    return hf.eval()


@pytest.mark.slow
def test_export_loads_in_transformers_with_our_logits_under_every_mask(unilm_run, tmp_path):
    module, tokenizer = load_for_generation(unilm_run / "checkpoints" / "last.ckpt")
    assert isinstance(module, UniLM)
    hf = hf_masked_lm(unilm_run, tmp_path)
    a = tokenizer.encode("the python interpreter", add_special_tokens=False).ids
    b = tokenizer.encode("reads the file and runs it", add_special_tokens=False).ids
    ids = torch.tensor([[module.vocab.cls, *a, module.vocab.sep, *b, module.vocab.sep, 0, 0]] * 4)
    types = torch.zeros_like(ids)
    types[:, len(a) + 2 : len(a) + len(b) + 3] = 1
    real = torch.ones_like(ids)
    real[:, -2:] = 0
    ids[:, -2:] = module.vocab.pad
    kinds = torch.tensor([BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ])
    mask = unilm_attention_mask(kinds, types, real)  # (4, seq, seq)
    with torch.no_grad():
        ours = module.mlm_head(module.encoder(ids, types, mask))
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask[:, None]).logits
        plain = hf(input_ids=ids, token_type_ids=types, attention_mask=real).logits
    keep = real.bool()
    torch.testing.assert_close(theirs[keep], ours[keep], rtol=0, atol=1e-5)
    torch.testing.assert_close(theirs[0][keep[0]], plain[0][keep[0]], rtol=0, atol=1e-5)
    assert (theirs[1] - theirs[0]).abs().max() > 1e-3  # the masks matter: not all one mask


@pytest.mark.slow
def test_pretrain_generate_writes_the_exported_models_greedy_seq2seq_target(
    unilm_run, tmp_path, capsys
):
    checkpoint = unilm_run / "checkpoints" / "last.ckpt"
    assert main([str(checkpoint), "--text", SOURCE, "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]  # (after any library's warning)
    assert printed.startswith(f"{SOURCE} => ")
    module, tokenizer = load_for_generation(checkpoint)
    text = generate_text(module, tokenizer, SOURCE, max_new_tokens=6)
    assert printed.strip() == f"{SOURCE} => {text}".strip()
    # the same decoding by hand with the exported model: append [MASK], take its argmax
    hf, vocab = hf_masked_lm(unilm_run, tmp_path), module.vocab
    source = [vocab.cls, *tokenizer.encode(SOURCE, add_special_tokens=False).ids, vocab.sep]
    sequence, banned = list(source), [vocab.pad, vocab.cls, vocab.mask, vocab.unk]
    for _ in range(6):
        ids = torch.tensor([[*sequence, vocab.mask]])
        types = (torch.arange(ids.shape[1]) >= len(source)).long()[None]
        mask = unilm_attention_mask(torch.tensor([SEQ2SEQ]), types, torch.ones_like(ids))
        with torch.no_grad():
            logits = hf(input_ids=ids, token_type_ids=types, attention_mask=mask[:, None]).logits
        logits[0, -1, banned] = float("-inf")
        sequence.append(int(logits[0, -1].argmax()))
        if sequence[-1] == vocab.sep:
            break
    generated = sequence[len(source) :]
    assert generated and text == tokenizer.decode(generated, skip_special_tokens=True)
    # and pretrain-generate on the exported directory (a BERT: UniLM's seq2seq generation)
    exported, exported_tokenizer = load_for_generation(tmp_path / "hf")
    assert isinstance(exported, UniLM)
    assert generate_text(exported, exported_tokenizer, SOURCE, max_new_tokens=6) == text
