"""XLNet's input formats (xlnet_pair, xlnet_memory), its corruption, the memory carried across
training steps (detached, reset at document boundaries) and an end-to-end demo run."""

import csv

import numpy as np
import pytest
import torch

from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.stream import EpochStream
from pretrain.data.vocab import Vocabulary
from pretrain.data.xlnet_formats import make_xlnet_pairs, memory_sequences
from pretrain.objectives.xlnet import PermutationCorruption, PermutationLanguageModel
from pretrain.runtime.run import build_stream

VOCAB = Vocabulary(size=200, pad=0, unk=1, cls=2, sep=3, mask=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _document(key: str, n: int, start: int = 10, sentence: int = 7) -> dict:
    ids = (np.arange(n) % 150 + start).astype(np.int32)
    sents = np.r_[np.arange(sentence, n, sentence), n].astype(np.int64)
    return {"key": key, "ids": ids, "sents": np.unique(sents), "words": np.ones(n, bool)}


def test_xlnet_pair_layout():
    documents = [_document(f"d{i}", 60 + 13 * i, start=10 + i) for i in range(8)]
    sequences = list(make_xlnet_pairs(documents, 32, VOCAB, seed=1, epoch=0))
    assert sequences
    for s in sequences:
        ids, types = s["input_ids"], s["token_type_ids"]
        assert len(ids) <= 32 and ids[-1] == VOCAB.cls and ids[-2] == VOCAB.sep
        assert (ids == VOCAB.cls).sum() == 1 and (ids == VOCAB.sep).sum() == 2
        first_sep = int(np.flatnonzero(ids == VOCAB.sep)[0])
        assert (types[: first_sep + 1] == 0).all()  # A and its [SEP]
        assert (types[first_sep + 1 : -1] == 1).all()  # B and its [SEP]
        assert types[-1] == 2  # [CLS] at the end has its own segment
        assert s["next_sentence_label"] == IGNORE_INDEX  # no NSP


def test_memory_sequences_continue_each_document():
    """A slot's segment t + 1 starts reuse_len tokens after segment t in the same document,
    the reuse part being the document's text there; a segment that starts a document (offset
    0, the next document in order) is flagged new_document."""
    documents = [_document(f"d{i}", n, start=10 + i) for i, n in enumerate([90, 40, 130, 25, 70])]
    by_key = {d["key"]: d for d in documents}
    reuse, length = 16, 40
    segments = list(memory_sequences(documents, reuse, length, VOCAB, seed=0, epoch=0))
    previous, order = None, []
    for s in segments:
        document, offset = s["key"].split("@")
        offset = int(offset)
        ids = s["input_ids"]
        assert len(ids) <= length and ids[-1] == VOCAB.cls
        n_reuse = min(reuse, len(by_key[document]["ids"]) - offset - 2)
        np.testing.assert_array_equal(
            ids[:n_reuse], by_key[document]["ids"][offset : offset + n_reuse]
        )
        if s["new_document"]:
            assert offset == 0
            order.append(document)
        else:
            assert previous == (document, offset - reuse)
        previous = (document, offset)
    assert order == list(by_key)  # every document, in order


def test_corruption_targets_and_masks():
    corruption = PermutationCorruption(seed=3, special_ids=(0, 1, 2, 3, 4))
    ids = np.random.default_rng(0).integers(5, 200, (6, 40))
    ids[:, -2:] = [3, 2]
    attention = np.ones_like(ids)
    attention[0, 30:] = 0
    ids[0, 30:] = 0
    batch = {
        "input_ids": ids.copy(),
        "attention_mask": attention,
        "keys": [f"k{i}" for i in range(6)],
    }
    out = corruption(batch, epoch=0)
    np.testing.assert_array_equal(out["input_ids"], ids)  # XLNet does not corrupt the input
    targets = out["labels"] != IGNORE_INDEX
    assert targets.sum(1).tolist() == [5] + [6] * 5  # round(28 / 6), round(38 / 6)
    assert not targets[:, -2:].any() and not targets[0, 30:].any()
    mapped = out["target_mapping"].argmax(2)[out["target_labels"] != IGNORE_INDEX]
    assert sorted(mapped.tolist()) == sorted(np.nonzero(targets)[1].tolist())
    assert out["perm_mask"].shape == (6, 40, 40)


def _module(memory: bool) -> PermutationLanguageModel:
    config = {
        "seed": 0,
        "model": {
            "name": "t",
            "_target_": "pretrain.models.xlnet.XLNetEncoder",
            "d_model": 32,
            "n_layer": 2,
            "n_head": 2,
            "d_inner": 64,
            "mem_len": 8,
            "reuse_len": 8,
            "dropout": 0.0,
        },  # fmt: skip
        "objective": {"name": "xlnet"},
        "data": {"format": "xlnet_memory", "stream_partitions": None}
        if memory
        else {"format": "xlnet_pair"},
        "trainer": {"nonfinite": "skip"},
    }
    return PermutationLanguageModel(config, VOCAB)


def _batch(seed: int, new_document: list[bool]) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 200, (2, 16))
    batch = {
        "input_ids": ids,
        "token_type_ids": np.zeros_like(ids),
        "attention_mask": np.ones_like(ids),
        "keys": [f"s{seed}-{i}" for i in range(2)],
    }
    batch = PermutationCorruption(seed=0, special_ids=VOCAB.special_ids)(batch, 0)
    batch = {k: (v if k == "keys" else torch.from_numpy(v)) for k, v in batch.items()}
    batch["new_document"] = torch.tensor(new_document)
    return batch


