"""The tokenizers of the BERT family: train one with Hugging Face `tokenizers`, save it so
that `transformers.AutoTokenizer.from_pretrained(dir)` loads it, or take an existing one.

Four kinds:
- `wordpiece` (BERT) and `chinese` (Chinese BERT): one WordPiece pipeline. Both isolate
  every CJK character (BertNormalizer's `handle_chinese_chars`); `chinese` also puts every
  CJK character of the corpus into the vocabulary as a whole token, however rare
  (`wordpiece` keeps only the `limit_alphabet` most frequent characters, the rest [UNK]).
- `unigram` (ALBERT, SentencePiece-style): NFKC (+ lower-casing and accent stripping when
  `lowercase`), Metaspace pre-tokenizer (`▁` marks a word start; words are split at
  spaces only, so punctuation belongs to its word), Unigram language model.
- `bytelevel_bpe` (GPT-2 / RoBERTa / BART style): ByteLevel pre-tokenizer (GPT-2's split
  into words, numbers, punctuation runs and contractions; `Ġ` marks a preceding space; a
  space is prefixed to every text, so a sentence's first word is tokenized as elsewhere)
  and decoder, BPE over the 256 bytes: never [UNK]. Cased unless `lowercase`.

Every kind has the special tokens [PAD]=0, [UNK], [CLS], [SEP], [MASK] (ids 0-4) and adds
`[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` when asked for special tokens. A token starts a word
(shard word-start flags) when it begins a pre-tokenizer word: see
`data_pipelines.document_encoding.encode_sentences`.

A saved directory holds `tokenizer.json` (the whole pipeline; its sha256 identifies the
tokenizer in shard manifests), `tokenizer_config.json`, `special_tokens_map.json` and, for
WordPiece, `vocab.txt` (one token per line, in id order).
"""

import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from data_pipelines.chinese import is_cjk_char
from pretrain.data.shard_format import file_sha256

# In id order: [PAD] is 0, as BERT's embeddings and attention masks assume.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_KINDS = ("wordpiece", "chinese", "unigram", "bytelevel_bpe")
BYTE_ALPHABET_SIZE = 256  # bytelevel_bpe: every byte is a token of the vocabulary
# Unigram scores are log-probabilities summed in a thread-dependent order; rounding them to
# this many decimals makes the same texts give the same tokenizer.json, byte for byte.
UNIGRAM_SCORE_DECIMALS = 8
UNIGRAM_REQUIRED_STEP = 0.0001


class TokenizerError(ValueError):
    """A tokenizer directory is missing or unusable; the message names it."""


