"""Batches by token budget (`data.tokens_per_batch`, RoBERTa's DOC-SENTENCES batches): steps
of about the same number of tokens, the same global steps for any number of ranks, workers
and accumulation, resumes that lose and repeat nothing, and a loss weighed by tokens."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_stream import stream_spec
from torch.utils.data import DataLoader

from pretrain.data.datamodule import check_token_budget
from pretrain.data.loader import (
    LOSS_TOKENS_KEY,
    STEP_LOSS_TOKENS_KEY,
    StepAlignedLoader,
    predicted_tokens,
)
from pretrain.data.positions import next_position
from pretrain.data.reading import MARKS_KEY
from pretrain.data.stream import EpochStream, token_budget_batches
from pretrain.errors import ConfigError

BUDGET = 4 * 64 * 4  # 4 partitions x 64 tokens (data.max_seq_length) x 4


def budget_spec(corpus, *overrides):
    return stream_spec(
        corpus,
        "data=doc_sentences",
        "objective=mlm",
        "data.stream_partitions=4",
        f"data.tokens_per_batch={BUDGET}",
        *overrides,
    )


def global_steps(spec, ranks=1, accumulation=1, resume=None, workers=0, epoch=0):
    """[(step, sorted keys of the step over all ranks)]: each rank's micro-batches (through a
    real DataLoader with `workers`), grouped into optimizer steps, the ranks' steps united."""
    steps = []
    for rank in range(ranks):
        shape = replace(spec, rank=rank, world_size=ranks, accumulation=accumulation)
        loader = DataLoader(
            EpochStream(shape, epoch, positions=resume), batch_size=None, num_workers=workers
        )
        for n, batch in enumerate(loader):
            step = n // accumulation
            while len(steps) <= step:
                steps.append([])
            steps[step].extend(batch["keys"])
    return [sorted(keys) for keys in steps]