def test_memory_is_carried_detached_and_reset():
    module = _module(memory=True)
    inputs = []  # hidden states entering each layer, per step
    hooks = [
        layer.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
        for layer in module.encoder.layer
    ]
    first = module(_batch(1, [True, True]))
    assert first["loss"].requires_grad
    mems = module._mems[0]  # the first micro-batch's (no accumulation: the only one)
    assert len(mems) == 2
    for layer, mem in enumerate(mems):
        assert not mem.requires_grad and mem.grad_fn is None
        torch.testing.assert_close(mem, inputs[layer][:, :8].detach())  # the reused 8 tokens
    seen = {}
    original = module.encoder.forward

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    module.encoder.forward = spy
    first["loss"].backward()  # frees step 1's graph: step 2 must not reach into it
    second = module(_batch(2, [False, True]))
    second["loss"].backward()
    for carried, mem in zip(seen["mems"], mems, strict=True):
        assert carried is mem
    assert seen["mems_mask"][0].all() and not seen["mems_mask"][1].any()  # slot 1 reset
    for hook in hooks:
        hook.remove()


def test_without_memory_format_no_memory_is_kept():
    module = _module(memory=False)
    module(_batch(1, [True, True]))
    assert module._mems == {}


def test_xlnet_pair_through_the_stream(prepared_corpus):
    overrides = [
        "experiment=xlnet_demo", f"data.shards_dir={prepared_corpus}", "data.format=xlnet_pair",
    ]  # fmt: skip
    _, spec, _ = build_stream(compose_config(overrides))
    batch = next(iter(EpochStream(spec, 0)))
    last = batch["attention_mask"].sum(1) - 1
    rows = torch.arange(len(last))
    assert (batch["input_ids"][rows, last] == spec.vocab.cls).all()
    assert (batch["token_type_ids"][rows, last] == 2).all()
    assert "new_document" not in batch and batch["perm_mask"].dtype == torch.bool


def test_objective_rejects_bert_pair_formats():
    with pytest.raises(ConfigError, match="data.format"):
        validate(compose_config(["experiment=xlnet_demo", "data.format=segment_pair"]))


