"""Typed schemas of the composed run config.

Every config group in `conf/` is checked against one of these dataclasses. OmegaConf checks
types while Hydra composes; `validate` then builds the dataclasses, whose `__post_init__`
checks values and cross-group constraints, so a bad value fails before training starts with
an error that names the key.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain.batching import BatchPlan, batch_plan
from pretrain.errors import ConfigError, require, require_unit_interval
from pretrain.models.configs import KERNEL_IMPLS, MODEL_SCHEMAS, ModelConfig
from pretrain.objectives.configs import ObjectiveConfig, objective_schemas

LR_SCALINGS = ("none", "linear", "sqrt")
STRATEGIES = ("auto", "ddp", "deepspeed")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "64-true")
T = TypeVar("T")


def stage_context(run: "TrainConfig") -> tuple[tuple[int, ...] | None, tuple[float, ...] | None]:
    """The stages' sequence lengths (objective.stages[k].max_seq_length, else
    data.max_seq_length) and global RoPE thetas (.global_rope_theta, else the model's), each
    None when no stage sets it. ConfigError naming objective.stages[k].<key> when a length is
    not in 8 .. data.max_seq_length (the run's longest, which sizes its shapes), a length
    stage's format does not pack sentences, or the model has no global RoPE theta."""
    from pretrain.data.input_formats import INPUT_FORMATS

    stages = run.objective.stages or []
    lengths, thetas = [], []
    for number, stage in enumerate(stages):
        where = f"objective.stages[{number}]"
        length = stage.get("max_seq_length", run.data.max_seq_length)
        require(
            isinstance(length, int) and 8 <= length <= run.data.max_seq_length,
            f"{where}.max_seq_length",
            length,
            f"must be a whole number of tokens from 8 to data.max_seq_length "
            f"({run.data.max_seq_length}, the run's longest)",
        )
        require(
            length == run.data.max_seq_length or INPUT_FORMATS[run.data.format].staged_lengths,
            f"{where}.max_seq_length",
            length,
            f"data.format={run.data.format} does not pack sentences to a length; use "
            "data=full_sentences or doc_sentences",
        )
        default_theta = getattr(run.model, "global_rope_theta", None)
        require(
            "global_rope_theta" not in stage or default_theta is not None,
            f"{where}.global_rope_theta",
            stage.get("global_rope_theta"),
            f"model {run.model.name} has no RoPE theta (a modernbert model has)",
        )
        theta = stage.get("global_rope_theta", default_theta)
        require(
            theta is None or theta > 0,
            f"{where}.global_rope_theta",
            theta,
            "must be positive",
        )
        lengths.append(length)
        thetas.append(theta)
    staged_lengths = any(n != run.data.max_seq_length for n in lengths)
    staged_thetas = any("global_rope_theta" in stage for stage in stages)
    return (tuple(lengths) if staged_lengths else None, tuple(thetas) if staged_thetas else None)


# The classes a model or objective section without `_target_` (a partial plain config) names.
DEFAULT_TARGETS = {
    "model": ModelConfig._target_,
    "objective": ObjectiveConfig._target_,
}


def component_config(
    group: str, values: "ModelConfig | ObjectiveConfig | Mapping[str, Any]"
) -> "ModelConfig | ObjectiveConfig":
    """Build and check the config dataclass of the class named by `values["_target_"]` (its
    `config_class`) for the config group `group` ("model", "objective"): types are converted
    and checked by OmegaConf, values by the dataclass; errors name the key."""
    from hydra.utils import get_class

    if is_dataclass(values) and not isinstance(values, type):  # typed while composed
        if type(values) is get_class(values._target_).config_class:
            return values
        values = OmegaConf.to_container(OmegaConf.structured(values))  # another schema's
    values = OmegaConf.create(values) if not isinstance(values, DictConfig) else values
    target = values.get("_target_")
    try:
        schema = get_class(target).config_class
    except Exception as error:
        raise ConfigError(
            f"{group}._target_ = {target!r}: not a {group} class with a config_class ({error})"
        ) from error
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(values) - known)
    require(
        not unknown,
        f"{group}.{unknown[0] if unknown else ''}",
        values.get(unknown[0]) if unknown else None,
        f"not a setting of {target} (its settings: {', '.join(sorted(known))})",
    )
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as error:
        raise ConfigError(f"{group}.{error.full_key}: {error.msg}") from error


COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")  # trainer.compile_backend
DEFAULT_STREAM_PARTITIONS = 64  # data.stream_partitions: null, for formats without memory


@dataclass
class DataConfig:
    """Where the shards are and how documents become batches. Lengths in tokens."""

    format: str = "segment_pair"
    shards_dir: str = "data/builtin"
    tokenizer_dir: str | None = None
    max_seq_length: int = 128
    short_seq_probability: float = 0.1
    nsp_random_probability: float = 0.5
    batch_size: int = 32
    num_workers: int = 0
    shuffle_buffer_documents: int = 1000
    random_document_pool: int = 100
    holdout_shards: int = 0
    # Canonical partitions of every epoch's stream: the global sample order depends on them
    # and on the seed only, never on nodes, ranks or workers; ranks must divide it.
    # null: derived, one per memory slot of the global batch for xlnet_memory, else 64.
    stream_partitions: int | None = DEFAULT_STREAM_PARTITIONS
    # Samples per optimizer step over all ranks; null = batch_size x accumulation x ranks.
    # When set, trainer.accumulate_grad_batches is derived from it (pretrain.batching).
    global_batch_size: int | None = None
    # Batches by token budget instead (RoBERTa): about this many tokens per optimizer step
    # over all ranks, in micro-batches of a varying number of sequences (data/stream.py);
    # null = batches of data.batch_size sequences. Excludes global_batch_size.
    tokens_per_batch: int | None = None
    # Batch-size warm-up (ModernBERT; pretrain/data/batch_warmup.py): the global batch starts
    # at batch_size_warmup_start samples and grows in multiples of it to global_batch_size
    # over the first batch_size_warmup_tokens tokens; null = the full batch from the start.
    batch_size_warmup_tokens: int | None = None
    batch_size_warmup_start: int | None = None
    # Packed rows (full_sentences) carry each token's document (document_ids, batch x seq),
    # and the model attends within a document only, positions restarting at each (ModernBERT).
    document_masks: bool = False
    # Read every shard whole and check it (sha256, blocks, counts) before training starts.
    verify_shards: bool = False
    # A shard that fails its checks, or repeats another shard's content (the manifest's
    # sha256 of shards and blocks): `error` stops the run naming it; `skip` leaves it out of
    # the epoch (every rank alike), with a warning line per shard and a count.
    bad_shards: str = "error"
    # A corpus at a URL (s3://, gs://, az://, hf://, http(s)://) is read through a local cache
    # (pretrain.storage): its directory (null: node-local $TMPDIR/pretrain-cache-<user>,
    # shared by the ranks of a node), its limit in bytes (null: unbounded; least recently used
    # shards evicted, never one in use), shards fetched ahead of each reader, attempts per
    # download (backoff with jitter between), and fsspec's options (endpoint_url, profile...;
    # keep secrets in the environment, as this config is saved with every checkpoint).
    cache_dir: str | None = None
    cache_limit: int | None = None
    prefetch_shards: int = 8
    download_attempts: int = 5
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from pretrain.data.input_formats import INPUT_FORMATS  # torch: only when validated

        require(
            self.cache_limit is None or self.cache_limit > 0,
            "data.cache_limit",
            self.cache_limit,
            "must be a positive number of bytes, or null (unbounded)",
        )
        require(
            self.prefetch_shards >= 0,
            "data.prefetch_shards",
            self.prefetch_shards,
            "must be 0 or more",
        )
        require(
            self.download_attempts >= 1,
            "data.download_attempts",
            self.download_attempts,
            "must be at least 1",
        )

        require(
            self.format in INPUT_FORMATS,
            "data.format",
            self.format,
            f"must be one of {', '.join(INPUT_FORMATS)}",
        )
        require(
            self.max_seq_length >= 8,
            "data.max_seq_length",
            self.max_seq_length,
            "must be at least 8",
        )
        require_unit_interval(
            "data.short_seq_probability", self.short_seq_probability, open_low=False
        )
        require_unit_interval("data.nsp_random_probability", self.nsp_random_probability)
        require(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be at least 1")
        require(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be 0 or more")
        require(
            self.shuffle_buffer_documents >= 1,
            "data.shuffle_buffer_documents",
            self.shuffle_buffer_documents,
            "must be at least 1",
        )
        require(
            self.bad_shards in ("error", "skip"),
            "data.bad_shards",
            self.bad_shards,
            "must be error or skip",
        )
        require(
            self.stream_partitions is None or self.stream_partitions >= 1,
            "data.stream_partitions",
            self.stream_partitions,
            "must be at least 1",
        )
        require(
            self.random_document_pool >= 1,
            "data.random_document_pool",
            self.random_document_pool,
            "must be at least 1",
        )
        require(
            self.global_batch_size is None or self.global_batch_size >= 1,
            "data.global_batch_size",
            self.global_batch_size,
            "must be at least 1, or null (batch_size x accumulation x ranks)",
        )
        require(
            self.tokens_per_batch is None or self.tokens_per_batch >= self.max_seq_length,
            "data.tokens_per_batch",
            self.tokens_per_batch,
            "must be at least data.max_seq_length, or null (batches of data.batch_size)",
        )
        require(
            self.tokens_per_batch is None or self.global_batch_size is None,
            "data.tokens_per_batch",
            self.tokens_per_batch,
            "sets the batch in tokens: leave data.global_batch_size null with it",
        )
        self.check_batch_size_warmup()

    def check_batch_size_warmup(self) -> None:
        """data.batch_size_warmup_*: both set or both null; the start divides the full
        global batch (set explicitly), and batches are counted in samples."""
        tokens, start = self.batch_size_warmup_tokens, self.batch_size_warmup_start
        if tokens is None and start is None:
            return
        require(
            tokens is not None and tokens >= 1,
            "data.batch_size_warmup_tokens",
            tokens,
            "must be a positive number of tokens when data.batch_size_warmup_start is set",
        )
        require(
            self.global_batch_size is not None and start is not None and start >= 1,
            "data.batch_size_warmup_start",
            start,
            "must be a positive number of samples, with data.global_batch_size set (the full "
            "batch the warm-up grows to)",
        )
        require(
            self.global_batch_size % start == 0,
            "data.batch_size_warmup_start",
            start,
            f"must divide data.global_batch_size ({self.global_batch_size}): the batch grows "
            "in whole multiples of it",
        )


@dataclass
class OptimConfig:
    """Optimizer (a `_partial_` receiving the parameter groups) and learning-rate schedule."""

    optimizer: dict = field(
        default_factory=lambda: {
            "_target_": "torch.optim.AdamW",
            "_partial_": True,
            "lr": 1e-4,
            "betas": [0.9, 0.999],
            "eps": 1e-6,
            "weight_decay": 0.01,
        }
    )
    schedule: str = "linear"  # linear | constant | wsd (warm-up, stable, decay)
    # wsd: the share of the steps after the warm-up that decay to 0, and the decay's shape
    # (linear | 1-sqrt); pretrain/runtime/schedule.py
    decay_fraction: float = 0.1
    decay_shape: str = "1-sqrt"
    warmup_steps: int = 10000
    # Optimizer steps over which `linear` decays to 0 (null: trainer.max_steps); set it to stop
    # early with trainer.max_steps and continue later exactly.
    schedule_steps: int | None = None
    # A later launch with trainer.max_steps past the end of a decaying schedule (stored in the
    # checkpoint): refuse (an error), or rewarm (warm up again, then decay to the new
    # max_steps); see pretrain/runtime/schedule.py.
    extend: str = "refuse"
    # Warm-up in samples instead of optimizer steps (null: use warmup_steps); the same
    # samples of warm-up whatever the global batch size.
    warmup_samples: int | None = None
    # optimizer.lr is the rate at reference_batch_size samples per step; the run's rate is
    # scaled by (global batch / reference) for linear, its square root for sqrt.
    lr_scaling: str = "none"
    reference_batch_size: int = 256
    # Optimizer kernels: auto (apex's FusedAdam/FusedLAMB on CUDA when apex is installed, else
    # torch's, fused on CUDA) | torch | apex (an error where apex cannot run); pretrain/runtime/kernels.py.
    impl: str = "auto"

    def __post_init__(self) -> None:
        require(
            self.impl in KERNEL_IMPLS,
            "optim.impl",
            self.impl,
            f"must be one of {', '.join(KERNEL_IMPLS)}",
        )
        lr = self.optimizer["lr"] if "lr" in self.optimizer else None
        number = isinstance(lr, int | float) and not isinstance(lr, bool)
        require(
            number and math.isfinite(lr) and lr > 0,
            "optim.optimizer.lr",
            lr,
            "must be set to a finite positive number",
        )
        require(
            self.lr_scaling in LR_SCALINGS,
            "optim.lr_scaling",
            self.lr_scaling,
            f"must be one of {', '.join(LR_SCALINGS)}",
        )
        require(
            self.reference_batch_size >= 1,
            "optim.reference_batch_size",
            self.reference_batch_size,
            "must be at least 1 (samples per optimizer step)",
        )
        require(
            self.warmup_samples is None or self.warmup_samples >= 0,
            "optim.warmup_samples",
            self.warmup_samples,
            "must be 0 or more, or null (use optim.warmup_steps)",
        )
        require(
            0 < self.decay_fraction <= 1,
            "optim.decay_fraction",
            self.decay_fraction,
            "must be in (0, 1] (the share of the steps after the warm-up that decay)",
        )
        require(
            self.decay_shape in ("linear", "1-sqrt"),
            "optim.decay_shape",
            self.decay_shape,
            "must be 'linear' or '1-sqrt'",
        )
        require(
            self.schedule in ("linear", "constant", "wsd"),
            "optim.schedule",
            self.schedule,
            "must be 'linear', 'constant' or 'wsd'",
        )
        require(
            self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be 0 or more"
        )
        require(
            self.schedule_steps is None or self.schedule_steps >= 1,
            "optim.schedule_steps",
            self.schedule_steps,
            "must be at least 1 (optimizer steps), or null (trainer.max_steps)",
        )
        require(
            self.extend in ("refuse", "rewarm"),
            "optim.extend",
            self.extend,
            "must be 'refuse' or 'rewarm'",
        )


@dataclass
class TrainerConfig:
    """Lightning Trainer settings; steps are optimizer steps."""

    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    precision: str = "32-true"
    max_steps: int = 1000
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 500
    keep_checkpoints: int = 2
    enable_progress_bar: bool = True
    # torch's CPU threads per training process; null: OMP_NUM_THREADS when exported, else
    # the cores this process may use split between the node's ranks (pretrain.runtime.threads)
    num_threads: int | None = None
    # GPU speed switches (conf/trainer/gpu.yaml turns them on; no effect on a CPU run):
    # TF32 tensor-core matmuls and convolutions for fp32 work (torch.backends.cuda/cudnn);
    tf32: bool = False
    # page-locked host batches, so the copy to the GPU does not block the step;
    pin_memory: bool = False
    # torch.compile the objective module in place (nn.Module.compile: checkpoint and export
    # names unchanged); the first steps of each batch shape are slower while it compiles.
    compile: bool = False
    # torch.compile's backend: inductor (generated kernels), or aot_eager / eager (tracing
    # only, no code generated: to check that a model compiles, in seconds, or to debug).
    compile_backend: str = "inductor"
    # A non-finite loss or gradient on any rank: skip the optimizer step (counted in
    # train/skipped_steps) or stop the run with an error.
    nonfinite: str = "skip"
    # Skipped optimizer steps in a row after which the run stops (exit status 3): a run whose
    # every step is non-finite has diverged; null: no bound.
    max_consecutive_skipped_steps: int | None = 10
    # Skipped optimizer steps in all (this run, across launches) after which it stops (exit
    # status 3): a run that keeps skipping is sick even if it recovers in between; null: no bound.
    max_skipped_steps: int | None = 100
    # The peak of one device in TFLOP/s at the run's precision (e.g. 989 for an H100's dense
    # bf16), for train/mfu = train/model_tflops / peak_tflops; null: the table of
    # pretrain/models/flops.py for a known GPU; no MFU on a CPU or another device unless set.
    peak_tflops: float | None = None
    # Signal that means "save last.ckpt at the next step boundary, requeue, stop" (sbatch
    # --signal / the launcher's); SIGTERM always saves and stops. null: SIGTERM only.
    preemption_signal: str | None = "USR1"
    # Seconds a collective (all-reduce, barrier) may wait for the other ranks before the run
    # fails with an error naming the step, instead of hanging until the job's time limit.
    collective_timeout_s: float = 600.0
    # Seconds the ranks wait for each other until they meet at a launch's first step (the
    # rendezvous, loading a checkpoint, starting data-loader workers), when longer than
    # collective_timeout_s: a node that starts late is waited for, a stuck rank is found soon.
    startup_timeout_s: float = 600.0
    # Seconds a rank may go without finishing a micro-batch before its watchdog writes every
    # thread's stack to its log and all ranks exit with status 75 (requeued, resumed from the
    # last checkpoint): a stuck data-loader worker, a dead mount (pretrain.cluster.watchdog).
    # Until a launch's first micro-batch ends it waits startup_timeout_s longer. 0 or null: off.
    hang_timeout_s: float | None = 1800.0
    # Held-out evaluation (pretrain.runtime.validation) every this many optimizer steps and at the
    # last, when data.holdout_shards >= 1; null: none.
    val_check_interval: int | None = 500
    # Batches (of data.batch_size sequences) of the held-out shards each evaluation reads.
    val_batches: int = 16

    def __post_init__(self) -> None:
        require(
            self.val_check_interval is None or self.val_check_interval >= 1,
            "trainer.val_check_interval",
            self.val_check_interval,
            "must be at least 1 (optimizer steps), or null (no held-out evaluation)",
        )
        require(
            self.val_batches >= 1, "trainer.val_batches", self.val_batches, "must be at least 1"
        )
        require(
            self.nonfinite in ("skip", "stop"),
            "trainer.nonfinite",
            self.nonfinite,
            "must be 'skip' or 'stop'",
        )
        require(
            self.compile_backend in COMPILE_BACKENDS,
            "trainer.compile_backend",
            self.compile_backend,
            f"must be one of {', '.join(COMPILE_BACKENDS)}",
        )
        require(
            self.peak_tflops is None or self.peak_tflops > 0,
            "trainer.peak_tflops",
            self.peak_tflops,
            "must be a positive number of TFLOP/s (one device's peak), or null",
        )
        require(
            self.max_skipped_steps is None or self.max_skipped_steps >= 1,
            "trainer.max_skipped_steps",
            self.max_skipped_steps,
            "must be at least 1 (optimizer steps), or null (no bound)",
        )
        require(
            self.max_consecutive_skipped_steps is None or self.max_consecutive_skipped_steps >= 1,
            "trainer.max_consecutive_skipped_steps",
            self.max_consecutive_skipped_steps,
            "must be at least 1 (optimizer steps), or null (no bound)",
        )
        require(
            self.precision in PRECISIONS,
            "trainer.precision",
            self.precision,
            f"must be one of {', '.join(PRECISIONS)}",
        )
        require(self.max_steps >= 1, "trainer.max_steps", self.max_steps, "must be at least 1")
        require(
            self.num_threads is None or self.num_threads >= 1,
            "trainer.num_threads",
            self.num_threads,
            "must be at least 1 (threads per process), or null (the cores available)",
        )
        require(
            self.hang_timeout_s is None or self.hang_timeout_s >= 0,
            "trainer.hang_timeout_s",
            self.hang_timeout_s,
            "must be 0 or more (seconds), or null (no watchdog)",
        )
        for key in ("collective_timeout_s", "startup_timeout_s"):
            require(
                getattr(self, key) > 0,
                f"trainer.{key}",
                getattr(self, key),
                "must be positive (seconds)",
            )
        require(
            self.accumulate_grad_batches >= 1,
            "trainer.accumulate_grad_batches",
            self.accumulate_grad_batches,
            "must be at least 1",
        )
        require(
            self.gradient_clip_val is None or self.gradient_clip_val > 0,
            "trainer.gradient_clip_val",
            self.gradient_clip_val,
            "must be positive or null (no clipping)",
        )
        require(
            self.log_every_n_steps >= 1,
            "trainer.log_every_n_steps",
            self.log_every_n_steps,
            "must be at least 1",
        )
        require(
            self.checkpoint_every_n_steps >= 1,
            "trainer.checkpoint_every_n_steps",
            self.checkpoint_every_n_steps,
            "must be at least 1",
        )
        require(
            self.keep_checkpoints >= 1,
            "trainer.keep_checkpoints",
            self.keep_checkpoints,
            "must be at least 1",
        )


@dataclass
class StrategyConfig:
    """How training spreads over processes: Lightning's `auto` (one device), `ddp`, or
    `deepspeed` ZeRO (stage 1: optimizer states, 2: + gradients, 3: + parameters partitioned
    over ranks), optionally offloading optimizer states / parameters to CPU memory."""

    name: str = "auto"
    process_group_backend: str | None = None  # null: nccl on GPUs, gloo on CPU
    find_unused_parameters: bool = False  # ddp only
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False
    # Extra DeepSpeed JSON merged over the generated one (checked by DeepSpeed's parser).
    deepspeed: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(
            self.name in STRATEGIES,
            "strategy.name",
            self.name,
            f"must be one of {', '.join(STRATEGIES)}",
        )
        require(
            self.zero_stage in (0, 1, 2, 3), "strategy.zero_stage", self.zero_stage, "must be 0-3"
        )
        offloads = self.offload_optimizer or self.offload_parameters
        require(
            self.name == "deepspeed" or not offloads,
            "strategy.offload_optimizer",
            self.offload_optimizer,
            "offload needs strategy.name=deepspeed (use strategy=deepspeed_zero2_offload ...)",
        )
        require(
            not self.offload_parameters or self.zero_stage == 3,
            "strategy.offload_parameters",
            self.offload_parameters,
            "parameter offload needs strategy.zero_stage=3",
        )


@dataclass
class LoggerConfig:
    """CSV metrics are always written; wandb too when `wandb` is true."""

    wandb: bool = True
    project: str = "pretrain"
    group: str | None = None
    mode: str = "auto"

    def __post_init__(self) -> None:
        require(
            self.mode in ("auto", "online", "offline"),
            "logger.mode",
            self.mode,
            "must be auto, online or offline",
        )


@dataclass
class TrainConfig:
    """The whole run. `run_dir` is derived from names, never a timestamp, so requeued jobs find it."""

    # Typed while Hydra composes: each model yaml starts from its family's schema
    # (`pretrain.models.configs.MODEL_SCHEMAS`), each objective yaml from its objective's
    # (`pretrain.objectives.configs.objective_schemas()`: each `objectives/*_config.py`).
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    seed: int = 1234
    experiment_name: str = "default"
    run_name: str = "${model.name}-${objective.name}-${data.format}${sweep_suffix:}"
    run_dir: str = "runs/${experiment_name}/${run_name}"
    resume: str = "auto"
    # A Hugging Face directory or a `pretrain` .ckpt whose weights initialise a new run
    # (continued pretraining); an error when the run directory holds a checkpoint of a run
    # that did not start from it (pretrain.checkpoint.relaunch.check_init_from).
    init_from: str | None = None

    def __post_init__(self) -> None:
        from pretrain.data.input_formats import INPUT_FORMATS  # torch: only when validated

        self.model = component_config("model", self.model)
        self.objective = component_config("objective", self.objective)
        self.objective.check_data(self.data.format)
        require(
            not (self.objective.stages and INPUT_FORMATS[self.data.format].memory),
            "objective.stages",
            self.objective.stages,
            f"data.format={self.data.format} carries a memory across steps, which a change of "
            "corruption would break; use another format or leave objective.stages out",
        )
        require(
            not self.data.document_masks or self.data.format == "full_sentences",
            "data.document_masks",
            self.data.document_masks,
            f"needs rows that pack documents (data=full_sentences; data.format is "
            f"{self.data.format!r}); set it to false",
        )
        require(
            not self.data.document_masks or self.model.attends_by_document,
            "data.document_masks",
            self.data.document_masks,
            f"model {self.model.name} cannot mask attention by document; use a modernbert "
            "model or set it to false",
        )
        warmup = self.data.batch_size_warmup_tokens is not None
        require(
            not warmup or not INPUT_FORMATS[self.data.format].memory,
            "data.batch_size_warmup_tokens",
            self.data.batch_size_warmup_tokens,
            f"data.format={self.data.format} has one memory slot per sample of the global "
            "batch, which cannot grow; set it to null",
        )
        require(
            not warmup or not self.strategy.name.startswith("deepspeed"),
            "data.batch_size_warmup_tokens",
            self.data.batch_size_warmup_tokens,
            "DeepSpeed's engine accumulates a fixed number of micro-batches per step; use "
            "strategy=ddp (or auto) with the warm-up, or set it to null",
        )
        stage_context(self)  # a context-extension stage's length and RoPE theta
        longest = self.model.max_sequence_tokens
        require(
            longest is None or self.data.max_seq_length <= longest,
            "data.max_seq_length",
            self.data.max_seq_length,
            f"must not exceed the {longest} positions of model {self.model.name}",
        )
        require(
            self.resume in ("auto", "never", "force") or self.resume.endswith(".ckpt"),
            "resume",
            self.resume,
            "must be 'auto', 'never', 'force' or the path of a .ckpt file",
        )
        # Derived once per launch and passed down (trainer, strategy, optimizer, log line);
        # not a field, so never part of the plain config. ConfigError naming the key when the
        # global batch cannot be made for the configured ranks.
        self.batch_plan: BatchPlan = batch_plan(self.data, self.trainer)
        if warmup:  # the start must be whole micro-batches on every rank
            from pretrain.data.batch_warmup import batch_size_warmup

            batch_size_warmup(self)
        memory_partitions(self)  # XLNet's memory: partitions = slots, checked here
        from pretrain.deepspeed_json import check_strategy  # late: it imports torch

        check_strategy(self)


MIN_SLOT_DOCUMENTS = 8  # training documents per XLNet memory slot, on average


def stream_partitions(run: TrainConfig, documents: int) -> int:
    """The canonical partitions of the run's stream on a corpus of `documents` training
    documents: XLNet's memory slots (`memory_partitions`; ConfigError when the corpus has
    fewer than MIN_SLOT_DOCUMENTS documents a slot: an epoch ends when the first slot's
    partition runs out), else data.stream_partitions (null: DEFAULT_STREAM_PARTITIONS) made
    to fit the corpus (`reading.effective_partitions`)."""
    from pretrain.data.reading import effective_partitions

    slots = memory_partitions(run)
    if slots is None:
        requested = run.data.stream_partitions or DEFAULT_STREAM_PARTITIONS
        return effective_partitions(requested, documents)
    if documents < MIN_SLOT_DOCUMENTS * slots:
        raise ConfigError(
            f"data.global_batch_size: xlnet_memory's {slots} memory slots (one canonical "
            f"partition each) need at least {MIN_SLOT_DOCUMENTS} training documents a slot, "
            f"the corpus {run.data.shards_dir} has {documents}; lower data.global_batch_size "
            "(or data.batch_size), or use a larger corpus"
        )
    return slots


def memory_partitions(run: TrainConfig) -> int | None:
    """The canonical partitions of XLNet's memory format (data.format=xlnet_memory): one per
    memory slot of the global batch, so a slot reads one partition's consecutive segments and
    a step's global batch holds one segment of every partition (`data/stream.py`): the global
    batch size in samples, half of it with model.bi_data (a slot is a forward and a backward
    row). None for other formats. ConfigError naming the keys when data.stream_partitions is
    another number (null: derived), with model.bi_data and an odd data.batch_size, or with
    data.tokens_per_batch."""
    from pretrain.data.input_formats import INPUT_FORMATS

    data = run.data
    if not INPUT_FORMATS[data.format].memory:
        return None
    bi_data = bool(getattr(run.model, "bi_data", False))
    require(
        data.tokens_per_batch is None,
        "data.tokens_per_batch",
        data.tokens_per_batch,
        "xlnet_memory keeps a memory per batch slot and needs fixed batches; set it to null",
    )
    require(
        not bi_data or data.batch_size % 2 == 0,
        "data.batch_size",
        data.batch_size,
        "must be even with model.bi_data (half of each batch is read forward, half backward)",
    )
    batch = run.batch_plan.global_batch_size
    slots = batch // 2 if bi_data else batch
    require(
        data.stream_partitions in (None, slots),
        "data.stream_partitions",
        data.stream_partitions,
        f"xlnet_memory reads one partition per memory slot: must be null or {slots} (the "
        f"global batch of {batch} samples, data.global_batch_size or data.batch_size x "
        "accumulation x ranks; halved with model.bi_data)",
    )
    return slots


def sweep_suffix() -> str:
    """`-<the job's overrides>` inside a job of a Hydra sweep (`pretrain -m ...`), else "".

    The default `run_name` ends with it, so every point of a sweep gets its own run directory
    (the same one again when the job is requeued) instead of resuming another point's run.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return ""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or not hydra_cfg.job.override_dirname:
        return ""
    return "-" + hydra_cfg.job.override_dirname.replace("/", "_")  # one directory level


def register_schemas() -> None:
    """Register the schemas so `conf/train.yaml` can name them in its defaults list, and the
    `${sweep_suffix:}` resolver."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, schemas in (("model", MODEL_SCHEMAS), ("objective", objective_schemas())):
        for name, schema in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=schema)
    OmegaConf.register_new_resolver("sweep_suffix", sweep_suffix, replace=True)


def validate(cfg: DictConfig) -> TrainConfig:
    """Build the dataclasses from a composed config, running every value check; the result
    is the run object that components receive their typed sections of. A key the schema has
    no place for (added with `+key=...` on the command line) is a ConfigError naming it."""
    check_known_keys(cfg)
    return OmegaConf.to_object(cfg)


def check_component_sections(cfg: DictConfig) -> tuple[ModelConfig, ObjectiveConfig]:
    """The composed config's `model` and `objective` sections built into their schemas (typed
    while Hydra composed them), running their value checks without importing torch (but
    with objective.stages, which asks the objective's corruption what a stage may set); a bad
    value is a ConfigError naming the key."""
    sections = []
    for group in ("model", "objective"):
        try:
            sections.append(OmegaConf.to_object(cfg[group]))
        except OmegaConfBaseException as error:
            raise ConfigError(f"{group}.{error.full_key}: {error.msg}") from error
    return sections[0], sections[1]


def check_known_keys(node: object, prefix: str = "") -> None:
    """ConfigError naming the first key of `node` (a composed config, or a section of it) that
    its schema dataclass has no field for; open places (fields typed `dict` or `Any`: the
    optimizer's arguments, `strategy.deepspeed`; `model` and `objective`, which
    `component_config` checks against their own classes) take any key. Hydra's own node
    (`hydra`, present with return_hydra_config) is left alone."""
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return
    known = {item.name: item for item in fields(schema)}
    for key in node.keys():
        if prefix == "" and key == "hydra":
            continue
        if key not in known:
            section = prefix.rstrip(".") or "the run config"
            raise ConfigError(
                f"{prefix}{key}: not a setting of {section} (its settings: "
                f"{', '.join(sorted(known))}); check the spelling, or leave the key out"
            )
        value = node._get_node(key)
        if isinstance(value, DictConfig) and is_dataclass(OmegaConf.get_type(value)):
            check_known_keys(value, f"{prefix}{key}.")


# Sections a plain run config holds beside the schema's, added when the corpus is opened:
# facts of the run's tokenizer (`model_runtime`: vocab_size, pad_token_id) and of its corpus
# (`data_runtime`: corpus_sha256, the manifest's content hash).
RUNTIME_SECTIONS = ("model_runtime", "data_runtime")


def run_config(config: "TrainConfig | Mapping[str, Any] | DictConfig") -> TrainConfig:
    """The typed, validated run config of `config`: itself when typed already, else a plain
    run config (a checkpoint's, possibly partial) merged over the schema's defaults and
    validated; `RUNTIME_SECTIONS` are left out."""
    if isinstance(config, TrainConfig):
        return config
    values = {k: v for k, v in config.items() if k not in RUNTIME_SECTIONS}
    for group in ("model", "objective"):  # their defaults (names: run_name) from the schema
        if group in values:
            given = {"_target_": DEFAULT_TARGETS[group], **values[group]}
            values[group] = OmegaConf.structured(component_config(group, given))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), values)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{error.full_key}: {error.msg}") from error
    return validate(merged)


