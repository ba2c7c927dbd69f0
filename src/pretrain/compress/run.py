"""The three `pretrain-compress` methods: each takes the validated CompressConfig, writes a
Hugging Face directory at `out_dir` with `compression.json` (what was done, the losses, the
sparsity or error reached, the MLM accuracy of the teacher and of the result) and returns
that report."""

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from pretrain.compress.config import CompressConfig
from pretrain.compress.data import PretrainingBatches, task_batches
from pretrain.compress.encoders import (
    LoadedModel,
    build_student,
    load_model,
    require_same_tokenizer,
    write_hf_directory,
)
from pretrain.errors import ConfigError

REPORT = "compression.json"
SHARED_SIZES = ("max_position_embeddings", "type_vocab_size")  # a student takes the teacher's


def stream_of(run: CompressConfig, teacher: LoadedModel) -> PretrainingBatches:
    """The pretraining stream of `run.data`, refused unless made with the teacher's tokenizer."""
    batches = PretrainingBatches(
        run.data.shards_dir, run.data.max_seq_length, run.data.batch_size, run.data.seed
    )
    require_same_tokenizer(teacher, batches.tokenizer_dir, "teacher")
    return batches


def held_out(run: CompressConfig, teacher: LoadedModel) -> list[dict]:
    """The first `data.eval_batches` batches of the stream under another seed: MLM accuracy's
    (refused unless made with the teacher's tokenizer)."""
    batches = PretrainingBatches(
        run.data.shards_dir, run.data.max_seq_length, run.data.batch_size, run.data.seed + 1
    )
    require_same_tokenizer(teacher, batches.tokenizer_dir, "teacher")
    return [batch for _, batch in zip(range(run.data.eval_batches), batches, strict=False)]


