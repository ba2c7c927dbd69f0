"""`loaders.py --remote s3`: moto's S3 server on 127.0.0.1 (started here, as the storage tests
start it), each way's converted files uploaded to it, where each reader opens them, and the
table of the S3 figures beside the local ones. A module of loaders.py, no command of its own.

Each reader uses its own client, pointed at the server the way its documentation says:
ours (`data.shards_dir=s3://...`, `data.cache_dir`) and LitData (`StreamingDataset("s3://..")`,
boto3 underneath) read AWS_ENDPOINT_URL; Mosaic streaming (`StreamingDataset(remote=..,
local=..)`) reads S3_ENDPOINT_URL; webdataset has no S3 client of its own and reads each tar
over HTTP (curl) from a presigned URL of the private bucket (s3fs's `sign`). LitData's
chunk fetcher (obstore) is told it may use plain HTTP (`allow_litdata_http`), as it must be for
any http:// endpoint.
"""

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from storage_servers import S3_ENV, make_bucket, moto_server  # noqa: E402

from pretrain.storage import filesystem, publish_corpus  # noqa: E402

BUCKET = "loaders"


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server with the bucket BUCKET, this process's environment (and so its
    data-loader workers') pointed at it: the AWS_* credentials, AWS_ENDPOINT_URL (boto3, s3fs,
    LitData) and S3_ENDPOINT_URL (Mosaic streaming). Yields its endpoint URL."""
    with moto_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        os.environ.update({**S3_ENV, "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint})
        allow_litdata_http()
        yield endpoint


def allow_litdata_http() -> None:
    """LitData fetches chunks with obstore under fixed client options that refuse a plain
    http:// endpoint (moto on loopback; real S3 is https) and ignore AWS_ALLOW_HTTP: add
    `allow_http` to them, in this process and so in its forked workers."""
    try:
        from litdata.streaming import downloader
    except Exception:  # noqa: BLE001 - LitData not importable: loaders.py skips it
        return
    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"


def upload(way: str, local: Path) -> tuple[float, str | list[str]]:
    """Upload `way`'s converted files in `local` to s3://BUCKET/<way>: ours with
    `publish_corpus` (what `pretrain-data prepare out_dir=s3://...` does after writing
    locally: shards, then the manifest), theirs file by file as written. Returns (seconds,
    what its reader opens: the s3:// URL, for webdataset each tar's presigned http:// URL)."""
    url = f"s3://{BUCKET}/{way}"
    start = time.perf_counter()
    if way.startswith("ours"):
        publish_corpus(local, url)
    else:
        fs = filesystem(url)
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            fs.put_file(str(path), f"{url}/{path.relative_to(local).as_posix()}")
    seconds = time.perf_counter() - start
    if way != "webdataset":
        return seconds, url
    tars = sorted(p.name for p in local.glob("*.tar"))
    return seconds, [filesystem(url).sign(f"{url}/{name}", expiration=86400) for name in tars]


def print_table(
    measured: dict, converted: dict, uploaded: dict, batch_size: int, ratios: Callable
) -> None:
    """The S3 rows beside the local ones: `measured` {(way, workers, place): (batches/s,
    batches, tokens a row, first batch s)} with place None (local) or "s3"; `converted` {way:
    (conversion s, dir)}; `uploaded` {way: (upload s, URL)}. Then ours against the best of
    theirs from S3, in real tokens/s a worker (`ratios`: loaders.py's `print_ratios`)."""
    print(
        "| way | convert s | upload s | workers | local batches/s per worker "
        "| s3 batches/s per worker | s3 / local | s3 first batch s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    per_worker: dict[tuple[str, int], float] = {}  # S3: real tokens/s a worker
    for (way, workers, place), (speed, _, tokens, first_s) in measured.items():
        if place != "s3":
            continue
        local = measured[(way, workers, None)][0] / max(workers, 1)
        remote = speed / max(workers, 1)
        per_worker[(way, workers)] = remote * tokens * batch_size
        print(
            f"| {way} | {converted[way][0]:.1f} | {uploaded[way][0]:.1f} | {workers} "
            f"| {local:.2f} | {remote:.2f} | {remote / local:.2f} | {first_s:.1f} |"
        )
    print()
    ratios(per_worker, "s3, ")
