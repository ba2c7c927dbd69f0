"""How much of its teacher's downstream accuracy a compressed model keeps: each model
fine-tuned with `pretrain-eval`'s demo recipe (pretrain.eval.demo: LP-FT, every layer's
mean-pooled features, 5 epochs) on built-in tasks over several seeds, beside the teacher and
the teacher's architecture with random weights under the same recipe and seeds.

A model is fine-tuned as it ships, keeping what its compression removed:
- a transformers directory (students, weight- and head-pruned models: pruned heads are zero
  rows and columns there) is fine-tuned with every weight that is exactly zero held at zero
  (`KeepZeros`), so a pruned model stays pruned;
- an int8 directory (`model.ts`) cannot be fine-tuned; int8 post-training quantization is
  applied to the task model instead: the teacher fine-tuned, then its encoder's Linear layers
  made int8 (`QuantizeBeforePredict`, pretrain.compress.quantize) before the dev set is scored.

retention = model accuracy / teacher accuracy (means over seeds); `margin kept` = (model -
random) / (teacher - random), the share of what pretraining added that the model keeps.
"""

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
from torch import nn

# The tasks and seeds of the table: the three word-order tasks, where the demo teacher
# fine-tunes about 30 points above random weights (README, `make demo-eval`); each task
# costs 3 fits per row
DEFAULT_TASKS = ("builtin_order", "builtin_reversed", "builtin_next_order")
DEFAULT_SEEDS = (0, 1, 2)


