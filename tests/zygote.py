"""A fork server for the tests' training launches (`run_pretrain`).

A `python -m pretrain.cli.train ...` process spends about 10 s of CPU importing torch,
Lightning, DeepSpeed and transformers before its first step, and the multi-rank tests launch
dozens. Here one server process per pytest worker imports them once, then forks a child per
launch, which runs the module as `python -m` would: `sys.argv`, `__main__`, its own
environment, working directory, standard output and error (files), default signal handlers,
and the process ends through the console script (`exit_after`). The test gets what
`subprocess.run(..., capture_output=True, text=True, timeout=...)` gives: a
`CompletedProcess` (returncode -N for a signal N) or `subprocess.TimeoutExpired` after the child
was killed.

What a fork cannot show is left to real executables elsewhere: start-up and import order
(tests/integration/test_cli_startup.py, test_startup_errors.py), the process's exit
(test_process_exit.py), signals and kills from outside (tests/faults, the SLURM tests).

Protocol: the server listens on a Unix socket; a launch is one connection carrying one JSON
line (argv, env, cwd, output paths); the server answers the child's pid, then its wait
status when it ends, and closes the connection. Single-threaded (a fork of a process with
threads could inherit held locks): `selectors` over the connections, children reaped every
50 ms.
"""

import atexit
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOAD = (  # what a training run imports; the test helpers (dist_helpers) load per launch
    "pretrain.config",
    "pretrain.runtime.run",
    "pretrain.runtime.task",
    "pretrain.runtime.strategies",
    "lightning.pytorch",
    "deepspeed",
    "transformers",
    "s3fs",  # Lightning's loggers and checkpoint IO import it (with aiohttp, 0.45 s per launch)
)
MULTIPROCESS_TESTS = Path(__file__).parent / "multiprocess"
# Rank 0's rendezvous port (MASTER_PORT) of each launch. Launches inherited the test process's
# MASTER_PORT, which an in-process distributed run had set (Lightning writes it to os.environ):
# three launches of one xdist worker in three seconds used the same port, and those that
# started while another still held it failed with EADDRINUSE. So each launch gets its own,
# below Linux's ephemeral range (32768-60999, where clients' ports come from): a block of
# PORTS_PER_WORKER per pytest-xdist worker (the SLURM lane's pytest: the last block).
FIRST_PORT, PORTS_PER_WORKER, WORKER_BLOCKS = 20000, 1000, 12
_launches = iter(range(10**9))
_server: subprocess.Popen | None = None
_address: str | None = None
_lock = threading.Lock()


def _start_server() -> str:
    """The socket address of this process's server, started on first use."""
    global _server, _address
    with _lock:
        if _server is not None and _server.poll() is None:
            return _address
        directory = tempfile.mkdtemp(prefix="pretrain-zygote-")
        address = os.path.join(directory, "socket")
        _server = subprocess.Popen(
            [sys.executable, __file__, address],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        )
        ready = _server.stdout.readline()
        if ready.strip() != "ready":
            _server.kill()
            raise RuntimeError(f"the test fork server did not start: {ready!r}")
        atexit.register(_stop, _server, directory)
        _address = address
        return address


def _stop(server: subprocess.Popen, directory: str) -> None:
    server.kill()
    server.wait()
    shutil.rmtree(directory, ignore_errors=True)


