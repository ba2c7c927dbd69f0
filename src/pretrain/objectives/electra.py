"""ELECTRA's objective (Clark et al., 2020): replaced-token detection.

A small generator (an MLM encoder, `objective.generator_size_fraction` of the discriminator's
width) predicts the masked tokens; replacements are sampled from its output distribution
(no gradient through the sampling); the discriminator (the `model` group) classifies every
non-padding token as original or replaced. Both share one embeddings module (word, position,
token type, LayerNorm), as in the paper. Loss = generator MLM + lambda * discriminator BCE,
lambda = `objective.discriminator_weight` (50).

Corruption (data-loader workers) is BERT's MLM selection: 15% of the non-special tokens, all
replaced by [MASK] (the paper's text; the released code keeps 15% of them unchanged:
`objective.mask_token_probability=0.85`). The generator predicts at the batch's
`prediction_positions` (a static budget, `pretrain.data.prediction_budget`); the
discriminator's loss is averaged over the real tokens by weights, not by boolean indexing.
"""

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from pretrain.config import TrainConfig
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.build import DESCRIPTIVE_KEYS, build_encoder
from pretrain.models.electra import ElectraEncoder, ReplacedTokenHead, generator_config
from pretrain.models.flops import embedding_size, encoder_flops, mlm_head_flops, sequence_sizes
from pretrain.models.heads import MaskedLMHead
from pretrain.models.unpadding import encoder_mask, set_unpadding, unpadded_inputs
from pretrain.objectives.base import Losses, Objective
from pretrain.objectives.electra_config import ElectraObjectiveConfig
from pretrain.objectives.mlm import MaskedLMCorruption, mlm_corruption_inputs
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
    masked_mean,
    predicted_positions,
)


