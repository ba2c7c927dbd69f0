"""Batches for compression: the pretraining stream (shards -> packed, MLM-masked sequences,
`pretrain.data.stream.EpochStream`) and a downstream task's training examples
(`pretrain-eval`'s built-in tasks and files, tokenized as `pretrain-eval` does)."""

from collections.abc import Iterator
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


def task_batches(
    task_name: str,
    tokenizer_dir: str | Path,
    max_seq_length: int,
    batch_size: int,
    train_size: int = 400,
    seed: int = 0,
) -> list[dict[str, Tensor]]:
    """The training examples of the built-in `pretrain-eval` task `task_name`, tokenized with
    the fast tokenizer of `tokenizer_dir` (an export directory) to `max_seq_length` tokens, in
    batches of `batch_size` (input_ids, token_type_ids, attention_mask): the data of
    task-specific distillation (the intermediate layers, without labels)."""
    from transformers import AutoTokenizer

    from pretrain.eval.builtin_tasks import builtin_task
    from pretrain.eval.features import text_features

    try:
        task = builtin_task(task_name, train_size, 1, seed)
    except ValueError as error:
        raise ConfigError(f"method.task = {task_name!r}: {error}") from None
    if task.kind not in ("classification", "pair", "regression"):
        raise ConfigError(
            f"method.task = {task_name!r}: a {task.kind} task; task distillation reads text, "
            "pair or regression tasks"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    rows = text_features(tokenizer, task.train, max_seq_length, task.kind == "regression")
    keys = ("input_ids", "token_type_ids", "attention_mask")
    return [
        {key: rows.tensors[key][start : start + batch_size] for key in keys if key in rows.tensors}
        for start in range(0, len(rows), batch_size)
    ]
