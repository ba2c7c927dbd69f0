"""BART: export to `transformers.BartForConditionalGeneration` with parity (padding in encoder
and decoder inputs), a lossless round trip, the sinusoidal Transformer refused, and the demo
trained end to end, exported, and its reconstructions (greedy and beam) equal to HF's."""

from pathlib import Path

import pytest
import torch
from test_seq2seq import TINY, TRANSFORMER, assert_loss_falls, train_tiny
from transformers import AutoTokenizer, BartForConditionalGeneration

from pretrain.checkpoint.compat import objective_state_dict
from pretrain.export import ExportError, export_checkpoint, import_hf_model, read_hf_model
from pretrain.export.bart import from_hf, to_hf
from pretrain.export.hf import write_hf_model
from pretrain.models.seq2seq import EncoderDecoder, TiedLMHead
from pretrain.objectives.denoising import DenoisingAutoencoder

VOCAB = 60
BART_SHAPE = {
    "position_embedding": "learned",
    "activation": "gelu",
    "scale_embedding": False,
    "layernorm_embedding": True,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "layer_norm_eps": 1e-5,
    "init_std": 0.02,
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run_config(**shape) -> dict:
    model = {"name": "t", "_target_": "pretrain.models.seq2seq.EncoderDecoder", **TINY}
    model.update({**BART_SHAPE, **shape})
    return {"model": model, "model_runtime": {"vocab_size": VOCAB, "pad_token_id": 0}}


def random_state_dict(config: dict) -> dict[str, torch.Tensor]:
    """Our weights with every tensor perturbed (so LayerNorms and biases matter too)."""
    torch.manual_seed(0)
    kwargs = {k: v for k, v in config["model"].items() if k not in ("name", "_target_")}
    net = EncoderDecoder(vocab_size=VOCAB, pad_token_id=0, **kwargs)
    head = TiedLMHead(net.word_embeddings)
    with torch.no_grad():
        for parameter in [*net.parameters(), head.bias]:
            parameter.add_(0.05 * torch.randn_like(parameter))
    state = {f"encoder.{k}": v for k, v in net.state_dict().items()}
    return state | {f"lm_head.{k}": v for k, v in head.state_dict().items()}


def our_logits(config, state, ids, mask, decoder_ids, decoder_mask) -> torch.Tensor:
    kwargs = {k: v for k, v in config["model"].items() if k not in ("name", "_target_")}
    net = EncoderDecoder(vocab_size=VOCAB, pad_token_id=0, **kwargs).eval()
    head = TiedLMHead(net.word_embeddings)
    net.load_state_dict({k[8:]: v for k, v in state.items() if k.startswith("encoder.")})
    head.bias.data.copy_(state["lm_head.bias"])
    with torch.no_grad():
        return head(net(ids, mask, decoder_ids, decoder_mask))


def padded_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    ids, decoder_ids = torch.randint(5, VOCAB, (3, 12)), torch.randint(5, VOCAB, (3, 10))
    mask, decoder_mask = torch.ones_like(ids), torch.ones_like(decoder_ids)
    mask[1, 8:], mask[2, 5:], decoder_mask[0, 6:], decoder_mask[2, 3:] = 0, 0, 0, 0
    return ids * mask, mask, decoder_ids * decoder_mask, decoder_mask


def test_bart_export_matches_transformers_with_padding(tmp_path):
    config = run_config()
    state = random_state_dict(config)
    write_hf_model(to_hf(state, config), tmp_path, None)
    reference = BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    ids, mask, decoder_ids, decoder_mask = padded_inputs()
    with torch.no_grad():
        theirs = reference(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=decoder_ids,
            decoder_attention_mask=decoder_mask,
        ).logits
    ours = our_logits(config, state, ids, mask, decoder_ids, decoder_mask)
    real = decoder_mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)
    assert reference.lm_head.weight.data_ptr() == reference.model.shared.weight.data_ptr()


