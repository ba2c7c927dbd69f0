"""Lightning strategies of a run, built from the `strategy` config group.

`ddp` is Lightning's DDPStrategy (`LocalDDPStrategy`: on CPU its local ranks are forked,
`pretrain.runtime.fork_launcher`). `deepspeed` is Lightning's DeepSpeedStrategy with a DeepSpeed
JSON generated from the run config (`pretrain.deepspeed_json`) and checked by DeepSpeed's own parser
when the config is validated, so a bad value fails before a job is queued. On a CPU
accelerator, `CPUDeepSpeedStrategy` runs ZeRO 1-3 with the gloo backend (Lightning's strategy
refuses anything but CUDA; DeepSpeed itself runs on CPU). Optimizer offload steps on CPU
partitions: on a CUDA run an AdamW/Adam becomes DeepSpeedCPUAdam where its op builds, never
apex's (`kernels.offload_settings`); elsewhere the configured torch optimizer is kept
(`zero_force_ds_cpu_optimizer: false`), so CPU runs need no compiled ops (tested on CPU:
ZeRO-3 with optimizer and parameter offload).

Lightning's DeepSpeed precision plugin casts every floating tensor of a batch to the engine's
dtype before the module sees it: in bf16 a stage's RoPE theta 160,000 became 159,744 and a
micro-batch's loss-token count was rounded. `DeepSpeedPrecisionKeepingFloat32` leaves the
batch fields that are numbers, not activations (`FLOAT32_BATCH_FIELDS`), in float32.
"""

import datetime
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.precision import DeepSpeedPrecision
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, Strategy

from pretrain.checkpoint.atomic import PARTIAL_SUFFIX, replace_directory
from pretrain.cluster.collectives import use_timeouts
from pretrain.data.loader import LOSS_TOKENS_KEY
from pretrain.data.stages import ROPE_THETA_KEY
from pretrain.deepspeed_json import deepspeed_config
from pretrain.errors import ConfigError
from pretrain.lightning_compat import ReplacesScriptLauncher, unified_precision
from pretrain.runtime.fork_launcher import ForkLauncher

# batch fields that are numbers the step computes with, not activations: kept in float32
FLOAT32_BATCH_FIELDS = (ROPE_THETA_KEY, LOSS_TOKENS_KEY)


