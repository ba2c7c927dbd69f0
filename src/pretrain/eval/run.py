"""One downstream evaluation: load the encoder and the task, fit with Lightning, predict the
dev set, score it, and write `<run dir>/eval/<name>.json`."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from pretrain.eval.config import EvalConfig, EvalRunConfig, TaskConfig
from pretrain.eval.encoder import (
    LoadedEncoder,
    feature_statistics,
    load_encoder,
    with_hidden_states,
)
from pretrain.eval.features import IGNORE_INDEX, tagging_features, text_features, window_features
from pretrain.eval.heads import PER_TOKEN_KINDS
from pretrain.eval.metrics import (
    classification_metrics,
    constant_prediction,
    decode_answers,
    majority_baseline,
    qa_metrics,
    regression_metrics,
)
from pretrain.eval.module import DownstreamModule, HeadSettings
from pretrain.eval.tasks import TaskData

# The most memory (bytes) the frozen encoder's cached hidden states may take in features mode:
# a small encoder's (1400 + 1000 examples of 64 tokens, 3 states of 64: 120 MB), not a BERT-base
# on a GLUE task's (SST-2: 340 GB), which runs the encoder per batch instead
CACHED_STATES_BYTES = 2 * 1024**3


def load_task(task: TaskConfig) -> TaskData:
    """The examples `task` names: generated (builtin) or read from its files."""
    if task.format == "builtin":
        from pretrain.eval.builtin_tasks import builtin_task

        return builtin_task(task.name, task.train_size, task.dev_size, task.seed)
    from pretrain.eval.formats import read_task

    return read_task(task)


def _features(loaded: LoadedEncoder, task: TaskData, examples: list, settings: EvalConfig):
    last_token = loaded.model_type == "xlnet"
    if task.kind == "qa":
        return window_features(
            loaded.tokenizer,
            examples,
            settings.max_seq_length,
            settings.doc_overlap_tokens,
            last_token_summary=last_token,
        )
    if task.kind == "tagging":
        return tagging_features(loaded.tokenizer, examples, settings.max_seq_length)
    return text_features(
        loaded.tokenizer, examples, settings.max_seq_length, regression=task.kind == "regression"
    )


def _score(task: TaskData, settings: EvalConfig, logits: torch.Tensor, features) -> dict:
    """(metrics, predictions, references) of the dev set from the head's outputs; a
    classifier's also with its majority-class baseline and its constant prediction (the
    one class it predicts for every example, else None)."""
    if task.kind == "qa":
        start, end = logits.unbind(-1)
        allow_no_answer = any(not e.answers for e in task.train)
        answers = decode_answers(
            start, end, features, task.dev, settings.max_answer_tokens, allow_no_answer
        )
        references = [[text for text, _ in e.answers] for e in task.dev]
        return {
            "metrics": qa_metrics(answers, task.dev),
            "predictions": [answers[e.qid] for e in task.dev],
            "references": references,
        }
    labels = features.tensors["labels"]
    if task.kind == "regression":
        return {
            "metrics": regression_metrics(logits, labels),
            "predictions": logits.tolist(),
            "references": labels.tolist(),
        }
    predictions = logits.argmax(-1)
    if task.kind == "tagging":
        scored = labels != IGNORE_INDEX  # a word's first token
        predictions, labels = predictions[scored], labels[scored]
    return {
        "metrics": classification_metrics(predictions, labels, len(task.labels)),
        "baseline": majority_baseline(labels, task.labels),
        "constant_prediction": constant_prediction(predictions, task.labels),
        "predictions": predictions.tolist(),
        "references": labels.tolist(),
    }


def fit_and_score(
    loaded: LoadedEncoder,
    task: TaskData,
    settings: EvalConfig,
    accelerator: str = "cpu",
    cache_states: bool = True,
    callbacks: list | None = None,
) -> dict:
    """Fit a head (and, in finetune mode, the encoder) on `task.train`; returns {metrics,
    predictions, references} on `task.dev` (QA: answer texts; tagging: per scored word).
    In finetune mode with `probe_epochs`, the head is first fitted alone on the frozen
    encoder (LP-FT), then every weight is trained from there. In features mode with
    `cache_states` the frozen encoder runs once per example, not once per epoch: its hidden
    states are computed before training and the head reads them (a sequence-level task's
    pooled over the tokens already), when those of the training and dev sets fit in
    CACHED_STATES_BYTES. `callbacks` (Lightning callbacks) join the last fit and its
    prediction of the dev set only (not LP-FT's probe)."""
    import lightning as L

    L.seed_everything(settings.seed, verbose=False)
    train, dev = (_features(loaded, task, part, settings) for part in (task.train, task.dev))
    start = None
    if settings.mode == "finetune" and settings.probe_epochs:
        probe = replace(  # a linear probe: no dropout
            settings,
            mode="features",
            epochs=settings.probe_epochs,
            lr=settings.probe_lr,
            dropout=0.0,
        )
        start, _ = _fit(loaded, task, probe, train, dev, accelerator, cache_states)
    _, logits = _fit(
        loaded, task, settings, train, dev, accelerator, cache_states, start, callbacks or []
    )
    return _score(task, settings, logits, dev)


def _fit(
    loaded: LoadedEncoder,
    task: TaskData,
    settings: EvalConfig,
    train,
    dev,
    accelerator: str,
    cache_states: bool,
    start: DownstreamModule | None = None,
    callbacks: list | None = None,
) -> tuple[DownstreamModule, torch.Tensor]:
    """(the fitted module, its logits on the dev set) of one fit with `settings`, the head
    and layer mix starting from `start`'s when given, `callbacks` in its Trainer."""
    import lightning as L

    train_rows = train.rows if task.kind == "qa" else train
    dev_rows = dev.rows if task.kind == "qa" else dev
    pooled = task.kind not in PER_TOKEN_KINDS  # a sequence-level head: pooled states cached
    cached_bytes = (  # float32 hidden states of every layer, embeddings included
        4
        * (len(train_rows) + len(dev_rows))
        * (loaded.model.num_layers + 1)
        * (1 if pooled else settings.max_seq_length)
        * loaded.model.hidden_size
    )
    pooling = settings.pooling if pooled else None
    last_token = loaded.model_type == "xlnet"
    if settings.mode == "features" and cache_states and cached_bytes <= CACHED_STATES_BYTES:
        train_rows, dev_rows = (
            with_hidden_states(loaded.model, rows, settings.batch_size, pooling, last_token)
            for rows in (train_rows, dev_rows)
        )
    loader = DataLoader(train_rows, batch_size=settings.batch_size, shuffle=True)
    head = HeadSettings(
        mode=settings.mode,
        layers=settings.layers,
        pooling=settings.pooling,
        lr=settings.lr,
        warmup_fraction=settings.warmup_fraction,
        weight_decay=settings.weight_decay,
        dropout=settings.dropout,
        total_steps=len(loader) * settings.epochs,
    )
    module = DownstreamModule(
        loaded.model, task.kind, task.num_outputs, head, loaded.model_type == "xlnet"
    )
    if start is not None:  # LP-FT: the probe's head, layer mix and standardization
        module.head.load_state_dict(start.head.state_dict())
        module.layers.load_state_dict(start.layers.state_dict())
        if start.shift is not None:
            module.standardize(start.shift, start.scale)
    elif settings.standardize:
        module.standardize(
            *feature_statistics(loaded.model, train_rows, settings.batch_size, pooling, last_token)
        )
    dev_loader = DataLoader(dev_rows, batch_size=settings.batch_size)
    if settings.mode == "features" and accelerator == "cpu" and not callbacks:
        return module, _fit_features(module, loader, settings.epochs, dev_loader)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_epochs=settings.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks or [],
    )
    module.train()  # a loaded Hugging Face model comes in eval mode; Lightning keeps modes
    trainer.fit(module, loader)
    outputs = trainer.predict(module, dev_loader)
    return module, torch.cat(outputs).float().cpu()


