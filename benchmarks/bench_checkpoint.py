"""How long the training loop is blocked per checkpoint save: the run's synchronous atomic
write (`AtomicCheckpointIO`: torch.save, fsync, rename) against `trainer.async_checkpoint`'s
background writer (`BackgroundCheckpointIO`: the loop waits only for the copy of the state;
the write itself follows on a thread). The state is a model's weights and its AdamW moments,
as a run's checkpoint holds them. Prints the median blocked time of each, and the background
write's own time (which the loop no longer waits for).

    .venv/bin/python benchmarks/bench_checkpoint.py [--model bert_small] [--repeats 5]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from pretrain.checkpoint.atomic import AtomicCheckpointIO
from pretrain.checkpoint.background import BackgroundCheckpointIO
from pretrain.config import compose_config
from pretrain.models.build import build_encoder


def training_state(model_name: str) -> dict:
    """A checkpoint's state for `model_name` (conf/model): weights, AdamW state after a step."""
    model_cfg = OmegaConf.to_container(compose_config([f"model={model_name}"]).model)
    encoder = build_encoder(model_cfg, 30522, 0)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-4)
    for parameter in encoder.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    return {
        "state_dict": encoder.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "global_step": 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert_small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work-dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    state = training_state(args.model)
    blocked: dict[str, list[float]] = {"sync": [], "async": []}
    written: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        path = Path(work) / "step.ckpt"
        sync, background = AtomicCheckpointIO(), BackgroundCheckpointIO()
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            start = time.perf_counter()
            sync.save_checkpoint(state, path)
            blocked["sync"].append(time.perf_counter() - start)
            start = time.perf_counter()
            background.save_checkpoint(state, path)
            blocked["async"].append(time.perf_counter() - start)
            background.wait()
            written.append(time.perf_counter() - start)
        megabytes = path.stat().st_size / 1e6
    sync_ms, async_ms = (statistics.median(blocked[k]) * 1e3 for k in ("sync", "async"))
    print(f"{args.model}: checkpoint of {megabytes:.1f} MB (weights + AdamW moments)")
    print(f"loop blocked per save, sync  {sync_ms:9.1f} ms")
    print(f"loop blocked per save, async {async_ms:9.1f} ms   ratio {sync_ms / async_ms:.1f}x")
    print(f"background write (not waited for) {statistics.median(written) * 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
