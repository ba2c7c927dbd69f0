"""Per-rank memory of model states under DeepSpeed ZeRO stages 0-3, 2 ranks, measured.

Starts 2 CPU processes (gloo), wraps a BERT encoder (bert_mini sizes by default) in
`deepspeed.initialize` at each stage with AdamW in fp32, runs one forward/backward/step and
sums numel x element_size of what each rank holds:

- parameters: the module's parameters (stage 3: this rank's partitions, `ds_tensor`);
- gradients: after backward, at the accumulation boundary (stage 0: `.grad` of every
  parameter; stages 1-2: the reduced partition in `averaged_gradients`; stage 3: the
  gradient partitions). DeepSpeed's stage 1 also reduce-scatters at the boundary, so the
  snapshot equals stage 2's: stage 1 differs by holding full gradients *between*
  boundaries while accumulating, which an after-backward snapshot does not show;
- optimizer states: every tensor in the wrapped optimizer's state (Adam's exp_avg,
  exp_avg_sq, step) plus ZeRO's fp32 master partitions.

Beside it, DeepSpeed's own estimate for the same model (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`, without offload), which assumes fp16 mixed precision
(2 bytes per parameter and gradient, 12 per parameter of optimizer state) and a 1.5 buffer
factor: the ratios between stages are what compare, not the absolute numbers.

    python benchmarks/bench_zero_memory.py [--hidden 256 --layers 4 --vocab 30522] [--stages 0 1 2 3]
"""

import argparse
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

MB = 2**20


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from pretrain.models.bert import BertEncoder

    torch.manual_seed(0)
    return BertEncoder(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
    )


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optimizer", optimizer)  # ZeRO wraps the torch optimizer
    tensors = [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v)]
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        tensors += [t for t in getattr(optimizer, name, []) or [] if torch.is_tensor(t)]
    # with fp32 training the master partitions may be the tensors Adam updates: count once
    unique = {id(t): t for t in tensors}
    return list(unique.values())


def gradient_tensors(engine, stage: int) -> list[torch.Tensor]:
    optimizer = engine.optimizer
    if stage == 0:
        return [p.grad for p in engine.module.parameters()]
    if stage in (1, 2):
        return [t for group in optimizer.averaged_gradients.values() for t in group or []]
    grads = getattr(optimizer, "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition", {})
    if grads:
        return list(grads.values())
    return [p.grad for p in optimizer.fp32_partitioned_groups_flat]


def measure(rank: int, world: int, port: int, stage: int, args, queue) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    import importlib

    import deepspeed

    # no C++ build of DeepSpeed's shared-memory all-reduce, which only inference calls (as
    # the project's CPU strategy, `runtime.strategies.CPUDeepSpeedStrategy`): 40-75 s of
    # CPU on a machine that has not built it, every rank waiting on the build's lock
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed("gloo")
    model = build_model(args)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config, dist_init_required=False
    )
    ids = torch.randint(5, args.vocab, (2, 32))
    loss = engine(ids).float().pow(2).mean()
    engine.backward(loss)
    grads = nbytes(gradient_tensors(engine, stage))
    engine.step()
    params = nbytes(getattr(p, "ds_tensor", p) for p in engine.module.parameters())
    states = nbytes(optimizer_tensors(ds_optimizer))
    queue.put((stage, rank, params, grads, states))
    deepspeed.comm.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deepspeed_estimates(model: torch.nn.Module, ranks: int) -> dict[int, float]:
    """DeepSpeed's per-GPU model-state estimate in MB for stages 2 and 3 (no offload)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    _, zero2 = estimate_zero2_model_states_mem_needs(total, ranks, 1, cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(
        total, largest, ranks, 1, cpu_offload=False, cpu_offload_params=False
    )
    return {2: zero2 / MB, 3: zero3 / MB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], choices=range(4))
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    model = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"BertEncoder hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}: "
        f"{n_params / 1e6:.2f}M parameters, fp32, AdamW, {args.ranks} ranks (CPU, gloo)"
    )
    context = mp.get_context("spawn")
    queue = context.Queue()
    results = {}
    for stage in args.stages:
        port = free_port()
        procs = [
            context.Process(target=measure, args=(r, args.ranks, port, stage, args, queue))
            for r in range(args.ranks)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            s, rank, params, grads, states = queue.get(timeout=600)
            results[(s, rank)] = (params, grads, states)
        for p in procs:
            p.join()
            if p.exitcode:
                sys.exit(f"stage {stage}: a rank failed with exit code {p.exitcode}")
    estimates = deepspeed_estimates(model, args.ranks)
    print(
        f"{'stage':>5} {'params MB':>10} {'grads MB':>9} {'optim MB':>9} {'total MB':>9} "
        f"{f'vs stage {args.stages[0]}':>10} {'DeepSpeed est. MB (fp16 mixed)':>31}"
    )
    base = None
    for stage in args.stages:
        params, grads, states = results[(stage, 0)]
        total = (params + grads + states) / MB
        base = base or total
        estimate = f"{estimates[stage]:.1f}" if stage in estimates else "-"
        print(
            f"{stage:>5} {params / MB:>10.2f} {grads / MB:>9.2f} {states / MB:>9.2f} "
            f"{total:>9.2f} {total / base:>10.2f} {estimate:>31}"
        )
    print("(rank 0; rank 1 holds the same within one partition's rounding)")


if __name__ == "__main__":
    main()
