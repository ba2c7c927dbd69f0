"""objective.stages (pretrain/data/stages.py): corruption settings by training progress, keyed
to each sample's position in the global sample order. Checked on real stream batches: the
switch at the documented sample, the same rows whatever the workers or ranks and after a
resume, and ERNIE's three stages masking words, then phrases, then entities whole."""

import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import prepare_small_corpus
from torch.utils.data import DataLoader

from data_pipelines.prepare_config import EntitySettings, PhraseSettings
from pretrain.config import compose_config, validate
from pretrain.data.masking import ENTITY_START, IGNORE_INDEX, INSIDE_SPAN, PHRASE_START, mask_budget
from pretrain.data.reading import MARKS_KEY
from pretrain.data.stages import first_sample_of_stage, sample_progress_tokens
from pretrain.data.stream import EpochStream
from pretrain.errors import ConfigError
from pretrain.objectives.configs import stage_configs
from pretrain.objectives.ernie_config import ErnieConfig
from pretrain.objectives.mlm_config import MaskedLMConfig
from pretrain.runtime.run import build_stream

ERNIE = "pretrain.objectives.ernie.ErnieMaskedLM"
LENGTH = 64  # data.max_seq_length of these streams
SWITCH = 41 * LENGTH - 10  # until_tokens of the first stage: sample 41 is the first of stage 1


def staged_spec(shards_dir, stages: str, *overrides: str):
    _, spec, _ = build_stream(
        compose_config(
            [
                f"data.shards_dir={shards_dir}",
                f"data.max_seq_length={LENGTH}",
                "data.batch_size=8",
                f"+objective.stages={stages}",
                *overrides,
            ]
        )
    )
    return spec


def collect(spec, workers=0, start=0) -> list[dict]:
    loader = DataLoader(EpochStream(spec, 0, start), batch_size=None, num_workers=workers)
    return list(loader)


def sample_index(batch: dict, partitions: int) -> np.ndarray:
    marks = batch[MARKS_KEY].numpy()
    return marks[:, 1] * partitions + marks[:, 0]


