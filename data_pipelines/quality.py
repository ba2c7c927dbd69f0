"""Document quality rules of Gopher (Rae et al. 2021, appendix A) and C4 (Raffel et al. 2020).

`quality_failure(text, settings)` names the first rule a normalized document fails, or None.
The rules, in the order they are checked (the settings in `QualitySettings`):

- `words`: fewer than `min_words` or more than `max_words` words (split at whitespace);
- `mean_word_length`: mean word length outside [`min_mean_word_length`, `max_mean_word_length`];
- `symbols`: more than `max_symbol_word_ratio` "#" or "..."/"…" per word;
- `digits`: more than `max_digit_fraction` of the non-space characters are digits;
- `bullet_lines`, `ellipsis_lines`: more than the fraction of lines start with a bullet /
  end with an ellipsis;
- `alpha_words`: fewer than `min_alpha_words` of the words hold an alphabetic character;
- `stop_words`: fewer than `min_stop_words` of Gopher's eight English stop words;
- `duplicate_lines`, `duplicate_line_chars`: the fraction of lines (of characters in lines)
  that repeat an earlier line exceeds its limit;
- `top_ngram`: the most frequent word 2-, 3- or 4-gram covers more of the word characters
  than its limit;
- `duplicate_ngrams`: word 5- to 10-grams that occurred before cover more of the word
  characters than their limits;
- `c4_bad_phrases`: "lorem ipsum" or a curly brace (C4 drops such pages as placeholder text
  or code).
"""

from collections import Counter

from data_pipelines.filter_settings import QualitySettings

STOP_WORDS = frozenset(("the", "be", "to", "of", "and", "that", "have", "with"))
BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "◦", "‣", "–", "-", "*", "·")
ELLIPSES = ("...", "…")


def _duplicate_ngram_chars(words: list[str], n: int) -> int:
    """Characters of the words in n-grams that occurred earlier in `words` (each word
    counted once, as Gopher does)."""
    seen: set[tuple[str, ...]] = set()
    covered = bytearray(len(words))
    for i in range(len(words) - n + 1):
        gram = tuple(words[i : i + n])
        if gram in seen:
            covered[i : i + n] = b"\x01" * n
        else:
            seen.add(gram)
    return sum(len(w) for w, c in zip(words, covered, strict=True) if c)


def _top_ngram_chars(words: list[str], n: int) -> int:
    """Characters in all occurrences of the most frequent word n-gram."""
    if len(words) < n:
        return 0
    counts = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    gram, count = max(counts.items(), key=lambda item: (item[1], item[0]))
    return count * sum(len(w) for w in gram) if count > 1 else 0


def _line_rules(lines: list[str], settings: QualitySettings) -> str | None:
    if sum(line.lstrip().startswith(BULLETS) for line in lines) > settings.max_bullet_lines * len(
        lines
    ):
        return "bullet_lines"
    if sum(line.rstrip().endswith(ELLIPSES) for line in lines) > settings.max_ellipsis_lines * len(
        lines
    ):
        return "ellipsis_lines"
    return None


def _repetition_rules(lines: list[str], words: list[str], settings: QualitySettings) -> str | None:
    seen: set[str] = set()
    duplicate_lines = duplicate_chars = 0
    for line in lines:
        if line in seen:
            duplicate_lines += 1
            duplicate_chars += len(line)
        seen.add(line)
    if duplicate_lines > settings.max_duplicate_lines * len(lines):
        return "duplicate_lines"
    if duplicate_chars > settings.max_duplicate_line_chars * sum(len(line) for line in lines):
        return "duplicate_line_chars"
    lowered = [w.lower() for w in words]
    word_chars = sum(len(w) for w in lowered) or 1
    for n, limit in zip((2, 3, 4), settings.max_top_ngram_chars, strict=True):
        if _top_ngram_chars(lowered, n) > limit * word_chars:
            return "top_ngram"
    for n, limit in zip(range(5, 11), settings.max_duplicate_ngram_chars, strict=True):
        if _duplicate_ngram_chars(lowered, n) > limit * word_chars:
            return "duplicate_ngrams"
    return None


def quality_failure(text: str, settings: QualitySettings) -> str | None:
    """The name of the first rule (module docstring) that the normalized document `text`
    fails, or None when it passes them all."""
    words = text.split()
    if not settings.min_words <= len(words) <= settings.max_words:
        return "words"
    mean_length = sum(len(w) for w in words) / max(1, len(words))
    if not settings.min_mean_word_length <= mean_length <= settings.max_mean_word_length:
        return "mean_word_length"
    symbols = text.count("#") + text.count("...") + text.count("…")
    if symbols > settings.max_symbol_word_ratio * len(words):
        return "symbols"
    visible = len(text) - text.count(" ") - text.count("\n")
    if sum(c.isdigit() for c in text) > settings.max_digit_fraction * max(1, visible):
        return "digits"
    lines = text.split("\n")
    failure = _line_rules(lines, settings)
    if failure:
        return failure
    if sum(any(c.isalpha() for c in w) for w in words) < settings.min_alpha_words * len(words):
        return "alpha_words"
    if sum(w.lower().strip(".,;:!?\"'()") in STOP_WORDS for w in words) < settings.min_stop_words:
        return "stop_words"
    failure = _repetition_rules(lines, words, settings)
    if failure:
        return failure
    if settings.c4_bad_phrases and ("{" in text or "lorem ipsum" in text.lower()):
        return "c4_bad_phrases"
    return None
