"""The `sys/` memory metrics (issue 18): PSS counts pages shared with a forked worker once, and
the anonymous-page figure follows what the run allocates."""

import os
import sys

import pytest
import torch

from pretrain.runtime.memory import GB, memory_metrics

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/proc/self/smaps_rollup"),
    reason="PSS needs Linux's smaps_rollup",
)


def test_a_tensor_is_counted_once_in_the_process_and_its_forked_child():
    before = memory_metrics()  # other tests' servers may be children of this process
    assert "sys/host_anon_memory_gb" in before
    held = torch.ones(2**26)  # 256 MiB, every page written
    grown = memory_metrics()
    for key in ("sys/host_memory_gb", "sys/host_anon_memory_gb"):
        assert grown[key] - before[key] == pytest.approx(held.numel() * 4 / GB, abs=0.03), key
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a worker holding the parent's pages copy-on-write, until told to go
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    try:
        os.close(read)
        shared = memory_metrics()
        assert shared["sys/workers"] == before["sys/workers"] + 1
        # the 256 MiB are shared, not doubled: half of them counted in each process
        assert shared["sys/host_memory_gb"] == pytest.approx(grown["sys/host_memory_gb"], abs=0.03)
        assert shared["sys/host_memory_workers_gb"] > 0.1
        assert shared["sys/host_memory_main_gb"] < grown["sys/host_memory_main_gb"] - 0.1
    finally:
        os.write(write, b"x")
        os.close(write)
        os.waitpid(child, 0)
    del held
