"""The corrupted-sentence task: a quarter of a sentence's words (at least one) replaced by
other words of the corpus's vocabulary, the rest kept in place."""

import numpy as np

from pretrain.eval.builtin_tasks import corrupted_task

DOCUMENTS = [["a b c d e f g h", "i j k l m n o p"], ["q r s t u v w x", "y z a b"]]


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
