"""The run's memory, read at logging steps (`sys/*` metrics), so a dashboard shows a leak the
day it appears.

Host memory is counted per process as PSS (proportional set size: pages shared with other
processes, such as the data-loader workers forked from the main process, count once in all,
divided among the sharers), from /proc/<pid>/smaps_rollup; where the kernel has no
smaps_rollup, RSS (from /proc/<pid>/statm, or psutil off Linux), which counts shared pages
in every process. The workers are the main process's descendants (data-loader workers;
any other helper the run started is counted with them; under Lightning's subprocess DDP
launcher, rank 0's count includes the other local ranks, which it started). On CUDA, the peak allocated and
reserved memory of the caching allocator since the start: host-side counters, no device
synchronisation.

Beside the PSS of all pages, `host_anon_memory_gb` counts only the anonymous and shared-memory
pages (Pss_Anon + Pss_Shmem: the heap, tensors, batches passed from the workers): what a leak
grows. The PSS of the mapped library files also moves when unrelated processes on the machine
start or end (their share of the same files changes); this figure does not.
"""

import os
from pathlib import Path

import torch

GB = 1024**3
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_memory_bytes(pid: int) -> tuple[int, int | None] | None:
    """(PSS, PSS of anonymous and shared-memory pages) of process `pid` in bytes; (RSS, None)
    where smaps_rollup is not available; None when the process is gone or cannot be read."""
    try:
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                fields[name] = int(value.split()[0]) * 1024
        if "Pss" in fields:
            anon = fields.get("Pss_Anon", 0) + fields.get("Pss_Shmem", 0)
            return fields["Pss"], anon if "Pss_Anon" in fields else None
    except OSError:
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES, None
    except OSError:
        pass
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss, None
    except Exception:  # no psutil, or the process is gone
        return None


def descendant_pids(pid: int) -> list[int]:
    """The process ids descending from `pid` (children, their children, ...: data-loader
    workers forked directly, or by a forkserver the run started), from /proc/<id>/stat;
    psutil off Linux."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            import psutil

            return [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except Exception:
            return []
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])  # after "pid (command) state"
        children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        found += frontier
    return found


def memory_metrics(device: torch.device | None = None) -> dict[str, float]:
    """`sys/` metrics of this process and its descendants: host_memory_gb (main + workers),
    host_memory_main_gb, host_memory_workers_gb, host_anon_memory_gb (main + workers, where
    the kernel reports it), workers (count), in GiB; on a CUDA `device`
    also cuda_max_allocated_gb and cuda_max_reserved_gb (peaks since the start)."""
    main = process_memory_bytes(os.getpid()) or (0, None)
    workers = [process_memory_bytes(pid) for pid in descendant_pids(os.getpid())]
    workers = [sizes for sizes in workers if sizes is not None]
    workers_total = sum(size for size, _ in workers)
    metrics = {
        "sys/host_memory_gb": (main[0] + workers_total) / GB,
        "sys/host_memory_main_gb": main[0] / GB,
        "sys/host_memory_workers_gb": workers_total / GB,
        "sys/workers": float(len(workers)),
    }
    anon = [main[1], *(size for _, size in workers)]
    if None not in anon:
        metrics["sys/host_anon_memory_gb"] = sum(anon) / GB
    if device is not None and device.type == "cuda":
        metrics["sys/cuda_max_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GB
        metrics["sys/cuda_max_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GB
    return metrics
