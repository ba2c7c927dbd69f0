"""XLNet's bidirectional data (model.bi_data) and its segment B from another document
(objective.memory_random_b_probability) in the xlnet_memory stream, as in XLNet's
data_utils.py: measured on real batches of the stream."""

import numpy as np
import pytest

from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.reading import reader_documents
from pretrain.data.stream import EpochStream
from pretrain.data.vocab import Vocabulary
from pretrain.data.xlnet_formats import reversed_document
from pretrain.objectives.xlnet import PermutationLanguageModel
from pretrain.runtime.run import build_stream

BATCHES = 40


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _stream(shards_dir, random_b: float) -> tuple[list[dict], dict[str, dict], Vocabulary]:
    """BATCHES batches of 8 rows (4 forward slots, 4 backward) of the demo's memory stream, and
    the rank's documents by key."""
    overrides = [
        "experiment=xlnet_demo", f"data.shards_dir={shards_dir}", "data.batch_size=8",
        "data.max_seq_length=48", "model.reuse_len=16", "model.bi_data=true",
        f"objective.memory_random_b_probability={random_b}",
    ]  # fmt: skip
    _, spec, _ = build_stream(compose_config(overrides))
    batches = [b for _, b in zip(range(BATCHES), EpochStream(spec, 0), strict=False)]
    documents = {d["key"]: d for d in reader_documents(spec, 0, 0, 1, (0, 0))}
    return batches, documents, spec.vocab


def _rows(batches: list[dict], vocab: Vocabulary):
    """(batch, row, document key, backward?, offset, text tokens, position of [SEP] after A
    among the text tokens) of every row: its tokens without [SEP], [CLS] and padding."""
    for number, batch in enumerate(batches):
        for row, key in enumerate(batch["keys"]):
            ids = batch["input_ids"][row].numpy()[: int(batch["attention_mask"][row].sum())]
            sep = int(np.flatnonzero(ids == vocab.sep)[0])
            text = ids[(ids != vocab.sep) & (ids != vocab.cls)]
            document, offset = key.rsplit("@", 1)
            backward = document.endswith("/backward")
            yield number, row, document.removesuffix("/backward"), backward, int(offset), text, sep


def test_half_of_each_batch_is_the_same_text_read_backward(prepared_corpus):
    """bi_data: rows b and b + 4 read the same document at the same offset, row b forward and
    row b + 4 backward, with the same new_document flags (each its own memory); every
    backward row is the document's tokens reversed (word starts at the forward words' ends)."""
    batches, documents, vocab = _stream(prepared_corpus, random_b=0.0)
    reversed_rows = []
    for number, row, key, backward, offset, text, _ in _rows(batches, vocab):
        ids = documents[key]["ids"]
        forward_text = ids[offset : offset + len(text)]
        backward_text = ids[len(ids) - offset - len(text) : len(ids) - offset][::-1]
        reads_backward = np.array_equal(text, backward_text) and not np.array_equal(
            text, forward_text
        )
        assert reads_backward == backward and (backward or np.array_equal(text, forward_text))
        assert (row >= 4) == backward
        reversed_rows.append(reads_backward)
        if backward:  # its twin: the forward row 4 rows up
            twin = batches[number]["keys"][row - 4]
            assert twin == f"{key}@{offset}"
    assert np.mean(reversed_rows) == 0.5 and len(reversed_rows) == 8 * BATCHES
    for batch in batches:
        flags = batch["new_document"].numpy()
        np.testing.assert_array_equal(flags[:4], flags[4:])
    assert sum(int(b["new_document"].sum()) for b in batches[1:]) > 10  # documents change
    for document in list(documents.values())[:50]:  # reading backward twice is the document
        again = reversed_document(reversed_document(document))
        for name in ("ids", "words", "sents"):
            np.testing.assert_array_equal(again[name], document[name])
        assert reversed_document(document)["words"].sum() == document["words"].sum()


class SentenceRuns:
    """All documents read in one direction, concatenated (-1 between them), to find where a
    run of tokens that begins at a sentence start occurs."""

    def __init__(self, documents: list[dict]) -> None:
        self.tokens = np.concatenate([np.r_[d["ids"], -1] for d in documents])
        self.offsets = np.cumsum([0] + [len(d["ids"]) + 1 for d in documents])
        self.sentence_start = np.zeros(len(self.tokens), bool)
        for offset, d in zip(self.offsets, documents, strict=False):
            self.sentence_start[offset + np.r_[0, d["sents"][:-1]]] = True

    def documents_holding(self, run: np.ndarray) -> set[int]:
        """Indices of the documents in which `run` begins at a sentence start."""
        found = set()
        for start in np.flatnonzero(self.sentence_start & (self.tokens == run[0])):
            if np.array_equal(self.tokens[start : start + len(run)], run):
                found.add(int(np.searchsorted(self.offsets, start, side="right")) - 1)
        return found


def test_segment_b_comes_from_another_document_at_the_configured_rate(prepared_corpus):
    """objective.memory_random_b_probability = 0.5: B is text of another document (read in the
    row's direction, from a sentence start) in about half of the rows, marked
    next_sentence_label 1; otherwise B continues A in the row's document. The reuse part and
    A always continue the row's own text."""
    batches, documents, vocab = _stream(prepared_corpus, random_b=0.5)
    keys = list(documents)
    texts = {
        False: [documents[k]["ids"] for k in keys],
        True: [documents[k]["ids"][::-1] for k in keys],
    }
    runs = {  # B of another document read forward, and read backward
        False: SentenceRuns([documents[k] for k in keys]),
        True: SentenceRuns([reversed_document(documents[k]) for k in keys]),
    }
    labels, coincidences = [], 0
    for number, row, key, backward, offset, text, sep in _rows(batches, vocab):
        own = texts[backward][keys.index(key)]
        label = int(batches[number]["next_sentence_label"][row])
        np.testing.assert_array_equal(text[:sep], own[offset : offset + sep])  # reuse part + A
        continues = np.array_equal(text, own[offset : offset + len(text)])
        assert continues or label == 1
        if label == 1:
            assert runs[backward].documents_holding(text[sep:]) - {keys.index(key)}
            coincidences += continues  # another document's text that equals the continuation
        labels.append(label)
    n = len(labels)
    assert coincidences <= 0.02 * sum(labels), coincidences  # (the help topics repeat lines)
    assert n == 8 * BATCHES and abs(np.mean(labels) - 0.5) < 4 * np.sqrt(0.25 / n), np.mean(labels)


def test_bi_data_needs_the_memory_format_and_an_even_batch():
    vocab = Vocabulary(size=100, pad=0, unk=1, cls=2, sep=3, mask=4)
    run = validate(compose_config(["experiment=xlnet_demo", "model.bi_data=true"]))
    assert PermutationLanguageModel.corruption_inputs(run, vocab)["bi_data"] is True
    pair = ["experiment=xlnet_demo", "model.bi_data=true", "data.format=xlnet_pair"]
    with pytest.raises(ConfigError, match="model.bi_data"):
        PermutationLanguageModel.corruption_inputs(validate(compose_config(pair)), vocab)
    with pytest.raises(ConfigError, match="data.batch_size = 7: must be even"):
        validate(
            compose_config(["experiment=xlnet_demo", "model.bi_data=true", "data.batch_size=7"])
        )
