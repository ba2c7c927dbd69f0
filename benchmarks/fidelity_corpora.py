"""The corpora of `fidelity.py`, prepared once into data/fidelity/ (about a minute on 2
cores): the built-in English corpus with ERNIE's phrase and entity annotations, and Chinese
prose (character tokens, jieba words, phrases, entities)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "data" / "fidelity"
TEST_DATA = ROOT / "tests" / "data"
SEEDS = ROOT.parent / "shared" / "seeds"


# Multi-word terms of the built-in corpus added to tests/data/entities_en.txt as entities
# (that list alone finds almost no entity of two or more words there).
EXTRA_ENTITIES = ("standard library", "keyword arguments", "return value", "for example")


def english_corpus() -> Path:
    """The built-in corpus with ERNIE's phrase and entity annotations (prepared once)."""
    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import EntitySettings, PhraseSettings, PrepareConfig

    out = CORPORA / "english"
    if not (out / "manifest.json").is_file():
        names = (TEST_DATA / "entities_en.txt").read_text(encoding="utf-8").split("\n")
        listed = CORPORA / "entities_en.txt"
        listed.parent.mkdir(parents=True, exist_ok=True)
        listed.write_text("\n".join([*filter(None, names), *EXTRA_ENTITIES]) + "\n")
        entities = EntitySettings(path=str(listed))
        config = PrepareConfig(out_dir=str(out), docs_per_shard=64, overwrite=True)
        config.phrases, config.entities = PhraseSettings(enabled=True), entities
        prepare(config, progress=False)
    return out


def chinese_corpus() -> Path:
    """Chinese prose (character tokens, jieba words, phrases, entities), prepared once."""
    from data_pipelines.prepare import prepare
    from data_pipelines.prepare_config import (
        EntitySettings,
        PhraseSettings,
        PrepareConfig,
        TokenizerSettings,
    )

    out = CORPORA / "chinese"
    if not (out / "manifest.json").is_file():
        inputs = [str(TEST_DATA / "chinese_prose.txt"), *map(str, sorted(SEEDS.glob("*.txt")))]
        config = PrepareConfig(inputs=inputs, out_dir=str(out), docs_per_shard=4, overwrite=True)
        config.tokenizer = TokenizerSettings(kind="chinese", vocab_size=3000, min_frequency=1)
        config.segmenter = "jieba"
        config.phrases = PhraseSettings(enabled=True, min_count=2, min_npmi=0.3)
        config.entities = EntitySettings(path=str(TEST_DATA / "entities_zh.txt"))
        prepare(config, progress=False)
    return out
