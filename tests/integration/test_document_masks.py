"""Document boundaries from the stream to ModernBERT's attention (`data.document_masks`): the
packed FULL-SENTENCES rows of the real stream carry document_ids that cut them exactly where
the corpus's documents end, and the MLM objective's loss on such a batch is the loss of every
document encoded alone."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.shard_format import load_manifest, read_documents
from pretrain.data.stream import EpochStream
from pretrain.errors import ConfigError
from pretrain.objectives.predictions import gather_positions, gather_targets, predicted_positions
from pretrain.runtime.run import prepare_run

pytestmark = pytest.mark.usefixtures("one_thread")

PACKED = (
    "model=modernbert_tiny",
    "model.local_attention=16",
    "model.initializer_range=0.3",  # large logits: the loss tells the contexts apart
    "objective=mlm",
    "objective.mlm_probability=0.3",
    "data=full_sentences",
    "data.num_workers=0",
    "data.document_masks=true",
)


def first_batch(shards_dir: Path, run_dir: Path):
    """The task and the first training batch of the real stream (epoch 0, rank 0)."""
    config = compose_config(cpu_run_overrides(shards_dir, run_dir, *PACKED))
    _, task, datamodule = prepare_run(config)
    return task, next(iter(EpochStream(datamodule.spec, 0)))


def corpus_texts(shards_dir: Path) -> list[bytes]:
    """Every document's token ids, as bytes (int64), for substring search."""
    manifest = load_manifest(shards_dir)
    return [
        doc["ids"].astype(np.int64).tobytes()
        for path in manifest.shard_paths
        for doc in read_documents(path)
    ]


def test_packed_rows_carry_the_documents_boundaries(prepared_corpus, tmp_path):
    task, batch = first_batch(prepared_corpus, tmp_path / "run")
    vocab = task.vocab
    ids, labels = batch["input_ids"], batch["labels"]
    original = torch.where(labels != IGNORE_INDEX, labels, ids)  # the uncorrupted tokens
    documents = corpus_texts(prepared_corpus)
    assert batch["document_ids"].shape == ids.shape and batch["document_ids"].dtype == torch.long
    boundaries = 0
    for row in range(ids.shape[0]):
        real = int(batch["attention_mask"][row].sum())
        row_ids, row_docs = original[row, :real], batch["document_ids"][row, :real]
        assert row_ids[0] == vocab.cls and row_ids[-1] == vocab.sep and row_docs[0] == 0
        assert (row_docs.diff() >= 0).all() and (row_docs.diff() <= 1).all()
        pieces = [row_ids[row_docs == d] for d in range(int(row_docs[-1]) + 1)]
        for number, piece in enumerate(pieces):
            body = piece[1:] if number == 0 else piece  # [CLS] goes with the first document
            assert body[-1] == vocab.sep  # each document ends in its separator
            text = body[:-1].numpy().astype(np.int64).tobytes()
            holders = [doc for doc in documents if text in doc]
            assert holders, f"row {row}: piece {number} is in no document"
            if number < len(pieces) - 1:  # cut at the end of a document
                assert any(doc.endswith(text) for doc in holders)
            if number > 0:  # and the next starts one
                assert any(doc.startswith(text) for doc in holders)
        boundaries += len(pieces) - 1
    assert boundaries >= 1  # some row packs two documents


def test_the_loss_of_a_packed_batch_is_that_of_its_documents_alone(prepared_corpus, tmp_path):
    task, batch = first_batch(prepared_corpus, tmp_path / "run")
    objective = task.objective.eval()
    hidden_alone = torch.zeros(*batch["input_ids"].shape, objective.encoder.hidden_size)
    with torch.no_grad():
        loss = objective(batch).loss
        for row in range(batch["input_ids"].shape[0]):
            real = int(batch["attention_mask"][row].sum())
            for d in batch["document_ids"][row, :real].unique():
                where = torch.nonzero(batch["document_ids"][row, :real] == d)[:, 0]
                alone = objective.encoder(batch["input_ids"][row, where][None])[0]
                hidden_alone[row, where] = alone
        positions = predicted_positions(batch)
        logits = objective.mlm_head(gather_positions(hidden_alone, positions))
        targets = gather_targets(batch["labels"], positions)
        expected = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
        across = dict(batch)
        del across["document_ids"]
        unmasked = objective(across).loss
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-5)
    assert abs(float(unmasked) - float(loss)) > 1e-4  # without the ids rows attend across


@pytest.mark.parametrize(
    "overrides,named",
    [
        (("model=bert_tiny", "data=full_sentences"), "cannot mask attention by document"),
        (("model=modernbert_tiny", "data=segment_pair"), "needs rows that pack documents"),
    ],
)
def test_document_masks_need_packed_rows_and_a_model_that_uses_them(
    prepared_corpus, tmp_path, overrides, named
):
    settings = ("objective=mlm", "objective.pair_task=none", "data.document_masks=true")
    overrides = cpu_run_overrides(prepared_corpus, tmp_path, *overrides, *settings)
    with pytest.raises(ConfigError, match=f"data.document_masks.*{named}"):
        prepare_run(compose_config(overrides))
