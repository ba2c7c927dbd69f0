"""Chinese preparation: character tokens, jieba word starts, sentence splitting, determinism."""

import functools
import logging
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import CHINESE_PROSE, prepare_chinese_corpus, small_english_documents
from tokenizers import Tokenizer, normalizers

from data_pipelines.chinese import CJK_RANGES, JiebaSegmenter, is_cjk_char
from data_pipelines.document_encoding import encode_sentences
from data_pipelines.text import normalize, split_sentences
from data_pipelines.tokenizer import TokenizerError, train_tokenizer
from pretrain.data.shard_format import load_manifest, read_documents

END_PUNCTUATION = "。！？"


def _documents(shards_dir: Path) -> list[dict]:
    return [d for path in load_manifest(shards_dir).shard_paths for d in read_documents(path)]


def _prose_documents() -> list[str]:
    """The documents of the Chinese test corpus, as the plain-text reader cuts them."""
    text = CHINESE_PROSE.read_text(encoding="utf-8")
    return [d for d in re.split(r"\n\s*\n", text) if d.strip()]


@functools.cache
def _independent_jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba.Tokenizer()


def _independent_jieba_words(sentence: str) -> list[str]:
    """jieba's words for `sentence`, straight from jieba (its HMM on, as preparation uses)."""
    return list(_independent_jieba().cut(sentence, HMM=True))


