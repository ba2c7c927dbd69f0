"""XLNet's objective: permutation language modelling with partial prediction.

Corruption (data-loader workers, `PermutationCorruption`): the input is left as it is; a
factorization order is drawn per sequence (pretrain.data.permutation) and becomes
`perm_mask` (batch, seq, seq), `target_mapping` (batch, num_predict, seq) and
`target_labels` (batch, num_predict); `labels` (batch, seq) and `target_rank` (batch, seq)
are kept for previews. Loss: cross-entropy of the query stream's predictions at the targets
(the last 1/K of the order, K = 6). num_predict comes from a fixed set of widths whose base
is ceil(data.max_seq_length / K) (`pretrain.data.prediction_budget`), so the query stream and
the head see a bounded set of shapes; unused slots have target label IGNORE_INDEX.

With memory (data.format=xlnet_memory), as XLNet's data_utils.py does with reuse_len > 0:
the reuse part (the first reuse_len positions, whose hidden states become the next segment's
memory) and the rest are permuted separately, each with 1/K of its candidates as targets;
the reuse part may not attend to the rest (which holds the next segment's text, so the
memory never carries a token the next segment predicts) and the rest sees the reuse part.

Memory (data.format=xlnet_memory): the module keeps the encoder's memory between training
steps (detached), one per micro-batch of the step (the same rows of the next step continue
the same slots, `stream.memory_rows`), and masks a row's memory when the batch flags
`new_document` for it. Checkpoints save it by global memory row (every rank's, gathered), and
a resume on any shape (ranks, accumulation, micro-batch) takes its own rows' memory back, so
it continues as if never stopped. Other formats train without memory.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pretrain.config import TrainConfig
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.permutation import (
    Permutation,
    perm_mask_from,
    span_order,
    target_mapping_from,
    uniform_order,
)
from pretrain.data.prediction_budget import prediction_widths, width_for
from pretrain.data.stream import memory_rows
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.build import build_encoder
from pretrain.models.flops import xlnet_flops
from pretrain.models.xlnet import XLNetLMHead
from pretrain.objectives.base import Losses, Objective
from pretrain.objectives.predictions import masked_classification_metrics
from pretrain.objectives.xlnet_config import PermutationLMConfig

if TYPE_CHECKING:
    import lightning as L


@dataclass(frozen=True)
class PermutationCorruption:
    """(batch, epoch) -> batch + perm_mask, target_mapping, target_labels, labels, target_rank.
    Draws are keyed by (seed, epoch, sequence key); the stream passes the epoch that seeds
    them (under static masking epoch % dupe_factor).
    `reuse_len`, `bi_data` (model.*) and `memory_random_b_probability` are read by the
    xlnet_memory stream; `max_seq_length` (the run's data.max_seq_length; None: the batch's
    width) sizes num_predict."""

    seed: int
    special_ids: tuple[int, ...]
    partial_prediction_k: float = PermutationLMConfig.partial_prediction_k
    order: str = PermutationLMConfig.order
    max_span_length: int = PermutationLMConfig.max_span_length
    reuse_len: int | None = None
    max_seq_length: int | None = None
    bi_data: bool = False
    memory_random_b_probability: float = PermutationLMConfig.memory_random_b_probability

    def prediction_widths(self, max_seq_length: int) -> tuple[int, ...]:
        """The values num_predict may take for sequences of `max_seq_length`."""
        return prediction_widths(max_seq_length / self.partial_prediction_k, max_seq_length)

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """The batch axes this corruption sizes (`prediction_budget.shape_set`)."""
        return {"predictions": self.prediction_widths(max_seq_length)}

    def order_of(
        self, candidates: np.ndarray, keys: list[str], epoch: int, reuse: int = 0
    ) -> Permutation:
        """The factorization order of each row's `candidates` (batch, seq) bool; with
        `reuse`, the first `reuse` positions and the rest as two parts (`two_part_order`)."""
        k = self.partial_prediction_k
        if self.order == "uniform":
            hashes = key_hashes(keys)
            return uniform_order(candidates, hashes, seed=self.seed, epoch=epoch, k=k, reuse=reuse)
        orders = [
            span_order(
                part,
                part_keys,
                seed=self.seed,
                epoch=epoch,
                k=k,
                max_span_length=self.max_span_length,
            )  # fmt: skip
            for part, part_keys in self._parts(candidates, keys, reuse)
        ]
        if len(orders) == 1:
            return orders[0]
        first = np.arange(candidates.shape[1]) < reuse
        rank = np.where(first, orders[0].rank, orders[1].rank)
        return Permutation(rank, orders[0].targets | orders[1].targets)

    @staticmethod
    def _parts(candidates: np.ndarray, keys: list[str], reuse: int) -> list:
        """(candidates, keys) of each part: the whole row, or with `reuse` the first `reuse`
        positions and the rest (keyed apart)."""
        if not reuse:
            return [(candidates, keys)]
        first = np.arange(candidates.shape[1]) < reuse
        return [(candidates & first, keys), (candidates & ~first, [f"{k}/non-reuse" for k in keys])]

    def two_part_order(
        self, candidates: np.ndarray, keys: list[str], epoch: int, reuse: int
    ) -> tuple[Permutation, np.ndarray]:
        """XLNet's memory layout (data_utils.py, reuse_len > 0): the first `reuse` positions
        (whose hidden states become the next segment's memory) and the rest are permuted
        separately, each with its own 1/K of targets; the reuse part may not see the rest,
        the rest sees all of the reuse part. Returns (the joint order, perm_mask (batch, seq,
        seq))."""
        perm = self.order_of(candidates, keys, epoch, reuse)
        perm_mask = perm_mask_from(perm)  # within each part: its own order
        perm_mask[:, :reuse, reuse:] = True  # the reuse part is blocked from the rest
        perm_mask[:, reuse:, :reuse] = False  # the rest sees the whole reuse part
        return perm, perm_mask

    def __call__(self, batch: dict, epoch: int) -> dict:
        ids = batch["input_ids"]
        candidates = batch["attention_mask"].astype(bool)
        for special in self.special_ids:
            candidates &= ids != special
        if "new_document" in batch:  # xlnet_memory: the stream's reuse part comes first
            reuse = self.reuse_len or (self.max_seq_length or ids.shape[1]) // 2  # as the stream
            perm, batch["perm_mask"] = self.two_part_order(candidates, batch["keys"], epoch, reuse)
        else:
            perm = self.order_of(candidates, batch["keys"], epoch)
            batch["perm_mask"] = perm_mask_from(perm)
        widths = self.prediction_widths(self.max_seq_length or ids.shape[1])
        num_predict = width_for(int(perm.targets.sum(axis=1).max(initial=0)), widths)
        mapping, target_labels, _ = target_mapping_from(perm, ids, num_predict)
        batch["target_mapping"], batch["target_labels"] = mapping, target_labels
        batch["labels"] = np.where(perm.targets, ids, IGNORE_INDEX)
        batch["target_rank"] = perm.rank
        return batch


class PermutationLanguageModel(Objective):
    """XLNet encoder + tied LM head on the query stream; loss over the targets only."""

    summary_metric = "plm_loss"

    config_class = PermutationLMConfig
    corruption_class = PermutationCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        self.encoder = build_encoder(self.run.model, vocab.size, vocab.pad)
        self.lm_head = XLNetLMHead(vocab.size)
        self.use_memory = self.run.data.format == "xlnet_memory"
        # per micro-batch of the step (batch_idx % accumulation): per layer (batch, mlen,
        # d_model), and (batch, mlen) bool
        self._mems: dict[int, list[torch.Tensor]] = {}
        self._mems_mask: dict[int, torch.Tensor] = {}
        self._phase = 0  # the current micro-batch of the optimizer step
        self._restored_memory: dict | None = None

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        bi_data = bool(getattr(config.model, "bi_data", False))
        if bi_data and config.data.format != "xlnet_memory":
            raise ConfigError(
                f"model.bi_data = true needs data.format=xlnet_memory (not {config.data.format!r}):"
                " only its batches have a fixed forward half and backward half"
            )
        return {
            "special_ids": vocab.special_ids,
            "reuse_len": config.model.reuse_len,
            "max_seq_length": config.data.max_seq_length,
            "bi_data": bi_data,
        }

    def carried_memory(self, batch: dict) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
        """The memory for this batch: the last step's of the same micro-batch, with the rows
        that start a new document masked out; None at the start or when the batch size
        changed."""
        mems = self._mems.get(self._phase) if self.use_memory else None
        if mems is None or mems[0].shape[0] != batch["input_ids"].shape[0]:
            return None, None
        mask = self._mems_mask[self._phase]
        if "new_document" in batch:
            mask = mask & ~batch["new_document"].bool()[:, None]
        return mems, mask

    def reset_memory(self) -> None:
        """Forget the carried memory (a new epoch, a resumed run)."""
        self._mems, self._mems_mask = {}, {}

    def start_epoch(self, task: "L.LightningModule") -> None:
        self.reset_memory()

    def start_batch(self, task: "L.LightningModule", batch: dict, batch_idx: int) -> None:
        """The step's micro-batch; at the first batch of a run resumed inside an epoch, take
        back this shape's rows of the memory its checkpoint saved, so it continues as if never
        stopped."""
        self._phase = batch_idx % task.trainer.accumulate_grad_batches
        restored, self._restored_memory = self._restored_memory, None
        if restored is not None and restored["epoch"] == task.current_epoch:
            rows = torch.from_numpy(self.memory_rows(task))  # (accumulation, batch)
            for phase, phase_rows in enumerate(rows):
                self._mems[phase] = [m[phase_rows].to(task.device) for m in restored["mems"]]
                self._mems_mask[phase] = restored["mask"][phase_rows].to(task.device)

    def memory_rows(self, task: "L.LightningModule") -> np.ndarray:
        """(accumulation, batch) global memory row of each row of this rank's micro-batches
        (`stream.memory_rows`) in the run `task` trains."""
        trainer = task.trainer
        return memory_rows(
            trainer.global_rank,
            trainer.world_size,
            trainer.accumulate_grad_batches,
            self.run.data.batch_size,
            bool(getattr(self.run.model, "bi_data", False)),
        )

    def save_state(self, task: "L.LightningModule", checkpoint: dict) -> None:
        """Save the carried memory, by global memory row (`memory_rows`): every rank's rows,
        gathered, each row's memory (rows, mlen, d_model) per layer and mask (rows, mlen)."""
        if not self.use_memory:
            return
        strategy = task.trainer.strategy
        rows = self.memory_rows(task)  # (accumulation, batch)
        whole = len(self._mems) == len(rows)
        if not strategy.reduce_boolean_decision(whole, all=True):
            return  # some rank has no memory yet: resume starts without it, as at an epoch start
        phases = range(len(rows))
        mems = [
            torch.cat([self._mems[p][layer] for p in phases]) for layer in range(len(self._mems[0]))
        ]
        mask = torch.cat([self._mems_mask[p] for p in phases])  # (accumulation x batch, mlen)
        order = torch.from_numpy(rows.reshape(-1))
        if task.trainer.world_size > 1:  # (ranks, rows, ...): every rank's rows
            mems, mask = [task.all_gather(m) for m in mems], task.all_gather(mask)
            order = task.all_gather(order.to(task.device))
            mems, mask = [m.flatten(0, 1) for m in mems], mask.flatten(0, 1)
            order = order.flatten()
        by_row = torch.argsort(order.cpu())  # (global rows,) positions of rows 0, 1, ...
        checkpoint["xlnet_memory"] = {
            "epoch": task.current_epoch,
            "mems": [m.detach().cpu()[by_row] for m in mems],
            "mask": mask.cpu()[by_row],
            "rows": "global",  # by global memory row (`stream.memory_rows`)
        }

    def load_state(self, checkpoint: dict) -> None:
        memory = checkpoint.get("xlnet_memory")  # saved per rank: not restored
        self._restored_memory = memory if memory and memory.get("rows") == "global" else None

    def forward_flops(self, batch: dict) -> float:
        """Forward FLOPs of a batch (`pretrain.models.flops.xlnet_flops`), on its padded shape and
        the carried memory's length (the next batch's, the same in a steady run)."""
        rows, qlen = batch["input_ids"].shape
        mems = self._mems.get(self._phase) if self.use_memory else None
        mlen = mems[0].shape[1] if mems is not None else 0
        predict = batch["target_mapping"].shape[1]
        return xlnet_flops(self.run.model, rows, qlen, mlen, predict, self.vocab.size)

    def forward(self, batch: dict) -> Losses:
        """Loss, with its accuracy as a metric, of one batch; with memory, updates the carried
        memory."""
        mems, mems_mask = self.carried_memory(batch)
        out = self.encoder(
            batch["input_ids"],
            batch["token_type_ids"],
            batch["attention_mask"],
            perm_mask=batch["perm_mask"],
            target_mapping=batch["target_mapping"],
            mems=mems,
            mems_mask=mems_mask,
            use_mems=self.use_memory,
        )
        if self.use_memory:
            self._mems[self._phase], self._mems_mask[self._phase] = out.mems, out.mems_mask
        targets = batch["target_labels"].flatten()  # (batch * num_predict,), unused: ignored
        query = out.query.flatten(0, 1)  # (batch * num_predict, d_model)
        logits = self.lm_head(query, self.encoder.word_embeddings.weight)
        metrics = masked_classification_metrics("plm", logits, targets)
        return Losses(metrics["plm_loss"], metrics)
