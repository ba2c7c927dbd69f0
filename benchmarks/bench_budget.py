"""The static prediction budget's cost in the MLM training step (issue 18), interleaved.

`bench_model.py` times its rows one after another; on a noisy machine that spread (+-10%)
hides a few percent. Here the steps alternate (ABBA order) on one model and one batch, and
each variant's median step time is printed over the boolean-mask step's:
- `boolean mask`: `hidden[masked]`, plain cross-entropy (the step before issue 18, without
  its accuracy);
- `boolean mask + metrics`: the same rows, the objective's loss and accuracy
  (`masked_classification_metrics`);
- `budget + cross-entropy`: the (batch, width) slots of the static budget, plain
  cross-entropy with ignored slots;
- `budget + metrics`: the MLM objective's own step.

    .venv/bin/python benchmarks/bench_budget.py --sizes bert_mini bert_small --rounds 30
"""

import statistics

import bench_model
import torch
from torch.nn import functional as F

from pretrain.data.masking import IGNORE_INDEX
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
)


def boolean_with_metrics(model, batch) -> torch.Tensor:
    hidden = bench_model.encode(model, batch)
    logits = model["mlm_head"](hidden[batch["masked"]])
    return masked_classification_metrics("mlm", logits, batch["labels"][batch["masked"]])[
        "mlm_loss"
    ]


def budget_cross_entropy(model, batch) -> torch.Tensor:
    hidden = bench_model.encode(model, batch)
    positions = batch["prediction_positions"]
    logits = model["mlm_head"](gather_positions(hidden, positions))
    targets = gather_targets(batch["labels"], positions)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)


STEPS = {
    "boolean mask": bench_model.our_step,
    "boolean mask + metrics": boolean_with_metrics,
    "budget + cross-entropy": budget_cross_entropy,
    "budget + metrics (the objective's step)": bench_model.our_step_static_budget,
}


def main() -> None:
    parser = bench_model.batch_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="timed steps of each variant")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 CPU, batch "
        f"{args.batch_size} x seq {args.seq_len}, {args.rounds} interleaved steps each"
    )
    for size in args.sizes:
        torch.manual_seed(args.seed)
        ours, _ = bench_model.build_models(size, args)
        batch = bench_model.make_batch(args)
        optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4)
        times = {name: [] for name in STEPS}
        for step in STEPS.values():  # warm-up
            bench_model.train_steps(ours, step, optimizer, batch, 2)
        for round_ in range(args.rounds):
            order = list(STEPS.items())
            for name, step in order if round_ % 2 else order[::-1]:
                times[name].append(bench_model.train_steps(ours, step, optimizer, batch, 1))
        base = statistics.median(times["boolean mask"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{size:11s} {name:40s} {median * 1e3:7.1f} ms  {median / base:.3f}")


if __name__ == "__main__":
    main()