def test_memory_stream_same_batches_with_workers(prepared_corpus):
    """Two data-loader workers deliver the same sequence of batches as one process, so slot
    continuity does not depend on num_workers."""
    overrides = [
        "experiment=xlnet_demo", f"data.shards_dir={prepared_corpus}", "data.batch_size=4",
        "data.max_seq_length=48", "model.reuse_len=16",
    ]  # fmt: skip
    _, spec, _ = build_stream(compose_config(overrides))
    alone = [b["keys"] for _, b in zip(range(6), EpochStream(spec, 0), strict=False)]
    loader = torch.utils.data.DataLoader(EpochStream(spec, 0), batch_size=None, num_workers=2)
    shared = [b["keys"] for _, b in zip(range(6), loader, strict=False)]
    assert alone == shared


def _logged(run_dir, column: str) -> list[float]:
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return [float(r[column]) for r in csv.DictReader(f) if r.get(column)]


def test_xlnet_demo_trains_with_falling_loss(prepared_corpus, tmp_path):
    from pretrain.runtime.run import train

    run_dir = tmp_path / "xlnet"
    train(
        compose_config(
            [
                "experiment=xlnet_demo",
                f"data.shards_dir={prepared_corpus}",
                f"run_dir={run_dir}",
                "logger=csv",
                "trainer.enable_progress_bar=false",
                "data.num_workers=0",
                "data.batch_size=8",
                "data.max_seq_length=48",
                "model.reuse_len=16",
                "model.mem_len=16",
                "model.dropout=0.0",
                "optim.optimizer.lr=3e-3",
                "optim.warmup_steps=5",
                "trainer.max_steps=30",
                "trainer.log_every_n_steps=1",
            ]
        )  # fmt: skip
    )
    loss = _logged(run_dir, "train/plm_loss")
    assert len(loss) == 30
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 0.5, loss
    # the checkpoint exports to XLNetLMHeadModel with the same query-stream predictions, and
    # the export initialises a new run (init_from)
    import transformers

    from pretrain.export import export_checkpoint, import_hf_model, read_checkpoint
    from pretrain.runtime.run import initialise_from

    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    hf = transformers.XLNetLMHeadModel.from_pretrained(out).eval()
    state_dict, config = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    module = PermutationLanguageModel(config, _vocab(config))
    initialise_from(module, str(out))
    for key, tensor in module.state_dict().items():
        assert torch.equal(tensor, state_dict[key]), key
    batch = _batch(5, [True, True])
    module.eval()
    with torch.no_grad():
        ours = module.encoder(
            batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"]
        ).query
        ours = module.lm_head(ours, module.encoder.word_embeddings.weight)
        theirs = hf(
            input_ids=batch["input_ids"], perm_mask=batch["perm_mask"].float(),
            target_mapping=batch["target_mapping"].float(),
        ).logits  # fmt: skip
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert import_hf_model(out)[0]["d_model"] == 64


def _vocab(config: dict) -> Vocabulary:
    from pretrain.data.vocab import load_vocabulary

    return load_vocabulary(config["data"]["tokenizer_dir"])


def test_preview_shows_the_factorization_order(prepared_corpus):
    import re

    from tokenizers import Tokenizer

    from pretrain.runtime.preview import preview_records, render

    overrides = ["experiment=xlnet_demo", f"data.shards_dir={prepared_corpus}"]
    records, tokenizer_dir, pair_task = preview_records(overrides, 2)
    tokenizer = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    for record in records:
        text = render(record, tokenizer, pair_task)
        places = sorted(int(k) for k in re.findall(r"#(\d+)>", text))
        predicted = sum(label != IGNORE_INDEX for label in record["labels"])
        assert places == list(range(1, predicted + 1)) and predicted > 0


