"""From a composed config to a trained, checkpointed run."""

import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from pretrain.batching import describe as describe_batching
from pretrain.batching import warmup_steps
from pretrain.checkpoint.relaunch import check_relaunch, check_same_model
from pretrain.checkpoint.resume import (
    checkpoint_weight_shapes,
    find_resume_checkpoint,
    save_hydra_config,
    saved_config,
    set_aside_checkpoints,
)
from pretrain.checkpoint.safety import check_checkpoint_slots, check_resume_strategy
from pretrain.cluster.collectives import CollectiveTimeout, collective_failure
from pretrain.cluster.local_ranks import wait_for_local_ranks
from pretrain.cluster.preemption import (
    PREEMPTED_EXIT_STATUS,
    Preempted,
    PreemptionCheckpoint,
    raise_if_preempted,
)
from pretrain.cluster.watchdog import clear_stall_records, stop_if_stalled, watchdog_callbacks
from pretrain.config import TrainConfig, validate, with_schema_defaults
from pretrain.data.datamodule import (
    PretrainingDataModule,
    open_corpus,
    split_holdout,
    unrepeated_shards,
    verified_shards,
)
from pretrain.data.mixture_spec import mixture_sha256, mixture_stream_spec
from pretrain.data.node_manifest import open_manifest
from pretrain.data.partitions import stream_partitions
from pretrain.data.prediction_budget import describe_shape_set, shape_set
from pretrain.data.reading import StreamSpec, stream_spec
from pretrain.data.shard_format import ShardError
from pretrain.errors import (
    ConfigError,
    RunEnvironmentError,
    filesystem_error,
    report_error,
    write_line,
)
from pretrain.export.checkpoint import ExportError
from pretrain.models.unpadding import describe_unpadded_rows
from pretrain.objectives.base import Objective
from pretrain.runtime.nonfinite import NonFiniteError
from pretrain.runtime.run_state import write_run_state
from pretrain.runtime.schedule import check_extension, first_phase_warnings
from pretrain.runtime.task import PretrainingTask
from pretrain.runtime.threads import loader_workers, set_training_threads
from pretrain.runtime.time_budget import stopped_by_time_budget, time_budget_callbacks
from pretrain.runtime.trainer import build_trainer, finish_loggers
from pretrain.runtime.validation import heldout_callbacks
from pretrain.storage import keep_copy, local_path

# Lightning flattens each batch with torch's deprecated LeafSpec: a FutureWarning at every epoch
# end (each `catch_warnings` resets Python's once-per-place record) about code not ours.
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
)


def build_stream(cfg: DictConfig) -> tuple[TrainConfig, StreamSpec, type[Objective]]:
    """Validate the config into the typed run object, open and check the corpus, and
    describe the data stream; returns them and the objective's class. The run's data paths become absolute (the tokenizer's: the
    one the corpus was checked with), as checkpoints store them; a corpus at a URL keeps its
    URL, and its tokenizer is copied into `<run_dir>/tokenizer` (the cache may be
    node-local and temporary, the run's tokenizer must not be)."""
    run = validate(cfg)
    if run.data.sources:  # a mixture of corpora (data/mixture.py)
        objective_class = get_class(run.objective._target_)
        return run, mixture_stream_spec(run, objective_class.build_corruption), objective_class
    corpus = open_corpus(run.data.shards_dir, run.data.tokenizer_dir, run.data)
    tokenizer_dir = corpus.tokenizer_dir
    if corpus.storage is None:  # a URL stays as given
        run.data.shards_dir = str(Path(local_path(run.data.shards_dir)).resolve())
    elif run.data.tokenizer_dir is None:  # the cache's copy may go: the run keeps its own
        tokenizer_dir = keep_copy(tokenizer_dir, Path(run.run_dir).resolve() / "tokenizer")
    run.data.tokenizer_dir = str(tokenizer_dir)
    objective_class = get_class(run.objective._target_)
    training = range(len(split_holdout(corpus, run.data.holdout_shards)[0]))
    training = unrepeated_shards(corpus.manifest, training, run.data.bad_shards)
    if run.data.verify_shards:
        training = verified_shards(corpus.manifest, training, run.data.bad_shards, corpus.storage)
    training_paths = corpus.manifest.shard_path_table.take(training)
    shard_tokens, documents = corpus.manifest.shard_counts(training)
    spec = stream_spec(
        run,
        shard_paths=training_paths,
        shard_tokens=shard_tokens,
        stream_partitions=stream_partitions(run, documents),
        vocab=corpus.vocab,
        corruption=objective_class.build_corruption(run, corpus.vocab),
        storage=corpus.storage,
    )
    return run, spec, objective_class


