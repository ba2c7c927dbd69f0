"""The per-step non-finite gradient check, side by side in one process: a kernel per parameter
(`isfinite(g).all()` for each gradient) against one foreach pass (`get_total_norm(..., inf)`),
on gradients shaped like bert_base's. Prints the median time of each and their ratio.

    .venv/bin/python benchmarks/bench_nonfinite_check.py [--model bert_base] [--repeats 30]
"""

import argparse
import statistics
import time

import torch
from torch.nn.utils import get_total_norm

from pretrain.config import compose_config
from pretrain.models.build import build_encoder


def per_parameter(grads: list[torch.Tensor]) -> bool:
    bad = torch.zeros((), dtype=torch.bool)
    for grad in grads:
        bad = bad | ~torch.isfinite(grad).all()
    return bool(bad)


def one_pass(grads: list[torch.Tensor]) -> bool:
    return bool(~torch.isfinite(get_total_norm(grads, norm_type=float("inf"))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert_base")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    from omegaconf import OmegaConf

    model_cfg = OmegaConf.to_container(compose_config([f"model={args.model}"]).model)
    encoder = build_encoder(model_cfg, 30522, 0)
    grads = [torch.randn_like(p) for p in encoder.parameters()]
    times = {"per parameter": [], "one foreach pass": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        for name, check in (("per parameter", per_parameter), ("one foreach pass", one_pass)):
            start = time.perf_counter()
            assert check(grads) is False
            times[name].append(time.perf_counter() - start)
    grads[-1][0] = float("nan")
    assert per_parameter(grads) and one_pass(grads)
    per, one = (statistics.median(times[k]) * 1e3 for k in times)
    print(f"{args.model}: {len(grads)} gradients, {sum(g.numel() for g in grads):,} values")
    print(f"per parameter    {per:8.2f} ms")
    print(f"one foreach pass {one:8.2f} ms   ratio {per / one:.2f}x")


if __name__ == "__main__":
    main()
