"""Reading downstream task files (GLUE-style TSV, SQuAD JSON, JSONL, CSV)."""

from pretrain.eval.config import TaskConfig
from pretrain.eval.tasks import TaskData


class TaskFileError(ValueError):
    """A task file is missing or malformed; the message names the file and line."""


def read_task(task: TaskConfig) -> TaskData:
    """The train and dev examples of the task files `task` names."""
    raise TaskFileError(f"eval.task.format = {task.format!r}: not readable yet")
