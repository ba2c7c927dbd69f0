"""A console script's process ended by `exit_after` (no interpreter teardown) keeps what
`sys.exit` keeps: the status `main` returns or raises, a message given to `SystemExit` on
stderr with status 1, output still in Python's buffers (a pipe), exit handlers, and the
work of threads that are not daemons; `ends_process` says it is in force."""

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys, threading, time
from pretrain.cluster.process_exit import ends_process, exit_after

def late_write():
    time.sleep(0.3)
    sys.stdout.write("thread done;")

def main():
    atexit.register(lambda: sys.stdout.write("handler ran;"))
    threading.Thread(target=late_write).start()
    sys.stdout.write(f"ends_process={ends_process()};")  # no newline: left in the pipe's buffer
    {ending}

print("ends_process", ends_process(), end=";")
exit_after(main)
print("never printed")
"""


def run(ending: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("{ending}", ending)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("ending", "status"),
    [("return 3", 3), ("return None", 0), ("sys.exit(75)", 75), ("sys.exit()", 0)],
)
def test_the_status_output_handlers_and_threads_are_kept(ending, status):
    result = run(ending)
    assert result.returncode == status, result.stderr
    assert result.stdout == "ends_process False;ends_process=True;thread done;handler ran;"


def test_a_message_to_exit_goes_to_stderr_with_status_1():
    result = run("sys.exit('error: no corpus')")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: no corpus"
    assert result.stdout.endswith("handler ran;")


def test_an_exception_takes_the_normal_path():
    result = run("raise ValueError('boom')")
    assert result.returncode == 1
    assert "ValueError: boom" in result.stderr and "Traceback" in result.stderr
