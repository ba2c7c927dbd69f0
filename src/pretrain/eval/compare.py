"""`pretrain-compare RUN_OR_EXPERIMENT_DIR... [--out DIR]`: runs side by side, offline.

Reads each run's CSV logs (`<run>/csv/version_*/metrics.csv`, every launch of a resumed run),
config (the newest `hparams.yaml` beside them) and how its last launch ended
(`run_state.json`, `pretrain.runtime.run_state`), and writes to `--out` (default:
`<first dir>/report`) PNG figures (matplotlib, one line per run), `summary.csv` and
`report.html`, a single self-contained page (figures embedded). Its first table reads: the
run and its state (finished, preempted or failed at step s of max), the final losses
(training and held-out), the downstream results `pretrain-eval` wrote in the run
(`<run>/eval/<name>.json`: a column `eval/<name>/<metric>` each), progress and throughput,
a mixture's samples and tokens per source (`train/source/<name>/*`); the second, the config
keys that differ between the runs and change what is trained (logging, checkpointing,
kernel and worker settings, `checkpoint.relaunch.RELAUNCH_KEYS`, left out; a batch-size
sweep reads like RoBERTa's Table 3). `summary.csv` has both, in that order.
Figures: each kind of loss on its own axes (an MLM+NSP total is never drawn beside an
MLM-only loss: the total is drawn only when every run has the same objective, and not when
it repeats a term, as an MLM-only run's does; a mixture's held-out loss per source,
`val/source/<name>/loss`, is a loss of its own), against tokens seen and against wall-clock
seconds; throughput (tokens/s, model TFLOP/s by the FLOP model of pretrain/models/flops.py,
and MFU against the device peak where logged: not on CPU), learning rate and skipped steps
against tokens seen. Never needs wandb.
"""

import argparse
import base64
import csv
import html
import re
import sys
from fnmatch import fnmatch
from pathlib import Path

from pretrain.runtime.run_state import describe_run_state, read_run_state

# figure file -> (title, x axis, [(axis title, y column)]); x: tokens seen or seconds. The
# loss figures (`LOSS_FIGURES`) get one axis per loss kind the runs logged (`loss_panels`).
LOSS_FIGURES = {
    "loss_vs_tokens.png": ("Losses against tokens seen", "train/tokens_seen"),
    "loss_vs_time.png": ("Losses against wall-clock time", "train/elapsed_s"),
}
FIGURES = {
    **{name: (title, x, []) for name, (title, x) in LOSS_FIGURES.items()},
    "throughput.png": (
        "Throughput (a rank's)",
        "train/tokens_seen",
        [
            ("tokens/s", "train/tokens_per_s"),
            ("model TFLOP/s", "train/model_tflops"),  # pretrain/models/flops.py
            ("MFU", "train/mfu"),
        ],
    ),
    "lr.png": ("Learning rate", "train/tokens_seen", [("learning rate", "train/lr")]),
    "skipped_steps.png": (
        "Skipped optimizer steps (non-finite loss or gradient)",
        "train/tokens_seen",
        [("skipped steps (cumulative)", "train/skipped_steps")],
    ),
}
X_LABELS = {"train/tokens_seen": "tokens seen", "train/elapsed_s": "wall-clock seconds"}
# keys that name a run rather than describe it: never table columns
IDENTITY_KEYS = ("run_dir", "run_name", "experiment_name")
# keys of RELAUNCH_KEYS that do change what is trained, so a comparison shows them
COMPARED_RELAUNCH_KEYS = ("trainer.max_steps",)
PROGRESS_COLUMNS = (
    "step",
    "train/tokens_seen",
    "train/elapsed_s",
    "train/tokens_per_s",
    "train/mfu",
)


def is_loss(column: str) -> bool:
    """Whether a logged column is a loss (`train/loss`, `train/mlm_loss`, `val/nsp_loss`,
    a mixture's `val/source/<name>/loss`)."""
    prefix, _, name = column.partition("/")
    name = name.rpartition("/")[2]  # val/source/<name>/loss: its last part
    return prefix in ("train", "val") and (name == "loss" or name.endswith("_loss"))


def is_source_count(column: str) -> bool:
    """Whether a column is a mixture's samples or tokens of one source
    (`train/source/<name>/samples`, `.../tokens`)."""
    return column.startswith("train/source/") and column.endswith(("/samples", "/tokens"))


