"""Prepare's cleaning filters on crafted inputs: duplicates injected at known rates are removed
at that rate, each quality rule removes what it names, language identification keeps the
languages asked for, and the manifest counts what each filter removed."""

import json
import random

import pytest

from data_pipelines.builtin_corpus import pydoc_topic_documents
from data_pipelines.cleaning import (
    CleaningStats,
    clean_documents,
    dedup_text,
    detection_probability,
    identify_language,
    merge_records,
)
from data_pipelines.filter_settings import FilterSettings, FilterSettingsError, QualitySettings
from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings, compose_prepare_config
from data_pipelines.quality import quality_failure
from data_pipelines.sources import RawDocument


def distinct_documents(count: int = 200, min_words: int = 200) -> list[str]:
    """`count` documents of at least `min_words` words, each a run of distinct paragraphs of
    Python's help topics (no paragraph in two documents)."""
    seen: dict[str, None] = {}
    for _, text in pydoc_topic_documents():
        seen.update((line, None) for line in text.split("\n") if len(line.split()) >= 3)
    documents, lines, words = [], [], 0
    for line in seen:
        lines.append(line)
        words += len(line.split())
        if words >= min_words:
            documents.append("\n".join(lines))
            lines, words = [], 0
    assert len(documents) >= count, "the help topics give fewer documents than asked for"
    return documents[:count]


def raw(texts: list[str]) -> list[RawDocument]:
    return [RawDocument("crafted", i, t) for i, t in enumerate(texts)]


def clean(texts: list[str], filters: list[str], settings: FilterSettings | None = None):
    settings = settings or FilterSettings()
    stats = CleaningStats(tuple(filters), settings)
    kept = list(clean_documents(raw(texts), filters, settings, stats))
    return kept, stats


def near_copy(text: str, rng: random.Random) -> str:
    """`text` with one word replaced and the case of another changed."""
    words = text.split(" ")
    i = rng.randrange(len(words))
    words[i] = "zyxwvut"
    j = rng.randrange(len(words))
    words[j] = words[j].upper()
    return " ".join(words)


def test_injected_duplicates_are_removed_at_the_injected_rate():
    base = distinct_documents()
    rng = random.Random(0)
    originals = rng.sample(base, 40)  # 10% exact copies, 10% near copies of others
    exact = [f"  {d.upper()}\n\n" for d in originals[:20]]  # case and spaces differ
    near = [near_copy(d, rng) for d in originals[20:]]
    texts = base + exact + near
    rng.shuffle(texts)  # copies may come before their originals
    _, alone = clean(base, ["exact_dedup", "near_dedup"])
    kept, stats = clean(texts, ["exact_dedup", "near_dedup"])
    assert alone.removed["exact_dedup"] == 0 and alone.removed["near_dedup"] <= 0.02 * len(base)
    assert stats.removed["exact_dedup"] == 20  # every exact copy
    near_removed = stats.removed["near_dedup"] - alone.removed["near_dedup"]
    assert abs(near_removed / len(texts) - 20 / len(texts)) <= 0.02
    assert len(kept) == len(texts) - stats.removed["exact_dedup"] - stats.removed["near_dedup"]
    record = stats.record()
    assert record["documents_in"] == 240 and record["documents_kept"] == len(kept)
    assert record["near_dedup"]["bands"] * record["near_dedup"]["rows"] <= 128
    assert record["near_dedup"]["detection_probability"]["0.90"] > 0.9


def test_exact_dedup_alone_keeps_first_occurrences_in_order():
    texts = ["Alpha beta.", "Gamma delta.", "alpha   BETA.", "Gamma delta.", "Epsilon."]
    kept, stats = clean(texts, ["exact_dedup"])
    assert [d.index for d in kept] == [0, 1, 4]
    assert stats.removed["exact_dedup"] == 2
    assert dedup_text(" Alpha\tbeta.\n") == dedup_text("alpha beta.")


def test_detection_probability_is_the_lsh_s_curve():
    assert detection_probability(1.0, 9, 13) == 1.0
    assert detection_probability(0.0, 9, 13) == 0.0
    assert abs(detection_probability(0.8, 9, 13) - (1 - (1 - 0.8**13) ** 9)) < 1e-12


GOOD = (
    "The history of the river valley is long and varied. Farmers have worked the land with "
    "care for many generations, and the town that grew beside the water became a market for "
    "the whole region. Travellers came to trade wool, grain and timber, and the old bridge "
    "still stands as a reminder of that busy time. Today the valley is quieter, but people "
    "with an interest in the past visit the museum to learn how life was lived here."
)


@pytest.mark.parametrize(
    "text, rule",
    [
        (GOOD, None),
        ("Too short to be a page of the web.", "words"),
        (" ".join(["a"] * 60) + " the and", "mean_word_length"),
        (GOOD + " #tag" * 10, "symbols"),
        (GOOD + " " + " ".join(["1234567890"] * 30), "digits"),
        ("\n".join(f"• {line}" for line in GOOD.split(". ")), "bullet_lines"),
        ("\n".join(f"and then the story goes on {i}..." for i in range(20)), "symbols"),
        (GOOD + " " + " ".join(["***"] * 30), "alpha_words"),
        (GOOD.replace(" the ", " a ").replace(" and ", " or ").replace(" with ", " by "), None),
        (" ".join(f"word{i} other{i} sample{i}" for i in range(30)), "stop_words"),
        ("\n".join([GOOD] * 3), "duplicate_lines"),
        (GOOD + " " + "the big cat " * 30, "top_ngram"),
        (GOOD + " Lorem ipsum dolor sit amet.", "c4_bad_phrases"),
        (GOOD + " function f() { return 1; }", "c4_bad_phrases"),
    ],
)
def test_each_quality_rule_removes_what_it_names(text, rule):
    assert quality_failure(text, QualitySettings()) == rule


