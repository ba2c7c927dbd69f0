"""The LightningDataModule: opens and checks a prepared corpus, serves one stream per epoch,
and records its position in checkpoints so a resumed run sees the same batches."""

import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch

from pretrain.data.batch_warmup import BatchSizeWarmup
from pretrain.data.loader import StepAlignedLoader
from pretrain.data.mixing import source_samples
from pretrain.data.node_manifest import TABLES_DIR, open_manifest
from pretrain.data.positions import POSITION_FORMAT, PartitionPosition, positions_from_saved
from pretrain.data.reading import StreamSpec
from pretrain.data.shard_checks import repeat_message, repeated_shards
from pretrain.data.shard_format import (
    Manifest,
    ShardError,
    check_shards,
    check_tokenizer,
    verify_shard,
)
from pretrain.data.shard_table import ShardPaths
from pretrain.data.stream import EpochStream, check_world_size, rows_per_sample
from pretrain.data.vocab import Vocabulary, load_vocabulary
from pretrain.data.worker_processes import init_data_worker, worker_context
from pretrain.errors import ConfigError, write_line
from pretrain.lightning_compat import batches_done_this_epoch, restart_epoch_counters
from pretrain.storage import (
    RetryPolicy,
    StorageError,
    StorageSpec,
    check_remote_shards,
    default_cache_dir,
    is_url,
    local_path,
    mirror_corpus,
    pin_shard,
    redact,
)
from pretrain.storage.corpus import ShardRecords

# `data` below is pretrain.config's DataConfig, named in docstrings: the run config sits above
# data (its checks read the format registry), so data cannot import it.


@dataclass(frozen=True)
class Corpus:
    """A checked, prepared corpus: its manifest, tokenizer directory and special ids; for a
    corpus at a URL, `storage` says how its shards reach the local cache (the manifest's
    root, where its shard paths lie, is the corpus's directory in the cache)."""

    manifest: Manifest
    tokenizer_dir: Path
    vocab: Vocabulary
    storage: StorageSpec | None = None


def open_corpus(
    shards_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    data: Any = None,
) -> Corpus:
    """Load and check the manifest, every shard's presence and size, and that the tokenizer is
    the one the shards were made with. `shards_dir` may be a URL (s3://, gs://, http(s)://,
    ...): its manifest and tokenizer are mirrored into the cache of `data` (the typed
    DataConfig: cache_dir, cache_limit, prefetch_shards, download_attempts, storage_options)
    and its shards fetched when read. Errors name `data.shards_dir` / `data.tokenizer_dir`
    and the file at fault."""
    storage = None
    try:
        tables = Path(getattr(data, "cache_dir", None) or default_cache_dir()) / TABLES_DIR
        if is_url(shards_dir):
            storage, listing = remote_storage(str(shards_dir), data)
            manifest = open_manifest(storage.root, tables)
            check_remote_shards(storage.url, manifest.shards, listing)
            order = manifest.table.arrays["name_order"]
            storage = replace(
                storage,
                shards=ShardRecords.from_sorted(
                    manifest.table.arrays["sorted_names"],
                    manifest.table.arrays["bytes"][order],
                    manifest.table.arrays["sha256"][order],
                ),
            )
        else:
            manifest = open_manifest(local_path(str(shards_dir)), tables)
            check_shards(manifest)
        tokenizer = Path(tokenizer_dir).resolve() if tokenizer_dir else manifest.tokenizer_dir
        check_tokenizer(manifest, tokenizer)
        vocab = load_vocabulary(tokenizer)
        if vocab.size != manifest.vocab_size:
            raise ShardError(
                f"the manifest of {manifest.root} gives vocab_size {manifest.vocab_size}, its "
                f"tokenizer {tokenizer} has {vocab.size} tokens (a manifest edited by hand?)"
            )
    except (ShardError, ValueError, StorageError) as error:
        raise ShardError(
            f"data.shards_dir={redact(str(shards_dir))} data.tokenizer_dir={tokenizer_dir}: {error}"
        ) from error
    return Corpus(manifest, tokenizer, vocab, storage)


