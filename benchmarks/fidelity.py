"""Paper fidelity: for each objective, the statistics its paper states against the same
statistics measured on real batches of the project's stream, one command:

    .venv/bin/python benchmarks/fidelity.py [--batches 40] [--only mlm,span] [--no-write] \
        [--english SHARDS_DIR]

Batches come from the stream (`pretrain.runtime.run.build_stream`: shards, partitions, input format,
collation; epoch 0), 4,096 tokens each: 32 sequences of 128 tokens, or 8 of 512 for ALBERT's
n-grams and SpanBERT's spans (their papers' length; fewer units cut by a segment's end).
Corpora (`fidelity_corpora.py`, prepared once into data/fidelity/): the built-in English
corpus with phrase and entity annotations, and for Chinese whole-word masking the Chinese
prose of the tests with the seed texts of ../shared/seeds when present (jieba words).
Masking units are read from the corruption's own `select` on the collated batch, splits from
the corrupted batch. The table is printed and written into
benchmarks/RESULTS.md between the `fidelity` markers. About a minute on 2 cores once the
corpora exist (preparing them takes about another).
"""

import argparse
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np
from fidelity_corpora import chinese_corpus, english_corpus

from pretrain.config import compose_config
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import (
    ENTITY_START,
    IGNORE_INDEX,
    INSIDE_SPAN,
    PHRASE_START,
    word_start_flags,
)
from pretrain.data.reading import MARKS_KEY, collate
from pretrain.data.stream import EpochStream, rank_sequences
from pretrain.runtime.run import build_stream

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- fidelity:begin -->", "<!-- fidelity:end -->"
Row = tuple[str, str, str, str]  # objective, statistic, paper, measured


def stream_spec(shards: Path, *overrides: str, length: int = 128):
    """The stream of a run on `shards` with `overrides`: sequences of `length` tokens, 4,096
    tokens a batch (32 sequences of 128)."""
    sizes = [f"data.max_seq_length={length}", f"data.batch_size={4096 // length}"]
    return build_stream(compose_config([f"data.shards_dir={shards}", *sizes, *overrides]))[1]


def collated(spec, batches: int) -> Iterator[dict]:
    """The first `batches` full collated (uncorrupted) batches of epoch 0's global order."""
    sequences = rank_sequences(spec, 0)
    for _ in range(batches):
        chunk = list(islice(sequences, spec.batch_size))
        if len(chunk) < spec.batch_size:
            return
        batch = collate(chunk, spec.vocab.pad)
        batch.pop(MARKS_KEY, None)
        yield batch


def copied(batch: dict) -> dict:
    return {k: v.copy() if isinstance(v, np.ndarray | list) else v for k, v in batch.items()}


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


class Counts(defaultdict):
    """Named sums over batches."""

    def __init__(self) -> None:
        super().__init__(float)

    def share(self, part: str, whole: str) -> float:
        return self[part] / max(self[whole], 1)


def masked_lm(spec, batches: int, span_check: bool = False) -> tuple[Counts, np.ndarray]:
    """Sums over batches of an MLM-family corruption: candidates, selected, the 80/10/10
    outcome of predicted tokens, units masked in part or with mixed decisions, annotated
    spans (phrases, entities) of two or more words touched and masked in part; and every
    masked unit's length in words."""
    corruption, counts, unit_words = spec.corruption, Counts(), []
    for batch in collated(spec, batches):
        ids = batch["input_ids"].copy()
        candidates = batch["attention_mask"].astype(bool) & ~np.isin(ids, spec.vocab.special_ids)
        selected, unit_start = corruption.select(
            copied(batch), candidates, key_hashes(batch["keys"]), 0
        )
        out = corruption(copied(batch), 0)
        predicted = out["labels"] != IGNORE_INDEX
        counts["candidates"] += candidates.sum()
        as_mask = count_split(counts, predicted, out["input_ids"], ids, spec.vocab.mask)
        counts["nsp_random"] += (batch["next_sentence_label"] == 1).sum()
        counts["sequences"] += len(ids)
        if unit_start is not None:
            unit = np.arange(len(ids))[:, None] * ids.shape[1] + unit_start  # (batch, seq)
            taken = np.bincount(unit[predicted], minlength=unit.size)
            masks = np.bincount(unit[as_mask], minlength=unit.size)
            words = word_start_flags(batch["word_starts"], candidates)
            in_words = np.bincount(unit[predicted], words[predicted], minlength=unit.size)
            counts["units"] += (taken > 0).sum()
            counts["mixed_units"] += ((masks > 0) & (masks < taken)).sum()
            counts["cut_units"] += cut_inside_words(predicted, unit, words, candidates)
            unit_words.append(in_words[taken > 0])
        if span_check:
            annotated_span_counts(batch, predicted, counts)
    return counts, np.concatenate(unit_words) if unit_words else np.zeros(0)


