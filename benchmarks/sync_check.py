"""Host synchronisations in the training step (issue 18 item 2), on a CUDA machine.

For every objective (a tiny model of its family on a prepared corpus), a few training steps
(forward, loss, backward, the non-finite check and the optimizer step as
`PretrainingTask.optimizer_step` does them on CUDA: `nonfinite_flag`, counted by
`DeviceSkips`, handed to a fused AdamW as `found_inf`) run
under torch.cuda.set_sync_debug_mode("error"),
which raises at the first operation that makes the host wait for the device (boolean-mask
indexing, nonzero, .item(), a device-to-host copy). Outside it: the first step (lazy CUDA
initialisation, and a logging step's reads, which may sync) and moving each batch to the
device (Lightning's transfer, not the step). The one planted NaN gradient (`--nan-step`)
must leave the weights as they were, counted when the skips are settled after the loop.
Lightning's loop adds its own per-step work (logging off logging steps, no progress bar:
trainer.enable_progress_bar=false, whose per-step postfix reads the loss).

    .venv/bin/python benchmarks/sync_check.py --shards data/builtin [--objectives mlm electra]
    .venv/bin/python benchmarks/sync_check.py --shards data/builtin --device cpu

On a CPU, where nothing synchronises, the same steps run under `HostSyncOps` instead: a
dispatch mode that raises at every operator that makes the host wait for the device on CUDA
(reading a value: `.item()`, `bool()`; an output whose size depends on the data: boolean-mask
indexing and index_put, nonzero, masked_select, unique, repeat_interleave without its size,
bincount). It sees operators only: host reads that dispatch none on a CPU tensor (`.tolist()`,
`.numpy()`, `.cpu()`) it does not see; on CUDA those are device-to-host copies, which the CUDA
mode catches.

Prints one line per objective (ok, or the error with the last frames of our code) and exits
1 when any step synchronised.
"""

import argparse
import contextlib
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Every objective's tiny model: the golden cases (tests/golden/<case>.json), so an objective
# with a golden case is checked here without a list to extend.
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "tests" / "golden"


def golden_cases(golden_dir: Path = GOLDEN_DIR) -> dict[str, tuple[str, ...]]:
    """case -> the overrides of `golden_dir`'s <case>.json (objective, model, data), less its
    optimizer's (a fused AdamW steps here) and its teacher's (`make_teacher` makes one)."""
    cases = {}
    for path in sorted(golden_dir.glob("*.json")):
        overrides = json.loads(path.read_text())["overrides"]
        kept = [o for o in overrides if not o.lstrip("+").startswith("optim")]
        cases[path.stem] = tuple(o for o in kept if "{teacher}" not in o)
    return cases


OBJECTIVES = golden_cases()


aten = torch.ops.aten
# Operators that wait for the device on CUDA whatever their arguments: a value read by the
# host, or an output whose size depends on the data (counted on the device first).
SYNCING = {
    aten._local_scalar_dense.default,  # .item(), bool(), float(), int()
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.bincount.default,
}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


