"""The registry of input formats (`data.format`): how an epoch's documents become batches of
sequences. The config checks names against it, the stream dispatches on it; adding a format
is one entry here.

Every format turns documents into sequences; the stream (`stream.py`) reads them from the
epoch's canonical partitions and interleaves them into the global sample order. XLNet's
memory format makes one memory slot's consecutive segments per partition (`memory`: one
partition per slot of the global batch, so a slot's next segment is in the next step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pretrain.data.formats import make_segment_pairs, pack_sentences
from pretrain.data.xlnet_formats import make_xlnet_pairs, memory_sequences

if TYPE_CHECKING:  # reading imports torch; the config checks names without it
    from pretrain.data.reading import StreamSpec

Sequences = Iterator[dict]


@dataclass(frozen=True)
class InputFormat:
    """One input format: `sequences(documents, spec, epoch)`, which the stream interleaves
    across partitions and batches. `pairs`: its two segments carry a sentence-relation label.
    `memory`: a partition's sequences are one memory slot's consecutive segments, so the
    partitions are the global batch's slots (`partitions.memory_partitions`)."""

    sequences: Callable[[Iterable[dict], StreamSpec, int], Sequences]
    pairs: bool = False
    memory: bool = False
    staged_lengths: bool = False  # takes each sequence's length (a context-extension stage)
    crosses_documents: bool = False  # a row packs documents (data.document_masks)


def _packed(
    cross_documents: bool, fill: str | None = None
) -> Callable[[Iterable[dict], StreamSpec, int], Sequences]:
    def sequences(
        documents: Iterable[dict], spec: StreamSpec, epoch: int, length_of=None
    ) -> Sequences:
        """`length_of(n)`: the n-th sequence's length (a context-extension stage), whose
        shortest length (the stages') cuts long sentences."""
        lengths = getattr(spec.corruption, "stage_lengths", None)
        return pack_sentences(
            documents,
            spec.max_seq_length if length_of is None else min(lengths.lengths),
            spec.vocab,
            cross_documents=cross_documents,
            fill=fill,
            document_ids=spec.document_masks,
            length_of=length_of,
        )

    return sequences


def _pairs(single_sentences: bool) -> Callable[[Iterable[dict], StreamSpec, int], Sequences]:
    def sequences(documents: Iterable[dict], spec: StreamSpec, epoch: int) -> Sequences:
        return make_segment_pairs(
            documents,
            spec.max_seq_length,
            spec.vocab,
            seed=spec.seed,
            epoch=epoch,
            pair_task=spec.pair_task,
            single_sentences=single_sentences,
            short_seq_probability=spec.short_seq_probability,
            random_probability=spec.nsp_random_probability,
            pool_size=spec.random_document_pool,
        )

    return sequences


def _xlnet_pairs(documents: Iterable[dict], spec: StreamSpec, epoch: int) -> Sequences:
    return make_xlnet_pairs(
        documents,
        spec.max_seq_length,
        spec.vocab,
        seed=spec.seed,
        epoch=epoch,
        short_seq_probability=spec.short_seq_probability,
        random_probability=spec.nsp_random_probability,
        pool_size=spec.random_document_pool,
    )


def _xlnet_memory(documents: Iterable[dict], spec: StreamSpec, epoch: int) -> Sequences:
    """reuse_len and bi_data come from the corruption (the objective's, set from
    model.reuse_len / model.bi_data), else half of max_seq_length and off; so does the
    probability of a random B (objective.memory_random_b_probability, else 0)."""
    corruption = spec.corruption
    reuse_len = getattr(corruption, "reuse_len", None) or spec.max_seq_length // 2
    return memory_sequences(
        documents, reuse_len, spec.max_seq_length, spec.vocab, spec.seed, epoch,
        bi_data=bool(getattr(corruption, "bi_data", False)),
        random_probability=getattr(corruption, "memory_random_b_probability", 0.0),
        pool_size=spec.random_document_pool,
    )  # fmt: skip


INPUT_FORMATS: dict[str, InputFormat] = {
    "full_sentences": InputFormat(
        _packed(cross_documents=True), staged_lengths=True, crosses_documents=True
    ),
    # run_mlm.py's group_texts: rows of max_seq_length tokens, sentences cut where a row is full
    "token_blocks": InputFormat(
        _packed(cross_documents=True, fill="carry"), staged_lengths=True, crosses_documents=True
    ),
    # full sentences, the row's last one cut where the row is full and whole in the next row
    "filled_sentences": InputFormat(
        _packed(cross_documents=True, fill="restart"), staged_lengths=True, crosses_documents=True
    ),
    "doc_sentences": InputFormat(_packed(cross_documents=False), staged_lengths=True),
    "segment_pair": InputFormat(_pairs(single_sentences=False), pairs=True),
    "sentence_pair": InputFormat(_pairs(single_sentences=True), pairs=True),
    "xlnet_pair": InputFormat(_xlnet_pairs),  # A [SEP] B [SEP] [CLS], no pair label
    "xlnet_memory": InputFormat(_xlnet_memory, memory=True),
}
PAIR_FORMATS = tuple(name for name, entry in INPUT_FORMATS.items() if entry.pairs)
