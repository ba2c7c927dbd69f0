"""Equal steps on every rank: where an epoch ends, decided the same way on all ranks.

Each rank's share of an epoch has its own length (documents differ in length, and formats
pack or pair them at random), and Lightning cannot run ranks with unequal batch counts: the
rank that runs out first waits at the epoch's barrier while the others wait in the next
step's collective, forever. So an epoch ends for everyone at the first optimizer step for
which some rank lacks a full step of batches:

- `StepAlignedLoader` (each rank's DataLoader) looks a step ahead: before it hands out an
  optimizer step's first micro-batch it holds that step's batches and the next step's, and
  tells on the first micro-batch what it knows of the next one (`NEXT_STEP_KEY`: whether it
  is whole, and its loss tokens); where a step is not whole it yields `END_OF_EPOCH` instead
  (the fewer batches it held are the rank's tail);
- the module (`runtime.epoch_end`) sums those flags over the ranks in one small all-reduce
  per optimizer step on the host group (`collectives.LaggedSum`): launched at step s's start
  without waiting, read at step s+1's start, by when every rank has long launched it, so it
  never blocks the host in steady state (the launch's and an epoch's first step agree with
  one blocking all-reduce); when any rank is at its end, every rank returns -1 at the same
  step and the epoch ends;
- what the ranks held and did not train (their tails) is counted by draining the loaders
  (`StepAlignedLoader.drain`) and logged as `train/epoch_dropped_samples`.

Shares are balanced by tokens (`reading.read_split`), so a tail is about a batch per rank.
The rule holds for every input format, strategy, number of data-loader workers and on a
resume in the middle of an epoch (the loader counts from the resumed batch).
"""

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader

from pretrain.data.batch_warmup import SKIPPED_BATCH_KEY
from pretrain.data.batch_wire import pack_batch, unpack_batch
from pretrain.data.positions import PartitionPosition, next_position
from pretrain.data.reading import MARKS_KEY

END_OF_EPOCH_KEY = "end_of_epoch"
DATA_ERROR_KEY = "data_error"
STREAM_BATCH_KEY = "stream_batch"  # (number, last): a worker's share (`stream.worker_batches`)
LOSS_TOKENS_KEY = "loss_tokens"  # a micro-batch's predicted tokens (token-budget batches)
STEP_LOSS_TOKENS_KEY = "step_loss_tokens"  # the rank's, over the step (its first micro-batch)
NEXT_STEP_KEY = "next_step"  # (flag, loss tokens) of the step after (its first micro-batch)


def is_end_of_epoch(batch: object) -> bool:
    """True for the marker batch a `StepAlignedLoader` yields when its rank is out of steps."""
    return isinstance(batch, dict) and END_OF_EPOCH_KEY in batch


def data_error_batch(message: str) -> dict:
    """The marker batch a stream yields, as its last, when a shard failed its checks: the
    message travels from the data-loader worker to the training step, where every rank stops
    at the same step (`step_flag`) instead of one rank dying and the others waiting."""
    return {DATA_ERROR_KEY: message}


def step_flag(batch: object) -> int:
    """What a rank says about the step `batch` begins, reduced (MIN) over ranks: 1 a whole
    step, 0 the epoch's end, -1 bad data."""
    if isinstance(batch, dict) and DATA_ERROR_KEY in batch:
        return -1
    return int(not is_end_of_epoch(batch))


def next_step(step: tuple[int, list[dict]] | dict) -> tuple[int, int | None]:
    """What a rank says about a step it fetched ahead (`StepAlignedLoader`): its `step_flag`
    and, with token-budget batches, its loss tokens (STEP_LOSS_TOKENS_KEY; else None)."""
    if isinstance(step, dict):  # the end marker, or a data error
        return step_flag(step), None
    skips, batches = step
    tokens = batches[0].get(STEP_LOSS_TOKENS_KEY) if not skips and batches else None
    return 1, tokens


