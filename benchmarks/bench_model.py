"""Training throughput of our BERT encoder + MLM head vs `transformers.BertForMaskedLM`.

Side by side in one process, same config, same weights (ours exported into HF's model), same
random inputs and the same masked positions. One training step = forward + backward + AdamW
step. Ours projects to the vocabulary only at the masked positions (as the MLM objective
does); HF projects every position and ignores the rest through labels = -100. A third row
runs ours doing HF's work (all positions projected) to separate the encoder's speed from the
saving of the masked-only projection. A fourth row is the MLM objective's own step: the
masked positions gathered through the static prediction budget (`prediction_positions`,
(batch, 20) for 15% of 128 tokens, issue 18) instead of boolean-mask indexing. Each row masks
exactly round(p x seq) positions, as the objective's corruption does.

    .venv/bin/python benchmarks/bench_model.py                       # about a minute on 2 cores
    .venv/bin/python benchmarks/bench_model.py --sizes bert_base --batch-size 8 --steps 2

Prints tokens/s (tokens = batch * seq, padding included) as the median of the repeats,
warm-up steps excluded, and the ratio ours / HF.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from omegaconf import OmegaConf
from torch.nn import functional as F

from pretrain.config import compose_config
from pretrain.data.prediction_budget import prediction_positions, prediction_widths
from pretrain.export.bert import bert_to_hf_state_dict, hf_config
from pretrain.models.build import build_encoder, count_parameters
from pretrain.models.heads import MaskedLMHead
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
)

PAD_ID = 0


def batch_parser(description: str) -> argparse.ArgumentParser:
    """The flags of the benchmark batch and models: sizes (conf/model names), batch, sequence
    length, vocabulary, masking rate, seed (`bench_budget.py` adds its own)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", nargs="+", default=["bert_mini", "bert_small"], help="conf/model/*.yaml names"
    )
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument(
        "--mask-probability", type=float, default=0.15, help="fraction of positions predicted"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def parse_args() -> argparse.Namespace:
    """`batch_parser`'s flags, and the timing: steps, warm-up steps, repeats."""
    parser = batch_parser(__doc__)
    parser.add_argument("--steps", type=int, default=1, help="timed training steps per repeat")
    parser.add_argument(
        "--warmup-steps", type=int, default=1, help="untimed steps before the first repeat"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repeats; the median is reported"
    )
    return parser.parse_args()


def make_batch(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Random ids with two segments, a full attention mask, and round(mask_probability x seq)
    (at least 1) masked positions per row, with their static-budget `prediction_positions`."""
    batch, seq = args.batch_size, args.seq_len
    input_ids = torch.randint(5, args.vocab_size, (batch, seq))
    token_type_ids = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    count = max(1, round(args.mask_probability * seq))
    chosen = torch.rand(batch, seq).argsort(dim=1)[:, :count]
    masked = torch.zeros(batch, seq, dtype=torch.bool).scatter_(1, chosen, True)  # (batch, seq)
    widths = prediction_widths(args.mask_probability * seq, seq)
    labels = torch.full((batch, seq), -100)
    labels[masked] = input_ids[masked]
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "masked": masked,
        "labels": labels,
        "prediction_positions": torch.from_numpy(prediction_positions(masked.numpy(), widths)),
    }


def build_models(size: str, args: argparse.Namespace):
    """Our encoder + MLM head and an HF BertForMaskedLM holding the same weights."""
    from transformers import BertConfig, BertForMaskedLM

    model_cfg = OmegaConf.to_container(compose_config([f"model={size}"]).model, resolve=True)
    encoder = build_encoder(model_cfg, args.vocab_size, PAD_ID)
    mlm_head = MaskedLMHead(
        model_cfg["hidden_size"],
        args.vocab_size,
        model_cfg["layer_norm_eps"],
        encoder.word_embeddings,
    )
    ours = torch.nn.ModuleDict({"encoder": encoder, "mlm_head": mlm_head})
    config = hf_config(model_cfg, args.vocab_size, PAD_ID, architectures=("BertForMaskedLM",))
    hf = BertForMaskedLM(BertConfig(**config))
    hf.load_state_dict(bert_to_hf_state_dict(ours.state_dict()), strict=True)
    return ours, hf


def encode(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Our encoder's hidden states of the batch."""
    return model["encoder"](batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])


def our_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Loss of our encoder + MLM head, projecting only the masked positions."""
    hidden = encode(model, batch)
    logits = model["mlm_head"](hidden[batch["masked"]])  # (N, vocab)
    return F.cross_entropy(logits, batch["labels"][batch["masked"]])


def our_step_static_budget(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Loss of the MLM objective's step: the masked positions gathered by the static budget."""
    hidden = encode(model, batch)
    positions = batch["prediction_positions"]  # (batch, width), -1 = ignored slot
    logits = model["mlm_head"](gather_positions(hidden, positions))  # (batch * width, vocab)
    targets = gather_targets(batch["labels"], positions)
    return masked_classification_metrics("mlm", logits, targets)["mlm_loss"]


def our_step_all_positions(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Loss of ours doing HF's work: project every position, ignore labels -100."""
    hidden = encode(model, batch)
    logits = model["mlm_head"](hidden)  # (batch, seq, vocab)
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())


def hf_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Loss of transformers' BertForMaskedLM (projects every position, labels -100 ignored)."""
    return model(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
    ).loss


def train_steps(model, loss_fn: Callable, optimizer, batch, steps: int) -> float:
    """Run `steps` training steps; returns the elapsed wall time in seconds."""
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def bench_size(size: str, args: argparse.Namespace) -> list[tuple]:
    """Tokens/s (median of repeats) of ours and HF for one model size; returns table rows."""
    torch.manual_seed(args.seed)
    ours, hf = build_models(size, args)
    batch = make_batch(args)
    with torch.no_grad():  # same weights, same inputs: the eval-mode losses must agree
        ours.eval(), hf.eval()
        loss_gap = abs(our_step(ours, batch).item() - hf_step(hf, batch).item())
    ours.train(), hf.train()
    our_optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    runs = {
        "ours": (ours, our_step, our_optimizer),
        "ours_static": (ours, our_step_static_budget, our_optimizer),
        "ours_all": (ours, our_step_all_positions, our_optimizer),
        "hf": (hf, hf_step, torch.optim.AdamW(hf.parameters(), lr=1e-4)),
    }
    for model, loss_fn, optimizer in runs.values():
        train_steps(model, loss_fn, optimizer, batch, args.warmup_steps)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
        for name, (model, loss_fn, optimizer) in runs.items():
            seconds[name].append(train_steps(model, loss_fn, optimizer, batch, args.steps))
    tokens = args.steps * args.batch_size * args.seq_len
    speed = {name: tokens / statistics.median(times) for name, times in seconds.items()}
    params = count_parameters(ours) / 1e6
    attention = hf.config._attn_implementation
    return [
        (
            size,
            "ours, masked positions only",
            params,
            speed["ours"],
            speed["ours"] / speed["hf"],
            loss_gap,
        ),
        (
            size,
            "ours, static prediction budget (the objective's step)",
            params,
            speed["ours_static"],
            speed["ours_static"] / speed["hf"],
            loss_gap,
        ),
        (
            size,
            "ours, all positions",
            params,
            speed["ours_all"],
            speed["ours_all"] / speed["hf"],
            loss_gap,
        ),
        (size, f"HF BertForMaskedLM ({attention})", params, speed["hf"], 1.0, loss_gap),
    ]


def main() -> None:
    """Benchmark every size and print the table."""
    args = parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 CPU, batch {args.batch_size} x "
        f"seq {args.seq_len}, vocab {args.vocab_size}, {args.mask_probability:.0%} masked, "
        f"{args.steps} steps x median of {args.repeats} repeats ({args.warmup_steps} warm-up)"
    )
    header = f"{'model':<11} {'implementation':<53} {'params(M)':>9} {'tokens/s':>10} {'ours/HF':>8} {'|dloss|':>8}"
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        for size_name, impl, params, speed, ratio, gap in bench_size(size, args):
            print(
                f"{size_name:<11} {impl:<53} {params:>9.1f} {speed:>10.0f} {ratio:>8.2f} {gap:>8.1e}"
            )


if __name__ == "__main__":
    main()
