"""Typed schema of `pretrain-eval`'s config (conf/evaluate.yaml and the `eval/` group),
checked when composed: a bad value fails before any model is loaded, naming the key."""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from pretrain.errors import require, require_positive, require_unit_interval
from pretrain.eval.tasks import TASK_KINDS

# What a task head reads (pretrain.eval.heads; named here so the schema loads without torch)
LAYER_CHOICES = ("last", "second_to_last", "concat_last4", "concat_all", "scalar_mix")
POOLINGS = ("cls", "mean")
MODES = ("finetune", "features")  # every weight trained | the encoder frozen

TASK_FORMATS = ("builtin", "glue", "squad", "jsonl", "csv")


@dataclass
class TaskConfig:
    """Where a task's examples come from. `format`: builtin (generated: `name` is a built-in
    task, `train_size`/`dev_size` examples, `seed`), glue (`path` a GLUE task directory,
    `name` the GLUE task: sst2, cola, mrpc, qqp, stsb, mnli, qnli, rte), squad (SQuAD JSON
    files), jsonl or csv (`columns` name the fields). `train_file`/`dev_file` are relative to
    `path`; `kind` is needed for jsonl/csv; `labels` fixes the class order (default: sorted
    labels of the training file)."""

    name: str = "builtin_order"
    format: str = "builtin"
    kind: str | None = None
    path: str | None = None
    train_file: str | None = None
    dev_file: str | None = None
    text_a: str = (
        "text_a"  # jsonl/csv column of the (first) text, the question (qa), the words (tagging)
    )
    text_b: str | None = (
        None  # jsonl/csv column of the second text (pair, regression), the context (qa)
    )
    label: str = "label"  # jsonl/csv column of the label, the answers (qa), the tags (tagging)
    labels: list[str] = field(default_factory=list)
    train_size: int = 400  # examples (builtin)
    dev_size: int = 200  # examples (builtin)
    seed: int = 0  # of the built-in task's examples

    def __post_init__(self) -> None:
        require(
            self.format in TASK_FORMATS,
            "eval.task.format",
            self.format,
            f"must be one of {', '.join(TASK_FORMATS)}",
        )
        require(
            self.kind is None or self.kind in TASK_KINDS,
            "eval.task.kind",
            self.kind,
            f"must be null or one of {', '.join(TASK_KINDS)}",
        )
        require(
            self.format not in ("jsonl", "csv") or self.kind is not None,
            "eval.task.kind",
            self.kind,
            f"a {self.format} task must say its kind: one of {', '.join(TASK_KINDS)}",
        )
        require(
            self.format == "builtin" or self.path is not None,
            "eval.task.path",
            self.path,
            f"a {self.format} task needs the directory of its files",
        )
        require_positive(self, ("train_size", "dev_size"), "eval.task")


@dataclass
class EvalConfig:
    """A task and how to fit it (the `eval/` group). Units: `lr` per optimizer step at its
    peak; `batch_size` examples (QA: windows) per step; `epochs` passes over the training
    set; `warmup_fraction` of all optimizer steps; `max_seq_length`, `doc_overlap_tokens`
    (QA windows: context tokens consecutive windows share) and `max_answer_tokens` in
    tokens. `probe_epochs` (finetune mode): epochs of fitting the head alone on the frozen
    encoder at `probe_lr` before every weight is trained (LP-FT: Kumar et al. 2022, a fitted
    head distorts the pretrained features less than a random one); 0 (default) starts from
    a random head. `standardize`: the head reads every layer's features standardized by
    their mean and standard deviation over the training set (computed once, from the encoder
    as it is before training; kept through LP-FT's fine-tuning), as a linear probe's inputs
    usually are: the layers concatenated differ in scale."""

    task: TaskConfig = field(default_factory=TaskConfig)
    mode: str = "finetune"
    layers: str = "last"
    pooling: str = "cls"
    lr: float = 5e-5
    batch_size: int = 32
    epochs: int = 3
    probe_epochs: int = 0
    probe_lr: float = 3e-2
    standardize: bool = False
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    max_seq_length: int = 128
    doc_overlap_tokens: int = 32
    max_answer_tokens: int = 30
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.mode in MODES, "eval.mode", self.mode, f"must be one of {', '.join(MODES)}")
        require(
            self.layers in LAYER_CHOICES,
            "eval.layers",
            self.layers,
            f"must be one of {', '.join(LAYER_CHOICES)}",
        )
        require(
            self.pooling in POOLINGS,
            "eval.pooling",
            self.pooling,
            f"must be one of {', '.join(POOLINGS)}",
        )
        require_positive(
            self,
            ("lr", "probe_lr", "batch_size", "epochs", "max_seq_length", "max_answer_tokens"),
            "eval",
        )
        require(self.probe_epochs >= 0, "eval.probe_epochs", self.probe_epochs, "must be >= 0")
        require_unit_interval("eval.warmup_fraction", self.warmup_fraction, open_low=False)
        require_unit_interval("eval.dropout", self.dropout, open_low=False)
        require(
            self.doc_overlap_tokens >= 0,
            "eval.doc_overlap_tokens",
            self.doc_overlap_tokens,
            "must be >= 0 (QA: less than half of max_seq_length)",
        )


@dataclass
class EncoderConfig:
    """The encoder to evaluate: `path` a `pretrain` checkpoint or an exported Hugging Face
    directory; `init` pretrained (its weights) or random (same size, fresh weights: the
    baseline)."""

    path: str = "exports/demo-bert"
    init: str = "pretrained"

    def __post_init__(self) -> None:
        require(
            self.init in ("pretrained", "random"),
            "encoder.init",
            self.init,
            "must be pretrained or random",
        )


@dataclass
class EvalRunConfig:
    """One evaluation: the encoder, the task and its recipe, where the result goes
    (`out_dir`, default: the pretraining run's directory; the result is
    `<out_dir>/eval/<result_name>.json`), the accelerator (Lightning's: cpu, gpu, auto) and
    `wandb`: log the result to the pretraining run's wandb group (pretrain.eval.tracking):
    auto (when that run logged to wandb), always or never."""

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out_dir: str | None = None
    result_name: str = "${eval.task.name}"
    accelerator: str = "cpu"
    wandb: str = "auto"

    def __post_init__(self) -> None:
        from pretrain.eval.tracking import WANDB_CHOICES

        require(
            self.wandb in WANDB_CHOICES,
            "wandb",
            self.wandb,
            f"must be one of {', '.join(WANDB_CHOICES)}",
        )


def register_eval_schema() -> None:
    """Register the schema so conf/evaluate.yaml can name it in its defaults list."""
    ConfigStore.instance().store(name="evaluate_schema", node=EvalRunConfig)
