"""Reading downstream task files: GLUE-style TSV directories, SQuAD JSON, plain JSONL and CSV
with named columns. A malformed row is a `TaskFileError` naming the file and line.

GLUE (`format: glue`, `name` the task): `<path>/train.tsv` and `<path>/dev.tsv` (MNLI:
`dev_matched.tsv`) in the layouts of the GLUE release, see `GLUE_LAYOUTS`.
SQuAD (`format: squad`): `<path>/train.json`, `<path>/dev.json` as SQuAD v1.1/v2.0 write
them; v2's `is_impossible` questions have no answer.
JSONL/CSV (`format: jsonl|csv`): `<path>/train.<ext>`, `<path>/dev.<ext>`; the task's
`text_a`, `text_b`, `label` settings name the columns (see `TaskConfig`).
"""

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pretrain.eval.config import TaskConfig
from pretrain.eval.tasks import SpanExample, TaggingExample, TaskData, TextExample


class TaskFileError(ValueError):
    """A task file is missing or malformed; the message names the file and line."""


# GLUE task -> (kind, has a header row, first text, second text, label: column names, or
# column indices for header-less files; class names in label order, () for regression)
GLUE_LAYOUTS: dict[str, tuple[str, bool, Any, Any, Any, tuple[str, ...]]] = {
    "sst2": ("classification", True, "sentence", None, "label", ("0", "1")),
    "cola": ("classification", False, 3, None, 1, ("0", "1")),
    "mrpc": ("pair", True, "#1 String", "#2 String", "Quality", ("0", "1")),
    "qqp": ("pair", True, "question1", "question2", "is_duplicate", ("0", "1")),
    "stsb": ("regression", True, "sentence1", "sentence2", "score", ()),
    "mnli": (
        "pair",
        True,
        "sentence1",
        "sentence2",
        "gold_label",
        ("contradiction", "entailment", "neutral"),
    ),
    "qnli": ("pair", True, "question", "sentence", "label", ("entailment", "not_entailment")),
    "rte": ("pair", True, "sentence1", "sentence2", "label", ("entailment", "not_entailment")),
}
DEFAULT_FILES = {
    "glue": ("train.tsv", "dev.tsv"),
    "squad": ("train.json", "dev.json"),
    "jsonl": ("train.jsonl", "dev.jsonl"),
    "csv": ("train.csv", "dev.csv"),
}


def task_files(task: TaskConfig) -> tuple[Path, Path]:
    """The train and dev files of `task`: its `train_file`/`dev_file` (relative to `path`) or
    the format's default names."""
    train, dev = DEFAULT_FILES[task.format]
    if task.format == "glue" and task.name == "mnli":
        dev = "dev_matched.tsv"
    root = Path(task.path or ".")
    paths = (root / (task.train_file or train), root / (task.dev_file or dev))
    for path in paths:
        if not path.is_file():
            raise TaskFileError(f"{path}: task file not found (eval.task.path = {task.path!r})")
    return paths


def read_task(task: TaskConfig) -> TaskData:
    """The train and dev examples of the task files `task` names."""
    train_path, dev_path = task_files(task)
    if task.format == "glue":
        if task.name not in GLUE_LAYOUTS:
            raise TaskFileError(
                f"eval.task.name = {task.name!r}: not a GLUE task; one of {', '.join(GLUE_LAYOUTS)}"
            )
        kind, *_, labels = GLUE_LAYOUTS[task.name]
        read = lambda path: list(read_glue(path, task.name))  # noqa: E731
    elif task.format == "squad":
        kind, labels = "qa", ()
        read = read_squad
    else:
        kind = task.kind
        rows = read_jsonl if task.format == "jsonl" else read_csv
        train_rows = list(rows(train_path))
        labels = tuple(task.labels) or _labels_seen(task, train_rows, train_path)
        read = lambda path: [  # noqa: E731
            row_example(task, kind, labels, row, path, line)
            for line, row in (train_rows if path == train_path else rows(path))
        ]
        return TaskData(task.name, kind, read(train_path), read(dev_path), labels)
    return TaskData(task.name, kind, read(train_path), read(dev_path), labels)


def _location(path: Path, line: int) -> str:
    return f"{path}:{line}"


