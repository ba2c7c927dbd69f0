"""The `unigram` (ALBERT, SentencePiece-style) and `bytelevel_bpe` (GPT-2 / RoBERTa) tokenizer
kinds: special tokens, AutoTokenizer loading, determinism, word starts in shards, prepare."""

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import small_english_documents, write_text_corpus
from tokenizers import Tokenizer

from data_pipelines import cli
from data_pipelines.document_encoding import encode_sentences
from data_pipelines.prepare_config import (
    PrepareConfigError,
    TokenizerSettings,
    compose_prepare_config,
)
from data_pipelines.tokenizer import (
    SPECIAL_TOKENS,
    TokenizerError,
    copy_tokenizer,
    is_lowercase,
    save_tokenizer,
    train_tokenizer,
)
from pretrain.data.shard_format import load_manifest, read_documents
from pretrain.data.vocab import load_vocabulary

NEW_KINDS = ("unigram", "bytelevel_bpe")
WORD_MARK = {"unigram": "▁", "bytelevel_bpe": "Ġ"}
SENTENCES = [
    "Unbelievably, the interpreter's grammar isn't trivial.",
    "Zyxwv qqq! Crème brûlée costs 42 euros.",
    "The END of the line.",
]


@pytest.fixture(scope="module")
def trained() -> dict[tuple[str, bool], Tokenizer]:
    """Each new kind, lower-cased and cased, trained on 120 small documents."""
    documents = small_english_documents(120)
    return {
        (kind, lowercase): train_tokenizer(
            lambda: documents, vocab_size=600, lowercase=lowercase, min_frequency=2, kind=kind
        )
        for kind in NEW_KINDS
        for lowercase in (True, False)
    }


@pytest.mark.parametrize("kind", NEW_KINDS)
@pytest.mark.parametrize("lowercase", [True, False])
def test_special_tokens_autotokenizer_and_casing(trained, tmp_path, kind, lowercase):
    transformers = pytest.importorskip("transformers")
    tokenizer = trained[(kind, lowercase)]
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.get_vocab_size() <= 600
    assert is_lowercase(tokenizer) == lowercase
    save_tokenizer(tokenizer, tmp_path)
    assert not (tmp_path / "vocab.txt").exists()  # WordPiece only
    vocab = load_vocabulary(tmp_path)
    assert (vocab.pad, vocab.unk, vocab.cls, vocab.sep, vocab.mask) == (0, 1, 2, 3, 4)
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto.pad_token_id == 0 and auto.mask_token_id == 4 and auto.cls_token == "[CLS]"
    expected = tokenizer.encode(SENTENCES[0], SENTENCES[1])
    encoded = auto(SENTENCES[0], SENTENCES[1])
    assert encoded["input_ids"] == expected.ids
    assert encoded["input_ids"][0] == 2 and encoded["input_ids"][-1] == 3
    assert encoded["token_type_ids"] == expected.type_ids and 1 in expected.type_ids
    assert (auto.tokenize("The END") == auto.tokenize("the end")) == lowercase


def test_bytelevel_bpe_is_lossless_and_never_unknown(trained):
    tokenizer = trained[("bytelevel_bpe", False)]
    text = "Crème brûlée, 東京 and 🙂 emoji;  two  spaces."
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert 1 not in ids  # [UNK]: every byte is in the vocabulary
    assert tokenizer.decode(ids) == " " + text  # the prefix space is the only change