@torch.no_grad()
def sample_replacements(
    logits: torch.Tensor, temperature: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row drawn from softmax(logits / temperature): (n, vocab) -> (n,) int64.
    No gradient flows through the draw. The draw is torch.multinomial's own one-sample method
    (argmax of probabilities / Exponential(1) noise) without its validity check, which reads
    the device back (a host synchronisation on CUDA)."""
    probabilities = torch.softmax(logits.detach().float() / temperature, dim=-1)
    noise = torch.empty_like(probabilities).exponential_(1, generator=generator)
    return (probabilities / noise).argmax(dim=-1)


class ElectraModule(Objective):
    """Generator (`generator`, `generator_head`) + discriminator (`encoder`,
    `discriminator_head`) sharing `encoder.embeddings`."""

    config_class = ElectraObjectiveConfig
    corruption_class = MaskedLMCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        model, objective = self.run.model, self.run.objective
        self.encoder = build_encoder(model, vocab.size, vocab.pad)  # the discriminator
        if not isinstance(self.encoder, ElectraEncoder):
            raise ConfigError(
                f"model._target_ = {model._target_!r}: objective=electra needs an ELECTRA "
                "model (model=electra_small, electra_base, electra_large or electra_tiny)"
            )
        init = model.initializer_range
        self.discriminator_head = ReplacedTokenHead(model.hidden_size, init)
        self.generator_model_config = generator_config(
            self.config["model"],
            objective.generator_size_fraction,
            objective.generator_layer_fraction,
        )
        sizes = {
            key: value
            for key, value in self.generator_model_config.items()
            if key not in (*DESCRIPTIVE_KEYS, "_target_")
        }
        self.generator = ElectraEncoder(
            vocab.size, pad_token_id=vocab.pad, embeddings=self.encoder.embeddings, **sizes
        )
        set_unpadding(self.generator, model.unpad)
        self.generator_head = MaskedLMHead(
            sizes["hidden_size"],
            vocab.size,
            model.layer_norm_eps,
            self.encoder.word_embeddings,
            initializer_range=init,
        )
        self.temperature = float(objective.temperature)
        self.discriminator_weight = float(objective.discriminator_weight)

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        """BERT's MLM selection with the objective's probabilities (see the module docstring)."""
        return mlm_corruption_inputs(vocab, config)

    def generate(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Generator logits at the batch's prediction positions, (batch * width, vocab), and
        those positions, (batch, width) int64, -1 = ignored slot."""
        hidden = self.generator(
            batch["input_ids"],
            batch["token_type_ids"],
            encoder_mask(batch),
            **unpadded_inputs(batch),
        )  # (batch, seq, generator hidden)
        positions = predicted_positions(batch)
        return self.generator_head(gather_positions(hidden, positions)), positions

    def replace(
        self, batch: dict, logits: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The discriminator's input, (batch, seq) ids with the masked positions filled by
        tokens sampled from the generator's logits (batch * width, vocab) at `positions`
        (batch, width), and its labels, (batch, seq) bool: True where that input differs from
        the original text (only ever at masked positions)."""
        selected = batch["labels"] != IGNORE_INDEX
        original = torch.where(selected, batch["labels"], batch["input_ids"])  # (batch, seq)
        sampled = sample_replacements(logits, self.temperature).view(positions.shape)
        seq = original.shape[1]  # ignored slots write a spare last column, then dropped
        spare = torch.cat([original, original[:, :1]], dim=1)  # (batch, seq + 1)
        replaced = spare.scatter(1, positions.masked_fill(positions < 0, seq), sampled)[:, :seq]
        return replaced, replaced != original

    def forward_flops(self, batch: dict) -> torch.Tensor:
        """Forward FLOPs of a batch (`pretrain.models.flops`): the generator (its encoder on the real
        tokens, its MLM head on the prediction slots), then the discriminator (the encoder on
        the real tokens, the replaced-token head h -> h -> 1 on every position)."""
        model, generator = self.run.model, self.generator_model_config
        tokens, pairs = sequence_sizes(batch["attention_mask"])
        rows = predicted_positions(batch).numel()
        head = mlm_head_flops(
            generator["hidden_size"], embedding_size(model), self.vocab.size, rows
        )
        hidden = model.hidden_size
        detection = 2 * batch["input_ids"].numel() * (hidden * hidden + hidden)
        discriminator = encoder_flops(model, tokens, pairs) + detection
        return encoder_flops(generator, tokens, pairs) + head + discriminator

    def forward(self, batch: dict) -> Losses:
        """Loss (generator MLM + weighted replaced-token detection) and metrics of one batch
        (see the module docstring)."""
        logits, positions = self.generate(batch)  # (batch * width, vocab)
        generator = masked_classification_metrics(
            "mlm", logits, gather_targets(batch["labels"], positions)
        )
        replaced_ids, is_replaced = self.replace(batch, logits, positions)
        hidden = self.encoder(
            replaced_ids, batch["token_type_ids"], encoder_mask(batch), **unpadded_inputs(batch)
        )
        detection = self.discriminator_head(hidden).float()  # (batch, seq) logits
        real = batch["attention_mask"].bool()
        per_token = F.binary_cross_entropy_with_logits(
            detection, is_replaced.float(), reduction="none"
        )
        discriminator_loss = masked_mean(per_token, real)
        correct = (detection > 0) == is_replaced
        mlm_loss = generator["mlm_loss"]
        return Losses(
            mlm_loss + self.discriminator_weight * discriminator_loss,
            {
                "mlm_loss": mlm_loss,
                "discriminator_loss": discriminator_loss,
                "generator_accuracy": generator["mlm_accuracy"],
                "replaced_fraction": masked_mean(is_replaced, batch["labels"] != IGNORE_INDEX),
                "discriminator_accuracy_replaced": masked_mean(correct, is_replaced & real),
                "discriminator_accuracy_original": masked_mean(correct, ~is_replaced & real),
            },
        )

    @classmethod
    def hf_exports(cls, state_dict: dict, config: dict) -> dict:
        """The discriminator as `ElectraForPreTraining` (the export directory itself) and the
        generator as `ElectraForMaskedLM` (its `generator/` subdirectory)."""
        from pretrain.export.electra import pretraining_models

        return pretraining_models(state_dict, config)

    def load_pretrained(self, state_dict: dict[str, torch.Tensor], source: str) -> None:
        """Initialise from a checkpoint of this objective, or from an ELECTRA export directory
        (the discriminator; the generator too when `<source>/generator` exists, whose sizes
        must match this run's and whose embeddings must equal the discriminator's)."""
        from pretrain.export.electra import generator_weights

        state = dict(state_dict)
        generator_dir = Path(source) / "generator"
        if generator_dir.is_dir():
            state.update(generator_weights(generator_dir, self.generator_model_config, state))
        for key, tensor in list(state.items()):  # the shared module, under its second name
            if key.startswith("encoder.embeddings."):
                state["generator." + key.removeprefix("encoder.")] = tensor
        super().load_pretrained(state, source)
