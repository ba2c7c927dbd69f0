"""Memory against the step of the family demos (issue 18).

Runs `pretrain experiment=<demo>` for `--steps` optimizer steps per demo (CSV logger, a
scratch run directory, logging every `--every` steps), reads the run's own memory metrics
from its metrics.csv (`sys/host_memory_gb`: PSS of the main process and its data-loader
workers, `pretrain.runtime.memory`; and `sys/host_anon_memory_gb`, the PSS of their anonymous and
shared-memory pages, which other processes on the machine do not move), prints a table of memory against the step and the growth from
`--from-step` to the last step, and writes a PNG when matplotlib is installed.

    .venv/bin/python benchmarks/memory.py --demos demo electra_demo xlnet_demo \
        --steps 600 --every 50 --png benchmarks/figures/memory_vs_step.png

The demos read the built-in corpora (`make demo-families` prepares them); distilbert_demo
needs the demo's checkpoint as its teacher (`make demo`, or the `demo` run of the same
`--runs-dir`). Extra Hydra overrides for every run follow `--`, e.g. `-- data.num_workers=0`.
With `--runs-dir` the runs are kept there and a demo whose run already reached `--steps` is
read, not run again: one demo at a time, then all of them in one table and one PNG
(`--read-only`: only read what the runs logged, e.g. of a run stopped early).
"""

import argparse
import csv
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COLUMNS = ("sys/host_memory_main_gb", "sys/host_memory_workers_gb", "sys/host_memory_gb")
ANON = "sys/host_anon_memory_gb"  # NaN in runs logged before it existed


def run_demo(demo: str, steps: int, every: int, run_dir: Path, extra: list[str]) -> None:
    """Train `demo` for `steps` optimizer steps in `run_dir` (a new run); raises on a failed
    run."""
    command = [
        str(Path(sys.executable).parent / "pretrain"),
        f"experiment={demo}",
        f"trainer.max_steps={steps}",
        f"trainer.log_every_n_steps={every}",
        f"trainer.checkpoint_every_n_steps={10 * steps}",  # only the final checkpoint
        "logger=csv",
        f"run_dir={run_dir}",
        "resume=never",
        "trainer.enable_progress_bar=false",
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{demo}: exit {result.returncode}\n{result.stderr[-3000:]}")


def memory_rows(run_dir: Path) -> list[tuple[int, float, float, float, float]]:
    """(step, main GiB, workers GiB, total GiB, anonymous GiB) of every logged step of the
    run; `step` as logged: the index of the step, so step 299 is measured after 300 optimizer
    steps."""
    rows = []
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("sys/host_memory_gb"):
                    values = (float(row[c]) for c in COLUMNS)
                    rows.append((int(row["step"]), *values, float(row.get(ANON) or "nan")))
    return sorted(rows)


def growth(rows: list[tuple], from_step: int) -> float:
    """Relative growth of the total from the first logged step at or after `from_step`
    optimizer steps to the last."""
    start = next((r for r in rows if r[0] + 1 >= from_step), rows[0])
    return rows[-1][3] / start[3] - 1


def robust_growth(
    rows: list, from_step: int, window: int = 5, column: int = 3
) -> tuple[float, float]:
    """(median of the last `window` totals over the median of the first `window` at or after
    `from_step`, minus 1; the least-squares line's rise over the same steps, relative to its
    start), of the total (`column` 3) or the anonymous pages (4): one logged point catches its step's transient allocations (about +-5% here),
    these two do not."""
    points = [(r[0], r[column]) for r in rows if r[0] + 1 >= from_step] or [
        (r[0], r[column]) for r in rows
    ]
    head, tail = points[:window], points[-window:]
    level = statistics.median(v for _, v in tail) / statistics.median(v for _, v in head) - 1
    if len(points) < 2:
        return level, 0.0
    slope, intercept = statistics.linear_regression([s for s, _ in points], [v for _, v in points])
    first, last = points[0][0], points[-1][0]
    return level, slope * (last - first) / (intercept + slope * first)


def percent(value: float) -> str:
    """A growth as a signed percentage; "-" for NaN (a run logged before the figure existed)."""
    return "-" if math.isnan(value) else f"{value:+.1%}"


def plot(results: dict[str, list], path: Path) -> bool:
    """Memory against the step: per demo, main + workers (solid) and the main process alone
    (dashed, same colour; the legend, outside the axes, names each demo once); False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for demo, rows in results.items():
        steps = [r[0] for r in rows]
        (line,) = axis.plot(steps, [r[3] for r in rows], marker=".", label=demo)
        axis.plot(steps, [r[1] for r in rows], "--", color=line.get_color())
    axis.set_title("main process + data-loader workers (solid), main process (dashed)")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("PSS (GiB)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", nargs="+", default=["demo", "electra_demo", "xlnet_demo"])
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps per demo")
    parser.add_argument("--every", type=int, default=50, help="log (and measure) every N steps")
    parser.add_argument("--from-step", type=int, default=300, help="growth measured from here")
    parser.add_argument("--png", type=Path, default=Path("benchmarks/figures/memory_vs_step.png"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    parser.add_argument("--runs-dir", type=Path, help="keep the runs here (default: scratch)")
    parser.add_argument("--read-only", action="store_true", help="run nothing: read --runs-dir")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        runs = args.runs_dir or Path(scratch)
        for demo in args.demos:
            run_dir = runs / demo
            rows = memory_rows(run_dir) if run_dir.is_dir() else []
            if not args.read_only and (not rows or rows[-1][0] < args.steps - args.every):
                teacher = runs / "demo" / "checkpoints" / "last.ckpt"
                extra = (
                    [f"objective.teacher={teacher}"]
                    if demo == "distilbert_demo" and teacher.is_file()
                    else []
                )
                shutil.rmtree(run_dir, ignore_errors=True)
                run_demo(demo, args.steps, args.every, run_dir, [*extra, *args.overrides])
                rows = memory_rows(run_dir)
            if not rows:
                print(f"== {demo}: no memory logged in {run_dir}", flush=True)
                continue
            results[demo] = rows
            print(f"== {demo}: step, main, workers, total, anonymous (GiB, PSS)", flush=True)
            for step, *sizes in results[demo]:
                print(f"{step:6d}" + "".join(f" {size:7.3f}" for size in sizes), flush=True)
    print(
        f"\n| demo | total at step >= {args.from_step} | total at the last step | growth "
        "(points) | growth (medians of 5) | trend (least squares) | anonymous pages: medians "
        "of 5, trend |"
    )
    print("|---|---|---|---|---|---|---|")
    for demo, rows in results.items():
        start = next((r for r in rows if r[0] + 1 >= args.from_step), rows[0])
        level, trend = robust_growth(rows, args.from_step)
        anon_level, anon_trend = robust_growth(rows, args.from_step, column=4)
        print(
            f"| {demo} | {start[3]:.3f} GiB (step {start[0]}) | {rows[-1][3]:.3f} GiB "
            f"(step {rows[-1][0]}) | {growth(rows, args.from_step):+.1%} | {level:+.1%} | "
            f"{trend:+.1%} | {percent(anon_level)}, {percent(anon_trend)} |"
        )
    if plot(results, args.png):
        print(f"\nwrote {args.png}")


if __name__ == "__main__":
    main()
