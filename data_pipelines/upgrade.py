"""`pretrain-data upgrade <dir>`: convert a prepared corpus of shard format 1 to format 2.

Streaming, a shard at a time (memory: one shard's block), with a progress bar over the old
shards' bytes. Each shard keeps its name and documents, in order, with their keys; the
manifest keeps every count, source and setting, gains `tokens_per_block` and the new
shards' bytes, sha256 and blocks. Written into `.<dir name>.upgrade` beside the directory;
only when it is complete is the original moved aside (`.<dir name>.format1`) and the new one
moved into place, then the original removed. An interrupted upgrade leaves the original
untouched (the next run starts over).
"""

import json
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from data_pipelines.prepare import PrepareError
from data_pipelines.shard_format_v1 import read_v1_documents
from data_pipelines.shard_writer import TOKENS_PER_BLOCK, ShardWriter
from pretrain.data.shard_format import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    load_manifest,
    read_manifest_json,
)


def _upgrade_shard(old: Path, new_dir: Path, record: dict, tokens_per_block: int) -> dict:
    """Write the documents of format-1 shard `old` as `new_dir/<same name>`; its new record."""
    writer = ShardWriter(new_dir, sys.maxsize, tokens_per_block, shard_name=lambda _: old.name)
    for document in read_v1_documents(old):
        writer.write(document)
    new = writer.close()
    if not new or (new[0]["documents"], new[0]["tokens"]) != (
        record["documents"],
        record["tokens"],
    ):
        raise PrepareError(
            f"{old}: holds other documents than its manifest records ({record['documents']} "
            "documents); the corpus is damaged, prepare it again"
        )
    return new[0]


def upgrade_corpus(shards_dir: str | Path, progress: bool | None = None) -> Path:
    """Convert the format-1 corpus in `shards_dir` to format 2 in place (atomically); returns
    the directory. Raises PrepareError when it is not of format 1, ShardError when a shard is
    damaged."""
    manifest_path, raw = read_manifest_json(shards_dir)
    root = manifest_path.parent
    version = raw.get("format_version")
    if version != 1:
        raise PrepareError(
            f"{manifest_path}: format_version is {version!r}; only format-1 corpora are upgraded "
            f"(format {FORMAT_VERSION} is current)"
        )
    work = root.with_name(f".{root.name}.upgrade")
    shutil.rmtree(work, ignore_errors=True)
    shards = [dict(shard) for shard in raw["shards"]]
    names = {shard["name"] for shard in shards} | {MANIFEST_FILE}
    shutil.copytree(root, work, ignore=lambda _, entries: [e for e in entries if e in names])
    config = dict(raw.get("config") or {})
    tokens_per_block = int(config.get("tokens_per_block", TOKENS_PER_BLOCK))
    bar = tqdm(
        desc="upgrade",
        total=sum(shard["bytes"] for shard in shards),
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        disable=None if progress is None else not progress,
    )
    try:
        new_shards = []
        for shard in shards:
            new = _upgrade_shard(root / shard["name"], work, shard, tokens_per_block)
            new_shards.append({**shard, **new})
            bar.update(shard["bytes"])
        config["tokens_per_block"] = tokens_per_block
        upgraded = {**raw, "format_version": FORMAT_VERSION, "shards": new_shards}
        upgraded["config"] = config
        (work / MANIFEST_FILE).write_text(
            json.dumps(upgraded, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        load_manifest(work)  # reads as format 2
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        bar.close()
    old = root.with_name(f".{root.name}.format1")
    shutil.rmtree(old, ignore_errors=True)
    root.rename(old)
    work.rename(root)
    shutil.rmtree(old)
    return root
