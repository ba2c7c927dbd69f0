"""The training stream of every objective against `transformers`' collator, side by side in
one process, one thread (issue 14 item 5). For each objective, on the same prepared corpus:

- `stream`: one epoch of the training stream, tar shards -> masked batch as tensors (reading,
  shuffling, the input format, collation, the objective's corruption), as one data-loader
  worker runs it (batch 64 x 128 unless told);
- `mask step`: collation + the objective's corruption + tensors alone (`collate`,
  `corrupt_to_tensors`), on the same epoch's sequences already formatted;
- `HF`: `transformers.DataCollatorForLanguageModeling` alone (padding to a multiple of 8,
  15% masking, 80/10/10, torch tensors) on the same sequences as pre-tokenized lists with
  their `special_tokens_mask` (HF's fastest documented input), in the same batches; and its
  whole-word mode (`whole_word_mask=True`, words from `offset_mapping`, which this version of
  transformers has in place of `DataCollatorForWholeWordMask`) as the masking baseline of the
  objectives that mask whole words (wwm, ernie, and the word runs of span and ngram).

Printed per objective: sequences/s of each, and two ratios: (a) stream / HF (target >= 1.0x)
and (b) mask step / HF (the whole-word mode for wwm, ernie, span and ngram; target >= 5x); the
plain collator's sequences/s are printed for every row. Times are CPU seconds of this
process (`time.process_time`, one thread), the best of `--repeats` passes, the measurements
interleaved, so a load that comes and goes hits them alike. xlnet_memory
runs 32 rows a batch (one memory slot a row needs 8 documents; the built-in corpus has 485);
distillation's corruption is MLM's, its row is `mlm`.

A mixture (issue 55: no speed lost): `--sources A,B` adds, after each objective's row, a row
`<objective> x2` of the same objective on the prepared corpora A and B mixed
(`data.sources`, `epochs: 1` each, so one epoch reads each once: with `data/builtin-topics`
and `data/builtin-docstrings`, the two parts of `data/builtin`, the same tokens as the
one-source row), and the ratio of its stream's sequences/s to the one source's (goal: within
5%, i.e. >= 0.95x). With `--sources` every stream pass starts with the decoded-shard caches
empty (`reading.decoded_shard`, `shard_owners`), both rows: the built-in corpus's 8 shards
otherwise stay decoded from one pass to the next, which no epoch of a real corpus sees.

    .venv/bin/python benchmarks/bench_stream_objectives.py data/builtin [--objectives mlm_nsp,ngram] \
        [--repeats 3] [--profile ngram] [--sources data/builtin-topics,data/builtin-docstrings]

`bench_stream.py --objectives ...` calls this module.
"""

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pretrain.config import compose_config  # noqa: E402
from pretrain.data import reading  # noqa: E402
from pretrain.data.reading import collate, collated_fields, corrupt_to_tensors  # noqa: E402
from pretrain.data.stream import EpochStream  # noqa: E402
from pretrain.runtime.run import build_stream  # noqa: E402


def clock() -> float:
    """CPU seconds of this process (one thread): what each pass costs a core, less
    disturbed than wall time by other processes on a shared machine."""
    return time.process_time()


@dataclass(frozen=True)
class Case:
    label: str
    overrides: tuple[str, ...]
    # masking baseline: "plain" (DataCollatorForLanguageModeling), "whole_word" (its
    # whole-word mode) or "plm" (DataCollatorForPermutationLanguageModeling, XLNet's)
    baseline: str = "plain"
    batch_size: int | None = None  # instead of --batch-size (a format that needs fewer rows)


