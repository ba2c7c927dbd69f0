"""DistilBERT's objective (Sanh et al., 2019): masked LM plus distillation from a frozen teacher.

The student (usually `model=distilbert`) starts from the teacher, unless
`objective.init_from_teacher` is false: its embeddings, its MLM head and one layer in two
(student layer i <- teacher layer i * stride, stride = teacher layers // student layers:
0, 2, 4 ...). A BERT teacher's token-type row 0 (added to every
token of a single-segment input) is folded into the student's position embeddings, so a
student without token types embeds exactly as the teacher does.

The teacher (a `pretrain` .ckpt or a Hugging Face directory, `objective.teacher`) stays in
eval mode without gradients; it is not a submodule, so it is neither optimised nor saved in
the student's checkpoints, nor exported. Loss, as in Hugging Face's distiller with MLM:

    alpha_ce * KL(teacher || student, both softmax(logits / T)) * T^2   over masked positions
  + alpha_mlm * cross-entropy of the student's MLM                     over masked positions
  + alpha_cos * mean(1 - cos(student hidden, teacher hidden))         over real tokens
"""

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pretrain.config import TrainConfig
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.build import build_encoder
from pretrain.models.flops import (
    bert_family,
    embedding_size,
    encoder_flops,
    mlm_head_flops,
    sequence_sizes,
)
from pretrain.models.heads import MaskedLMHead
from pretrain.models.unpadding import encoder_mask, unpadded_inputs
from pretrain.objectives.base import Losses
from pretrain.objectives.distillation_config import DistillationConfig
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
    masked_mean,
    predicted_positions,
)


class Teacher(nn.Module):
    """A frozen encoder + MLM head in eval mode: (ids, types, mask) -> (hidden, ...)."""

    def __init__(self, model_cfg: dict, state_dict: dict, vocab: Vocabulary, source: str) -> None:
        super().__init__()
        self.model_cfg = model_cfg
        self.encoder = build_encoder(model_cfg, vocab.size, vocab.pad)
        self.mlm_head = MaskedLMHead(
            model_cfg["hidden_size"],
            vocab.size,
            model_cfg["layer_norm_eps"],
            self.encoder.word_embeddings,
            initializer_range=model_cfg.get("initializer_range", 0.02),
        )
        weights = {k: v for k, v in state_dict.items() if k.startswith(("encoder.", "mlm_head."))}
        rows = weights.get("encoder.embeddings.word_embeddings.weight")
        if rows is not None and rows.shape[0] != vocab.size:
            raise ConfigError(
                f"objective.teacher={source}: the teacher's vocabulary has {rows.shape[0]} tokens, "
                f"the run's tokenizer {vocab.size}; distil with the teacher's tokenizer (its shards)"
            )
        if "mlm_head.bias" not in weights:
            raise ConfigError(
                f"objective.teacher={source}: the teacher has no MLM head; give a model trained "
                "with an MLM objective (or a *ForMaskedLM / *ForPreTraining export)"
            )
        self.load_state_dict(weights, strict=True)
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> "Teacher":
        """Always eval mode (no dropout), whatever the caller asks."""
        return super().train(False)


def load_teacher(source: str | None, vocab: Vocabulary) -> Teacher:
    """The teacher of `objective.teacher`: a Hugging Face directory or a `pretrain` .ckpt."""
    from pretrain.export import import_hf_model, read_checkpoint

    if not source:
        raise ConfigError(
            "objective.teacher is not set: pass objective.teacher=<a pretrain .ckpt or a Hugging "
            "Face directory> of a model trained with the run's tokenizer"
        )
    path = Path(source)
    if path.is_dir():
        model_cfg, state_dict = import_hf_model(path)
    elif path.is_file():
        state_dict, saved = read_checkpoint(path)
        model_cfg = saved["model"]
    else:
        raise ConfigError(
            f"objective.teacher={source}: no such file or directory; give a .ckpt or a HF directory"
        )
    return Teacher(model_cfg, state_dict, vocab, source)


def initialise_student(student: MaskedLanguageModel, teacher: Teacher) -> None:
    """Copy the teacher's embeddings, MLM head and every `stride`-th layer into the student
    (student layer i <- teacher layer i * stride); a teacher's token-type row 0 is folded
    into the student's position embeddings when the student has no token types."""
    source = student.run.objective.teacher
    student_layers, teacher_layers = student.encoder.layers, teacher.encoder.layers
    if len(teacher_layers) < len(student_layers):
        raise ConfigError(
            f"model.num_hidden_layers = {len(student_layers)}: the student cannot have more "
            f"layers than the teacher ({len(teacher_layers)}, objective.teacher={source})"
        )
    stride = len(teacher_layers) // len(student_layers)
    student_embeddings = student.encoder.embeddings.state_dict()
    teacher_embeddings = teacher.encoder.embeddings.state_dict()
    copied = {}
    for name, tensor in student_embeddings.items():
        if name not in teacher_embeddings:
            raise ConfigError(
                f"objective.teacher={source}: the teacher has no {name} to initialise the "
                "student's embeddings from; use a teacher of the student's family"
            )
        copied[name] = teacher_embeddings[name][: tensor.shape[0]]
    folded = "token_type_embeddings.weight"
    if folded in teacher_embeddings and folded not in student_embeddings:
        copied["position_embeddings.weight"] = (
            copied["position_embeddings.weight"] + teacher_embeddings[folded][0]
        )
    with torch.no_grad():
        try:
            student.encoder.embeddings.load_state_dict(copied)
            for index, layer in enumerate(student_layers):
                layer.load_state_dict(teacher_layers[index * stride].state_dict())
            student.mlm_head.load_state_dict(teacher.mlm_head.state_dict())
        except RuntimeError as error:
            raise ConfigError(
                f"model.hidden_size = {student.run.model.hidden_size}: the student's "
                f"sizes must match the teacher's (objective.teacher={source}): {error}"
            ) from error