def prepare_run(cfg: DictConfig) -> tuple[TrainConfig, PretrainingTask, PretrainingDataModule]:
    """`build_stream`, then the task around the objective (seeded) and the data module."""
    run, spec, objective_class = build_stream(cfg)
    threads = set_training_threads(run.trainer.num_threads, run.trainer.devices)
    print(f"torch threads per process: {threads} (trainer.num_threads)", flush=True)
    L.seed_everything(run.seed, workers=False, verbose=False)
    module = PretrainingTask(objective_class(run, spec.vocab))
    # What the corpus holds, wherever it lies: a relaunch may move it (checkpoint.relaunch).
    manifest_root = spec.storage.root if spec.storage is not None else run.data.shards_dir
    sha256 = mixture_sha256(spec) if spec.sources else open_manifest(manifest_root).content_sha256
    module.config["data_runtime"] = {"corpus_sha256": sha256}
    remote = any(part.storage is not None for part in (spec, *spec.sources))
    workers = loader_workers(run.data.num_workers, remote)
    if workers != run.data.num_workers:
        print(
            f"data.num_workers={run.data.num_workers}: none started, this process may use one "
            "core (the batches are the same)",
            flush=True,
        )
    datamodule = PretrainingDataModule(
        spec,
        num_workers=workers,
        pin_memory=run.trainer.pin_memory and torch.cuda.is_available(),
        batch_warmup=module.batch_warmup,
    )
    use_speed_switches(run, module)
    return run, module, datamodule


def use_speed_switches(run: TrainConfig, module: PretrainingTask) -> None:
    """trainer.tf32 (TF32 matmuls on CUDA, process-wide; off: torch's defaults kept) and
    trainer.compile (the module compiled in place, its parameter names unchanged); see
    conf/trainer/gpu.yaml."""
    if run.trainer.tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if run.trainer.compile:
        module.compile(backend=run.trainer.compile_backend)


