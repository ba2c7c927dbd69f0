"""The model measurements of `benchmarks/gpu_check.sh` (issue 14 item 7), side by side in one
process on the same batches: for each model and sequence length, ours (encoder + MLM head on
the static prediction budget: the MLM objective's step) against transformers'
`BertForMaskedLM` / `RobertaForMaskedLM` holding the same weights (exported by
`pretrain.export`), in bf16 autocast on CUDA: tokens/s, model TFLOP/s and MFU (the same useful
FLOPs for both, `pretrain.models.flops`), peak device memory; ours compiled (torch.compile) too; apex's
FusedAdam against torch's fused AdamW when apex is installed; and the exported model's logits
at the predicted positions against ours (max |difference|, in the run's dtype).

    .venv/bin/python benchmarks/gpu_bench.py --out gpu_check.md           # on a GPU
    .venv/bin/python benchmarks/gpu_bench.py --smoke --out /tmp/smoke.md  # tiny, CPU, fp32

Prints a markdown table and writes it to --out.
"""

import argparse
import contextlib
import copy
import statistics
import time
from pathlib import Path

import torch
from bench_model import hf_step, make_batch, our_step_static_budget
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.export.hf import family_module
from pretrain.models.build import build_encoder
from pretrain.models.flops import device_peak_tflops, embedding_size, encoder_flops, mlm_head_flops
from pretrain.models.heads import MaskedLMHead
from pretrain.objectives.predictions import gather_positions
from pretrain.runtime.kernels import apex_extension_available

