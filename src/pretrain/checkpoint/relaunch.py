"""The relaunch policy: which config changes a resumed or initialised run may make. Keys in
`RELAUNCH_KEYS` (logging, checkpointing, kernels, workers, the run's length) change how a run
is carried out, not what it trains; any other change, and a global batch that differs, is
refused on resume (`check_relaunch`) unless resume=force. Torch-free, so reports and CLIs can
read the policy without loading it."""

from dataclasses import fields
from fnmatch import fnmatch
from pathlib import Path

from pretrain.batching import batch_plan
from pretrain.config import DataConfig, TrainerConfig
from pretrain.errors import ConfigError


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Keys that may differ between the launches of one run: they say how long, where, how
# visibly and how fast it trains, not what it trains (fnmatch patterns over dotted keys).
# The step's shape (`RANK_KEYS`) may change too while the global batch stays the same, and
# with a token budget (`data.tokens_per_batch`, whose steps hold the same samples for any
# shape) `trainer.accumulate_grad_batches` in any case.
# Anything else makes `resume=auto` refuse.
RELAUNCH_KEYS = (
    "resume",
    "run_name",
    "run_dir",
    "experiment_name",
    "trainer.max_steps",
    "trainer.max_time_s",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.checkpoint_every_n_steps",
    "trainer.keep_checkpoints",
    "trainer.async_checkpoint",
    "trainer.preemption_signal",
    "trainer.collective_timeout_s",
    "trainer.startup_timeout_s",
    "trainer.hang_timeout_s",
    "trainer.max_consecutive_skipped_steps",
    "trainer.max_skipped_steps",
    "trainer.peak_tflops",
    "trainer.tf32",  # speed switches: the same model and data either way
    "trainer.pin_memory",
    "trainer.compile",
    "trainer.compile_backend",
    "trainer.val_*",
    "logger.*",
    "data.num_workers",
    "data.verify_shards",
    "data.bad_shards",
    "data.cache_dir",  # where remote shards are cached and how: the same bytes either way
    "data.cache_limit",
    "data.prefetch_shards",
    "data.download_attempts",
    "data.storage_options",
    "optim.extend",
    "optim.impl",  # kernels (apex or torch) compute the same update: a machine may lack apex
    "model.layer_norm_impl",
    "model.unpad",  # the unpadded path computes the same outputs
)
# The shape of a step: ranks, micro-batch and accumulation. They may change between launches
# while the global batch stays the same: a step holds the same samples, and its micro-batches'
# losses are weighed by their predicted tokens (`data.loader.weigh_step`), so it trains the same.
RANK_KEYS = (
    "trainer.devices",
    "trainer.num_nodes",
    "data.batch_size",
    "trainer.accumulate_grad_batches",
    "data.global_batch_size",
)
# Where the corpus and its tokenizer lie: they may change (a local copy -> its URL, and
# back) when the manifests' content hashes (`data_runtime.corpus_sha256`) agree.
CORPUS_KEYS = ("data.shards_dir", "data.tokenizer_dir")
UNSET = "<unset>"


def corpus_hashes(saved: dict, current: dict) -> tuple[str | None, str | None]:
    """The manifest content hashes (`data_runtime.corpus_sha256`) the checkpoint's run and
    the current one read; None where a config does not record one (an older checkpoint)."""
    return tuple(c.get("data_runtime", {}).get("corpus_sha256") for c in (saved, current))


def moved_to_another_corpus(saved: dict, current: dict) -> str | None:
    """One line when data.shards_dir changed and the corpus there is not the one the
    checkpoint trained on (both content hashes known and different), else None."""
    before, after = corpus_hashes(saved, current)
    old, new = (c.get("data", {}).get("shards_dir") for c in (saved, current))
    if old == new or before is None or after is None or before == after:
        return None
    return (
        f"data.shards_dir: {old!r} -> {new!r} holds another corpus than the checkpoint was "
        f"trained on (manifest content sha256 {before[:12]} -> {after[:12]}); point "
        "data.shards_dir at a copy of the run's corpus, or start a new run (run_name=NAME)"
    )


def config_changes(saved: dict, current: dict, ignore: tuple[str, ...] = ("resume",)) -> list[str]:
    """Keys whose value differs between a checkpoint's config and the current one, as
    'key: saved -> current' lines (keys matching a pattern of `ignore` are skipped). Give
    `saved` through `config.with_schema_defaults`, so keys added since it was saved count at
    their defaults."""
    old, new = _flatten(saved), _flatten(current)
    return [
        f"{key}: {old.get(key, UNSET)!r} -> {new.get(key, UNSET)!r}"
        for key in sorted(old.keys() | new.keys())
        if not any(fnmatch(key, pattern) for pattern in ignore)
        and old.get(key, UNSET) != new.get(key, UNSET)
    ]


