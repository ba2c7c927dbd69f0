"""The built-in tasks' corruptions: a quarter of a sentence's words (at least one) replaced by
other words of the corpus's vocabulary, the rest kept in place; a next sentence shuffled; a
sentence reversed with its closing punctuation kept at the end."""

import numpy as np

from pretrain.eval.builtin_tasks import (
    corrupted_task,
    reversed_task,
    shuffled_continuation_task,
)

DOCUMENTS = [["a b c d e f g h", "i j k l m n o p"], ["q r s t u v w x", "y z a b"]]
PUNCTUATED = [["The module is imported.", "Is it (say) there?"], ['See "help" for "it".', "a b c"]]


def test_corrupted_sentences_differ_in_a_quarter_of_their_words():
    sentences = {s for document in DOCUMENTS for s in document}
    vocabulary = {w for s in sentences for w in s.split()}
    for seed in range(20):
        examples = corrupted_task(np.random.default_rng(seed), DOCUMENTS, 4)
        assert sorted(e.label for e in examples) == [0, 0, 1, 1]
        for example in examples:
            words = example.text_a.split()
            assert set(words) <= vocabulary and example.text_b is None
            if example.label == 1:
                assert example.text_a in sentences
                continue
            # the original: the sentence of the same length whose words differ least
            changed = min(
                sum(a != b for a, b in zip(words, s.split(), strict=True))
                for s in sentences
                if len(s.split()) == len(words)
            )
            assert changed == max(1, round(0.25 * len(words)))


def test_next_order_pairs_keep_the_next_sentence_or_its_shuffled_words():
    """builtin_next_order: A is a sentence, B the one after it in its document, as written
    (label 1) or with its words in another order (label 0); half of each."""
    following = {
        a: b for document in DOCUMENTS for a, b in zip(document, document[1:], strict=False)
    }
    for seed in range(20):
        examples = shuffled_continuation_task(np.random.default_rng(seed), DOCUMENTS, 2)
        assert sorted(e.label for e in examples) == [0, 1]
        for example in examples:
            truth = following[example.text_a]
            assert sorted(example.text_b.split()) == sorted(truth.split())
            assert (example.text_b == truth) == (example.label == 1)


def test_reversed_sentences_read_backwards_with_their_closing_punctuation_at_the_end():
    sentences = {s for document in PUNCTUATED for s in document}
    expected = {
        "The module is imported.": "imported is module The.",
        "Is it (say) there?": "there (say) it Is?",
        'See "help" for "it".': '"it for "help" See".',
        "a b c": "c b a",
    }
    for seed in range(10):
        examples = reversed_task(np.random.default_rng(seed), PUNCTUATED, 4)
        assert sorted(e.label for e in examples) == [0, 0, 1, 1]
        for example in examples:
            if example.label == 1:
                assert example.text_a in sentences
            else:
                assert example.text_a in expected.values()