class DeepSpeedPrecisionKeepingFloat32(DeepSpeedPrecision):
    """Lightning's DeepSpeed precision plugin, whose `convert_input` (every floating tensor
    of a batch to the engine's dtype) leaves `FLOAT32_BATCH_FIELDS` as they are."""

    def convert_input(self, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return super().convert_input(data)
        kept = {key: data[key] for key in FLOAT32_BATCH_FIELDS if key in data}
        converted = super().convert_input({k: v for k, v in data.items() if k not in kept})
        return {key: kept[key] if key in kept else converted[key] for key in data}


class ForkedLocalRanks(ReplacesScriptLauncher):
    """Strategy mixin (before a DDPStrategy): the local ranks Lightning would start by running
    the command line again are forked where that is safe (`ForkLauncher`)."""

    def local_ranks_launcher(self) -> ForkLauncher:
        return ForkLauncher(
            self.cluster_environment,
            self.num_processes,
            self.num_nodes,
            devices=list(self.parallel_devices or []),
        )


class LocalDDPStrategy(ForkedLocalRanks, DDPStrategy):
    """Lightning's DDPStrategy, its local ranks forked on CPU (`ForkedLocalRanks`)."""


class PretrainDeepSpeedStrategy(ForkedLocalRanks, DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy, but a checkpoint directory is written aside
    (`NAME.partial/`) and renamed into place after every rank has written its shard
    (DeepSpeed's save ends with a barrier), so a half-written one is never resumed from;
    local ranks on CPU are forked (`ForkedLocalRanks`)."""

    def save_checkpoint(
        self, checkpoint: dict, filepath: Any, storage_options: Any | None = None
    ) -> None:
        final = Path(self.broadcast(str(filepath)))
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        if self.is_global_zero and partial.exists():
            shutil.rmtree(partial)
        self.barrier()
        super().save_checkpoint(checkpoint, partial, storage_options)
        if self.is_global_zero:
            replace_directory(partial, final)
        self.barrier()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict:
        """DeepSpeed's engine loads the directory with every file read weights_only
        (`pretrain.checkpoint.safety.weights_only_loading`): a pickle cannot run code. A
        directory written before the task held the objective as `objective.*` is read under
        today's names (`pretrain.checkpoint.compat.zero_state_with_task_names`), when its
        parameters, renamed, are the engine's in the same order (the optimizer partitions are
        flat, by that order); else ConfigError saying how to convert it."""
        from pretrain.checkpoint.compat import zero_state_with_task_names
        from pretrain.checkpoint.safety import weights_only_loading

        def with_task_names(state: object) -> object:
            state, renamed = zero_state_with_task_names(state)
            if renamed and isinstance(state, dict) and "param_shapes" in state:
                check_parameter_order(checkpoint_path, state["param_shapes"], self._param_order())
            return state

        with weights_only_loading(with_task_names):
            return super().load_checkpoint(checkpoint_path, weights_only)

    def _param_order(self) -> list[tuple[str, tuple[int, ...]]] | None:
        """(name, shape) of the engine's partitioned parameters, in its optimizer groups'
        order; None when DeepSpeed does not say."""
        shapes = getattr(self.deepspeed_engine, "_get_zero_param_shapes", None)
        if shapes is None:
            return None
        return [(n, tuple(s)) for group in shapes() for n, s in group.items()]


def check_parameter_order(
    checkpoint: Any, saved: list, ours: list[tuple[str, tuple[int, ...]]] | None
) -> None:
    """ConfigError (one line) unless an older ZeRO checkpoint's parameters, renamed (`saved`:
    its `param_shapes`, one mapping per optimizer group), are this engine's (`ours`), name,
    shape and order: its flat optimizer partitions could not be mapped otherwise."""
    theirs = [(n, tuple(s)) for group in saved for n, s in group.items()]
    if ours is not None and theirs != ours:
        raise ConfigError(
            f"{checkpoint}: a ZeRO checkpoint of an older version whose parameters are not "
            "this model's in the same order, so its optimizer state cannot be resumed; "
            f"convert it: pretrain-export {checkpoint} <dir>, then start a new run "
            "with init_from=<dir>"
        )


class CPUDeepSpeedStrategy(PretrainDeepSpeedStrategy):
    """DeepSpeedStrategy on CPU processes (gloo): skips Lightning's two CUDA-only checks and
    gives each rank `cpu:<local_rank>` as root device (DeepSpeed reads the index as its rank)."""

    def setup_environment(self) -> None:
        # DeepSpeedStrategy.setup_environment only adds the CUDA check to DDP's
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        import importlib

        from lightning.fabric.utilities.seed import reset_seed

        # DeepSpeed's backend compiles a shared-memory all-reduce when it starts (a C++
        # extension: 40 s and 75 s of CPU on 2 cores the first time on a machine, compiler
        # probes on every start) that only `inference_all_reduce` calls; training's
        # collectives are gloo's.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu", self.local_rank)


def is_cpu_run(trainer: Any) -> bool:
    """True when the run's accelerator (of the typed TrainerConfig) is the CPU (`cpu`, or
    `auto` without CUDA)."""
    accelerator = trainer.accelerator
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def build_strategy(config: Any) -> Strategy | str:
    """The Lightning strategy of a run (the typed TrainConfig): 'auto', a DDPStrategy, or a
    DeepSpeed strategy (the CPU subclass when the accelerator is the CPU)."""
    strategy, trainer = config.strategy, config.trainer
    name = strategy.name
    cpu = is_cpu_run(trainer)
    backend = strategy.process_group_backend or ("gloo" if cpu else None)
    # the longer wait until the ranks meet, then collective_timeout_s (`collectives.ranks_met`)
    wait_s = use_timeouts(trainer.startup_timeout_s, trainer.collective_timeout_s)
    timeout = datetime.timedelta(seconds=wait_s)
    if name == "auto":
        return "auto"
    if name == "ddp":
        return LocalDDPStrategy(
            process_group_backend=backend,
            find_unused_parameters=strategy.find_unused_parameters,
            timeout=timeout,
        )
    if name == "deepspeed":
        os.environ.setdefault("DS_BUILD_OPS", "0")
        strategy_class = CPUDeepSpeedStrategy if cpu else PretrainDeepSpeedStrategy
        precision = unified_precision(trainer.precision)
        return strategy_class(
            config=deepspeed_config(config),
            precision_plugin=DeepSpeedPrecisionKeepingFloat32(precision),
            process_group_backend=backend,
            timeout=timeout,
        )
    raise ConfigError(f"strategy.name = {name!r}: must be auto, ddp or deepspeed")
