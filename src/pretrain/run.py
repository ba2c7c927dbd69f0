"""From a composed config to a trained, checkpointed run."""

import sys
from pathlib import Path

import lightning as L
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from pretrain.batching import batch_plan
from pretrain.batching import describe as describe_batching
from pretrain.checkpointing import config_changes, find_resume_checkpoint, saved_config
from pretrain.config import validate
from pretrain.data.datamodule import PretrainingDataModule, open_corpus, split_holdout
from pretrain.data.shard_format import ShardError
from pretrain.data.stream import StreamSpec
from pretrain.errors import ConfigError
from pretrain.export.checkpoint import ExportError
from pretrain.objectives.base import NonFiniteError, PretrainingModule
from pretrain.trainer import build_trainer


def build_stream(cfg: DictConfig) -> tuple[dict, StreamSpec, type[PretrainingModule]]:
    """Validate the config, open and check the corpus, and describe the data stream.
    The returned plain config adds what the tokenizer decides (`model_runtime`) and absolute
    data paths; it is what checkpoints store."""
    validate(cfg)
    data = cfg.data
    corpus = open_corpus(data.shards_dir, data.tokenizer_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    config["data"]["shards_dir"] = str(Path(data.shards_dir).resolve())
    config["data"]["tokenizer_dir"] = str(corpus.tokenizer_dir)
    config["model_runtime"] = {"vocab_size": corpus.vocab.size, "pad_token_id": corpus.vocab.pad}
    module_class = get_class(cfg.objective._target_)
    spec = StreamSpec(
        shard_paths=split_holdout(corpus, data.holdout_shards)[0],
        vocab=corpus.vocab,
        corruption=module_class.build_corruption(config, corpus.vocab),
        format=data.format,
        max_seq_length=data.max_seq_length,
        batch_size=data.batch_size,
        seed=cfg.seed,
        short_seq_probability=data.short_seq_probability,
        nsp_random_probability=data.nsp_random_probability,
        pair_task=config["objective"].get("pair_task", "none"),
        shuffle_buffer_documents=data.shuffle_buffer_documents,
        random_document_pool=data.random_document_pool,
    )
    return config, spec, module_class


def prepare_run(cfg: DictConfig) -> tuple[dict, PretrainingModule, PretrainingDataModule]:
    """`build_stream`, then the objective module (seeded) and the data module."""
    config, spec, module_class = build_stream(cfg)
    L.seed_everything(cfg.seed, workers=False, verbose=False)
    module = module_class(config, spec.vocab)
    return config, module, PretrainingDataModule(spec, num_workers=cfg.data.num_workers)


def train(cfg: DictConfig) -> Path:
    """Train (or resume) the run described by `cfg`; returns its run directory."""
    config, module, datamodule = prepare_run(cfg)
    run_dir = Path(config["run_dir"])
    ckpt_path = find_resume_checkpoint(run_dir, config["resume"])
    if ckpt_path:
        print(f"Resuming from {ckpt_path}", flush=True)
        changes = config_changes(saved_config(ckpt_path), config)
        if changes:
            print(
                "warning: the config differs from the checkpoint's:\n  " + "\n  ".join(changes),
                flush=True,
            )
    elif config.get("init_from"):
        initialise_from(module, config["init_from"])
    trainer = build_trainer(config, run_dir)
    if trainer.is_global_zero:
        print(describe_batching(config, batch_plan(config, ranks=trainer.world_size)), flush=True)
    for logger in trainer.loggers:
        logger.log_hyperparams(config)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        print(summary(module, run_dir), flush=True)
    return run_dir


def initialise_from(module: PretrainingModule, source: str) -> None:
    """Load the weights of a Hugging Face directory or a `pretrain` checkpoint (a file, or a
    DeepSpeed ZeRO directory) into `module`;
    the model sizes must match the run's (a mismatch names the key)."""
    from pretrain.checkpointing import is_deepspeed_checkpoint
    from pretrain.export import import_hf_model, read_checkpoint

    if Path(source).is_dir() and not is_deepspeed_checkpoint(source):
        model_cfg, state_dict = import_hf_model(source)
    else:
        state_dict, saved = read_checkpoint(source)
        model_cfg = saved["model"]
    ours = module.config["model"]
    for key, value in model_cfg.items():
        if key not in ("name", "reference_vocab_size") and ours.get(key) != value:
            raise ConfigError(
                f"init_from={source}: model.{key} is {value!r} there but {ours.get(key)!r} in "
                "this run; choose the matching model config"
            )
    module.load_pretrained(state_dict, source)
    print(f"Initialised from {source}", flush=True)


def summary(module: PretrainingModule, run_dir: Path) -> str:
    """The objective's summary loss (MLM, LM, ...) at the first and last logged step of this launch."""
    history = module.loss_history
    lines = [f"Run directory: {run_dir}", f"Checkpoints: {run_dir / 'checkpoints'}"]
    if history:
        (first_step, first), (last_step, last) = history[0], history[-1]
        lines.insert(
            0,
            f"{module.summary_metric.replace('_', ' ')}: {first:.3f} at step {first_step} -> "
            f"{last:.3f} at step {last_step}",
        )
    return "\n".join(lines)


def run_or_exit(cfg: DictConfig) -> Path:
    """`train`, turning config and data errors into a clear message and exit status 2, a
    non-finite loss under trainer.nonfinite=stop into exit status 3."""
    try:
        return train(cfg)
    except (ConfigError, ShardError, ExportError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(3)
