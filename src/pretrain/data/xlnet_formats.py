"""XLNet's input formats (Yang et al., 2019, §3.1, and data_utils.py of the released code,
github.com/zihangdai/xlnet).

`xlnet_pair`: two segments as in BERT's SEGMENT-PAIR (B continues A, or comes from another
document half of the time), laid out with the special tokens at the END:
A [SEP] B [SEP] [CLS], token types 0 (A and its [SEP]), 1 (B and its [SEP]), 2 ([CLS]).
There is no NSP loss (next_sentence_label is IGNORE_INDEX).

`xlnet_memory`: the same layout after a "reuse" part that carries the memory across batches:
each memory slot of the global batch reads one canonical partition of the epoch's documents
(`stream.py`), one document after another; segment t of a document is reuse_len tokens from
offset t * reuse_len, then A [SEP] B [SEP] [CLS] cut from the tokens that follow (B
continues A). The slot's next segment is in the next optimizer step's global batch, in the
same row, so the model's memory (the hidden states of the reuse part) is the text just
before. A segment at offset 0 flags `new_document` so the objective resets that slot's memory.

As in XLNet's data_utils.py, B may not continue A: with `random_probability` it is text of
another document of the stream (from a sentence start, as long as the continuation would
have been), marked next_sentence_label = 1 (0: B continues A; no loss uses it). With
`bi_data` (XLNet's bidirectional data, `create_tfrecords`), every slot also reads its
documents backward (`reversed_document`): the first half of a micro-batch's rows are slots
read forward, the second half the same slots backward (row b + batch/2 is row b's text
reversed), each row with its own memory; the model gives the second half backward relative positions (`model.bi_data`).
"""

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from pretrain.data.formats import make_segment_pairs, random_document_pools
from pretrain.data.keyed_rng import STREAM_FORMAT, scalar_keyed_uniform
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
            array = out[name]
            out[name] = np.concatenate((array[1:], array[:1]))  # np.roll(array, -1), faster
    out["token_type_ids"][-1] = CLS_TOKEN_TYPE  # (a new array)
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


class BackwardPool(Sequence):
    """A pool of documents read backwards: each is reversed when drawn (`reversed_document`)."""

    def __init__(self, pool: Sequence[dict]) -> None:
        self.pool = pool

    def __len__(self) -> int:
        return len(self.pool)

    def __getitem__(self, index: int) -> dict:  # type: ignore[override]
        return reversed_document(self.pool[index])


def reversed_document(document: dict) -> dict:
    """`document` read backwards (XLNet's bi_data): its tokens reversed; a word starts at what
    was a word's last token; sentence ends and phrase/entity spans (first token 1/2, then 3)
    mirrored. Its key gains "/backward", so its draws differ from the forward text's."""
    ids, words = document["ids"], document["words"].astype(bool)
    n, sents = len(ids), np.asarray(document["sents"])
    backward = {
        "key": f"{document['key']}/backward",
        "ids": ids[::-1],
        "words": np.r_[words[1:], True][::-1],  # token i ends a word
        "sents": np.r_[(n - sents[:-1])[::-1], n].astype(sents.dtype),
    }
    phrases = document.get("phrases")
    if phrases is not None:
        inside = phrases != 0
        starts = np.flatnonzero((phrases == 1) | (phrases == 2))
        ends = np.flatnonzero(inside & (np.r_[phrases[1:], 0] != 3))  # each span's last token
        mirrored = np.where(inside, 3, 0).astype(phrases.dtype)
        mirrored[ends] = phrases[starts]
        backward["phrases"] = mirrored[::-1]
    return backward


def _random_b(other: dict, length: int, uniform: float) -> tuple[np.ndarray, ...]:
    """(ids, word starts, phrase flags) of up to `length` tokens of document `other` from a
    sentence start: a uniform token position (one that leaves `length` tokens when the
    document is long enough; `uniform` in [0, 1) picks it) moved back to its sentence's
    start, as data_utils.py does."""
    ids = other["ids"]
    position = int(uniform * max(1, len(ids) - length + 1))
    starts = np.r_[0, np.asarray(other["sents"])[:-1]]
    start = int(starts[np.searchsorted(starts, position, side="right") - 1])
    stop = min(len(ids), start + length)
    phrases = other.get("phrases")
    phrases = np.zeros(len(ids), np.uint8) if phrases is None else phrases
    return ids[start:stop], other["words"][start:stop], phrases[start:stop]


