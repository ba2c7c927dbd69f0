"""The typed schema of `conf/prepare.yaml` and its composition with Hydra's compose API.

OmegaConf checks types while Hydra composes; building the dataclasses then runs the value
checks in `__post_init__`. Either way a bad value fails before any work, with an error that
names the key.
"""

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_pipelines.filter_settings import FILTERS, FilterSettings, FilterSettingsError
from data_pipelines.sources import UNDECODABLE_POLICIES
from data_pipelines.tokenizer import BYTE_ALPHABET_SIZE, SPECIAL_TOKENS, TOKENIZER_KINDS
from pretrain.paths import CONF_DIR

CONFIG_NAME = "prepare"
# Settings that change where and how fast a corpus is made, never what it holds.
RUN_ONLY_KEYS = ("out_dir", "overwrite", "num_proc")


class PrepareError(ValueError):
    """Preparing cannot go on; the message names the path or key and says what to do."""


class PrepareConfigError(ValueError):
    """A prepare setting is wrong; the message names the key and says what would be right."""


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise PrepareConfigError(f"{key} = {value!r}: {expected}")


SEGMENTERS = ("none", "jieba")


@dataclass
class TokenizerSettings:
    """Train a tokenizer (`vocab_size` in tokens, special tokens included), or use the one in
    `path`, trained on at most `train_megabytes` MB of the corpus's text, the first
    documents of each source in proportion to its size (None: all of it; see
    `data_pipelines.prepare.training_documents`). `kind`: `wordpiece` (BERT), `chinese` (Chinese BERT: every CJK character of the
    corpus is a whole token of the vocabulary, WordPiece for the rest), `unigram` (ALBERT:
    SentencePiece-style Unigram; `min_frequency` unused) or `bytelevel_bpe` (GPT-2 / RoBERTa /
    BART byte-level BPE; set lowercase=false for their cased vocabularies)."""

    path: str | None = None
    kind: str = "wordpiece"
    vocab_size: int = 8000
    lowercase: bool = True
    min_frequency: int = 2
    train_megabytes: float | None = 20.0

    def __post_init__(self) -> None:
        _check(
            self.train_megabytes is None or self.train_megabytes > 0,
            "tokenizer.train_megabytes",
            self.train_megabytes,
            "must be null (train on all the text) or more than 0 (MB of text)",
        )
        _check(
            self.kind in TOKENIZER_KINDS,
            "tokenizer.kind",
            self.kind,
            f"must be one of {', '.join(TOKENIZER_KINDS)}",
        )
        _check(
            len(SPECIAL_TOKENS) < self.vocab_size <= 2**32,
            "tokenizer.vocab_size",
            self.vocab_size,
            f"must be more than the {len(SPECIAL_TOKENS)} special tokens and at most 2**32",
        )
        if self.kind == "bytelevel_bpe":
            _check(
                self.vocab_size > len(SPECIAL_TOKENS) + BYTE_ALPHABET_SIZE,
                "tokenizer.vocab_size",
                self.vocab_size,
                f"bytelevel_bpe needs more than {len(SPECIAL_TOKENS) + BYTE_ALPHABET_SIZE} "
                "(special tokens and the 256 bytes); RoBERTa uses 50265",
            )
        _check(
            self.min_frequency >= 1,
            "tokenizer.min_frequency",
            self.min_frequency,
            "must be at least 1",
        )


@dataclass
class PhraseSettings:
    """ERNIE phrase annotations: a lexicon of word n-grams (2 to `max_words` words) seen at
    least `min_count` times whose adjacent words are associated with a normalized PMI of at
    least `min_npmi` (the minimum over adjacent pairs), the `max_phrases` most frequent."""

    enabled: bool = False
    min_count: int = 5
    min_npmi: float = 0.5
    max_words: int = 4
    max_phrases: int = 100_000

    def __post_init__(self) -> None:
        _check(self.min_count >= 1, "phrases.min_count", self.min_count, "must be at least 1")
        _check(
            -1.0 <= self.min_npmi <= 1.0,
            "phrases.min_npmi",
            self.min_npmi,
            "must be between -1 and 1 (normalized PMI; 0 = independent words)",
        )
        _check(
            2 <= self.max_words <= 8, "phrases.max_words", self.max_words, "must be 2 to 8 words"
        )
        _check(self.max_phrases >= 1, "phrases.max_phrases", self.max_phrases, "must be at least 1")


@dataclass
class EntitySettings:
    """ERNIE entity annotations: `path` names a UTF-8 file with one entity per line (none:
    no entity annotations)."""

    path: str | None = None