# What Lightning writes into os.environ when a run is distributed in this process (an
# in-process DDP or DeepSpeed test): inherited by a launch, LOCAL_RANK made it believe its
# ranks were started by someone else, so rank 0 waited for a rank 1 nobody started (a
# 30-minute hang in a full run), and MASTER_PORT sent launches to one port (EADDRINUSE).
DISTRIBUTED_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def launch_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what a distributed run left in it
    (`DISTRIBUTED_VARIABLES`), with a rendezvous port of the launch's own (`launch_port`),
    then `env` (the caller's, which may set any of them)."""
    inherited = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    return inherited | {"MASTER_PORT": str(launch_port())} | (env or {})


def launch_port() -> int:
    """A rendezvous port for the next launch of this test process, free now, that no other
    pytest-xdist worker of the session hands out (`FIRST_PORT`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    block = int(worker[2:]) if worker.startswith("gw") else WORKER_BLOCKS - 1
    first = FIRST_PORT + (block % WORKER_BLOCKS) * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_launches) % PORTS_PER_WORKER
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use (a run still ending on it): the next one
                continue
        return port
    raise RuntimeError(f"no free port in {first}..{first + PORTS_PER_WORKER - 1}")


def run_pretrain(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`python -m pretrain.cli.train *args` in a child of the fork server, as
    `subprocess.run(command, env=os.environ | env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)` would run it, with tests/multiprocess on PYTHONPATH (dist_helpers'
    recording objectives)."""
    env = launch_environment(env)
    env["PYTHONPATH"] = os.pathsep.join([str(MULTIPROCESS_TESTS), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pretrain.cli.train", *args]
    with tempfile.TemporaryDirectory(prefix="pretrain-launch-") as outputs:
        out, err = Path(outputs, "stdout"), Path(outputs, "stderr")
        request = {
            "args": args,
            "env": dict(env),
            "cwd": str(cwd),
            "out": str(out),
            "err": str(err),
        }
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(_start_server())
            connection.sendall(json.dumps(request).encode() + b"\n")
            replies = bytearray()
            pid = _line(connection, replies)
            if not pid:
                raise RuntimeError("the test fork server ended before the launch")
            pid = int(pid)
            connection.settimeout(timeout)
            try:
                status = _line(connection, replies)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                connection.settimeout(None)
                _line(connection, replies)  # reaped
                expired = subprocess.TimeoutExpired(command, timeout, _read(out), _read(err))
                expired.pid = pid
                raise expired from None
        if not status:
            raise RuntimeError(f"the test fork server ended during the launch of pid {pid}")
        returncode = os.waitstatus_to_exitcode(int(status))
        result = subprocess.CompletedProcess(command, returncode, _read(out), _read(err))
        result.pid = pid
        return result


def recorded_launch(
    args: list[str], run_dir: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`run_pretrain(args)` from `run_dir`'s parent, with dist_helpers' recording objectives
    writing to `<run_dir>-records`; a launch still running after `timeout` fails the test (it
    hangs)."""
    records = Path(f"{run_dir}-records")
    records.mkdir(parents=True, exist_ok=True)
    try:
        return run_pretrain(
            args, run_dir.parent, {"PRETRAIN_TEST_RECORD_DIR": str(records)} | (env or {}), timeout
        )
    except subprocess.TimeoutExpired as error:
        import pytest

        pytest.fail(f"launch still running after {timeout} s: it hangs\n{error.stdout}")


def _line(connection: socket.socket, buffer: bytearray) -> str:
    """The next line from `connection` ("" at its end); what follows it stays in `buffer`."""
    while b"\n" not in buffer:
        chunk = connection.recv(4096)
        if not chunk:
            return ""
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _child(request: dict) -> None:
    """In the forked child: become `python -m pretrain.cli.train ARGS`; never returns."""
    import runpy

    status = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        for entry in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        os.chdir(request["cwd"])
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.argv = ["-m", *request["args"]]
        runpy.run_module("pretrain.cli.train", run_name="__main__", alter_sys=True)
        status = 0  # reached only if the module returned instead of ending the process
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def serve(address: str) -> None:
    """Import PRELOAD, then fork a child per request on `address` until killed or orphaned."""
    import importlib

    parent = os.getppid()
    ready = os.fdopen(os.dup(1), "w")  # the client's pipe; what the imports print goes to stderr
    os.dup2(2, 1)
    # Lightning gives its loggers a console handler of their own, and stops them propagating,
    # when the root logger has none at its import; in a run Hydra has set up the root logger
    # (the run's train.log) by then, so the imports here see one.
    placeholder = logging.NullHandler()
    logging.getLogger().addHandler(placeholder)
    for name in PRELOAD:
        importlib.import_module(name)
    logging.getLogger().removeHandler(placeholder)
    if threading.active_count() != 1:
        raise RuntimeError(f"threads after the imports: {threading.enumerate()}")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    print("ready", file=ready, flush=True)
    ready.close()
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                request = json.loads(connection.makefile("r").readline())
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other in (connection, *children.values()):
                        other.close()
                    _child(request)
                connection.sendall(f"{pid}\n".encode())
                children[pid] = connection
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in children:
                connection = children.pop(pid)
                try:
                    connection.sendall(f"{status}\n".encode())
                except OSError:  # the test gave up on it (a timeout)
                    pass
                connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