def test_steps_hold_about_the_budget_and_more_tokens_than_fixed_batches(prepared_corpus):
    """DOC-SENTENCES rows are short at document ends: a fixed batch of full-length rows'
    count sees fewer tokens per step than the budget, which every step meets within one
    sequence per partition."""
    spec = budget_spec(prepared_corpus)
    tokens = []
    for batch in token_budget_batches(spec, 0):
        tokens.append(sum(len(s["input_ids"]) for s in batch))
    tokens = np.array(tokens[1:-1])  # whole windows
    assert len(tokens) > 20
    assert np.all(np.abs(tokens - BUDGET) <= spec.stream_partitions * spec.max_seq_length)
    assert abs(tokens.mean() - BUDGET) < 0.1 * BUDGET
    fixed = replace(spec, tokens_per_batch=None, batch_size=BUDGET // spec.max_seq_length)
    fixed_tokens = [int(b["attention_mask"].sum()) for b in EpochStream(fixed, 0)][:-1]
    assert np.mean(fixed_tokens) < 0.95 * tokens.mean()


def test_global_steps_do_not_depend_on_ranks_workers_or_accumulation(prepared_corpus):
    spec = budget_spec(prepared_corpus)
    reference = global_steps(spec)
    assert len(reference) > 20 and len(set(map(len, reference))) > 1  # sizes vary
    shapes = [(2, 1, 0), (4, 1, 0), (1, 2, 2), (2, 2, 2)]
    for ranks, accumulation, workers in shapes:
        got = global_steps(spec, ranks, accumulation, workers=workers)
        n = min(len(got), len(reference))
        assert n >= len(reference) - 2, (ranks, accumulation)
        assert got[:n] == reference[:n], (ranks, accumulation, workers)


def test_a_reshaped_resume_loses_and_repeats_nothing(prepared_corpus):
    """Positions after step k (as a checkpoint stores them) resume on 2 ranks with
    accumulation 2 at step k of the same global order."""
    spec = budget_spec(prepared_corpus)
    reference = global_steps(spec)
    k = len(reference) // 2
    positions = {}
    for n, batch in enumerate(token_budget_batches(spec, 0)):
        if n == k:
            break
        for sequence in batch:
            positions[sequence["mark"].partition] = next_position(sequence["mark"])
    resumed = global_steps(spec, ranks=2, accumulation=2, resume=positions)
    n = min(len(resumed), len(reference) - k)
    assert n >= len(reference) - k - 2
    assert resumed[:n] == reference[k : k + n]
    seen = Counter(key for step in reference[:k] + resumed[:n] for key in step)
    assert max(seen.values()) == 1
    assert sum(seen.values()) == sum(map(len, reference[: k + n]))


def test_micro_batches_are_weighed_by_their_share_of_the_steps_predictions(prepared_corpus):
    """The loader marks each micro-batch's predicted tokens and the rank's step total: the
    weights of a step sum to the accumulation (what Lightning divides back out)."""
    spec = replace(budget_spec(prepared_corpus), accumulation=2)
    loader = StepAlignedLoader(
        EpochStream(spec, 0), accumulation=2, weigh_steps=True, full_batch=None
    )
    batches = list(loader)[:-1]  # the last is the epoch's end marker
    assert len(batches) >= 20 and len(batches) % 2 == 0
    for first, second in zip(batches[::2], batches[1::2], strict=True):
        counts = [predicted_tokens(first), predicted_tokens(second)]
        assert first[STEP_LOSS_TOKENS_KEY] == sum(counts) > 0
        assert STEP_LOSS_TOKENS_KEY not in second
        assert [float(b[LOSS_TOKENS_KEY]) for b in (first, second)] == counts
        assert MARKS_KEY not in first
    assert predicted_tokens(batches[0]) == int((batches[0]["labels"] != -100).sum())


def test_weighted_loss_equals_the_steps_mean_over_predicted_tokens(prepared_corpus):
    """Module level: two micro-batches' weighted losses, divided by the accumulation as
    Lightning does, sum to the mean loss over every predicted token of the step."""
    from pretrain.config import compose_config
    from pretrain.runtime.run import prepare_run

    run, module, _ = prepare_run(
        compose_config(
            [
                f"data.shards_dir={prepared_corpus}",
                "data=doc_sentences",
                "objective=mlm",
                "data.max_seq_length=64",
                "data.stream_partitions=4",
                f"data.tokens_per_batch={BUDGET}",
            ]
        )
    )
    spec = replace(budget_spec(prepared_corpus), accumulation=2)
    loader = StepAlignedLoader(
        EpochStream(spec, 0), accumulation=2, weigh_steps=True, full_batch=None
    )
    first, second = list(loader)[:2]
    module.eval()
    module._loss_scale = 2 / first.pop(STEP_LOSS_TOKENS_KEY)
    module.log_step = lambda *args: None  # outside a Trainer
    with torch.no_grad():
        weighted = sum(module.training_step(b, i) / 2 for i, b in enumerate((first, second)))
        sums = [module(b)["mlm_loss"] * predicted_tokens(b) for b in (first, second)]
    total = predicted_tokens(first) + predicted_tokens(second)
    assert float(weighted) == pytest.approx(float(sum(sums) / total), rel=1e-6)


def test_budgets_too_small_for_a_sequence_per_partition_are_refused(prepared_corpus):
    spec = replace(budget_spec(prepared_corpus), accumulation=8)
    with pytest.raises(ConfigError, match="data.tokens_per_batch = 1024: must be at least 2048"):
        check_token_budget(spec)
    memory = replace(spec, format="xlnet_memory", accumulation=1)
    with pytest.raises(ConfigError, match="data.tokens_per_batch"):
        check_token_budget(memory)


def test_a_relaunch_may_change_accumulation_only_under_a_token_budget():
    from pretrain.checkpoint.relaunch import refused_changes
    from pretrain.config import compose_config, plain_config, validate

    def config(*overrides):
        return plain_config(validate(compose_config(list(overrides))))

    budget = "data.tokens_per_batch=8192"
    saved = config(budget, "trainer.accumulate_grad_batches=1")
    assert refused_changes(saved, config(budget, "trainer.accumulate_grad_batches=2")) == []
    refused = refused_changes(config(), config("trainer.accumulate_grad_batches=2"))
    assert any(line.startswith("trainer.accumulate_grad_batches") for line in refused)
    refused = refused_changes(saved, config("data.tokens_per_batch=4096"))
    assert any(line.startswith("data.tokens_per_batch") for line in refused)
