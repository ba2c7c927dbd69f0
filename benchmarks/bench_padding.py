"""Padding per input format (issue 14 item 4): of the tokens the encoder computes on, how many
are real. For each format at the paper settings (SEGMENT-PAIR with short_seq_probability 0.1,
SENTENCE-PAIR, FULL-SENTENCES, DOC-SENTENCES, DOC-SENTENCES in token-budget batches
`data.tokens_per_batch`, XLNet's pair input), one epoch of the training stream (capped at
`--batches` batches) of the given corpus; a batch is padded to its sequence bucket
(`prediction_budget.sequence_widths`). Prints, per format and max_seq_length: batches,
real tokens (attention mask 1), padded tokens (the batches' input_ids elements) and the
padding fraction 1 - real / padded.

With `--speed MODEL...` (conf/model names), the MLM objective's training step (forward,
backward, AdamW) on the same DOC-SENTENCES batches of the stream, with model.unpad false
(padded) and true (dense layers on the real tokens, `pretrain/models/unpadding.py`), side by
side in this process on one thread: real tokens/s of each (median of `--repeats` passes over
`--speed-batches` batches, interleaved) and the ratio unpadded / padded.

    .venv/bin/python benchmarks/bench_padding.py [--shards data/builtin] [--lengths 128 512]
    .venv/bin/python benchmarks/bench_padding.py --speed bert_mini bert_small --lengths 128 512
"""

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

# format -> overrides (objective and model of the paper that uses it; tiny sizes)
FORMATS = {
    "segment_pair": ("objective=mlm_nsp", "model=bert_tiny", "data=segment_pair"),
    "sentence_pair": ("objective=mlm_nsp", "model=bert_tiny", "data=sentence_pair"),
    "full_sentences": ("objective=mlm", "model=roberta_tiny", "data=full_sentences"),
    "doc_sentences": ("objective=mlm", "model=roberta_tiny", "data=doc_sentences"),
    "doc_sentences+tokens_per_batch": ("objective=mlm", "model=roberta_tiny", "data=doc_sentences"),
    "xlnet_pair": ("objective=xlnet", "model=xlnet_tiny", "data=xlnet_pair"),
}


def stream(overrides: list[str], length: int, batch_size: int, shards: Path):
    """(run, stream spec, objective class) of a run with `overrides` on `shards`."""
    from pretrain.config import compose_config
    from pretrain.runtime.run import build_stream

    return build_stream(
        compose_config(
            [
                *overrides,
                f"data.shards_dir={shards}",
                f"data.max_seq_length={length}",
                f"data.batch_size={batch_size}",
                f"run_dir={tempfile.gettempdir()}/bench_padding",
            ]
        )
    )


def padding(
    name: str, length: int, batch_size: int, shards: Path, limit: int
) -> tuple[int, int, int]:
    """(batches, real tokens, padded tokens) of up to `limit` batches of format `name`."""
    from pretrain.data.stream import EpochStream

    overrides = list(FORMATS[name])
    if name.endswith("tokens_per_batch"):  # as many tokens as the fixed batches hold
        overrides += [f"data.tokens_per_batch={batch_size * length}", "data.stream_partitions=1"]
    _, spec, _ = stream(overrides, length, batch_size, shards)
    batches = real = padded = 0
    for batch in EpochStream(spec, epoch=0):
        batches += 1
        real += int(batch["attention_mask"].sum())
        padded += batch["input_ids"].numel()
        if batches == limit:
            break
    return batches, real, padded


def speed(model: str, length: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """(padding fraction, padded real tokens/s, unpadded real tokens/s) of the MLM step of
    `model` on DOC-SENTENCES batches; the two modules hold the same weights."""
    import torch

    from pretrain.data.stream import EpochStream

    overrides = ["objective=mlm", f"model={model}", "data=doc_sentences", "seed=3"]
    modules = {}
    for unpad in ("false", "true"):
        run, spec, module_class = stream(
            [*overrides, f"model.unpad={unpad}"], length, args.batch_size, args.shards.resolve()
        )
        torch.manual_seed(0)
        modules[unpad] = module_class(run, spec.vocab).train()
    modules["true"].load_state_dict(modules["false"].state_dict())
    batches = list(itertools.islice(EpochStream(spec, epoch=0), args.speed_batches))
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in modules.items()}
    seconds: dict[str, list[float]] = {k: [] for k in modules}
    for repeat in range(args.repeats + 1):  # the first pass warms up
        for unpad, module in modules.items():
            start = time.perf_counter()
            for batch in batches:
                module(batch)["loss"].backward()
                optimizers[unpad].step()
                optimizers[unpad].zero_grad(set_to_none=True)
            if repeat:
                seconds[unpad].append(time.perf_counter() - start)
    padded_speed, unpadded_speed = (real / statistics.median(seconds[k]) for k in modules)
    return 1 - real / padded, padded_speed, unpadded_speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=Path, default=Path("data/builtin"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per batch")
    parser.add_argument("--batches", type=int, default=200, help="at most this many per row")
    parser.add_argument("--speed", nargs="*", default=[], help="conf/model names to time")
    parser.add_argument("--speed-batches", type=int, default=8, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (median)")
    args = parser.parse_args()
    if args.speed:
        import torch

        torch.set_num_threads(1)
        print(
            f"{'model':<12} {'seq':>4} {'padding':>8} {'padded tok/s':>13} {'unpadded tok/s':>15} {'ratio':>6}"
        )
        for model in args.speed:
            for length in args.lengths:
                fraction, padded, unpadded = speed(model, length, args)
                print(
                    f"{model:<12} {length:>4} {fraction:>8.1%} {padded:>13.0f} "
                    f"{unpadded:>15.0f} {unpadded / padded:>6.2f}",
                    flush=True,
                )
        return
    print(f"{'format':<32} {'seq':>4} {'batches':>7} {'real':>9} {'padded':>9} {'padding':>8}")
    for length in args.lengths:
        for name in FORMATS:
            batches, real, padded = padding(
                name, length, args.batch_size, args.shards.resolve(), args.batches
            )
            print(
                f"{name:<32} {length:>4} {batches:>7} {real:>9} {padded:>9} "
                f"{1 - real / padded:>8.1%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
