"""A corpus at a URL is mirrored once per launch and node, without listing the store (issue
54 item 1): the node's first process fetches the manifest and tokenizer, the others of the
same launch find its copy; a new launch fetches anew; only the manifest's own files come."""

import shutil
from pathlib import Path

from pretrain.storage.corpus import MANIFEST_FILE, mirror_corpus


def remote_copy(prepared_corpus: Path, tmp_path: Path) -> Path:
    remote = tmp_path / "remote"
    shutil.copytree(prepared_corpus, remote)
    (remote / "tokenizer" / "notes.txt").write_text("a file only a listing would find")
    return remote


def test_one_fetch_per_launch_and_node(prepared_corpus, tmp_path, monkeypatch):
    remote = remote_copy(prepared_corpus, tmp_path)
    url, cache = f"file://{remote}", tmp_path / "cache"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    root, listing = mirror_corpus(url, cache)
    assert listing is None
    first = (root / MANIFEST_FILE).read_bytes()
    assert first == (remote / MANIFEST_FILE).read_bytes()
    assert (root / "tokenizer" / "tokenizer.json").is_file()
    assert not (root / "tokenizer" / "notes.txt").exists()  # the store was not listed

    (remote / MANIFEST_FILE).write_bytes(first + b" ")  # the store changes under the launch
    assert mirror_corpus(url, cache)[0] == root  # another rank of the launch: the copy
    assert (root / MANIFEST_FILE).read_bytes() == first

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeued job: a new launch
    mirror_corpus(url, cache)
    assert (root / MANIFEST_FILE).read_bytes() == first + b" "


def test_a_lone_process_fetches_every_time(prepared_corpus, tmp_path, monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    remote = remote_copy(prepared_corpus, tmp_path)
    url, cache = f"file://{remote}", tmp_path / "cache"
    root, _ = mirror_corpus(url, cache)
    (remote / MANIFEST_FILE).write_bytes((remote / MANIFEST_FILE).read_bytes() + b" ")
    mirror_corpus(url, cache)
    assert (root / MANIFEST_FILE).read_bytes() == (remote / MANIFEST_FILE).read_bytes()
