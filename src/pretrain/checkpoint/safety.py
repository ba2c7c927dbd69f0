"""Checkpoints are data, never code: how everything read back from a run directory, a
checkpoint or an export is loaded.

- `load_weights_only(path)`: `torch.load(weights_only=True)`, on the CPU (tensors and plain containers;
  DeepSpeed's few bookkeeping classes allowed, `deepspeed_safe_globals`), a refusal turned
  into a one-line `UnsafeCheckpointError` naming the file and the global it asked for.
- `weights_only_loading()`: a context in which every `torch.load` is that load, whatever its
  caller asks: DeepSpeed's engine (resuming a ZeRO directory) and its `zero_to_fp32`
  consolidation call `torch.load(weights_only=False)` themselves.
- `check_stored_targets(config, source)`: a config stored in a checkpoint may name only this
  project's model and objective classes (`MODEL_CLASSES`, `OBJECTIVE_CLASSES`) and known
  optimizers (`OPTIMIZER_CLASSES`), each in its own place; any other `_target_` (nested ones
  too) is refused before anything is imported or called.
"""

import contextlib
import pickle
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from pretrain.errors import ConfigError
from pretrain.objectives.configs import objective_schemas
from pretrain.paths import CONF_DIR

# The classes a stored config may name, by where they stand. Every `_target_` of
# conf/model/*.yaml and conf/optim/*.yaml is here (a test checks it): a new model or optimizer
# is added to this list too; the objectives' are read from their schemas and yamls.
MODEL_CLASSES = frozenset(
    {
        "pretrain.models.albert.AlbertEncoder",
        "pretrain.models.bert.BertEncoder",
        "pretrain.models.distilbert.DistilBertEncoder",
        "pretrain.models.electra.ElectraEncoder",
        "pretrain.models.gpt.GPTModel",
        "pretrain.models.modernbert.ModernBertEncoder",
        "pretrain.models.roberta.RobertaEncoder",
        "pretrain.models.seq2seq.EncoderDecoder",
        "pretrain.models.xlnet.XLNetEncoder",
    }
)


