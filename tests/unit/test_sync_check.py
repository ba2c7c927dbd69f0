"""benchmarks/sync_check.py's CPU stand-in for CUDA's sync debug mode (issue 18 item 2): it
stops at the operators that make the host wait on CUDA, and lets the sync-free ones through."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from sync_check import HostSyncOps  # noqa: E402

HIDDEN = torch.randn(2, 6, 4, requires_grad=True)
MASK = torch.tensor([[True, False, True, False, False, False], [False] * 5 + [True]])
POSITIONS = torch.tensor([[0, 2], [5, -1]])  # a static budget of 2 slots, one ignored


@pytest.mark.parametrize(
    "syncing",
    [
        lambda: HIDDEN[MASK],  # boolean-mask indexing: the row count is on the device
        lambda: HIDDEN.sum().item(),
        lambda: bool(HIDDEN.sum() > 0),
        lambda: MASK.nonzero(),
        lambda: HIDDEN.masked_select(MASK[..., None]),
        lambda: torch.unique(POSITIONS),
        lambda: torch.repeat_interleave(torch.tensor([1, 2])),
        lambda: HIDDEN.detach().clone().index_put_((MASK,), torch.zeros(3, 4)),
    ],
)
def test_an_operator_that_waits_for_the_device_is_stopped(syncing):
    with HostSyncOps(), pytest.raises(RuntimeError, match="synchronises with the host"):
        syncing()


def test_the_static_budgets_gather_and_its_backward_pass():
    from pretrain.objectives.predictions import gather_positions, gather_targets

    labels = torch.randint(0, 9, (2, 6))
    with HostSyncOps():
        picked = gather_positions(HIDDEN, POSITIONS)  # (4, 4), the ignored slot reads row 0
        targets = gather_targets(labels, POSITIONS)
        (picked * (targets != -100)[:, None]).sum().backward()
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
    assert picked.shape == (4, 4) and targets[-1] == -100
    assert HIDDEN.grad[1, 5].eq(1).all() and HIDDEN.grad[1, 0].eq(0).all()
