"""ERNIE annotations: the collocation scorer, entity matching, span flags and their shards."""

import contextlib
import json
import math
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import CHINESE_ENTITIES, ENGLISH_ENTITIES, write_raw_shard, write_text_corpus
from tokenizers import Tokenizer, models

from data_pipelines import cli
from data_pipelines.annotate import ENTITIES_FILE, PHRASES_FILE, EntitiesSkippedWarning
from data_pipelines.document_encoding import encode_sentences
from data_pipelines.phrases import barrier_tokens, count_pairs, learn_phrases, npmi
from data_pipelines.prepare import PrepareError, prepare
from data_pipelines.prepare_config import (
    EntitySettings,
    PhraseSettings,
    PrepareConfig,
    PrepareConfigError,
    TokenizerSettings,
    compose_prepare_config,
)
from data_pipelines.shard_writer import ShardWriter, TokenizedDocument
from data_pipelines.span_annotation import (
    EntityFileError,
    SpanLexicon,
    annotate_spans,
    load_entities,
)
from data_pipelines.text import normalize
from data_pipelines.tokenizer import SPECIAL_TOKENS, build_tokenizer
from pretrain.data.shard_format import ShardError, load_manifest, read_documents

PUNCT = 7  # token id of a punctuation token in the synthetic corpora


def _documents(shards_dir: Path) -> list[dict]:
    return [d for path in load_manifest(shards_dir).shard_paths for d in read_documents(path)]


def _document(sentences: list[list[int]], words: list[int] | None = None) -> dict:
    ids = np.array([i for s in sentences for i in s], dtype=np.int64)
    return {
        "ids": ids,
        "sents": np.cumsum([len(s) for s in sentences]).astype(np.int32),
        "words": np.ones(len(ids), bool) if words is None else np.array(words, bool),
    }


def _barrier(size: int = 1000) -> np.ndarray:
    barrier = np.zeros(size, bool)
    barrier[[0, 1, 2, 3, 4, PUNCT]] = True
    return barrier


# --- collocations ---------------------------------------------------------------------------


def test_npmi_is_one_for_inseparable_words_and_zero_for_independent_ones():
    assert npmi(50, 50, 50, 10_000) == pytest.approx(1.0)
    assert npmi(25, 500, 500, 10_000) == pytest.approx(0.0, abs=1e-12)  # p(ab) = p(a) p(b)
    assert npmi(1, 500, 500, 10_000) < 0
    expected = math.log(0.002 / (0.005 * 0.01)) / -math.log(0.002)
    assert npmi(20, 50, 100, 10_000) == pytest.approx(expected)


def _planted_corpus(seed: int = 0) -> tuple[list[dict], dict]:
    """Sentences of random words (ids 100-299; ids 100-104 frequent, like function words)
    with planted collocations: "new york" (20, 21), "machine learning system" (30, 31, 32);
    a pair that always straddles a sentence end (40 | 41); a pair always split by
    punctuation (50 , 51)."""
    rng = np.random.default_rng(seed)
    common = np.arange(100, 105)
    documents = []
    for _ in range(60):
        sentences = []
        for _ in range(8):
            n = int(rng.integers(6, 14))
            sentence = np.where(
                rng.random(n) < 0.4, rng.choice(common, n), rng.integers(105, 300, n)
            ).tolist()
            plant = int(rng.integers(0, 5))
            cut = int(rng.integers(0, len(sentence)))
            insert = {0: [20, 21], 1: [30, 31, 32], 2: [50, PUNCT, 51], 3: [], 4: []}[plant]
            sentence[cut:cut] = insert
            sentences.append(sentence)
        sentences[3] = [*sentences[3], 40]
        sentences[4] = [41, *sentences[4]]
        documents.append(_document(sentences))
    return documents, {"new york": (20, 21), "machine learning system": (30, 31, 32)}