def in_stream_order(batches: Iterator[dict]) -> Iterator[dict]:
    """The batches of workers that build only their share (`stream.worker_batches`, tagged
    with STREAM_BATCH_KEY, which this removes) as the rank's stream holds them: DataLoader's
    round-robin hands them over in order until a worker runs out; the rank's stream ends at
    the first batch that is missing (another worker's comes instead) or a worker's last one.
    Untagged batches pass unchanged."""
    expected = 0
    for batch in batches:
        if STREAM_BATCH_KEY not in batch:
            yield batch
            continue
        number, last = batch.pop(STREAM_BATCH_KEY)
        if number != expected:
            return
        yield batch
        if last:
            return
        expected += 1


def batch_samples(batch: dict) -> int:
    """Number of sequences in a batch of the stream."""
    return len(batch["keys"])


def predicted_tokens(batch: dict) -> int:
    """The tokens a batch's loss is averaged over: its predicted positions where the
    objective lists them (`prediction_positions`, -1 = an empty slot), else its real input
    tokens (ELECTRA, causal and XLNet-style objectives predict about a fixed share of them)."""
    if "prediction_positions" in batch:
        return int((batch["prediction_positions"] >= 0).sum())
    return int(batch["attention_mask"].sum())


def weigh_step(batches: list[dict]) -> None:
    """Token-budget batches vary in size, so each micro-batch's mean loss is weighed by its
    share of the step's predicted tokens (`runtime.task`): each gets LOSS_TOKENS_KEY (a
    float tensor), the first STEP_LOSS_TOKENS_KEY (the rank's total, summed over ranks by the
    module at the step's start)."""
    counts = [predicted_tokens(batch) for batch in batches]
    for batch, count in zip(batches, counts, strict=True):
        batch[LOSS_TOKENS_KEY] = torch.tensor(float(count))
    if batches:
        batches[0][STEP_LOSS_TOKENS_KEY] = sum(counts)


