"""Publishing a locally written corpus to a URL: in parallel, resumable, the manifest last.

Each file is uploaded by a thread of a pool, then its sha256 is written beside it as a
sidecar, `.sha256/<name>` (a hidden path: readers mirror no name that starts with a dot). A
file already at the URL with the same size and a sidecar naming the same sha256 is skipped,
so running the same upload again after a failure sends only what is missing. The shards'
sha256 come from the manifest (they are not hashed again). Once every file is there, checked
by a new listing, the manifest is written: a reader never sees a manifest whose shards are
not all there. Nothing at the URL is deleted, except an older manifest of another corpus,
removed before its shards are replaced.
"""

import hashlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pretrain.storage.corpus import MANIFEST_FILE, list_objects
from pretrain.storage.retry import RetryPolicy, StorageError, with_retries
from pretrain.storage.urls import filesystem, join_url, redact

SIDECAR_DIR = ".sha256"
UPLOAD_THREADS = 8


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def local_files(local_dir: Path) -> dict[str, tuple[Path, int, str]]:
    """{name relative to `local_dir`: (path, bytes, sha256)} of the corpus's files but its
    manifest; the shards' sha256 are the manifest's, the other (small) files are hashed."""
    local_dir = Path(local_dir)
    manifest = json.loads((local_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    recorded = {s["name"]: s["sha256"] for s in manifest.get("shards", [])}
    files = {}
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        name = path.relative_to(local_dir).as_posix()
        if name != MANIFEST_FILE:
            sha256 = recorded.get(name) or _file_sha256(path)
            files[name] = (path, path.stat().st_size, sha256)
    return files


def publish_corpus(
    local_dir: Path, url: str, options_json: str = "{}", threads: int = UPLOAD_THREADS
) -> int:
    """Upload the prepared corpus in `local_dir` to `url` over `threads` connections,
    skipping the files already there (same size, same sha256 in their sidecar), then check
    the listing and write the manifest last. Returns the number of files uploaded (the
    manifest not counted); prints a line when earlier uploads were resumed. Raises
    StorageError naming the first file that failed (run it again: what is there stays)."""
    fs = filesystem(url, options_json)
    retry = RetryPolicy()
    manifest_path = Path(local_dir) / MANIFEST_FILE
    manifest_url = join_url(url, MANIFEST_FILE)
    remote = with_retries(lambda: _listing(url, options_json), url, retry, "listing")
    if MANIFEST_FILE in remote:
        if fs.cat_file(manifest_url) == manifest_path.read_bytes():
            remote.pop(MANIFEST_FILE)  # the same corpus: its files are checked below
        else:  # another corpus: its manifest must not name the shards being replaced
            with_retries(lambda: fs.rm(manifest_url), manifest_url, retry, "removal")
    files = local_files(Path(local_dir))

    def present(name: str, size: int, sha256: str) -> bool:
        if remote.get(name) != size or remote.get(f"{SIDECAR_DIR}/{name}") is None:
            return False
        sidecar = join_url(url, f"{SIDECAR_DIR}/{name}")
        return with_retries(lambda: fs.cat_file(sidecar), sidecar, retry).decode() == sha256

    def upload(name: str) -> bool:
        path, size, sha256 = files[name]
        if present(name, size, sha256):
            return False
        target = join_url(url, name)
        with_retries(lambda: fs.put_file(str(path), target), target, retry, "upload")
        sidecar = join_url(url, f"{SIDECAR_DIR}/{name}")
        with_retries(lambda: fs.pipe_file(sidecar, sha256.encode()), sidecar, retry, "upload")
        return True

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="corpus-upload") as pool:
        uploaded = sum(pool.map(upload, files))
    _check_uploaded(url, files, with_retries(lambda: _listing(url, options_json), url, retry))
    with_retries(lambda: fs.put_file(str(manifest_path), manifest_url), manifest_url, retry)
    if uploaded < len(files):
        print(
            f"publish {redact(url)}: resumed, {len(files) - uploaded} of {len(files)} files "
            "already there were kept, the rest uploaded",
            file=sys.stderr,
        )
    return uploaded


def _listing(url: str, options_json: str) -> dict[str, int]:
    """`list_objects`, empty where nothing is at `url` yet."""
    try:
        return list_objects(url, options_json)
    except FileNotFoundError:
        return {}


def _check_uploaded(url: str, files: dict[str, tuple[Path, int, str]], remote: dict) -> None:
    """StorageError naming the first file missing at `url` or of another size there."""
    for name, (_, size, _) in files.items():
        if remote.get(name) != size:
            raise StorageError(
                f"{redact(join_url(url, name))}: {remote.get(name)} bytes after the upload, "
                f"{size} written locally; run the upload again"
            )
