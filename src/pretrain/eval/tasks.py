"""Downstream task data: the examples of each task kind and a task's train and dev sets."""

from dataclasses import dataclass, field

# classification: one text -> a class; pair: two texts -> a class; regression: one or two
# texts -> a number; qa: question + context -> a span of the context or none; tagging: one
# class per word.
TASK_KINDS = ("classification", "pair", "regression", "qa", "tagging")


@dataclass(frozen=True)
class TextExample:
    """A classification, pair or regression example: `label` is a class index (into the
    task's `labels`) or a real number (regression)."""

    text_a: str
    text_b: str | None
    label: int | float


@dataclass(frozen=True)
class SpanExample:
    """An extractive QA example: `answers` are (text, start character in `context`); empty
    when the question has no answer in the context (SQuAD v2)."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class TaggingExample:
    """A token-tagging example: one tag index (into the task's `labels`) per word."""

    words: tuple[str, ...]
    tags: tuple[int, ...]


Example = TextExample | SpanExample | TaggingExample


@dataclass
class TaskData:
    """A task's examples: `kind` one of TASK_KINDS; `labels` the class or tag names
    (classification, pair, tagging; empty otherwise)."""

    name: str
    kind: str
    train: list = field(default_factory=list)
    dev: list = field(default_factory=list)
    labels: tuple[str, ...] = ()

    @property
    def num_outputs(self) -> int:
        """Outputs of the task head per example (per token for tagging): classes, 1 for
        regression, 2 (start, end) for QA."""
        return {"regression": 1, "qa": 2}.get(self.kind, len(self.labels))