def test_collocation_scorer_finds_planted_phrases_and_not_random_pairs():
    documents, planted = _planted_corpus()
    settings = PhraseSettings(enabled=True, min_count=5, min_npmi=0.5)
    counts = count_pairs(documents, _barrier())
    frequent_random = [pair for pair, c in counts.pairs.items() if c >= 5 and min(pair)[0] >= 100]
    assert len(frequent_random) > 20  # random pairs pass the count, so the score must reject them
    assert counts.pairs[((40,), (41,))] == 0 and counts.pairs[((50,), (51,))] == 0
    lexicon = learn_phrases(lambda: documents, _barrier(), settings)
    found = {p.token_ids: p for p in lexicon}
    assert set(found) == {(20, 21), (30, 31, 32), (30, 31), (31, 32)}
    assert found[(30, 31, 32)].score == min(found[(30, 31)].score, found[(31, 32)].score)
    assert all(p.score >= 0.5 and p.count >= 5 for p in lexicon)
    assert found[planted["new york"]].count == counts.pairs[((20,), (21,))]
    looser = learn_phrases(lambda: documents, _barrier(), PhraseSettings(min_count=5, min_npmi=-1))
    assert len(looser) > len(lexicon) + 20  # the threshold, not the count, rejected them


def test_lexicon_order_cap_and_determinism():
    documents, _ = _planted_corpus(seed=1)
    settings = PhraseSettings(enabled=True, min_count=3, min_npmi=0.2)
    lexicon = learn_phrases(lambda: documents, _barrier(), settings)
    assert len(lexicon) >= 4
    assert lexicon == learn_phrases(lambda: documents[::-1], _barrier(), settings)
    keys = [(-p.count, -p.score) for p in lexicon]
    assert keys == sorted(keys)
    capped = learn_phrases(
        lambda: documents, _barrier(), PhraseSettings(min_count=3, min_npmi=0.2, max_phrases=2)
    )
    assert capped == lexicon[:2]
    only_pairs = learn_phrases(
        lambda: documents, _barrier(), PhraseSettings(min_count=3, min_npmi=0.2, max_words=2)
    )
    assert {p.token_ids for p in only_pairs} == {p.token_ids for p in lexicon if len(p.words) == 2}


def test_phrase_words_are_whole_words():
    # word = token run from a word start: (20 ##60) (21) is a phrase of two words, 3 tokens
    sentence, flags = [20, 60, 21, 105], [1, 0, 1, 1]
    documents = [_document([sentence] * 10, flags * 10)]
    lexicon = learn_phrases(lambda: documents, _barrier(), PhraseSettings(min_count=5))
    assert {p.words for p in lexicon} == {
        ((20, 60), (21,)),
        ((21,), (105,)),
        ((20, 60), (21,), (105,)),
    }
    assert [(p.count, p.score) for p in lexicon] == [(10, pytest.approx(1.0))] * 3


# --- spans ------------------------------------------------------------------------------------


def _flags(sentences, words=None, entities=(), phrases=()) -> list[int]:
    document = _document(sentences, words)
    return annotate_spans(
        document["ids"],
        document["sents"],
        document["words"],
        SpanLexicon(entities),
        SpanLexicon(phrases),
    ).tolist()


def test_span_conflicts_entities_then_longer_then_leftmost():
    sentence = [[10, 11, 12, 13, 14, 15]]
    assert _flags(sentence, entities=[(11, 12)], phrases=[(10, 11, 12)]) == [0, 2, 3, 0, 0, 0]
    assert _flags(sentence, phrases=[(10, 11), (11, 12, 13)]) == [0, 1, 3, 3, 0, 0]
    assert _flags(sentence, phrases=[(11, 12), (10, 11), (13, 14)]) == [1, 3, 0, 1, 3, 0]
    assert _flags(sentence, entities=[(14,), (13, 14, 15)], phrases=[(10, 11)]) == [
        1,
        3,
        0,
        2,
        3,
        3,
    ]
    assert _flags(sentence, entities=[(10, 11), (10, 11, 12)]) == [2, 3, 3, 0, 0, 0]


def test_spans_respect_words_and_sentences():
    words = [1, 1, 0, 1, 1, 1]
    assert _flags([[10, 11, 12, 13, 14, 15]], words, phrases=[(10, 11)]) == [0] * 6
    assert _flags([[10, 11, 12, 13, 14, 15]], words, phrases=[(12, 13)]) == [0] * 6
    assert _flags([[10, 11, 12, 13, 14, 15]], words, phrases=[(10, 11, 12)]) == [1, 3, 3, 0, 0, 0]
    assert _flags([[10, 11], [12, 13]], phrases=[(11, 12)], entities=[(11, 12)]) == [0] * 4
    assert _flags([[10, 11], [12, 13]], phrases=[(12, 13)]) == [0, 0, 1, 3]


def _tokenizer(tokens: list[str], lowercase: bool) -> Tokenizer:
    tokenizer = build_tokenizer(lowercase)
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *tokens])}
    tokenizer.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    return tokenizer


