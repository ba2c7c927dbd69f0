"""Prepare's cleaning stage: the filters `filters=[...]` names, applied to every document in
input order, in parallel, with the same result whatever the number of processes.

The filters (settings in `data_pipelines.filter_settings`, `filter.<name>.<key>`):
- `exact_dedup`: a document whose normalized text (NFC, case-folded, whitespace collapsed)
  has the same 64-bit BLAKE2b digest as an earlier kept document's is removed (a chance
  collision at 10^8 documents: about 3 in 10,000 corpora).
- `near_dedup`: MinHash LSH (datasketch) over lower-cased word n-grams; a document that
  shares an LSH band with an earlier kept document is removed. The manifest records the
  bands and rows datasketch chose and the probability that a pair is caught at a Jaccard
  similarity of the threshold, 0.1 above it and 0.1 below it (the false-positive side):
  1 - (1 - s^rows)^bands.
- `quality`: the Gopher/C4 rules of `data_pipelines.quality`.
- `language`: py3langid's model (shipped inside the package, no download).

Per-document work (the quality rules, language identification, the digest and the MinHash
signature) runs in `num_proc` spawned processes, a chunk of documents a task; the decisions
that depend on earlier documents (the two deduplications) are made here, in input order, so
the kept documents are the same for any `num_proc`. A document is checked by the filters in
the order `filters` lists them; the first that removes it is counted. Empty documents pass
untouched (prepare counts them as empty). `CleaningStats.record()` is the manifest's
`filters` section: documents in and kept, what each filter removed (by rule and by
language), and under `examples` the keys of the first documents each removed (their ids from
the input with `id_field`, so a removal can be looked up in the source).
"""

import hashlib
import os
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

from data_pipelines.filter_settings import FilterSettings, FilterSettingsError, NearDedupSettings
from data_pipelines.quality import quality_failure
from data_pipelines.sources import RawDocument
from data_pipelines.text import normalize

PER_DOCUMENT = ("quality", "language")
CHUNK_DOCUMENTS = 512  # documents per task (at most; and about 1 M characters)
EXAMPLES = 5  # removed documents named per filter in the manifest
_WORD_RE = re.compile(r"\w+")


@dataclass(frozen=True)
class Verdict:
    """What the per-document filters found: the first of them that removes the document
    (None: none) and its detail (the quality rule, the language), the exact digest and the
    MinHash signature (None unless those filters run)."""

    failed: str | None = None
    detail: str | None = None
    digest: int | None = None
    signature: object = None
    empty: bool = False


def dedup_text(text: str) -> str:
    """`text` as exact deduplication compares it: normalized, case-folded, every run of
    whitespace one space."""
    return " ".join(normalize(text).casefold().split())


