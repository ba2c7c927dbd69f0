"""`pretrain-data`: prepare corpora, inspect prepared shards, preview batches.

pretrain-data prepare [overrides...]     e.g. inputs=[corpus/] out_dir=data/mine tokenizer.vocab_size=16000
pretrain-data info <shards_dir>          a prepared corpus: its manifest summary, after checking
                                         every shard (a model's size: pretrain-params)
pretrain-data preview [overrides...]     batches as the training run would see them
pretrain-data verify <shards_dir>        read every shard in full: sha256, blocks, counts
pretrain-data upgrade <shards_dir>       convert shards of format 1 to format 2, in place

As a SLURM job array (slurm/prepare.sbatch; same overrides for every step):
pretrain-data prepare-tokenizer [overrides...]   the tokenizer of all inputs
pretrain-data prepare-slice I N [overrides...]   array task I of N: shards of slice I
pretrain-data dedup-signatures I N [overrides...] array task I: datatrove dedup signatures
pretrain-data dedup N [overrides...]            the duplicates across all N slices
pretrain-data merge [overrides...]               slices -> out_dir, one manifest
"""

import sys

from pretrain.cluster.process_exit import console_script
from pretrain.errors import filesystem_error, report_error

USAGE = __doc__.split("\n", 1)[1]


def _prepare_errors() -> tuple[type[Exception], ...]:
    """The errors of preparing a corpus that name what the user should fix (exit status 2)."""
    from data_pipelines.filter_settings import FilterSettingsError
    from data_pipelines.prepare import PrepareError
    from data_pipelines.prepare_config import PrepareConfigError
    from data_pipelines.sources import SourceError
    from data_pipelines.span_annotation import EntityFileError
    from data_pipelines.tokenizer import TokenizerError
    from pretrain.errors import ConfigError
    from pretrain.storage import StorageError  # an out_dir URL: upload, missing extra

    return (
        PrepareConfigError,
        FilterSettingsError,
        PrepareError,
        SourceError,
        TokenizerError,
        EntityFileError,
        StorageError,
        ConfigError,
    )


def _prepare(overrides: list[str]) -> int:
    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import compose_prepare_config

    try:
        out_dir = prepare(compose_prepare_config(overrides))
    except _prepare_errors() as error:
        report_error(error, "pretrain-data prepare")
        return 2
    return _info([str(out_dir)])


COUNTS = ("documents", "sentences", "tokens", "empty_documents", "undecodable_lines")
ANNOTATIONS = (
    ("phrases", "phrase lexicon"),
    ("entities", "entity list"),
    ("phrase_spans", "phrase spans"),
    ("entity_spans", "entity spans"),
)


def summarize(shards_dir: str) -> str:
    """A human-readable summary of a prepared corpus (manifest checked, shards sizes checked)."""
    from pretrain.data.shard_format import check_shards, load_manifest
    from pretrain.storage import is_url

    if is_url(shards_dir):  # manifest and tokenizer mirrored into the cache, sizes listed
        from pretrain.data.datamodule import open_corpus

        manifest = open_corpus(shards_dir).manifest
    else:
        manifest = load_manifest(shards_dir)
        check_shards(manifest)
    tokenizer, counts = manifest.raw["tokenizer"], manifest.counts
    sources = manifest.raw.get("sources", [])
    total_bytes = sum(shard["bytes"] for shard in manifest.shards)
    rows = [
        ("shards dir", str(manifest.root)),
        ("format", str(manifest.format_version)),
        (
            "tokenizer",
            f"{manifest.tokenizer_dir} (sha256 {manifest.tokenizer_sha256[:12]}, vocab "
            f"{manifest.vocab_size}, {'uncased' if tokenizer.get('lowercase') else 'cased'})",
        ),
        ("ids dtype", manifest.dtype),
        ("shards", f"{len(manifest.shards)} ({total_bytes / 2**20:.1f} MiB)"),
        *((name, f"{counts.get(name, 0):,}") for name in COUNTS),
        ("word segmenter", _segmenter(manifest.raw.get("segmenter"))),
        *_annotation_rows(manifest.annotations),
        ("sources", str(len(sources))),
    ]
    lines = [f"{label:<18} {value}" for label, value in rows]
    for source in sources[:20]:
        lines.append(
            f"  {source['path']}: {source['documents']:,} documents, "
            f"{source['undecodable_lines']:,} undecodable lines"
        )
    if len(sources) > 20:
        lines.append(f"  ... and {len(sources) - 20} more")
    return "\n".join(lines + _warnings(manifest.raw, manifest.vocab_size))


def _warnings(raw: dict, vocab_size: int) -> list[str]:
    """Warning lines of a summary: a trained vocabulary smaller than asked for (both sizes),
    lines dropped or decoded with replacements by the `undecodable` policy (how many)."""
    config, counts, lines = raw.get("config") or {}, raw.get("counts") or {}, []
    asked = (config.get("tokenizer") or {}).get("vocab_size")
    if not (config.get("tokenizer") or {}).get("path") and asked and vocab_size < asked:
        lines.append(
            f"warning: tokenizer.vocab_size={asked} was asked for, the corpus gave {vocab_size:,} "
            "tokens (too little text for more); models are built with the smaller size"
        )
    if counts.get("undecodable_lines"):
        lines.append(
            f"warning: {counts['undecodable_lines']:,} undecodable line(s) dropped "
            f"(undecodable={config.get('undecodable', 'skip')}); see sources above"
        )
    if counts.get("replaced_lines"):
        lines.append(
            f"warning: {counts['replaced_lines']:,} line(s) decoded with U+FFFD replacements "
            "(undecodable=replace)"
        )
    return lines


def _segmenter(record: dict | None) -> str:
    return "none" if not record else f"{record['name']} {record.get('version', '')}".strip()