def _entity_flags(tokenizer, entities_path, sentences) -> tuple[list[str], list[int]]:
    ids, sents, words = encode_sentences(tokenizer, sentences, "uint16")
    entity_list = load_entities(entities_path, tokenizer)
    flags = annotate_spans(ids, sents, words, entity_list.lexicon)
    return [tokenizer.id_to_token(int(i)) for i in ids], flags.tolist()


def test_entities_longest_match_at_word_boundaries_case_insensitive(tmp_path):
    path = tmp_path / "entities.txt"
    path.write_text("New York\n\nNew York City\n  York  \n", encoding="utf-8")
    words = ["i", "love", "new", "york", "city", ".", "and", "a", "##new", "##shire"]
    tokenizer = _tokenizer(words, lowercase=True)
    sentences = ["I love New York City.", "new york and Yorkshire.", "anew york"]
    tokens, flags = _entity_flags(tokenizer, path, sentences)
    assert tokens == "i love new york city . new york and york ##shire . a ##new york".split()
    assert flags == [0, 0, 2, 3, 3, 0, 2, 3, 0, 0, 0, 0, 0, 0, 2]
    assert load_entities(path, tokenizer).entries == 3


def test_entities_are_case_sensitive_with_a_cased_tokenizer(tmp_path):
    path = tmp_path / "entities.txt"
    path.write_text("New York\n", encoding="utf-8")
    tokenizer = _tokenizer(["New", "new", "York", "york", "."], lowercase=False)
    tokens, flags = _entity_flags(tokenizer, path, ["New York.", "new york."])
    assert tokens == ["New", "York", ".", "new", "york", "."]
    assert flags == [2, 3, 0, 0, 0, 0]


def test_entities_never_cross_a_sentence_end(tmp_path):
    path = tmp_path / "entities.txt"
    path.write_text("York City\n", encoding="utf-8")
    tokenizer = _tokenizer(["i", "love", "new", "york", "city", "is", "big"], lowercase=True)
    assert _entity_flags(tokenizer, path, ["I love New York", "City is big"])[1] == [0] * 7
    assert _entity_flags(tokenizer, path, ["I love New York City is big"])[1] == [
        0, 0, 0, 2, 3, 0, 0,
    ]  # fmt: skip


def test_entity_file_errors_name_the_file(tmp_path):
    tokenizer = _tokenizer(["york"], lowercase=True)
    with pytest.raises(EntityFileError, match=r"entities\.path=.*missing\.txt: no such file"):
        load_entities(tmp_path / "missing.txt", tokenizer)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(EntityFileError, match=r"latin1\.txt: cannot be read as UTF-8"):
        load_entities(tmp_path / "latin1.txt", tokenizer)
    (tmp_path / "unknown.txt").write_text("york\nzebra\n")
    entities = load_entities(tmp_path / "unknown.txt", tokenizer)
    assert (entities.entries, entities.skipped) == (1, ["zebra"])


# --- prepared corpora -------------------------------------------------------------------------


def _spans(document: dict) -> list[tuple[int, int, int]]:
    """(start, end, kind) of every span in the document's flags."""
    flags = document["phrases"].tolist()
    spans = []
    for i, flag in enumerate(flags):
        if flag in (1, 2):
            end = i + 1
            while end < len(flags) and flags[end] == 3:
                end += 1
            spans.append((i, end, flag))
    return spans


def _span_text(tokenizer: Tokenizer, ids, words) -> str:
    text = ""
    for token_id, start in zip(ids.tolist(), words.tolist(), strict=True):
        token = tokenizer.id_to_token(token_id)
        text += (" " if start and text else "") + (token[2:] if token.startswith("##") else token)
    return text


