"""A batch as it crosses from a data-loader worker to the main process (issue 54 item 6).

Every tensor a worker hands over travels as its own shared-memory segment and file
descriptor (a socket round trip each); a batch of 7 int64 tensors cost more to move than to
build. `pack_batch` (the DataLoader's collate_fn in the workers) puts a batch's tensors into
one buffer of bytes, sent through the worker's pipe itself (no segment, no descriptor),
each integer tensor in the smallest dtype that holds its values (token ids
of a small vocabulary in int16, masks in uint8, ...) and a tensor of one repeated value
(token_type_ids of one segment) as that value alone; `unpack_batch` (in the main process)
gives back tensors of the original dtypes, shapes and values, so nothing a run computes
changes. Values that are not tensors (keys, markers) pass as they are.
"""

import numpy as np
import torch

WIRE_KEY = "_wire"  # (layout, buffer) of a packed batch
ALIGN = 8  # bytes: each part starts at a multiple of it, so views of any dtype are aligned
# the dtypes an integer tensor may travel in, smallest first
NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
NUMPY_DTYPES |= {torch.float16, torch.float32, torch.float64}
NARROW = (np.uint8, np.int8, np.int16, np.int32, np.int64)


def wire_dtype(array: np.ndarray) -> np.dtype:
    """The smallest dtype that holds every value of the integer `array` (its own for other
    dtypes and for an empty array)."""
    if array.dtype.kind not in "iu" or array.size == 0:
        return array.dtype
    low, high = array.min(), array.max()
    for dtype in NARROW:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return np.dtype(dtype)
    return array.dtype


def pack_batch(batch):
    """A batch (dict of tensors and other values) with its tensors in one buffer under
    WIRE_KEY (see the module docstring); anything but a dict, or a dict without tensors, is
    returned as it is."""
    if not isinstance(batch, dict) or not any(isinstance(v, torch.Tensor) for v in batch.values()):
        return batch
    layout, parts, offset, packed = [], [], 0, {}
    for name, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dtype not in NUMPY_DTYPES:
            layout.append((name, None, None, "as is", None))  # bfloat16 too: as before
            packed[name] = value
            continue
        array = value.detach().contiguous().numpy().reshape(-1)
        shape = tuple(value.shape)
        if array.size and array.dtype.kind in "iu" and array.min() == array.max():
            layout.append((name, value.dtype, shape, "fill", array[0].item()))
            continue
        raw = np.ascontiguousarray(array, wire_dtype(array))
        layout.append((name, value.dtype, shape, raw.dtype.str, offset))
        parts.append((offset, raw.view(np.uint8)))
        offset += -(-raw.nbytes // ALIGN) * ALIGN
    buffer = np.zeros(offset, np.uint8)
    for start, raw in parts:
        buffer[start : start + raw.size] = raw
    packed[WIRE_KEY] = (tuple(layout), buffer.tobytes())  # through the worker's pipe itself
    return packed


def unpack_batch(batch, pin_memory: bool = False):
    """The batch `pack_batch` packed, with tensors of their original dtypes, shapes and
    values, in its original order (in page-locked memory with `pin_memory`, on a CUDA
    machine); anything else as it is."""
    if not isinstance(batch, dict) or WIRE_KEY not in batch:
        return batch
    layout, data = batch.pop(WIRE_KEY)
    pinned = pin_memory and torch.cuda.is_available()
    unpacked = {}
    for name, dtype, shape, how, where in layout:
        if how == "as is":
            unpacked[name] = batch[name]
            continue
        tensor = torch.empty(shape, dtype=dtype, pin_memory=pinned)
        if how == "fill":
            tensor.fill_(where)
        else:
            count = tensor.numel()
            array = np.frombuffer(data, np.dtype(how), count, where).reshape(shape)
            tensor.numpy()[...] = array  # widened to the tensor's dtype
        unpacked[name] = tensor
    return unpacked