def memory_segment(
    document: dict,
    offset: int,
    reuse_len: int,
    max_seq_length: int,
    vocab: Vocabulary,
    seed: int,
    epoch: int,
    pool: Sequence[dict] = (),
    random_probability: float = 0.0,
) -> tuple[dict, int | None]:
    """The segment of `document` at token `offset`: (sequence, offset of the next segment or
    None when the document is used up). reuse part = up to reuse_len tokens (fewer at the
    document's end, leaving 2 for A and B), then A [SEP] B [SEP] [CLS] from the next
    max_seq_length - reuse - 3 tokens, cut at a keyed random point; with
    `random_probability` B is as many tokens of a document of `pool` instead (`_random_b`).
    The draws are keyed uniforms of (seed, epoch, document key @ offset)."""
    ids, words = document["ids"], document["words"]
    phrases = document.get("phrases")
    if phrases is None:
        phrases = np.zeros(len(ids), np.uint8)
    remaining = len(ids) - offset
    reuse = min(reuse_len, remaining - 2)
    pair_end = min(len(ids), offset + max_seq_length - 3)  # room for [SEP] [SEP] [CLS]
    pair_len = pair_end - offset - reuse
    key = f"{document['key']}@{offset}"
    cut, use_random, which, where = scalar_keyed_uniform(seed, epoch, STREAM_FORMAT, key, 4)
    a_end = offset + reuse + 1 + int(cut * (pair_len - 1))  # A: at least 1 token, B too
    b = ids[a_end:pair_end], words[a_end:pair_end], phrases[a_end:pair_end]
    random_b = random_probability > 0 and len(pool) > 0 and use_random < random_probability
    if random_b:
        b = _random_b(pool[int(which * len(pool))], pair_end - a_end, where)
    sep, cls = np.array([vocab.sep]), np.array([vocab.cls])
    input_ids = np.concatenate([ids[offset:a_end], sep, b[0], sep, cls])
    types = np.concatenate(
        [
            np.zeros(a_end - offset + 1, np.int64),
            np.ones(len(b[0]) + 1, np.int64),
            [CLS_TOKEN_TYPE],
        ]
    )
    flag, zero = np.ones(1, bool), np.zeros(1, np.uint8)
    word_starts = np.concatenate([words[offset:a_end], flag, b[1], flag, flag])
    phrase_flags = np.concatenate([phrases[offset:a_end], zero, b[2], zero, zero])
    sequence = {
        "key": key,
        "input_ids": input_ids.astype(np.int64),
        "token_type_ids": types,
        "word_starts": word_starts.astype(bool),
        "phrases": phrase_flags.astype(np.uint8),
        "next_sentence_label": int(random_b),
    }
    following = offset + reuse_len
    done = reuse < reuse_len or len(ids) - following < 3
    return sequence, None if done else following


def memory_sequences(
    documents: Iterable[dict],
    reuse_len: int,
    max_seq_length: int,
    vocab: Vocabulary,
    seed: int,
    epoch: int,
    *,
    bi_data: bool = False,
    random_probability: float = 0.0,
    pool_size: int = 100,
) -> Iterator[dict]:
    """The segments of one memory slot reading `documents` one after another (documents
    shorter than 3 tokens are skipped): each document's segments at offsets 0, reuse_len,
    2 x reuse_len, ... (`memory_segment`), each with `new_document` (True at offset 0: the
    objective resets the slot's memory there). With `bi_data`, each also holds its
    "backward" mirror: the same segment of the document read backward, its own row with its
    own memory. Random B segments come from `pool_size` documents around
    (`random_document_pools`)."""
    if reuse_len >= max_seq_length - 4:
        raise ValueError(
            f"model.reuse_len ({reuse_len}) must leave room for A [SEP] B [SEP] [CLS] in "
            f"data.max_seq_length ({max_seq_length}) tokens"
        )
    settings = (reuse_len, max_seq_length, vocab, seed, epoch)
    long_enough = (d for d in documents if len(d["ids"]) >= 3)
    for document, pool in random_document_pools(long_enough, pool_size):
        reverse = reversed_document(document) if bi_data else None
        offset: int | None = 0
        while offset is not None:
            sequence, following = memory_segment(
                document, offset, *settings, pool, random_probability
            )
            sequence["new_document"] = offset == 0
            if reverse is not None:
                sequence["backward"] = memory_segment(
                    reverse, offset, *settings, BackwardPool(pool), random_probability
                )[0] | {"new_document": offset == 0}
            yield sequence
            offset = following
