"""Deduplication across every task of a prepare array, through datatrove (the engine FineWeb
was prepared with): its MinHash stages (signatures -> buckets -> clusters -> filter) and its
exact deduplication (signatures -> duplicates), run by its executors.

Our own per-document work stays ours and comes first: normalisation, the Gopher/C4 rules and
language identification (`cleaning`, the filters of `filters` other than the two dedup ones).
The documents they keep are numbered per array task, in order; then

1. `dedup_signatures` (array task I of N): datatrove's MinHash signatures of the normalized
   text (`MinhashDedupSignature`) and exact-dedup hashes of `cleaning.dedup_text`
   (`ExactDedupSignature`, priority 65535 - I: of equal texts the earliest task's is kept);
2. `find_duplicates` (one job): `MinhashDedupBuckets` (one task per bucket) and
   `MinhashDedupCluster` (one task) under a `LocalPipelineExecutor` (completion markers: a
   rerun skips the finished tasks), `ExactFindDedups`; of each MinHash cluster the first
   document in corpus order is kept (datatrove keeps the root of its union-find, which need
   not be the first), written as datatrove's `.remove` files;
3. `prepare_slice` drops them with `MinhashDedupFilter` and `ExactDedupFilter`'s files.

So the documents kept do not depend on how the corpus is cut: N tasks keep those one task
keeps (tested). MinHash: datatrove's 14 buckets of 8 hashes over word `near_dedup.ngram`-grams
(documents of fewer words are not near-deduplicated); `near_dedup.threshold` and
`num_perm` are the one-process `prepare`'s (datasketch) settings.
"""

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from data_pipelines.cleaning import dedup_text
from data_pipelines.prepare import cleaned_documents
from data_pipelines.prepare_config import PrepareConfig
from data_pipelines.sources import RawDocument, SourceStats, read_raw_documents
from data_pipelines.text import normalize

DEDUP_FILTERS = ("exact_dedup", "near_dedup")
PRIORITY_MAX = 65535
WORDS = re.compile(r"\w+")
DONE = "signatures-{:05d}-of-{:05d}.done"


def is_global(cfg: PrepareConfig) -> bool:
    """Whether `cfg` deduplicates (so an array does it globally)."""
    return any(name in DEDUP_FILTERS for name in cfg.filters)


def rule_settings(cfg: PrepareConfig) -> PrepareConfig:
    """`cfg` with the per-document filters only (the array's slices deduplicate globally)."""
    return replace(cfg, filters=[f for f in cfg.filters if f not in DEDUP_FILTERS])


def _minhash_config(cfg: PrepareConfig):
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    near = cfg.filter.near_dedup
    return MinhashConfig(n_grams=near.ngram, seed=near.seed, hash_config=_hash_config())


def _hash_config():
    """64-bit SHA-1 hashes, as FineWeb's (datatrove's default, xxhash, needs bytes)."""
    from datatrove.utils.hashing import HashConfig

    return HashConfig(precision=64, hash_fc="sha1")


