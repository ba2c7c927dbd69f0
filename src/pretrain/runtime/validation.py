"""Held-out curves during training: every `trainer.val_check_interval` optimizer steps (and at
the last step) the objective's own metrics on a fixed set of held-out batches, logged as `val/*`.

The held-out batches are the first `trainer.val_batches` full batches of the held-out shards
(`data.holdout_shards`, the last shards of the manifest), read as epoch 0 by one reader: the
same sequences and masks (keyed by seed, epoch 0 and sample key) at every evaluation, in every
launch of a run and for any number of ranks. Rank r of R evaluates batches r, r + R, ...
(their number is rounded down to a multiple of R); the sums are all-reduced, so every `val/x`
is the mean over all evaluated batches of the batch's `x` (what the objective's `forward`
returns: its loss, MLM / sentence-task accuracy, ELECTRA's generator and discriminator
metrics, ...). Perplexities are exp of the mean loss (`PERPLEXITY_OF`). Evaluation runs in
eval mode (no dropout) under a forked random state seeded by the run's seed (ELECTRA's
sampled replacements), so the training's random state is untouched.

A mixture (`data.sources`) holds out the last `data.holdout_shards` shards of each source:
the held-out batches are each source's first `trainer.val_batches`, read as that source's
own stream; `val/*` are the means over all of them, and `val/source/<name>/loss` is the
source's loss weighed by each batch's predicted tokens (`data.loader.predicted_tokens`), as
the training step weighs its micro-batches.
"""

import math
from dataclasses import replace

import lightning as L
import torch
from lightning.fabric.utilities import move_data_to_device

from pretrain.data.datamodule import open_corpus, split_holdout
from pretrain.data.input_formats import INPUT_FORMATS
from pretrain.data.loader import predicted_tokens
from pretrain.data.mixture import source_spec
from pretrain.data.reading import StreamSpec, effective_partitions
from pretrain.data.shard_format import ShardError
from pretrain.data.stages import StagedCorruption
from pretrain.data.stream import EpochStream, rows_per_sample
from pretrain.errors import ConfigError

# exp of the mean of the loss (nats per predicted token) named by the key: its perplexity;
# `nll` (seq2seq, without label smoothing) after `lm_loss`, so it wins when both are there
PERPLEXITY_OF = {
    "mlm_loss": "mlm_perplexity",
    "plm_loss": "plm_perplexity",
    "lm_loss": "lm_perplexity",
    "nll": "lm_perplexity",
}


def heldout_spec(run, spec: StreamSpec, shards_dir: str | None = None) -> StreamSpec:
    """The training stream's `spec` on the held-out shards of the run (`data.holdout_shards`
    >= 1) of `shards_dir` (default `data.shards_dir`), as one reader (rank 0 of 1), corrupted
    as the last stage of objective.stages (so held-out curves stay comparable across
    stages). `run`: the typed TrainConfig."""
    corpus = open_corpus(shards_dir or run.data.shards_dir, run.data.tokenizer_dir, run.data)
    heldout = split_holdout(corpus, run.data.holdout_shards)[1]
    shards = corpus.manifest.shards[len(corpus.manifest.shards) - len(heldout) :]
    documents = sum(shard["documents"] for shard in shards)
    corruption = spec.corruption  # objective.stages: the held-out batches use the last
    if isinstance(corruption, StagedCorruption):
        corruption = corruption.stages[-1]
    return replace(
        spec,
        corruption=corruption,
        shard_paths=heldout,
        shard_tokens=tuple(shard["tokens"] for shard in shards),
        stream_partitions=heldout_partitions(spec, documents),
        rank=0,
        world_size=1,
        tokens_per_batch=None,  # held-out batches of data.batch_size sequences
    )


def source_heldout_specs(run, spec: StreamSpec) -> dict[str, StreamSpec]:
    """{source name: `heldout_spec` of that source} of a mixture's training `spec`, each a
    one-corpus stream seeded as the source's own order (`data.mixture.source_spec`)."""
    configs = {config.name: config for config in run.data.sources}
    return {
        source.name: heldout_spec(run, source_spec(spec, source), configs[source.name].shards_dir)
        for source in spec.sources
    }


def heldout_partitions(spec: StreamSpec, documents: int) -> int:
    """The held-out stream's canonical partitions: XLNet's memory format's slots of one
    batch (its memory carried from batch to batch, one reader); else as for training, on
    the held-out shards' `documents`."""
    if INPUT_FORMATS[spec.format].memory:
        return spec.batch_size // rows_per_sample(spec)
    return effective_partitions(spec.stream_partitions, documents)


def heldout_batches(spec: StreamSpec, limit: int) -> list[dict]:
    """The first `limit` full batches (spec.batch_size sequences) of epoch 0 of the held-out
    stream `spec` (`heldout_spec`), corrupted; fewer when the shards hold fewer."""
    batches = []
    for batch in EpochStream(spec, epoch=0):
        if "input_ids" not in batch:  # a stream's marker of a shard that failed its checks
            message = next((v for v in batch.values() if isinstance(v, str)), "a bad shard")
            raise ShardError(f"held-out shards (data.holdout_shards): {message}")
        if len(batch["input_ids"]) == spec.batch_size:
            batches.append(batch)
        if len(batches) == limit:
            break
    return batches