def cut_inside_words(predicted, unit, words, candidates) -> int:
    """Masked units that start or end inside a word: the unit's first token does not start a
    word, or the token after its last one continues the word outside the unit. All (batch,
    seq): predicted, words (word starts) and candidates bool, unit (a unit id) int."""
    edge = np.zeros((len(unit), 1), bool)
    same_as_next = predicted[:, 1:] & (unit[:, 1:] == unit[:, :-1])  # (batch, seq - 1)
    first = predicted & ~np.concatenate([edge, same_as_next], axis=1)
    last = predicted & ~np.concatenate([same_as_next, edge], axis=1)
    continues = np.concatenate([candidates[:, 1:] & ~words[:, 1:], edge], axis=1)
    cut = (first & ~words) | (last & continues)
    return int((np.bincount(unit[cut], minlength=unit.size) > 0).sum())


def count_split(counts: Counts, predicted, corrupted, original, mask_id: int) -> np.ndarray:
    """Add the predicted tokens and how they were corrupted ([MASK], random, unchanged) to
    `counts`; returns those turned into [MASK], (batch, seq) bool."""
    as_mask = predicted & (corrupted == mask_id)
    counts["selected"] += predicted.sum()
    counts["mask"] += as_mask.sum()
    counts["same"] += (predicted & (corrupted == original)).sum()
    counts["random"] += (predicted & ~as_mask & (corrupted != original)).sum()
    return as_mask


def annotated_span_counts(batch: dict, predicted: np.ndarray, counts: Counts) -> None:
    """Annotated spans of two or more words: touched (a token predicted) and masked in part."""
    for row, (phrases, starts) in enumerate(
        zip(batch["phrases"], batch["word_starts"], strict=True)
    ):
        begins = np.flatnonzero((phrases == PHRASE_START) | (phrases == ENTITY_START))
        for first in begins:
            end = first + 1
            while end < len(phrases) and phrases[end] == INSIDE_SPAN:
                end += 1
            if not starts[first + 1 : end].any():
                continue
            kind = "phrases" if phrases[first] == PHRASE_START else "entities"
            hit = predicted[row, first:end]
            counts[f"{kind}_spans"] += 1
            counts[f"{kind}_touched"] += hit.any()
            counts[f"{kind}_partial"] += hit.any() and not hit.all()


def split_rows(name: str, counts: Counts, paper: str = "80 / 10 / 10") -> list[Row]:
    measured = " / ".join(percent(counts.share(k, "selected")) for k in ("mask", "random", "same"))
    return [(name, "[MASK] / random / unchanged", paper, measured)]


def mlm_rows(name: str, counts: Counts) -> list[Row]:
    """The masked share of candidate tokens and the 80/10/10 split."""
    rate = percent(counts.share("selected", "candidates"))
    return [(name, "masked tokens", "15%", rate), *split_rows(name, counts)]


def unit_rows(name: str, unit: str, counts: Counts) -> list[Row]:
    return [
        (name, f"{unit} cut inside a word", "0%", percent(counts.share("cut_units", "units"))),
        (name, f"{unit} with mixed 80/10/10", "0%", percent(counts.share("mixed_units", "units"))),
    ]


def run_mlm(english: Path, chinese: Path, batches: int) -> list[Row]:
    spec = stream_spec(english, "objective=mlm", "data=full_sentences")
    rows = mlm_rows("MLM (RoBERTa)", masked_lm(spec, batches)[0])
    counts, _ = masked_lm(stream_spec(english, "objective=mlm_nsp", "data=segment_pair"), batches)
    nsp = percent(counts.share("nsp_random", "sequences"))
    rows += [*mlm_rows("BERT", counts), ("BERT", "B from another document (NSP)", "50%", nsp)]
    teacher = "objective.teacher=unused"  # the corruption is the student's MLM
    spec = stream_spec(english, "objective=distillation", "data=full_sentences", teacher)
    return rows + mlm_rows("DistilBERT", masked_lm(spec, batches)[0])


def run_wwm(english: Path, chinese: Path, batches: int) -> list[Row]:
    rows = []
    for name, shards in (("BERT-wwm", english), ("Chinese BERT-wwm", chinese)):
        spec = stream_spec(shards, "objective=wwm", "data=segment_pair")
        counts, _ = masked_lm(spec, batches)
        rows += mlm_rows(name, counts) + unit_rows(name, "words", counts)
    return rows


