"""Opening an input of `prepare`: the one place a source's bytes are opened (so other
storage can be plugged in here), the error that names an unreadable input, what a
corrupt compressed stream raises, zstd decompression, and documents' ids (`id_field`)."""

import io
import lzma
import zlib
from typing import IO

DATASETS_STATE = "state.json"  # marks a datasets save_to_disk directory
# What a corrupt or truncated compressed stream raises while it is read.
STREAM_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)
READ_BYTES = 1 << 20  # bytes per read of a compressed stream


class SourceError(ValueError):
    """An input cannot be read; the message names it and says what to do."""


def open_input(name: str) -> IO[bytes]:
    """A buffered binary stream (with `peek`) of the bytes of the source file `name`, as
    stored (compressed or not). SourceError naming it when it cannot be opened."""
    try:
        return open(name, "rb")  # noqa: SIM115
    except OSError as error:
        raise SourceError(f"{name}: cannot be opened ({error}); fix or remove it") from error


class ZstdReader(io.RawIOBase):
    """A readable stream of the zstd frames of `raw`, one after another; a file that ends
    inside a frame raises EOFError (the zstandard stream reader would end silently)."""

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self._raw, self._zstd = raw, zstandard
        self._decompressor = zstandard.ZstdDecompressor().decompressobj()
        self._buffer = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        while not self._buffer and not self._done:
            data = self._raw.read(READ_BYTES)
            if not data:
                if not self._decompressor.eof:
                    raise EOFError("zstd stream ended inside a frame (truncated file)")
                self._done = True
                break
            try:
                self._buffer = self._decompressor.decompress(data)
                while self._decompressor.eof and self._decompressor.unused_data:
                    rest = self._decompressor.unused_data
                    self._decompressor = self._zstd.ZstdDecompressor().decompressobj()
                    self._buffer += self._decompressor.decompress(rest)
            except self._zstd.ZstdError as error:
                raise EOFError(f"zstd: {error}") from error
        n = min(len(out), len(self._buffer))
        out[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def missing_id_field(where: str, id_field: str, fields: list[str]) -> SourceError:
    return SourceError(
        f"{where}: no id column {id_field!r} (columns: {fields}); set id_field to the column "
        "that holds the document id, or id_field=null"
    )


def document_id(value, id_field: str, where: str) -> str:
    """A document's id as kept in the shards: a string or an integer of `id_field`, as text.
    SourceError naming `where` for a missing (null) id, another type, or a tab or line break
    (which the shards' key lists cannot hold)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = "null" if value is None else type(value).__name__
        raise SourceError(
            f"{where}: id {id_field!r} is {shown}, not a string or an integer; give every "
            "document an id, or set id_field=null"
        )
    text = str(value)
    if not text or "\t" in text or "\n" in text or "\r" in text:
        raise SourceError(
            f"{where}: id {id_field!r} = {text!r} is empty or holds a tab or line break; fix "
            "the ids, or set id_field=null"
        )
    return text
