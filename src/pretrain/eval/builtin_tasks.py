"""Tasks generated from the built-in corpus (Python's help topics), so the demo and the tests
run offline. Each is deterministic given (seed, sizes), and each asks something a pretrained
encoder knows better than a random one: word order, what follows what, where a phrase goes on.

    builtin_order     classification: is the sentence as written, or its words shuffled?
    builtin_reversed  classification: is the sentence as written, or its words reversed
                      (its closing punctuation kept at the end)?
    builtin_corrupted classification: is the sentence as written, or are a quarter of its
                      words replaced by words drawn from the corpus's vocabulary?
    builtin_next      pair: does sentence B follow sentence A in the document?
    builtin_continuation pair: is B A's next sentence as written, or with half of its
                      words replaced by words drawn from the corpus's vocabulary?
    builtin_next_order pair: is B A's next sentence as written, or with its words shuffled?
    builtin_overlap   regression: how many of A's words does B keep (0..1)?
    builtin_qa        extractive QA: which words follow the question's words in the context?
                      (a third of the questions have no answer: SQuAD v2 style)
    builtin_replaced_qa extractive QA: which 5 consecutive words of the sentence were
                      replaced by words drawn from the corpus's vocabulary?
    builtin_replaced  tagging: which words were replaced by a word drawn from the corpus?
"""

import re
from collections.abc import Callable

import numpy as np

from pretrain.eval.tasks import SpanExample, TaggingExample, TaskData, TextExample

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
MIN_WORDS, MAX_WORDS = 6, 24  # words of a sentence the tasks use
_CLOSING = ".!?:;,)\"'"  # what a sentence's last word may end with


def builtin_documents_sentences() -> list[list[str]]:
    """Sentences of 6 to 24 words (split on whitespace), per help topic of the built-in
    corpus, in its fixed order; topics with fewer than 2 such sentences are left out."""
    from data_pipelines.builtin_corpus import pydoc_topic_documents

    documents = []
    for _, text in pydoc_topic_documents():
        sentences = [
            sentence.strip()
            for paragraph in text.split("\n")
            for sentence in _SENTENCE_END.split(paragraph)
            if MIN_WORDS <= len(sentence.split()) <= MAX_WORDS
        ]
        if len(sentences) >= 2:
            documents.append(sentences)
    return documents


def _split(examples: list, train_size: int, dev_size: int, name: str) -> tuple[list, list]:
    if len(examples) < train_size + dev_size:
        raise ValueError(
            f"{name}: the built-in corpus gives {len(examples)} examples, fewer than "
            f"train_size + dev_size = {train_size + dev_size}"
        )
    return examples[:train_size], examples[train_size : train_size + dev_size]


def _shuffled(words: list[str], rng: np.random.Generator) -> list[str]:
    order = rng.permutation(len(words))
    while (order == np.arange(len(words))).all():
        order = rng.permutation(len(words))
    return [words[i] for i in order]


def order_task(rng: np.random.Generator, documents: list[list[str]], count: int) -> list:
    """Sentences as written (label 1) or with their words shuffled (label 0), alternating in
    a random order."""
    return _sentences(rng, documents, count, lambda words: _shuffled(words, rng))


def reversed_task(rng: np.random.Generator, documents: list[list[str]], count: int) -> list:
    """Sentences as written (label 1) or with their words in reverse order (label 0, as
    `_reversed`), alternating in a random order."""
    return _sentences(rng, documents, count, _reversed)


def _sentences(
    rng: np.random.Generator,
    documents: list[list[str]],
    count: int,
    corrupt: Callable[[list[str]], list[str]],
) -> list:
    """`count` sentences drawn without replacement, as written (label 1) or `corrupt(their
    words)` (label 0), alternating, then in a random order."""
    sentences = [s for document in documents for s in document]
    picks = rng.choice(len(sentences), size=min(count, len(sentences)), replace=False)
    examples = []
    for position, index in enumerate(picks):
        words = sentences[index].split()
        label = position % 2
        examples.append(TextExample(" ".join(words if label else corrupt(words)), None, label))
    return [examples[i] for i in rng.permutation(len(examples))]


def _reversed(words: list[str]) -> list[str]:
    """`words` in reverse order, the closing punctuation of the last kept at the end, so
    that a reversed sentence does not give itself away by its first word ("module." of
    "... the module."): what is left is the order of the words."""
    stem = words[-1].rstrip(_CLOSING)
    closing = words[-1][len(stem) :]
    out = [*([stem] if stem else []), *reversed(words[:-1])]
    out[-1] += closing
    return out


def shuffled_continuation_task(
    rng: np.random.Generator, documents: list[list[str]], count: int
) -> list:
    """(A, B) pairs: B the sentence after A in its topic, as written (label 1) or with its
    words shuffled (label 0), alternating, pairs in a random order: word order read across
    a sentence pair; the words of both are those of the document."""
    return _next_sentence_pairs(rng, documents, count, lambda words: _shuffled(words, rng))


