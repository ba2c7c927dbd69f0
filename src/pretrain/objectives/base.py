"""What an objective is: an `nn.Module` that names its config class (`config_class`) and its
corruption (`corruption_class`), maps a batch to its `Losses` (the loss to train on, named
explicitly, and the metrics to log), and counts its forward FLOPs per batch. It owns no
training machinery: `pretrain.runtime.task.PretrainingTask` wraps any objective and owns the
optimizer step, the schedule, non-finite handling, epoch ends and throughput."""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from pretrain.config import TrainConfig, plain_config, run_config
from pretrain.data.run_checks import stage_context
from pretrain.data.stages import StagedCorruption, StageLengths
from pretrain.data.vocab import Vocabulary
from pretrain.objectives.configs import ObjectiveConfig, stage_configs

if TYPE_CHECKING:
    import lightning as L

Corruption = Callable[[dict, int], dict]


def objective_settings(cls: type, objective: ObjectiveConfig, **given: object) -> object:
    """An instance of the dataclass `cls` (a corruption, its noise settings) from the typed
    objective section `objective`: each field `given[name]` when given (ids of the
    vocabulary, the run's seed), else the
    objective's setting of that name. No field falls back to a default of `cls`: a field
    neither given nor a setting of the objective's schema is a TypeError naming both, so a
    setting renamed on one side only fails when the corruption is first built (every
    objective's is, in the unit tests), never silently keeping an old default."""
    settings = {item.name for item in fields(objective)}
    values = {}
    for item in fields(cls):
        if not item.init:
            continue
        if item.name in given:
            values[item.name] = given[item.name]
        elif item.name in settings:
            values[item.name] = getattr(objective, item.name)
        else:
            raise TypeError(
                f"{cls.__name__}.{item.name}: not a setting of {type(objective).__name__} "
                "and not given by the objective's corruption_inputs; add it to one of them"
            )
    unknown = set(given) - set(values)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    return cls(**values)


@dataclass(frozen=True)
class Losses(Mapping):
    """What an objective's `forward` returns: `loss`, the scalar the gradient is taken of, and
    `metrics`, scalars logged beside it (component losses, accuracies) that never enter the
    gradient whatever their names. Read as a mapping it is {"loss": loss, **metrics}, the
    scalars logged under `train/` and `val/`."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "loss" in self.metrics:
            raise ValueError("Losses.metrics must not hold 'loss': give it as Losses.loss")

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.loss if key == "loss" else self.metrics[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.metrics
        yield "loss"

    def __len__(self) -> int:
        return len(self.metrics) + 1


class Objective(nn.Module):
    """Base of the objectives. Built from the typed run config (`TrainConfig`, or a plain run
    config such as a checkpoint's, validated into one): `run` is the typed config whose
    sections subclasses read, `config` the same as plain containers (what checkpoints store,
    with the vocabulary's size as `model_runtime`). Subclasses build their model and heads in
    __init__ (the order fixes the random initialisation), name `config_class` and
    `corruption_class`, and implement `forward` and `forward_flops`."""

    summary_metric: ClassVar[str] = "mlm_loss"  # the metric the run summary reports
    # the objective's dataclass schema, in <module>_config.py beside it (torch-free)
    config_class: ClassVar[type[ObjectiveConfig]] = ObjectiveConfig
    # The picklable transform data-loader workers apply to each batch: (batch, epoch) ->
    # batch; a dataclass built by `build_corruption`.
    corruption_class: ClassVar[type | None] = None

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__()
        if not isinstance(config, TrainConfig):  # a plain config: this objective's
            objective = dict(config["objective"]) if "objective" in config else {}
            objective.setdefault("_target_", f"{type(self).__module__}.{type(self).__qualname__}")
            config = {**config, "objective": objective}
        self.run = run_config(config)
        self.config = plain_config(self.run)
        if vocab is not None:
            self.config["model_runtime"] = {"vocab_size": vocab.size, "pad_token_id": vocab.pad}
        self.vocab = vocab

    @classmethod
    def build_corruption(cls, config: TrainConfig | Mapping, vocab: Vocabulary) -> Corruption:
        """The objective's corruption (`corruption_class`) for the run config `config`:
        each field from `corruption_inputs` or the run's seed, else the objective's setting of
        that name (`objective_settings`); with objective.stages, a `StagedCorruption` of one
        per stage."""
        config = run_config(config)
        inputs = cls.corruption_inputs(config, vocab)
        if "seed" in {item.name for item in fields(cls.corruption_class)}:
            inputs.setdefault("seed", config.seed)  # the run's: corruption draws are keyed
        stages = stage_configs(config.objective)
        if not stages:
            return objective_settings(cls.corruption_class, config.objective, **inputs)
        until = tuple(until for until, _ in stages[:-1])
        lengths, thetas = stage_context(config)  # a context-extension phase, if any
        return StagedCorruption(  # objective.stages: one corruption per stage
            tuple(objective_settings(cls.corruption_class, s, **inputs) for _, s in stages),
            until,
            pad_id=vocab.pad,
            stage_lengths=None if lengths is None else StageLengths(lengths, until),
            rope_thetas=thetas,
        )

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        """Fields of the corruption that are not objective settings (vocabulary ids, ...)."""
        return {}

    @classmethod
    def hf_exports(cls, state_dict: dict, config: dict) -> dict:
        """The Hugging Face models (`pretrain.export.hf.HFModel`) a checkpoint of this
        objective holds, by subdirectory of the export ("" = the export directory itself):
        by default the one model of `config.model` (a checkpoint's plain config), converted
        by its family's `to_hf`. `state_dict` is under the objective's names (`encoder.*`)."""
        from pretrain.export.hf import family_module

        return {"": family_module(config["model"]).to_hf(state_dict, config)}

    def load_pretrained(self, state_dict: dict[str, torch.Tensor], source: str) -> None:
        """Initialise from weights under our names (`encoder.*`, heads): every weight of the
        encoder must be there; heads missing from `state_dict`, or of another shape (a 2-way
        sentence head for StructBERT's three-way one), keep their initialisation."""
        ours = self.state_dict()
        state_dict = {
            key: tensor
            for key, tensor in state_dict.items()
            if key.startswith("encoder.") or key not in ours or ours[key].shape == tensor.shape
        }
        result = self.load_state_dict(state_dict, strict=False)
        missing = [key for key in result.missing_keys if key.startswith("encoder.")]
        if missing:
            raise ValueError(f"init_from={source}: lacks the encoder weights {missing[:3]}")
        if result.missing_keys:
            print(f"init_from={source}: freshly initialised: {', '.join(result.missing_keys)}")

    def forward(self, batch: dict) -> Losses:
        """The loss and metrics of one batch (on the device)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward")

    def forward_flops(self, batch: dict) -> torch.Tensor | float | None:
        """Forward FLOPs of one micro-batch by the family's FLOP model (`pretrain.models.flops`),
        or None: the 6N rule over the objective's parameters."""
        return None

    # State carried between batches (XLNet's memory): the task calls these at its hooks.

    def start_epoch(self, task: "L.LightningModule") -> None:
        """A training epoch starts (the task's `on_train_epoch_start`)."""

    def start_batch(self, task: "L.LightningModule", batch: dict, batch_idx: int) -> None:
        """A micro-batch is about to be trained (after the task's epoch-end agreement)."""

    def save_state(self, task: "L.LightningModule", checkpoint: dict) -> None:
        """Add the objective's own training state to a checkpoint being written (on every
        rank; collectives through `task` are allowed)."""

    def load_state(self, checkpoint: dict) -> None:
        """Take back what `save_state` wrote, from a checkpoint being resumed."""
