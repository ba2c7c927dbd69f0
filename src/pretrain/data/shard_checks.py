"""Cheap checks of a shards directory beyond each shard's own bytes: a manifest's counts
against a shard's block index, and shards whose content repeats another's (by the sha256 of
each shard and of each block that the manifest records). `pretrain.data.shard_format` and the
data module use them."""

import io
from pathlib import Path
from typing import Any

from pretrain.data.shard_blocks import PREPARE_HINT, ForwardReader, ShardError, block_index


def check_block_index(shard: dict, path: Path, data: bytes | None = None) -> None:
    """Compare the manifest's blocks of one shard (documents and tokens each) with the
    shard's own block index (`block_index`: its tar headers and small members, the ids not
    read), from its bytes `data` when read already, else from the file. Raises ShardError
    naming the shard when they disagree: a manifest whose counts were edited, or another
    shard under this name. Run by whoever reads the shard (`shard_format.checked_blocks`)."""
    try:
        if data is not None:
            found = block_index(path, ForwardReader(io.BytesIO(data)))
        else:
            with open(path, "rb") as f:
                found = block_index(path, ForwardReader(f))
    except OSError as error:
        raise ShardError(f"{path}: cannot be read ({error}); {PREPARE_HINT}") from error
    listed = [(int(block["documents"]), int(block["tokens"])) for block in shard["blocks"]]
    if found != listed:
        documents, tokens = sum(d for d, _ in found), sum(t for _, t in found)
        raise ShardError(
            f"{path}: holds {documents} documents and {tokens} tokens in {len(found)} blocks, "
            f"the manifest says {shard['documents']} and {shard['tokens']} in {len(listed)} "
            f"(a manifest edited by hand, or another shard under this name?); {PREPARE_HINT}"
        )


def repeated_shards(shards: list[dict], names: list[str] | None = None) -> dict[int, str]:
    """{number of a shard: why it repeats an earlier one} for the shard records `shards` (a
    manifest's, or records of what was read: "sha256" and the blocks' "sha256"): a shard whose
    sha256 is an earlier shard's, or one of whose blocks holds the same content as an earlier
    block (in another shard or its own). `names` (default: the records' "name") name them."""
    names = names or [str(shard.get("name", i)) for i, shard in enumerate(shards)]
    by_shard: dict[str, int] = {}
    by_block: dict[str, tuple[int, int]] = {}
    repeats: dict[int, str] = {}
    for number, shard in enumerate(shards):
        sha = shard.get("sha256")
        if sha and sha in by_shard:
            repeats[number] = f"the same bytes as shard {names[by_shard[sha]]}"
        elif sha:
            by_shard[sha] = number
        for block_number, block in enumerate(shard.get("blocks", ())):
            digest = block.get("sha256")
            if not digest:
                continue
            if digest in by_block and number not in repeats:
                first, first_block = by_block[digest]
                repeats[number] = (
                    f"block {block_number} holds the documents of block {first_block} of shard "
                    f"{names[first]}"
                )
            by_block.setdefault(digest, (number, block_number))
    return repeats


def repeat_message(manifest: Any, number: int, why: str) -> str:
    """The one line naming shard number `number` of `manifest` (a `shard_format.Manifest`),
    which repeats another (`why`), and what to do about it."""
    return (
        f"{manifest.shard_paths[number]}: repeats content ({why}): its documents would train "
        f"twice an epoch; remove it from {manifest.root / 'manifest.json'} ({PREPARE_HINT}), "
        "or leave such shards out with data.bad_shards=skip"
    )
