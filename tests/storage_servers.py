"""Real storage servers for the storage tests, on 127.0.0.1: an S3-compatible one (moto's
server, a subprocess speaking the S3 HTTP API) and a plain HTTP file server with fault hooks
(a 500 every k-th request, a connection cut mid-body, a changed object, stop and restart)."""

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

S3_ENV = {  # moto accepts any credentials; botocore reads these the standard way
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_server():
    """Start moto's S3 server on a free port; yields its endpoint URL (http://127.0.0.1:N)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(endpoint, process)
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_until_serving(endpoint: str, process: subprocess.Popen, limit_s: float = 180) -> None:
    """Return once `endpoint` answers HTTP (any status); raise if `process` exits first or
    `limit_s` passes. A loaded machine takes tens of seconds to import moto's server."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=5)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(
                    f"moto's server exited at start ({process.returncode})"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"moto's server not serving {endpoint} after {limit_s} s"
                ) from None
            time.sleep(0.1)


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create `bucket` on the S3 server at `endpoint`."""
    import boto3

    boto3.client("s3", endpoint_url=endpoint, **_boto_credentials()).create_bucket(Bucket=bucket)


def _boto_credentials() -> dict:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_DEFAULT_REGION"],
    }


class Faults:
    """What the faulty server does to GET requests: `fail_every` k (every k-th GET answers
    500), `cut_every` k (every k-th GET sends its headers and half its body, then closes),
    `changed` ({path: bytes served instead}); counts GETs and bytes sent per path."""

    def __init__(self):
        self.fail_every = 0
        self.cut_every = 0
        self.changed: dict[str, bytes] = {}
        self.gets = 0
        self.paths: dict[str, int] = {}
        self.lock = threading.Lock()


def _handler(root: Path, faults: Faults):
    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            with faults.lock:
                faults.gets += 1
                number = faults.gets
                faults.paths[self.path] = faults.paths.get(self.path, 0) + 1
            if faults.fail_every and number % faults.fail_every == 0:
                self.send_error(500, "injected fault")
                return
            path = root / self.path.lstrip("/").split("?")[0]
            body = faults.changed.get(self.path)
            if body is None:
                if not path.is_file():
                    self.send_error(404, "not found")
                    return
                body = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if faults.cut_every and number % faults.cut_every == 0:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            path = root / self.path.lstrip("/").split("?")[0]
            if not path.is_file():
                self.send_error(404, "not found")
                return
            body = faults.changed.get(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) if body else path.stat().st_size))
            self.end_headers()

    return Handler


class FaultyHTTPServer:
    """A threaded HTTP server of the files under `root` on a fixed port of 127.0.0.1, with
    `faults`; `stop()` and `start()` again on the same port (a server restarted mid-epoch)."""

    def __init__(self, root: Path):
        self.root, self.faults, self.port = Path(root), Faults(), free_port()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultyHTTPServer":
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(
            ("127.0.0.1", self.port), _handler(self.root, self.faults)
        )
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def s3_environment(endpoint: str) -> dict:
    """The environment a process needs to reach the S3 server at `endpoint` (no options)."""
    return {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL": endpoint}
