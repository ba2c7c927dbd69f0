"""Errors for people, and the checks that raise them: the ground floor every layer may import.

`ConfigError` says which config key is wrong, what it is and what would be right; the
`require*` helpers raise it from the `__post_init__` checks of the config dataclasses
(`pretrain.config`, each model's and objective's `config_class`). Imports nothing from the
project.
"""

import errno
import os
import sys
import traceback
from collections.abc import Iterable
from typing import Any

VERBOSE_ENV = "PRETRAIN_VERBOSE"  # set (not 0): one-line errors also print their traceback


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and says what would be right."""


class RunEnvironmentError(RuntimeError):
    """The machine cannot do what the run asks (a disk full while saving, an accelerator it
    does not have); one line naming the path or key and what to do (exit status 2)."""


# What each filesystem error means for a writer, and what the user can do about it.
_FILESYSTEM_FAULTS = {
    errno.ENOSPC: ("no space left on device", "free space there"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or raise the quota"),
    errno.EROFS: ("read-only file system", "point the output at a writable directory"),
    errno.EACCES: ("permission denied", "make it writable for this user, or write elsewhere"),
    errno.EPERM: ("operation not permitted", "make it writable for this user, or write elsewhere"),
    errno.EISDIR: ("a directory is in the way of a file", "move or remove that directory"),
    errno.ENOTDIR: ("a file is in the way of a directory", "move or remove that file"),
    errno.EEXIST: ("something is in the way", "move or remove it"),
}


def filesystem_error(
    error: BaseException | None, doing: str, then: str, path: object = None
) -> "RunEnvironmentError | None":
    """The one-line RunEnvironmentError for a filesystem fault (a full disk or quota, a
    read-only or forbidden directory, a directory or file in the way) found in `error` or the
    errors it arose from (`__cause__`, `__context__`: torch.save wraps the OSError of a failed
    write in a RuntimeError): "<path>: <what> while <doing>; <what to do>, then <then>".
    None when no such OSError is in the chain."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _FILESYSTEM_FAULTS:
            what, fix = _FILESYSTEM_FAULTS[error.errno]
            named = error.filename2 if error.errno == errno.EISDIR else None
            named = named or error.filename or path or "(a file the error did not name)"
            return RunEnvironmentError(f"{named}: {what} while {doing}; {fix}, then {then}")
        error = error.__cause__ or error.__context__
    return None


def write_line(text: str, stream: Any = None) -> None:
    """`text` and its newline on `stream` (stderr by default) in one write: the ranks, data-
    loader workers and SLURM's own daemons of a run share the stream, and `print` writes the
    newline apart (two writes where output is unbuffered, PYTHONUNBUFFERED), so two processes'
    lines printed at once came out as one ("...directoryerror: epoch 0, rank 0: ...", "...(exit
    status 75)slurmstepd-n1: error: ...")."""
    stream = stream or sys.stderr
    stream.write(f"{text}\n")
    stream.flush()


def report_error(error: BaseException, prog: str = "") -> None:
    """Print `error` as the one line `<prog>: error: <message>` on stderr, preceded by its
    traceback when the environment sets PRETRAIN_VERBOSE (to anything but 0)."""
    if os.environ.get(VERBOSE_ENV, "0") not in ("", "0"):
        traceback.print_exception(error, file=sys.stderr)
    write_line(f"{prog}: error: {error}" if prog else f"error: {error}")


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """Raise ConfigError "`key` = `value`: `expected`" unless `ok`."""
    if not ok:
        raise ConfigError(f"{key} = {value!r}: {expected}")


def require_unit_interval(
    key: str, value: float, *, open_low: bool = True, open_high: bool = True
) -> None:
    """Check that `value` (a probability, a fraction) lies in the unit interval, open or
    closed at either end as asked."""
    low_ok = value > 0 if open_low else value >= 0
    high_ok = value < 1 if open_high else value <= 1
    lo, hi = "(" if open_low else "[", ")" if open_high else "]"
    require(low_ok and high_ok, key, value, f"must lie in {lo}0, 1{hi}")


def require_positive(config: Any, keys: Iterable[str], group: str = "model") -> None:
    """Check that each attribute `keys` of `config` (a size, a count) is > 0; errors name
    `group.key`."""
    for key in keys:
        value = getattr(config, key)
        require(value > 0, f"{group}.{key}", value, "must be positive")


def require_probabilities(config: Any, keys: Iterable[str], group: str = "model") -> None:
    """Check that each attribute `keys` of `config` (a dropout, a noise rate) lies in [0, 1);
    errors name `group.key`."""
    for key in keys:
        require_unit_interval(f"{group}.{key}", getattr(config, key), open_low=False)


def require_choice(config: Any, key: str, choices: Iterable[str], group: str = "model") -> None:
    """Check that attribute `key` of `config` is one of `choices`; the error lists them."""
    value = getattr(config, key)
    require(value in choices, f"{group}.{key}", value, f"must be one of {', '.join(choices)}")


ENCODER_SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def require_encoder_sizes(config: Any, *more: str, group: str = "model") -> None:
    """Check a Transformer's sizes (ENCODER_SIZES and `more`) are positive and its width a
    multiple of its head count."""
    require_positive(config, (*ENCODER_SIZES, *more), group)
    require_divisible(config, "hidden_size", "num_attention_heads", group)


def require_divisible(config: Any, key: str, by: str, group: str = "model") -> None:
    """Check that attribute `key` of `config` (a width) is a multiple of attribute `by` (a
    head count), as multi-head attention needs; the error names both keys."""
    value, divisor = getattr(config, key), getattr(config, by)
    require(
        value % divisor == 0,
        f"{group}.{key}",
        value,
        f"must be divisible by {group}.{by} ({divisor})",
    )