def train(cfg: DictConfig) -> Path:
    """Train (or resume) the run described by `cfg`; returns its run directory."""
    run, module, datamodule = prepare_run(cfg)
    run_dir = Path(run.run_dir)
    ckpt_path = find_resume_checkpoint(run_dir, run.resume)
    if run.resume != "never":  # resume=never moves the old checkpoints aside first
        check_checkpoint_slots(run_dir, run.strategy.name)
    if ckpt_path:  # refused (ConfigError) when the config changed what is trained
        check_resume_strategy(ckpt_path, run.strategy.name)  # a ZeRO dir: DeepSpeed only
        stored = saved_config(ckpt_path)
        check_same_model(
            f"resume from {ckpt_path}",
            stored,
            module.config,
            checkpoint_weight_shapes(ckpt_path),
            weight_shapes(module),
        )
        saved = with_schema_defaults(stored)
        check_relaunch(saved, module.config, ckpt_path, run.resume)
        check_extension(ckpt_path, run, warmup_steps(run.optim, run.batch_plan))
        print(f"Resuming from {ckpt_path}", flush=True)
    elif run.init_from:
        initialise_from(module.objective, run.init_from)
    callbacks = [
        *heldout_callbacks(run, datamodule.spec),
        *watchdog_callbacks(run.trainer, run_dir),
        *time_budget_callbacks(run.trainer.max_time_s),
    ]
    trainer = build_trainer(run, run_dir, callbacks)
    if trainer.is_global_zero:
        clear_stall_records(run_dir)  # a previous launch's (pretrain.cluster.watchdog)
        if run.resume == "never" and (previous := set_aside_checkpoints(run_dir)):
            print(f"resume=never: the old checkpoints moved to {previous}", flush=True)
        save_hydra_config(cfg)
        spec = datamodule.spec
        shapes = describe_shape_set(
            shape_set(spec.corruption, spec.max_seq_length),
            None if spec.tokens_per_batch else run.batch_plan.micro_batch_size,
        ) + describe_unpadded_rows(module.objective)
        print(f"{describe_batching(run.optim, run.batch_plan)}; {shapes}", flush=True)
        if not ckpt_path:  # a resumed launch follows its checkpoint's schedule
            for line in first_phase_warnings(run, warmup_steps(run.optim, run.batch_plan)):
                write_line(line)
        write_run_state(run_dir, "running", 0, run.trainer.max_steps)
    for logger in trainer.loggers:
        logger.log_hyperparams(module.config)
    finished, state = False, "failed"
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        finished = trainer.global_step >= run.trainer.max_steps or stopped_by_time_budget(trainer)
        state = "finished" if finished else "preempted" if saved_by_signal(trainer) else "failed"
    except (RuntimeError, OSError) as error:
        # OSError: a worker killed while the main process took its batch's shared memory
        # surfaces as that connection's error (ConnectionResetError), not torch's own
        stop_if_stalled()  # a rank's watchdog ends the run (status 75): not this error
        if isinstance(error, RuntimeError):
            stuck = collective_failure(error, trainer)
            if stuck is not None:
                raise stuck from error
        died = dead_worker_message(error, datamodule)
        if died:  # killed: out of memory, or by hand
            raise RunEnvironmentError(
                f"{died} at step {trainer.global_step}: a data-loader "
                "worker died (out of memory? see `dmesg`); lower data.num_workers or "
                "data.shuffle_buffer_documents, then resume from the last checkpoint"
            ) from error
        raise
    except ShardError:
        # every rank stops at the same step with its own line (`epoch_end.agree_on_step`):
        # rank 0 lets the ranks it started write theirs, which its exit would cut short
        if trainer.is_global_zero:
            wait_for_local_ranks(trainer, run.trainer.collective_timeout_s)
        raise
    finally:
        # the loader's workers stopped and gone on every path (Lightning's teardown leaves a
        # failed fit's to the interpreter's exit, where one still starting prints a traceback)
        datamodule.teardown("fit")
        finish_loggers(trainer, finished)  # the next sweep point gets its own wandb run
        if trainer.is_global_zero:
            write_run_state(run_dir, state, trainer.global_step, run.trainer.max_steps)
    if trainer.is_global_zero:  # the ranks it started would die with it: let them finish
        wait_for_local_ranks(trainer, run.trainer.collective_timeout_s)
    raise_if_preempted(trainer)  # stopped by a signal before max_steps: not finished
    if trainer.is_global_zero:
        print(summary(module, run_dir), flush=True)
    return run_dir


def saved_by_signal(trainer: L.Trainer) -> bool:
    """Whether a preemption signal stopped `trainer` after saving a complete checkpoint."""
    return any(
        isinstance(callback, PreemptionCheckpoint) and callback.saved_step is not None
        for callback in trainer.callbacks
    )


def dead_worker_message(error: BaseException, datamodule: PretrainingDataModule) -> str:
    """The first line of "DataLoader worker (pid N) is killed by ..." when `error` (or an
    error it arose from) is that, or when a worker of the data module's loader died: torch
    raises it from its SIGCHLD handler wherever the main process is, so inside a checkpoint's
    write it surfaces as the writer's own error. "" otherwise."""
    seen = error
    while seen is not None:
        if str(seen).startswith("DataLoader worker"):
            return str(seen).splitlines()[0]
        seen = seen.__cause__ or seen.__context__
    killed = datamodule.dead_workers()
    if killed:
        return f"DataLoader worker (pid(s) {', '.join(map(str, killed))}) exited unexpectedly"
    return ""


