"""The heads' side of the static prediction budget (`pretrain.data.prediction_budget`):
gather hidden states and targets at a batch's predicted positions, (batch, width) with -1 in
ignored slots, and losses and accuracies that count only the real slots. No boolean-mask
indexing, `nonzero` or `.item()`: shapes follow the positions array, so the step never waits
for the device to say how many tokens were predicted.
"""

import torch
import torch.nn.functional as F

from pretrain.data.masking import IGNORE_INDEX


def predicted_positions(batch: dict, labels_key: str = "labels", key: str = "") -> torch.Tensor:
    """The batch's predicted positions (batch, width) int64, -1 = ignored slot:
    `batch[key]` (default: `prediction_positions`), which the stream's corruption writes; a
    batch built by hand without it gets exactly the positions where `batch[labels_key]` is
    not IGNORE_INDEX (one host synchronisation: for tests and tools, never the stream)."""
    key = key or "prediction_positions"
    if key in batch:
        return batch[key]
    selected = batch[labels_key] != IGNORE_INDEX  # (batch, seq)
    width = int(selected.sum(dim=1).max()) if selected.numel() else 0
    order = torch.argsort((~selected).to(torch.int8), dim=1, stable=True)[:, :width]
    return order.masked_fill(~selected.gather(1, order), -1)


def gather_positions(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """values (batch, seq, ...) at positions (batch, width) -> (batch * width, ...), row-major
    (the order of `values[selected]`); ignored slots read position 0."""
    rows = torch.arange(values.shape[0], device=values.device)[:, None]  # (batch, 1)
    return values[rows, positions.clamp(min=0)].flatten(0, 1)


def gather_targets(labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """labels (batch, seq) at positions (batch, width) -> (batch * width,), IGNORE_INDEX in
    ignored slots."""
    return gather_positions(labels, positions).masked_fill(positions.flatten() < 0, IGNORE_INDEX)


def masked_mean(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the True entries of `where` (same shape), in fp32; 0 when none."""
    where = where.float()
    return (values.float() * where).sum() / where.sum().clamp(min=1)


def masked_classification_metrics(
    name: str, logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0
) -> dict[str, torch.Tensor]:
    """{name_loss, name_accuracy} of logits (n, classes) against targets (n,) over the slots
    whose target is not IGNORE_INDEX: cross-entropy (fp32, label-smoothed by
    `label_smoothing`) and accuracy averaged over those slots, 0 when there are none."""
    logits = logits.float()
    real = targets != IGNORE_INDEX
    count = real.sum().clamp(min=1)
    loss = F.cross_entropy(
        logits, targets, ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=label_smoothing
    )
    correct = (logits.argmax(-1) == targets) & real
    return {f"{name}_loss": loss / count, f"{name}_accuracy": correct.sum() / count}
