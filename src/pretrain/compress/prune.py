"""Pruning a BERT: attention heads by importance, weights by magnitude or movement.

- Heads (Michel et al., 2019): a head's importance is E_x |dL/d xi_h|, the gradient of the
  MLM loss with respect to a gate xi_h = 1 on its context, averaged over batches and
  normalised per layer (L2). The least important `fraction` of all heads go (at least one
  head stays in each layer); the pruned encoder is physically smaller (fewer rows in `qkv`,
  fewer columns in the attention output).
  Shipped as `model.pt2`, the `torch.export` program of the smaller model (ids, types, mask
  -> MLM logits; torch alone loads it). transformers 5 dropped `config.pruned_heads` and
  `prune_heads` (no trace of either in 5.24), and BertConfig has one `num_attention_heads`
  for every layer, so transformers cannot build a BERT with fewer heads in some layers: the
  directory's model.safetensors (for fine-tuning in transformers) holds the pruned heads as
  zero rows (query, key, value) and zero columns (attention output), the pruned model's
  logits exactly at the teacher's size, and config.json records `pruned_heads`.
- Weights by magnitude: the smallest |w| of the encoder layers' Linear weights (attention,
  feed-forward; not embeddings or heads) set to zero, one global threshold, to `sparsity`.
- Weights by movement (Sanh et al., 2020; hard, first-order): MLM fine-tuning while the
  scores S accumulate -w * dL/dw; the weights of lowest S (moving towards zero) are masked,
  the masked fraction rising on a cubic schedule to `sparsity` (a masked weight stays masked).
  Weight-pruned models ship dense (model.safetensors, transformers): no CPU runtime of torch
  runs unstructured (or 2:4) sparse Linear layers faster than dense ones (torch's 2:4 kernels,
  `to_sparse_semi_structured`, are CUDA-only), so they are neither smaller nor faster.
"""

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.compress.encoders import EncoderWithMLM
from pretrain.compress.tinybert import cycled
from pretrain.compress.trace import trace_encoder
from pretrain.errors import ConfigError