def run_ngram(english: Path, chinese: Path, batches: int) -> list[Row]:
    name = "ALBERT n-gram"
    overrides = ("objective=ngram", "objective.pair_task=sop", "data=segment_pair")
    spec = stream_spec(english, *overrides, length=512)  # ALBERT's sequences
    counts, words = masked_lm(spec, batches)
    shares = " / ".join(percent(np.mean(words == n)) for n in (1, 2, 3))
    swapped = percent(counts.share("nsp_random", "sequences"))
    return [
        *mlm_rows(name, counts),
        (name, "n = 1 / 2 / 3 words", "54.5 / 27.3 / 18.2% (draws)", shares),
        (name, "mean n-gram (words)", "1.64 (draws)", f"{words.mean():.2f}"),
        (name, "swapped segments (SOP)", "50%", swapped),
        *unit_rows(name, "n-grams", counts),
    ]


def run_span(english: Path, chinese: Path, batches: int) -> list[Row]:
    name = "SpanBERT"
    spec = stream_spec(english, "objective=span", "data=full_sentences", length=512)
    counts, words = masked_lm(spec, batches)
    return [
        *mlm_rows(name, counts),
        (name, "mean span (words)", "3.8 (sampler)", f"{words.mean():.2f}"),
        (name, "spans of 10 words", "3.0% (sampler)", percent(np.mean(words == 10))),
        (name, "spans over 10 words", "0%", percent(np.mean(words > 10))),
        *unit_rows(name, "spans", counts),
    ]


def run_ernie(english: Path, chinese: Path, batches: int) -> list[Row]:
    rows = []
    for level in ("basic", "phrase", "entity"):
        name = f"ERNIE ({level} level)"
        overrides = ("objective=ernie", "data=segment_pair", f"objective.masking_level={level}")
        counts, words = masked_lm(stream_spec(english, *overrides), batches, span_check=True)
        rows += mlm_rows(name, counts)[:1] if level != "entity" else mlm_rows(name, counts)
        for kind, unit_from in (("phrases", "phrase"), ("entities", "entity")):
            paper = "0%" if level in ("entity", unit_from) else "(not units)"
            share = percent(counts.share(f"{kind}_partial", f"{kind}_touched"))
            touched = f"{share} of {int(counts[f'{kind}_touched'])}"
            rows.append((name, f"{kind} of 2+ words masked in part", paper, touched))
    sizes = f"{words.mean():.2f}; {percent(np.mean(words >= 3))}"
    rows.append((name, "mean unit (words); units of 3+ words", "(not stated)", sizes))
    return rows + unit_rows(name, "units", counts)


def run_structbert(english: Path, chinese: Path, batches: int) -> list[Row]:
    import torch

    name = "StructBERT"
    spec = stream_spec(english, "objective=structbert", "data=segment_pair")
    specials = torch.tensor(spec.vocab.special_ids)
    free = shuffled = 0
    labels = []
    for batch in islice(EpochStream(spec, 0), batches):
        unmasked = batch["attention_mask"].bool() & (batch["labels"] == IGNORE_INDEX)
        free += int((unmasked & ~torch.isin(batch["input_ids"], specials)).sum())
        shuffled += int((batch["shuffle_labels"] != IGNORE_INDEX).sum())
        labels.append(batch["next_sentence_label"].numpy())
    thirds = " / ".join(percent(np.mean(np.concatenate(labels) == k)) for k in (0, 1, 2))
    return [
        *mlm_rows(name, masked_lm(spec, batches)[0]),
        (name, "unmasked tokens in shuffled trigrams", "5%", percent(shuffled / max(free, 1))),
        (name, "next / previous / random segment", "33 / 33 / 33%", thirds),
    ]


def run_electra(english: Path, chinese: Path, batches: int) -> list[Row]:
    counts, _ = masked_lm(stream_spec(english, "objective=electra", "data=segment_pair"), batches)
    name = "ELECTRA (generator input)"
    rate = percent(counts.share("selected", "candidates"))
    return [(name, "masked tokens", "15%", rate), *split_rows(name, counts, "100 / 0 / 0")]


def run_xlnet(english: Path, chinese: Path, batches: int) -> list[Row]:
    rows, model = [], ["objective=xlnet", "model=xlnet_tiny", "data=full_sentences"]
    for data in ("xlnet_pair", "xlnet_memory"):
        spec = stream_spec(english, *model, f"data.format={data}")
        stream = list(islice(EpochStream(spec, 0), batches))
        targets = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in stream)
        real = sum(int(b["attention_mask"].sum()) - 3 * len(b["keys"]) for b in stream)
        rows.append((f"XLNet ({data})", "targets (1/K, K = 6)", "16.7%", percent(targets / real)))
    leaked, seen = memory_leakage(stream, spec)
    leakage = f"{percent(leaked / max(seen, 1))} of {seen}"
    return [*rows, ("XLNet (xlnet_memory)", "next segment's targets the memory saw", "0%", leakage)]


