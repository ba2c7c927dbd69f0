"""What the fault tests share: real filesystems that fail (a small tmpfs, a read-only mount, a
directory without write permission), the processes a run leaves behind, and the console
scripts run as the user runs them."""

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPTS = Path(sys.executable).parent
MARKER = "PRETRAIN_FAULT_TEST"  # an environment variable every process of a run inherits


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (created) for the block; skips the test where this
    user cannot mount (not root, no CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_read_only(path: Path) -> None:
    """Make the tmpfs at `path` read-only."""
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill(path: Path, leave_bytes: int) -> None:
    """Fill the filesystem of directory `path` until about `leave_bytes` are free."""
    free = shutil.disk_usage(path).free - leave_bytes
    with open(path / "filler", "wb") as f:
        f.write(b"\0" * max(free, 0))


def unprivileged(command: list[str]) -> list[str]:
    """`command` run so that file permissions apply to it: as is for an ordinary user; for
    root, under capsh without the capabilities that override them. Skips the test where
    neither is possible."""
    if os.geteuid() != 0:
        return command
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("root without capsh: permissions cannot be made to apply")
    line = " ".join(f"'{part}'" for part in command)
    return [capsh, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", line]


def script_env(marker: str | None = None) -> dict[str, str]:
    """The environment of a console script run by a test: this checkout's code first, one
    thread per process, and `MARKER` set to `marker` (to find its processes later)."""
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    if marker:
        env[MARKER] = marker
    return env


def new_marker() -> str:
    return uuid.uuid4().hex


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment holds `MARKER=marker`,
    wherever it was reparented to."""
    wanted = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if wanted in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                    found.append((int(entry), command.decode(errors="replace")[:120]))
        except OSError:
            continue
    return found


def error_lines(stderr: str) -> list[str]:
    """The lines of `stderr` that report an error (`...error: ...`) or a traceback."""
    return [
        line
        for line in stderr.splitlines()
        if "error: " in line or line.startswith("Traceback") or "Error:" in line
    ]
