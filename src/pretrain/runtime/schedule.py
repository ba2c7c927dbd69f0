"""The learning-rate schedule of a run, stored in its checkpoints, and how a run is extended.

A schedule is a list of segments, each {"start", "warmup_steps", "end", "kind"} in optimizer
steps: from `start`, a linear warm-up over `warmup_steps`, then `kind` ("constant", "linear"
decay to 0 at `end`, or "wsd": warm-up, stable, decay, the rate held at its peak until the
last `decay_steps` before `end`, then decayed to 0 at `end` by `decay_shape`, "linear" or
"1-sqrt", 1 - sqrt(progress) as in ModernBERT; `optim.decay_fraction` of the steps after the
warm-up decay). A run starts with one segment, start 0, ending at
`optim.schedule_steps` (null: `trainer.max_steps`). The schedule is state of the run, not of a
launch: it is saved with the LR scheduler in every checkpoint (and as `lr_schedule`, readable
without the weights), and a resumed launch follows the saved one whatever its own max_steps.

Extending a run (a later launch with `trainer.max_steps` past the end of a decaying schedule)
is explicit, `optim.extend`:
- `refuse` (default): a one-line error before training, naming the other choice;
- `rewarm`: a new segment from the resumed step: warm-up over `optim.warmup_steps` (from
  1/warmup of the peak rate up to it), then `optim.schedule` to the new max_steps. Printed.
A constant schedule is extended as is (the rate does not depend on max_steps).
"""

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pretrain.errors import ConfigError

if TYPE_CHECKING:
    from pretrain.config import OptimConfig, TrainConfig