def with_schema_defaults(saved: dict) -> dict:
    """A checkpoint's plain run config with the keys it lacks (added to the schema since it
    was saved) at the schema's defaults, which keep what older versions did; its own values
    unchanged. `saved` itself when it no longer validates (an old or foreign config)."""
    try:
        defaults = plain_config(run_config(saved))
    except Exception:  # noqa: BLE001 (then only its own keys count)
        return saved

    def merged(base: dict, own: dict) -> dict:
        out = dict(base)
        for key, value in own.items():
            both = isinstance(value, dict) and isinstance(base.get(key), dict)
            out[key] = merged(base[key], value) if both else value
        return out

    return merged(defaults, saved)


def plain_config(run: TrainConfig) -> dict:
    """`run` as plain containers (dicts, lists, scalars): what checkpoints store and loggers
    record."""
    return OmegaConf.to_container(OmegaConf.structured(run), resolve=True)


def settings_from(cls: type[T], *sections: object, **given: object) -> T:
    """An instance of the dataclass `cls` (a corruption, a stream spec) built from typed
    config: each field is `given[name]` when given, else the attribute of that name of the
    first of `sections` (typed config sections) that has one, else the field's default."""
    values = {}
    for item in fields(cls):
        if not item.init:
            continue
        if item.name in given:
            values[item.name] = given[item.name]
            continue
        for section in sections:
            if hasattr(section, item.name):
                values[item.name] = getattr(section, item.name)
                break
    unknown = set(given) - {item.name for item in fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    return cls(**values)


register_schemas()


def compose_config(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose `conf/<config_name>.yaml` with Hydra overrides outside a Hydra app (tests,
    `pretrain-data preview`)."""
    from hydra import compose, initialize_config_dir

    from pretrain.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))
