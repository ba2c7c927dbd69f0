"""Chinese text: which characters are CJK, and word starts from `jieba` word segmentation.

BERT's normalizer (`handle_chinese_chars`) puts spaces around every CJK character, so each is
its own token; Chinese BERT-wwm (Cui et al., 2019) masks whole *words* all the same, and
the words come from a segmenter. Here the segmenter is `jieba` (its dictionary ships with it,
no download), run on each sentence at preparation time: a token whose first character is
CJK starts a word iff that character starts a jieba word; every other token keeps the word
start the tokenizer gives it (so English inside Chinese text is split as usual; a jieba word
that mixes scripts, "T恤", is one word when its CJK part follows the Latin part).
"""

import logging
from collections.abc import Sequence

import numpy as np

# The code points BERT's normalizer treats as Chinese characters (tokenizers'
# `is_chinese_char`): CJK Unified Ideographs, extensions A to F, compatibility ideographs.
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk_char(char: str) -> bool:
    """Whether `char` (one character) is one that BERT's normalizer makes its own token."""
    code = ord(char)
    return any(low <= code <= high for low, high in CJK_RANGES)


class JiebaSegmenter:
    """Chinese word segmentation with jieba's default dictionary and HMM for unknown words.

    Its own `jieba.Tokenizer` (not jieba's global one), initialised when made, with jieba's
    logging turned down to warnings: the same text gives the same words in every process."""

    name = "jieba"

    def __init__(self) -> None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        self.version = jieba.__version__
        self._tokenizer = jieba.Tokenizer()
        self._tokenizer.initialize()

    def words(self, sentence: str) -> list[str]:
        """The words of `sentence`, in order; joined they give `sentence` back."""
        return list(self._tokenizer.cut(sentence, HMM=True))

    def word_start_chars(self, sentence: str) -> set[int]:
        """Character offsets (into `sentence`) at which a word starts."""
        starts, offset = set(), 0
        for word in self.words(sentence):
            starts.add(offset)
            offset += len(word)
        return starts


def segmented_word_starts(
    sentence: str,
    offsets: Sequence[tuple[int, int]],
    token_starts: np.ndarray,
    segmenter: JiebaSegmenter,
) -> np.ndarray:
    """Word-start flags (n,) uint8 of the n tokens of one sentence: a token whose first
    character is CJK starts a word iff the segmenter starts a word there; other tokens keep
    `token_starts` (n,), the tokenizer's own flags. `offsets` are the tokens' (start, end)
    character offsets into `sentence`. The first token always starts a word."""
    starts = segmenter.word_start_chars(sentence)
    flags = np.asarray(token_starts, dtype=np.uint8).copy()
    for index, (start, end) in enumerate(offsets):
        if end > start and is_cjk_char(sentence[start]):
            flags[index] = start in starts
    if len(flags):
        flags[0] = 1
    return flags


def make_segmenter(name: str) -> JiebaSegmenter | None:
    """The segmenter that the `segmenter` setting names (`none` gives None)."""
    if name == "none":
        return None
    if name == JiebaSegmenter.name:
        return JiebaSegmenter()
    raise ValueError(f"segmenter={name!r}: unknown; one of none, jieba")