def remote_storage(url: str, data: Any = None) -> tuple[StorageSpec, dict[str, int] | None]:
    """Mirror the manifest and tokenizer of the corpus at `url` into the cache that `data`
    (a DataConfig, or None for the defaults) names; (its StorageSpec, without shard records
    yet, as the caller checks the manifest; {object: bytes} at the URL, None where the
    storage cannot list)."""
    options = json.dumps(getattr(data, "storage_options", None) or {}, sort_keys=True)
    cache_dir = getattr(data, "cache_dir", None) or default_cache_dir()
    retry = RetryPolicy(attempts=getattr(data, "download_attempts", 5))
    root, objects = mirror_corpus(url, Path(cache_dir), options, retry)
    spec = StorageSpec(
        url=url,
        root=str(root),
        shards=(),
        limit_bytes=getattr(data, "cache_limit", None),
        prefetch_shards=getattr(data, "prefetch_shards", 8),
        retry=retry,
        options_json=options,
    )
    return spec, objects


def split_holdout(corpus: Corpus, holdout_shards: int) -> tuple[ShardPaths, ShardPaths]:
    """(training shard paths, held-out shard paths), each a `ShardPaths` (a sequence of str):
    the last `holdout_shards` shards of the manifest are kept out of training for evaluation."""
    paths = corpus.manifest.shard_path_table
    if holdout_shards >= len(paths):
        raise ShardError(
            f"data.holdout_shards = {holdout_shards}: the corpus {corpus.manifest.root} has only {len(paths)} "
            "shards; hold out fewer, or prepare it with a smaller docs_per_shard"
        )
    cut = len(paths) - holdout_shards
    return paths.take(range(cut)), paths.take(range(cut, len(paths)))


def verified_shards(
    manifest: Manifest,
    indices: range | list[int],
    bad_shards: str,
    storage: StorageSpec | None = None,
) -> list[int]:
    """Those of the shards `indices` that pass `verify_shard` (data.verify_shards=true),
    read whole with a progress bar (fetched into the cache first, for a corpus at a URL:
    `storage`). A bad shard raises ShardError (data.bad_shards=error) or is left out with a
    warning line naming it (skip); the count left out is printed."""
    from tqdm import tqdm

    good = []
    for index in tqdm(indices, desc="verifying shards", unit="shard", disable=None):
        path = manifest.shard_paths[index]
        try:
            with pin_shard(storage, path.name) if storage else nullcontext(path):
                verify_shard(manifest.shards[index], path)
        except (ShardError, StorageError) as error:
            if bad_shards == "error":
                raise ShardError(f"data.verify_shards: {error}") from error
            write_line(f"warning: data.bad_shards=skip: left out {error}")
            continue
        good.append(index)
    if not good:
        raise ShardError(f"{manifest.root}: every training shard failed its checks")
    if len(good) < len(indices):
        print(
            f"data.bad_shards=skip: {len(indices) - len(good)} of {len(indices)} training "
            "shards failed their checks and are left out",
            file=sys.stderr,
            flush=True,
        )
    return good


def unrepeated_shards(manifest: Manifest, indices: range | list[int], bad_shards: str) -> list[int]:
    """Those of the shards `indices` whose content repeats no other shard of the manifest (by
    the manifest's sha256 of each shard and of each block, `repeated_shards`: a shard copied
    under another name, blocks written twice). A repeat raises ShardError naming both
    (data.bad_shards=error) or is left out with a warning line (skip), the count printed."""
    table = manifest.table
    repeats = table.repeats() if table is not None else repeated_shards(manifest.shards)
    kept = [index for index in indices if index not in repeats]
    for index in indices:
        if index in repeats:
            message = repeat_message(manifest, index, repeats[index])
            if bad_shards == "error":
                raise ShardError(message)
            write_line(f"warning: data.bad_shards=skip: left out {message}")
    if len(kept) < len(indices):
        print(
            f"data.bad_shards=skip: {len(indices) - len(kept)} of {len(indices)} training "
            "shards repeat another shard's content and are left out",
            file=sys.stderr,
            flush=True,
        )
    return kept


