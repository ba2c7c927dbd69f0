"""The cleaning stage in worker processes: the same corpus gives the same kept documents and
the same shards, byte for byte, whatever the number of processes."""

import json
import random

from test_cleaning import GERMAN, GOOD, distinct_documents, near_copy, raw

from data_pipelines import cleaning
from data_pipelines.cleaning import CleaningStats, clean_documents
from data_pipelines.filter_settings import FilterSettings
from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings

FILTERS = ["quality", "exact_dedup", "near_dedup", "language"]


def corpus() -> list[str]:
    base = distinct_documents(80)
    rng = random.Random(1)
    texts = base + rng.sample(base, 10) + [near_copy(d, rng) for d in rng.sample(base, 10)]
    texts += [GOOD, GOOD.upper(), GERMAN, "", "tiny"]
    rng.shuffle(texts)
    return texts


def test_kept_documents_do_not_depend_on_the_process_count(monkeypatch):
    monkeypatch.setattr(cleaning, "CHUNK_DOCUMENTS", 17)  # many tasks in flight
    texts = corpus()
    results = []
    for num_proc in (1, 2):
        stats = CleaningStats(tuple(FILTERS), FilterSettings())
        kept = [
            d.index for d in clean_documents(raw(texts), FILTERS, FilterSettings(), stats, num_proc)
        ]
        results.append((kept, stats.record()))
    assert results[0] == results[1]
    record = results[0][1]
    assert record["exact_dedup"]["removed"] > 0 and record["near_dedup"]["removed"] > 0


def test_prepare_with_filters_gives_the_same_bytes_for_any_num_proc(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus()), encoding="utf-8")
    outputs = []
    for num_proc in (1, 2):
        out = prepare(
            PrepareConfig(
                inputs=[str(path)],
                out_dir=str(tmp_path / f"out{num_proc}"),
                tokenizer=TokenizerSettings(vocab_size=1000, min_frequency=2),
                filters=FILTERS,
                docs_per_shard=50,
                num_proc=num_proc,
            ),
            progress=False,
        )
        outputs.append(
            {
                p.relative_to(out).as_posix(): p.read_bytes()
                for p in sorted(out.rglob("*"))
                if p.is_file()
            }
        )
    assert outputs[0] == outputs[1]
    manifest = json.loads(outputs[0]["manifest.json"])
    assert (
        manifest["filters"]["documents_kept"]
        == manifest["counts"]["documents"] + manifest["counts"]["empty_documents"]
    )