PAIR = ("data=segment_pair",)
SINGLE = ("data=full_sentences",)
CASES: dict[str, Case] = {
    "mlm_nsp": Case("MLM + NSP (BERT)", ("objective=mlm_nsp", "model=bert_tiny", *PAIR)),
    "mlm": Case("MLM, FULL-SENTENCES", ("objective=mlm", "model=roberta_tiny", *SINGLE)),
    "wwm": Case("whole-word + NSP", ("objective=wwm", "model=bert_tiny", *PAIR), "whole_word"),
    "ernie": Case("ERNIE units + NSP", ("objective=ernie", "model=bert_tiny", *PAIR), "whole_word"),
    # spans and n-grams are runs of whole words: their masking against HF's whole-word mode
    "span": Case(
        "SpanBERT span + SBO", ("objective=span", "model=bert_tiny", *SINGLE), "whole_word"
    ),
    "ngram": Case(
        "ALBERT n-gram + SOP",
        ("objective=ngram", "objective.pair_task=sop", "model=albert_tiny", *PAIR),
        "whole_word",
    ),
    "structbert": Case("StructBERT", ("objective=structbert", "model=bert_tiny", *PAIR)),
    "electra": Case(
        "ELECTRA (MLM, 100% [MASK])", ("objective=electra", "model=electra_tiny", *PAIR)
    ),
    "bart": Case("BART infilling + permutation", ("objective=bart", "model=bart_tiny", *SINGLE)),
    "mass": Case("MASS fragment", ("objective=mass", "model=bart_tiny", *SINGLE)),
    "xlnet": Case(
        "XLNet, xlnet_pair",
        ("objective=xlnet", "model=xlnet_tiny", *SINGLE, "data.format=xlnet_pair"),
        "plm",
    ),
    "xlnet_memory": Case(  # one memory slot per row needs 8 documents: the built-in corpus
        "XLNet, xlnet_memory",  # (485 documents) has enough for 32 rows, not 64
        ("objective=xlnet", "model=xlnet_tiny", "data=xlnet_memory"),
        "plm",
        batch_size=32,
    ),
    "gpt": Case("GPT causal LM", ("objective=causal_lm", "model=gpt_tiny", *SINGLE)),
}
BASELINES = {"plain": "", "whole_word": " (HF like: whole-word mode)", "plm": " (HF like: PLM)"}
# distillation's corruption is MaskedLMCorruption on full_sentences: the `mlm` row.
NOT_SEPARATE = {"distillation": "mlm"}


def sources_override(sources: list[str]) -> tuple[str, ...]:
    """`data.sources` of the corpora `sources` (s0, s1, ...), one epoch of each."""
    if not sources:
        return ()
    listed = ", ".join(
        f"{{name: s{i}, shards_dir: '{Path(d).resolve()}', epochs: 1}}"
        for i, d in enumerate(sources)
    )
    return (f"data.sources=[{listed}]",)


def build_spec(
    shards_dir: str, case: Case, batch_size: int, max_seq_length: int, sources: list[str] = ()
):
    """The StreamSpec a training run of `case` on `shards_dir` (or on the mixture of
    `sources`) has (one rank, no workers)."""
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose_config(
            [
                *case.overrides,
                f"data.shards_dir={Path(shards_dir).resolve()}",
                "data.holdout_shards=0",
                f"data.batch_size={batch_size}",
                f"data.max_seq_length={max_seq_length}",
                "data.num_workers=0",
                "logger=csv",
                "trainer=cpu",
                f"run_dir={run_dir}",
                *sources_override(sources),
            ]
        )
        _, spec, _ = build_stream(cfg)
    return spec


def formatted_batches(spec) -> list[tuple[list[dict], dict]]:
    """The epoch's batches as the stream collates them: (sequences, extras), extras being
    what the stream adds to the collated batch before the corruption (XLNet memory flags in
    some versions). Recorded from one pass of the stream, so whatever the format."""
    import pretrain.data.stream as stream

    batches: list[tuple[list[dict], dict]] = []
    real_collate, real_corrupt = stream.collate, stream.corrupt_to_tensors
    collated: dict = {}

    def recording_collate(sequences, *args, **kwargs):
        batch = real_collate(sequences, *args, **kwargs)
        batches.append((list(sequences), {}))
        collated.clear()
        collated.update(batch)
        return batch

    def recording_corrupt(batch, *args, **kwargs):
        batches[-1][1].update({k: v for k, v in batch.items() if k not in collated})
        return real_corrupt(batch, *args, **kwargs)

    stream.collate, stream.corrupt_to_tensors = recording_collate, recording_corrupt
    try:
        for _ in EpochStream(spec, 0):
            pass
    finally:
        stream.collate, stream.corrupt_to_tensors = real_collate, real_corrupt
    return batches


def hf_tokenizer(tokenizer_dir: str):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(tokenizer_dir)


def hf_examples(batches, special_ids, whole_word: bool) -> list[list[dict]]:
    """Each batch's sequences as HF pre-tokenized examples (lists), with special_tokens_mask
    and, for the whole-word mode, character offsets that join a word's tokens."""
    out = []
    for sequences, _ in batches:
        examples = []
        for s in sequences:
            ids = s["input_ids"].tolist()
            example = {
                "input_ids": ids,
                "special_tokens_mask": np.isin(s["input_ids"], special_ids).astype(int).tolist(),
            }
            if whole_word:  # a token not starting a word begins where the previous one ends
                starts = np.cumsum(np.where(s["word_starts"], 2, 1)) * 4
                ends = starts + 4
                ends[:-1] = np.where(s["word_starts"][1:], ends[:-1], starts[1:])
                example["offset_mapping"] = np.stack([starts, ends], axis=1).tolist()
            examples.append(example)
        out.append(examples)
    return out


