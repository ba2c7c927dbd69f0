"""Opening an input of `prepare`: the one place a source's bytes are opened (so other
storage can be plugged in here), the error that names an unreadable input, and what a
corrupt compressed stream raises."""

import lzma
import zlib
from typing import IO

DATASETS_STATE = "state.json"  # marks a datasets save_to_disk directory
# What a corrupt or truncated compressed stream raises while it is read.
STREAM_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


class SourceError(ValueError):
    """An input cannot be read; the message names it and says what to do."""


def open_input(name: str) -> IO[bytes]:
    """A buffered binary stream (with `peek`) of the bytes of the source file `name`, as
    stored (compressed or not). SourceError naming it when it cannot be opened."""
    try:
        return open(name, "rb")  # noqa: SIM115
    except OSError as error:
        raise SourceError(f"{name}: cannot be opened ({error}); fix or remove it") from error
