"""The unpadded encoder path (MosaicBERT-style): the dense layers (qkv and
output projections, feed-forward, LayerNorms) run on the real tokens of a batch only.

After the embeddings, the encoder gathers the (batch, seq) grid's real tokens into a
(tokens, hidden) tensor; each attention scatters its qkv back onto the grid, runs the padded
SDPA with the key-padding mask and gathers the context again; the sequence output is
scattered back to (batch, seq, hidden) at the end (padding positions meaningless, as on the
padded path). The outputs at real tokens equal the padded path's up to float rounding.

Bounded shapes: the row count is the batch's real-token count rounded up to one of
`unpadded_widths(batch x seq)`: at most `UNPADDED_BUCKETS` multiples of a step that is a
multiple of 8 tokens (the grid's size / 16, rounded up: 256 for 32 x 128, 1,024 for
32 x 512), the last the whole grid. The rows past the real tokens are padding positions (a
batch has at least as many as the rounding adds), computed like the padded path computes
them and dropped when scattered back. Per (batch, seq) input shape a run thus sees at most
16 unpadded shapes.

Attention is the one layer that does not run on the real tokens alone: torch has no
variable-length (packed, `cu_seqlens`) attention kernel on the CPU (nested-jagged tensors'
SDPA falls back to the math kernel, which pads again), so the context is computed on the grid
under the key-padding mask. On CUDA, ModernBERT's FlexAttention (model.attention_backend auto
or flex) skips every block of padding through its BlockMask, which is the variable-length
saving; BERT's SDPA with a mask takes the memory-efficient kernel there (FlashAttention takes
no mask), and a batch without padding gets no mask at all (`mark_padding`, `encoder_mask`).

`model.unpad` selects the path: `true`, `false`, or `auto` (unpadded on CUDA for batches with
padding to drop, padded on the CPU, where it measures no faster: benchmarks/RESULTS.md). The
layout's index is computed on the host before the batch moves to the device
(`PretrainingTask.host_batch` adds it as the batch's `unpadded_index`), so
the training step reads no token count from the device. Under `auto` an
encoder unpads only a batch that brings its index; under `true` it counts the real tokens
itself when the batch has none (one synchronisation on CUDA).
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pretrain.errors import ConfigError

UNPADDED_BUCKETS = 16  # at most this many unpadded row counts per (batch, seq) shape
UNPAD_CHOICES = ("auto", "true", "false")


def unpadded_widths(grid_tokens: int) -> tuple[int, ...]:
    """The row counts (tokens) an unpadded batch of `grid_tokens` = batch x seq positions can
    have: multiples of a step (grid / `UNPADDED_BUCKETS` rounded up to a multiple of 8), then
    `grid_tokens` itself."""
    step = 8 * math.ceil(grid_tokens / UNPADDED_BUCKETS / 8)
    return (*range(step, grid_tokens, step), grid_tokens)


@dataclass(frozen=True)
class Unpadded:
    """Where the rows of an unpadded (tokens, features) tensor lie on the (batch, seq) grid:
    `index` (tokens,) flat positions, the real tokens in order, then padding positions up to
    the bucket; `attend` the (batch, 1, 1, seq) key-padding mask of the grid."""

    index: Tensor
    batch: int
    seq: int
    attend: Tensor

    def gather(self, grid: Tensor) -> Tensor:
        """(batch, seq, features) -> (tokens, features)."""
        return grid.reshape(self.batch * self.seq, -1).index_select(0, self.index)

    def scatter(self, rows: Tensor) -> Tensor:
        """(tokens, features) -> (batch, seq, features), zeros where no row lands."""
        grid = rows.new_zeros(self.batch * self.seq, rows.shape[-1])
        return grid.index_copy(0, self.index, rows).view(self.batch, self.seq, -1)


def unpadded_index(attention_mask: Tensor) -> Tensor:
    """(tokens,) int64: the flat positions of a (batch, seq) attention mask's real tokens (1),
    in order, then padding positions up to the next of `unpadded_widths(batch x seq)`."""
    batch, seq = attention_mask.shape
    padding = attention_mask.reshape(-1) == 0  # (batch x seq,)
    width = next(w for w in unpadded_widths(batch * seq) if w >= int((~padding).sum()))
    return torch.argsort(padding.to(torch.uint8), stable=True)[:width]  # real positions first


def unpadding(attention_mask: Tensor, attend: Tensor, index: Tensor | None = None) -> Unpadded:
    """The layout of a (batch, seq) attention mask with key mask `attend` (batch, 1, 1, seq):
    `index` (from `unpadded_index`, computed on the host), or computed here."""
    batch, seq = attention_mask.shape
    return Unpadded(unpadded_index(attention_mask) if index is None else index, batch, seq, attend)


def unpads(setting: str, attention_mask: Tensor | None, index: Tensor | None) -> bool:
    """Whether an encoder with `model.unpad` = `setting` runs a batch with this attention
    mask (never without one) and `unpadded_index` (or None) unpadded: `true` always, `auto`
    when the batch brings its index."""
    if attention_mask is None:
        return False
    return setting == "true" or (setting == "auto" and index is not None)


def with_unpadded_index(batch: dict, encoder: nn.Module | None, device: torch.device) -> dict:
    """`batch` with its `unpadded_index` (`unpadded_index` of its attention mask, computed
    where the batch is, on the host) when `encoder` runs it unpadded on `device`: under
    `true`, and under `auto` on CUDA when the index drops some padding."""
    setting = getattr(encoder, "unpad", "false")
    if not isinstance(batch, dict) or "attention_mask" not in batch:
        return batch
    if batch.get("has_padding") is False:
        return batch  # the encoder gets no mask (`encoder_mask`): nothing to unpad
    if setting == "true" or (setting == "auto" and device.type == "cuda"):
        index = unpadded_index(batch["attention_mask"])
        if setting == "true" or index.numel() < batch["attention_mask"].numel():
            batch["unpadded_index"] = index
    return batch


def mark_padding(batch: dict) -> dict:
    """`batch` with `has_padding` (a Python bool): whether its (batch, seq) attention mask has
    a padding position. Read on the host, where the batch is built, so that an encoder can
    pass no mask to SDPA for an unpadded batch (FlashAttention takes none) without reading
    the mask back from the device."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    if isinstance(mask, Tensor) and mask.dim() == 2 and mask.device.type == "cpu":
        batch["has_padding"] = bool((mask == 0).any())
    return batch


