"""XLNet's input formats (Yang et al., 2019, §3.1 and the released `data_utils.py`).

`xlnet_pair`: two segments as in BERT's SEGMENT-PAIR (B continues A, or comes from another
document half of the time), laid out with the special tokens at the END:
A [SEP] B [SEP] [CLS], token types 0 (A and its [SEP]), 1 (B and its [SEP]), 2 ([CLS]).
There is no NSP loss (next_sentence_label is IGNORE_INDEX).

`xlnet_memory`: the same layout after a "reuse" part that carries the memory across batches:
each of the batch_size slots of a rank reads its own sub-stream of documents; segment t of a
slot is reuse_len tokens of its document from offset t * reuse_len, then A [SEP] B [SEP]
[CLS] cut from the tokens that follow (B continues A). So batch t + 1, slot b continues
batch t, slot b, and the model's memory (the hidden states of the reuse part) is the text
just before. A slot whose document is used up takes the next document of the rank's stream
and flags `new_document` (batch,) so the objective resets that slot's memory. Every data-loader
worker builds the rank's whole sequence of batches (cheap slicing) and corrupts only its own
(batches w, w + W, ...), so the slots stay continuous whatever the number of workers
(`workers_share_documents` in input_formats.py).
"""

from collections.abc import Iterable, Iterator

import numpy as np

from pretrain.data.formats import make_segment_pairs
from pretrain.data.keyed_rng import STREAM_FORMAT, keyed_generator
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary

CLS_TOKEN_TYPE = 2  # XLNet's segment id of the final [CLS]
PER_TOKEN = ("input_ids", "token_type_ids", "word_starts", "phrases", "sentence_starts")


def to_xlnet_layout(sequence: dict) -> dict:
    """[CLS] A [SEP] B [SEP] -> A [SEP] B [SEP] [CLS] (every per-token array rotated by one),
    the [CLS] of token type 2, no sentence-relation label."""
    out = dict(sequence)
    for name in PER_TOKEN:
        if name in out:
            out[name] = np.roll(out[name], -1)
    out["token_type_ids"] = out["token_type_ids"].copy()
    out["token_type_ids"][-1] = CLS_TOKEN_TYPE
    out["next_sentence_label"] = IGNORE_INDEX
    return out


def make_xlnet_pairs(
    documents: Iterable[dict],
    max_seq_length: int,
    vocab: Vocabulary,
    *,
    seed: int,
    epoch: int,
    short_seq_probability: float = 0.1,
    random_probability: float = 0.5,
    pool_size: int = 100,
) -> Iterator[dict]:
    """The `xlnet_pair` format: SEGMENT-PAIR sequences (random B with `random_probability`,
    as XLNet's data pipeline does) in XLNet's layout; lengths in tokens."""
    pairs = make_segment_pairs(
        documents,
        max_seq_length,
        vocab,
        seed=seed,
        epoch=epoch,
        pair_task="nsp",
        short_seq_probability=short_seq_probability,
        random_probability=random_probability,
        pool_size=pool_size,
    )
    for sequence in pairs:
        yield to_xlnet_layout(sequence)


def memory_segment(
    document: dict,
    offset: int,
    reuse_len: int,
    max_seq_length: int,
    vocab: Vocabulary,
    seed: int,
    epoch: int,
) -> tuple[dict, int | None]:
    """The segment of `document` at token `offset`: (sequence, offset of the next segment or
    None when the document is used up). reuse part = up to reuse_len tokens (fewer at the
    document's end, leaving 2 for A and B), then A [SEP] B [SEP] [CLS] from the next
    max_seq_length - reuse - 3 tokens, cut at a keyed random point."""
    ids, words = document["ids"], document["words"]
    phrases = document.get("phrases")
    remaining = len(ids) - offset
    reuse = min(reuse_len, remaining - 2)
    pair_end = min(len(ids), offset + max_seq_length - 3)  # room for [SEP] [SEP] [CLS]
    pair_len = pair_end - offset - reuse
    key = f"{document['key']}@{offset}"
    rng = keyed_generator(seed, epoch, STREAM_FORMAT, key)
    a_end = offset + reuse + int(rng.integers(1, pair_len))  # A: at least 1 token, B too
    sep, cls = np.array([vocab.sep]), np.array([vocab.cls])
    input_ids = np.concatenate([ids[offset:a_end], sep, ids[a_end:pair_end], sep, cls])
    types = np.concatenate(
        [
            np.zeros(a_end - offset + 1, np.int64),
            np.ones(pair_end - a_end + 1, np.int64),
            [CLS_TOKEN_TYPE],
        ]
    )
    flag = np.ones(1, bool)
    word_starts = np.concatenate([words[offset:a_end], flag, words[a_end:pair_end], flag, flag])
    if phrases is None:
        phrase_flags = np.zeros(len(input_ids), np.uint8)
    else:
        zero = np.zeros(1, np.uint8)
        phrase_flags = np.concatenate(
            [phrases[offset:a_end], zero, phrases[a_end:pair_end], zero, zero]
        )
    sequence = {
        "key": key,
        "input_ids": input_ids.astype(np.int64),
        "token_type_ids": types,
        "word_starts": word_starts.astype(bool),
        "phrases": phrase_flags.astype(np.uint8),
        "next_sentence_label": IGNORE_INDEX,
    }
    following = offset + reuse_len
    done = reuse < reuse_len or len(ids) - following < 3
    return sequence, None if done else following


def memory_batches(
    documents: Iterable[dict],
    batch_size: int,
    reuse_len: int,
    max_seq_length: int,
    vocab: Vocabulary,
    seed: int,
    epoch: int,
) -> Iterator[tuple[list[dict], np.ndarray]]:
    """(sequences of the batch_size slots, new_document (batch_size,) bool) per batch: slot b
    continues its document from the previous batch; a used-up slot takes the next document
    (documents shorter than 3 tokens are skipped). Stops when the documents run out."""
    if reuse_len >= max_seq_length - 4:
        raise ValueError(
            f"model.reuse_len ({reuse_len}) must leave room for A [SEP] B [SEP] [CLS] in "
            f"data.max_seq_length ({max_seq_length}) tokens"
        )
    stream = (d for d in documents if len(d["ids"]) >= 3)
    slots: list[tuple[dict, int] | None] = [None] * batch_size
    while True:
        sequences, new_document = [], np.zeros(batch_size, bool)
        for b in range(batch_size):
            if slots[b] is None:
                document = next(stream, None)
                if document is None:
                    return
                slots[b], new_document[b] = (document, 0), True
            document, offset = slots[b]
            sequence, following = memory_segment(
                document, offset, reuse_len, max_seq_length, vocab, seed, epoch
            )
            sequences.append(sequence)
            slots[b] = None if following is None else (document, following)
        yield sequences, new_document
