"""Retries of transient storage failures (connection reset, 5xx, timeouts, a truncated body)
with exponential backoff and full jitter, up to a budget of attempts, then one error line
naming the URL, the attempts and the last error."""

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pretrain.errors import RunEnvironmentError
from pretrain.storage.urls import redact

T = TypeVar("T")


class StorageError(RunEnvironmentError):
    """Bytes that could not be had from storage (after the retries), or that are not the ones
    the manifest records."""


class TransientError(OSError):
    """A failure worth another attempt (a short or changed body, a 5xx)."""


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` in all (1 = no retry); attempt k waits a uniform random time in
    [0, min(max_delay_s, base_delay_s x 2^k)] before it (full jitter)."""

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt number `attempt` (1 = the first retry)."""
        return rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))


PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(error: BaseException) -> bool:
    """Whether another attempt may succeed: not for a missing object or a refused
    permission (nor a bug), yes for network, timeout and server errors."""
    if isinstance(error, PERMANENT):
        return False
    status = http_status(error)
    if status is not None:
        return status >= 500 or status in (408, 429)  # server errors, timeouts, throttling
    if isinstance(error, (OSError, TimeoutError, ConnectionError, TransientError)):
        return True
    name = type(error).__name__
    text = str(error)
    if "NoSuchKey" in text or "404" in text or "403" in text or "AccessDenied" in text:
        return False
    # aiohttp, botocore and fsspec errors that do not derive from OSError
    return any(
        word in name
        for word in ("ClientError", "Timeout", "Connection", "Payload", "Server", "Endpoint")
    ) or any(code in text for code in (" 500", " 502", " 503", " 504", "Internal Server Error"))


def http_status(error: BaseException) -> int | None:
    """The HTTP status an aiohttp or botocore error carries, if any."""
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(code) if code else None
    return None


def with_retries(
    action: Callable[[], T],
    url: str,
    policy: RetryPolicy,
    what: str = "download",
    sleep: Callable[[float], None] | None = None,
) -> T:
    """`action()`, attempted up to `policy.attempts` times while it fails transiently.
    Between attempts it waits the policy's backoff with `sleep` (default `time.sleep`, looked
    up at each wait). Raises StorageError naming `url` (credentials hidden), the attempts and
    the last error."""
    rng = random.Random()
    for attempt in range(policy.attempts):
        if attempt:
            (sleep or time.sleep)(policy.delay_s(attempt, rng))
        try:
            return action()
        except Exception as error:  # noqa: BLE001 (classified below)
            last = error
            if not is_transient(error):
                break
    raise StorageError(
        f"{redact(url)}: {what} failed after {attempt + 1} attempt(s): "
        f"{type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''}"
    ) from last