EXTEND_MODES = ("refuse", "rewarm")
SCHEDULES = ("linear", "constant", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")


class LearningRateSchedule:
    """LambdaLR multiplier of the base rate at an optimizer step, from `segments`. A callable
    object (not a function), so LambdaLR's state_dict saves its segments with the run."""

    def __init__(self, segments: list[dict]):
        self.segments = [dict(segment) for segment in segments]

    def __call__(self, step: int) -> float:
        segment = [s for s in self.segments if s["start"] <= step][-1]
        local, warmup = step - segment["start"], segment["warmup_steps"]
        if local < warmup:
            return (local + 1) / warmup
        if segment["kind"] == "constant":
            return 1.0
        end = segment["end"]
        if segment["kind"] == "wsd":
            return stable_then_decay(step, end, segment["decay_steps"], segment["decay_shape"])
        return max(0.0, (end - step) / max(1, end - segment["start"] - warmup))


def stable_then_decay(step: int, end: int, decay_steps: int, shape: str) -> float:
    """WSD's multiplier after the warm-up: 1 until `end - decay_steps`, then down to 0 at
    `end` (optimizer steps), linearly or as 1 - sqrt(progress) (`shape` "1-sqrt")."""
    progress = min(1.0, max(0.0, (step - (end - decay_steps)) / max(1, decay_steps)))
    return 1.0 - (math.sqrt(progress) if shape == "1-sqrt" else progress)


def decay_settings(optim: "OptimConfig | None", start: int, end: int, warmup_steps: int) -> dict:
    """The extra keys of a segment from `start` to `end` (optimizer steps) under the run's
    (typed OptimConfig) schedule: for wsd, "decay_steps" (optim.decay_fraction of the steps
    after the warm-up, at least 1) and "decay_shape"; none for the others."""
    if getattr(optim, "schedule", None) != "wsd":
        return {}
    after_warmup = max(1, end - start - warmup_steps)
    decay_steps = max(1, round(optim.decay_fraction * after_warmup))
    return {"decay_steps": decay_steps, "decay_shape": optim.decay_shape}


def first_segment(
    warmup_steps: int, end: int, kind: str, optim: "OptimConfig | None" = None
) -> dict:
    """The one segment of a new run (optimizer steps); `optim` (the typed OptimConfig) gives
    a wsd segment its decay."""
    segment = {"start": 0, "warmup_steps": warmup_steps, "end": end, "kind": kind}
    return segment | decay_settings(optim, 0, end, warmup_steps)


def run_schedule_end(run: "TrainConfig") -> int:
    """Where the run's (typed TrainConfig) schedule decays to 0: optim.schedule_steps, else
    trainer.max_steps (optimizer steps)."""
    steps = run.optim.schedule_steps
    return run.trainer.max_steps if steps is None else steps


def extended(segments: list[dict], step: int, run: "TrainConfig", warmup_steps: int) -> list[dict]:
    """The segments a launch resumed at optimizer `step` trains with: `segments` as saved
    when the run's max_steps is within them or they end in a constant rate, else per
    `run.optim.extend` (ConfigError for `refuse`; a new segment for `rewarm`)."""
    last = segments[-1]
    max_steps = run.trainer.max_steps
    if last["kind"] == "constant" or max_steps <= last["end"]:
        return segments
    if run.optim.extend == "refuse":
        raise ConfigError(
            f"trainer.max_steps={max_steps}: the run's learning rate decays to 0 at step "
            f"{last['end']} (optim.schedule={last['kind']}, stored in its checkpoint); to train "
            f"on, set optim.extend=rewarm (warm up again over optim.warmup_steps from step "
            f"{step}, then decay to step {max_steps}; see README 'Resuming'), or keep "
            f"trainer.max_steps <= {last['end']}"
        )
    segment = {"start": step, "warmup_steps": warmup_steps, "end": max_steps}
    decay = decay_settings(run.optim, step, max_steps, warmup_steps)
    return [*segments, segment | {"kind": run.optim.schedule} | decay]


def describe_extension(segments: list[dict]) -> str:
    """One line for the log about the newest segment of an extended schedule."""
    s = segments[-1]
    return (
        f"optim.extend=rewarm: the learning rate warms up again from step {s['start']} over "
        f"{s['warmup_steps']} steps, then {s['kind']} to step {s['end']}"
    )


def set_rates(scheduler, rate: float) -> None:
    """Set every parameter group's learning rate of `scheduler`'s optimizer to its base rate
    times `rate`."""
    for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * rate


def rewind_schedule(scheduler, schedule: LearningRateSchedule | None, steps: int) -> None:
    """Move a step-interval LR `scheduler` (None: nothing to move) back by `steps` optimizer
    steps, skipped on the device after it had advanced, and set the rates from `schedule`."""
    if scheduler is not None:
        scheduler.last_epoch -= steps
        set_rates(scheduler, schedule(scheduler.last_epoch) if schedule else 1.0)


def continue_schedule(
    scheduler, schedule: LearningRateSchedule, saved: list[dict], run: "TrainConfig", warmup: int
) -> bool:
    """Make a resumed launch's `schedule` follow the checkpoint's segments `saved`, extended
    per optim.extend when the run's max_steps passes the end of a decaying one (ConfigError
    under `refuse`), and set the next step's rate; True when a segment was added."""
    segments = extended(saved, scheduler.last_epoch, run, warmup)
    schedule.segments = [dict(s) for s in segments]
    set_rates(scheduler, schedule(scheduler.last_epoch))
    return len(segments) > len(saved)


def check_extension(checkpoint: str | Path, run: "TrainConfig", warmup_steps: int) -> None:
    """Before any rank starts: ConfigError when continuing `checkpoint` (a file or a ZeRO
    directory) with the run's (typed TrainConfig) max_steps would extend its decaying
    schedule under optim.extend=refuse (`extended`). Checkpoints without a stored schedule
    ended it at their config's trainer.max_steps."""
    from pretrain.checkpoint.resume import deepspeed_client_state_file
    from pretrain.checkpoint.safety import load_weights_only

    path = Path(checkpoint)
    state = load_weights_only(
        deepspeed_client_state_file(path) if path.is_dir() else path, mmap=True
    )
    segments = stored_schedule(state)
    if segments:
        extended(segments, int(state["global_step"]), run, warmup_steps)


def stored_schedule(state: dict) -> list[dict] | None:
    """The segments a checkpoint's state holds (`lr_schedule`); for a checkpoint written
    before schedules were stored, one segment ending at its config's trainer.max_steps; None
    when neither is there."""
    if state.get("lr_schedule"):
        return state["lr_schedule"]
    try:
        optim, trainer = state["config"]["optim"], state["config"]["trainer"]
        return [first_segment(optim["warmup_steps"], trainer["max_steps"], optim["schedule"])]
    except (KeyError, TypeError):
        return None


def warmup_then_decay(warmup_steps: int, total_steps: int, schedule: str) -> Callable[[int], float]:
    """Learning-rate multiplier at an optimizer step: linear warm-up over `warmup_steps`, then
    constant or linear decay to 0 at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


FIRST_PHASE_SHARE = 0.5  # a warm-up over this share of trainer.max_steps is warned about


def first_phase_warnings(run: "TrainConfig", warmup_steps: int) -> list[str]:
    """The warning lines of a new run (typed TrainConfig) whose first phase leaves little or
    nothing of it, each naming the keys to change: the learning-rate warm-up (`warmup_steps`
    optimizer steps, from optim.warmup_steps or optim.warmup_samples) over FIRST_PHASE_SHARE
    of trainer.max_steps, and a first of objective.stages (a curriculum or context
    extension) that lasts the whole run, its until_tokens at the run's tokens per step (the
    global batch's samples x the stage's sequence length, `pretrain.data.stages`) or more.
    [] when neither."""
    max_steps, lines = run.trainer.max_steps, []
    if warmup_steps > FIRST_PHASE_SHARE * max_steps:
        key = "warmup_steps" if run.optim.warmup_samples is None else "warmup_samples"
        never = " (the rate never reaches its peak)" if warmup_steps >= max_steps else ""
        lines.append(
            f"warning: optim.{key}={getattr(run.optim, key)}: the learning-rate warm-up takes "
            f"{warmup_steps} of the run's {max_steps} optimizer steps (trainer.max_steps)"
            f"{never}; lower optim.{key} or raise trainer.max_steps"
        )
    stages = run.objective.stages
    if len(stages) > 1:
        until = stages[0]["until_tokens"]
        length = stages[0].get("max_seq_length") or run.data.max_seq_length
        steps = math.ceil(until / (run.batch_plan.global_batch_size * length))
        if steps >= max_steps:
            lines.append(
                f"warning: objective.stages[0].until_tokens={until}: the first stage lasts "
                f"about {steps} optimizer steps ({run.batch_plan.global_batch_size} samples of "
                f"{length} tokens each), the whole run (trainer.max_steps={max_steps}): the "
                "later stages never come; lower objective.stages[0].until_tokens or raise "
                "trainer.max_steps"
            )
    return lines