def exact_digest(text: str) -> int:
    """64-bit BLAKE2b digest of `dedup_text(text)`, as an int."""
    digest = hashlib.blake2b(dedup_text(text).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def shingles(text: str, ngram: int) -> list[bytes]:
    """Lower-cased word `ngram`-grams of `text` (one of all its words when it has fewer)."""
    words = _WORD_RE.findall(text.casefold())
    if len(words) <= ngram:
        return [" ".join(words).encode("utf-8")]
    return [" ".join(words[i : i + ngram]).encode("utf-8") for i in range(len(words) - ngram + 1)]


_MINHASH_TEMPLATES: dict[tuple[int, int], object] = {}


def minhash_signature(text: str, settings: NearDedupSettings):
    """A datasketch LeanMinHash of `text`'s shingles (`settings.num_perm` hash values)."""
    from datasketch import LeanMinHash, MinHash

    key = (settings.num_perm, settings.seed)
    template = _MINHASH_TEMPLATES.get(key)
    if template is None:
        template = _MINHASH_TEMPLATES[key] = MinHash(settings.num_perm, seed=settings.seed)
    minhash = MinHash(
        settings.num_perm,
        seed=settings.seed,
        permutations=template.permutations,
        scheme=template.scheme,
    )
    minhash.update_batch(shingles(text, settings.ngram))
    return LeanMinHash(minhash)


_IDENTIFIER = None


def identify_language(text: str, max_chars: int) -> tuple[str, float]:
    """(ISO 639-1 code, probability) of the first `max_chars` characters of `text`, by
    py3langid's shipped model (loaded once per process)."""
    global _IDENTIFIER
    if _IDENTIFIER is None:
        from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

        _IDENTIFIER = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
    language, probability = _IDENTIFIER.classify(text[:max_chars])
    return language, float(probability)


def judge(text: str, filters: tuple[str, ...], settings: FilterSettings) -> Verdict:
    """The per-document part of the `filters` for one raw document's text."""
    clean = normalize(text)
    if not clean:
        return Verdict(empty=True)
    failed = detail = None
    for name in filters:
        if name == "quality":
            detail = quality_failure(clean, settings.quality)
        elif name == "language":
            language, probability = identify_language(clean, settings.language.max_chars)
            ok = language in settings.language.languages
            detail = None if ok and probability >= settings.language.min_probability else language
        if detail is not None:
            failed = name
            break

    def before_failure(name: str) -> bool:  # a filter that still sees the document
        return name in filters and (failed is None or filters.index(name) < filters.index(failed))

    return Verdict(
        failed,
        detail,
        exact_digest(clean) if before_failure("exact_dedup") else None,
        minhash_signature(clean, settings.near_dedup) if before_failure("near_dedup") else None,
    )


def _judge_chunk(texts: list[str], filters: tuple[str, ...], settings: FilterSettings):
    return [judge(text, filters, settings) for text in texts]


def _init_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def detection_probability(similarity: float, bands: int, rows: int) -> float:
    """The probability that MinHash LSH with `bands` bands of `rows` rows makes two
    documents of Jaccard `similarity` candidates: 1 - (1 - s^rows)^bands."""
    return 1.0 - (1.0 - similarity**rows) ** bands


@dataclass
class CleaningStats:
    """Counts of the cleaning stage (documents in, kept, removed by each filter) and the keys
    (ids, with `id_field`) of the first EXAMPLES documents each filter removed."""

    filters: tuple[str, ...]
    settings: FilterSettings
    documents_in: int = 0
    documents_kept: int = 0
    removed: Counter = field(default_factory=Counter)
    by_rule: Counter = field(default_factory=Counter)
    by_language: Counter = field(default_factory=Counter)
    lsh_shape: tuple[int, int] | None = None
    examples: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The manifest's `filters` section (plain JSON values)."""
        section: dict = {
            "order": list(self.filters),
            "documents_in": self.documents_in,
            "documents_kept": self.documents_kept,
        }
        for name in self.filters:
            section[name] = {"removed": self.removed[name]}
        section["examples"] = {name: list(self.examples.get(name, [])) for name in self.filters}
        if "quality" in self.filters:
            section["quality"]["by_rule"] = dict(sorted(self.by_rule.items()))
        if "language" in self.filters:
            section["language"]["by_language"] = dict(sorted(self.by_language.items()))
        if "near_dedup" in self.filters and self.lsh_shape:
            bands, rows = self.lsh_shape
            threshold = self.settings.near_dedup.threshold
            section["near_dedup"].update(
                bands=bands,
                rows=rows,
                detection_probability={
                    f"{s:.2f}": round(detection_probability(s, bands, rows), 6)
                    for s in (max(0.0, threshold - 0.1), threshold, min(1.0, threshold + 0.1))
                },
            )
        return section


def merge_records(records: list[dict]) -> dict:
    """One `filters` section from those of slices prepared apart (SLURM array tasks): counts
    summed (deduplication was within each slice: `dedup_scope: slice`)."""
    merged = {key: value for key, value in records[0].items() if not isinstance(value, (int, dict))}
    for key in ("documents_in", "documents_kept"):
        merged[key] = sum(r[key] for r in records)
    for name in records[0]["order"]:
        section = dict(records[0][name])
        section["removed"] = sum(r[name]["removed"] for r in records)
        for detail in ("by_rule", "by_language"):
            if detail in section:
                total: Counter = Counter()
                for r in records:
                    total.update(r[name][detail])
                section[detail] = dict(sorted(total.items()))
        merged[name] = section
    merged["examples"] = {
        name: [key for r in records for key in r.get("examples", {}).get(name, [])][:EXAMPLES]
        for name in records[0]["order"]
    }
    merged["dedup_scope"] = "slice"
    return merged


class Deduplicator:
    """The order-dependent decisions: exact digests and the MinHash LSH index of the
    documents kept so far."""

    def __init__(self, filters: tuple[str, ...], settings: NearDedupSettings) -> None:
        self.digests: set[int] = set()
        self.lsh = None
        if "near_dedup" in filters:
            from datasketch import MinHashLSH

            self.lsh = MinHashLSH(threshold=settings.threshold, num_perm=settings.num_perm)
        self.count = 0

    def duplicate(self, name: str, verdict: Verdict) -> bool:
        """Whether the `name` filter (exact_dedup or near_dedup) removes the document."""
        if name == "exact_dedup":
            return verdict.digest is not None and verdict.digest in self.digests
        return verdict.signature is not None and bool(self.lsh.query(verdict.signature))

    def keep(self, verdict: Verdict) -> None:
        """Remember a kept document."""
        if verdict.digest is not None:
            self.digests.add(verdict.digest)
        if self.lsh is not None and verdict.signature is not None:
            self.lsh.insert(self.count, verdict.signature, check_duplication=False)
        self.count += 1


def _verdicts(
    chunks: Iterator[list[RawDocument]],
    filters: tuple[str, ...],
    settings: FilterSettings,
    num_proc: int,
) -> Iterator[tuple[list[RawDocument], list[Verdict]]]:
    """(chunk, its verdicts) in input order; `num_proc` > 1: in spawned processes, at most
    4 tasks per process in flight."""
    if num_proc <= 1:
        for chunk in chunks:
            yield chunk, _judge_chunk([d.text for d in chunk], filters, settings)
        return
    with ProcessPoolExecutor(
        num_proc, mp_context=get_context("spawn"), initializer=_init_worker
    ) as pool:
        pending: deque = deque()
        for chunk in chunks:
            texts = [d.text for d in chunk]
            pending.append((chunk, pool.submit(_judge_chunk, texts, filters, settings)))
            if len(pending) >= 4 * num_proc:
                chunk, future = pending.popleft()
                yield chunk, future.result()
        while pending:
            chunk, future = pending.popleft()
            yield chunk, future.result()


def _chunked(
    documents: Iterable[RawDocument], size: int, max_chars: int = 1 << 20
) -> Iterator[list[RawDocument]]:
    """Runs of at most `size` consecutive documents and about `max_chars` characters (so
    the tasks in flight hold a bounded amount of text whatever the documents' length)."""
    chunk: list[RawDocument] = []
    chars = 0
    for document in documents:
        chunk.append(document)
        chars += len(document.text)
        if len(chunk) >= size or chars >= max_chars:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def clean_documents(
    documents: Iterable[RawDocument],
    filters: list[str] | tuple[str, ...],
    settings: FilterSettings,
    stats: CleaningStats,
    num_proc: int = 1,
) -> Iterator[RawDocument]:
    """The documents of `documents` that the `filters` keep, in input order (the same for
    any `num_proc`, the processes that judge them); `stats` is updated as they pass."""
    filters = tuple(filters)
    if not filters:
        yield from documents
        return
    _require_libraries(filters)
    dedup = Deduplicator(filters, settings.near_dedup)
    if dedup.lsh is not None:
        stats.lsh_shape = (dedup.lsh.b, dedup.lsh.r)
    for chunk, verdicts in _verdicts(
        _chunked(documents, CHUNK_DOCUMENTS), filters, settings, num_proc
    ):
        for document, verdict in zip(chunk, verdicts, strict=True):
            stats.documents_in += 1
            removed_by = None if verdict.empty else _first_removal(filters, verdict, dedup)
            if removed_by is None:
                if not verdict.empty:
                    dedup.keep(verdict)
                stats.documents_kept += 1
                yield document
                continue
            stats.removed[removed_by] += 1
            named = stats.examples.setdefault(removed_by, [])
            if len(named) < EXAMPLES:
                named.append(document.key)
            if removed_by == "quality":
                stats.by_rule[verdict.detail] += 1
            elif removed_by == "language":
                stats.by_language[verdict.detail] += 1


def _require_libraries(filters: tuple[str, ...]) -> None:
    """FilterSettingsError naming the filter whose library is not installed."""
    for name, module in (("near_dedup", "datasketch"), ("language", "py3langid")):
        if name in filters:
            try:
                __import__(module)
            except ImportError as error:
                raise FilterSettingsError(
                    f"filters=[{name}] needs {module}; pip install 'pretrain[corpora]'"
                ) from error


def _first_removal(filters: tuple[str, ...], verdict: Verdict, dedup: Deduplicator) -> str | None:
    """The first filter, in `filters` order, that removes a document with `verdict`."""
    for name in filters:
        if name in PER_DOCUMENT:
            if verdict.failed == name:
                return name
        elif dedup.duplicate(name, verdict):
            return name
    return verdict.failed