def encoder_mask(batch: dict) -> Tensor | None:
    """The attention mask to give the encoder: None when the host found no padding in the
    batch (`mark_padding`; every key visible, as the all-ones mask says), else the batch's."""
    return None if batch.get("has_padding") is False else batch["attention_mask"]


def unpadded_inputs(batch: dict) -> dict[str, Tensor]:
    """The encoder's keyword arguments for the batch's `unpadded_index`, if it has one."""
    return {"unpadded_index": batch["unpadded_index"]} if "unpadded_index" in batch else {}


def gather_real(hidden: Tensor, attend: "Tensor | Unpadded | None") -> Tensor:
    """(batch, seq, hidden) -> (tokens, hidden) when `attend` is an Unpadded, else as is."""
    return attend.gather(hidden) if isinstance(attend, Unpadded) else hidden


def scatter_real(hidden: Tensor, attend: "Tensor | Unpadded | None") -> Tensor:
    """(tokens, hidden) -> (batch, seq, hidden) when `attend` is an Unpadded, else as is."""
    return attend.scatter(hidden) if isinstance(attend, Unpadded) else hidden


def describe_unpadded_rows(module: nn.Module) -> str:
    """The part of the run's shape line for `module`'s encoder: its unpadded row counts when
    it runs unpadded, else ''."""
    if getattr(getattr(module, "encoder", None), "unpad", "false") != "true":
        return ""
    return f", unpadded rows: at most {UNPADDED_BUCKETS} buckets per input shape (model.unpad)"


def set_unpadding(encoder: nn.Module, setting: str) -> None:
    """Give `encoder` the `model.unpad` setting; ConfigError for `true` on an encoder without
    the unpadded path (its class has no `unpad` attribute)."""
    setting = str(setting).lower()
    if setting not in UNPAD_CHOICES:
        raise ConfigError(f"model.unpad = {setting!r}: must be one of {', '.join(UNPAD_CHOICES)}")
    if hasattr(type(encoder), "unpad"):
        encoder.unpad = setting
    elif setting == "true":
        raise ConfigError(
            f"model.unpad=true: {type(encoder).__name__} has no unpadded path (BERT, RoBERTa, "
            "ALBERT, ELECTRA and DistilBERT have one); set model.unpad=auto or false"
        )
