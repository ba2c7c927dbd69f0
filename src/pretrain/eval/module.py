"""The Lightning module that fine-tunes (or, with a frozen encoder, probes) an encoder on a
downstream task: encoder -> chosen layers -> pooled or per-token features -> a linear head."""

from dataclasses import dataclass

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from pretrain.errors import ConfigError
from pretrain.eval.encoder import HiddenStates
from pretrain.eval.features import IGNORE_INDEX
from pretrain.eval.heads import MODES, PER_TOKEN_KINDS, LayerSelection, pool


@dataclass
class HeadSettings:
    """How the task reads the encoder and is trained: `mode` finetune (every weight trained)
    or features (encoder frozen, in eval mode: only the head and the layer mix learn);
    `layers` and `pooling` as in `pretrain.eval.heads`; `lr` peak learning rate, reached
    linearly over the first `warmup_fraction` of the optimizer steps, then linearly to 0
    over `total_steps`; `dropout` before the head (probability)."""

    mode: str = "finetune"
    layers: str = "last"
    pooling: str = "cls"
    lr: float = 5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    total_steps: int = 1


class DownstreamModule(L.LightningModule):
    """`kind` (a TASK_KINDS entry) decides the head and the loss: classification and pair:
    cross-entropy on the pooled vector; regression: squared error on one output; tagging:
    cross-entropy per labelled token; qa: start and end logits per token, cross-entropy
    against the answer's first and last token. `last_token_summary`: XLNet's summary token
    ends the input."""

    def __init__(
        self,
        encoder: HiddenStates,
        kind: str,
        num_outputs: int,
        settings: HeadSettings,
        last_token_summary: bool = False,
    ) -> None:
        super().__init__()
        if settings.mode not in MODES:
            raise ConfigError(f"eval.mode = {settings.mode!r}: must be one of {', '.join(MODES)}")
        self.encoder = encoder
        self.kind = kind
        self.settings = settings
        self.last_token_summary = last_token_summary
        self.layers = LayerSelection(settings.layers, encoder.num_layers + 1, encoder.hidden_size)
        self.dropout = nn.Dropout(settings.dropout)
        self.head = nn.Linear(self.layers.output_size, num_outputs)
        self.register_buffer("shift", None)  # set by `standardize`; None: features as they are
        self.register_buffer("scale", None)
        self.frozen = settings.mode == "features"
        self.encoder.requires_grad_(not self.frozen)  # a probe's fit may have frozen it

    def standardize(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Read every state's features as (h - mean) / std; each (num_states, hidden)."""
        self.shift, self.scale = mean.clone(), std.clone()

    def on_train_start(self) -> None:
        # Lightning keeps the modes modules come in with; a loaded Hugging Face model is in
        # eval mode (no dropout) until told otherwise
        self.train()
        if self.frozen:
            self.encoder.eval()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits: (batch, outputs) for sequence tasks, (batch,) for regression, (batch, seq,
        tags) for tagging, (batch, seq, 2) start/end for qa. A batch may carry the frozen
        encoder's `hidden_states` (batch, states, seq, hidden), computed once before training
        (pretrain.eval.encoder.with_hidden_states); then the encoder is not run."""
        if "hidden_states" in batch:
            states = tuple(batch["hidden_states"].unbind(1))
        elif self.frozen:
            self.encoder.eval()  # no dropout in a frozen feature extractor
            with torch.no_grad():
                states = self.encoder(batch)
        else:
            states = self.encoder(batch)
        if self.shift is not None:
            states = tuple(
                (h - m) / s for h, m, s in zip(states, self.shift, self.scale, strict=True)
            )
        hidden = self.layers(states)  # (batch, seq, features)
        if self.kind in PER_TOKEN_KINDS:
            return self.head(self.dropout(hidden))
        pooled = pool(
            hidden, batch["attention_mask"], self.settings.pooling, self.last_token_summary
        )
        logits = self.head(self.dropout(pooled))
        return logits.squeeze(-1) if self.kind == "regression" else logits

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.kind == "regression":
            return F.mse_loss(logits, batch["labels"])
        if self.kind == "tagging":
            return F.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
            )
        if self.kind == "qa":
            start, end = logits.unbind(-1)  # (batch, seq) each
            return (
                F.cross_entropy(start, batch["start_positions"])
                + F.cross_entropy(end, batch["end_positions"])
            ) / 2
        return F.cross_entropy(logits, batch["labels"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # not logged: the fit has no logger and no progress bar (pretrain.eval.run)
        return self.loss(self(batch), batch)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self):
        trainable = [p for p in self.parameters() if p.requires_grad]
        decayed = [p for p in trainable if p.ndim >= 2]
        plain = [p for p in trainable if p.ndim < 2]  # biases, LayerNorms, the layer mix
        optimizer = torch.optim.AdamW(
            [
                {"params": decayed, "weight_decay": self.settings.weight_decay},
                {"params": plain, "weight_decay": 0.0},
            ],
            lr=self.settings.lr,
        )
        total = max(self.settings.total_steps, 1)
        warmup = int(self.settings.warmup_fraction * total)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(total - warmup, 1))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