@torch.no_grad()
def metric_sums(
    module: L.LightningModule,
    batches: list[dict],
    seed: int,
    sources: list[str] | None = None,
    names: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Sum over `batches` of the loss and every scalar metric the task `module` returns
    (`Losses`), and "batches": their number; tensors on the module's device. `sources`: the
    source name of each batch (a mixture), which adds "source/<name>/loss_x_tokens" and
    "source/<name>/tokens" for every name of `names` (zeros where none of its batches is
    here, so every rank sums the same keys). Eval mode and a forked random state seeded with
    `seed`; XLNet's carried memory starts empty and is put back afterwards."""
    device = module.device
    objective = module.objective
    memory = getattr(objective, "_mems", None), getattr(objective, "_mems_mask", None)
    if hasattr(objective, "reset_memory"):
        objective.reset_memory()
    was_training = module.training
    module.eval()
    sums: dict[str, torch.Tensor] = {}
    for name in names:
        for part in ("loss_x_tokens", "tokens"):
            sums[f"source/{name}/{part}"] = torch.zeros((), device=device)
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        for i, batch in enumerate(batches):
            out = module(move_data_to_device(batch, device))
            for key, value in out.items():
                if torch.is_tensor(value) and value.numel() == 1:
                    sums[key] = sums.get(key, 0.0) + value.detach().float().reshape(())
            if sources is not None:
                tokens = float(predicted_tokens(batch))
                sums[f"source/{sources[i]}/loss_x_tokens"] += out["loss"].detach().float() * tokens
                sums[f"source/{sources[i]}/tokens"] += tokens
    module.train(was_training)
    if hasattr(objective, "reset_memory"):
        objective._mems, objective._mems_mask = memory
    sums["batches"] = torch.tensor(float(len(batches)), device=device)
    return sums


def means_of(sums: dict[str, float]) -> dict[str, float]:
    """`val/<key>`: the mean over batches of each summed metric (`metric_sums`), plus the
    perplexities of `PERPLEXITY_OF`; a mixture's `val/source/<name>/loss`: its loss
    weighed by predicted tokens."""
    count = sums["batches"]
    means = {
        key: value / count
        for key, value in sums.items()
        if key != "batches" and not key.startswith("source/")
    }
    for key, value in sums.items():
        if key.startswith("source/") and key.endswith("/loss_x_tokens"):
            source = key.removesuffix("/loss_x_tokens")
            means[f"{source}/loss"] = value / max(sums[f"{source}/tokens"], 1.0)
    for loss, perplexity in PERPLEXITY_OF.items():
        if loss in means:
            means[perplexity] = math.exp(min(means[loss], 700.0))
    return {f"val/{key}": value for key, value in sorted(means.items())}


class HeldoutEvaluation(L.Callback):
    """Evaluates the module on the held-out batches after every `every_n_steps`-th optimizer
    step and the last (`max_steps`), reduces over ranks and logs `val/*` at that step (rank
    0, to every logger; also into `trainer.callback_metrics`, hence the wandb summary)."""

    def __init__(
        self,
        spec: StreamSpec,
        every_n_steps: int,
        max_batches: int,
        seed: int,
        sources: dict[str, StreamSpec] | None = None,
    ):
        self.spec = spec  # the held-out stream (`heldout_spec`)
        self.sources = sources or {}  # a mixture's held-out stream of each source, by name
        self.every_n_steps = every_n_steps  # optimizer steps
        self.max_batches = max_batches  # held-out batches per evaluation (per source), all ranks
        self.seed = seed  # of the random draws made while evaluating
        self.batches: list[dict] = []
        self.batch_sources: list[str] | None = None  # each batch's source (a mixture)
        self._last_step = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        ranks, rank = trainer.world_size, trainer.global_rank
        self.batches, names = [], []
        for name, spec in self.sources.items() or [("", self.spec)]:
            available = heldout_batches(spec, self.max_batches)
            usable = len(available) // ranks * ranks
            if usable == 0:
                where = f" of source {name}" if name else ""
                raise ConfigError(
                    f"data.holdout_shards = {len(spec.shard_paths)}: the held-out shards{where} "
                    f"give {len(available)} full batches of {spec.batch_size} sequences, fewer "
                    f"than the {ranks} ranks; hold out more shards or set "
                    "trainer.val_check_interval=null"
                )
            mine = available[rank:usable:ranks]
            self.batches += mine
            names += [name] * len(mine)
        self.batch_sources = names if self.sources else None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # a resumed run evaluated this step already

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_) -> None:
        step = trainer.global_step
        due = step % self.every_n_steps == 0 or step >= trainer.max_steps
        if step == self._last_step or not due:
            return
        self._last_step = step
        metrics = self.evaluate(trainer, pl_module)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """`val/*` of the module now, the same on every rank (one all-reduce)."""
        with trainer.strategy.precision_plugin.val_step_context():
            sums = metric_sums(
                pl_module, self.batches, self.seed, self.batch_sources, tuple(self.sources)
            )
        keys = sorted(sums)
        total = trainer.strategy.reduce(torch.stack([sums[k] for k in keys]), reduce_op="sum")
        return means_of(dict(zip(keys, total.tolist(), strict=True)))


def heldout_callbacks(run, spec: StreamSpec) -> list[L.Callback]:
    """[HeldoutEvaluation] when the run holds out shards (`data.holdout_shards` >= 1) and
    `trainer.val_check_interval` is set; else none. `run`: the typed TrainConfig; `spec`: the
    training stream's."""
    every = run.trainer.val_check_interval
    if not run.data.holdout_shards or not every:
        return []
    if spec.sources:  # a mixture: each source's held-out shards
        sources = source_heldout_specs(run, spec)
        first = next(iter(sources.values()))
        return [HeldoutEvaluation(first, every, run.trainer.val_batches, run.seed, sources)]
    return [HeldoutEvaluation(heldout_spec(run, spec), every, run.trainer.val_batches, run.seed)]
