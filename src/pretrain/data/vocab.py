"""The special-token ids a pipeline needs, read from a saved tokenizer directory."""

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


@dataclass(frozen=True)
class Vocabulary:
    """Vocabulary size and the ids of the special tokens."""

    size: int
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


def load_vocabulary(tokenizer_dir: str | Path) -> Vocabulary:
    """Read `tokenizer.json` in `tokenizer_dir`; raise ValueError naming the file when it is
    missing or lacks one of BERT's special tokens."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(
            f"{path}: no tokenizer.json; point data.tokenizer_dir at a directory made by `pretrain-data prepare`"
        )
    tokenizer = Tokenizer.from_file(str(path))
    ids = {name: tokenizer.token_to_id(token) for name, token in SPECIAL_TOKENS.items()}
    missing = [SPECIAL_TOKENS[n] for n, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"{path}: the tokenizer lacks the special tokens {missing}")
    return Vocabulary(size=tokenizer.get_vocab_size(), **ids)