def _global_batch(config: dict) -> int | None:
    try:
        # the schema's fields only: a key an older or newer version saved does not matter
        data, trainer = (
            cls(**{f.name: config[name][f.name] for f in fields(cls) if f.name in config[name]})
            for cls, name in ((DataConfig, "data"), (TrainerConfig, "trainer"))
        )
        return batch_plan(data, trainer).global_batch_size
    except (ConfigError, KeyError, TypeError):  # a section missing, or a value refused
        return None


def refused_changes(saved: dict, current: dict) -> list[str]:
    """The differences (`config_changes` lines) that stop `resume=auto` from continuing a
    checkpoint with `current`: every key but `RELAUNCH_KEYS` and `init_from` (checked on its
    own, `check_init_from`), `RANK_KEYS` only when the global batch changes with them, and
    `CORPUS_KEYS` only when the corpus's content hash changes (or is not recorded)."""
    allowed = (*RELAUNCH_KEYS, *RANK_KEYS, "init_from", "data_runtime.*")
    before, after = corpus_hashes(saved, current)
    if before is not None and before == after:  # the same corpus, wherever it lies now
        allowed += CORPUS_KEYS
    tokens = saved.get("data", {}).get("tokens_per_batch")
    if tokens and tokens == current.get("data", {}).get("tokens_per_batch"):
        allowed += ("trainer.accumulate_grad_batches",)  # token-budget steps do not depend on it
    changes = config_changes(saved, current, allowed)
    ranks = config_changes(saved, current, ())
    ranks = [line for line in ranks if line.split(":")[0] in RANK_KEYS]
    before, after = _global_batch(saved), _global_batch(current)
    if ranks and (before is None or before != after):
        batch = f" (global batch {before} -> {after} samples per step)"
        changes += [line + batch for line in ranks]
    return changes


def check_init_from(saved: dict, current: dict, checkpoint: str) -> None:
    """ConfigError when the run asks for `init_from` other than the one the checkpoint's run
    started from: resuming continues the checkpoint's weights, so initialising from elsewhere
    cannot be honoured. The same `init_from` (a relaunch or a requeue of that run) or none is
    fine."""
    wanted = current.get("init_from")
    if wanted is None or wanted == saved.get("init_from"):
        return
    raise ConfigError(
        f"init_from={wanted}: the run directory already holds a checkpoint ({checkpoint}) "
        f"that started from {saved.get('init_from')!r}; resuming continues its weights, so "
        "init_from cannot apply. To start a run from init_from, name a new run (run_name=...) "
        "or start over here (resume=never)"
    )


# Model settings that name or tune a model without changing what it computes.
NAMING_KEYS = ("name", "reference_vocab_size", "layer_norm_impl", "unpad")
MAX_LISTED_SHAPES = 3


def model_differences(
    saved: dict,
    current: dict,
    saved_shapes: dict[str, tuple[int, ...]] | None = None,
    current_shapes: dict[str, tuple[int, ...]] | None = None,
) -> list[str]:
    """How the model stored with a checkpoint (`saved`: its plain run config, or just
    {"model": ..., "model_runtime": ...}) differs from this run's (`current`): its family
    (`model._target_`), vocabulary size (`model_runtime.vocab_size`: the corpus's tokenizer),
    sizes (the other `model.*` keys but `NAMING_KEYS`) and, when both are given, the shapes
    of the weights both hold (name -> shape). [] when they are the same model; each item is
    a short phrase "what: there -> here"."""
    old_model, new_model = saved.get("model") or {}, current.get("model") or {}
    parts = []
    old_family, new_family = old_model.get("_target_"), new_model.get("_target_")
    if old_family and new_family and old_family != new_family:
        parts.append(
            f"model family {old_family.rsplit('.', 1)[-1]} -> {new_family.rsplit('.', 1)[-1]}"
        )
    old_vocab = (saved.get("model_runtime") or {}).get("vocab_size")
    new_vocab = (current.get("model_runtime") or {}).get("vocab_size")
    if old_vocab is not None and new_vocab is not None and old_vocab != new_vocab:
        parts.append(
            f"vocabulary size {old_vocab} -> {new_vocab} (another tokenizer: data.shards_dir)"
        )
    if not parts:  # sizes only matter within one family
        sizes = [
            f"model.{key} {old_model.get(key, UNSET)!r} -> {new_model.get(key, UNSET)!r}"
            for key in sorted(old_model.keys() & new_model.keys())
            if key not in NAMING_KEYS and key != "_target_" and old_model[key] != new_model[key]
        ]
        parts += sizes
    if saved_shapes is not None and current_shapes is not None:
        shapes = [
            f"{key} {tuple(saved_shapes[key])} -> {tuple(current_shapes[key])}"
            for key in sorted(saved_shapes.keys() & current_shapes.keys())
            if tuple(saved_shapes[key]) != tuple(current_shapes[key])
        ]
        if shapes:
            more = len(shapes) - MAX_LISTED_SHAPES
            listed = ", ".join(shapes[:MAX_LISTED_SHAPES]) + (
                f" and {more} more" if more > 0 else ""
            )
            parts.append(f"{len(shapes)} weight shape(s) differ: {listed}")
    return parts