def _annotation_rows(annotations: dict | None) -> list[tuple[str, str]]:
    """Rows for the phrase/entity annotations: one `none` row when there are none."""
    if not annotations:
        return [("span annotations", "none")]
    return [(label, f"{annotations.get(key, 0):,}") for key, label in ANNOTATIONS]


def _info(args: list[str]) -> int:
    from pretrain.data.shard_format import ShardError

    if len(args) != 1:
        print("usage: pretrain-data info <shards_dir>", file=sys.stderr)
        return 2
    from pretrain.storage import StorageError

    try:
        print(summarize(args[0]))
    except (ShardError, StorageError) as error:
        report_error(error, "pretrain-data info")
        return 1
    return 0


def _preview(overrides: list[str]) -> int:
    from pretrain.runtime.preview import main as preview_main

    return preview_main(overrides) or 0


def _sliced(step: str, overrides: list[str]) -> int:
    """`prepare-tokenizer`, `dedup-signatures I N`, `dedup N`, `prepare-slice I N` and
    `merge` (see data_pipelines.slices)."""
    from data_pipelines import global_dedup, slices
    from data_pipelines.prepare import PrepareError
    from data_pipelines.prepare_config import compose_prepare_config

    try:
        if step in ("prepare-slice", "dedup-signatures"):
            if len(overrides) < 2 or not (overrides[0].isdigit() and overrides[1].isdigit()):
                raise PrepareError(
                    f"usage: pretrain-data {step} INDEX COUNT [overrides...] "
                    "(e.g. $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT)"
                )
            index, count, overrides = int(overrides[0]), int(overrides[1]), overrides[2:]
        if step == "dedup":
            if not overrides or not overrides[0].isdigit():
                raise PrepareError("usage: pretrain-data dedup COUNT [overrides...]")
            count, overrides = int(overrides[0]), overrides[1:]
        cfg = compose_prepare_config(overrides)
        if step in ("dedup-signatures", "dedup") and not global_dedup.is_global(cfg):
            print(f"{step}: no exact_dedup or near_dedup in filters, nothing to do")
            return 0
        if step == "dedup-signatures":
            print(
                f"dedup signatures {index} of {count}: {slices.prepare_dedup_signatures(cfg, index, count)}"
            )
            return 0
        if step == "dedup":
            print(f"dedup of {count} slices removes: {slices.prepare_dedup(cfg, count)}")
            return 0
        if step == "prepare-tokenizer":
            print(f"tokenizer: {slices.prepare_tokenizer(cfg)}")
            return 0
        if step == "prepare-slice":
            print(f"slice {index} of {count}: {slices.prepare_slice(cfg, index, count)}")
            return 0
        out_dir = slices.merge_slices(cfg)
    except _prepare_errors() as error:
        print(f"pretrain-data {step}: {error}", file=sys.stderr)
        return 2
    return _info([str(out_dir)])


def _verify(args: list[str]) -> int:
    from pretrain.data.shard_format import ShardError, load_manifest, verify_shards

    if len(args) != 1:
        print("usage: pretrain-data verify <shards_dir>", file=sys.stderr)
        return 2
    from pretrain.storage import StorageError, is_url, redact

    try:
        if is_url(args[0]):  # each shard fetched through the cache (sha256 checked), then read
            from pretrain.data.datamodule import open_corpus, verified_shards

            corpus = open_corpus(args[0])
            manifest = corpus.manifest
            verified_shards(manifest, range(len(manifest.shards)), "error", corpus.storage)
        else:
            manifest = load_manifest(args[0])
            verify_shards(manifest)
    except (ShardError, StorageError) as error:
        print(f"pretrain-data verify: {error}", file=sys.stderr)
        return 1
    where = redact(args[0]) if is_url(args[0]) else manifest.root
    print(f"{where}: {len(manifest.shards)} shards verified")
    return 0


def _upgrade(args: list[str]) -> int:
    from data_pipelines.prepare import PrepareError
    from data_pipelines.upgrade import upgrade_corpus
    from pretrain.data.shard_format import ShardError

    if len(args) != 1:
        print("usage: pretrain-data upgrade <shards_dir>", file=sys.stderr)
        return 2
    try:
        upgrade_corpus(args[0])
    except (PrepareError, ShardError) as error:
        print(f"pretrain-data upgrade: {error}", file=sys.stderr)
        return 1
    return _info(args)


COMMANDS = {
    "prepare": _prepare,
    "verify": _verify,
    "upgrade": _upgrade,
    "info": _info,
    "preview": _preview,
    "prepare-tokenizer": lambda args: _sliced("prepare-tokenizer", args),
    "dedup-signatures": lambda args: _sliced("dedup-signatures", args),
    "dedup": lambda args: _sliced("dedup", args),
    "prepare-slice": lambda args: _sliced("prepare-slice", args),
    "merge": lambda args: _sliced("merge", args),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pretrain-data`; returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help") or {"-h", "--help"} & set(args[1:]):
        print(f"usage:\n{USAGE}")
        return 0 if args else 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(
            f"pretrain-data: unknown command {args[0]!r}; one of {', '.join(COMMANDS)}\nusage:\n{USAGE}",
            file=sys.stderr,
        )
        return 2
    try:
        return command(args[1:])
    except (OSError, RuntimeError) as error:  # where prepare, merge or upgrade write
        fault = filesystem_error(
            error, f"running pretrain-data {args[0]}", "run the same command again"
        )
        if fault is None:
            raise
        report_error(fault, f"pretrain-data {args[0]}")
        return 2


console_main = console_script(main)  # `main`, then the process ends (pretrain.cluster.process_exit)


if __name__ == "__main__":
    console_main()