def memory_leakage(batches: list[dict], spec) -> tuple[int, int]:
    """(targets of each next segment that a memory-producing position of the segment before
    could see, those targets): the next segment's text continues this one's after its reuse
    part, token by token."""
    reuse = spec.corruption.reuse_len or spec.max_seq_length // 2
    leaked = total = 0
    for before, after in zip(batches, batches[1:], strict=False):
        mask = before["perm_mask"].numpy()  # (batch, seq, seq): True = may not attend
        for row in np.flatnonzero(~after["new_document"].numpy()):
            old = text_positions(before, row, spec)
            old = old[old >= reuse]
            new = text_positions(after, row, spec)
            n = min(len(old), len(new))
            predicted = (after["labels"][row, new[:n]] != IGNORE_INDEX).numpy()
            visible = ~mask[row, :reuse][:, old[:n][predicted]]  # (reuse, targets)
            leaked += int(visible.any(axis=0).sum())
            total += int(predicted.sum())
    return leaked, total


def text_positions(batch: dict, row: int, spec) -> np.ndarray:
    ids = batch["input_ids"][row].numpy()
    real = batch["attention_mask"][row].numpy().astype(bool)
    return np.flatnonzero(real & (ids != spec.vocab.sep) & (ids != spec.vocab.cls))


def run_bart(english: Path, chinese: Path, batches: int) -> list[Row]:
    counts = Counts()
    spec = stream_spec(english, "objective=bart", "model=bart_tiny", "data=full_sentences")
    for batch in islice(EpochStream(spec, 0), batches):
        original = (batch["labels"] != IGNORE_INDEX).sum(1).numpy()
        encoder = batch["attention_mask"].sum(1).numpy()
        masks = (batch["input_ids"] == spec.vocab.mask).sum(1).numpy()  # one per span
        counts["removed"] += (original - (encoder - masks)).sum()
        counts["body"] += (original - 2).sum()
        counts["spans"] += masks.sum()
    mean = f"{counts.share('removed', 'spans'):.2f}"
    return [
        ("BART", "infilled tokens", "30%", percent(counts.share("removed", "body"))),
        ("BART", "mean span (tokens, 0-length incl.)", "3.0 (Poisson)", mean),
    ]


def run_mass(english: Path, chinese: Path, batches: int) -> list[Row]:
    counts = Counts()
    spec = stream_spec(english, "objective=mass", "model=bart_tiny", "data=full_sentences")
    for batch in islice(EpochStream(spec, 0), batches):
        predicted = (batch["labels"] != IGNORE_INDEX).numpy()
        labels = batch["labels"].numpy()
        count_split(counts, predicted, batch["input_ids"].numpy(), labels, spec.vocab.mask)
        counts["body"] += (batch["attention_mask"].sum(1).numpy() - 2).sum()
        counts["rows"] += len(predicted)
        for where in map(np.flatnonzero, predicted):
            counts["contiguous"] += len(where) == 0 or where[-1] - where[0] + 1 == len(where)
    return [
        ("MASS", "fragment of the sequence", "50%", percent(counts.share("selected", "body"))),
        ("MASS", "contiguous fragments", "100%", percent(counts.share("contiguous", "rows"))),
        *split_rows("MASS (encoder fragment)", counts),
    ]


OBJECTIVES: dict[str, Callable[[Path, Path, int], list[Row]]] = {
    "mlm": run_mlm,
    "wwm": run_wwm,
    "ngram": run_ngram,
    "span": run_span,
    "ernie": run_ernie,
    "structbert": run_structbert,
    "electra": run_electra,
    "xlnet": run_xlnet,
    "bart": run_bart,
    "mass": run_mass,
}


def table(rows: list[Row]) -> str:
    lines = ["| objective | statistic | paper | measured |", "| --- | --- | --- | --- |"]
    return "\n".join(lines + [f"| {' | '.join(row)} |" for row in rows])


def write_results(text: str) -> None:
    path = ROOT / "benchmarks" / "RESULTS.md"
    body = path.read_text(encoding="utf-8")
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in body:
        body = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, body, flags=re.S)
    else:
        title = "## Paper fidelity (`benchmarks/fidelity.py`)"
        body = f"{body.rstrip()}\n\n{title}\n\n{block}\n"
    path.write_text(body, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=40, help="batches of 32 per objective")
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(OBJECTIVES)}")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--english", type=Path, help="an annotated English shards dir (default: data/fidelity's)"
    )
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name] or list(OBJECTIVES)
    unknown = sorted(set(chosen) - set(OBJECTIVES))
    if unknown:
        sys.exit(f"--only: unknown {', '.join(unknown)} (choose from {', '.join(OBJECTIVES)})")
    english = args.english or english_corpus()
    chinese = chinese_corpus() if "wwm" in chosen else None
    rows = []
    for name in chosen:
        start = time.perf_counter()
        rows += OBJECTIVES[name](english, chinese, args.batches)
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if not args.no_write and not args.only:
        write_results(text)


if __name__ == "__main__":
    main()