class KeepZeros(L.Callback):
    """Hold every entry of the encoder's Linear weights that is exactly zero when fitting
    starts (what magnitude, movement and head pruning remove) at zero: its gradient is zeroed
    before each optimizer step, so AdamW never moves it (no gradient, no moments, and decay of
    zero is zero). Biases, LayerNorms and embeddings train as usual (a fresh model's biases
    start at zero); a pruned head stays silent because its output columns stay zero."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = [m.weight for m in pl_module.encoder.modules() if isinstance(m, nn.Linear)]
        self.masks = [(w, w.detach() != 0) for w in weights if not bool((w != 0).all())]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        for parameter, mask in self.masks:
            if parameter.grad is not None:
                parameter.grad.mul_(mask)


class QuantizeBeforePredict(L.Callback):
    """Make the fine-tuned encoder's Linear layers torch's dynamic int8 before the dev set is
    predicted (the task model's post-training quantization; the head stays fp32)."""

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from pretrain.compress.quantize import quantize_dynamic_int8

        quantize_dynamic_int8(pl_module.encoder.eval())


@dataclass
class Scored:
    """A table row: its name, what was fine-tuned, and {task: per-seed dev accuracy}."""

    name: str
    how: str
    scores: dict[str, list[float]] = field(default_factory=dict)


def finetune_accuracy(
    directory: Path,
    task: str,
    seed: int,
    init: str = "pretrained",
    callbacks: tuple[L.Callback, ...] = (),
    overrides: tuple[str, ...] = (),
) -> float:
    """Dev accuracy of the demo fine-tuning recipe (pretrain.eval.demo's RECIPES["finetune"]
    and SIZES, then `overrides`) on the built-in `task` for the transformers directory
    `directory` (`init="random"`: its architecture with random weights), `seed` drawing the
    examples, the head and the batch order; `callbacks` join the fine-tuning fit."""
    from omegaconf import OmegaConf

    from pretrain.config import compose_config
    from pretrain.eval.config import register_eval_schema
    from pretrain.eval.demo import RECIPES, SIZES
    from pretrain.eval.encoder import load_encoder
    from pretrain.eval.run import fit_and_score, load_task

    register_eval_schema()
    cfg = compose_config(
        [
            f"eval={task}",
            *RECIPES["finetune"],
            *SIZES,
            f"eval.task.seed={seed}",
            f"eval.seed={seed}",
            *overrides,
        ],
        "evaluate",
    )
    settings = OmegaConf.to_object(cfg).eval
    loaded = load_encoder(directory, init, seed)
    scored = fit_and_score(loaded, load_task(settings.task), settings, callbacks=list(callbacks))
    return float(scored["metrics"]["accuracy"])


def plan(directory: Path, teacher: Path) -> tuple[Path, str, tuple[L.Callback, ...]] | None:
    """(the transformers directory to fine-tune, how, callbacks) for a compressed `directory`
    (KeepZeros always: a student has no zero weights; "zeros kept" said of a pruned model);
    None for a quantization-aware int8 model (its QAT steps were MLM fine-tuning, which a
    task model fine-tuned from the teacher and then quantized, the int8 row, does not carry)."""
    import json

    from pretrain.compress.quantize import is_quantized

    if is_quantized(directory):
        config = json.loads((directory / "config.json").read_text())
        if config.get("quantization", {}).get("qat_steps"):
            return None
        return teacher, "teacher fine-tuned, then int8", (QuantizeBeforePredict(),)
    report = directory / "compression.json"
    pruned = (
        report.is_file() and {"sparsity", "pruned_heads"} & json.loads(report.read_text()).keys()
    )
    return directory, "fine-tuned, zeros kept" if pruned else "fine-tuned", (KeepZeros(),)


def score_models(
    teacher: Path,
    models: list[Path],
    tasks: list[str],
    seeds: list[int],
    overrides: tuple[str, ...] = (),
) -> list[Scored]:
    """The teacher's, every compressed model's and random weights' per-seed accuracies, in
    that order (rows: teacher, models..., random weights; a model `plan` skips is left out,
    said in one line); one line printed per fit."""
    rows, plans = [Scored("teacher", "fine-tuned")], [(teacher, "pretrained", ())]
    for model in models:
        if (planned := plan(model, teacher)) is None:
            print(f"{model.name}: not fine-tuned (quantization-aware MLM steps; see int8)")
            continue
        source, how, callbacks = planned
        rows.append(Scored(model.name, how))
        plans.append((source, "pretrained", callbacks))
    rows.append(Scored("random weights", "teacher's architecture, fine-tuned"))
    plans.append((teacher, "random", ()))
    for task in tasks:
        for row, (source, init, callbacks) in zip(rows, plans, strict=True):
            row.scores[task] = []
            for seed in seeds:
                accuracy = finetune_accuracy(source, task, seed, init, callbacks, overrides)
                row.scores[task].append(accuracy)
                print(f"{row.name} {task} seed {seed}: {accuracy:.3f}", flush=True)
    return rows


def retention(scores: list[float], teacher: list[float]) -> float:
    """Mean of `scores` over the mean of the teacher's (per-seed accuracies)."""
    return statistics.fmean(scores) / statistics.fmean(teacher)


def margin_kept(scores: list[float], teacher: list[float], random: list[float]) -> float:
    """(model - random) / (teacher - random), means over seeds; nan where the teacher is no
    better than random weights."""
    mean = statistics.fmean
    margin = mean(teacher) - mean(random)
    return (mean(scores) - mean(random)) / margin if margin > 0 else float("nan")


def mean_std(values: list[float]) -> str:
    """'mean ± sample standard deviation' to 3 decimals (0 for one value)."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {spread:.3f}"


def table(rows: list[Scored]) -> str:
    """The Markdown table of `score_models`' rows: per task, accuracy (mean ± std over seeds),
    retention and margin kept against the first row (the teacher) and the last (random)."""
    teacher, random = rows[0], rows[-1]
    tasks = list(teacher.scores)
    names = ["model", "fine-tuned as"]
    names += [f"{t} {c}" for t in tasks for c in ("accuracy", "retention", "margin kept")]
    lines = ["| " + " | ".join(names) + " |", "|---|---|" + "---:|" * (len(names) - 2)]
    for row in rows:
        cells = [row.name, row.how]
        for task in tasks:
            scores = row.scores[task]
            kept = margin_kept(scores, teacher.scores[task], random.scores[task])
            cells += [mean_std(scores), f"{100 * retention(scores, teacher.scores[task]):.1f}%"]
            cells.append(f"{100 * kept:.0f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