def _next_sentence_pairs(
    rng: np.random.Generator,
    documents: list[list[str]],
    count: int,
    corrupt: Callable[[list[str]], list[str]],
) -> list:
    """`count` (A, B) pairs of consecutive sentences of a topic in a random order, B as
    written (label 1) or `corrupt(B's words)` (label 0), alternating."""
    pairs = [(d, i) for d, sentences in enumerate(documents) for i in range(len(sentences) - 1)]
    examples = []
    for position, index in enumerate(rng.permutation(len(pairs))[:count]):
        doc, i = pairs[index]
        words = documents[doc][i + 1].split()
        label = position % 2
        examples.append(
            TextExample(documents[doc][i], " ".join(words if label else corrupt(words)), label)
        )
    return examples


def corrupted_task(
    rng: np.random.Generator, documents: list[list[str]], count: int, fraction: float = 0.25
) -> list:
    """Sentences as written (label 1) or with a `fraction` of their words (at least one)
    replaced by words drawn uniformly from the corpus's distinct words (label 0), each
    replacement differing from the word it replaces; alternating, sentences in a random
    order. A pretrained encoder knows which words are common and which fit their
    neighbours; a random one learns it only from the training examples."""
    sentences = [s for document in documents for s in document]
    vocabulary = _vocabulary(documents)
    picks = rng.choice(len(sentences), size=min(count, len(sentences)), replace=False)
    examples = []
    for position, index in enumerate(picks):
        words = sentences[index].split()
        label = position % 2
        if not label:
            _replace_words(rng, words, vocabulary, max(1, round(fraction * len(words))))
        examples.append(TextExample(" ".join(words), None, label))
    return examples


def _vocabulary(documents: list[list[str]]) -> list[str]:
    """The corpus's distinct words (split on whitespace), sorted."""
    return sorted({w for document in documents for s in document for w in s.split()})


def _replace_words(
    rng: np.random.Generator, words: list[str], vocabulary: list[str], count: int
) -> None:
    """Replace `count` random distinct positions of `words` (in place) by words drawn
    uniformly from `vocabulary`, each differing from the word it replaces."""
    _replace_at(rng, words, vocabulary, rng.choice(len(words), size=count, replace=False))


def _replace_at(rng: np.random.Generator, words: list[str], vocabulary: list[str], positions):
    """Replace `words` at `positions` (in place) by words drawn uniformly from `vocabulary`,
    each differing from the word it replaces."""
    for at in positions:
        new = words[at]
        while new == words[at]:
            new = vocabulary[int(rng.integers(len(vocabulary)))]
        words[at] = new


def continuation_task(
    rng: np.random.Generator, documents: list[list[str]], count: int, fraction: float = 0.5
) -> list:
    """(A, B) pairs: B the sentence after A in its topic as written (label 1) or with a
    `fraction` of its words (at least one) replaced as in `corrupted_task` (label 0),
    alternating, pairs in a random order. The label is whether B reads as a plausible
    continuation of A word by word, what masked-word pretraining learns; topic coherence,
    which a short pretraining barely learns, plays no part (a corrupted B keeps half of the
    true next sentence's words)."""
    vocabulary = _vocabulary(documents)

    def corrupt(words: list[str]) -> list[str]:
        _replace_words(rng, words, vocabulary, max(1, round(fraction * len(words))))
        return words

    return _next_sentence_pairs(rng, documents, count, corrupt)


def next_task(rng: np.random.Generator, documents: list[list[str]], count: int) -> list:
    """(A, B) pairs: B the sentence after A in its topic (label 1) or a sentence of another
    topic (label 0), half each."""
    pairs = [(d, i) for d, sentences in enumerate(documents) for i in range(len(sentences) - 1)]
    examples = []
    for position, index in enumerate(rng.permutation(len(pairs))[:count]):
        doc, i = pairs[index]
        first = documents[doc][i]
        if position % 2:
            examples.append(TextExample(first, documents[doc][i + 1], 1))
            continue
        other = int(rng.integers(len(documents) - 1))
        other += other >= doc
        sentences = documents[other]
        examples.append(TextExample(first, sentences[int(rng.integers(len(sentences)))], 0))
    return examples


def overlap_task(rng: np.random.Generator, documents: list[list[str]], count: int) -> list:
    """(A, B) pairs: B is A with a random fraction of its words replaced by words of other
    sentences; the score is the fraction of A's words B keeps (0..1)."""
    sentences = [s for document in documents for s in document]
    vocabulary = sorted({w for s in sentences for w in s.split()})
    examples = []
    for index in rng.permutation(len(sentences))[:count]:
        words = sentences[index].split()
        replaced = rng.random(len(words)) < rng.random()
        other = [vocabulary[int(i)] for i in rng.integers(len(vocabulary), size=len(words))]
        kept = [o if r else w for w, o, r in zip(words, other, replaced, strict=True)]
        examples.append(TextExample(" ".join(words), " ".join(kept), float(1.0 - replaced.mean())))
    return examples


