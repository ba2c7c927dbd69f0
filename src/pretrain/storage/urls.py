"""Where bytes live, as text: telling a URL from a local path, joining names onto a corpus
URL, brace patterns, hiding credentials in messages, and the fsspec filesystem of a URL
(imported only when a URL is used, so the command line starts fast)."""

import json
import os
import re
from functools import lru_cache
from typing import Any

from pretrain.errors import ConfigError

# protocol -> (fsspec protocol, the pretrain extra that installs its filesystem, or None)
PROTOCOLS: dict[str, tuple[str, str | None]] = {
    "s3": ("s3", "s3"),
    "gs": ("gcs", "gcs"),
    "gcs": ("gcs", "gcs"),
    "az": ("az", "azure"),
    "abfs": ("abfs", "azure"),
    "hf": ("hf", "hf"),
    "http": ("http", "http"),
    "https": ("http", "http"),
    "file": ("file", None),
    "memory": ("memory", None),
}
READ_ONLY = ("http", "https", "hf")
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)


def protocol(location: str) -> str | None:
    """The lower-case scheme of a URL (`s3` of `s3://bucket/key`), None for a local path."""
    match = _URL.match(str(location))
    return match.group(1).lower() if match else None


def is_url(location: Any) -> bool:
    """Whether `location` names remote storage (s3://, gs://, http(s)://, ...), not a local
    path; `file://` counts as local."""
    scheme = protocol(str(location))
    return scheme is not None and scheme != "file"


def local_path(location: str) -> str:
    """A local path from a path or a `file://` URL."""
    return str(location)[len("file://") :] if protocol(location) == "file" else str(location)


def join_url(base: str, *names: str) -> str:
    """`base` (a corpus URL, with or without a trailing slash) and relative names joined by '/'."""
    return "/".join([str(base).rstrip("/"), *(n.strip("/") for n in names)])


def redact(url: str) -> str:
    """`url` without a user:password part and query string (which may hold a token), for
    messages and logs."""
    url = re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", str(url), flags=re.IGNORECASE)
    return url.split("?", 1)[0]


_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """The names of a brace pattern, as WebDataset and the shell expand them, in order:
    `shard-{000000..000002}.tar` -> shard-000000.tar, shard-000001.tar, shard-000002.tar (a
    numeric range keeps the zero-padding of its first bound); `{a,b}` -> a, b. A pattern
    without braces is itself."""
    match = _BRACE.search(pattern)
    if not match:
        return [pattern]
    body, head, tail = match.group(1), pattern[: match.start()], pattern[match.end() :]
    numeric = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numeric:
        first, last = numeric.groups()
        step = 1 if int(last) >= int(first) else -1
        width = len(first)
        parts = [f"{n:0{width}d}" for n in range(int(first), int(last) + step, step)]
    else:
        parts = body.split(",")
    return [name for part in parts for name in expand_braces(head + part + tail)]


def filesystem(url: str, storage_options: dict | str | None = None):
    """The fsspec filesystem for `url` (fsspec and its backend imported here). Raises
    ConfigError naming the extra to install when the backend is missing."""
    options = (
        storage_options
        if isinstance(storage_options, str)
        else json.dumps(storage_options or {}, sort_keys=True)
    )
    return _filesystem(protocol(url) or "file", options, storage_environment())


# Where the backends read endpoints and credentials from when no option names them.
ENVIRONMENT_PREFIXES = ("AWS_", "BOTO_", "GOOGLE_", "GCS", "AZURE_", "HF_", "FSSPEC_")


def storage_environment() -> tuple[tuple[str, str], ...]:
    """The environment variables the storage backends read: a filesystem is made again when
    they change (a new endpoint or credentials in a process that already made one)."""
    return tuple(
        sorted(item for item in os.environ.items() if item[0].startswith(ENVIRONMENT_PREFIXES))
    )


@lru_cache(maxsize=16)
def _filesystem(scheme: str, options_json: str, environment: tuple):
    """(`environment`, from `storage_environment`, is part of the cache key only.)"""
    import fsspec

    fs_protocol, extra = PROTOCOLS.get(scheme, (scheme, None))
    try:  # fsspec's own instance cache does not know the environment
        options = {**json.loads(options_json), "skip_instance_cache": True}
        return fsspec.filesystem(fs_protocol, **options)
    except (ImportError, ModuleNotFoundError) as error:
        hint = f'pip install "pretrain[{extra}]"' if extra else f"install fsspec's {scheme} backend"
        raise ConfigError(f"{scheme}:// storage needs {hint} ({error})") from error
    except ValueError as error:  # fsspec: unknown protocol
        raise ConfigError(
            f"{scheme}://: no fsspec filesystem for this protocol ({error})"
        ) from error


def check_writable(url: str) -> None:
    """ConfigError when `url` is on storage this project only reads (http(s), hf)."""
    if protocol(url) in READ_ONLY:
        raise ConfigError(
            f"out_dir={redact(url)}: {protocol(url)}:// is read-only here; write to a local "
            "path or to object storage (s3://, gs://, az://)"
        )