def loss_panels(metrics: list[dict], objectives: list[object]) -> list[tuple[str, str]]:
    """[(axis title, column)] of the loss figures: each loss kind any run logged, training
    then held-out; the total (`train/loss`, `val/loss`) only when every run has the same
    objective (totals of different objectives sum different terms)."""
    columns = sorted({c for m in metrics for c in m if is_loss(c) and m[c]})
    same_objective = len({repr(o) for o in objectives}) <= 1
    if not same_objective:  # totals (a source's held-out total too) sum different terms
        columns = [c for c in columns if c.rpartition("/")[2] != "loss"]
    columns = [c for c in columns if not total_repeats_a_term(c, columns, metrics)]
    names = {"train": "training", "val": "held-out"}
    order = sorted(columns, key=lambda c: (c.partition("/")[2] != "loss", c.partition("/")[2], c))
    return [
        (f"{names[c.partition('/')[0]]} {re.sub('[_/]', ' ', c.partition('/')[2])}", c)
        for c in order
    ]


def total_repeats_a_term(column: str, columns: list[str], metrics: list[dict]) -> bool:
    """Whether `column` is a total (`train/loss`, `val/loss`) that equals, at every step of
    every run, one of its terms (an MLM-only run's total is its MLM loss): a second axis
    with the same lines."""
    prefix, _, name = column.partition("/")
    terms = [c for c in columns if c.startswith(prefix + "/") and c != column]
    return name == "loss" and any(all(m.get(t) == m.get(column) for m in metrics) for t in terms)


def natural_order(path: Path) -> list:
    """Sort key of a run directory: numbers in its name by value (tiny-bs8 before tiny-bs32,
    lr0.0001 before lr0.001)."""
    parts = re.split(r"(\d+(?:\.\d+)?(?:e-?\d+)?)", path.name)
    return [(0, float(part), "") if i % 2 else (1, 0.0, part) for i, part in enumerate(parts)]


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories (those holding `csv/`) among `paths` and their subdirectories (an
    experiment or sweep directory), in `natural_order` within each path. SystemExit when none."""
    runs: list[Path] = []
    for path in map(Path, paths):
        if (path / "csv").is_dir():
            runs.append(path)
        else:
            runs += sorted((p.parent for p in path.glob("*/csv") if p.is_dir()), key=natural_order)
    if not runs:
        raise SystemExit(f"error: no run directory (one with csv/) in {', '.join(map(str, paths))}")
    return runs


def read_metrics(run_dir: Path) -> dict[str, dict[int, float]]:
    """{column: {step: value}} over every launch's metrics.csv (a later launch's value wins)."""
    columns: dict[str, dict[int, float]] = {}
    versions = sorted(
        run_dir.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])
    )
    for path in versions:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                step = int(row["step"])
                for key, value in row.items():
                    if key not in ("step", "epoch") and value not in ("", None):
                        columns.setdefault(key, {})[step] = float(value)
    return columns


def read_config(run_dir: Path) -> dict[str, object]:
    """The run's config flattened to dotted keys, from its newest CSV `hparams.yaml`."""
    import yaml

    found = sorted(run_dir.glob("csv/version_*/hparams.yaml"), key=lambda p: int(p.parent.name[8:]))
    if not found:
        return {}
    flat: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(yaml.safe_load(found[-1].read_text()) or {}, "")
    return flat


def differing_keys(configs: list[dict[str, object]]) -> list[str]:
    """Config keys whose values are not the same in every run (missing counts as a value) and
    that change what is trained: not a run's name, nor a key of the relaunch policy's
    `RELAUNCH_KEYS` (logging, checkpointing, kernels, workers) but `COMPARED_RELAUNCH_KEYS`."""
    from pretrain.checkpoint.relaunch import RELAUNCH_KEYS

    ignored = [k for k in RELAUNCH_KEYS if k not in COMPARED_RELAUNCH_KEYS]
    keys = sorted(set().union(*configs)) if configs else []
    return [
        k
        for k in keys
        if k not in IDENTITY_KEYS
        and not any(fnmatch(k, pattern) for pattern in ignored)
        and len({repr(c.get(k)) for c in configs}) > 1
    ]