class PretrainingDataModule(L.LightningDataModule):
    """Serves `EpochStream(spec, epoch)` in whole optimizer steps (`StepAlignedLoader`,
    so every rank ends the epoch at the same step); the loader is rebuilt every epoch (the
    Trainer runs with reload_dataloaders_every_n_epochs=1) so each epoch has its own shard
    order, shuffle and masks. Every epoch's workers are forked by a forkserver that does not
    grow with the run, not by the main process (`worker_processes`)."""

    def __init__(
        self,
        spec: StreamSpec,
        num_workers: int = 0,
        pin_memory: bool = False,  # page-locked batches (trainer.pin_memory, on CUDA)
        batch_warmup: BatchSizeWarmup | None = None,  # data.batch_size_warmup_* (steps' sizes)
    ):
        super().__init__()
        self.spec = spec
        self.batch_warmup = batch_warmup
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._resume: dict | None = None
        self._loader: StepAlignedLoader | None = None
        self._loader_epoch = -1
        self._start_samples = 0  # where this launch's epoch began, in global samples

    def setup(self, stage: str) -> None:
        """Start the forkserver of the workers now, before the model's set-up, so it has
        imported torch by the time the first loader forks its workers (after Lightning has
        installed its own signal handlers, which the training loop only then takes back)."""
        worker_context(self.num_workers, self.spec.corruption)

    def train_dataloader(self) -> StepAlignedLoader:
        trainer = self.trainer
        epoch = trainer.current_epoch if trainer else 0
        spec = self.spec
        if trainer is not None:
            spec = replace(
                spec,
                rank=trainer.global_rank,
                world_size=trainer.world_size,
                accumulation=trainer.accumulate_grad_batches,
            )
        check_token_budget(spec)
        check_world_size(spec)  # token budgets deal whole partitions to ranks
        self._start_samples = 0
        positions = None
        if self._resume and self._resume["epoch"] == epoch:
            self._start_samples = resume_position(self._resume, spec)
            positions = self._resume.get("partitions")
            # batch_idx (and so Lightning's accumulation phase) restarts at this position,
            # which may have been reached with another micro-batch size or accumulation
            restart_epoch_counters(trainer)
        self._resume = None
        self.teardown("fit")  # the previous epoch's loader and its workers
        self._loader_epoch = epoch
        self._loader = StepAlignedLoader(
            EpochStream(
                spec, epoch, self._start_samples, errors_as_batches=True, positions=positions
            ),
            accumulation=trainer.accumulate_grad_batches if trainer else 1,
            full_batch=None if spec.tokens_per_batch else spec.batch_size,
            start_positions=positions,
            # each micro-batch's loss weighed by its share of the step's loss tokens (all
            # ranks) wherever a step has several: the same gradient and loss for any reshape
            weigh_steps=bool(spec.tokens_per_batch) or spec.world_size * spec.accumulation > 1,
            step_batches=self._step_batches(trainer, spec),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=False,
            # not forked from a grown process
            multiprocessing_context=worker_context(self.num_workers, spec.corruption),
            generator=torch.Generator().manual_seed(spec.seed),  # keeps the global RNG untouched
            worker_init_fn=init_data_worker,  # SLURM's signals ignored; ends with the main process
        )
        return self._loader

    def _step_batches(self, trainer, spec: StreamSpec):
        """With the batch-size warm-up: the real micro-batches of the loader's n-th step (its
        first is the trainer's global step now), else None."""
        if self.batch_warmup is None:
            return None
        first = trainer.global_step if trainer else 0
        return partial(
            _warmup_step_batches, self.batch_warmup, first, spec.batch_size * spec.world_size
        )

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        """What the module adds to a batch on the host (`PretrainingTask.host_batch`)."""
        return self.trainer.lightning_module.host_batch(batch)

    def teardown(self, stage: str) -> None:
        """Stop the data-loader workers (at the end of fit, and before each new epoch's)."""
        if self._loader is not None:
            self._loader.close()

    def dead_workers(self) -> list[int]:
        """Pids of the current loader's data-loader workers that died unasked (`run.py`)."""
        return self._loader.dead_workers() if self._loader is not None else []

    def state_dict(self) -> dict:
        """Position in the stream: the epoch, the global samples of its order consumed (all
        ranks), each canonical partition's position after them ("partitions", gathered from
        every rank: {partition: `PartitionPosition`}, where a resume seeks,
        `stream.rank_sequences`; saved as lists, in `POSITION_FORMAT`), and the
        training shards' tokens (an epoch's, for an export to find its stage). With
        batches of varying size (tokens_per_batch) or of two rows a sample (XLNet's bi_data),
        the samples are counted from the partitions' positions. Called on every rank alike
        (each saves or helps save)."""
        trainer = self.trainer
        trained = batches_done_this_epoch(trainer)
        loader = trainer.train_dataloader
        aligned = isinstance(loader, StepAlignedLoader)
        samples = trained * self.spec.batch_size * trainer.world_size
        positions = {}
        if aligned and self._loader_epoch == trainer.current_epoch:
            positions = loader.partition_positions(trained)
        positions = gather_positions(positions)
        if self.spec.tokens_per_batch or self.batch_warmup or rows_per_sample(self.spec) > 1:
            samples = sum(position.samples for position in positions.values())  # the partitions'
        else:
            samples += self._start_samples
        return {
            "epoch": trainer.current_epoch,
            "samples": samples,
            # plain lists: a checkpoint holds no class of ours (`checkpoint.safety`)
            "partitions": {partition: list(p) for partition, p in positions.items()},
            "position_format": POSITION_FORMAT,
            "epoch_tokens": sum(self.spec.shard_tokens),  # T of objective.stages' progress
            # a mixture's samples of the epoch per source (data/mixture.py); {} for one corpus
            "source_samples": source_samples(self.spec, samples, trainer.current_epoch),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """A checkpoint's position, of any format so far (`positions.position_from_saved`)."""
        self._resume = dict(state_dict)
        self._resume["partitions"] = positions_from_saved(state_dict.get("partitions"))


def _warmup_step_batches(warmup: BatchSizeWarmup, first_step: int, per_pass: int, n: int) -> int:
    """Real micro-batches per rank of optimizer step first_step + n (`StepAlignedLoader`)."""
    return warmup.micro_batches(first_step + n, per_pass)


def check_token_budget(spec: StreamSpec) -> None:
    """With data.tokens_per_batch, every partition must fill every micro-step's window
    (tokens_per_batch / (partitions x accumulation) tokens) with at least one sequence, and
    the format must be one of separate sequences: ConfigError naming the key otherwise."""
    if not spec.tokens_per_batch:
        return
    from pretrain.data.input_formats import INPUT_FORMATS

    if INPUT_FORMATS[spec.format].memory:
        raise ConfigError(
            f"data.tokens_per_batch = {spec.tokens_per_batch}: the {spec.format} format keeps "
            "a memory per batch slot and needs fixed batches; set data.tokens_per_batch=null"
        )
    least = spec.stream_partitions * spec.accumulation * spec.max_seq_length
    if spec.tokens_per_batch < least:
        raise ConfigError(
            f"data.tokens_per_batch = {spec.tokens_per_batch}: must be at least {least} = "
            f"{spec.stream_partitions} stream partitions x {spec.accumulation} accumulated "
            f"micro-batches x data.max_seq_length {spec.max_seq_length}, so that every "
            "partition adds a sequence to every micro-batch; raise it, or lower "
            "data.stream_partitions or the accumulation"
        )


def gather_positions(
    positions: dict[int, PartitionPosition],
) -> dict[int, PartitionPosition]:
    """The partitions' positions of every rank (each knows those it read), merged: for each
    partition the furthest (most samples). Itself alone in a one-process run."""
    import torch.distributed as dist

    from pretrain.cluster.collectives import host_group

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return positions
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, positions, group=host_group())
    merged: dict[int, PartitionPosition] = {}
    for rank_positions in gathered:
        for partition, position in (rank_positions or {}).items():
            if partition not in merged or position.samples > merged[partition].samples:
                merged[partition] = position
    return merged


def resume_position(state: dict, spec: StreamSpec) -> int:
    """Global samples consumed of a saved position. Checkpoints from before positions were
    counted in samples hold batches of the same shape only."""
    if "samples" in state:
        return state["samples"]
    return state["batches"] * spec.batch_size * spec.world_size
