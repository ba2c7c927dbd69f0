"""Attention over packed documents with an optional sliding window (ModernBERT's layers).

A row of a batch may hold several documents (packed) and padding. Each token has a document
key: the row's `document_ids` (documents numbered along the row, non-decreasing; 0 for every
token when the batch is not packed) at real tokens, -1 at padding. A query attends to the
keys of its own document only, and in a local layer only to those within `half_window`
positions on either side (ModernBERT: |q - k| <= 64 for a 128-token window). Padding attends
to padding, so no row is empty (an empty row would give NaN); its outputs are meaningless.

Attention runs on the (batch, seq) grid, masked by a dense boolean (batch, 1, seq, seq) mask
for `torch.nn.functional.scaled_dot_product_attention` (SDPA), or by a FlexAttention
`BlockMask`, which skips the blocks outside a document or the window and those of padding. Positions restart at 0 at each document's first token, so a packed
document is encoded as if it were alone in its row.
"""

import functools

import torch
from torch import Tensor

from pretrain.errors import ConfigError
from pretrain.models.configs import ATTENTION_BACKENDS


def flex_available() -> bool:
    """Whether this torch has FlexAttention (`torch.nn.attention.flex_attention`, torch 2.5+)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def uses_flex(backend: str, device: torch.device, dropout: float) -> bool:
    """Whether attention runs through FlexAttention: `model.attention_backend` = flex (an error
    where torch lacks it), or auto on CUDA with FlexAttention and no attention dropout (flex
    has none); SDPA otherwise."""
    if backend not in ATTENTION_BACKENDS:
        raise ConfigError(
            f"model.attention_backend = {backend!r}: must be one of {', '.join(ATTENTION_BACKENDS)}"
        )
    if backend == "flex":
        if not flex_available():
            raise ConfigError(
                "model.attention_backend=flex: this torch has no FlexAttention (torch >= 2.5); "
                "set model.attention_backend=sdpa"
            )
        return True
    return backend == "auto" and device.type == "cuda" and dropout == 0 and flex_available()


def document_keys(attention_mask: Tensor | None, document_ids: Tensor | None, shape) -> Tensor:
    """(batch, seq) int64 document key of every grid position: `document_ids` (or 0) at real
    tokens, -1 at padding (attention_mask 0). `shape`: (batch, seq) of the input ids."""
    keys = torch.zeros(shape, dtype=torch.long, device=_device(attention_mask, document_ids))
    if document_ids is not None:
        keys = document_ids.long()
    if attention_mask is not None:
        keys = torch.where(attention_mask.bool(), keys, -1)
    return keys


def document_inputs(batch: dict) -> dict[str, Tensor]:
    """The encoder's keyword arguments for what a batch carries about its rows' context, if
    it does: packed rows' `document_ids` (data.document_masks) and each row's
    `global_rope_theta` (a context-extension stage, `data/stages.py`)."""
    return {key: batch[key] for key in ("document_ids", "global_rope_theta") if key in batch}


def _device(*tensors: Tensor | None) -> torch.device | None:
    return next((t.device for t in tensors if t is not None), None)


def document_positions(keys: Tensor) -> Tensor:
    """(..., seq) document keys -> (..., seq) int64 positions, 0 at each document's first
    token (where the key changes along the row) and counting up to its last."""
    seq = keys.shape[-1]
    index = torch.arange(seq, device=keys.device).expand_as(keys)
    starts = torch.ones_like(keys, dtype=torch.bool)
    starts[..., 1:] = keys[..., 1:] != keys[..., :-1]
    first = torch.where(starts, index, 0).cummax(dim=-1).values  # each token's document start
    return index - first


def dense_mask(
    keys: Tensor | None, half_window: int | None, seq: int, device: torch.device
) -> Tensor | None:
    """(batch, seq) document keys (None: one document filling every row) -> boolean
    (batch or 1, 1, seq, seq) mask (True = the query may attend to the key): same document,
    and |q - k| <= half_window when given; None when every position sees every other."""
    window = half_window is not None and half_window < seq - 1
    if keys is None and not window:
        return None
    allowed = None if keys is None else keys[:, :, None] == keys[:, None, :]  # (batch, seq, seq)
    if window:
        band = torch.ones(seq, seq, dtype=torch.bool, device=device)
        near = band.tril(half_window).triu(-half_window)[None]  # (1, seq, seq): |q - k| <= w
        allowed = near if allowed is None else allowed & near
    return allowed[:, None]


def block_mask(
    keys: Tensor | None,
    half_window: int | None,
    seq: int,
    device: torch.device,
    compile_backend: str | None = None,
):
    """(batch, seq) document keys (None: one document filling every row) -> a FlexAttention
    BlockMask over the grid: same document, and |q - k| <= half_window when given. Padding
    queries see nothing (FlexAttention gives them zeros), so blocks of padding are skipped.
    None when every position sees every other.

    Built once per shape: a mask without keys depends on (window, seq, device) alone and is
    kept (`static_block_mask`); one over documents differs per batch and is built by one
    `torch.compile(create_block_mask)` (CUDA, or `compile_backend`), whose graph serves every
    batch of a shape (the keys are its input), block by block, never the dense mask."""
    if keys is None and half_window is None:
        return None
    if keys is None:
        return static_block_mask(half_window, seq, str(device))

    def visible(batch, head, query, key):
        near = (query - key).abs() <= half_window if half_window is not None else query >= 0
        same = (keys[batch, query] == keys[batch, key]) & (keys[batch, query] >= 0)
        return same & near

    if compile_backend is None and device.type == "cuda":
        compile_backend = "inductor"
    return mask_builder(compile_backend)(visible, keys.shape[0], None, seq, seq, device=device)


@functools.cache
def mask_builder(compile_backend: str | None):
    """`create_block_mask`, compiled once with `compile_backend` (None: eager)."""
    from torch.nn.attention import flex_attention as flex

    if compile_backend is None:
        return flex.create_block_mask
    return torch.compile(flex.create_block_mask, backend=compile_backend)


@functools.lru_cache(maxsize=64)
def static_block_mask(half_window: int, seq: int, device: str):
    """The BlockMask of a `half_window` band over `seq` positions (no documents, no padding),
    shared by every row, head and forward pass of that length on `device`."""
    from torch.nn.attention import flex_attention as flex

    def near(batch, head, query, key):
        return (query - key).abs() <= half_window

    return flex.create_block_mask(near, None, None, seq, seq, device=device)


_compiled_flex = None


def flex_attention(query: Tensor, key: Tensor, value: Tensor, mask) -> Tensor:
    """FlexAttention of (batch, heads, seq, head) query, key and value under BlockMask `mask`;
    compiled (fused kernels) on CUDA, the eager reference elsewhere (torch has no
    FlexAttention backward on a CPU: there it serves inference and tests)."""
    global _compiled_flex
    from torch.nn.attention import flex_attention as flex

    if query.device.type != "cuda":
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without")
            return flex.flex_attention(query, key, value, block_mask=mask)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex.flex_attention)
    return _compiled_flex(query, key, value, block_mask=mask)
