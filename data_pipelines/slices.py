"""Preparing one corpus in slices, as a SLURM job array, and merging them.

Three steps, each given the same `prepare` overrides (see slurm/prepare.sbatch):

    pretrain-data prepare-tokenizer [overrides]       one job: the tokenizer of all inputs
    pretrain-data prepare-slice I N [overrides]       array task I of N: shards of slice I
    pretrain-data merge [overrides]                   one job: out_dir with one manifest

The work lives in `.<out_dir name>.slices/` beside `out_dir`: `tokenizer/` (trained on every
input, as `prepare` trains it, or copied from `tokenizer.path`) and `slice-IIIII-of-NNNNN/`,
each a prepared corpus of a contiguous run of the expanded input files, tokenized with that
one tokenizer and without span annotations. The merge rewrites nothing: it hard-links the
slices' shards, in order, into `out_dir` as shard-000000.tar, ... with their manifest records
(sha256 included) carried over, so its time grows with the number of shards, not their bytes;
then it adds span annotations where asked (phrases need counts over the whole corpus) and
writes the manifest. `out_dir` holds the documents, in order, and the counts of a single
`pretrain-data prepare` with the same overrides (each slice's last shard may be short). It is
written atomically (as `prepare` does); the work directory is removed only once the corpus is
in place (and uploaded, for a URL out_dir), so a merge or upload that fails is run again.
"""

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from tokenizers import Tokenizer

from data_pipelines import global_dedup
from data_pipelines.cleaning import merge_records
from data_pipelines.pieces import plan_pieces, source_path
from data_pipelines.prepare import (
    TOKENIZER_DIR,
    PrepareError,
    _check_out_dir,
    make_tokenizer,
    prepare,
    write_prepared,
)
from data_pipelines.prepare_config import EntitySettings, PhraseSettings, PrepareConfig
from data_pipelines.publish import check_remote_out_dir, local_out_dir, publish
from data_pipelines.shard_writer import SHARD_PATTERN
from data_pipelines.sources import expand_inputs
from data_pipelines.tokenizer import copy_tokenizer, tokenizer_sha256
from pretrain.data.shard_format import MANIFEST_FILE, file_sha256
from pretrain.storage import is_url

COUNTS = ("documents", "sentences", "tokens", "empty_documents", "undecodable_lines")


def work_dir(cfg: PrepareConfig) -> Path:
    """`.<out_dir name>.slices` beside `out_dir` (absolute): the tokenizer and the slices."""
    out_dir = local_out_dir(cfg.out_dir)
    return out_dir.with_name(f".{out_dir.name}.slices")


def slice_dir(cfg: PrepareConfig, index: int, count: int) -> Path:
    """Where array task `index` of `count` writes its slice."""
    return work_dir(cfg) / f"slice-{index:05d}-of-{count:05d}"