def read_glue(path: Path, name: str) -> Iterator[TextExample]:
    """The examples of a GLUE TSV file in `name`'s layout (tab-separated, no quoting)."""
    kind, header, text_a, text_b, label, labels = GLUE_LAYOUTS[name]
    with path.open(encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        columns = None
        for line, row in enumerate(rows, start=1):
            if header and columns is None:
                columns = {column: i for i, column in enumerate(row)}
                missing = [c for c in (text_a, text_b, label) if c is not None and c not in columns]
                if missing:
                    raise TaskFileError(
                        f"{_location(path, line)}: the header lacks the column {missing[0]!r} "
                        f"of GLUE {name} (found: {', '.join(row)})"
                    )
                width = len(row)
                continue
            if not row:
                continue
            index = columns.__getitem__ if header else int
            needed = width if header else max(text_a, label) + 1
            if len(row) < needed:
                raise TaskFileError(
                    f"{_location(path, line)}: {len(row)} tab-separated columns, GLUE {name} "
                    f"rows have {needed}"
                )
            value = row[index(label)]
            yield TextExample(
                row[index(text_a)],
                row[index(text_b)] if text_b is not None else None,
                _label(value, kind, labels, path, line),
            )


def _label(value: Any, kind: str, labels: tuple[str, ...], path: Path, line: int) -> int | float:
    if kind == "regression":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TaskFileError(
                f"{_location(path, line)}: label {value!r} is not a number"
            ) from None
    if str(value) not in labels:
        raise TaskFileError(
            f"{_location(path, line)}: label {value!r} is not one of the task's labels "
            f"({', '.join(labels)})"
        )
    return labels.index(str(value))


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) per non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise TaskFileError(f"{_location(path, line)}: not JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise TaskFileError(f"{_location(path, line)}: not a JSON object")
            yield line, row


def read_csv(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, {column: value}) per non-blank row of a CSV file with a header row."""
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise TaskFileError(
                    f"{_location(path, reader.line_num)}: {len(row)} columns where the header "
                    f"has {len(header)}"
                )
            yield reader.line_num, dict(zip(header, row, strict=True))


def _column(row: dict, name: str, path: Path, line: int) -> Any:
    if name not in row:
        raise TaskFileError(
            f"{_location(path, line)}: no column {name!r} (found: {', '.join(map(str, row))})"
        )
    return row[name]


def _labels_seen(task: TaskConfig, rows: list[tuple[int, dict]], path: Path) -> tuple[str, ...]:
    if task.kind in ("regression", "qa"):
        return ()
    seen = set()
    for line, row in rows:
        value = _column(row, task.label, path, line)
        if task.kind == "tagging":
            seen.update(map(str, value if isinstance(value, list) else str(value).split()))
        else:
            seen.add(str(value))
    return tuple(sorted(seen))


def row_example(
    task: TaskConfig, kind: str, labels: tuple[str, ...], row: dict, path: Path, line: int
):
    """The example of one JSONL/CSV row. Tagging: words and tags are lists (JSONL) or
    space-separated (CSV); QA (JSONL only): answers a list of {text, answer_start}, empty
    for no answer; `id` the question id (default: file:line)."""
    if kind == "tagging":
        words, tags = (_column(row, c, path, line) for c in (task.text_a, task.label))
        words = words if isinstance(words, list) else str(words).split()
        tags = tags if isinstance(tags, list) else str(tags).split()
        if len(words) != len(tags):
            raise TaskFileError(f"{_location(path, line)}: {len(words)} words but {len(tags)} tags")
        return TaggingExample(
            tuple(map(str, words)), tuple(_label(t, kind, labels, path, line) for t in tags)
        )
    if kind == "qa":
        if task.text_b is None:
            raise TaskFileError(f"{path}: a qa task needs eval.task.text_b, the context column")
        question, context = (str(_column(row, c, path, line)) for c in (task.text_a, task.text_b))
        answers = _column(row, task.label, path, line)
        return SpanExample(
            str(row.get("id", f"{path.name}:{line}")),
            question,
            context,
            _answers(answers, context, f"{_location(path, line)}"),
        )
    text_b = str(_column(row, task.text_b, path, line)) if task.text_b else None
    label = _label(_column(row, task.label, path, line), kind, labels, path, line)
    return TextExample(str(_column(row, task.text_a, path, line)), text_b, label)


def _answers(answers: Any, context: str, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(answers, list):
        raise TaskFileError(f"{where}: answers must be a list of {{text, answer_start}}")
    spans = []
    for answer in answers:
        try:
            text, start = str(answer["text"]), int(answer["answer_start"])
        except (TypeError, KeyError, ValueError):
            raise TaskFileError(
                f'{where}: an answer must be {{"text": ..., "answer_start": ...}}, got {answer!r}'
            ) from None
        if context[start : start + len(text)] != text:
            raise TaskFileError(
                f"{where}: answer {text!r} is not at character {start} of the context"
            )
        spans.append((text, start))
    return tuple(spans)


def read_squad(path: Path) -> list[SpanExample]:
    """The questions of a SQuAD v1.1/v2.0 JSON file; errors name the file and the line of
    the question's id."""
    raw = path.read_text(encoding="utf-8")
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as error:
        raise TaskFileError(f"{_location(path, error.lineno)}: not JSON ({error.msg})") from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise TaskFileError(f"{_location(path, 1)}: not SQuAD JSON (no top-level 'data' list)")
    examples = []
    for article in document["data"]:
        for paragraph in article.get("paragraphs", []):
            context = paragraph.get("context")
            for qa in paragraph.get("qas", []):
                qid = str(qa.get("id"))
                found = raw.find(json.dumps(qid))
                line = raw.count("\n", 0, found) + 1 if found >= 0 else 1
                where = f"{_location(path, line)} (question {qid})"
                if not isinstance(context, str) or not isinstance(qa.get("question"), str):
                    raise TaskFileError(
                        f"{where}: a question needs 'question' and its paragraph 'context'"
                    )
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                examples.append(
                    SpanExample(qid, qa["question"], context, _answers(answers, context, where))
                )
    return examples
