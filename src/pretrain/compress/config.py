"""Typed schema of `pretrain-compress` (conf/compress/compress.yaml and its `method/` and
`student/` groups), checked when composed: a bad value fails naming its key."""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from pretrain.errors import require, require_positive

PRUNE_KINDS = ("heads", "magnitude", "movement")


@dataclass
class CompressData:
    """The pretraining stream the methods train on: prepared shards (`pretrain-data`),
    sequences of `max_seq_length` tokens, `batch_size` sequences a step, MLM masks seeded by
    `seed`; `eval_batches` batches (the first of the stream) score MLM accuracy."""

    shards_dir: str = "data/builtin"
    max_seq_length: int = 128
    batch_size: int = 16
    seed: int = 0
    eval_batches: int = 4

    def __post_init__(self) -> None:
        require_positive(self, ("max_seq_length", "batch_size", "eval_batches"), "data")


@dataclass
class TinyBertMethod:
    """TinyBERT (pretrain.compress.tinybert): `intermediate_steps` then `prediction_steps`
    optimizer steps of general distillation on the pretraining stream at `lr`; with `task`
    (a built-in `pretrain-eval` classification or pair task) task-specific distillation:
    the teacher fine-tuned for `teacher_task_steps` steps at `teacher_lr`, then `task_steps`
    steps of the layer-wise losses plus the teacher's soft class distribution on its training
    examples (no augmentation). `temperature` softens the soft targets."""

    _target_: str = "pretrain.compress.run.distil_tinybert"
    name: str = "tinybert"
    intermediate_steps: int = 200
    prediction_steps: int = 100
    lr: float = 1e-3
    temperature: float = 1.0
    task: str | None = None
    task_steps: int = 100
    teacher_task_steps: int = 100
    teacher_lr: float = 5e-4

    def __post_init__(self) -> None:
        require_positive(self, ("lr", "temperature", "teacher_lr"), "method")
        for key in ("intermediate_steps", "prediction_steps", "task_steps", "teacher_task_steps"):
            require(getattr(self, key) >= 0, f"method.{key}", getattr(self, key), "must be >= 0")


@dataclass
class QuantizeMethod:
    """torch dynamic int8, shipped as TorchScript (pretrain.compress.quantize): `qat_steps`
    0 = post-training dynamic quantization; more = that many Q8BERT-style quantization-aware
    MLM fine-tuning steps (torchao's fake quantizers) at `lr` first."""

    _target_: str = "pretrain.compress.run.quantize_int8"
    name: str = "int8"
    qat_steps: int = 0
    lr: float = 5e-5

    def __post_init__(self) -> None:
        require(self.qat_steps >= 0, "method.qat_steps", self.qat_steps, "must be >= 0")
        require_positive(self, ("lr",), "method")


@dataclass
class PruneMethod:
    """Pruning (pretrain.compress.prune): `kind` heads (the `head_fraction` least important
    heads, importance over `importance_steps` batches), magnitude or movement (weights to
    `sparsity`; movement over `steps` MLM fine-tuning steps at `lr`)."""

    _target_: str = "pretrain.compress.run.prune_model"
    name: str = "pruned"
    kind: str = "heads"
    head_fraction: float = 0.5
    importance_steps: int = 8
    sparsity: float = 0.5
    steps: int = 100
    lr: float = 5e-5

    def __post_init__(self) -> None:
        require(
            self.kind in PRUNE_KINDS, "method.kind", self.kind, f"one of {', '.join(PRUNE_KINDS)}"
        )
        require(
            0 <= self.head_fraction < 1,
            "method.head_fraction",
            self.head_fraction,
            "must be in [0, 1)",
        )
        require(0 <= self.sparsity < 1, "method.sparsity", self.sparsity, "must be in [0, 1)")
        require_positive(self, ("importance_steps", "steps", "lr"), "method")


@dataclass
class CompressConfig:
    """One compression: the `teacher` (the model to compress: a `pretrain` .ckpt or a Hugging
    Face directory), the `method`, the `student` model config (TinyBERT only), the data, and
    `out_dir`, the Hugging Face directory written (with compression.json, the report)."""

    teacher: str = "exports/demo-bert"
    out_dir: str = MISSING
    method: Any = MISSING
    student: dict[str, Any] = field(default_factory=dict)
    data: CompressData = field(default_factory=CompressData)


def register_compress_schema() -> None:
    """Register the schemas so the YAML files can name them in their defaults lists."""
    store = ConfigStore.instance()
    store.store(name="compress_schema", node=CompressConfig)
    store.store(group="method", name="tinybert_schema", node=TinyBertMethod)
    store.store(group="method", name="quantize_schema", node=QuantizeMethod)
    store.store(group="method", name="prune_schema", node=PruneMethod)
