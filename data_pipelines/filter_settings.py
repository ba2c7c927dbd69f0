"""The typed settings of prepare's cleaning filters (`filters=[...]`, `filter.<name>.<key>`).

Each filter is one step, applied in the order `filters` lists them (see
`data_pipelines.cleaning`): `exact_dedup`, `near_dedup`, `quality`, `language`. Values are
checked when the config is composed, with the key's name in the error.
"""

from dataclasses import dataclass, field
from typing import Any

FILTERS = ("exact_dedup", "near_dedup", "quality", "language")


class FilterSettingsError(ValueError):
    """A filter setting is wrong; the message names the key and what would be right."""


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise FilterSettingsError(f"filter.{key} = {value!r}: {expected}")


@dataclass
class NearDedupSettings:
    """MinHash LSH over word `ngram`-grams (lower-cased): a document whose estimated Jaccard
    similarity to an earlier kept one reaches `threshold` is removed. `num_perm` hash
    functions (more: a sharper threshold, slower), split into LSH bands as datasketch
    chooses for the threshold; `seed` fixes the hash functions."""

    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 5
    seed: int = 1

    def __post_init__(self) -> None:
        _check(0 < self.threshold < 1, "near_dedup.threshold", self.threshold, "must be in (0, 1)")
        _check(16 <= self.num_perm <= 1024, "near_dedup.num_perm", self.num_perm, "16 to 1024")
        _check(1 <= self.ngram <= 20, "near_dedup.ngram", self.ngram, "must be 1 to 20 words")


@dataclass
class QualitySettings:
    """Gopher (Rae et al. 2021, appendix A) and C4 (Raffel et al. 2020) document rules, their
    published values as defaults. Counts in words (whitespace-separated), lengths in
    characters, fractions in [0, 1]; a document failing any rule is removed (the first
    failing rule is counted)."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1  # "#" and "..." per word
    max_digit_fraction: float = 0.25  # digits among non-space characters
    max_bullet_lines: float = 0.9  # lines starting with a bullet
    max_ellipsis_lines: float = 0.3  # lines ending with "..." or "…"
    min_alpha_words: float = 0.8  # words with an alphabetic character
    min_stop_words: int = 2  # of the, be, to, of, and, that, have, with
    max_duplicate_lines: float = 0.3  # lines equal to an earlier line
    max_duplicate_line_chars: float = 0.2  # characters in such lines
    # most frequent n-gram's characters / all word characters, for n = 2, 3, 4
    max_top_ngram_chars: list[float] = field(default_factory=lambda: [0.2, 0.18, 0.16])
    # characters in n-grams seen before / all word characters, for n = 5 ... 10
    max_duplicate_ngram_chars: list[float] = field(
        default_factory=lambda: [0.15, 0.14, 0.13, 0.12, 0.11, 0.10]
    )
    c4_bad_phrases: bool = True  # C4: "lorem ipsum" and "{" (code) remove a page

    def __post_init__(self) -> None:
        _check(self.min_words >= 0, "quality.min_words", self.min_words, "must be at least 0")
        _check(
            self.max_words >= self.min_words,
            "quality.max_words",
            self.max_words,
            "must be at least quality.min_words",
        )
        fractions = {
            "max_digit_fraction": self.max_digit_fraction,
            "max_bullet_lines": self.max_bullet_lines,
            "max_ellipsis_lines": self.max_ellipsis_lines,
            "min_alpha_words": self.min_alpha_words,
            "max_duplicate_lines": self.max_duplicate_lines,
            "max_duplicate_line_chars": self.max_duplicate_line_chars,
        }
        for key, value in fractions.items():
            _check(0 <= value <= 1, f"quality.{key}", value, "must be a fraction in [0, 1]")
        _check(
            len(self.max_top_ngram_chars) == 3,
            "quality.max_top_ngram_chars",
            self.max_top_ngram_chars,
            "must list 3 fractions (2-, 3- and 4-grams)",
        )
        _check(
            len(self.max_duplicate_ngram_chars) == 6,
            "quality.max_duplicate_ngram_chars",
            self.max_duplicate_ngram_chars,
            "must list 6 fractions (5- to 10-grams)",
        )


@dataclass
class LanguageSettings:
    """Language identification by py3langid (langid.py's model, shipped inside the package):
    a document is kept when its most probable language is in `languages` (ISO 639-1 codes)
    with a probability of at least `min_probability`. The first `max_chars` characters are
    classified."""

    languages: list[str] = field(default_factory=lambda: ["en"])
    min_probability: float = 0.5
    max_chars: int = 5000

    def __post_init__(self) -> None:
        _check(bool(self.languages), "language.languages", self.languages, "name at least one")
        _check(
            0 <= self.min_probability <= 1,
            "language.min_probability",
            self.min_probability,
            "must be in [0, 1]",
        )
        _check(self.max_chars >= 1, "language.max_chars", self.max_chars, "must be at least 1")


@dataclass
class FilterSettings:
    """The settings of every filter; only those named in `filters` are used."""

    near_dedup: NearDedupSettings = field(default_factory=NearDedupSettings)
    quality: QualitySettings = field(default_factory=QualitySettings)
    language: LanguageSettings = field(default_factory=LanguageSettings)
