"""A corpus's manifest opened for training: parsed and checked once per node into its shard
table (`manifest_table`), which every other rank and data-loader worker maps."""

import json
from pathlib import Path

from pretrain.data.manifest_table import TableShards, node_table, register_table, registered_table
from pretrain.data.shard_format import (
    MANIFEST_FILE,
    PREPARE_HINT,
    Manifest,
    ShardError,
    checked_manifest,
)

TABLES_DIR = "manifest-tables"


def open_manifest(shards_dir: str | Path, table_home: str | Path | None = None) -> Manifest:
    """The manifest of `shards_dir` (`load_manifest`'s checks, run once per node) backed by
    its shard table in `table_home` (default: where this process found it before, else
    `<node cache>/manifest-tables`): its `shards`
    are records built on access, its `raw` the manifest without its shards. Registers the
    table for this process and the workers its shard paths reach. Raises ShardError naming
    the manifest, as `load_manifest`."""
    path = Path(shards_dir).resolve() / MANIFEST_FILE
    if not path.is_file():
        raise ShardError(
            f"{path}: no manifest; {PREPARE_HINT} (or point at the out_dir of a prepare run)"
        )
    if table_home is None and registered_table(path.parent):  # opened before here
        table_home = Path(registered_table(path.parent)).parent
    if table_home is None:
        from pretrain.storage import default_cache_dir

        table_home = default_cache_dir() / TABLES_DIR

    def parse(data: bytes) -> tuple[dict, list[dict], str]:
        try:
            raw = json.loads(data.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ShardError(f"{path}: not valid JSON ({error}); {PREPARE_HINT}") from error
        if not isinstance(raw, dict):
            raise ShardError(f"{path}: not a JSON object; {PREPARE_HINT}")
        manifest = checked_manifest(path, raw)
        rest = {key: value for key, value in raw.items() if key != "shards"}
        return rest, manifest.shards, manifest.content_sha256

    table = node_table(path, Path(table_home), parse)
    register_table(path.parent, table.directory)
    raw = table.header["raw"]
    return Manifest(
        root=path.parent,
        format_version=raw["format_version"],
        tokenizer_sha256=str(raw["tokenizer"]["sha256"]),
        vocab_size=int(raw["tokenizer"]["vocab_size"]),
        dtype=str(raw["dtype"]),
        shards=TableShards(table),
        counts=dict(raw["counts"]),
        raw=raw,
        table=table,
    )