def run_status(run_dir: Path, final: dict, config: dict) -> str:
    """How the run's last launch ended (`run_state.json`), else judged from its last logged
    step against its config's trainer.max_steps."""
    max_steps = config.get("trainer.max_steps")
    return describe_run_state(
        read_run_state(run_dir),
        int(final["step"]) if "step" in final else None,
        max_steps if isinstance(max_steps, int) else None,
    )


def x_values(
    metrics: dict[str, dict[int, float]], x: str, steps: list[int], after: int
) -> list[float]:
    """The x value (`x`: tokens seen or seconds) after `steps[i] + after` optimizer steps: a
    training row's step s is its batch's (s + 1 steps taken, `after` = 1), a held-out row's
    step the steps taken (`after` = 0). `x` is logged in training rows (so at s + 1 steps),
    interpolated linearly from 0 at 0 steps; the steps themselves when the run has no `x`."""
    import numpy as np

    known = metrics.get(x)
    if not known:
        return [float(s + after) for s in steps]
    taken = sorted(known)
    xs, ys = [0, *(s + 1 for s in taken)], [0.0, *(known[s] for s in taken)]
    return list(np.interp([s + after for s in steps], xs, ys))


def final_metrics(metrics: dict[str, dict[int, float]]) -> dict[str, float]:
    """The optimizer steps the run took ("step"; a training row's step s is its batch's, after
    which s + 1 steps were taken), and the last logged value of each column of
    `PROGRESS_COLUMNS`, every loss (`is_loss`), every `val/*` and a mixture's per-source
    counts (`is_source_count`)."""
    taken = [max(v) + (0 if k.startswith("val/") else 1) for k, v in metrics.items() if v]
    final = {"step": float(max(taken, default=0))}
    for key, values in metrics.items():
        if (
            key in PROGRESS_COLUMNS
            or is_loss(key)
            or key.startswith("val/")
            or is_source_count(key)
        ):
            final[key] = values[max(values)]
    return final


def eval_results(run_dir: Path) -> dict[str, float]:
    """`eval/<name>/<metric>` -> value of every downstream result `pretrain-eval` wrote in
    the run (`<run_dir>/eval/<name>.json`, `<name>` the result's name); empty when none."""
    import json

    found: dict[str, float] = {}
    for path in sorted((run_dir / "eval").glob("*.json")):
        try:
            metrics = json.loads(path.read_text())["metrics"]
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(
                f"error: {path}: not a pretrain-eval result ({error!r}); move it out of eval/"
            ) from error
        found.update({f"eval/{path.stem}/{name}": float(v) for name, v in metrics.items()})
    return found


