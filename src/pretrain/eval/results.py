"""One table of evaluation results: `python -m pretrain.eval.results DIR...` reads every
`eval/*.json` under the given run directories (or the files themselves; a sweep writes one
per point) and prints a Markdown table, one row per result, one column per metric.
`pretrain-eval -m` prints that table of its points when the sweep ends (`SweepTable`)."""

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


def result_files(paths: list[str | Path]) -> list[Path]:
    """The result files named by `paths`: files as given, directories' `eval/*.json` (also
    below them, for an experiment directory of runs), sorted."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        else:
            found.extend(sorted(p for p in path.rglob("*.json") if p.parent.name == "eval"))
    return found


def results_table(files: list[Path]) -> str:
    """A Markdown table of the results in `files`: file, task, encoder, init, mode, then every
    metric any of them has (blank where one lacks it), 4 significant digits."""
    rows = [(path, json.loads(path.read_text())) for path in files]
    metrics = sorted({name for _, result in rows for name in result["metrics"]})
    header = ["result", "task", "encoder", "init", "mode", *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for path, result in rows:
        values = [f"{result['metrics'][m]:.4g}" if m in result["metrics"] else "" for m in metrics]
        cells = [
            path.stem,
            result["task"],
            result["encoder"],
            result["init"],
            result["settings"]["mode"],
        ]
        lines.append("| " + " | ".join(cells + values) + " |")
    return "\n".join(lines)


class SweepTable(Callback):
    """Hydra callback of `pretrain-eval` (conf/evaluate.yaml): collects the result file each
    point of a sweep returns and prints `results_table` of them all when the sweep ends. (A
    sweep launched elsewhere, e.g. on SLURM: `python -m pretrain.eval.results DIR...`.)"""

    def __init__(self) -> None:
        self.files: list[Path] = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        value = getattr(job_return, "_return_value", None)  # unset when the job failed
        if isinstance(value, Path):
            self.files.append(value)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if self.files:
            print(f"{len(self.files)} results:")
            print(results_table(self.files), flush=True)


def main(argv: list[str] | None = None) -> None:
    files = result_files(argv if argv is not None else sys.argv[1:])
    if not files:
        print("no eval/*.json under the given paths", file=sys.stderr)
        sys.exit(2)
    print(results_table(files))


if __name__ == "__main__":
    main()