@pytest.mark.parametrize("fixture", ["prepared_annotated_corpus", "prepared_chinese_corpus"])
def test_span_flags_are_valid(fixture, request):
    shards_dir = request.getfixturevalue(fixture)
    tokenizer = Tokenizer.from_file(str(shards_dir / "tokenizer/tokenizer.json"))
    lexicon = {
        line.split("\t")[0]
        for line in (shards_dir / PHRASES_FILE).read_text(encoding="utf-8").splitlines()[1:]
    }
    entity_lines = (shards_dir / ENTITIES_FILE).read_text(encoding="utf-8").splitlines()
    entities = {normalize(e).lower().replace(" ", "") for e in entity_lines if e.strip()}
    counts = {1: 0, 2: 0}
    for document in _documents(shards_dir):
        flags, words, n = document["phrases"], document["words"], len(document["ids"])
        assert flags.dtype == np.uint8 and flags.shape == (n,) and flags.max() <= 3
        assert flags[0] != 3 and np.all((flags[1:] != 3) | (flags[:-1] != 0))  # 3 follows 1-3
        assert words[flags == 1].all() and words[flags == 2].all()  # spans start words
        sentence_of = np.searchsorted(document["sents"], np.arange(n), side="right")
        for start, end, kind in _spans(document):
            counts[kind] += 1
            assert end == n or words[end]  # ends where a word starts
            assert sentence_of[start] == sentence_of[end - 1]  # inside one sentence
            text = _span_text(tokenizer, document["ids"][start:end], words[start:end])
            if kind == 1:
                assert text in lexicon
            else:
                assert text.replace(" ", "") in entities
    annotations = load_manifest(shards_dir).annotations
    assert (annotations["phrase_spans"], annotations["entity_spans"]) == (counts[1], counts[2])
    assert counts[1] > 20 and counts[2] > 10
    assert annotations["phrases"] == len(lexicon) and annotations["entities"] == len(entities)


def test_stored_annotations_equal_a_fresh_computation(prepared_annotated_corpus):
    tokenizer = Tokenizer.from_file(str(prepared_annotated_corpus / "tokenizer/tokenizer.json"))
    documents = _documents(prepared_annotated_corpus)
    settings = PhraseSettings(**load_manifest(prepared_annotated_corpus).raw["config"]["phrases"])
    phrases = learn_phrases(lambda: documents, barrier_tokens(tokenizer), settings)
    assert len(phrases) == load_manifest(prepared_annotated_corpus).annotations["phrases"]
    entities = load_entities(ENGLISH_ENTITIES, tokenizer).lexicon
    phrase_lexicon = SpanLexicon(p.token_ids for p in phrases)
    for document in documents:
        expected = annotate_spans(
            document["ids"], document["sents"], document["words"], entities, phrase_lexicon
        )
        assert document["phrases"].tolist() == expected.tolist()


def test_shards_without_annotations_read_as_zeros(prepared_corpus):
    manifest = load_manifest(prepared_corpus)
    assert manifest.annotations is None and manifest.raw["annotations"] is None
    assert not (prepared_corpus / PHRASES_FILE).exists()
    with tarfile.open(manifest.shard_paths[0]) as tar:
        assert not [m for m in tar.getnames() if m.endswith(".phrases.npy")]
    for document in read_documents(manifest.shard_paths[0]):
        assert document["phrases"].dtype == np.uint8
        assert document["phrases"].shape == document["ids"].shape
        assert not document["phrases"].any()