def hf_collator(tokenizer, whole_word: bool):
    from transformers import DataCollatorForLanguageModeling

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whole-word mode: "random replacement not supported"
        return DataCollatorForLanguageModeling(
            tokenizer, mlm_probability=0.15, pad_to_multiple_of=8, whole_word_mask=whole_word
        )


def plm_collator(tokenizer):
    """transformers' XLNet collator (spans of up to 5 tokens, 1/6 predicted: XLNet's own
    settings; perm_mask, target_mapping, labels), the sequences padded to a multiple of 8 first
    (it pads to the longest, and needs an even length)."""
    from transformers import DataCollatorForPermutationLanguageModeling

    collator = DataCollatorForPermutationLanguageModeling(tokenizer, plm_probability=1 / 6)

    def collate_examples(examples: list[dict]) -> dict:
        width = -(-max(len(e["input_ids"]) for e in examples) // 8) * 8
        pad = tokenizer.pad_token_id
        return collator([e["input_ids"] + [pad] * (width - len(e["input_ids"])) for e in examples])

    return collate_examples


def padded_offsets(collator):
    """The whole-word collator, with `offset_mapping` padded first (the tokenizer's `pad`
    leaves it ragged)."""

    def collate_examples(examples: list[dict]) -> dict:
        width = -(-max(len(e["input_ids"]) for e in examples) // 8) * 8
        padded = []
        for e in examples:
            pad = width - len(e["offset_mapping"])
            padded.append(e | {"offset_mapping": e["offset_mapping"] + [[0, 0]] * pad})
        return collator(padded)

    return collate_examples


def time_stream(spec, cold: bool = False) -> tuple[float, int]:
    """CPU seconds of one epoch of `spec`'s stream and its rows; `cold`: the process's
    decoded-shard caches emptied first (untimed), as an epoch of a corpus of many shards
    finds them."""
    if cold:
        reading.decoded_shard.cache_clear()
        reading.shard_owners.cache_clear()
    start = clock()
    rows = 0
    for batch in EpochStream(spec, 0):
        rows += batch["input_ids"].shape[0]
    return clock() - start, rows


def time_mask_step(spec, batches) -> float:
    start = clock()
    for sequences, extras in batches:
        batch = collate(sequences, spec.vocab.pad, spec.max_seq_length, collated_fields(spec))
        batch |= extras
        corrupt_to_tensors(batch, spec, 0)
    return clock() - start


def time_hf(collate_examples, examples) -> float:
    start = clock()
    for batch in examples:
        collate_examples(batch)
    return clock() - start


@dataclass
class Row:
    name: str  # the objective (CASES)
    stream: float  # sequences/s
    mask_step: float
    hf: float
    hf_like: float | None  # the objective's own HF baseline (whole-word mode, PLM), if any
    sequences: int
    sources: int = 1  # corpora mixed (--sources)

    @property
    def ratio_stream(self) -> float:
        return self.stream / self.hf

    @property
    def ratio_mask(self) -> float:
        return self.mask_step / (self.hf_like or self.hf)


def measure(shards_dir: str, name: str, args, tokenizer, sources: list[str] = ()) -> Row:
    case = CASES[name]
    size = case.batch_size or args.batch_size
    spec = build_spec(shards_dir, case, size, args.max_seq_length, sources)
    batches = formatted_batches(spec)
    sequences = sum(len(s) for s, _ in batches)
    special = np.array(spec.vocab.special_ids)
    plain = hf_collator(tokenizer, whole_word=False)
    plain_examples = hf_examples(batches, special, whole_word=False)
    whole = ww_examples = None
    if case.baseline == "whole_word":
        whole = padded_offsets(hf_collator(tokenizer, whole_word=True))
        ww_examples = hf_examples(batches, special, whole_word=True)
    elif case.baseline == "plm":
        whole, ww_examples = plm_collator(tokenizer), plain_examples
    time_mask_step(spec, batches[:2])  # warm-up
    time_hf(plain, plain_examples[:2])
    best = {"stream": np.inf, "mask": np.inf, "hf": np.inf, "ww": np.inf}
    rows = 0
    for _ in range(args.repeats):
        seconds, rows = time_stream(spec, cold=bool(args.sources))
        best["stream"] = min(best["stream"], seconds)
        best["mask"] = min(best["mask"], time_mask_step(spec, batches))
        best["hf"] = min(best["hf"], time_hf(plain, plain_examples))
        if whole is not None:
            best["ww"] = min(best["ww"], time_hf(whole, ww_examples))
    if rows != sequences:
        raise RuntimeError(f"{name}: the stream gave {rows} sequences, the format {sequences}")
    return Row(
        name,
        sequences / best["stream"],
        sequences / best["mask"],
        sequences / best["hf"],
        sequences / best["ww"] if whole is not None else None,
        sequences,
        max(1, len(sources)),
    )


def profile(shards_dir: str, name: str, args, lines: int = 25) -> None:
    """cProfile of one epoch of `name`'s stream, by cumulative and by own time."""
    case = CASES[name]
    spec = build_spec(shards_dir, case, case.batch_size or args.batch_size, args.max_seq_length)
    profiler = cProfile.Profile()
    profiler.runcall(time_stream, spec)
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(lines)


def print_table(rows: list[Row], file=sys.stdout) -> None:
    print(
        f"{'objective':<14}{'seqs':>6}{'stream/s':>10}{'mask/s':>10}{'HF/s':>9}{'HF like/s':>10}"
        f"{'(a) stream/HF':>15}{'(b) mask/HF':>13}  what",
        file=file,
    )
    for r in rows:
        ww = f"{r.hf_like:>10,.0f}" if r.hf_like else f"{'-':>10}"
        a = f"{r.ratio_stream:.2f}x" + (" " if r.ratio_stream >= 1.0 else "*")
        b = f"{r.ratio_mask:.1f}x" + (" " if r.ratio_mask >= 5.0 else "*")
        label = r.name if r.sources == 1 else f"{r.name} x{r.sources}"
        print(
            f"{label:<14}{r.sequences:>6}{r.stream:>10,.0f}{r.mask_step:>10,.0f}{r.hf:>9,.0f}"
            f"{ww}{a:>15}{b:>13}  {CASES[r.name].label}{BASELINES[CASES[r.name].baseline]}",
            file=file,
        )
    print(
        "(a) target >= 1.0x, (b) target >= 5x (against 'HF like' where there is one, else the "
        "plain collator); * = below target. "
        + ", ".join(f"{k}: as {v}" for k, v in NOT_SEPARATE.items()),
        file=file,
    )
    one = {r.name: r for r in rows if r.sources == 1}
    for r in rows:
        if r.sources > 1 and r.name in one:
            ratio = r.stream / one[r.name].stream
            print(
                f"{r.name}: {r.sources} sources / 1 source, stream sequences/s: {ratio:.3f}x"
                + (" " if ratio >= 0.95 else "*")
                + " (goal >= 0.95x)",
                file=file,
            )


def run(shards_dir: str, names: list[str], args) -> list[Row]:
    torch.set_num_threads(1)
    tokenizer = hf_tokenizer(str(build_spec_tokenizer(shards_dir)))
    rows = []
    for name in names:
        rows.append(measure(shards_dir, name, args, tokenizer))
        if args.sources:
            sources = args.sources.split(",")
            rows.append(measure(shards_dir, name, args, tokenizer, sources))
        print(f"  measured {name}", file=sys.stderr, flush=True)
    return rows


def build_spec_tokenizer(shards_dir: str) -> Path:
    from pretrain.data.shard_format import load_manifest

    return load_manifest(shards_dir).tokenizer_dir


def parse_names(text: str) -> list[str]:
    if text == "all":
        return list(CASES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    names = [NOT_SEPARATE.get(n, n) for n in names]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown objective(s) {unknown}; choose from {', '.join(CASES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--objectives",
        default="all",
        help=f"comma-separated, or all (default): {', '.join(CASES)}",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument(
        "--sources",
        default="",
        help="comma-separated prepared corpora (one tokenizer): each objective on their mix too",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards_dir")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many passes")
    add_arguments(parser)
    parser.add_argument("--profile", help="print a cProfile of this objective's stream instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.profile:
        profile(args.shards_dir, parse_names(args.profile)[0], args)
        return
    print_table(run(args.shards_dir, parse_names(args.objectives), args))


if __name__ == "__main__":
    main()