def test_unigram_normalizes_like_albert(trained):
    lower, cased = trained[("unigram", True)], trained[("unigram", False)]
    text = "``Crème  BRÛLÉE''"
    assert lower.normalizer.normalize_str(text) == '"creme brulee"'
    assert cased.normalizer.normalize_str(text) == '"Crème BRÛLÉE"'
    ids = lower.encode("The function returns a value.", add_special_tokens=False).ids
    assert lower.decode(ids) == "the function returns a value."


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_training_is_deterministic(trained, kind):
    again = train_tokenizer(
        lambda: small_english_documents(120), vocab_size=600, min_frequency=2, kind=kind
    )
    assert again.to_str() == trained[(kind, True)].to_str()


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_word_starts_are_marked_pieces(trained, kind):
    tokenizer = trained[(kind, False)]
    ids, sents, words = encode_sentences(tokenizer, SENTENCES, "uint16")
    tokens = [tokenizer.id_to_token(int(i)) for i in ids]
    marked = np.array([t.startswith(WORD_MARK[kind]) for t in tokens])
    assert marked.sum() > 10 and (~marked).sum() > 10  # many words span several tokens
    assert words[marked].all()  # every ▁ / Ġ token starts a word
    assert words[np.concatenate(([0], sents[:-1]))].all()
    if kind == "unigram":
        # SentencePiece words run from space to space: nothing else starts one.
        assert words.astype(bool).tolist() == marked.tolist()
        return
    # GPT-2's regex also starts a word at punctuation and contractions ("'s", "n't"), but
    # never inside a run of letters.
    unmarked_starts = [t for t, w, m in zip(tokens, words, marked, strict=True) if w and not m]
    assert unmarked_starts and all(not t[0].isalpha() or t in ("t", "s") for t in unmarked_starts)

    def kind_of(char: str) -> str:
        return "letter" if char.isalpha() else "digit" if char.isdigit() else "other"

    for i in np.flatnonzero(~words.astype(bool)):  # a run goes on, or a contraction's letters
        if not (tokens[i - 1] + tokens[i]).isascii():
            continue  # byte symbols of a multi-byte character
        assert kind_of(tokens[i - 1][-1]) == kind_of(tokens[i][0]) or tokens[i - 1] == "'"


def test_bytelevel_bpe_needs_room_for_the_bytes():
    with pytest.raises(TokenizerError, match="tokenizer.vocab_size=200"):
        train_tokenizer(lambda: ["a b c"], vocab_size=200, kind="bytelevel_bpe")
    with pytest.raises(PrepareConfigError, match="tokenizer.vocab_size"):
        TokenizerSettings(kind="bytelevel_bpe", vocab_size=261)
    with pytest.raises(PrepareConfigError, match="bytelevel_bpe"):
        TokenizerSettings(kind="sentencepiece")


def test_copy_tokenizer_writes_fast_companions(trained, tmp_path):
    tokenizer = trained[("unigram", True)]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    copy_tokenizer(tmp_path, tmp_path / "copy")
    config = json.loads((tmp_path / "copy/tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["do_lower_case"] is True and config["mask_token"] == "[MASK]"


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_pretrain_data_prepare_with_kind(tmp_path, kind, capsys):
    documents = small_english_documents(40)
    source = write_text_corpus(tmp_path / "corpus.txt", documents)
    out = tmp_path / "out"
    overrides = [
        f"inputs=[{source}]",
        f"out_dir={out}",
        f"tokenizer.kind={kind}",
        "tokenizer.vocab_size=500",
        "tokenizer.lowercase=false",
        "docs_per_shard=20",
        "num_proc=1",
    ]
    assert compose_prepare_config(overrides).tokenizer.kind == kind
    assert cli.main(["prepare", *overrides]) == 0, capsys.readouterr().err
    manifest = load_manifest(out)
    assert manifest.raw["tokenizer"]["lowercase"] is False
    assert manifest.raw["config"]["tokenizer"]["kind"] == kind
    tokenizer = Tokenizer.from_file(str(Path(out) / "tokenizer/tokenizer.json"))
    read = [d for path in manifest.shard_paths for d in read_documents(path)]
    assert len(read) == len(documents)
    for document in read[:10]:
        tokens = [tokenizer.id_to_token(int(i)) for i in document["ids"]]
        marked = np.array([t.startswith(WORD_MARK[kind]) for t in tokens])
        assert document["words"][marked].all()
        assert not document["words"].all()  # continuations are not word starts
        if kind == "unigram":
            assert document["words"].tolist() == marked.tolist()
        if kind == "bytelevel_bpe":
            text = unicodedata.normalize("NFC", tokenizer.decode(document["ids"].tolist()))
            assert text.split() == " ".join(documents[read.index(document)].split()).split()