def slice_inputs(cfg: PrepareConfig, index: int, count: int) -> list[str]:
    """The sources of slice `index` of `count`: whole files and pieces of files
    (`data_pipelines.pieces`), in input order, about the same stored bytes in each slice
    (`plan_pieces`; kept as `<work>/plan-NNNNN.json`, made by the first task to need it).
    Raises PrepareError for an index outside 0 .. count - 1."""
    if not 0 <= index < count:
        raise PrepareError(f"slice {index} of {count}: the index must lie in 0..{count - 1}")
    names = expand_inputs(cfg.inputs)
    path = work_dir(cfg) / f"plan-{count:05d}.json"
    if path.is_file():
        plan = json.loads(path.read_text(encoding="utf-8"))
        if plan["names"] == names:
            return plan["tasks"][index]
    tasks = plan_pieces(names, count)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    partial.write_text(json.dumps({"names": names, "tasks": tasks}) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return tasks[index]


def prepare_tokenizer(cfg: PrepareConfig) -> Path:
    """Train the tokenizer on all inputs (or copy `tokenizer.path`) into `<work>/tokenizer`;
    returns that directory. Refuses an out_dir that `merge` could not replace."""
    names = expand_inputs(cfg.inputs)
    check_remote_out_dir(cfg.out_dir, cfg.overwrite)
    _check_out_dir(local_out_dir(cfg.out_dir), cfg.overwrite or is_url(cfg.out_dir), names)
    target = work_dir(cfg) / TOKENIZER_DIR
    made_for = work_dir(cfg) / "tokenizer-config.json"
    if (target / "tokenizer.json").is_file() and _same_config(made_for, cfg):
        _resumed(f"tokenizer: resumed (trained before for these overrides: {target})")
        return target
    partial = target.with_name(TOKENIZER_DIR + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    make_tokenizer(cfg, names, partial)
    shutil.rmtree(target, ignore_errors=True)
    made_for.unlink(missing_ok=True)
    partial.rename(target)
    made_for.write_text(json.dumps(cfg.content_dict(), sort_keys=True) + "\n", encoding="utf-8")
    return target


def _same_config(path: Path, cfg: PrepareConfig) -> bool:
    """Whether the JSON file `path` holds the content of `cfg` (what a step was made for)."""
    if not path.is_file():
        return False
    made_for = json.loads(path.read_text(encoding="utf-8"))
    return made_for == json.loads(json.dumps(cfg.content_dict(), sort_keys=True))


def _resumed(message: str) -> None:
    """The one line a rerun step prints about the work it found done."""
    print(message, file=sys.stderr)


def prepare_slice(cfg: PrepareConfig, index: int, count: int, progress: bool | None = None) -> Path:
    """Prepare slice `index` of `count` with the tokenizer of `prepare_tokenizer`; returns the
    slice directory (kept, with a line saying so, where a complete one was made with the same
    settings; an interrupted one leaves only a partial directory, which a rerun replaces)."""
    tokenizer = work_dir(cfg) / TOKENIZER_DIR
    if not (tokenizer / "tokenizer.json").is_file():
        raise PrepareError(
            f"{tokenizer}: no tokenizer; run `pretrain-data prepare-tokenizer` with the same "
            "overrides first (the array's first job)"
        )
    inputs = slice_inputs(cfg, index, count)
    if not inputs:  # a task whose share lies inside a file that cannot be cut
        return _empty_slice(slice_dir(cfg, index, count), tokenizer)
    deduplicate = None
    if global_dedup.is_global(cfg):
        work = dedup_dir(cfg, count)
        if not (work / "summary.json").is_file():
            raise PrepareError(
                f"{work}: no duplicates found yet; run `pretrain-data dedup-signatures I "
                f"{count}` for every I, then `pretrain-data dedup {count}` (same overrides)"
            )
        deduplicate = global_dedup.GlobalRemovals(work, index, cfg.filters)
        cfg = global_dedup.rule_settings(cfg)
    part = replace(
        cfg,
        inputs=inputs,
        out_dir=str(slice_dir(cfg, index, count)),
        tokenizer=replace(cfg.tokenizer, path=str(tokenizer)),
        phrases=PhraseSettings(),
        entities=EntitySettings(),
        overwrite=True,
    )
    done = slice_dir(cfg, index, count) / MANIFEST_FILE
    if done.is_file():
        made_for = json.loads(done.read_text(encoding="utf-8")).get("config")
        if made_for == json.loads(json.dumps(part.content_dict())):
            _resumed(f"slice {index} of {count}: resumed (complete: {done.parent})")
            return done.parent
    return prepare(part, progress=progress, allow_empty=True, deduplicate=deduplicate)


def dedup_dir(cfg: PrepareConfig, count: int) -> Path:
    """Where the global deduplication of an array of `count` tasks keeps its files."""
    return work_dir(cfg) / f"dedup-{count:05d}"


def prepare_dedup_signatures(cfg: PrepareConfig, index: int, count: int) -> Path:
    """Array task `index` of `count`: the dedup signatures of its slice (see
    `global_dedup`); returns the dedup directory."""
    work = dedup_dir(cfg, count)
    work.mkdir(parents=True, exist_ok=True)
    global_dedup.dedup_signatures(cfg, slice_inputs(cfg, index, count), index, count, work)
    return work


def prepare_dedup(cfg: PrepareConfig, count: int, workers: int = 1) -> dict:
    """One job after the signatures: the duplicates across all `count` slices; returns
    {filter: documents it removes}."""
    return global_dedup.find_duplicates(cfg, count, dedup_dir(cfg, count), workers)


def _empty_slice(directory: Path, tokenizer: Path) -> Path:
    """A slice of no source: a manifest with no shard, written atomically."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    manifest = {
        "tokenizer": {"sha256": tokenizer_sha256(tokenizer)},
        "counts": dict.fromkeys(COUNTS, 0),
        "sources": [],
        "shards": [],
    }
    partial = directory / f".{MANIFEST_FILE}.partial"
    partial.write_text(json.dumps(manifest) + "\n", encoding="utf-8")
    os.replace(partial, directory / MANIFEST_FILE)
    return directory


def _slices(cfg: PrepareConfig) -> list[Path]:
    """The complete slices of the work directory, in order; PrepareError naming a missing one."""
    work = work_dir(cfg)
    found = sorted(work.glob("slice-*-of-*"))
    counts = {p.name.rsplit("-", 1)[1] for p in found}
    if not found or len(counts) != 1:
        raise PrepareError(
            f"{work}: {'no slices' if not found else 'slices of different array sizes'}; run "
            "`pretrain-data prepare-slice I N` for I in 0..N-1 (with one N) first"
        )
    count = int(counts.pop())
    for index in range(count):
        if not (slice_dir(cfg, index, count) / MANIFEST_FILE).is_file():
            raise PrepareError(
                f"{slice_dir(cfg, index, count)}: slice {index} of {count} is missing or "
                f"incomplete; rerun array task {index} (`pretrain-data prepare-slice {index} "
                f"{count} ...`)"
            )
    return [slice_dir(cfg, index, count) for index in range(count)]


def link_shard(source: Path, target: Path) -> None:
    """Put the shard `source` at `target` without reading it: a hard link (the slice keeps
    its own name for it, so an interrupted merge leaves the slices whole), a copy only where
    the filesystem has no links."""
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, target)


def _slice_manifest(directory: Path, sha256: str) -> dict:
    """The manifest of one slice, checked to be made with the array's tokenizer."""
    raw = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
    if raw["tokenizer"]["sha256"] != sha256:
        raise PrepareError(
            f"{directory}: made with another tokenizer than {directory.parent / TOKENIZER_DIR}; "
            "rerun its array task"
        )
    return raw


def merged_corpus(cfg: PrepareConfig, slices: list[Path], sha256: str, partial: Path) -> dict:
    """Link the shards of `slices` (in order) into `partial` as shard-000000.tar, ... and
    return the counts, sources, shards (records carried over, renamed: no shard is read or
    hashed) and filters sections of their manifest. Time grows with the number of shards."""
    counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
    sources: list[dict] = []
    shards: list[dict] = []
    filter_records, dedups = [], []
    for directory in slices:
        raw = _slice_manifest(directory, sha256)
        if raw.get("filters"):
            filter_records.append(raw["filters"])
        if raw.get("dedup"):
            dedups.append(raw["dedup"])
        for key, value in raw["counts"].items():
            counts[key] = counts.get(key, 0) + value
        _add_sources(sources, raw["sources"])
        for shard in raw["shards"]:
            name = SHARD_PATTERN.format(len(shards))
            link_shard(directory / shard["name"], partial / name)
            shards.append({**shard, "name": name})
    corpus = {"counts": counts, "sources": sources, "shards": shards}
    rules = merge_records(filter_records) if filter_records else None
    if global_dedup.is_global(cfg):
        corpus["filters"] = global_dedup.merged_filters(cfg, rules, dedups)
    elif rules:
        corpus["filters"] = rules
    return corpus


def _add_sources(sources: list[dict], more: list[dict]) -> None:
    """Append the per-source records `more` to `sources`, those of pieces of a file summed
    into one record of the file (as a single run records it)."""
    for record in more:
        record = {**record, "path": source_path(record["path"])}
        if sources and sources[-1]["path"] == record["path"]:
            for key, value in record.items():
                if key != "path":
                    sources[-1][key] += value
        else:
            sources.append(record)


def merge_slices(cfg: PrepareConfig) -> Path:
    """Merge the slices into `cfg.out_dir` (atomically, as `prepare` writes): their shards
    linked in order under new names with their records (sha256 included) carried over, span
    annotations added as `cfg` says (the one step that rewrites shards), the manifest written;
    then the corpus is uploaded where out_dir is a URL, and only then is the work directory
    removed (a failed upload is resumed by running the merge again). Returns out_dir. The
    documents, in order, and the counts are a single run's; each slice's last shard may hold
    fewer than `docs_per_shard` documents."""
    out_dir = local_out_dir(cfg.out_dir)  # a URL's: a staging dir, uploaded at the end
    slices = _slices(cfg)
    merged = work_dir(cfg) / "merged.sha256"  # the manifest the merge wrote, once in place
    if merged.is_file() and (out_dir / MANIFEST_FILE).is_file():
        if file_sha256(out_dir / MANIFEST_FILE) == merged.read_text().strip():
            _resumed(f"merge: resumed ({out_dir} written before; publishing, removing slices)")
            result = publish(cfg.out_dir, out_dir)
            shutil.rmtree(work_dir(cfg))
            return result
    names = expand_inputs(cfg.inputs)
    check_remote_out_dir(cfg.out_dir, cfg.overwrite)
    _check_out_dir(out_dir, cfg.overwrite or is_url(cfg.out_dir), names)

    def write(partial: Path) -> tuple[Tokenizer, dict]:
        source_tokenizer = work_dir(cfg) / TOKENIZER_DIR
        tokenizer: Tokenizer = copy_tokenizer(source_tokenizer, partial / TOKENIZER_DIR)
        return tokenizer, merged_corpus(cfg, slices, tokenizer_sha256(source_tokenizer), partial)

    write_prepared(cfg, out_dir, write)
    merged.write_text(file_sha256(out_dir / MANIFEST_FILE) + "\n")
    result = publish(cfg.out_dir, out_dir)
    shutil.rmtree(work_dir(cfg))
    return result
