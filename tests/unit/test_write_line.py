"""A line a run prints where processes share the stream goes out in one write: where output is
unbuffered (PYTHONUNBUFFERED, as SLURM jobs run) `print` writes the text and its newline apart,
and slurmstepd's own line landed between them in a 2-node job's log ("...(exit status
75)slurmstepd-n1: error: ...")."""

import io

from pretrain.errors import write_line


class Writes(io.RawIOBase):
    """A raw stream that keeps each write it is given, as a file descriptor would get them."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.chunks.append(bytes(data))
        return len(data)


def unbuffered() -> tuple[io.TextIOWrapper, Writes]:
    """A text stream as Python makes stdout and stderr under PYTHONUNBUFFERED=1."""
    raw = Writes()
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True), raw


def test_print_writes_the_newline_apart_where_output_is_unbuffered():
    stream, raw = unbuffered()
    print("preempted at step 13", file=stream, flush=True)
    assert raw.chunks == [b"preempted at step 13", b"\n"]  # the cause: two writes


def test_write_line_writes_the_text_and_its_newline_at_once():
    stream, raw = unbuffered()
    write_line("preempted at step 13", stream)
    write_line("preemption: saved step 13", stream)
    assert raw.chunks == [b"preempted at step 13\n", b"preemption: saved step 13\n"]