def rows(batches: list[dict]) -> dict[str, tuple]:
    """{sample key: (its input ids, its labels)}, padding left out."""
    out = {}
    for batch in batches:
        for r, key in enumerate(batch["keys"]):
            n = int(batch["attention_mask"][r].sum())
            out[key] = (batch["input_ids"][r, :n].tolist(), batch["labels"][r, :n].tolist())
    return out


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        (
            [{"until_tokens": 100, "mlm_probability": 0.3}, {"mlm_probabilty": 0.2}],
            "stages[1].mlm_probabilty",
        ),
        ([{"until_tokens": 100}, {"until_tokens": 50}, {}], "stages[1].until_tokens"),
        ([{"until_tokens": 100}, {"until_tokens": 200}], "stages[1].until_tokens"),
        ([{"mlm_probability": 0.3}, {}], "stages[0].until_tokens"),
        ([{"until_tokens": 100, "mlm_probability": 1.5}, {}], "stages[0].mlm_probability"),
        ([{"until_tokens": 100, "mlm_probability": "many"}, {}], "stages[0].mlm_probability"),
        ([{"until_tokens": 100, "pair_task": "sop"}, {}], "stages[0].pair_task"),
    ],
)
def test_stage_settings_are_checked_and_errors_name_the_key(stages, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        MaskedLMConfig(name="mlm", pair_task="none", stages=stages)


def test_each_stage_is_the_objectives_config_with_its_settings():
    stages = [{"until_tokens": 640, "masking_level": "basic"}, {"mlm_probability": 0.2}]
    staged = stage_configs(ErnieConfig(_target_=ERNIE, stages=stages))
    assert [until for until, _ in staged] == [640, None]
    assert [(c.masking_level, c.mlm_probability) for _, c in staged] == [
        ("basic", 0.15),
        ("entity", 0.2),
    ]


def test_stages_are_refused_where_the_stream_has_no_global_order():
    overrides = ["objective=xlnet", "model=xlnet_tiny", "data=xlnet_memory"]
    with pytest.raises(ConfigError, match="objective.stages"):
        validate(compose_config([*overrides, "+objective.stages=[{until_tokens:100},{}]"]))


def test_progress_counts_the_sample_order_and_grows_across_epochs():
    marks = np.array([[p, n, 0, 0, 0, 0] for n in range(3) for p in range(4)])  # P = 4
    within = sample_progress_tokens(marks, 0, 4, LENGTH, epoch_tokens=500)
    assert within.tolist() == [min(i * LENGTH, 500) for i in range(12)]
    later = sample_progress_tokens(marks, 1, 4, LENGTH, epoch_tokens=500)
    assert later.min() == 500 >= within.max()
    assert first_sample_of_stage(SWITCH, LENGTH) == 41


def test_the_stage_switches_at_the_documented_sample_whatever_the_workers_ranks_or_resume(
    prepared_corpus,
):
    """A masking-rate schedule (10% of tokens, then 40%) on token-level MLM, which masks
    exactly round(p x candidates) per row: every row's count says its stage."""
    stages = f"[{{until_tokens:{SWITCH},mlm_probability:0.1}},{{mlm_probability:0.4}}]"
    spec = staged_spec(prepared_corpus, stages, "objective=mlm", "data=full_sentences")
    batches = collect(spec)
    first = first_sample_of_stage(SWITCH, LENGTH)
    mixed = 0
    for batch in batches:
        index = sample_index(batch, spec.stream_partitions)
        labels = batch["labels"].numpy()
        ids = np.where(labels != IGNORE_INDEX, labels, batch["input_ids"].numpy())
        real = batch["attention_mask"].numpy() == 1
        candidates = (real & ~np.isin(ids, spec.vocab.special_ids)).sum(axis=1)
        expected = np.where(index < first, 0.1, 0.4)
        budgets = [mask_budget(c, p) for c, p in zip(candidates, expected, strict=True)]
        np.testing.assert_array_equal((labels != IGNORE_INDEX).sum(axis=1), budgets)
        mixed += (index < first).any() and (index >= first).any()
        positions = batch["prediction_positions"].numpy()
        assert (positions >= 0).sum() == (labels != IGNORE_INDEX).sum()
    assert mixed == 1  # one batch straddles the switch: its rows come from both stages
    reference = rows(batches)
    assert rows(collect(spec, workers=2)) == reference
    resumed = rows(collect(spec, start=5 * 8 + 4))  # inside the straddling batch
    assert resumed == {key: reference[key] for key in resumed} and len(resumed) > 100
    for rank in range(2):
        part = rows(collect(replace(spec, rank=rank, world_size=2, batch_size=4)))
        common = set(part) & set(reference)  # a rank may read past the 1-rank order's end
        assert len(common) > 0.4 * len(reference)
        assert {key: part[key] for key in common} == {key: reference[key] for key in common}


# Word pairs frequent in the small corpus (Python's help topics) as entities: the corpus's own
# entity list (tests/data/entities_en.txt) has few entities of two or more words.
FREQUENT_PAIRS = ("for example", "the following", "keyword arguments", "standard library")
FREQUENT_PAIRS += ("the interpreter", "return value", "such as", "can be", "in the")


@pytest.fixture(scope="module")
def entity_corpus(tmp_path_factory):
    """The small English corpus with phrases and `FREQUENT_PAIRS` as entities (about 1,400
    phrase and 400 entity spans of two or more words)."""
    root = tmp_path_factory.mktemp("entity_corpus")
    (root / "entities.txt").write_text("\n".join(FREQUENT_PAIRS) + "\n", encoding="utf-8")
    entities = EntitySettings(path=str(root / "entities.txt"))
    return prepare_small_corpus(root, phrases=PhraseSettings(enabled=True), entities=entities)


def annotated_spans(phrases: np.ndarray, word_starts: np.ndarray) -> list[tuple[int, int, int]]:
    """(kind, first, end) of one row's annotated spans of two or more words."""
    spans, t = [], 0
    while t < len(phrases):
        if phrases[t] in (PHRASE_START, ENTITY_START):
            end = t + 1
            while end < len(phrases) and phrases[end] == INSIDE_SPAN:
                end += 1
            if word_starts[t + 1 : end].any():
                spans.append((int(phrases[t]), t, end))
            t = end
        else:
            t += 1
    return spans


def test_ernie_stages_mask_words_then_phrases_then_entities_whole(entity_corpus):
    """Spans of two or more words, by stage: at the basic level, masked word by word (most
    touched spans only in part); at the phrase level, phrases whole (never in part) and
    entities word by word; at the entity level, both whole."""
    stages = (
        f"[{{until_tokens:{250 * LENGTH},masking_level:basic}},"
        f"{{until_tokens:{500 * LENGTH},masking_level:phrase}},{{masking_level:entity}}]"
    )
    spec = staged_spec(entity_corpus, stages, "objective=ernie", "data=segment_pair")
    # per stage, per kind: [spans masked whole, spans masked in part]
    counts = np.zeros((3, 3, 2), int)
    for batch in collect(spec):
        stage = np.searchsorted([250, 500], sample_index(batch, spec.stream_partitions), "right")
        masked = batch["labels"].numpy() != IGNORE_INDEX
        for row, (phrases, starts) in enumerate(
            zip(batch["phrases"].numpy(), batch["word_starts"].numpy(), strict=True)
        ):
            for kind, first, end in annotated_spans(phrases, starts):
                hit = masked[row, first:end]
                if hit.any():
                    counts[stage[row], kind, 0 if hit.all() else 1] += 1
    partial = counts[:, :, 1] / np.maximum(counts.sum(axis=2), 1)  # (stage, kind)
    assert counts[:, [PHRASE_START, ENTITY_START]].sum(axis=2).min() >= 10, counts
    assert partial[0, PHRASE_START] > 0.5 and partial[0, ENTITY_START] > 0.5, partial
    assert partial[1, PHRASE_START] == 0 and partial[1, ENTITY_START] > 0.5, partial
    assert partial[2, PHRASE_START] == 0 and partial[2, ENTITY_START] == 0, partial
