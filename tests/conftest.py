"""Shared fixtures: a small prepared corpus that every data and training test can read."""

from pathlib import Path

import pytest

from data_pipelines.builtin_corpus import pydoc_topic_documents
from data_pipelines.config import PrepareConfig, TokenizerSettings
from data_pipelines.prepare import prepare

SMALL_CORPUS_DOCUMENTS = 300
SMALL_CORPUS_DOCS_PER_SHARD = 50
SMALL_CORPUS_VOCAB_SIZE = 1500


def small_english_documents(count: int = SMALL_CORPUS_DOCUMENTS) -> list[str]:
    """`count` short English documents (1 to 7 paragraphs, a few sentences each) cut from the
    help topics that ship with Python; deterministic, no download."""
    paragraphs = [line for _, text in pydoc_topic_documents() for line in text.split("\n")]
    documents, start = [], 0
    while len(documents) < count and start < len(paragraphs):
        size = 1 + len(documents) % 7
        documents.append("\n".join(paragraphs[start : start + size]))
        start += size
    assert len(documents) == count, "the help topics give fewer documents than asked for"
    return documents


def write_text_corpus(path: Path, documents: list[str]) -> Path:
    """Write `documents` as a plain text input (documents separated by blank lines)."""
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def prepare_small_corpus(root: Path, **settings) -> Path:
    """Prepare the small corpus under `root` (tokenized in this process); returns its shards dir."""
    source = write_text_corpus(root / "corpus.txt", small_english_documents())
    tokenizer = TokenizerSettings(
        vocab_size=SMALL_CORPUS_VOCAB_SIZE, lowercase=True, min_frequency=2
    )
    config = PrepareConfig(
        inputs=[str(source)],
        out_dir=str(root / "shards"),
        tokenizer=tokenizer,
        docs_per_shard=SMALL_CORPUS_DOCS_PER_SHARD,
        workers=1,
    )
    for key, value in settings.items():
        setattr(config, key, value)
    return prepare(config, progress=False)


@pytest.fixture(scope="session")
def prepared_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards dir of a prepared corpus: 300 short English documents (about 200 kB, Python's
    help topics) in 6 shards of 50, lower-cased WordPiece vocabulary of at most 1500 tokens,
    tokenizer in `<dir>/tokenizer`. Made once per session, in a couple of seconds. Read-only:
    copy it before changing anything."""
    return prepare_small_corpus(tmp_path_factory.mktemp("prepared_corpus"))