def qa_task(
    rng: np.random.Generator, documents: list[list[str]], count: int, unanswerable: float = 1 / 3
) -> list:
    """Question: 4 consecutive words of the context; answer: the 1 to 3 words after them.
    Contexts are 2 to 6 consecutive sentences of a topic (often longer than one window). A
    fraction `unanswerable` of the questions take their words from another topic: no answer."""
    examples: list[SpanExample] = []
    while len(examples) < count:
        doc = int(rng.integers(len(documents)))
        sentences = documents[doc]
        start = int(rng.integers(len(sentences)))
        words = " ".join(sentences[start : start + int(rng.integers(2, 7))]).split()
        context = " ".join(words)
        qid = f"builtin_qa-{len(examples)}"
        if rng.random() < unanswerable:
            other = documents[(doc + 1 + int(rng.integers(len(documents) - 1))) % len(documents)]
            other_words = other[int(rng.integers(len(other)))].split()
            question = " ".join(other_words[:4])
            if question not in context:
                examples.append(SpanExample(qid, question, context, ()))
            continue
        if len(words) < 8:
            continue
        at = int(rng.integers(len(words) - 5))
        question = " ".join(words[at : at + 4])
        if context.count(question) != 1:
            continue
        answer = " ".join(words[at + 4 : at + 4 + int(rng.integers(1, 4))])
        answer_start = context.index(question) + len(question) + 1
        assert context[answer_start : answer_start + len(answer)] == answer
        examples.append(SpanExample(qid, question, context, ((answer, answer_start),)))
    return examples


def replaced_qa_task(
    rng: np.random.Generator,
    documents: list[list[str]],
    count: int,
    span_words: int = 5,
    question: str = "which words were replaced?",
) -> list:
    """Extractive QA: the context is a sentence with `span_words` consecutive words replaced
    by words drawn uniformly from the corpus's distinct words (as in `corrupted_task`); the
    answer is the replaced span. The question is the same for all; every question has an
    answer (SQuAD v1.1 style: a frozen encoder's linear head calls "no answer" no better
    than chance, pretrained or not). A pretrained encoder knows which words do not fit
    their neighbours (or are rare); a random one learns it only from the training examples."""
    sentences = [s for document in documents for s in document]
    vocabulary = _vocabulary(documents)
    examples = []
    for index in rng.permutation(len(sentences))[:count]:
        words = sentences[index].split()
        at = int(rng.integers(len(words) - span_words + 1))
        _replace_at(rng, words, vocabulary, range(at, at + span_words))
        answer = " ".join(words[at : at + span_words])
        answer_start = len(" ".join(words[:at])) + (at > 0)
        qid = f"builtin_replaced_qa-{len(examples)}"
        examples.append(SpanExample(qid, question, " ".join(words), ((answer, answer_start),)))
    return examples


def replaced_task(rng: np.random.Generator, documents: list[list[str]], count: int) -> list:
    """Sentences with about 15% of their words replaced by a word drawn from the corpus's
    running text (so as often as the corpus uses it: rarity gives no hint); tag 1 for a
    replaced word, 0 for an original one (a draw of the same word stays 0)."""
    sentences = [s for document in documents for s in document]
    running = [w for s in sentences for w in s.split()]
    examples = []
    for index in rng.permutation(len(sentences))[:count]:
        words = sentences[index].split()
        replaced = rng.random(len(words)) < 0.15
        out = [
            running[int(rng.integers(len(running)))] if r else w
            for w, r in zip(words, replaced, strict=True)
        ]
        tags = tuple(int(o != w) for o, w in zip(out, words, strict=True))
        examples.append(TaggingExample(tuple(out), tags))
    return examples


# name -> (kind, labels, generator)
BUILTIN_TASKS: dict[str, tuple[str, tuple[str, ...], Callable]] = {
    "builtin_order": ("classification", ("shuffled", "original"), order_task),
    "builtin_reversed": ("classification", ("reversed", "original"), reversed_task),
    "builtin_corrupted": ("classification", ("corrupted", "original"), corrupted_task),
    "builtin_next": ("pair", ("random", "next"), next_task),
    "builtin_continuation": ("pair", ("corrupted", "next"), continuation_task),
    "builtin_next_order": ("pair", ("shuffled", "next"), shuffled_continuation_task),
    "builtin_overlap": ("regression", (), overlap_task),
    "builtin_qa": ("qa", (), qa_task),
    "builtin_replaced_qa": ("qa", (), replaced_qa_task),
    "builtin_replaced": ("tagging", ("original", "replaced"), replaced_task),
}


def builtin_task(name: str, train_size: int = 400, dev_size: int = 200, seed: int = 0) -> TaskData:
    """The built-in task `name` (a key of BUILTIN_TASKS) with `train_size` training and
    `dev_size` dev examples (examples), generated with `seed`; the same arguments give the
    same examples."""
    if name not in BUILTIN_TASKS:
        raise ValueError(f"{name!r}: not a built-in task; one of {', '.join(BUILTIN_TASKS)}")
    kind, labels, generate = BUILTIN_TASKS[name]
    rng = np.random.default_rng(seed)
    examples = generate(rng, builtin_documents_sentences(), train_size + dev_size)
    train, dev = _split(examples, train_size, dev_size, name)
    return TaskData(name, kind, train, dev, labels)