def test_annotations_round_trip_through_a_shard(tmp_path):
    rng = np.random.default_rng(3)
    written = []
    with ShardWriter(tmp_path, docs_per_shard=10) as writer:
        for k in range(4):
            n = int(rng.integers(5, 40))
            phrases = rng.integers(0, 4, n).astype(np.uint8) if k != 2 else None
            document = TokenizedDocument(
                f"k_{k}",
                "src",
                rng.integers(5, 900, n).astype(np.uint16),
                np.array([n // 2, n], np.int32),
                (rng.random(n) < 0.7).astype(np.uint8),
                phrases,
            )
            writer.write(document)
            written.append(document)
    read = list(read_documents(tmp_path / writer.shards[0]["name"]))
    for document, back in zip(written, read, strict=True):
        expected = (
            np.zeros(len(document.ids), np.uint8) if document.phrases is None else document.phrases
        )
        assert back["phrases"].tolist() == expected.tolist()
        assert back["ids"].tolist() == document.ids.tolist()


@pytest.mark.parametrize(
    "array, problem", [(np.full(4, 7, np.uint8), "value"), (np.zeros(3, np.uint8), "length")]
)
def test_bad_phrases_member_is_an_error(tmp_path, array, problem):
    path = tmp_path / "bad.tar"
    write_raw_shard(
        path,
        [
            ("000000.docs.npy", np.array([1], np.int32)),
            ("000000.sents.npy", np.array([4], np.int32)),
            ("000000.ids.npy", np.arange(5, 9, dtype=np.uint16)),
            ("000000.words.npy", np.packbits(np.ones(4, bool))),
            ("000000.keys.txt", b"k_\t1\t1\n"),
            ("000000.phrases.npy", array),
        ],
    )
    with pytest.raises(ShardError, match=re.escape(str(path)) + ": member 000000.phrases.npy"):
        list(read_documents(path))


def _dir_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _config_from_manifest(shards_dir: Path, out_dir: Path, num_proc: int) -> PrepareConfig:
    """The settings a prepared corpus records, to prepare it again into `out_dir`."""
    recorded = dict(load_manifest(shards_dir).raw["config"])
    nested = {"tokenizer": TokenizerSettings, "phrases": PhraseSettings, "entities": EntitySettings}
    for key, schema in nested.items():
        recorded[key] = schema(**recorded[key])
    return PrepareConfig(**recorded, out_dir=str(out_dir), num_proc=num_proc)


def test_annotated_preparation_is_deterministic(prepared_annotated_corpus, tmp_path):
    config = _config_from_manifest(prepared_annotated_corpus, tmp_path / "again", num_proc=2)
    assert config.phrases.enabled and config.entities.path == str(ENGLISH_ENTITIES)
    with contextlib.chdir(prepared_annotated_corpus.parent):  # its source: corpus.txt there
        again = prepare(config, progress=False)
    assert _dir_bytes(again) == _dir_bytes(prepared_annotated_corpus)
    manifest = load_manifest(again)
    assert sum(s["tokens"] for s in manifest.shards) == manifest.counts["tokens"]
    assert json.loads((again / "manifest.json").read_text())["config"]["phrases"]["enabled"]


def test_entities_only_and_bad_entity_settings(tmp_path):
    source = write_text_corpus(tmp_path / "c.txt", ["北京和上海都很大。我爱北京！", "Zebra"])
    config = PrepareConfig(
        inputs=[str(source)],
        out_dir=str(tmp_path / "out"),
        tokenizer=TokenizerSettings(kind="chinese", vocab_size=200, min_frequency=1),
        entities=EntitySettings(path=str(CHINESE_ENTITIES)),
        docs_per_shard=5,
        num_proc=1,
    )
    with pytest.warns(EntitiesSkippedWarning, match="entities_zh.txt: .* not matched"):
        out = prepare(config, progress=False)
    assert not (out / PHRASES_FILE).exists() and (out / ENTITIES_FILE).is_file()
    flags = [d["phrases"].tolist() for d in _documents(out)]
    assert flags[0] == [2, 3, 0, 2, 3, 0, 0, 0, 0] + [0, 0, 2, 3, 0] and not any(flags[1])
    annotations = load_manifest(out).annotations
    assert annotations["phrases"] == annotations["phrase_spans"] == 0
    assert annotations["entity_spans"] == 3
    config.entities.path = str(tmp_path / "nope.txt")
    config.out_dir = str(tmp_path / "out2")
    with pytest.raises(PrepareError, match=r"entities\.path=.*nope\.txt: no such file"):
        prepare(config, progress=False)


@pytest.mark.parametrize(
    "override, key",
    [
        ("phrases.min_npmi=2", "phrases.min_npmi"),
        ("phrases.min_count=0", "phrases.min_count"),
        ("phrases.max_words=1", "phrases.max_words"),
        ("phrases.max_phrases=0", "phrases.max_phrases"),
        ("segmenter=stanza", "segmenter"),
        ("tokenizer.kind=bpe", "tokenizer.kind"),
        ("+phrases.min_pmi=1", "phrases.min_pmi"),
    ],
)
def test_bad_annotation_settings_name_the_key(override, key):
    with pytest.raises(PrepareConfigError, match=re.escape(key)):
        compose_prepare_config([override])


def test_info_shows_annotation_counts(prepared_annotated_corpus, prepared_corpus, capsys):
    assert cli.main(["info", str(prepared_annotated_corpus)]) == 0
    printed = capsys.readouterr().out
    annotations = load_manifest(prepared_annotated_corpus).annotations
    for label, key in (("phrase spans", "phrase_spans"), ("entity spans", "entity_spans")):
        assert re.search(rf"^{label} +{annotations[key]:,}$", printed, re.M)
    assert re.search(r"^phrase lexicon +\d", printed, re.M)
    assert cli.main(["info", str(prepared_corpus)]) == 0
    assert re.search(r"^span annotations +none$", capsys.readouterr().out, re.M)
