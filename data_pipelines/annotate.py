"""Phrase and entity annotations for prepared shards (ERNIE 1.0), added after tokenization.

Once the shards are written, the phrase lexicon is learned from them (two passes over ids and
word starts, no tokenizing: `data_pipelines.phrases`), the entity list is tokenized, and
every shard is rewritten with a `<block>.phrases.npy` member per block
(`data_pipelines.span_annotation`). The phrase lexicon is saved as `phrases.txt` and the entity list
copied as `entities.txt`, beside the shards, for people to read.
"""

import os
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data_pipelines.document_encoding import default_num_proc
from data_pipelines.phrases import barrier_tokens, learn_phrases, write_phrases
from data_pipelines.prepare_config import PrepareConfig
from data_pipelines.shard_writer import TOKENS_PER_BLOCK, TokenizedDocument, rewrite_shard
from data_pipelines.span_annotation import SpanLexicon, annotate_spans, load_entities
from pretrain.data.shard_format import ENTITY_START, PHRASE_START, read_documents

PHRASES_FILE = "phrases.txt"
ENTITIES_FILE = "entities.txt"


class EntitiesSkippedWarning(UserWarning):
    """Some entities hold characters the tokenizer does not know, and are not matched."""


def _annotated(
    path: Path,
    dtype: str,
    entities: SpanLexicon | None,
    phrases: SpanLexicon | None,
    spans: dict[str, int],
) -> Iterator[TokenizedDocument]:
    for document in read_documents(path):
        ids, sents, words = document["ids"], document["sents"], document["words"]
        flags = annotate_spans(ids, sents, words, entities, phrases)
        spans["phrase_spans"] += int(np.count_nonzero(flags == PHRASE_START))
        spans["entity_spans"] += int(np.count_nonzero(flags == ENTITY_START))
        yield TokenizedDocument(
            document["key"], "", ids.astype(dtype), sents, words.astype(np.uint8), flags
        )


def annotate_shard(
    path: Path,
    dtype: str,
    entities: SpanLexicon | None,
    phrases: SpanLexicon | None,
    tokens_per_block: int = TOKENS_PER_BLOCK,
) -> dict:
    """Rewrite one shard (ids in `dtype`) with span annotations; returns its new record
    fields ("documents", "tokens", "bytes", "sha256") and its "phrase_spans" and
    "entity_spans" counts."""
    spans = {"phrase_spans": 0, "entity_spans": 0}
    record = rewrite_shard(
        path, _annotated(path, dtype, entities, phrases, spans), tokens_per_block
    )
    return {**record, **spans}


_worker_lexicons: tuple[SpanLexicon | None, SpanLexicon | None] = (None, None)


def _init_worker(entities: SpanLexicon | None, phrases: SpanLexicon | None) -> None:
    global _worker_lexicons
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # processes give the parallelism
    _worker_lexicons = (entities, phrases)  # sent once per worker, not once per shard


def _annotate_in_worker(path: Path, dtype: str, tokens_per_block: int) -> dict:
    return annotate_shard(path, dtype, *_worker_lexicons, tokens_per_block)


def _annotate_all(
    paths: list[Path],
    dtype: str,
    entities: SpanLexicon | None,
    phrases: SpanLexicon | None,
    num_proc: int,
    tokens_per_block: int,
) -> list[dict]:
    """annotate_shard for every shard, in order; in `num_proc` spawned processes if > 1."""
    if num_proc <= 1 or len(paths) <= 1:
        return [annotate_shard(path, dtype, entities, phrases, tokens_per_block) for path in paths]
    with ProcessPoolExecutor(
        min(num_proc, len(paths)),
        mp_context=get_context("spawn"),
        initializer=_init_worker,
        initargs=(entities, phrases),
    ) as pool:
        return list(
            pool.map(
                _annotate_in_worker,
                paths,
                [dtype] * len(paths),
                [tokens_per_block] * len(paths),
            )
        )


def annotate_corpus(
    cfg: PrepareConfig, tokenizer: Tokenizer, out_dir: Path, shards: list[dict], dtype: str
) -> dict:
    """Add span annotations to the shards in `out_dir` (their records `shards` are updated
    in place) as `cfg.phrases` and `cfg.entities` say; writes phrases.txt / entities.txt.
    Returns the manifest's `annotations` section. Raises EntityFileError for a bad entity
    file."""
    paths = [out_dir / shard["name"] for shard in shards]
    entities = phrases = None
    entity_count = phrase_count = 0
    if cfg.entities.path:
        entity_list = load_entities(cfg.entities.path, tokenizer)
        if entity_list.skipped:
            warnings.warn(
                f"entities.path={cfg.entities.path}: {len(entity_list.skipped)} entities hold "
                f"characters the tokenizer does not know and are not matched, e.g. "
                f"{entity_list.skipped[:3]}",
                EntitiesSkippedWarning,
                stacklevel=2,
            )
        shutil.copyfile(cfg.entities.path, out_dir / ENTITIES_FILE)
        entities, entity_count = entity_list.lexicon, entity_list.entries
    if cfg.phrases.enabled:
        barrier = barrier_tokens(tokenizer)
        lexicon = learn_phrases(
            lambda: (d for path in paths for d in read_documents(path)), barrier, cfg.phrases
        )
        write_phrases(out_dir / PHRASES_FILE, lexicon, tokenizer)
        phrases = SpanLexicon(p.token_ids for p in lexicon)
        phrase_count = len(lexicon)
    totals = {"phrase_spans": 0, "entity_spans": 0}
    for shard, result in zip(
        shards,
        _annotate_all(
            paths,
            dtype,
            entities,
            phrases,
            cfg.num_proc or default_num_proc(),
            cfg.tokens_per_block,
        ),
        strict=True,
    ):
        for key in totals:
            totals[key] += result.pop(key)
        shard.update(result)
    return {"phrases": phrase_count, "entities": entity_count, **totals}