def shipped_objective_classes(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """The `_target_` of every objective schema (`objective_schemas()`, a default) and of every
    `conf/objective/*.yaml` that sets its own, read as text (nothing imported): an objective
    added with its schema or yaml is allowed without a list to keep."""
    targets = {schema._target_ for schema in objective_schemas().values()}
    for path in sorted((conf_dir / "objective").glob("*.yaml")):
        targets.update(_TARGET_LINE.findall(path.read_text(encoding="utf-8")))
    return frozenset(targets)


_TARGET_LINE = re.compile(r"^_target_:\s*([\w.]+)", re.MULTILINE)
OBJECTIVE_CLASSES = shipped_objective_classes()
OPTIMIZER_CLASSES = frozenset(
    {
        "torch.optim.AdamW",
        "torch.optim.Adam",
        "pytorch_optimizer.Lamb",
        "pytorch_optimizer.StableAdamW",
    }
)
ALLOWED_TARGETS = {
    "model._target_": MODEL_CLASSES,
    "objective._target_": OBJECTIVE_CLASSES,
    "optim.optimizer._target_": OPTIMIZER_CLASSES,
}


class UnsafeCheckpointError(ConfigError):
    """A checkpoint or stored config would run code or name a class we do not build; the
    message is one line naming the file (and the key)."""


def check_stored_targets(config: Mapping[str, Any], source: str | Path) -> None:
    """Refuse (`UnsafeCheckpointError`) a config read back from `source` (a checkpoint, an
    export) whose `_target_` values are not this project's classes at their places
    (`ALLOWED_TARGETS`); a `_target_` anywhere else (a nested one) is refused too. Only
    compares strings: nothing is imported."""

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                dotted = f"{prefix}{key}"
                if key == "_target_":
                    allowed = ALLOWED_TARGETS.get(dotted)
                    if allowed is None or value not in allowed:
                        where = "not a class" if allowed is None else "not one"
                        raise UnsafeCheckpointError(
                            f"{source}: the stored config's {dotted} = {value!r} is refused "
                            f"({where} this project builds there); only use checkpoints and "
                            "exports written by `pretrain`"
                        )
                else:
                    walk(value, f"{dotted}.")
        elif isinstance(node, list | tuple):
            for index, value in enumerate(node):
                walk(value, f"{prefix}{index}.")

    walk(config, "")


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def refusal_message(path: str | Path, error: Exception) -> str:
    """One line for a load `torch.load(weights_only=True)` refused: the file and the global
    the pickle asked for, or what could not be read (never torch's advice to load it with
    weights_only=False)."""
    found = _GLOBAL.search(str(error))
    if found is None:  # not a pickle of tensors and containers at all: garbage, truncated
        detail = str(error).split("WeightsUnpickler error:")[-1].strip().split("\n")[0]
        return (
            f"{path}: cannot read the checkpoint ({detail or type(error).__name__}); is it a "
            "complete .ckpt written by `pretrain`?"
        )
    return (
        f"{path}: refused: not plain tensors and containers (it asks for {found.group(1)}); a "
        "checkpoint is loaded with torch.load(weights_only=True) so that it cannot run code; "
        "only use checkpoints written by `pretrain`"
    )


def deepspeed_safe_globals() -> list:
    """The classes DeepSpeed's checkpoint files hold besides tensors and containers (its
    ZeRO stage enum, loss scaler and fragment addresses); none runs code when rebuilt.
    Importing them imports DeepSpeed (1.5 s), so `load_weights_only` asks only for a file
    that names one, or in a process that has DeepSpeed already."""
    allowed: list = []
    with contextlib.suppress(ImportError):
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        allowed += [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]
    return allowed


def load_weights_only(path: str | Path, **kwargs: Any) -> Any:
    """`torch.load(path, weights_only=True, **kwargs)` with `deepspeed_safe_globals`
    allowed; a refused pickle raises `UnsafeCheckpointError` (one line, the file named).
    A file refused for one of DeepSpeed's classes is read again with them allowed, so a
    DDP run's resume or export never imports DeepSpeed. Tensors load on the CPU unless
    `map_location` says otherwise: a GPU run's checkpoint tags its storages `cuda:N`, which
    would put every rank's read on that device, and fail on a host without CUDA."""
    kwargs.pop("weights_only", None)
    kwargs.pop("pickle_module", None)
    kwargs.setdefault("map_location", "cpu")
    with_deepspeed = "deepspeed" in sys.modules
    start = path.tell() if hasattr(path, "seek") else None  # a file object: read it again
    while True:
        if start is not None:
            path.seek(start)
        allowed = deepspeed_safe_globals() if with_deepspeed else []
        with torch.serialization.safe_globals(allowed):
            try:
                return _torch_load(path, weights_only=True, **kwargs)
            except pickle.UnpicklingError as error:
                found = _GLOBAL.search(str(error))
                if with_deepspeed or not (found and found.group(1).startswith("deepspeed.")):
                    raise UnsafeCheckpointError(refusal_message(path, error)) from None
                with_deepspeed = True


_torch_load = torch.load


@contextlib.contextmanager
def weights_only_loading(transform: Callable[[Any], Any] | None = None) -> Iterator[None]:
    """Within: every `torch.load` (DeepSpeed's engine and `zero_to_fp32` ask for
    weights_only=False) is `load_weights_only`, so a ZeRO directory is read as data; each
    loaded object passed through `transform` when given (older weight names renamed)."""

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if args:  # torch.load(f, map_location, pickle_module, ...)
            kwargs.setdefault("map_location", args[0])
        loaded = load_weights_only(f, **kwargs)
        return loaded if transform is None else transform(loaded)

    torch.load = load
    try:
        yield
    finally:
        torch.load = _torch_load


def check_resume_strategy(checkpoint: str | Path, strategy: str) -> None:
    """ConfigError unless a DeepSpeed ZeRO checkpoint directory (one holding `latest`) is
    resumed under `strategy.name=deepspeed`: only DeepSpeed's engine reads such a directory,
    and only inside `weights_only_loading`."""
    if strategy != "deepspeed" and (Path(checkpoint) / "latest").is_file():
        raise ConfigError(
            f"{checkpoint}: a DeepSpeed checkpoint directory, but strategy.name={strategy}; "
            "resume it with strategy=deepspeed_zero<N> (the strategy it was written with), or "
            "start over here (resume=never)"
        )


def check_checkpoint_slots(run_dir: str | Path, strategy: str) -> None:
    """ConfigError when the checkpoint directory of `run_dir` holds a directory named
    `last.ckpt` (a DeepSpeed ZeRO checkpoint, or anything else) while `strategy` writes files:
    the next save could not replace it. One line naming it and what to do."""
    last = Path(run_dir) / "checkpoints" / "last.ckpt"
    if strategy != "deepspeed" and last.is_dir():
        kind = "a DeepSpeed checkpoint directory" if (last / "latest").is_file() else "a directory"
        raise ConfigError(
            f"{last}: {kind}, where strategy.name={strategy} saves a file; resume it with "
            "strategy=deepspeed_zero<N> (the strategy it was written with), move it away, or "
            "start over here (resume=never moves the old checkpoints aside)"
        )
