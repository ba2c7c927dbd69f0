"""The batched text paths equal their per-document references: `documents_sentences` and
`normalize_many` against `split_sentences(normalize(t))` and `normalize(t)` on random text
built from the characters the rules treat specially, and the alphabet from counted raw
characters against normalizing the whole text."""

import random
from collections import Counter

import pytest
from conftest import small_english_documents

from data_pipelines.text import documents_sentences, normalize, normalize_many, split_sentences
from data_pipelines.tokenizer import build_tokenizer, normalized_counts

PIECES = [
    *"abcXYZ .!?\"')]\n\r\t\x0b\x0c\x85\u2028\u2029\x00\x07\x7f\x9f\u00a0\u3000",
    *"。！？”」）e\u0301é\u0301ﬁ中文İΣς",
    "\r\n",
    ". a",
    ". B",
    "e.g. x",
    "\n\n",
    "  ",
    '."")\'] Next',
    "\ue000",
    "\n\ue000\n",
]


def random_texts(rng: random.Random) -> list[str]:
    return [
        "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        for _ in range(rng.randint(1, 8))
    ]


def test_batched_sentences_and_normalization_equal_the_per_document_rules():
    rng = random.Random(0)
    for _ in range(500):
        texts = random_texts(rng)
        per_text = [split_sentences(normalize(t)) for t in texts]
        sentences, counts = documents_sentences(texts)
        assert sentences == [s for text in per_text for s in text], texts
        assert counts == [len(s) for s in per_text], texts
        assert normalize_many(texts) == [normalize(t) for t in texts], texts


def test_batched_sentences_of_prose():
    texts = small_english_documents(200)
    sentences, counts = documents_sentences(texts)
    assert sentences == [s for t in texts for s in split_sentences(normalize(t))]
    assert sum(counts) == len(sentences) > 200


@pytest.mark.parametrize("lowercase", [True, False])
def test_counted_characters_normalize_as_the_whole_text(lowercase):
    tokenizer = build_tokenizer(lowercase)
    rng = random.Random(1)
    texts = small_english_documents(50) + ["".join(random_texts(rng)) for _ in range(200)]
    whole = Counter(tokenizer.normalizer.normalize_str("\n".join(texts)))
    assert normalized_counts(Counter("\n".join(texts)), tokenizer) == whole
