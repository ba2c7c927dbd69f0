"""Phrase and entity spans of a tokenized document (ERNIE 1.0's knowledge masking units).

Both lexicons are sequences of token ids, matched against a document's ids: a match starts
at a word start, ends where the next token starts a word (or at the sentence end), and never
crosses a sentence end. Entities come from a user's list, tokenized with the corpus's
tokenizer (so an uncased tokenizer matches them case-insensitively, a cased one exactly);
phrases from `data_pipelines.phrases`. Spans never overlap: entities win over phrases, then
longer spans (in tokens) over shorter ones, then the leftmost. The result is one uint8 flag
per token (`pretrain.data.shard_format`: 0 outside, 1 phrase start, 2 entity start, 3 inside).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data_pipelines.text import normalize
from pretrain.data.shard_format import ENTITY_START, INSIDE_SPAN, OUTSIDE_SPAN, PHRASE_START

_END = -1  # trie key marking the end of a sequence (token ids are >= 0)


class SpanLexicon:
    """A set of token-id sequences in a trie, for every match starting at one position."""

    def __init__(self, sequences: Iterable[Sequence[int]]):
        self._root: dict = {}
        self._size = 0
        for sequence in sequences:
            if not sequence:
                continue
            node = self._root
            for token in sequence:
                node = node.setdefault(int(token), {})
            if _END not in node:
                node[_END] = True
                self._size += 1

    def __len__(self) -> int:
        return self._size

    def match_ends(
        self, ids: Sequence[int], start: int, stop: int, boundary: Sequence[bool]
    ) -> list[int]:
        """Ends (exclusive) of the sequences that match `ids` from `start`, ending at most at
        `stop` and only where `boundary[end]` is true, shortest first."""
        ends, node = [], self._root
        for position in range(start, stop):
            node = node.get(ids[position])
            if node is None:
                break
            if _END in node and boundary[position + 1]:
                ends.append(position + 1)
        return ends


@dataclass
class EntityList:
    """The entities of a user's file as a lexicon; `skipped` lists the lines left out because
    the tokenizer does not know one of their characters ([UNK] would match any unknown word)."""

    lexicon: SpanLexicon
    entries: int
    skipped: list[str] = field(default_factory=list)


class EntityFileError(ValueError):
    """The entity file cannot be read; the message names it and says what to do."""


def load_entities(path: str | Path, tokenizer: Tokenizer) -> EntityList:
    """Entities of a UTF-8 file with one entity per line (blank lines ignored), each
    normalized like the corpus and tokenized without special tokens. Raises EntityFileError
    naming `entities.path` when the file is missing or not UTF-8."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as error:
        raise EntityFileError(
            f"entities.path={path}: no such file; point it at a UTF-8 file, one entity a line"
        ) from error
    except (UnicodeDecodeError, OSError) as error:
        raise EntityFileError(
            f"entities.path={path}: cannot be read as UTF-8 text ({error}); save it as UTF-8"
        ) from error
    unknown = tokenizer.token_to_id("[UNK]")
    texts = sorted({t for t in (normalize(line) for line in lines) if t})
    sequences, skipped = [], []
    for text, encoding in zip(
        texts, tokenizer.encode_batch(texts, add_special_tokens=False), strict=True
    ):
        if not encoding.ids or unknown in encoding.ids:
            skipped.append(text)
        else:
            sequences.append(encoding.ids)
    lexicon = SpanLexicon(sequences)
    return EntityList(lexicon, len(lexicon), skipped)


def annotate_spans(
    ids: np.ndarray,
    sents: np.ndarray,
    words: np.ndarray,
    entities: SpanLexicon | None = None,
    phrases: SpanLexicon | None = None,
) -> np.ndarray:
    """Span flags (n,) uint8 of one document: `ids` (n,) token ids, `sents` (s,) sentence end
    offsets, `words` (n,) word-start flags. See the module docstring for the rules."""
    n = len(ids)
    flags = np.full(n, OUTSIDE_SPAN, dtype=np.uint8)
    token_ids = np.asarray(ids).tolist()
    boundary = [*np.asarray(words, dtype=bool).tolist(), True]
    starts = np.concatenate(([0], sents[:-1])).tolist()
    for start in starts:
        boundary[start] = True  # a sentence start is a word start
    candidates = []  # (priority, -length, start, end)
    for priority, lexicon in enumerate((entities, phrases)):
        if lexicon is None or not len(lexicon):
            continue
        for sentence_start, sentence_end in zip(starts, sents.tolist(), strict=True):
            for begin in range(sentence_start, sentence_end):
                if boundary[begin]:
                    for end in lexicon.match_ends(token_ids, begin, sentence_end, boundary):
                        candidates.append((priority, begin - end, begin, end))
    covered = np.zeros(n, dtype=bool)
    for priority, _, begin, end in sorted(candidates):
        if not covered[begin:end].any():
            covered[begin:end] = True
            flags[begin] = ENTITY_START if priority == 0 else PHRASE_START
            flags[begin + 1 : end] = INSIDE_SPAN
    return flags