def check_same_model(
    what: str,
    saved: dict,
    current: dict,
    saved_shapes: dict[str, tuple[int, ...]] | None = None,
    current_shapes: dict[str, tuple[int, ...]] | None = None,
) -> None:
    """ConfigError in one line when the model of `what` ("init_from=PATH", "resume: PATH")
    is not this run's (`model_differences`): which of family, vocabulary size, sizes and
    weight shapes differ, there -> here, and what to do. Checked before any weight is loaded."""
    parts = model_differences(saved, current, saved_shapes, current_shapes)
    if parts:
        raise ConfigError(
            f"{what}: another model than this run's ({'; '.join(parts)}); use the model "
            "config and corpus (tokenizer) it was trained with, or start a new run"
        )


def data_parallel_ranks(config: dict) -> int | None:
    """trainer.devices × trainer.num_nodes of a config (a count or a list of devices);
    None when Lightning decides (`auto`, -1)."""
    trainer = config.get("trainer") or {}
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    count = len(devices) if isinstance(devices, list | tuple) else devices
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or count < 1 or not isinstance(nodes, int):
        return None
    return count * nodes


def check_zero_ranks(saved: dict, current: dict, checkpoint: str) -> None:
    """ConfigError (one line, every resume mode) when a DeepSpeed ZeRO checkpoint directory
    is resumed on another number of data-parallel ranks than wrote it: its optimizer state is
    partitioned by rank, and DeepSpeed loads it only on the same number. The line names
    DeepSpeed's conversion to its universal checkpoint, which does not depend on it."""
    latest = Path(checkpoint) / "latest"
    if (saved.get("strategy") or {}).get("name") != "deepspeed" or not latest.is_file():
        return
    before, now = data_parallel_ranks(saved), data_parallel_ranks(current)
    if before is None or now is None or before == now:
        return
    tag = Path(checkpoint) / latest.read_text().strip()
    raise ConfigError(
        f"{checkpoint}: a DeepSpeed ZeRO checkpoint of {before} data-parallel ranks, this launch "
        f"has {now} (trainer.devices × trainer.num_nodes); resume it on {before} ranks, or "
        "convert it to DeepSpeed's universal checkpoint, which any number of ranks loads: "
        f"python -m deepspeed.checkpoint.ds_to_universal --input_folder {tag} "
        f"--output_folder {checkpoint}.universal"
    )


def check_relaunch(saved: dict, current: dict, checkpoint: str, resume: str) -> None:
    """Whether the run may continue `checkpoint` (whose config is `saved`) with `current`:
    ConfigError listing the refused changes (`refused_changes`) and how to proceed for
    `resume=auto`; printed as a warning for `resume=force` or an explicit path (the launch
    names what it continues). `check_init_from` applies to every mode; for `resume=auto`, a
    data.shards_dir that now holds another corpus is one line (`moved_to_another_corpus`)."""
    check_init_from(saved, current, checkpoint)
    check_zero_ranks(saved, current, checkpoint)
    if resume == "auto" and (moved := moved_to_another_corpus(saved, current)):
        raise ConfigError(moved)
    changes = refused_changes(saved, current)
    if not changes:
        return
    listing = "\n  ".join(changes)
    if resume != "auto":
        print(
            f"warning: resume={resume}: continuing {checkpoint} although the config differs "
            f"(saved -> now):\n  {listing}",
            flush=True,
        )
        return
    raise ConfigError(
        f"the run directory holds a checkpoint ({checkpoint}) trained with another config; "
        f"these keys differ (saved -> now):\n  {listing}\n"
        f"Keys that may change between launches: {', '.join(RELAUNCH_KEYS)}; "
        f"{' and '.join(RANK_KEYS)} with the same global batch; {' and '.join(CORPUS_KEYS)} "
        "to a copy of the same corpus (the manifests' content hashes agree).\n"
        "To proceed: name a new run for this config (run_name=NAME), or start over in this "
        "directory (resume=never; the old checkpoints move to checkpoints.previous/), or "
        "continue the old run with the new values (resume=force)."
    )
