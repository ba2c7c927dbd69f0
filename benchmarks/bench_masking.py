"""Masking + collation throughput, side by side in one process: ours (`collate` +
`MaskedLMCorruption`, keyed by (seed, epoch, key)) against
`transformers.DataCollatorForLanguageModeling` (padding + 15% masking, 80/10/10), on the
same token sequences with the same tokenizer. Prints sequences/s and the ratio.

    .venv/bin/python benchmarks/bench_masking.py [--sequences 20000] [--batch-size 32] [--max-length 128]
"""

import argparse
import statistics
import time

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

from pretrain.data.reading import collate
from pretrain.objectives.mlm import MaskedLMCorruption

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer(vocab_size: int) -> BertTokenizerFast:
    vocab = {
        t: i for i, t in enumerate(SPECIALS + [f"w{i}" for i in range(vocab_size - len(SPECIALS))])
    }
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return BertTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def make_sequences(n: int, max_length: int, vocab_size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max_length // 2, max_length + 1, size=n)
    return [np.r_[2, rng.integers(5, vocab_size, size=k - 2), 3].astype(np.int64) for k in lengths]


def time_batches(fn, batches: list, repeats: int) -> float:
    """Median seconds for one pass over all batches."""
    fn(batches[0])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            fn(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sequences", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    tokenizer = make_tokenizer(args.vocab_size)
    sequences = make_sequences(args.sequences, args.max_length, args.vocab_size)
    ours_batches = [
        [
            {
                "key": f"doc_{i + j}:0",
                "input_ids": s,
                "token_type_ids": np.zeros_like(s),
                "word_starts": np.ones(len(s), bool),
                "phrases": np.zeros(len(s), np.uint8),
                "next_sentence_label": -100,
            }
            for j, s in enumerate(sequences[i : i + args.batch_size])
        ]
        for i in range(0, len(sequences), args.batch_size)
    ]
    hf_batches = [
        [{"input_ids": s.tolist()} for s in sequences[i : i + args.batch_size]]
        for i in range(0, len(sequences), args.batch_size)
    ]
    corruption = MaskedLMCorruption(
        seed=0, vocab_size=args.vocab_size, mask_token_id=4, special_ids=(0, 1, 2, 3, 4)
    )
    hf_collator = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=0.15, pad_to_multiple_of=8
    )

    def ours(batch: list[dict]) -> None:
        corruption(collate(batch, pad_id=0), epoch=0)

    ours_s = time_batches(ours, ours_batches, args.repeats)
    hf_s = time_batches(hf_collator, hf_batches, args.repeats)
    n = len(sequences)
    print(
        f"masking + collation, {n} sequences of {args.max_length // 2}-{args.max_length} tokens, batch {args.batch_size}"
    )
    print(f"{'implementation':<48}{'sequences/s':>14}")
    print(f"{'pretrain (collate + MaskedLMCorruption)':<48}{n / ours_s:>14,.0f}")
    print(f"{'transformers DataCollatorForLanguageModeling':<48}{n / hf_s:>14,.0f}")
    print(f"ratio ours/transformers: {hf_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