@dataclass
class PrepareConfig:
    """Everything `pretrain-data prepare` needs; `docs_per_shard` in documents,
    `tokens_per_block` in tokens (a shard's block closes after the document that reaches it),
    `num_proc` in processes (None: every core this process may use)."""

    # Files, directories (recursive), globs, or `builtin` (prose shipped with Python).
    inputs: list[str] = field(default_factory=lambda: ["builtin"])
    # JSONL, CSV/TSV, Parquet, Arrow, datasets dirs, tar .json: the field of a document's text.
    text_field: str = "text"
    # The column or field that holds each document's id (Parquet, Arrow, datasets, JSONL,
    # CSV/TSV): kept as the document's key in the shards and in the cleaning statistics.
    # None: keys made from the source name and the document's index.
    id_field: str | None = None
    # Cleaning steps, applied in this order (data_pipelines.cleaning): exact_dedup,
    # near_dedup, quality, language; their settings under `filter`.
    filters: list[str] = field(default_factory=list)
    filter: FilterSettings = field(default_factory=FilterSettings)
    # Lines that are not UTF-8 (or, in JSONL, not a JSON object): error | skip | replace
    # (data_pipelines.sources).
    undecodable: str = "error"
    out_dir: str = "data/builtin"  # must be empty or absent, unless overwrite=true
    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    segmenter: str = "none"  # none | jieba: word starts of Chinese text (Chinese BERT-wwm)
    phrases: PhraseSettings = field(default_factory=PhraseSettings)
    entities: EntitySettings = field(default_factory=EntitySettings)
    docs_per_shard: int = 1000
    tokens_per_block: int = 1 << 20
    num_proc: int | None = None
    # Replace a non-empty out_dir (the old one is removed only once the new one is complete).
    overwrite: bool = False

    def __post_init__(self) -> None:
        _check(
            len(self.inputs) > 0,
            "inputs",
            self.inputs,
            "must name at least one file, directory, glob or 'builtin'",
        )
        _check(
            all(isinstance(i, str) and i for i in self.inputs),
            "inputs",
            self.inputs,
            "must be non-empty strings",
        )
        _check(
            bool(self.text_field),
            "text_field",
            self.text_field,
            "must name the field (JSONL, CSV, Parquet, Arrow, tar .json) that holds the text",
        )
        _check(
            self.id_field is None or (isinstance(self.id_field, str) and bool(self.id_field)),
            "id_field",
            self.id_field,
            "must name the field (JSONL, CSV, Parquet, Arrow) that holds the document id, or be null",
        )
        _check(
            all(name in FILTERS for name in self.filters)
            and len(set(self.filters)) == len(self.filters),
            "filters",
            self.filters,
            f"must list each of {', '.join(FILTERS)} at most once",
        )
        _check(
            self.undecodable in UNDECODABLE_POLICIES,
            "undecodable",
            self.undecodable,
            f"must be one of {', '.join(UNDECODABLE_POLICIES)} (what to do with lines that "
            "are not UTF-8)",
        )
        _check(
            self.segmenter in SEGMENTERS,
            "segmenter",
            self.segmenter,
            f"must be one of {', '.join(SEGMENTERS)} (jieba: Chinese word segmentation)",
        )
        _check(bool(self.out_dir), "out_dir", self.out_dir, "must be a directory path")
        _check(
            self.docs_per_shard >= 1, "docs_per_shard", self.docs_per_shard, "must be at least 1"
        )
        _check(
            self.tokens_per_block >= 1,
            "tokens_per_block",
            self.tokens_per_block,
            "must be at least 1 (tokens; blocks of a few MB read fastest)",
        )
        _check(
            self.num_proc is None or self.num_proc >= 1,
            "num_proc",
            self.num_proc,
            "must be null (every core) or at least 1 (1: tokenize in this process)",
        )

    @property
    def annotates_spans(self) -> bool:
        """Whether shards get phrase/entity span annotations (`<block>.phrases.npy`)."""
        return self.phrases.enabled or bool(self.entities.path)

    def content_dict(self) -> dict:
        """The settings that determine the prepared data, as a plain dict (what the manifest
        records): everything but RUN_ONLY_KEYS."""
        settings = asdict(self)
        for key in RUN_ONLY_KEYS:
            settings.pop(key)
        if settings["undecodable"] == "error":  # nothing was dropped or replaced: as before
            settings.pop("undecodable")
        if settings["id_field"] is None:  # keys made up: recorded as before there were ids
            settings.pop("id_field")
        if not settings["filters"]:  # not cleaned: recorded as before there were filters
            settings.pop("filters")
            settings.pop("filter")
        return settings


def _check_known_keys(values: dict, schema: type, prefix: str = "") -> None:
    """Reject keys the schema lacks (a `+key=value` override would otherwise be dropped)."""
    known = {f.name: f.type for f in fields(schema)}
    for key, value in values.items():
        _check(key in known, f"{prefix}{key}", value, f"unknown key; known: {', '.join(known)}")
        if is_dataclass(known[key]) and isinstance(value, dict):
            _check_known_keys(value, known[key], f"{prefix}{key}.")


def register_schema() -> None:
    """Register PrepareConfig as `prepare_schema`, the first entry of prepare.yaml's defaults."""
    ConfigStore.instance().store(name="prepare_schema", node=PrepareConfig)


def compose_prepare_config(overrides: list[str] | None = None) -> PrepareConfig:
    """Compose `conf/prepare.yaml` with Hydra-style `overrides` (e.g. `out_dir=data/x`,
    `tokenizer.vocab_size=2000`, `inputs=[a.txt,b/]`) and validate it. Raises
    PrepareConfigError naming the key for a bad value or an unknown key."""
    register_schema()
    try:
        with initialize_config_dir(
            config_dir=str(CONF_DIR), version_base="1.3", job_name="prepare"
        ):
            cfg = compose(config_name=CONFIG_NAME, overrides=list(overrides or []))
        _check_known_keys(OmegaConf.to_container(cfg), PrepareConfig)
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except (PrepareConfigError, FilterSettingsError):
        raise
    except (HydraException, OmegaConfBaseException) as error:
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        raise PrepareConfigError(f"{CONF_DIR / (CONFIG_NAME + '.yaml')}: {error}{cause}") from error
