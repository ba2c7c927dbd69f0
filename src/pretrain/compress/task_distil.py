"""TinyBERT's task-specific stage around `LayerwiseDistiller`'s stage `task`: the teacher is
fine-tuned on the task first (its encoder and a Linear classifier on the [CLS] state, cross
entropy on the labels), then the student learns the layer-wise losses and the teacher's soft
class distribution; both are scored by dev accuracy. No data augmentation."""

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.compress.tinybert import cycled


def cls_state(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """(batch, hidden) last-layer state at the first ([CLS]) position of an EncoderWithMLM or
    a MobileBertWithMLM."""
    trace = model.trace(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
    return trace.hidden[-1][:, 0]


@dataclass
class FineTuning:
    """The teacher's classifier after fine-tuning, and the mean cross entropy of its first
    and last `window` steps."""

    head: nn.Linear
    first_loss: float
    last_loss: float


def finetune_teacher(
    teacher: nn.Module,
    batches: list[dict[str, Tensor]],
    classes: int,
    steps: int,
    lr: float,
    window: int = 10,
) -> FineTuning:
    """Fine-tune `teacher` (in place) and a new classifier for `steps` AdamW steps at `lr` on
    labelled `batches`; returns both frozen, in eval mode."""
    head = nn.Linear(teacher.model_cfg["hidden_size"], classes)
    params = [*teacher.parameters(), *head.parameters()]
    teacher.requires_grad_(True).train()
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    losses: list[float] = []
    for _, batch in zip(range(steps), cycled(batches), strict=False):
        loss = F.cross_entropy(head(cls_state(teacher, batch)), batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    teacher.requires_grad_(False).eval()
    head.requires_grad_(False).eval()
    window = max(1, min(window, len(losses) // 2))
    first = sum(losses[:window]) / window if losses else float("nan")
    last = sum(losses[-window:]) / window if losses else float("nan")
    return FineTuning(head, first, last)


@torch.no_grad()
def task_accuracy(model: nn.Module, head: nn.Linear, batches: list[dict[str, Tensor]]) -> float:
    """Fraction of `batches`' examples whose argmax of head([CLS] state) is the label."""
    was_training = model.training
    model.eval()
    right = total = 0
    for batch in batches:
        predicted = head(cls_state(model, batch)).argmax(-1)
        right += int((predicted == batch["labels"]).sum())
        total += len(batch["labels"])
    model.train(was_training)
    return right / max(total, 1)