def test_ellipsis_lines_rule_and_its_setting():
    text = "\n".join(f"{line} …" for line in distinct_documents(1)[0].split("\n"))
    assert quality_failure(text, QualitySettings(max_symbol_word_ratio=1.0)) == "ellipsis_lines"
    lenient = QualitySettings(max_symbol_word_ratio=1.0, max_ellipsis_lines=1.0)
    assert quality_failure(text, lenient) is None


def test_quality_statistics_count_each_rule():
    texts = [GOOD] * 3 + ["short text"] * 4 + [GOOD + " Lorem ipsum."] * 2 + [""]
    kept, stats = clean(texts, ["quality"])
    assert len(kept) == 4  # three good ones and the empty one (counted as empty by prepare)
    assert stats.record()["quality"] == {
        "removed": 6,
        "by_rule": {"c4_bad_phrases": 2, "words": 4},
    }


GERMAN = (
    "Die Geschichte des Flusstals ist lang und abwechslungsreich. Bauern haben das Land seit "
    "vielen Generationen mit Sorgfalt bearbeitet, und die Stadt am Wasser wurde zu einem Markt "
    "für die ganze Region."
)
FRENCH = (
    "L'histoire de la vallée est longue et variée. Les paysans ont travaillé la terre avec "
    "soin pendant de nombreuses générations, et la ville qui a grandi au bord de l'eau est "
    "devenue un marché pour toute la région."
)


def test_language_identification_by_the_shipped_model():
    assert identify_language(GOOD, 5000)[0] == "en"
    assert identify_language(GERMAN, 5000)[0] == "de"
    assert identify_language(FRENCH, 5000)[0] == "fr"
    texts = [GOOD, GERMAN, FRENCH, GOOD, GERMAN]
    kept, stats = clean(texts, ["language"])
    assert [d.index for d in kept] == [0, 3]
    assert stats.record()["language"] == {"removed": 3, "by_language": {"de": 2, "fr": 1}}
    settings = FilterSettings()
    settings.language.languages = ["en", "fr"]
    kept, _ = clean(texts, ["language"], settings)
    assert [d.index for d in kept] == [0, 2, 3]


def test_the_first_filter_listed_is_counted():
    texts = [GOOD, GOOD, "short", GERMAN]  # German fails both quality (words) and language
    _, stats = clean(texts, ["exact_dedup", "quality", "language"])
    assert dict(stats.removed) == {"exact_dedup": 1, "quality": 2}
    _, stats = clean(texts, ["language", "quality", "exact_dedup"])
    assert stats.by_language["de"] == 1 and sum(stats.removed.values()) == 3
    assert stats.removed["exact_dedup"] == 1


def test_filter_settings_are_checked_with_the_key():
    with pytest.raises(FilterSettingsError, match="filter.near_dedup.threshold"):
        compose_prepare_config(["filters=[near_dedup]", "filter.near_dedup.threshold=1.5"])
    with pytest.raises(ValueError, match="filters"):
        compose_prepare_config(["filters=[dedup]"])
    cfg = compose_prepare_config(["filters=[quality,exact_dedup]", "filter.quality.min_words=3"])
    assert cfg.filters == ["quality", "exact_dedup"] and cfg.filter.quality.min_words == 3
    assert "filter" not in compose_prepare_config([]).content_dict()


def test_prepare_records_the_filters_statistics(tmp_path):
    good = [d for d in distinct_documents(80) if quality_failure(d, QualitySettings()) is None]
    texts = good[:30] + [GERMAN * 6] * 2
    texts += [texts[0], texts[1], "The weather was fine and the sun was shining on the town."]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = prepare(
        PrepareConfig(
            inputs=[str(path)],
            out_dir=str(tmp_path / "out"),
            tokenizer=TokenizerSettings(vocab_size=800, min_frequency=1),
            filters=["exact_dedup", "near_dedup", "language", "quality"],
            num_proc=1,
        ),
        progress=False,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    filters = manifest["filters"]
    assert filters["documents_in"] == 35 and filters["documents_kept"] == 30
    assert filters["exact_dedup"]["removed"] == 2  # the copies (the German ones were not kept)
    assert filters["near_dedup"]["removed"] == 0
    assert filters["language"]["by_language"] == {"de": 2}
    assert filters["quality"]["by_rule"] == {"words": 1}
    assert manifest["counts"]["documents"] == 30
    assert manifest["config"]["filters"] == ["exact_dedup", "near_dedup", "language", "quality"]


def test_slices_records_merge_by_summing():
    texts = [GOOD, GOOD, "short", GERMAN]
    first = clean(texts, ["exact_dedup", "quality"])[1].record()
    second = clean(texts[1:], ["exact_dedup", "quality"])[1].record()
    merged = merge_records([first, second])
    assert merged["documents_in"] == 7 and merged["documents_kept"] == 2
    assert merged["exact_dedup"] == {"removed": 1}
    assert merged["quality"] == {"removed": 4, "by_rule": {"words": 4}}
    assert merged["order"] == ["exact_dedup", "quality"] and merged["dedup_scope"] == "slice"
