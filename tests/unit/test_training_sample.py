"""The tokenizer's training sample: a fixed, uniform share of a large corpus's documents."""

import math

from data_pipelines.prepare import training_sample
from data_pipelines.sources import RawDocument


def documents(count: int, size: int = 100) -> list[RawDocument]:
    return [RawDocument(f"part-{i % 7}.jsonl", i, "x" * size) for i in range(count)]


def test_the_sample_is_the_share_of_the_budget_and_always_the_same():
    corpus = documents(20_000)  # 2 MB of text
    sample = list(training_sample(corpus, 0.5, 2_000_000))  # a quarter
    n, p = len(corpus), 0.25
    assert abs(len(sample) - n * p) < 4 * math.sqrt(n * p * (1 - p))
    assert sample == list(training_sample(corpus, 0.5, 2_000_000))
    first_half = sum(d.index < 10_000 for d in sample)  # spread over the corpus
    assert abs(first_half - len(sample) / 2) < 4 * math.sqrt(len(sample) / 4)


def test_small_corpora_and_no_budget_use_every_document():
    corpus = documents(100)
    assert list(training_sample(corpus, 1.0, 10_000)) == corpus
    assert list(training_sample(corpus, None, 10_000)) == corpus


def test_an_unknown_total_takes_the_first_megabytes():
    sample = list(training_sample(documents(1000), 0.01, None))  # 10 kB of 100-byte documents
    assert [d.index for d in sample] == list(range(100))