class HostSyncOps(TorchDispatchMode):
    """Raises RuntimeError at an operator that synchronises on CUDA (`SYNCING`, indexing with
    a boolean mask, repeat_interleave without output_size), on any device: the CPU stand-in
    for torch.cuda.set_sync_debug_mode("error")."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        syncs = func in SYNCING
        if func in INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            syncs = any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)
        elif func is aten.repeat_interleave.Tensor:
            syncs = kwargs.get("output_size") is None
        if syncs:
            raise RuntimeError(f"{func} synchronises with the host on CUDA")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_sync(device: torch.device):
    """Raise RuntimeError at the first host synchronisation inside: CUDA's sync debug mode on
    a CUDA device, `HostSyncOps` on any other."""
    if device.type != "cuda":
        with HostSyncOps():
            yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def build(objective: str, shards: Path, scratch: Path, teacher: Path | None):
    """(module, stream spec) of `objective` on `shards`: batches of 8 sequences of 128."""
    from pretrain.config import compose_config
    from pretrain.runtime.run import build_stream

    overrides = [
        *OBJECTIVES[objective],
        f"data.shards_dir={shards}",
        f"run_dir={scratch / objective}",
        "data.max_seq_length=128",
        "data.batch_size=8",
        "data.num_workers=0",
        "seed=7",
    ]
    if teacher is not None:
        overrides.append(f"objective.teacher={teacher}")
    run, spec, module_class = build_stream(compose_config(overrides))
    from pretrain.runtime.task import PretrainingTask

    torch.manual_seed(0)
    return PretrainingTask(module_class(run, spec.vocab)), spec


def make_teacher(shards: Path, scratch: Path) -> Path:
    """A BERT-tiny MLM checkpoint (random weights) on the corpus's tokenizer: the teacher
    reads its encoder and MLM head (the sentence head is left out)."""
    module, _ = build("mlm_nsp", shards, scratch, None)
    path = scratch / "teacher.ckpt"
    torch.save({"state_dict": module.state_dict(), "config": module.config}, path)
    return path


def on_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors moved to `device`, as Lightning moves them; the rest (its keys, the
    host's flags such as whether it has padding) as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def check(objective: str, args, scratch: Path, teacher: Path | None) -> str:
    """'ok', or what synchronised (the error and the last frames under src/pretrain)."""
    from pretrain.data.stream import EpochStream
    from pretrain.runtime.nonfinite import DeviceSkips, nonfinite_flag

    device = torch.device(args.device)
    module, spec = build(objective, args.shards, scratch, teacher)
    module.to(device).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)  # takes found_inf
    skips = DeviceSkips()
    nan, before, after = float("nan"), [], []
    batches = iter(EpochStream(spec, 0))
    for step in range(args.steps + 1):
        # as Lightning moves it: the host-side hook first (the unpadded layout's index)
        batch = on_device(module.host_batch(next(batches)), device)
        # step 0: warm-up (lazy CUDA initialisation; a logging step)
        guard = no_host_sync(device) if step > 0 else contextlib.nullcontext()
        try:
            with guard:
                loss = module(batch)["loss"]
                loss.backward()
                if step == args.nan_step:  # copies on the device: compared after the loop
                    grad = next(p.grad for p in module.parameters() if p.grad is not None)
                    grad.view(-1)[:1].fill_(nan)  # a kernel: `[0] = nan` copies from the host
                    before = [p.detach().clone() for p in module.parameters()]
                bad = nonfinite_flag(~torch.isfinite(loss.detach()), module.parameters(), device)
                optimizer.found_inf = skips.record(bad.float())
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step == args.nan_step:
                    after = [p.detach().clone() for p in module.parameters()]
        except RuntimeError as error:
            frames = traceback.extract_tb(error.__traceback__)
            ours = [f for f in frames if "pretrain" in f.filename or f.filename == __file__]
            shown = ours[-2:] + [f for f in frames[-2:] if f not in ours[-2:]]
            return f"SYNC at step {step}: {str(error).splitlines()[0]} | " + " <- ".join(
                f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in reversed(shown)
            )
    if device.type == "cuda":
        torch.cuda.synchronize()
    skipped = skips.settle()[0]
    kept = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    if not kept or skipped != 1:
        return f"ERROR the NaN step: weights kept {kept}, {skipped} step(s) counted as skipped"
    return "ok" if device.type == "cuda" else "ok (cpu: no operator that synchronises on CUDA)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=Path, default=Path("data/builtin"))
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES))
    parser.add_argument("--steps", type=int, default=3, help="guarded steps per objective")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--nan-step", type=int, default=2, help="a guarded step with a NaN")
    args = parser.parse_args()
    if not 0 < args.nan_step <= args.steps:
        parser.error("--nan-step must be one of the guarded steps 1..--steps")
    args.shards = args.shards.resolve()
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        teacher = make_teacher(args.shards, scratch) if "distillation" in args.objectives else None
        for objective in args.objectives:
            try:
                result = check(
                    objective, args, scratch, teacher if objective == "distillation" else None
                )
            except Exception as error:  # a setup failure: reported, the others still run
                result = f"ERROR {type(error).__name__}: {str(error).splitlines()[0]}"
            failed += result.split()[0] in ("SYNC", "ERROR")
            print(f"{objective:14s} {result}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