@pytest.mark.slow
def test_resumed_memory_run_matches_the_uninterrupted_one(prepared_corpus, tmp_path):
    """The carried memory is saved with the checkpoint: resuming mid-epoch gives the
    uninterrupted run's losses and weights."""
    import shutil

    from pretrain.runtime.run import train

    def run(run_dir):
        train(
            compose_config(
                [
                    "experiment=xlnet_demo",
                    f"data.shards_dir={prepared_corpus}",
                    f"run_dir={run_dir}",
                    "logger=csv",
                    "trainer.enable_progress_bar=false",
                    "data.num_workers=0",
                    "data.batch_size=4",
                    "data.max_seq_length=48",
                    "model.reuse_len=16",
                    "model.mem_len=16",
                    "model.dropout=0.0",
                    "trainer.max_steps=8",
                    "trainer.checkpoint_every_n_steps=4",
                    "trainer.keep_checkpoints=5",
                    "trainer.log_every_n_steps=1",
                ]
            )  # fmt: skip
        )

    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    run(full_dir)
    checkpoint = torch.load(full_dir / "checkpoints" / "step-0000004.ckpt", weights_only=True)
    assert len(checkpoint["xlnet_memory"]["mems"]) == 2  # one memory per layer of xlnet_tiny
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(
        full_dir / "checkpoints" / "step-0000004.ckpt", resumed_dir / "checkpoints" / "last.ckpt"
    )
    run(resumed_dir)
    full, resumed = _logged(full_dir, "train/plm_loss"), _logged(resumed_dir, "train/plm_loss")
    assert resumed == pytest.approx(full[4:], abs=1e-5)
    a = torch.load(full_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(resumed_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5)


def _text_positions(batch: dict, row: int, vocab: Vocabulary) -> np.ndarray:
    """Positions of a memory-format row's document tokens (not [SEP], [CLS] or padding)."""
    ids = batch["input_ids"][row].numpy()
    real = batch["attention_mask"][row].numpy().astype(bool)
    return np.flatnonzero(real & (ids != vocab.sep) & (ids != vocab.cls))


@pytest.mark.parametrize("order", ["uniform", "span"])
def test_memory_producing_positions_never_see_the_next_segments_targets(prepared_corpus, order):
    """XLNet's two-part permutation: the reuse part (whose hidden states become the next
    segment's memory) is permuted on its own and blocked from the rest, so no position that
    produces memory sees a token the next segment of its slot predicts (the next segment's
    text is the text after this reuse part, aligned token by token); the rest sees the
    whole reuse part, and both parts have their own 1/K of targets."""
    reuse = 16
    overrides = [
        "experiment=xlnet_demo", f"data.shards_dir={prepared_corpus}", "data.batch_size=4",
        "data.max_seq_length=48", f"model.reuse_len={reuse}", f"objective.order={order}",
    ]  # fmt: skip
    _, spec, _ = build_stream(compose_config(overrides))
    batches = [b for _, b in zip(range(30), EpochStream(spec, 0), strict=False)]
    pairs = seen = reuse_targets = 0
    for before, after in zip(batches, batches[1:], strict=False):
        mask = before["perm_mask"].numpy()
        assert mask[:, :reuse, reuse:].all() and not mask[:, reuse:, :reuse].any()
        for row in np.flatnonzero(~after["new_document"].numpy()):
            old = _text_positions(before, row, spec.vocab)
            old = old[old >= reuse]  # the text after this segment's reuse part
            new = _text_positions(after, row, spec.vocab)
            n = min(len(old), len(new))
            np.testing.assert_array_equal(  # the next segment continues the text here
                before["input_ids"][row, old[:n]], after["input_ids"][row, new[:n]]
            )
            predicted = (after["labels"][row, new[:n]] != IGNORE_INDEX).numpy()
            reuse_targets += int(predicted[new[:n] < reuse].sum())
            seen += int((~mask[row, :reuse][:, old[:n][predicted]]).sum())
            pairs += 1
    assert pairs > 50 and reuse_targets > 50  # the next reuse parts do have targets
    assert seen == 0
