"""fsspec and its backends load only when a URL is used: the command-line tools and a local
corpus's `pretrain-data info` import none of them (CLI start-up time)."""

import json
import subprocess
import sys
from pathlib import Path

STORAGE_PACKAGES = ("fsspec", "s3fs", "gcsfs", "adlfs", "aiohttp", "botocore", "filelock")

COMMANDS = r"""
import contextlib, io, json, sys
from data_pipelines.cli import main as data
import pretrain.cli.train, data_pipelines.prepare, pretrain.storage
with contextlib.redirect_stdout(io.StringIO()):
    status = data(["info", sys.argv[1]])
names = sys.argv[2].split(",")
print(json.dumps({"status": status, "loaded": sorted(n for n in names if n in sys.modules)}))
"""


def test_local_corpora_and_the_clis_import_no_storage_backend(prepared_corpus: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS, str(prepared_corpus), ",".join(STORAGE_PACKAGES)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"status": 0, "loaded": []}
