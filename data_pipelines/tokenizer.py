"""BERT's WordPiece tokenizer: train it with Hugging Face `tokenizers`, save it so that
`transformers.AutoTokenizer.from_pretrained(dir)` loads it, or take an existing one.

Two kinds, one pipeline: `wordpiece` (BERT) and `chinese` (Chinese BERT). Both isolate every
CJK character (BertNormalizer's `handle_chinese_chars`); `chinese` also puts every CJK
character of the corpus into the vocabulary as a whole token, however rare (`wordpiece`
keeps only the `limit_alphabet` most frequent characters, the rest become [UNK]).

A saved directory holds `tokenizer.json` (the whole pipeline; its sha256 identifies the
tokenizer in shard manifests), `tokenizer_config.json`, `special_tokens_map.json` and
`vocab.txt` (one token per line, in id order).
"""

import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from data_pipelines.chinese import is_cjk_char
from pretrain.data.shards import file_sha256

# In id order: [PAD] is 0, as BERT's embeddings and attention masks assume.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_KINDS = ("wordpiece", "chinese")


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


def training_alphabet(
    texts: Iterable[str], tokenizer: Tokenizer, limit: int, all_cjk: bool = False
) -> tuple[list[str], list[str]]:
    """The characters training will use, from one pass over `texts` through the tokenizer's
    normalizer: (alphabet, the `limit` most frequent non-space characters, ties broken by code
    point, plus with `all_cjk` every CJK character seen; continuations, those of them that can
    continue a word, i.e. are neither punctuation nor CJK for the pre-tokenizer), both
    sorted."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(tokenizer.normalizer.normalize_str(text))
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
    """Train a WordPiece vocabulary of at most `vocab_size` tokens (special tokens included)
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


def is_lowercase(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's normalizer lower-cases (read from its JSON form)."""
    normalizer = json.loads(tokenizer.to_str()).get("normalizer") or {}
    return bool(normalizer.get("lowercase", False))


def _write_companions(tokenizer: Tokenizer, out_dir: Path) -> None:
    """tokenizer_config.json, special_tokens_map.json and vocab.txt for `transformers`."""
    lowercase = is_lowercase(tokenizer)
    special = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
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
    companions = ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
    if all((Path(src_dir) / name).is_file() for name in companions):
        for name in companions:
            shutil.copyfile(Path(src_dir) / name, out_dir / name)
    else:
        _write_companions(tokenizer, out_dir)
    return tokenizer


def tokenizer_sha256(tokenizer_dir: str | Path) -> str:
    """Hex sha256 of the bytes of `tokenizer_dir/tokenizer.json`: the tokenizer's identity."""
    return file_sha256(Path(tokenizer_dir) / TOKENIZER_FILE)
