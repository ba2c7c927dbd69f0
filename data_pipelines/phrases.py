"""A phrase lexicon learned from the corpus with collocation statistics (for ERNIE 1.0's
phrase-level masking).

Words are the words of the prepared shards: runs of tokens that begin at a word-start flag
(the tokenizer's pre-tokenized words; jieba words for Chinese with `segmenter=jieba`). A word
is identified by its token ids, so phrases follow the tokenizer's normalization (an uncased
tokenizer gives case-insensitive phrases). Words that hold punctuation or [UNK] never enter a
phrase. A phrase is 2 to `max_words` adjacent words of one sentence:

- it occurs at least `min_count` times;
- every pair of adjacent words in it is a collocation: normalized PMI
  npmi(a, b) = log(p(ab) / (p(a) p(b))) / -log p(ab), with p(ab) = count(ab) / N and
  p(a) = count(a) / N (N: words in the corpus), is at least `min_npmi`. A phrase's score is
  the minimum over its adjacent pairs (so a longer phrase is never scored above its weakest
  link).

Two passes: words and adjacent pairs are counted first; longer n-grams are then counted only
where every adjacent pair already qualifies, which keeps memory to the candidates. Of the
phrases found, the `max_phrases` most frequent are kept (ties: higher score, then token ids).
Counts are held in memory: about one entry per distinct word and per distinct adjacent pair.
"""

import math
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data_pipelines.prepare_config import PhraseSettings

Word = tuple[int, ...]  # the token ids of one word
Pair = tuple[Word, Word]


@dataclass(frozen=True)
class Phrase:
    """A lexicon entry: its words, how often it occurs and its score (min adjacent npmi)."""

    words: tuple[Word, ...]
    count: int
    score: float

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The phrase's token ids, all words concatenated."""
        return tuple(i for word in self.words for i in word)


def _is_punctuation(char: str) -> bool:
    """BERT's rule: ASCII symbols and every Unicode punctuation character."""
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def barrier_tokens(tokenizer: Tokenizer) -> np.ndarray:
    """(vocab,) bool: True for tokens a phrase may not hold: special tokens ([UNK] among them)
    and punctuation."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    barrier = np.zeros(max(vocab.values()) + 1, dtype=bool)
    for token, index in vocab.items():
        text = token[2:] if token.startswith("##") else token
        special = token.startswith("[") and token.endswith("]") and len(token) > 2
        barrier[index] = special or not text or all(map(_is_punctuation, text))
    for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        if token in vocab:
            barrier[vocab[token]] = True
    return barrier


def sentence_words(document: dict, barrier: np.ndarray) -> Iterator[list[Word | None]]:
    """Per sentence of `document` ({"ids", "sents", "words"} as read from a shard), its words
    in order; None stands for a word holding a barrier token."""
    ids, words = document["ids"], np.asarray(document["words"], dtype=bool)
    start = 0
    for end in document["sents"].tolist():
        starts = (start + np.flatnonzero(words[start:end])).tolist()
        if not starts or starts[0] != start:
            starts.insert(0, start)
        bounds = [*starts, end]
        blocked = np.logical_or.reduceat(barrier[ids[start:end]], [s - start for s in starts])
        yield [
            None if block else tuple(ids[a:b].tolist())
            for a, b, block in zip(bounds[:-1], bounds[1:], blocked.tolist(), strict=True)
        ]
        start = end


@dataclass
class PairCounts:
    """First-pass counts: words, adjacent pairs of phrase-able words, and all words (N)."""

    words: Counter
    pairs: Counter
    total_words: int = 0


def count_pairs(documents: Iterable[dict], barrier: np.ndarray) -> PairCounts:
    """Count the words and the adjacent pairs of phrase-able words of `documents`."""
    counts = PairCounts(Counter(), Counter())
    for document in documents:
        for words in sentence_words(document, barrier):
            counts.total_words += len(words)
            counts.words.update(w for w in words if w is not None)
            counts.pairs.update(
                (a, b) for a, b in pairwise(words) if a is not None and b is not None
            )
    return counts


def npmi(pair_count: int, first_count: int, second_count: int, total: int) -> float:
    """Normalized pointwise mutual information of two adjacent words, in [-1, 1]: 1 when they
    only occur together, 0 when independent. Counts in occurrences, `total` in words."""
    if pair_count >= total:
        return 1.0
    log_pair = math.log(pair_count / total)
    pmi = log_pair - math.log(first_count / total) - math.log(second_count / total)
    return max(-1.0, min(1.0, pmi / -log_pair))


def collocations(counts: PairCounts, settings: PhraseSettings) -> dict[Pair, float]:
    """Adjacent pairs seen at least `min_count` times with npmi >= `min_npmi`: their npmi."""
    scores = {}
    for (a, b), count in counts.pairs.items():
        if count >= settings.min_count:
            score = npmi(count, counts.words[a], counts.words[b], counts.total_words)
            if score >= settings.min_npmi:
                scores[(a, b)] = score
    return scores


def count_ngrams(
    documents: Iterable[dict], barrier: np.ndarray, pairs: dict[Pair, float], max_words: int
) -> Counter:
    """Occurrences of the n-grams of 3 to `max_words` words whose adjacent pairs are all in
    `pairs` (second pass)."""
    counts: Counter = Counter()
    for document in documents:
        for words in sentence_words(document, barrier):
            links = [(a, b) in pairs for a, b in pairwise(words)]
            for start in range(len(links)):
                stop = start
                while stop < len(links) and links[stop] and stop - start + 2 <= max_words:
                    stop += 1
                    if stop - start >= 2:
                        counts[tuple(words[start : stop + 1])] += 1
    return counts


def learn_phrases(
    documents: Callable[[], Iterable[dict]], barrier: np.ndarray, settings: PhraseSettings
) -> list[Phrase]:
    """The phrase lexicon of the documents that `documents()` yields (called twice), most
    frequent first (see the module docstring); at most `settings.max_phrases` entries."""
    first = count_pairs(documents(), barrier)
    pairs = collocations(first, settings)
    phrases = [Phrase(pair, first.pairs[pair], score) for pair, score in pairs.items()]
    del first
    if settings.max_words > 2 and pairs:
        for words, count in count_ngrams(documents(), barrier, pairs, settings.max_words).items():
            if count >= settings.min_count:
                score = min(pairs[(a, b)] for a, b in pairwise(words))
                phrases.append(Phrase(words, count, score))
    phrases.sort(key=lambda p: (-p.count, -p.score, p.token_ids, p.words))
    return phrases[: settings.max_phrases]


def phrase_text(phrase: Phrase, tokenizer: Tokenizer) -> str:
    """The phrase as text: its words separated by one space, `##` continuations joined."""
    return " ".join(
        "".join(
            token[2:] if k and token.startswith("##") else token
            for k, token in enumerate(tokenizer.id_to_token(i) for i in word)
        )
        for word in phrase.words
    )


def write_phrases(path: str | Path, phrases: list[Phrase], tokenizer: Tokenizer) -> Path:
    """Write the lexicon as UTF-8 text: a `#` header, then per phrase, in lexicon order,
    `<words separated by spaces>\\t<count>\\t<score, 4 decimals>`."""
    lines = ["# phrase\tcount\tnpmi (min over adjacent words); words are separated by spaces"]
    lines += [f"{phrase_text(p, tokenizer)}\t{p.count}\t{p.score:.4f}" for p in phrases]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