def cosine_loss(
    student: torch.Tensor, teacher: torch.Tensor, where: torch.Tensor | None = None
) -> torch.Tensor:
    """mean(1 - cos) of (..., hidden) vector pairs (CosineEmbeddingLoss with target 1), in
    fp32, over the True entries of `where` (...) bool (all when None)."""
    distance = 1 - F.cosine_similarity(student.float(), teacher.float(), dim=-1)
    return distance.mean() if where is None else masked_mean(distance, where)


def distillation_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float,
    where: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(teacher || student) of (n, vocab) logits softened by `temperature`, averaged over the
    n positions (those where `where` (n,) bool is True, when given) and scaled by T^2 (Hinton
    et al., 2015), in fp32."""
    log_student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_probs = F.softmax(teacher_logits.float() / temperature, dim=-1)
    if where is None:
        return F.kl_div(log_student, teacher_probs, reduction="batchmean") * temperature**2
    per_element = F.kl_div(log_student, teacher_probs, reduction="none")  # (n, vocab)
    rows = where.float()
    kl = (per_element * rows[:, None]).sum() / rows.sum().clamp(min=1)  # "batchmean" over `where`
    return kl * temperature**2


class DistillationModule(MaskedLanguageModel):
    """Student encoder + tied MLM head, distilled from a frozen teacher (see module docstring)."""

    config_class = DistillationConfig

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        objective = self.run.objective
        teacher = load_teacher(objective.teacher, vocab)
        # Not a submodule: kept out of parameters(), state_dict() and train()/eval().
        object.__setattr__(self, "teacher", teacher)
        if objective.init_from_teacher:
            initialise_student(self, teacher)

    def _teacher_on(self, reference: torch.Tensor) -> Teacher:
        """The teacher on the device and in the dtype of the student's weights."""
        first = next(self.teacher.parameters())
        if first.device != reference.device or first.dtype != reference.dtype:
            self.teacher.to(device=reference.device, dtype=reference.dtype)
        return self.teacher

    def forward_flops(self, batch: dict) -> torch.Tensor | None:
        """The student's forward FLOPs (the MLM objective's) plus a third of the frozen
        teacher's forward pass on the same tokens and prediction slots: a step counts 3 x
        forward, and the teacher runs forward only (`pretrain.models.flops`)."""
        student = super().forward_flops(batch)
        teacher = self.teacher.model_cfg
        if student is None or not bert_family(teacher):
            return student
        tokens, pairs = sequence_sizes(batch["attention_mask"])
        rows = predicted_positions(batch).numel()
        head = mlm_head_flops(
            teacher["hidden_size"], embedding_size(teacher), self.vocab.size, rows
        )
        return student + (encoder_flops(teacher, tokens, pairs) + head) / 3

    def forward(self, batch: dict) -> Losses:
        """Loss (alpha-weighted KL, MLM and cosine losses) and metrics (those three,
        accuracies) of one batch."""
        objective = self.run.objective
        inputs = (batch["input_ids"], batch["token_type_ids"], encoder_mask(batch))
        hidden = self.encoder(*inputs, **unpadded_inputs(batch))  # (batch, seq, hidden)
        positions = predicted_positions(batch)  # (batch, width), -1 = ignored slot
        targets = gather_targets(batch["labels"], positions)  # (batch * width,)
        logits = self.mlm_head(gather_positions(hidden, positions))  # (batch * width, vocab)
        teacher = self._teacher_on(self.encoder.word_embeddings.weight)
        with torch.no_grad():
            teacher_hidden = teacher.encoder(*inputs, **unpadded_inputs(batch))
            teacher_logits = teacher.mlm_head(gather_positions(teacher_hidden, positions))
        out = masked_classification_metrics("mlm", logits, targets)
        predicted = positions.flatten() >= 0
        out["kl_loss"] = distillation_kl(logits, teacher_logits, objective.temperature, predicted)
        real = batch["attention_mask"].bool()  # (batch, seq)
        out["cos_loss"] = cosine_loss(hidden, teacher_hidden, real)
        loss = (
            objective.alpha_ce * out["kl_loss"]
            + objective.alpha_mlm * out["mlm_loss"]
            + objective.alpha_cos * out["cos_loss"]
        )
        out["teacher_mlm_accuracy"] = masked_mean(teacher_logits.argmax(-1) == targets, predicted)
        return Losses(loss, out)
