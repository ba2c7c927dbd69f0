"""The run config's `trainer`, `strategy` and `logger` sections: types, defaults and the
checks of their own values."""

from dataclasses import dataclass, field
from typing import Any

from pretrain.errors import require

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")  # trainer.compile_backend
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "64-true")
STRATEGIES = ("auto", "ddp", "deepspeed")


@dataclass
class TrainerConfig:
    """Lightning Trainer settings; steps are optimizer steps."""

    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    precision: str = "32-true"
    max_steps: int = 1000
    # A wall-clock budget in seconds counted from the process's start (start-up included):
    # the run stops at the first optimizer step boundary past it, saves last.ckpt and ends
    # as finished, whatever max_steps (the schedule still runs to max_steps); null: none.
    max_time_s: float | None = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 500
    keep_checkpoints: int = 2
    # write checkpoint files on a background thread: the step waits only for the copy of
    # the state to host memory (pretrain.checkpoint.background); not with DeepSpeed
    async_checkpoint: bool = False
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
            self.max_time_s is None or self.max_time_s > 0,
            "trainer.max_time_s",
            self.max_time_s,
            "must be positive (seconds since the process started), or null (no time budget)",
        )
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