def write_report(out_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Write `<out_dir>/compression.json`; returns `report`."""
    (out_dir / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return report


def distil_tinybert(run: CompressConfig) -> dict[str, Any]:
    """TinyBERT general distillation (intermediate, then prediction layer) on the stream,
    then, with `method.task`, task-specific distillation; writes the student."""
    from pretrain.compress.prune import mlm_accuracy
    from pretrain.compress.tinybert import LayerwiseDistiller, distil, initialise_from_teacher

    method = run.method
    teacher = load_model(run.teacher)
    if not teacher.has_mlm_head and method.prediction_steps:
        raise ConfigError(
            f"teacher={run.teacher}: no MLM head for the prediction-layer loss; give a *ForMaskedLM "
            "export or set method.prediction_steps=0"
        )
    if not run.student:
        raise ConfigError(
            "student: no student model config; pass student=tinybert_4 (conf/compress/student/)"
        )
    batches = stream_of(run, teacher)
    torch.manual_seed(run.data.seed)
    # positions and token types as the teacher's: those are what the teacher can teach
    shared = {key: teacher.model_cfg[key] for key in SHARED_SIZES if key in teacher.model_cfg}
    student = build_student({**run.student, **shared}, teacher.vocab)
    distiller = LayerwiseDistiller(student, teacher.model)  # refuses a student it cannot map
    evaluation = held_out(run, teacher)
    teacher_mlm_accuracy = mlm_accuracy(teacher.model, evaluation)  # before any fine-tuning
    initialise_from_teacher(student, teacher.model, distiller.layers)
    logs = [distil(distiller, batches, "intermediate", method.intermediate_steps, method.lr)]
    if method.prediction_steps:
        logs.append(
            distil(
                distiller,
                batches,
                "prediction",
                method.prediction_steps,
                method.lr,
                method.temperature,
            )
        )
    task_report = distil_on_task(run, teacher, distiller, logs) if method.task else {}
    out = write_hf_directory(student, teacher.tokenizer_dir, teacher.vocab, run.out_dir)
    return write_report(
        out,
        {
            "method": "tinybert",
            "teacher": run.teacher,
            "student": run.student.get("name"),
            "layer_map": distiller.layers,
            "stages": [log.__dict__ for log in logs],
            "teacher_mlm_accuracy": teacher_mlm_accuracy,
            "mlm_accuracy": mlm_accuracy(student, evaluation),
            **task_report,
        },
    )


def distil_on_task(run: CompressConfig, teacher: LoadedModel, distiller, logs: list) -> dict:
    """Task-specific distillation on `run.method.task`: fine-tune the teacher, then
    `method.task_steps` steps of stage `task` (appended to `logs`); returns the report's
    task figures (dev accuracies of the fine-tuned teacher and the distilled student)."""
    from pretrain.compress.task_distil import finetune_teacher, task_accuracy
    from pretrain.compress.tinybert import distil

    method = run.method
    task = task_batches(
        method.task,
        run.teacher if Path(run.teacher).is_dir() else teacher.tokenizer_dir,
        run.data.max_seq_length,
        run.data.batch_size,
        seed=run.data.seed,
    )
    tuned = finetune_teacher(
        teacher.model, task.train, task.classes, method.teacher_task_steps, method.teacher_lr
    )
    distiller.attach_task_heads(tuned.head)
    logs.append(
        distil(distiller, task.train, "task", method.task_steps, method.lr, method.temperature)
    )
    return {
        "task": method.task,
        "teacher_finetuning_loss": [tuned.first_loss, tuned.last_loss],
        "teacher_task_accuracy": task_accuracy(teacher.model, tuned.head, task.dev),
        "task_accuracy": task_accuracy(distiller.student, distiller.task_head, task.dev),
    }


def hf_directory(source: str, scratch: Path) -> Path:
    """`source` if it is a Hugging Face directory, else its `pretrain-export` in `scratch`."""
    if (Path(source) / "config.json").is_file():
        return Path(source)
    from pretrain.export import ExportError, export_checkpoint

    try:
        return export_checkpoint(source, scratch / "hf")
    except ExportError as error:
        raise ConfigError(f"teacher={source}: {error}") from None


def quantize_int8(run: CompressConfig) -> dict[str, Any]:
    """torch dynamic int8 of every encoder Linear (post-training, or after QAT fine-tuning);
    writes model.ts (TorchScript, MLM logits) and the config and tokenizer beside it."""
    from pretrain.compress import quantize as q
    from pretrain.compress.artifacts import MaskedLMLogits, example_inputs

    method = run.method
    teacher = load_model(run.teacher)
    evaluation = held_out(run, teacher)
    with tempfile.TemporaryDirectory() as scratch:
        source = hf_directory(run.teacher, Path(scratch))
        reference = q.load_hf_masked_lm(source)
        model = q.load_hf_masked_lm(source)
        losses: list[float] = []
        if method.qat_steps:
            batches = stream_of(run, teacher)
            q.prepare_qat(model)
            losses = q.qat_finetune(model, batches, method.qat_steps, method.lr)
            q.convert_qat(model)
        else:
            q.quantize_dynamic_int8(model)
        inputs = example_inputs(teacher.vocab.size, 4, min(64, run.data.max_seq_length))
        difference = q.max_abs_difference(MaskedLMLogits(reference), MaskedLMLogits(model), inputs)
        out = q.save_quantized(model, source, Path(run.out_dir), {"qat_steps": method.qat_steps})
    return write_report(
        out,
        {
            "method": method.name,
            "teacher": run.teacher,
            "qat_steps": method.qat_steps,
            "qat_first_loss": losses[0] if losses else None,
            "qat_last_loss": losses[-1] if losses else None,
            "max_abs_logit_difference": difference,
            "teacher_mlm_accuracy": hf_mlm_accuracy(reference, evaluation),
            "mlm_accuracy": hf_mlm_accuracy(model, evaluation),
        },
    )


@torch.no_grad()
def hf_mlm_accuracy(model: torch.nn.Module, batches: list[dict]) -> float:
    """MLM accuracy of a Hugging Face *ForMaskedLM at the labelled positions of `batches`."""
    right = total = 0
    for batch in batches:
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        where = batch["labels"] != -100
        predicted = model(**inputs).logits[where].argmax(-1)
        right += int((predicted == batch["labels"][where]).sum())
        total += int(where.sum())
    return right / max(total, 1)


def prune_model(run: CompressConfig) -> dict[str, Any]:
    """Head, magnitude or movement pruning of the teacher; writes the pruned model (heads:
    model.pt2, the `torch.export` program of the smaller model, beside a model.safetensors
    with zeros in place of the pruned heads and `pruned_heads` in config.json)."""
    from pretrain.compress import prune as p
    from pretrain.compress.artifacts import PROGRAM, save_program

    method = run.method
    loaded = load_model(run.teacher)
    model = loaded.model
    evaluation = held_out(run, loaded)
    report: dict[str, Any] = {
        "method": method.name,
        "kind": method.kind,
        "teacher": run.teacher,
        "teacher_mlm_accuracy": p.mlm_accuracy(model, evaluation),
    }
    extra: dict[str, Any] = {}
    if method.kind == "heads":
        importance = p.head_importance(model, stream_of(run, loaded), method.importance_steps)
        pruned = p.heads_to_prune(importance, method.head_fraction)
        p.prune_heads(model, pruned)
        report["head_importance"] = importance.tolist()
        report["pruned_heads"] = extra["pruned_heads"] = {str(k): v for k, v in pruned.items()}
        report["parameters_after"] = sum(t.numel() for t in model.parameters())
        report["mlm_accuracy"] = p.mlm_accuracy(model, evaluation)
    elif method.kind == "magnitude":
        report["sparsity"] = p.magnitude_prune(model, method.sparsity)
    else:
        reached, losses = p.movement_prune(
            model, stream_of(run, loaded), method.sparsity, method.steps, method.lr
        )
        report.update(sparsity=reached, first_loss=losses[0], last_loss=losses[-1])
    report.setdefault("mlm_accuracy", p.mlm_accuracy(model, evaluation))
    small = model
    if method.kind == "heads":
        model = p.dense_copy(model, loaded.vocab)
    out = write_hf_directory(model, loaded.tokenizer_dir, loaded.vocab, run.out_dir, extra)
    if method.kind == "heads":
        save_program(
            small,
            out / PROGRAM,
            loaded.vocab.size,
            loaded.model_cfg.get("max_position_embeddings", run.data.max_seq_length),
        )
    return write_report(out, report)
