"""Shards whose content repeats another's, and manifest counts that disagree with a shard:
training and `pretrain-data verify` refuse them naming the shard (or, under
data.bad_shards=skip, training leaves repeats out and counts them), and a count edited in the
manifest is caught when the shard is read (by whoever reads it), from its block index."""

import json
import shutil
import tarfile

import pytest
from test_train import tiny_overrides

from data_pipelines.cli import main as data_main
from pretrain.config import compose_config
from pretrain.data.datamodule import open_corpus
from pretrain.data.shard_format import (
    ShardError,
    file_sha256,
    load_manifest,
    read_documents,
    verify_shard,
)
from pretrain.runtime.run import build_stream, run_or_exit


def copied_corpus(prepared_corpus, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(prepared_corpus, shards)
    return shards


def rewrite_manifest(shards, change) -> None:
    path = shards / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    manifest["counts"]["documents"] = sum(s["documents"] for s in manifest["shards"])
    manifest["counts"]["tokens"] = sum(s["tokens"] for s in manifest["shards"])
    path.write_text(json.dumps(manifest, indent=2))


def list_copy(shards, name: str, record_of=None) -> None:
    """List `name` (a copy of the first shard) in the manifest, with `record_of(record)`'s
    changes to the first shard's record."""

    def change(manifest):
        record = {**manifest["shards"][0], "name": name}
        manifest["shards"].append(record_of(record) if record_of else record)

    rewrite_manifest(shards, change)


def refusal(cfg, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(cfg)
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    return lines[0]


def test_prepare_records_a_content_hash_per_block(prepared_corpus):
    manifest = load_manifest(prepared_corpus)
    for shard, path in zip(manifest.shards, manifest.shard_paths, strict=True):
        read = verify_shard(shard, path)
        assert [b["sha256"] for b in read["blocks"]] == [b["sha256"] for b in shard["blocks"]]
    hashes = [b["sha256"] for s in manifest.shards for b in s["blocks"]]
    assert len(set(hashes)) == len(hashes) and all(len(h) == 64 for h in hashes)


def test_a_shard_copied_under_another_name(prepared_corpus, tmp_path, capsys):
    shards = copied_corpus(prepared_corpus, tmp_path)
    shutil.copy(shards / "shard-000000.tar", shards / "shard-000099.tar")
    list_copy(shards, "shard-000099.tar")
    run_dir = tmp_path / "run"
    line = refusal(compose_config(tiny_overrides(shards, run_dir, "data.holdout_shards=0")), capsys)
    assert line.startswith(f"error: {shards / 'shard-000099.tar'}: repeats content (the same ")
    assert "shard-000000.tar" in line and not (run_dir / "checkpoints").exists()

    assert data_main(["verify", str(shards)]) == 1
    assert "shard-000099.tar: repeats content" in capsys.readouterr().err

    skipping = tiny_overrides(shards, run_dir, "data.holdout_shards=0", "data.bad_shards=skip")
    _, spec, _ = build_stream(compose_config(skipping))
    assert [p.rsplit("/", 1)[1] for p in spec.shard_paths] == [
        f"shard-{i:06d}.tar" for i in range(6)
    ]
    err = capsys.readouterr().err
    assert "left out" in err and "1 of 7 training shards repeat" in err


def test_a_shard_whose_blocks_repeat_another_shard(prepared_corpus, tmp_path, capsys):
    """Other bytes (another tar of the same members), the same documents."""
    shards = copied_corpus(prepared_corpus, tmp_path)
    with tarfile.open(shards / "shard-000000.tar") as source:
        with tarfile.open(shards / "shard-000099.tar", "w", format=tarfile.USTAR_FORMAT) as copy:
            for member in source.getmembers():
                data = source.extractfile(member)
                member.mtime = 12345
                copy.addfile(member, data)
    copy_path = shards / "shard-000099.tar"
    list_copy(
        shards,
        copy_path.name,
        lambda r: {**r, "sha256": file_sha256(copy_path), "bytes": copy_path.stat().st_size},
    )
    line = refusal(compose_config(tiny_overrides(shards, tmp_path / "run")), capsys)
    assert "shard-000099.tar: repeats content (block 0 holds the documents of block 0 of " in line

    assert data_main(["verify", str(shards)]) == 1
    assert "shard-000099.tar: repeats content (block 0" in capsys.readouterr().err


def test_a_manifest_count_lowered_by_hand(prepared_corpus, tmp_path, capsys):
    shards = copied_corpus(prepared_corpus, tmp_path)

    def lower(manifest):
        shard = manifest["shards"][0]
        shard["documents"] -= 1
        shard["blocks"][-1]["documents"] -= 1

    rewrite_manifest(shards, lower)
    line = refusal(compose_config(tiny_overrides(shards, tmp_path / "run")), capsys)
    assert f"{shards / 'shard-000000.tar'}: holds 50 documents" in line
    assert "the manifest says 49" in line
    corpus = open_corpus(shards)  # the block index is read lazily, with the shard
    first = corpus.manifest.shard_paths[0]
    with pytest.raises(ShardError, match=f"{first}: holds 50 documents.*the manifest says 49"):
        next(read_documents(first))
