"""What every objective's LightningModule shares: the optimizer recipe and schedule, the
composed config and random-number state in checkpoints, and throughput logging."""

import random
import time
from collections.abc import Callable

import lightning as L
import numpy as np
import torch
from hydra.utils import instantiate
from torch.optim.lr_scheduler import LambdaLR

from pretrain.data.vocab import Vocabulary


def warmup_then_decay(warmup_steps: int, total_steps: int, schedule: str) -> Callable[[int], float]:
    """Learning-rate multiplier at an optimizer step: linear warm-up over `warmup_steps`, then
    constant or linear decay to 0 at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def rng_state() -> dict:
    """Torch, numpy and Python random states as checkpoint-safe containers."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = {
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": pos,
        "has_gauss": has_gauss,
        "gauss": gauss,
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class PretrainingModule(L.LightningModule):
    """Base of the objective modules. `config` is the composed run config as plain dicts;
    subclasses build model and heads in __init__ and define `build_corruption`."""

    def __init__(self, config: dict, vocab: Vocabulary):
        super().__init__()
        self.config = config
        self.vocab = vocab
        self._restored_rng: dict | None = None
        self._tokens_since_log = 0
        self._last_log_time = time.perf_counter()
        self._last_mlm_loss: torch.Tensor | None = None
        self.loss_history: list[tuple[int, float]] = []

    @classmethod
    def build_corruption(cls, config: dict, vocab: Vocabulary) -> Callable[[dict, int], dict]:
        """The picklable transform data-loader workers apply to each batch: (batch, epoch) -> batch."""
        raise NotImplementedError

    def configure_optimizers(self) -> dict:
        optim = self.config["optim"]
        decay = [p for p in self.parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [
            p for p in self.parameters() if p.requires_grad and p.ndim < 2
        ]  # biases, LayerNorm
        optimizer = instantiate(optim["optimizer"])(
            [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        )
        factor = warmup_then_decay(
            optim["warmup_steps"], self.config["trainer"]["max_steps"], optim["schedule"]
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": LambdaLR(optimizer, factor), "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["config"] = self.config
        checkpoint["rng"] = rng_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Applied at the first batch, after the data loaders have been built, exactly where
        # the interrupted run stood when it saved.
        self._restored_rng = checkpoint.get("rng")

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        if self._restored_rng is not None:
            set_rng_state(self._restored_rng)
            self._restored_rng = None

    def log_step(self, metrics: dict[str, torch.Tensor], batch: dict) -> None:
        """Log a micro-batch's metrics under train/ and count its non-padding input tokens."""
        batch_size = batch["input_ids"].shape[0]
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, batch_size=batch_size)
        self.log("loss", metrics["loss"], prog_bar=True, logger=False, batch_size=batch_size)
        # device tensors, read back only on log steps: never a host sync per step
        self._tokens_since_log = self._tokens_since_log + batch["attention_mask"].sum()
        self._last_mlm_loss = metrics.get("mlm_loss")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per optimizer step (after all accumulated micro-batches): the learning rate,
        and on log steps the MLM loss for the summary and tokens/s since the last log."""
        self.log("train/lr", optimizer.param_groups[0]["lr"])
        every = self.trainer.log_every_n_steps
        if self.global_step % every == 0 and self._last_mlm_loss is not None:
            self.loss_history.append((self.global_step, float(self._last_mlm_loss.detach())))
        if (self.global_step + 1) % every == 0:
            now = time.perf_counter()
            rate = float(self._tokens_since_log) / max(now - self._last_log_time, 1e-9)
            self.log("train/tokens_per_s", rate)
            self._tokens_since_log, self._last_log_time = 0, now