def mlm_loss(
    model: EncoderWithMLM, batch: dict[str, Tensor], head_gates: Tensor | None = None
) -> Tensor:
    """Mean cross-entropy of the MLM predictions at the batch's labelled positions
    (`labels` != -100), through the gated trace when `head_gates` (layers, heads) is given."""
    inputs = (batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"))
    if head_gates is None:
        hidden = model.encoder(*inputs)
    else:
        hidden = trace_encoder(model.encoder, *inputs, head_gates=head_gates).hidden[-1]
    where = batch["labels"] != -100
    return F.cross_entropy(model.mlm_head(hidden[where]).float(), batch["labels"][where])


@torch.no_grad()
def mlm_accuracy(model: nn.Module, batches: Iterable[dict[str, Tensor]]) -> float:
    """Fraction of labelled positions whose argmax prediction is the label, over `batches`
    (`model`: ids, types, mask -> MLM logits, an EncoderWithMLM or a MobileBertWithMLM)."""
    model.eval()
    right = total = 0
    for batch in batches:
        inputs = (batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"))
        where = batch["labels"] != -100
        predicted = model(*inputs)[where].argmax(-1)
        right += int((predicted == batch["labels"][where]).sum())
        total += int(where.sum())
    return right / max(total, 1)


def head_importance(
    model: EncoderWithMLM, batches: Iterable[dict[str, Tensor]], steps: int
) -> Tensor:
    """(layers, heads) importance of every head over `steps` batches: mean |dL/d gate|, each
    layer's row divided by its L2 norm."""
    encoder = model.encoder
    heads = encoder.layers[0].attention.num_heads
    gates = torch.ones(len(encoder.layers), heads, requires_grad=True)
    total = torch.zeros_like(gates)
    model.eval()  # no dropout: the gradient of the model as it is
    for _, batch in zip(range(steps), cycled(batches), strict=False):
        (grad,) = torch.autograd.grad(mlm_loss(model, batch, gates), gates)
        total += grad.abs()
    total /= max(steps, 1)
    return total / total.norm(dim=1, keepdim=True).clamp(min=1e-12)


def heads_to_prune(importance: Tensor, fraction: float) -> dict[int, list[int]]:
    """The round(fraction * all heads) least important heads of (layers, heads) `importance`,
    by layer, never the last head of a layer."""
    if not 0 <= fraction < 1:
        raise ConfigError(f"method.head_fraction = {fraction}: must be in [0, 1)")
    layers, heads = importance.shape
    wanted = round(fraction * layers * heads)
    chosen: dict[int, list[int]] = {}
    for flat in importance.flatten().argsort().tolist():
        if sum(len(v) for v in chosen.values()) == wanted:
            break
        layer, head = divmod(flat, heads)
        if len(chosen.get(layer, [])) < heads - 1:
            chosen.setdefault(layer, []).append(head)
    return {layer: sorted(found) for layer, found in sorted(chosen.items())}


def head_rows(head: int, head_size: int, width: int) -> list[int]:
    """The rows of head `head` in a fused [query | key | value] weight of `width` rows per part."""
    return [part * width + head * head_size + i for part in range(3) for i in range(head_size)]


def prune_heads(model: EncoderWithMLM, pruned: dict[int, list[int]]) -> None:
    """Remove the heads `pruned` ({layer: [head, ...]}, 0-based) from `model` in place: the
    layers' `qkv` and attention `output` shrink; `model.pruned_heads` records them."""
    with torch.no_grad():
        for layer_index, heads in pruned.items():
            attention = model.encoder.layers[layer_index].attention
            size, count = attention.head_size, attention.num_heads
            kept = [h for h in range(count) if h not in heads]
            if not kept:
                raise ConfigError(f"cannot prune every head of layer {layer_index}")
            rows = sorted(row for h in kept for row in head_rows(h, size, count * size))
            columns = [h * size + i for h in kept for i in range(size)]
            qkv = nn.Linear(attention.qkv.in_features, len(rows))
            qkv.weight.copy_(attention.qkv.weight[rows])
            qkv.bias.copy_(attention.qkv.bias[rows])
            output = nn.Linear(len(columns), attention.output.out_features)
            output.weight.copy_(attention.output.weight[:, columns])
            output.bias.copy_(attention.output.bias)
            attention.qkv, attention.output, attention.num_heads = qkv, output, len(kept)
    model.pruned_heads = {int(k): list(v) for k, v in pruned.items()}


def dense_copy(model: EncoderWithMLM, vocab) -> EncoderWithMLM:
    """A full-size copy of a head-pruned `model`: the pruned heads' query, key and value rows
    and attention-output columns are zeros, so its outputs equal the pruned model's."""
    dense = EncoderWithMLM(model.model_cfg, vocab)
    state = dense.state_dict()
    pruned = getattr(model, "pruned_heads", {})
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if state[name].shape == tensor.shape:
                state[name] = tensor.clone()
        for layer_index, heads in pruned.items():
            attention = model.encoder.layers[layer_index].attention
            size, count = attention.head_size, model.model_cfg["num_attention_heads"]
            width = count * size
            kept = [h for h in range(count) if h not in heads]
            rows = sorted(row for h in kept for row in head_rows(h, size, width))  # [q | k | v]
            columns = [h * size + i for h in kept for i in range(size)]
            prefix = f"encoder.layers.{layer_index}.attention."
            weight = torch.zeros_like(state[prefix + "qkv.weight"])
            bias = torch.zeros_like(state[prefix + "qkv.bias"])
            weight[rows], bias[rows] = attention.qkv.weight, attention.qkv.bias
            out_weight = torch.zeros_like(state[prefix + "output.weight"])
            out_weight[:, columns] = attention.output.weight
            state[prefix + "qkv.weight"], state[prefix + "qkv.bias"] = weight, bias
            state[prefix + "output.weight"] = out_weight
            state[prefix + "output.bias"] = attention.output.bias.clone()
    dense.load_state_dict(state)
    return dense.eval()


def load_head_pruned(directory: str | Path) -> EncoderWithMLM:
    """The physically smaller model of a head-pruned export (its config.json's
    `pruned_heads`): read as a dense model, then the recorded heads removed."""
    import json

    from pretrain.compress.encoders import load_model

    config = json.loads((Path(directory) / "config.json").read_text())
    loaded = load_model(directory, "model")
    pruned = {int(k): v for k, v in config.get("pruned_heads", {}).items()}
    prune_heads(loaded.model, pruned)
    return loaded.model.eval()


def prunable_weights(model: EncoderWithMLM) -> dict[str, nn.Parameter]:
    """The weights that weight pruning acts on: every Linear weight inside the encoder layers."""
    return {
        name: module.weight
        for name, module in model.encoder.layers.named_modules()
        if isinstance(module, nn.Linear)
    }


def sparsity(weights: dict[str, Tensor]) -> float:
    """Fraction of zero entries over all `weights`."""
    zeros = sum(int((w == 0).sum()) for w in weights.values())
    return zeros / max(sum(w.numel() for w in weights.values()), 1)


def global_masks(scores: dict[str, Tensor], target: float) -> dict[str, Tensor]:
    """Boolean keep-masks: the round(target * all) entries of lowest score over every tensor
    together are False."""
    if not 0 <= target < 1:
        raise ConfigError(f"method.sparsity = {target}: must be in [0, 1)")
    flat = torch.cat([s.flatten() for s in scores.values()])
    dropped = round(target * flat.numel())
    if dropped == 0:
        return {name: torch.ones_like(s, dtype=torch.bool) for name, s in scores.items()}
    order = flat.argsort()
    keep = torch.ones_like(flat, dtype=torch.bool)
    keep[order[:dropped]] = False
    masks, start = {}, 0
    for name, score in scores.items():
        masks[name] = keep[start : start + score.numel()].view_as(score)
        start += score.numel()
    return masks


def magnitude_prune(model: EncoderWithMLM, target: float) -> float:
    """Zero the `target` fraction of smallest-|w| prunable weights in place; returns the
    sparsity reached."""
    weights = prunable_weights(model)
    masks = global_masks({n: w.detach().abs() for n, w in weights.items()}, target)
    with torch.no_grad():
        for name, weight in weights.items():
            weight.mul_(masks[name])
    return sparsity(weights)


def movement_prune(
    model: EncoderWithMLM,
    batches: Iterable[dict[str, Tensor]],
    target: float,
    steps: int,
    lr: float,
) -> tuple[float, list[float]]:
    """Fine-tune on MLM `batches` for `steps` AdamW steps, pruning by movement (see the module
    docstring) to `target`; returns (sparsity reached, per-step losses)."""
    if steps < 1:
        raise ConfigError(f"method.steps = {steps}: movement pruning needs at least one step")
    weights = prunable_weights(model)
    scores = {name: torch.zeros_like(w) for name, w in weights.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    for step, batch in zip(range(steps), cycled(batches), strict=False):
        loss = mlm_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for name, weight in weights.items():
                scores[name] -= weight * weight.grad
        optimizer.step()
        reached = target * (1 - (1 - (step + 1) / steps) ** 3)  # cubic schedule
        masks = global_masks(
            {n: s.masked_fill(weights[n] == 0, float("-inf")) for n, s in scores.items()},
            reached,
        )
        with torch.no_grad():
            for name, weight in weights.items():
                weight.mul_(masks[name])
        losses.append(float(loss.detach()))
    model.eval()
    return sparsity(weights), losses
