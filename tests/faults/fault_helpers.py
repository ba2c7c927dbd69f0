"""What the fault tests share: real filesystems that fail (a small tmpfs, a read-only mount, a
directory without write permission), the processes a run leaves behind, and the console
scripts run as the user runs them."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from zygote import launch_environment

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


@contextlib.contextmanager
def quota_limited(path: Path, limit: str) -> Iterator[Path]:
    """A directory under `path` (created) whose writes may use `limit` bytes ("1m", "300k")
    in all before they fail with EDQUOT: a btrfs subvolume with a qgroup limit, in an image
    file mounted through a loop device (a qgroup binds root too; tmpfs quotas and ext4's
    need kernel options that are often off). Skips the test without btrfs-progs or where
    this user cannot mount."""
    if shutil.which("mkfs.btrfs") is None or shutil.which("btrfs") is None:
        pytest.skip("no btrfs-progs: a quota cannot be set up here")
    image, mount_point = path / "btrfs.img", path / "mnt"
    mount_point.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(120 << 20)  # sparse; btrfs's smallest default filesystem
    made = subprocess.run(["mkfs.btrfs", "-q", "-f", str(image)], capture_output=True, text=True)
    mounted = (
        made.returncode == 0
        and (
            subprocess.run(
                ["mount", "-o", "loop", str(image), str(mount_point)], capture_output=True
            )
        ).returncode
        == 0
    )
    if not mounted:
        image.unlink()
        pytest.skip(f"cannot make and mount a btrfs image here ({made.stderr.strip()[-200:]})")
    try:
        volume = mount_point / "volume"
        for command in (
            ["quota", "enable", str(mount_point)],
            ["subvolume", "create", str(volume)],
            ["qgroup", "limit", limit, str(volume)],
        ):
            subprocess.run(["btrfs", *command], check=True, capture_output=True)
        yield volume
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        image.unlink(missing_ok=True)


def set_quota(path: Path, limit_bytes: int) -> None:
    """A new qgroup limit for the `quota_limited` directory `path`."""
    subprocess.run(["btrfs", "qgroup", "limit", str(limit_bytes), str(path)], check=True)


def quota_used(path: Path) -> int:
    """Bytes the `quota_limited` directory `path` holds, as its qgroup counts them (after
    a sync: the count moves at each transaction's commit)."""
    shown = subprocess.run(
        ["btrfs", "qgroup", "show", "--raw", "--sync", "-f", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(shown.stdout.strip().splitlines()[-1].split()[1])


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[Path]:
    """`path` made immutable (chattr +i) for the block: nothing can be created, removed or
    written in it, by root either (EPERM). Skips the test where the filesystem or this user
    cannot set the flag."""
    if shutil.which("chattr") is None:
        pytest.skip("no chattr here")
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make {path} immutable here ({done.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


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
    thread per process, none of the variables an in-process distributed run left (`zygote.launch_environment`), and `MARKER` set
    to `marker` (to find its processes later)."""
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])
    env = launch_environment({"PYTHONPATH": path, "OMP_NUM_THREADS": "1"})
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


class Launch:
    """`pretrain` with `overrides` in its own session, its processes marked; its stdout lines
    collected as they come (`lines`), stderr kept in a file."""

    def __init__(self, overrides: list[str], tmp_path: Path):
        self.marker = new_marker()
        self.stderr = tmp_path / f"stderr-{self.marker}.txt"
        with open(self.stderr, "w") as err:
            self.process = subprocess.Popen(
                [str(SCRIPTS / "pretrain"), *overrides],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=script_env(self.marker),
                cwd=tmp_path,
                start_new_session=True,
            )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, ready, timeout_s: float = 240) -> None:
        """Poll `ready()` until true; fails when the run ended or the time ran out first."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert self.process.poll() is None, self.stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def survivors_after(self, seconds: float) -> list[tuple[int, str]]:
        """The run's processes still alive `seconds` after now (sooner when none is left);
        any found are killed after being recorded."""
        deadline = time.monotonic() + seconds
        while (left := marked_processes(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, _ in left:
            os.kill(pid, signal.SIGKILL)
        return left


def run_to_end(overrides: list[str], tmp_path: Path) -> Launch:
    launch = Launch(overrides, tmp_path)
    assert launch.process.wait(timeout=600) == 0, launch.stderr.read_text()[-3000:]
    return launch
