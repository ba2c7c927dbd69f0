"""Cumulative progress of a run, the x axes of `pretrain-compare`: non-padding input tokens
and samples trained (all ranks, the logged step's batch included) and wall-clock seconds of
training, logged as `train/tokens_seen`, `train/samples_seen` and `train/elapsed_s` with the
training metrics of every log step. They are saved in checkpoints (callback state), so a
resumed run continues its counts; the time between two launches is not counted. A mixture
of corpora (data.sources) adds each source's samples and tokens, `train/source/<name>/samples`
and `.../tokens`, counted from the rows' sources (`data.mixing.SOURCE_KEY`) the same way."""

import time

import lightning as L
import torch

from pretrain.cluster.collectives import sum_on_device
from pretrain.data.batch_warmup import is_skipped_batch
from pretrain.data.mixing import SOURCE_KEY


class ProgressLog(L.Callback):
    """Counts each micro-batch's tokens on the device and its samples on the host; after every
    optimizer step one all-reduce (`sum_on_device`: stream-ordered, no host sync) adds both to
    the run's totals, which are read back on log steps only."""

    def __init__(self) -> None:
        self.tokens = self.samples = 0  # before this launch (from the checkpoint)
        self.elapsed_s = 0.0
        self._launch: torch.Tensor | None = None  # (tokens, samples) of this launch, all ranks
        self._pending: torch.Tensor | None = None  # this rank's tokens, since the last step
        self._pending_samples = 0  # and samples (a host count: no copy to the device)
        self._start = time.monotonic()
        self._last_step = -1
        self.sources: tuple[str, ...] = ()  # a mixture's source names (on_train_start)
        self.source_counts: dict[str, list[int]] = {}  # {name: [samples, tokens]} before

    def state_dict(self) -> dict:
        totals = self._launch.tolist() if self._launch is not None else [0, 0]
        tokens, samples = totals[:2]
        state = {
            "tokens": self.tokens + int(tokens),
            "samples": self.samples + int(samples),
            "elapsed_s": self._elapsed(),
        }
        if self.sources:
            state["sources"] = self._source_totals(totals[2:])
        return state

    def load_state_dict(self, state: dict) -> None:
        self.tokens, self.samples = state["tokens"], state["samples"]
        self.elapsed_s = state["elapsed_s"]
        self.source_counts = {k: list(v) for k, v in state.get("sources", {}).items()}

    def _source_totals(self, launch: list) -> dict[str, list[int]]:
        """{source: [samples, tokens]} of the run: the checkpoint's and this launch's."""
        out = {}
        for i, name in enumerate(self.sources):
            before = self.source_counts.get(name, [0, 0])
            here = launch[2 * i : 2 * i + 2] or [0, 0]
            out[name] = [int(before[0] + here[0]), int(before[1] + here[1])]
        return out

    def _elapsed(self) -> float:
        return self.elapsed_s + time.monotonic() - self._start

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()
        self._last_step = trainer.global_step
        self._launch = self._pending = None
        self._pending_samples = 0
        spec = getattr(getattr(trainer, "datamodule", None), "spec", None)
        self.sources = tuple(source.name for source in getattr(spec, "sources", ()))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if is_skipped_batch(batch):  # a warm-up step's marker: no samples, never its last
            return
        mask = batch["attention_mask"]  # (batch, seq)
        tokens = mask.sum()
        if self.sources:  # (samples, tokens) of each source after the batch's totals
            per_source = torch.zeros(len(self.sources), 2, device=mask.device, dtype=mask.dtype)
            rows = batch[SOURCE_KEY]
            per_source.index_add_(0, rows, torch.stack([torch.ones_like(rows), mask.sum(1)], 1))
            tokens = torch.cat([tokens[None], per_source.flatten()])
        self._pending = tokens if self._pending is None else self._pending + tokens
        self._pending_samples += mask.shape[0]
        step = trainer.global_step
        if step != self._last_step:  # an optimizer step was taken: add every rank's counts
            self._last_step = step
            pending = self._pending.reshape(-1)  # tokens, then each source's samples, tokens
            samples = torch.full_like(pending[:1], self._pending_samples)  # a fill, not a copy
            total = sum_on_device(torch.cat([pending[:1], samples, pending[1:]]).double())
            self._launch = total if self._launch is None else self._launch + total
            self._pending, self._pending_samples = None, 0
        else:  # inside an accumulation: the step's row gets its counts at its last micro-batch
            return
        # in the row of the step's training metrics, which Lightning writes on log steps
        row = {
            "train/tokens_seen": self._launch[0] + self.tokens,
            "train/samples_seen": self._launch[1] + self.samples,
            "train/elapsed_s": self._elapsed(),
        }
        for i, name in enumerate(self.sources):
            before = self.source_counts.get(name, [0, 0])
            row[f"train/source/{name}/samples"] = self._launch[2 + 2 * i] + before[0]
            row[f"train/source/{name}/tokens"] = self._launch[3 + 2 * i] + before[1]
        pl_module.queue_log(row)


def is_log_step(steps_done: int, every: int, max_steps: int) -> bool:
    """Whether the optimizer step that completes `steps_done` steps of the run is a log step:
    every `every` steps (trainer.log_every_n_steps) and the run's last (trainer.max_steps),
    whose metrics row, step line and summary loss are always written."""
    return steps_done % every == 0 or steps_done >= max_steps
