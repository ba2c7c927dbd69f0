"""The random state of a process (torch, CUDA, numpy, Python) as checkpoint-safe containers:
what a checkpoint stores so that a resumed run draws what the interrupted one would have."""

import random

import numpy as np
import torch


def rng_state() -> dict:
    """Torch, numpy and Python random states as checkpoint-safe containers."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = {
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": pos,
        "has_gauss": has_gauss,
        "gauss": gauss,
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