def test_cjk_ranges_are_the_characters_bert_isolates():
    normalizer = normalizers.BertNormalizer(handle_chinese_chars=True, lowercase=False)
    probes = [chr(c) for low, high in CJK_RANGES for c in (low, (low + high) // 2, high)]
    probes += [chr(low - 1) for low, _ in CJK_RANGES] + [chr(high + 1) for _, high in CJK_RANGES]
    probes += list("aZ9。，！？「」ー가あ") + ["\u3400", "\u9fa5"]
    probes = [c for c in probes if unicodedata.category(c) not in ("Cc", "Cf", "Cs")]
    isolated = {c: normalizer.normalize_str(f"x{c}x") == f"x {c} x" for c in probes}
    assert {c: is_cjk_char(c) for c in probes} == isolated
    assert sum(isolated.values()) >= 24 and not all(isolated.values())


def test_chinese_tokenizer_keeps_every_cjk_character_whole():
    texts = _prose_documents() + small_english_documents(40)
    cjk = {c for text in texts for c in text if is_cjk_char(c)}
    chinese = train_tokenizer(
        lambda: texts, vocab_size=2000, min_frequency=2, limit_alphabet=150, kind="chinese"
    )
    vocab = chinese.get_vocab()
    assert len(cjk) > 300 and cjk <= set(vocab)
    assert not any(t.startswith("##") and any(map(is_cjk_char, t)) for t in vocab)
    # the default kind keeps only the most frequent characters: rare CJK ones become [UNK]
    wordpiece = train_tokenizer(lambda: texts, vocab_size=2000, min_frequency=2, limit_alphabet=150)
    assert not cjk <= set(wordpiece.get_vocab())
    # Latin text is still WordPiece: whole words where learned, ## pieces otherwise
    english = chinese.encode("The interpreter raises an exception.", add_special_tokens=False)
    assert english.tokens[:2] == ["the", "interpreter"]
    assert any(
        t.startswith("##")
        for t in chinese.encode("Interpretability", add_special_tokens=False).tokens
    )


def test_chinese_vocabulary_that_cannot_fit_names_the_key():
    with pytest.raises(TokenizerError, match=r"tokenizer\.vocab_size=100: .*CJK"):
        train_tokenizer(_prose_documents, vocab_size=100, kind="chinese")


def test_every_cjk_character_is_its_own_token(prepared_chinese_corpus):
    tokenizer = Tokenizer.from_file(str(prepared_chinese_corpus / "tokenizer/tokenizer.json"))
    documents = _documents(prepared_chinese_corpus)
    texts = [normalize(t) for t in _prose_documents()]
    assert len(documents) == len(texts) == 8
    for document, text in zip(documents, texts, strict=True):
        tokens = [tokenizer.id_to_token(i) for i in document["ids"].tolist()]
        assert "[UNK]" not in tokens
        cjk_tokens = [t for t in tokens if any(map(is_cjk_char, t))]
        assert all(len(t) == 1 for t in cjk_tokens)
        assert cjk_tokens == [c for c in text if is_cjk_char(c)]


def test_sentences_end_at_chinese_end_punctuation(prepared_chinese_corpus):
    tokenizer = Tokenizer.from_file(str(prepared_chinese_corpus / "tokenizer/tokenizer.json"))
    documents = _documents(prepared_chinese_corpus)
    texts = _prose_documents()
    for document, text in zip(documents, texts, strict=True):
        last_tokens = [
            tokenizer.id_to_token(int(document["ids"][end - 1])) for end in document["sents"]
        ]
        # every line of the test prose ends with 。！or ？, so every sentence does
        assert all(t in END_PUNCTUATION for t in last_tokens)
        assert len(document["sents"]) == sum(text.count(p) for p in END_PUNCTUATION)
    assert load_manifest(prepared_chinese_corpus).counts["sentences"] == 50
    assert split_sentences("你好。今天下雨吗？下雨！好") == [
        "你好。",
        "今天下雨吗？",
        "下雨！",
        "好",
    ]


def _cjk_words(sentence_tokens: list[str], flags: list[bool]) -> list[str]:
    """Words made only of CJK characters, from tokens and word-start flags."""
    words, current = [], []
    for token, start in zip(sentence_tokens, flags, strict=True):
        if start and current:
            words.append(current)
            current = []
        current.append(token)
    words.append(current)
    return ["".join(w) for w in words if all(is_cjk_char(t[0]) for t in w)]


def test_word_starts_are_jieba_words(prepared_chinese_corpus):
    tokenizer = Tokenizer.from_file(str(prepared_chinese_corpus / "tokenizer/tokenizer.json"))
    multi_character_words = 0
    for document, text in zip(_documents(prepared_chinese_corpus), _prose_documents(), strict=True):
        sentences = split_sentences(normalize(text))
        starts = [0, *document["sents"][:-1].tolist()]
        assert len(sentences) == len(starts)
        for sentence, start, end in zip(sentences, starts, document["sents"].tolist(), strict=True):
            tokens = [tokenizer.id_to_token(i) for i in document["ids"][start:end].tolist()]
            flags = document["words"][start:end].tolist()
            expected = [w for w in _independent_jieba_words(sentence) if all(map(is_cjk_char, w))]
            assert _cjk_words(tokens, flags) == expected, sentence
            multi_character_words += sum(len(w) > 1 for w in expected)
            # tokens that are not CJK keep the tokenizer's word starts
            for token, flag in zip(tokens, flags, strict=True):
                if not is_cjk_char(token[0]) and token.startswith("##"):
                    assert not flag
    assert multi_character_words > 100


def test_mixed_sentence_word_starts():
    tokenizer = train_tokenizer(
        lambda: _prose_documents() + ["Transformers and BERT."] * 3,
        vocab_size=1000,
        min_frequency=1,
        kind="chinese",
    )
    sentence = "我们用BERT训练语言模型，效果很好。"
    ids, _, words = encode_sentences(tokenizer, [sentence], "uint16", JiebaSegmenter())
    tokens = [tokenizer.id_to_token(int(i)) for i in ids]
    jieba_starts, offset = set(), 0
    for word in _independent_jieba_words(sentence):
        jieba_starts.add(offset)
        offset += len(word)
    expected, position = [], 0
    for token in tokens:  # walk the sentence: CJK tokens by jieba, others by ## continuation
        piece = token[2:] if token.startswith("##") else token
        position = sentence.lower().index(piece, position)
        expected.append(
            position in jieba_starts if is_cjk_char(piece[0]) else not token.startswith("##")
        )
        position += len(piece)
    assert words.astype(bool).tolist() == expected
    assert "bert" in tokens and 0 < words.sum() < len(tokens)
    plain = encode_sentences(tokenizer, [sentence], "uint16")[2]
    assert plain.all()  # without a segmenter every character is a word


def test_jieba_segmenter_is_quiet_and_deterministic(capfd):
    first, second = JiebaSegmenter(), JiebaSegmenter()
    assert capfd.readouterr().err == ""
    sentence = "研究人员发现，模型越大，效果往往越好。"
    assert first.words(sentence) == second.words(sentence) == _independent_jieba_words(sentence)
    assert "".join(first.words(sentence)) == sentence


def _dir_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_chinese_preparation_is_deterministic(prepared_chinese_corpus, tmp_path):
    again = prepare_chinese_corpus(tmp_path / "again", workers=2)
    assert _dir_bytes(again) == _dir_bytes(prepared_chinese_corpus)
    manifest = load_manifest(again)
    assert manifest.raw["segmenter"]["name"] == "jieba"
    assert manifest.raw["config"]["tokenizer"]["kind"] == "chinese"
    assert np.all([d["words"][0] for d in _documents(again)])