def build_tokenizer(lowercase: bool = True) -> Tokenizer:
    """An untrained BERT WordPiece pipeline: BertNormalizer (lower-casing and accent stripping
    when `lowercase`), BertPreTokenizer, WordPiece model and decoder (`##` continuations)."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _add_post_processor(tokenizer: Tokenizer) -> None:
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )


def normalized_counts(raw: Counter[str], tokenizer: Tokenizer) -> Counter[str]:
    """How often each character occurs in the normalized text, from how often each occurs in
    the raw text (`raw`): BertNormalizer (control characters removed, whitespace made a space,
    CJK characters spaced, NFD and accents stripped, lower-casing) and the other kinds'
    normalizers act on each character alone, so normalizing each distinct character once and
    weighting it by its count gives the counts of normalizing all the text."""
    counts: Counter[str] = Counter()
    for char, count in raw.items():
        for normalized in tokenizer.normalizer.normalize_str(char):
            counts[normalized] += count
    return counts


def training_alphabet(
    texts: Iterable[str], tokenizer: Tokenizer, limit: int, all_cjk: bool = False
) -> tuple[list[str], list[str]]:
    """The characters training will use, from one pass over `texts` (counted, then normalized
    a distinct character at a time: `normalized_counts`): (alphabet, the `limit` most frequent non-space characters, ties broken by code
    point, plus with `all_cjk` every CJK character seen; continuations, those of them that can
    continue a word, i.e. are neither punctuation nor CJK for the pre-tokenizer), both
    sorted."""
    raw: Counter[str] = Counter()
    for text in texts:  # counted as read; the normalizer then sees each character once
        raw.update(text)
    counts = normalized_counts(raw, tokenizer)
    visible = [(c, n) for c, n in counts.items() if tokenizer.pre_tokenizer.pre_tokenize_str(c)]
    if all_cjk:
        cjk = [c for c, _ in visible if is_cjk_char(c)]
        visible = [(c, n) for c, n in visible if not is_cjk_char(c)]
    ranked = sorted(visible, key=lambda item: (-item[1], item[0]))[:limit]
    alphabet = sorted([c for c, _ in ranked] + (cjk if all_cjk else []))

    def continues_word(char: str) -> bool:
        probe = tokenizer.normalizer.normalize_str("a" + char)
        return len(tokenizer.pre_tokenizer.pre_tokenize_str(probe)) == 1

    return alphabet, [c for c in alphabet if continues_word(c)]


def train_tokenizer(
    texts: Callable[[], Iterable[str]],
    vocab_size: int,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = False,
    kind: str = "wordpiece",
) -> Tokenizer:
    """Train a tokenizer of the `kind` named (see the module docstring); WordPiece kinds:
    train a WordPiece vocabulary of at most `vocab_size` tokens (special tokens included)
    on the texts (sentences or documents) that `texts()` yields; it is called twice. Pairs
    seen fewer than `min_frequency` times are not merged; the alphabet keeps the
    `limit_alphabet` most frequent characters, and with `kind="chinese"` every CJK
    character besides (TokenizerError if they do not fit in `vocab_size`). Special tokens get
    ids 0-4 in the order of SPECIAL_TOKENS. The same texts give the same tokenizer, byte for
    byte.

    Determinism: `tokenizers` (<= 0.23) creates the `##c` continuation tokens in hash-map
    order, so ids and tie-broken merges change from run to run (huggingface/tokenizers#1794).
    Here every `##c` and the alphabet are fixed beforehand from a first pass over the texts:
    the `##c` enter training as extra special tokens (ids in sorted order) and are then turned
    back into ordinary vocabulary entries."""
    if kind not in TOKENIZER_KINDS:
        raise TokenizerError(f"tokenizer.kind={kind!r}: one of {', '.join(TOKENIZER_KINDS)}")
    if kind == "unigram":
        return train_unigram_tokenizer(texts, vocab_size, lowercase, show_progress)
    if kind == "bytelevel_bpe":
        return train_bytelevel_bpe_tokenizer(
            texts, vocab_size, lowercase, min_frequency, show_progress
        )
    tokenizer = build_tokenizer(lowercase)
    alphabet, continuations = training_alphabet(
        texts(), tokenizer, limit_alphabet, all_cjk=kind == "chinese"
    )
    pinned = [f"##{c}" for c in continuations]
    needed = len(SPECIAL_TOKENS) + len(alphabet) + len(pinned)
    if kind == "chinese" and needed > vocab_size:
        raise TokenizerError(
            f"tokenizer.vocab_size={vocab_size}: the corpus has "
            f"{sum(map(is_cjk_char, alphabet))} distinct CJK characters, which with the other "
            f"characters and their ## forms need {needed} tokens; raise tokenizer.vocab_size "
            "(Chinese BERT: 21128)"
        )
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *pinned],
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    state = json.loads(tokenizer.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    tokenizer = Tokenizer.from_str(json.dumps(state))
    _add_post_processor(tokenizer)
    return tokenizer


def build_unigram_tokenizer(lowercase: bool = True) -> Tokenizer:
    """An untrained SentencePiece-style pipeline as ALBERT's: `` and '' become ", NFKC, with
    `lowercase` lower-casing and accent stripping, runs of spaces collapsed; Metaspace
    pre-tokenizer and decoder (`▁` prefixed to every word); Unigram model."""
    steps = [
        normalizers.Replace("``", '"'),
        normalizers.Replace("''", '"'),
        normalizers.NFKC(),
    ]
    if lowercase:
        steps += [normalizers.Lowercase(), normalizers.NFKD(), normalizers.StripAccents()]
    steps.append(normalizers.Replace(Regex(r"\s+"), " "))
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="always", split=True
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return tokenizer


def _canonical_unigram_vocab(vocab: list[list]) -> list[list]:
    """The trained [piece, score] list made independent of thread and hash order: scores
    rounded to UNIGRAM_SCORE_DECIMALS, pieces of equal score sorted by code point, and the
    characters the trainer appends last (made-up scores falling by UNIGRAM_REQUIRED_STEP, in
    hash-set order) sorted by code point, each taking the score of its new place."""
    special, rounded = vocab[: len(SPECIAL_TOKENS)], vocab[len(SPECIAL_TOKENS) :]
    rounded = [[piece, round(score, UNIGRAM_SCORE_DECIMALS)] for piece, score in rounded]
    start = len(rounded) - 1
    while start > 0 and len(rounded[start - 1][0]) == len(rounded[start][0]) == 1:
        if round(rounded[start - 1][1] - rounded[start][1], 6) not in (0.0, UNIGRAM_REQUIRED_STEP):
            break
        start -= 1
    head = sorted(rounded[:start], key=lambda item: (-item[1], item[0]))
    tail = sorted(piece for piece, _ in rounded[start:])
    scores = [score for _, score in rounded[start:]]
    return special + head + [[p, score] for p, score in zip(tail, scores, strict=True)]


def train_unigram_tokenizer(
    texts: Callable[[], Iterable[str]],
    vocab_size: int,
    lowercase: bool = True,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a Unigram (SentencePiece-style) vocabulary of `vocab_size` tokens (special
    tokens included, ids 0-4) on the texts `texts()` yields. Piece scores are rounded to
    UNIGRAM_SCORE_DECIMALS decimals, so the same texts give the same tokenizer byte for byte."""
    tokenizer = build_unigram_tokenizer(lowercase)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        unk_token="[UNK]",
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    state = json.loads(tokenizer.to_str())
    state["model"]["vocab"] = _canonical_unigram_vocab(state["model"]["vocab"])
    tokenizer = Tokenizer.from_str(json.dumps(state))
    _add_post_processor(tokenizer)
    return tokenizer


def build_bytelevel_bpe_tokenizer(lowercase: bool = False) -> Tokenizer:
    """An untrained GPT-2 style pipeline: (Lowercase when `lowercase`), ByteLevel
    pre-tokenizer with a prefix space and GPT-2's split regex, BPE model, ByteLevel decoder."""
    tokenizer = Tokenizer(models.BPE())
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_bytelevel_bpe_tokenizer(
    texts: Callable[[], Iterable[str]],
    vocab_size: int,
    lowercase: bool = False,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a byte-level BPE vocabulary of at most `vocab_size` tokens: the special tokens
    (ids 0-4), the 256 byte symbols, then merges of pairs seen at least `min_frequency`
    times. TokenizerError if `vocab_size` leaves no room for a merge. Deterministic."""
    needed = len(SPECIAL_TOKENS) + BYTE_ALPHABET_SIZE
    if vocab_size <= needed:
        raise TokenizerError(
            f"tokenizer.vocab_size={vocab_size}: bytelevel_bpe needs more than {needed} tokens "
            f"(the {len(SPECIAL_TOKENS)} special tokens and the {BYTE_ALPHABET_SIZE} bytes); "
            "GPT-2 and RoBERTa use 50265"
        )
    tokenizer = build_bytelevel_bpe_tokenizer(lowercase)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    _add_post_processor(tokenizer)
    return tokenizer


def is_lowercase(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's normalizer lower-cases (read from its JSON form)."""
    normalizer = json.loads(tokenizer.to_str()).get("normalizer") or {}
    if normalizer.get("type") == "Sequence":
        return any(n.get("type") == "Lowercase" for n in normalizer.get("normalizers", []))
    return normalizer.get("type") == "Lowercase" or bool(normalizer.get("lowercase", False))


def model_type(tokenizer: Tokenizer) -> str:
    """The tokenizer's model: "WordPiece", "Unigram" or "BPE" (read from its JSON form)."""
    return json.loads(tokenizer.to_str())["model"]["type"]


SPECIAL_TOKENS_MAP = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def _companion_names(tokenizer: Tokenizer) -> tuple[str, ...]:
    names = ("tokenizer_config.json", "special_tokens_map.json")
    return (*names, "vocab.txt") if model_type(tokenizer) == "WordPiece" else names


def _write_companions(tokenizer: Tokenizer, out_dir: Path) -> None:
    """tokenizer_config.json and special_tokens_map.json for `transformers` (+ vocab.txt for
    WordPiece, whose config names BertTokenizer; the other kinds load as
    PreTrainedTokenizerFast from tokenizer.json)."""
    lowercase = is_lowercase(tokenizer)
    special = dict(SPECIAL_TOKENS_MAP)
    if model_type(tokenizer) != "WordPiece":
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
            "do_lower_case": lowercase,
            "model_max_length": 512,
            "clean_up_tokenization_spaces": False,
            **special,
        }
        (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
        return
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    (out_dir / "vocab.txt").write_text(
        "".join(token + "\n" for token, _ in vocab), encoding="utf-8"
    )


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path) -> Path:
    """Write `tokenizer` and its `transformers` companion files into `out_dir` (created)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / TOKENIZER_FILE), pretty=True)
    _write_companions(tokenizer, out_dir)
    return out_dir


def load_tokenizer(tokenizer_dir: str | Path) -> Tokenizer:
    """The tokenizer in `tokenizer_dir`; TokenizerError if `tokenizer.json` is missing or lacks
    one of BERT's special tokens."""
    path = Path(tokenizer_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerError(
            f"{path}: not found; tokenizer.path must be a directory holding "
            f"{TOKENIZER_FILE} (e.g. the tokenizer/ of a prepared corpus)"
        )
    tokenizer = Tokenizer.from_file(str(path))
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        raise TokenizerError(
            f"{path}: lacks the special tokens {missing}; train a BERT WordPiece "
            "tokenizer instead (tokenizer.path=null)"
        )
    return tokenizer


def copy_tokenizer(src_dir: str | Path, out_dir: str | Path) -> Tokenizer:
    """Copy an existing tokenizer directory into `out_dir`, `tokenizer.json` byte for byte (so
    its sha256 is kept); companion files missing there are written. Returns the tokenizer."""
    tokenizer = load_tokenizer(src_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(src_dir) / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    companions = _companion_names(tokenizer)
    if all((Path(src_dir) / name).is_file() for name in companions):
        for name in companions:
            shutil.copyfile(Path(src_dir) / name, out_dir / name)
    else:
        _write_companions(tokenizer, out_dir)
    return tokenizer


def tokenizer_sha256(tokenizer_dir: str | Path) -> str:
    """Hex sha256 of the bytes of `tokenizer_dir/tokenizer.json`: the tokenizer's identity."""
    return file_sha256(Path(tokenizer_dir) / TOKENIZER_FILE)
