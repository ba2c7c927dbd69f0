"""How a run's last launch ended, for people and reports: `<run_dir>/run_state.json` holds
{"state": running | finished | preempted | failed, "step": optimizer steps taken,
"max_steps": the run's target}, written atomically by rank 0 when a launch starts and ends.
A launch killed outright (SIGKILL, a node lost) leaves "running" behind, which readers report
as "running or killed". Read back as data: a file that does not hold these keys with these
types is reported as unreadable, never trusted."""

import json
import os
from pathlib import Path

RUN_STATE_FILE = "run_state.json"
STATES = ("running", "finished", "preempted", "failed")


def write_run_state(run_dir: str | Path, state: str, step: int, max_steps: int) -> None:
    """Record `state` at optimizer step `step` of `max_steps` (written aside, then renamed)."""
    if state not in STATES:
        raise ValueError(f"run state {state!r}: must be one of {', '.join(STATES)}")
    path = Path(run_dir) / RUN_STATE_FILE
    partial = path.with_name(path.name + ".partial")
    record = {"state": state, "step": int(step), "max_steps": int(max_steps)}
    try:
        partial.write_text(json.dumps(record) + "\n")
        os.replace(partial, path)
    except OSError as error:  # a report's input: never worth failing a run over
        print(f"warning: {path}: run state not written ({error.strerror})", flush=True)


def read_run_state(run_dir: str | Path) -> dict | None:
    """The recorded state of `run_dir`'s last launch, or None when there is none or it is not
    a valid record."""
    try:
        record = json.loads((Path(run_dir) / RUN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    valid = (
        isinstance(record, dict)
        and record.get("state") in STATES
        and all(isinstance(record.get(k), int) for k in ("step", "max_steps"))
    )
    return record if valid else None


def describe_run_state(
    record: dict | None, step: int | None = None, max_steps: int | None = None
) -> str:
    """ "finished", "preempted (step 246 of 1000)", "failed (step 12 of 1000)", "running or
    killed (step ...)"; without a record, from the logged `step` and the config's `max_steps`
    ("finished" or "unfinished (step s of m)"), else "unknown"."""
    if record is not None:
        state, step, max_steps = record["state"], record["step"], record["max_steps"]
        if state == "finished":
            return "finished"
        label = "running or killed" if state == "running" else state
        return f"{label} (step {step} of {max_steps})"
    if step is None or max_steps is None:
        return "unknown"
    return "finished" if step >= max_steps else f"unfinished (step {step} of {max_steps})"