def _fit_features(
    module: DownstreamModule, loader: DataLoader, epochs: int, dev_loader: DataLoader
) -> torch.Tensor:
    """A features-mode fit on the CPU as Lightning's loop runs it (the same batches, steps,
    schedule and random draws: the same logits, `tests/integration/test_eval_features.py`), in
    plain torch: a demo probe on cached features takes 3.3 CPU-s against Lightning's 4.4-4.6
    (benchmarks/RESULTS.md, "The probes' plain loop"). Returns the logits on the dev set."""
    config = module.configure_optimizers()
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    module.on_train_start()
    for _ in range(epochs):
        for index, batch in enumerate(loader):
            loss = module.training_step(batch, index)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    module.eval()
    with torch.inference_mode():
        outputs = [module.predict_step(batch, index) for index, batch in enumerate(dev_loader)]
    return torch.cat(outputs).float()


def evaluate(run: EvalRunConfig) -> tuple[dict[str, Any], Path]:
    """Run the evaluation `run` describes; returns (the result, the path of its JSON file:
    `<out_dir or the pretraining run directory>/eval/<result_name>.json`). With `run.wandb`
    (auto: when the pretraining run logged to wandb) the result is logged to that run's wandb
    group too (pretrain.eval.tracking), its files under `<out_dir>/wandb`."""
    loaded = load_encoder(run.encoder.path, run.encoder.init, run.eval.seed)
    task = load_task(run.eval.task)
    scored = fit_and_score(loaded, task, run.eval, run.accelerator)
    from omegaconf import OmegaConf

    result = {
        "task": task.name,
        "kind": task.kind,
        "encoder": str(run.encoder.path),
        "init": run.encoder.init,
        "settings": OmegaConf.to_container(OmegaConf.structured(run.eval)),
        "train_examples": len(task.train),
        "dev_examples": len(task.dev),
        **scored,
    }
    out_dir = Path(run.out_dir) if run.out_dir else loaded.run_dir
    path = out_dir / "eval" / f"{run.result_name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    from pretrain.eval.tracking import log_to_wandb, should_log

    if should_log(run.wandb, loaded.run_dir):
        log_to_wandb(result, run.result_name, loaded.run_dir, out_dir)
    return result, path
