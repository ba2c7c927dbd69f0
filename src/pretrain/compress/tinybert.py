"""TinyBERT's layer-wise distillation (Jiao et al., 2020) into a smaller BERT.

The student (M layers, width d') learns from the frozen teacher (N >= M layers, width
d >= d', the same number of heads) by the uniform layer map g(m) = floor(m N / M): student
layer m (1-based) copies teacher layer g(m), the embedding output (m = 0) the teacher's.

    embedding loss   MSE(E_S W_e, E_T)                     over real tokens and features
    hidden loss      sum_m MSE(H_S^m W_h, H_T^g(m))        each a learned (d', d) projection
    attention loss   sum_m MSE(A_S^m, A_T^g(m))            scores before softmax, over heads
                                                            and (real query, real key) pairs
    prediction loss  soft cross-entropy -sum softmax(z_T/T) log softmax(z_S/T)  per position

Stage `intermediate` trains on the first three, stage `prediction` on the last (the paper's
two steps). Stage `task` (task-specific distillation, after `attach_task_heads`) trains on the
first three plus the soft cross-entropy of the student's task logits (a Linear on its [CLS]
state) against the fine-tuned teacher's at temperature T:

    task loss        embedding + hidden + attention + CE_T(head_S(H_S[CLS]), head_T(H_T[CLS]))

The projections and the student's task head exist only for distillation and are not exported.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.compress.encoders import EncoderWithMLM
from pretrain.compress.trace import EncoderTrace, real_tokens
from pretrain.errors import ConfigError

STAGES = ("intermediate", "prediction", "task")


def layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher layer (1-based) for each student layer 1..M: floor(m N / M); raises ConfigError
    when the student is deeper than the teacher."""
    if not 1 <= student_layers <= teacher_layers:
        raise ConfigError(
            f"student.num_hidden_layers = {student_layers}: must be 1 to the teacher's "
            f"{teacher_layers} layers (each student layer learns one teacher layer)"
        )
    return [m * teacher_layers // student_layers for m in range(1, student_layers + 1)]


def masked_mse(student: Tensor, teacher: Tensor, where: Tensor) -> Tensor:
    """Mean squared error of (..., features) tensors over the entries where `where` (...)
    bool is True and every feature, in fp32."""
    squared = (student.float() - teacher.float()).pow(2).mean(dim=-1)
    weights = where.float()
    return (squared * weights).sum() / weights.sum().clamp(min=1)


def attention_loss(student_scores: Tensor, teacher_scores: Tensor, real: Tensor) -> Tensor:
    """MSE of (batch, heads, seq, seq) attention scores over heads and the (query, key)
    pairs of real tokens (`real` (batch, seq) bool), in fp32."""
    pairs = real[:, None, :, None] & real[:, None, None, :]  # (batch, 1, seq, seq)
    pairs = pairs.expand_as(student_scores)
    squared = (student_scores.float() - teacher_scores.float()).pow(2)
    return (squared * pairs).sum() / pairs.sum().clamp(min=1)


def soft_cross_entropy(
    student_logits: Tensor, teacher_logits: Tensor, temperature: float
) -> Tensor:
    """-sum_k softmax(z_T / T)_k log softmax(z_S / T)_k of (n, classes) logits, averaged over
    the n rows, in fp32."""
    targets = F.softmax(teacher_logits.float() / temperature, dim=-1)
    log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return -(targets * log_probs).sum(dim=-1).mean()


def check_pair(student: nn.Module, teacher: EncoderWithMLM) -> list[int]:
    """Refuse a student (an EncoderWithMLM or a MobileBertWithMLM, whose `hidden_size` is its
    body's) that TinyBERT cannot map onto the teacher (deeper, wider, another number of heads,
    another vocabulary) with one line naming the key; returns the layer map."""
    s_cfg, t_cfg = student.model_cfg, teacher.model_cfg
    if s_cfg["hidden_size"] > t_cfg["hidden_size"]:
        raise ConfigError(
            f"student.hidden_size = {s_cfg['hidden_size']}: wider than the teacher's "
            f"{t_cfg['hidden_size']}, which is not supported (the projection maps a narrower "
            "student up to the teacher's width); choose a student at most as wide"
        )
    if s_cfg["num_attention_heads"] != t_cfg["num_attention_heads"]:
        raise ConfigError(
            f"student.num_attention_heads = {s_cfg['num_attention_heads']}: the attention loss "
            f"compares head by head, so it must equal the teacher's {t_cfg['num_attention_heads']}"
        )
    if student.word_embeddings.num_embeddings != teacher.word_embeddings.num_embeddings:
        raise ConfigError("student: its vocabulary must be the teacher's (the same tokenizer)")
    return layer_map(s_cfg["num_hidden_layers"], t_cfg["num_hidden_layers"])


class LayerwiseDistiller(nn.Module):
    """The student and the projections W_e, W_h (student width -> teacher width) being trained;
    the teacher is held outside the module tree (frozen, neither trained nor saved)."""

    def __init__(self, student: nn.Module, teacher: EncoderWithMLM) -> None:
        super().__init__()
        self.layers = check_pair(student, teacher)
        self.student = student
        object.__setattr__(self, "teacher", teacher)
        teacher.requires_grad_(False).eval()
        width, teacher_width = student.model_cfg["hidden_size"], teacher.model_cfg["hidden_size"]
        self.projections = nn.ModuleList(
            nn.Linear(width, teacher_width) for _ in range(len(self.layers) + 1)
        )  # [0]: embeddings, [m]: student layer m
        self.task_head: nn.Linear | None = None

    def attach_task_heads(self, teacher_head: nn.Linear) -> None:
        """Give stage `task` the fine-tuned teacher's classifier (frozen, held outside the
        module tree) and a new trainable student classifier of as many classes."""
        object.__setattr__(self, "teacher_head", teacher_head.requires_grad_(False))
        self.task_head = nn.Linear(self.student.model_cfg["hidden_size"], teacher_head.out_features)

    def losses(
        self, batch: dict[str, Tensor], stage: str, temperature: float = 1.0
    ) -> dict[str, Tensor]:
        """The stage's loss terms on a batch (input_ids, token_type_ids, attention_mask;
        `labels` (-100 = not predicted) selects the prediction loss's positions when present)
        and their sum, `loss`. Stage `task` reads the [CLS] (first) position's states."""
        inputs = (batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"))
        real = real_tokens(inputs[2], inputs[0])
        with torch.no_grad():
            teacher = self.teacher.trace(*inputs)
        student = self.student.trace(*inputs)
        if stage == "intermediate":
            return self.intermediate_losses(student, teacher, real)
        if stage == "task":
            if self.task_head is None:
                raise ConfigError("method.task: stage task needs attach_task_heads first")
            out = self.intermediate_losses(student, teacher, real)
            with torch.no_grad():
                teacher_logits = self.teacher_head(teacher.hidden[-1][:, 0])
            student_logits = self.task_head(student.hidden[-1][:, 0])  # (batch, classes)
            out["task_loss"] = soft_cross_entropy(student_logits, teacher_logits, temperature)
            out["loss"] = out["loss"] + out["task_loss"]
            return out
        if stage != "prediction":
            raise ConfigError(f"method.stage = {stage!r}: one of {', '.join(STAGES)}")
        where = batch["labels"] != -100 if "labels" in batch else real
        with torch.no_grad():
            teacher_logits = self.teacher.mlm_logits(teacher.hidden[-1][where])
        student_logits = self.student.mlm_logits(student.hidden[-1][where])  # (n, vocab)
        loss = soft_cross_entropy(student_logits, teacher_logits, temperature)
        return {"prediction_loss": loss, "loss": loss}

    def intermediate_losses(
        self, student: EncoderTrace, teacher: EncoderTrace, real: Tensor
    ) -> dict[str, Tensor]:
        """Embedding, hidden and attention losses of two traces (see the module docstring)."""
        out = {
            "embedding_loss": masked_mse(
                self.projections[0](student.embeddings), teacher.embeddings, real
            )
        }
        hidden = attention = 0.0
        for m, g in enumerate(self.layers, start=1):
            projected = self.projections[m](student.hidden[m - 1])
            hidden = hidden + masked_mse(projected, teacher.hidden[g - 1], real)
            attention = attention + attention_loss(
                student.scores[m - 1], teacher.scores[g - 1], real
            )
        out["hidden_loss"], out["attention_loss"] = hidden, attention
        out["loss"] = out["embedding_loss"] + hidden + attention
        return out


@dataclass
class DistillationLog:
    """Loss (mean of the stage's `loss`) over the first and the last `window` steps."""

    stage: str
    steps: int
    first_loss: float
    last_loss: float


def distil(
    distiller: LayerwiseDistiller,
    batches: Iterable[dict[str, Tensor]],
    stage: str,
    steps: int,
    lr: float,
    temperature: float = 1.0,
    window: int = 10,
) -> DistillationLog:
    """Train the student and projections for `steps` optimizer steps (AdamW at `lr`, linear
    decay to 0) on `batches` (cycled when shorter); returns the DistillationLog."""
    params = [p for p in distiller.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    distiller.train()
    losses: list[float] = []
    for _, batch in zip(range(steps), cycled(batches), strict=False):
        loss = distiller.losses(batch, stage, temperature)["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    distiller.eval()
    window = max(1, min(window, len(losses) // 2))
    return DistillationLog(
        stage, len(losses), sum(losses[:window]) / window, sum(losses[-window:]) / window
    )


def cycled(batches: Iterable[dict[str, Tensor]]) -> Iterator[dict[str, Tensor]]:
    """`batches` again and again (a new iterator each pass)."""
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ConfigError("the distillation data gave no batch; check data.shards_dir")


def initialise_from_teacher(student: nn.Module, teacher: EncoderWithMLM, layers: list[int]) -> None:
    """Start a student of the teacher's widths (hidden and feed-forward) from the teacher:
    embeddings, MLM head and the mapped layers (student layer m <- teacher layer g(m)); a
    narrower one, or a MobileBERT, keeps its random initialisation (TinyBERT's)."""
    widths = ("hidden_size", "intermediate_size")
    if not isinstance(student, EncoderWithMLM) or any(
        student.model_cfg[key] != teacher.model_cfg[key] for key in widths
    ):
        return
    with torch.no_grad():
        student.encoder.embeddings.load_state_dict(teacher.encoder.embeddings.state_dict())
        student.mlm_head.load_state_dict(teacher.mlm_head.state_dict())
        for m, g in enumerate(layers):
            student.encoder.layers[m].load_state_dict(teacher.encoder.layers[g - 1].state_dict())