def _word_tokenizer():
    """Our words (`\\w+` runs, as `cleaning.shingles` takes them) as a datatrove WordTokenizer:
    no spaCy model to download, the same on every machine."""
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return WORDS.findall(text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return Words()


def _content(document) -> bytes:
    return dedup_text(document.text).encode("utf-8")


def _priority(document) -> int:
    return document.metadata["priority"]


def _exact_config():
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig

    return ExactDedupConfig(_content, _priority, _hash_config())


def kept_by_rules(cfg: PrepareConfig, inputs: list[str]) -> Iterator[RawDocument]:
    """The documents of the sources `inputs` that the per-document filters keep, in order
    (empty ones included: they are numbered too)."""
    if not inputs:
        return iter(())
    stats = [SourceStats(name) for name in inputs]
    raw = read_raw_documents(inputs, stats, cfg.text_field, False, cfg.undecodable, cfg.id_field)
    return cleaned_documents(rule_settings(cfg), raw)[0]


def dedup_signatures(cfg: PrepareConfig, inputs: list[str], index: int, count: int, work: Path):
    """Array task `index` of `count`: the datatrove signatures of the documents of `inputs`
    (its slice) into `work`; skipped, with a line saying so, when a completed run left them."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    done = work / DONE.format(index, count)
    if done.is_file():
        print(
            f"dedup signatures of slice {index} of {count}: resumed (complete, {done})",
            file=sys.stderr,
        )
        return
    exact = ExactDedupSignature(str(work / "exact_sigs"), _exact_config())
    hashes: list = []

    def documents():
        for number, raw in enumerate(kept_by_rules(cfg, inputs)):
            text = normalize(raw.text)
            document = Document(
                text, f"{index}/{number}", metadata={"priority": PRIORITY_MAX - index}
            )
            if text:
                hashes.extend(exact.get_hashes(document, number))
            yield document

    signatures = MinhashDedupSignature(
        str(work / "minhash_sigs"), _minhash_config(cfg), language=_word_tokenizer()
    )
    signatures.run(documents(), index, count)
    exact.save_hashes(index, hashes)
    done.write_text("")


def find_duplicates(cfg: PrepareConfig, count: int, work: Path, workers: int = 1) -> dict:
    """The duplicates among the `count` tasks' signatures in `work`: datatrove's buckets and
    clusters (LocalPipelineExecutor, `workers` processes) and exact duplicates; writes
    `remove/NNNNNN.{exact,near}` (sorted document numbers per task) and `summary.json`;
    returns the summary ({filter: documents removed})."""
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.dedup.exact_dedup import ExactFindDedups
    from datatrove.pipeline.dedup.minhash import MinhashDedupBuckets, MinhashDedupCluster

    missing = [i for i in range(count) if not (work / DONE.format(i, count)).is_file()]
    if missing:
        raise RuntimeError(
            f"{work}: no signatures of slice {missing[0]} of {count}; rerun "
            f"`pretrain-data dedup-signatures {missing[0]} {count} ...`"
        )
    summary_path = work / "summary.json"
    if summary_path.is_file():
        print(f"dedup of {count} slices: resumed (found before: {summary_path})", file=sys.stderr)
        return json.loads(summary_path.read_text())
    config = _minhash_config(cfg)
    logs = work / "logs"
    buckets = LocalPipelineExecutor(
        [MinhashDedupBuckets(str(work / "minhash_sigs"), str(work / "buckets"), config=config)],
        tasks=config.num_buckets,
        workers=workers,
        logging_dir=str(logs / "buckets"),
    )
    clusters = LocalPipelineExecutor(
        [
            MinhashDedupCluster(
                str(work / "buckets"), str(work / "clusters"), config, save_cluster_id=True
            )
        ],
        tasks=1,
        workers=1,
        logging_dir=str(logs / "clusters"),
        depends=buckets,
    )
    exact = LocalPipelineExecutor(
        [ExactFindDedups(str(work / "exact_sigs"), str(work / "exact_dups"), _exact_config())],
        tasks=1,
        workers=1,
        logging_dir=str(logs / "exact"),
        depends=clusters,
    )
    exact.run()
    filters = [f for f in cfg.filters if f in DEDUP_FILTERS]
    removals = {
        "exact_dedup": _exact_removals(work / "exact_dups", count),
        "near_dedup": _first_of_each_cluster(work / "clusters", count),
    }
    (work / "remove").mkdir(exist_ok=True)
    summary = dict.fromkeys(filters, 0)
    for rank in range(count):
        taken: set[int] = set()
        for name in filters:  # a document two filters remove counts for the first
            ours = sorted(set(removals[name].get(rank, ())) - taken)
            taken.update(ours)
            summary[name] += len(ours)
            np.array(ours, "<u4").tofile(work / "remove" / f"{rank:06d}.{name}")
    partial = summary_path.with_name(f".summary.partial-{os.getpid()}")
    partial.write_text(json.dumps(summary) + "\n")
    os.replace(partial, summary_path)
    return summary


def _exact_removals(folder: Path, count: int) -> dict[int, list[int]]:
    """{task: document numbers} ExactFindDedups marked (all but the first of equal texts)."""
    removals: dict[int, list[int]] = {}
    for path in folder.rglob("*.c4_dup") if folder.is_dir() else ():
        rank = int(path.name.split(".")[0])  # the signature file's stem: its task
        removals.setdefault(rank, []).extend(np.fromfile(path, "<u4").tolist())
    return removals


def _first_of_each_cluster(folder: Path, count: int) -> dict[int, list[int]]:
    """{task: document numbers} of every member of a MinHash cluster but its first in corpus
    order (task, then number), read from MinhashDedupCluster's `.clusters` files."""
    members: dict[int, list[tuple[int, int]]] = {}
    for rank in range(count):
        path = folder / f"{rank:06d}.clusters"
        if path.is_file():
            pairs = np.fromfile(path, "<u4").reshape(-1, 2)
            for number, cluster in pairs.tolist():
                members.setdefault(cluster, []).append((rank, number))
    removals: dict[int, list[int]] = {}
    for nodes in members.values():
        for rank, number in sorted(nodes)[1:]:
            removals.setdefault(rank, []).append(number)
    return removals


class GlobalRemovals:
    """The documents task `rank` drops (`find_duplicates`' files), applied in order to the
    documents the rules keep; counts what each dedup filter removed."""

    def __init__(self, work: Path, rank: int, filters: list[str]):
        self.sets = {
            name: set(np.fromfile(work / "remove" / f"{rank:06d}.{name}", "<u4").tolist())
            for name in filters
            if name in DEDUP_FILTERS
        }
        self.seen = 0
        self.removed = dict.fromkeys(self.sets, 0)
        self.examples: dict[str, list[str]] = {name: [] for name in self.sets}

    def __call__(self, documents: Iterator[RawDocument]) -> Iterator[RawDocument]:
        """`documents` (those the rules keep, in order) without the duplicates."""
        for number, document in enumerate(documents):
            self.seen += 1
            name = next((n for n, s in self.sets.items() if number in s), None)
            if name is None:
                yield document
                continue
            self.removed[name] += 1
            if len(self.examples[name]) < 5:
                self.examples[name].append(document.key)

    def record(self) -> dict:
        """What this task's dedup removed (JSON, kept beside the slice's manifest)."""
        return {"documents": self.seen, "removed": self.removed, "examples": self.examples}


def merged_filters(cfg: PrepareConfig, rules: dict | None, dedups: list[dict]) -> dict:
    """The manifest's `filters` section of an array with global dedup: the rules' counts
    (`rules`, merged from the slices; None without rules) and the dedup counts of each slice
    (`GlobalRemovals.record`), `dedup_scope: global`."""
    seen = sum(d["documents"] for d in dedups)
    section = dict(rules) if rules else {"documents_in": seen, "documents_kept": seen}
    section["order"] = list(cfg.filters)
    examples = dict(section.get("examples", {}))
    for name in (f for f in cfg.filters if f in DEDUP_FILTERS):
        removed = sum(d["removed"][name] for d in dedups)
        section["documents_kept"] -= removed
        section[name] = {"removed": removed, "engine": "datatrove"}
        examples[name] = [k for d in dedups for k in d["examples"][name]][:5]
    section["examples"] = {name: examples.get(name, []) for name in cfg.filters}
    section["dedup_scope"] = "global"
    return section