class StepAlignedLoader(DataLoader):
    """A DataLoader (batch_size=None over a stream of whole batches) that yields batches only
    in whole optimizer steps of `accumulation` micro-batches, then one `END_OF_EPOCH` marker.
    `start_batch` is the epoch's first micro-batch index (non-zero on a mid-epoch resume), so
    steps line up with Lightning's `batch_idx`. With `full_batch`, a shorter batch (the last
    of a reader) is held back too, so every micro-batch has the same number of sequences and
    weighs the same in the accumulated loss; it counts in the tail. With `weigh_steps` (a
    step of several micro-batches: accumulation, several ranks, or batches of varying size,
    `stream.token_budget_batches`) each step's micro-batches are weighed by their predicted
    tokens (`weigh_step`), so the step's loss is the mean over all its predicted tokens
    however the step is cut into micro-batches. With `step_batches` (the
    batch-size warm-up, `batch_warmup.py`) the loader's n-th step holds `step_batches(n)`
    real micro-batches, after `accumulation - step_batches(n)` skipped ones (markers). It
    fetches a step ahead: each step's first micro-batch carries the next step's `next_step`
    (NEXT_STEP_KEY), so the ranks agree on a step one step before it begins. Its
    stream's workers each build only their share of the batches (`stream.worker_batches`),
    which `in_stream_order` puts back in the stream's order; each batch crosses from its
    worker as one slim buffer (`batch_wire`), the same tensors once unpacked here."""

    def __init__(
        self,
        dataset,
        *,
        accumulation: int = 1,
        start_batch: int = 0,
        full_batch: int | None = None,
        start_positions: dict[int, PartitionPosition] | None = None,
        weigh_steps: bool = False,
        step_batches: Callable[[int], int] | None = None,
        **kwargs,
    ):
        if getattr(dataset, "worker_shares", None) is False:  # an `EpochStream`: its workers
            dataset.worker_shares = True  # build their share only; put in order by this loader
        if kwargs.get("num_workers", 0) > 0:  # one slim buffer a batch across the pipe
            kwargs.setdefault("collate_fn", pack_batch)
        super().__init__(dataset, batch_size=None, **kwargs)
        self.accumulation = accumulation
        self.step_batches = step_batches
        self._skips = 0  # marker batches still to hand out before the step's real ones
        self.weigh_steps = weigh_steps
        self.start_batch = start_batch
        self.full_batch = full_batch
        self.start_positions = dict(start_positions or {})
        self._positions = dict(self.start_positions)  # {partition: resume} of batches let go
        self.tail_samples = 0  # sequences held back: short batches, and at the end what was left
        # (batch index, samples, marks) of the last batches handed out
        self._yielded: deque[tuple[int, int, np.ndarray | None]] = deque()
        self._buffer: deque[dict] = deque()  # fetched, not handed out: this step's, the next's
        self._source: Iterator | None = None  # DataLoader's iterator (its workers)
        self._batches: Iterator[dict] = iter(())  # its batches in the stream's order
        self.killed_workers: list[int] = []  # pids of workers that died unasked (`close`)
        self._init_worker = self.worker_init_fn
        self._started: list = []  # per worker of the iteration: 1 once it began its loop

    def __iter__(self) -> Iterator[dict]:
        self.close()
        if self.num_workers > 0:  # shared with the workers, which mark their start in it
            context = self.multiprocessing_context or multiprocessing.get_context()
            self._started = context.RawArray("b", self.num_workers)
            self.worker_init_fn = partial(_start_worker, self._started, self._init_worker)
        self._source = super().__iter__()
        self._batches = in_stream_order(map(self._unpack, self._source))
        self._buffer.clear()
        self._yielded.clear()
        self._skips = 0
        self._positions = dict(self.start_positions)
        self.tail_samples = 0
        return self._steps(self._batches)

    def _unpack(self, batch: dict) -> dict:
        """A batch as its worker built it (`batch_wire.unpack_batch`), page-locked when the
        loader pins memory."""
        return unpack_batch(batch, self.pin_memory)

    def _steps(self, source: Iterator[dict]) -> Iterator[dict]:
        index = self.start_batch
        step = self._fetch_step(source, index)
        while isinstance(step, tuple):  # (skipped markers, real batches): a whole step
            skips, batches = step
            # one step ahead: the ranks agree on the next step while this one trains
            upcoming = self._fetch_step(source, index + skips + len(batches))
            for position in range(skips + len(batches)):
                if position < skips:
                    batch = {SKIPPED_BATCH_KEY: torch.ones(1)}
                else:
                    batch = self._buffer.popleft()
                    marks = batch.pop(MARKS_KEY, None)
                    self._yielded.append((index, batch_samples(batch), marks))
                    while len(self._yielded) > 4 * self.accumulation + 4:  # the last few matter
                        self._let_go(self._yielded.popleft()[2])
                if position == 0:
                    batch[NEXT_STEP_KEY] = next_step(upcoming)
                yield batch
                index += 1
            step = upcoming
        yield step  # the epoch's end, or the data error that stops the run

    def _fetch_step(self, source: Iterator[dict], index: int) -> tuple[int, list[dict]] | dict:
        """The step that begins at micro-batch `index` (a resume may begin inside one):
        (skipped markers, its batches, also appended to the buffer), or the marker that ends
        the stream when there is not a whole step left (END_OF_EPOCH) or a shard failed."""
        need = self.accumulation - index % self.accumulation
        skips = 0
        if self.step_batches is not None:  # warm-up steps begin at index 0 mod A
            real = self.step_batches(index // self.accumulation)
            need, skips = real, need - real
        batches: list[dict] = []
        while len(batches) < need:
            batch = next(source, None)
            if batch is None:
                break
            if DATA_ERROR_KEY in batch:  # stops the run: handed on at this step
                return batch
            if self.full_batch and batch_samples(batch) < self.full_batch:
                self.tail_samples += batch_samples(batch)  # a reader's last, short one
                continue
            batches.append(batch)
        if len(batches) < need:
            self.tail_samples += sum(batch_samples(b) for b in batches)
            return {END_OF_EPOCH_KEY: torch.ones(1)}
        if self.weigh_steps:
            weigh_step(batches)
        self._buffer.extend(batches)
        return skips, batches

    def close(self) -> None:
        """Stop the data-loader workers of the current iteration now. They ignore SIGTERM
        (`job_signals`), so they must be told through their queues, which is what DataLoader's
        iterator does when shut down; nothing else would, while this loader holds it."""
        source, self._source = self._source, None
        self._buffer.clear()
        if source is not None and hasattr(source, "_shutdown_workers"):
            self.killed_workers = _died(source)  # before they are told to stop
            # A worker still starting (unpickling its stream and queues in the forkserver's
            # child, slow under load) has the job's signals blocked and reads no queue yet:
            # torch's shutdown would wait 5 s for it, SIGTERM it and wait 5 s more; killed
            # now instead, before it could fail once this process and its queues' semaphores
            # have gone, and print a traceback under the run's last line
            started = self._started
            starting = [w for i, w in enumerate(getattr(source, "_workers", [])) if not started[i]]
            if starting and source._worker_pids_set:  # torch's SIGCHLD check would raise
                torch.utils.data._utils.signal_handling._remove_worker_pids(id(source))
                source._worker_pids_set = False
            for worker in starting:
                worker.kill()
            source._shutdown_workers()
            for worker in getattr(source, "_workers", []):  # a started one that did not end
                if worker.is_alive():
                    worker.kill()
                    worker.join()

    def dead_workers(self) -> list[int]:
        """Pids of this loader's data-loader workers that died unasked (killed: out of memory,
        or by hand), now or by the last `close`; `run.py` reports them in one line."""
        return _died(self._source) if self._source is not None else self.killed_workers

    def _let_go(self, marks, positions: dict | None = None) -> None:
        """Record the partitions' positions after a batch's sequences (`marks`)."""
        if marks is None:
            return
        positions = self._positions if positions is None else positions
        for mark in marks.tolist():
            positions[mark[0]] = next_position(mark)

    def partition_positions(self, processed: int) -> dict[int, PartitionPosition]:
        """{partition: resume} after the `processed` micro-batches Lightning has trained, for
        the partitions this rank read (and those it was started with): where a resume seeks
        (`stream.rank_sequences`)."""
        positions = dict(self._positions)
        for index, _, marks in self._yielded:
            if index < processed:
                self._let_go(marks, positions)
        return positions

    def drain(self, stopped_at: int) -> int:
        """Sequences this rank's stream holds from micro-batch `stopped_at` on (the epoch was
        ended there by another rank): those already handed to Lightning, those looked ahead,
        and the rest of the stream, read to its end. Returns the count."""
        count = self.tail_samples
        count += sum(n for index, n, _ in self._yielded if index >= stopped_at)
        count += sum(batch_samples(b) for b in self._buffer)
        self._buffer.clear()
        self._yielded.clear()
        if self._source is not None:
            count += sum(batch_samples(b) for b in self._batches)
        self.close()
        return count


def _start_worker(started, init: Callable[[int], None] | None, worker_id: int) -> None:
    """A worker's `worker_init_fn`: the loader's own (`init`), then its start marked in
    `started` (shared memory), which `StepAlignedLoader.close` reads."""
    if init is not None:
        init(worker_id)
    started[worker_id] = 1


def _died(source: object) -> list[int]:
    """Pids of a DataLoader iterator's workers that have exited with a failure or a signal."""
    workers = getattr(source, "_workers", [])
    return [worker.pid for worker in workers if worker.exitcode not in (None, 0)]
