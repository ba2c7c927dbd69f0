"""ModernBERT's alternating attention (a global layer every 3rd, the others in a 128-token
sliding window) against every layer global: time and peak memory per token as the sequence
grows, on this machine, printed as ratios (local/global over all-global).

Each point runs in a fresh subprocess (so its peak resident memory is its own): a ModernBERT
of `--hidden` features, `--layers` layers and `--heads` heads encodes one row of N tokens,
`--repeats` times after a warm-up; the time is the median, the memory the peak RSS growth
over the process after the model was built (activations, masks, scores). Backends:
- sdpa: the (batch, seq) grid with a dense boolean mask (the CPU path): a local layer still
  computes every score, so the window saves nothing here; the ratio shows the mask's cost;
- flex: FlexAttention with a BlockMask; compiled on CUDA, where blocks outside the window
  are skipped; on a CPU its eager reference (inference only: torch has no FlexAttention
  backward there), which computes every score, so it shows no saving either.
`--train` times forward + backward (sdpa only on a CPU). `--device cuda` runs on the GPU
(bf16 weights; memory is then the peak CUDA allocation over the model's own).

    .venv/bin/python benchmarks/bench_local_attention.py [--lengths 512 1024 2048 4096 8192]
    .venv/bin/python benchmarks/bench_local_attention.py --device cuda --train --hidden 768 --heads 12
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

CHILD = r"""
import json, resource, statistics, sys, time, warnings
import torch
from pretrain.models.modernbert import ModernBertEncoder
warnings.filterwarnings("ignore")
args = json.loads(sys.argv[1])
torch.manual_seed(0)
device = torch.device(args["device"])
cuda = device.type == "cuda"
encoder = ModernBertEncoder(
    1000, 0, hidden_size=args["hidden"], num_hidden_layers=args["layers"],
    num_attention_heads=args["heads"], intermediate_size=args["hidden"] * 3 // 2,
    local_attention=128, global_attn_every_n_layers=args["every"],
    attention_backend=args["backend"], max_position_embeddings=8192,
).to(device, torch.bfloat16 if cuda else torch.float32)
ids = torch.randint(1, 1000, (args["rows"], args["length"]), device=device)
mask = torch.ones_like(ids)
def step():
    if args["train"]:
        encoder(ids, attention_mask=mask).square().mean().backward()
    else:
        with torch.no_grad():
            encoder(ids, attention_mask=mask)
base = torch.cuda.memory_allocated() // 1024 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
step()  # warm-up (and compilation)
times = []
for _ in range(args["repeats"]):
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
peak = (torch.cuda.max_memory_allocated() // 1024 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) - base
print(json.dumps({"seconds": statistics.median(times), "peak_kib": peak}))
"""


def measure(backend: str, every: int, length: int, args) -> dict:
    """One point in a fresh process: {"seconds": median step, "peak_kib": RSS growth}."""
    settings = dict(
        backend=backend,
        every=every,
        length=length,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        repeats=args.repeats,
        rows=args.rows,
        train=args.train,
        device=args.device,
    )
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(settings)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--backends", nargs="+", default=["sdpa", "flex"])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--rows", type=int, default=1, help="rows a batch (one row leaves a GPU host-bound)"
    )
    parser.add_argument("--train", action="store_true", help="forward + backward (sdpa)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    print(
        "| backend | tokens | local/global µs/token | all-global µs/token | time ratio "
        "| local/global MiB | all-global MiB | memory ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for backend in args.backends:
        for length in args.lengths:
            local = measure(backend, 3, length, args)
            glob = measure(backend, 1, length, args)
            lt, gt = (1e6 * r["seconds"] / (length * args.rows) for r in (local, glob))
            lm, gm = (r["peak_kib"] / 1024 for r in (local, glob))
            memory = f"{lm / gm:.2f}" if gm > 0 else "—"
            print(
                f"| {backend} | {length:,} | {lt:.1f} | {gt:.1f} | {lt / gt:.2f} | {lm:.0f} "
                f"| {gm:.0f} | {memory} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