def initialise_from(objective: Objective, source: str) -> None:
    """Load the weights of a Hugging Face directory or a `pretrain` checkpoint (a file, or a
    DeepSpeed ZeRO directory, of any version: `pretrain.checkpoint.compat`) into `objective`.
    The model must be the run's: the same family, vocabulary size, sizes and encoder weight
    shapes (one ConfigError line saying which differ, `check_same_model`, before any weight
    is loaded)."""
    from pretrain.checkpoint.atomic import is_deepspeed_checkpoint
    from pretrain.export import import_hf_model, read_checkpoint

    if Path(source).is_dir() and not is_deepspeed_checkpoint(source):
        model_cfg, state_dict = import_hf_model(source)
        vocab_size = hf_vocab_size(source)
    else:
        state_dict, saved = read_checkpoint(source)
        model_cfg, vocab_size = saved["model"], saved.get("model_runtime", {}).get("vocab_size")
    check_same_model(
        f"init_from={source}",
        {"model": model_cfg, "model_runtime": {"vocab_size": vocab_size}},
        objective.config,
        {key: tuple(value.shape) for key, value in state_dict.items() if is_encoder(key)},
        {key: shape for key, shape in weight_shapes(objective).items() if is_encoder(key)},
    )
    objective.load_pretrained(state_dict, source)
    print(f"Initialised from {source}", flush=True)


def is_encoder(key: str) -> bool:
    """Whether the weight named `key` is the encoder's (heads may differ with init_from)."""
    return key.startswith("encoder.")


def weight_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight of `module`'s state_dict."""
    return {key: tuple(value.shape) for key, value in module.state_dict().items()}


def hf_vocab_size(hf_dir: str) -> int | None:
    """`vocab_size` of a Hugging Face directory's config.json, None when it has none."""
    import json

    try:
        return json.loads((Path(hf_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None


def summary(module: PretrainingTask, run_dir: Path) -> str:
    """The objective's summary loss (MLM, LM, ...) at this launch's first step and its last log
    step."""
    history = module.loss_history
    lines = [f"Run directory: {run_dir}", f"Checkpoints: {run_dir / 'checkpoints'}"]
    if history:
        (first_step, first), (last_step, last) = history[0], history[-1]
        lines.insert(
            0,
            f"{module.summary_metric.replace('_', ' ')}: {first:.3f} at step {first_step} -> "
            f"{last:.3f} at step {last_step}",
        )
    speed = module.speed  # the last log step's
    if speed:
        mfu = f", MFU {speed['train/mfu']:.1%}" if "train/mfu" in speed else ""
        lines.insert(
            1 if history else 0,
            f"throughput: {speed['train/tokens_per_s']:,.0f} tokens/s, "
            f"{speed['train/model_tflops']:.3g} model TFLOP/s{mfu} (one rank, last log step)",
        )
    return "\n".join(lines)


def run_or_exit(cfg: DictConfig) -> Path:
    """`train`, turning config and data errors (a changed config refused on resume too)
    into a clear message and exit status 2, a non-finite loss under trainer.nonfinite=stop
    into exit status 3, a filesystem fault where the run writes (a full disk, a read-only or
    forbidden directory, a directory in the way) into one line and exit status 2, a
    collective that timed out (a stuck or dead rank) into exit status
    4, and a preemption (a complete checkpoint saved, the run not finished) into exit status
    75 (`PREEMPTED_EXIT_STATUS`) without the summary of a finished run."""
    try:
        return train(cfg)
    except (ConfigError, ShardError, ExportError, FileNotFoundError, RunEnvironmentError) as error:
        report_error(error)
        sys.exit(2)
    except NonFiniteError as error:
        report_error(error)
        sys.exit(3)
    except CollectiveTimeout as error:
        report_error(error)
        sys.exit(4)
    except Preempted as stop:
        if stop.report:  # rank 0's one line; every rank exits 75
            write_line(str(stop))
        sys.exit(PREEMPTED_EXIT_STATUS)
    except (OSError, RuntimeError) as error:  # a log, a config or a directory it writes
        fault = filesystem_error(
            error, "writing the run's files", "run the same command again to resume"
        )
        if fault is None:
            raise
        report_error(fault)
        sys.exit(2)