PAD_ID = 1  # RoBERTa's; positions start after it in both implementations
HEADER = "| model | seq | implementation | tokens/s | TFLOP/s | MFU | peak GiB | vs HF |"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert_base", "roberta_base"])
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--tokens-per-batch", type=int, default=32768, help="batch x seq")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compile",
        choices=("both", "first", "off"),
        default="both",
        help="ours compiled too: at every model and length, at the first only, or nowhere",
    )
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile's backend")
    parser.add_argument(
        "--max-logits-gap",
        type=float,
        default=1e-3,
        help="fail (exit 1, after every row) when fp32 exported logits differ from ours by more",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.md"))
    parser.add_argument("--smoke", action="store_true", help="tiny models, CPU, fp32, 1 step")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.seq_lens, args.tokens_per_batch = ["bert_tiny", "roberta_tiny"], [32], 128
        args.steps, args.repeats, args.compile, args.device = 1, 1, "first", "cpu"
        args.compile_backend = "eager"  # TorchDynamo's capture, without inductor's C++ build
    args.vocab_size, args.mask_probability, args.seed, args.warmup_steps = 30522, 0.15, 0, 1
    return args


def build_pair(size: str, args: argparse.Namespace, device: torch.device):
    """Ours (encoder + tied MLM head) and transformers' model with the same weights."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    cfg = OmegaConf.to_container(compose_config([f"model={size}"]).model, resolve=True)
    cfg.pop("layer_norm_impl", None)
    encoder = build_encoder(cfg, args.vocab_size, PAD_ID)
    head = MaskedLMHead(
        cfg["hidden_size"], args.vocab_size, cfg["layer_norm_eps"], encoder.word_embeddings
    )
    ours = torch.nn.ModuleDict({"encoder": encoder, "mlm_head": head})
    runtime = {"vocab_size": args.vocab_size, "pad_token_id": PAD_ID}
    exported = family_module(cfg).to_hf(ours.state_dict(), {"model": cfg, "model_runtime": runtime})
    config = dict(exported.config)
    hf = AutoModelForMaskedLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config))
    hf.load_state_dict(exported.weights, strict=False)  # position_ids buffers aside
    return cfg, ours.to(device), hf.to(device)


def timed(model, step, optimizer, batch, args, device) -> tuple[float, float | None]:
    """(tokens/s, median of repeats; peak memory in GiB or None off CUDA) of training steps."""
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )

    def run(steps: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            with autocast:
                loss = step(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    run(args.warmup_steps)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = statistics.median(run(args.steps) for _ in range(args.repeats))
    tokens = args.steps * batch["input_ids"].numel()
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return tokens / seconds, peak


def logits_gap(ours, hf, batch) -> float:
    """max |ours - exported| of the MLM logits at the predicted positions, in fp32 (TF32 off):
    the same weights must give the same logits up to float rounding."""
    ours.eval(), hf.eval()
    positions = batch["prediction_positions"]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        hidden = ours["encoder"](
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        )
        mine = ours["mlm_head"](gather_positions(hidden, positions)).float()
        theirs = hf(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            attention_mask=batch["attention_mask"],
        ).logits
        theirs = gather_positions(theirs, positions).float()
    torch.backends.cuda.matmul.allow_tf32 = tf32
    ours.train(), hf.train()
    return (mine - theirs).abs().max().item()


def compiled_copy(ours: torch.nn.ModuleDict, backend: str) -> torch.nn.ModuleDict:
    """A copy of ours with its encoder and MLM head compiled in place: the step calls those
    two, never the ModuleDict, so compiling the ModuleDict would leave the step eager."""
    compiled = copy.deepcopy(ours)
    for part in compiled.values():
        part.compile(backend=backend)
    return compiled


def optimizers(model, device) -> dict[str, torch.optim.Optimizer]:
    """torch's AdamW (fused on CUDA) and, when apex is installed, apex's FusedAdam."""
    fused = {"fused": True} if device.type == "cuda" else {}
    found = {
        "torch AdamW" + (" fused" if fused else ""): torch.optim.AdamW(
            model.parameters(), 1e-4, **fused
        )
    }
    if device.type == "cuda" and apex_extension_available("amp_C"):
        from apex.optimizers import FusedAdam

        found["apex FusedAdam"] = FusedAdam(model.parameters(), lr=1e-4, adam_w_mode=True)
    return found


def bench(size: str, seq_len: int, args, device, peak_tflops, compile_too: bool) -> list[str]:
    """The table rows of one model at one sequence length."""
    torch.manual_seed(args.seed)
    cfg, ours, hf = build_pair(size, args, device)
    args.batch_size, args.seq_len = max(1, args.tokens_per_batch // seq_len), seq_len
    batch = {key: value.to(device) for key, value in make_batch(args).items()}
    if "roberta" in cfg["_target_"]:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    tokens, pairs = batch["input_ids"].numel(), batch["input_ids"].shape[0] * seq_len**2
    rows_predicted = batch["prediction_positions"].numel()
    step_flops = 3 * (
        encoder_flops(cfg, tokens, pairs)
        + mlm_head_flops(cfg["hidden_size"], embedding_size(cfg), args.vocab_size, rows_predicted)
    )
    gap = logits_gap(ours, hf, batch)  # before either trains: the same weights
    results = {}
    hf_optimizer = next(iter(optimizers(hf, device).values()))  # fused AdamW on CUDA: as ours
    hf_speed, hf_peak = timed(hf, hf_step, hf_optimizer, batch, args, device)
    for name, optimizer in optimizers(ours, device).items():
        results[f"ours, {name}"] = timed(
            ours, our_step_static_budget, optimizer, batch, args, device
        )
    if compile_too:
        compiled = compiled_copy(ours, args.compile_backend)
        optimizer = next(iter(optimizers(compiled, device).values()))
        results["ours, compiled"] = timed(
            compiled, our_step_static_budget, optimizer, batch, args, device
        )
    results[f"transformers {type(hf).__name__}"] = (hf_speed, hf_peak)
    lines = []
    for name, (speed, peak) in results.items():
        tflops = step_flops / tokens * speed / 1e12  # the step's useful FLOPs per token
        mfu = f"{tflops / peak_tflops:.1%}" if peak_tflops else "—"
        memory = f"{peak:.2f}" if peak is not None else "—"
        lines.append(
            f"| {size} | {seq_len} | {name} | {speed:,.0f} | {tflops:.3g} | {mfu} | {memory} "
            f"| {speed / hf_speed:.2f} |"
        )
    verdict = "ok" if gap <= args.max_logits_gap else f"FAIL (> {args.max_logits_gap:g})"
    lines.append(
        f"| {size} | {seq_len} | exported logits vs ours, fp32, max abs diff | {gap:.3g} "
        f"| {verdict} | | | |"
    )
    args.failed = args.failed or gap > args.max_logits_gap
    return lines


def main() -> None:
    args = parse_args()
    args.failed = False
    device = torch.device(args.device)
    precision = "bf16-mixed" if device.type == "cuda" else "32-true"
    peak, source = device_peak_tflops(precision, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [
        f"{name}, torch {torch.__version__}, {precision}, {args.tokens_per_batch} tokens a batch, "
        f"{args.steps} steps x median of {args.repeats}; peak {peak or 0:.4g} TFLOP/s ({source}); "
        f"apex {'present' if apex_extension_available('amp_C') else 'absent'}",
        "",
        HEADER,
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for size in args.models:
        for seq_len in args.seq_lens:
            first = (size, seq_len) == (args.models[0], args.seq_lens[0])
            compile_too = args.compile == "both" or (args.compile == "first" and first)
            rows = bench(size, seq_len, args, device, peak, compile_too)
            print("\n".join(rows), flush=True)  # row by row: a cut-off run keeps what it measured
            lines += rows
    table = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + "\n")
    if args.failed:
        raise SystemExit(f"exported logits differ from ours by over {args.max_logits_gap:g}")


if __name__ == "__main__":
    main()