def plot_figures(
    runs: dict[str, dict], out: Path, losses: list[tuple[str, str]]
) -> dict[str, dict[str, list[str]]]:
    """Write the `FIGURES` PNGs for `runs` ({label: metrics}) to `out`, the loss figures with
    the axes `losses` (`loss_panels`), the others with the axes some run logged (no MFU axis
    on CPU); returns {file: {axis title: labels of its lines}} (one line per run that logged
    the column), without the figures no run logged anything for (their files removed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn: dict[str, dict[str, list[str]]] = {}
    for name, (title, x, panels) in FIGURES.items():
        logged = [p for p in panels if any(m.get(p[1]) for m in runs.values())]
        panels = (losses or [("loss", "train/loss")]) if name in LOSS_FIGURES else logged
        if not panels:
            (out / name).unlink(missing_ok=True)
            continue
        columns = min(len(panels), 3)
        rows = -(-len(panels) // columns)
        figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
        drawn[name] = {}
        for axis, (panel, column) in zip(axes.flat, panels, strict=False):
            for label, metrics in runs.items():
                values = metrics.get(column)
                if not values:
                    continue
                steps = sorted(values)
                after = 0 if column.startswith("val/") else 1
                axis.plot(
                    x_values(metrics, x, steps, after), [values[s] for s in steps], label=label
                )
            drawn[name][panel] = [line.get_label() for line in axis.get_lines()]
            axis.set(title=panel, xlabel=X_LABELS.get(x, x), ylabel=panel)
            axis.grid(alpha=0.3)
            if axis.get_lines():
                axis.legend(fontsize="small")
            else:
                axis.text(0.5, 0.5, f"no {column} logged", ha="center", transform=axis.transAxes)
        for axis in list(axes.flat)[len(panels) :]:
            axis.set_visible(False)
        if len(panels) > 1:  # one axis has its own title
            figure.suptitle(title)
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
    return drawn


def format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_table(
    labels: list[str], statuses: list[str], configs: list[dict], finals: list[dict]
) -> tuple[list[str], list[list[str]], int]:
    """(header, rows, split): run and state, the final losses (training, then held-out; a
    total that repeats a term left out, `total_repeats_a_term`), downstream results
    (`eval/*`), progress and throughput, a mixture's per-source samples and tokens, other
    held-out metrics, then, from column `split`
    on, the differing config keys that change training (`differing_keys`); blank where a run
    lacks one."""
    present = sorted({k for f in finals for k in f})
    losses = sorted((k for k in present if is_loss(k)), key=lambda k: (k[:3] == "val", k))
    losses = [k for k in losses if not total_repeats_a_term(k, losses, finals)]
    results = [k for k in present if k.startswith("eval/")]
    progress = [c for c in PROGRESS_COLUMNS if c in present]
    sources = [k for k in present if is_source_count(k)]
    other = [k for k in present if k.startswith("val/") and not is_loss(k)]
    metrics = [*losses, *results, *progress, *sources, *other]
    keys = differing_keys(configs)
    header = ["run", "status", *metrics, *keys]
    rows = [
        [
            label,
            status,
            *(format_value(f.get(m, "")) for m in metrics),
            *(format_value(c.get(k, "")) for k in keys),
        ]
        for label, status, c, f in zip(labels, statuses, configs, finals, strict=True)
    ]
    return header, rows, len(header) - len(keys)


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table of `header` and `rows`, every cell escaped; a header may break after a
    `/` (`train/<wbr>tokens_seen`), so that a dozen columns fit a page's width."""
    cells = lambda tag, row: "".join(f"<{tag}>{v}</{tag}>" for v in row)  # noqa: E731
    names = [html.escape(name).replace("/", "/<wbr>") for name in header]
    lines = [
        f"<tr>{cells('th', names)}</tr>",
        *(f"<tr>{cells('td', map(html.escape, row))}</tr>" for row in rows),
    ]
    return "<table>" + "\n".join(lines) + "</table>"


def write_report(run_dirs: list[Path], out: Path) -> tuple[Path, dict[str, dict[str, list[str]]]]:
    """Figures, `summary.csv` and the self-contained `report.html` for `run_dirs` in `out`;
    returns the HTML's path and what each figure drew (`plot_figures`)."""
    out.mkdir(parents=True, exist_ok=True)
    labels = [run.name for run in run_dirs]
    metrics = [read_metrics(run) for run in run_dirs]
    configs = [read_config(run) for run in run_dirs]
    losses = loss_panels(metrics, [c.get("objective._target_") for c in configs])
    drawn = plot_figures(dict(zip(labels, metrics, strict=True)), out, losses)
    finals = [
        final_metrics(m) | eval_results(run) for m, run in zip(metrics, run_dirs, strict=True)
    ]
    statuses = [run_status(run, f, c) for run, f, c in zip(run_dirs, finals, configs, strict=True)]
    header, rows, split = summary_table(labels, statuses, configs, finals)
    with open(out / "summary.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    settings = html_table(["run", *header[split:]], [[row[0], *row[split:]] for row in rows])
    if split == len(header):
        settings = "<p>None: the runs differ in no key that changes training.</p>"
    images = "\n".join(
        f'<h2>{html.escape(FIGURES[name][0])}</h2><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out / name).read_bytes()).decode()}">'
        for name in drawn
    )
    runs = "\n".join(
        f"<li><code>{html.escape(str(run))}</code>: {html.escape(status)}</li>"
        for run, status in zip(run_dirs, statuses, strict=True)
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pretrain-compare: {len(run_dirs)} runs</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{white-space:nowrap}}img{{max-width:100%}}</style>
</head><body><h1>{len(run_dirs)} runs</h1><ul>{runs}</ul>
<h2>Final metrics (losses, downstream results, progress)</h2>
{html_table(header[:split], [row[:split] for row in rows])}
<h2>Config keys that differ (those that change what is trained)</h2>
{settings}
{images}
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path, drawn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pretrain-compare", description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="+", help="run directories or experiment directories")
    parser.add_argument("--out", help="report directory (default: <first dir>/report)")
    args = parser.parse_args(argv)
    run_dirs = find_runs(args.dirs)
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    path, _ = write_report(run_dirs, out)
    print(f"Report of {len(run_dirs)} runs: {path}", file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
