"""Batches for compression: the pretraining stream (shards -> packed, MLM-masked sequences,
`pretrain.data.stream.EpochStream`) and a downstream task's training examples
(`pretrain-eval`'s built-in tasks and files, tokenized as `pretrain-eval` does)."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from pretrain.errors import ConfigError

STREAM_FIELDS = ("input_ids", "token_type_ids", "attention_mask", "labels")


def outside_hydra_app(compose, overrides: list[str]):
    """`compose(overrides)` (a Hydra compose of another config directory) from inside a
    running Hydra app: the app's global Hydra is set aside and restored afterwards."""
    from hydra.core.global_hydra import GlobalHydra

    global_hydra = GlobalHydra.instance()
    running = global_hydra.hydra if global_hydra.is_initialized() else None
    global_hydra.clear()
    try:
        return compose(overrides)
    finally:
        global_hydra.clear()
        if running is not None:
            global_hydra.initialize(running)


class PretrainingBatches:
    """The MLM pretraining stream of `shards_dir`: batches of `batch_size` full-sentence
    sequences of `max_seq_length` tokens (input_ids, token_type_ids, attention_mask, labels
    with -100 where not predicted), epoch after epoch; seeded by `seed`, as `pretrain` reads
    it (the same order and masks for the same arguments)."""

    def __init__(
        self, shards_dir: str | Path, max_seq_length: int, batch_size: int, seed: int
    ) -> None:
        from pretrain.config import compose_config
        from pretrain.runtime.run import build_stream

        if not (Path(shards_dir) / "manifest.json").is_file():
            raise ConfigError(
                f"data.shards_dir = {str(shards_dir)!r}: no manifest.json there; prepare the "
                "corpus with `pretrain-data prepare` (make data/builtin/manifest.json)"
            )
        overrides = [
            f"data.shards_dir={Path(shards_dir).resolve()}",
            "objective=mlm",
            "data=full_sentences",
            f"data.max_seq_length={max_seq_length}",
            f"data.batch_size={batch_size}",
            "data.num_workers=0",
            f"seed={seed}",
        ]
        run, self.spec, _ = build_stream(outside_hydra_app(compose_config, overrides))
        self.tokenizer_dir = Path(run.data.tokenizer_dir)  # the corpus's, checked against it
        self.epoch = 0

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        """One epoch of batches; the next iteration reads the next epoch (new masks)."""
        from pretrain.data.stream import EpochStream

        epoch, self.epoch = self.epoch, self.epoch + 1
        for batch in EpochStream(self.spec, epoch):
            yield {key: batch[key] for key in STREAM_FIELDS if key in batch}


@dataclass
class TaskBatches:
    """A built-in task's training and dev examples in batches (input_ids, token_type_ids,
    attention_mask, labels: class indices) and its number of classes."""

    train: list[dict[str, Tensor]]
    dev: list[dict[str, Tensor]]
    classes: int


def task_batches(
    task_name: str,
    tokenizer_dir: str | Path,
    max_seq_length: int,
    batch_size: int,
    train_size: int = 400,
    dev_size: int = 200,
    seed: int = 0,
) -> TaskBatches:
    """The examples of the built-in `pretrain-eval` classification or pair task `task_name`,
    tokenized with the fast tokenizer of `tokenizer_dir` (an export directory) to
    `max_seq_length` tokens as `pretrain-eval` does, in batches of `batch_size`: the data of
    task-specific distillation."""
    from transformers import AutoTokenizer

    from pretrain.eval.builtin_tasks import builtin_task
    from pretrain.eval.features import text_features

    try:
        task = builtin_task(task_name, train_size, dev_size, seed)
    except ValueError as error:
        raise ConfigError(f"method.task = {task_name!r}: {error}") from None
    if task.kind not in ("classification", "pair"):
        raise ConfigError(
            f"method.task = {task_name!r}: a {task.kind} task; task distillation's soft targets "
            "are class distributions, so it reads classification or pair tasks"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    keys = ("input_ids", "token_type_ids", "attention_mask", "labels")

    def batches(examples) -> list[dict[str, Tensor]]:
        rows = text_features(tokenizer, examples, max_seq_length)
        return [
            {k: rows.tensors[k][start : start + batch_size] for k in keys if k in rows.tensors}
            for start in range(0, len(rows), batch_size)
        ]

    return TaskBatches(batches(task.train), batches(task.dev), len(task.labels))