def test_round_trip_is_lossless(tmp_path):
    config = run_config()
    first = to_hf(random_state_dict(config), config)
    write_hf_model(first, tmp_path, None)
    model_cfg, state = import_hf_model(tmp_path)
    assert model_cfg["_target_"] == "pretrain.models.seq2seq.EncoderDecoder"
    second = to_hf(state, {"model": model_cfg, "model_runtime": config["model_runtime"]})
    assert second.config == first.config
    assert second.weights.keys() == first.weights.keys()
    for name, tensor in first.weights.items():
        assert torch.equal(second.weights[name], tensor), name
    assert from_hf(read_hf_model(tmp_path))[0] == model_cfg


def test_sinusoidal_transformer_is_refused_with_a_clear_error():
    config = run_config(**TRANSFORMER)
    with pytest.raises(ExportError, match="model.position_embedding"):
        to_hf(random_state_dict(config), config)


def test_unknown_weights_are_refused():
    config = run_config()
    state = random_state_dict(config) | {"encoder.extra.weight": torch.zeros(2)}
    with pytest.raises(ValueError, match="encoder.extra.weight"):
        to_hf(state, config)


@pytest.mark.slow
def test_bart_demo_trains_exports_and_reconstructs_like_transformers(prepared_corpus, tmp_path):
    run_dir = tmp_path / "bart"
    train_tiny(prepared_corpus, run_dir, "experiment=bart_demo", "objective.document_rotation=0.5")
    assert_loss_falls(run_dir)
    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    reference = BartForConditionalGeneration.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.mask_token == "[MASK]" and tokenizer.pad_token == "[PAD]"

    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    from pretrain.data.vocab import load_vocabulary

    vocab = load_vocabulary(Path(prepared_corpus) / "tokenizer")
    module = DenoisingAutoencoder(checkpoint["config"], vocab).eval()
    module.load_state_dict(objective_state_dict(checkpoint["state_dict"]))
    batch = noised_batch(module, checkpoint["config"], vocab)
    with torch.no_grad():
        ours = module.lm_head(
            module.encoder(
                batch["input_ids"],
                batch["attention_mask"],
                batch["decoder_input_ids"],
                batch["decoder_attention_mask"],
            )
        )
        theirs = reference(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
            decoder_attention_mask=batch["decoder_attention_mask"],
        ).logits
    real = batch["decoder_attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)

    source, source_mask = batch["input_ids"][:2], batch["attention_mask"][:2]
    for beams in (1, 3):
        mine = module.reconstruct(source, source_mask, num_beams=beams, max_new_tokens=12)
        hf = reference.generate(
            input_ids=source,
            attention_mask=source_mask,
            num_beams=beams,
            do_sample=False,
            max_new_tokens=12,
            forced_eos_token_id=None,
            forced_bos_token_id=None,
            early_stopping=True,
            length_penalty=1.0,
            no_repeat_ngram_size=0,
        )
        assert hf[0, 0] == vocab.sep  # the decoder starts from [SEP]
        width = min(mine.shape[1], hf.shape[1] - 1)
        assert width >= 1
        assert torch.equal(mine[:, :width], hf[:, 1 : 1 + width]), (beams, mine, hf)


def noised_batch(module, config, vocab) -> dict[str, torch.Tensor]:
    """One corrupted training batch of the run's own stream."""
    from dataclasses import replace

    from pretrain.config import run_config
    from pretrain.data.reading import stream_spec
    from pretrain.data.stream import EpochStream

    spec = stream_spec(
        run_config(config),
        shard_paths=tuple(sorted(str(p) for p in Path(config["data"]["shards_dir"]).glob("*.tar"))),
        shard_tokens=(),
        stream_partitions=64,
        vocab=vocab,
        corruption=module.build_corruption(config, vocab),
    )
    spec = replace(
        spec, format="full_sentences", max_seq_length=64, batch_size=4, shuffle_buffer_documents=10
    )
    return next(iter(EpochStream(spec, epoch=0)))
