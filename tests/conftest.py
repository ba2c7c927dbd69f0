"""Shared fixtures: small prepared corpora that every data and training test can read."""

import contextlib
import io
import multiprocessing.process
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from data_pipelines.builtin_corpus import (
    module_docstrings,
    pydoc_topic_documents,
    stdlib_source_files,
)
from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import (
    EntitySettings,
    PhraseSettings,
    PrepareConfig,
    TokenizerSettings,
)

SMALL_CORPUS_DOCUMENTS = 300
SMALL_CORPUS_DOCS_PER_SHARD = 50
SMALL_CORPUS_VOCAB_SIZE = 1500
TESTS_DIR = Path(__file__).parent
UNIT_DIR = TESTS_DIR / "unit"
DATA_DIR = TESTS_DIR / "data"
CHINESE_PROSE = DATA_DIR / "chinese_prose.txt"  # 8 documents, 50 sentences, written for the tests
CHINESE_ENTITIES = DATA_DIR / "entities_zh.txt"
ENGLISH_ENTITIES = DATA_DIR / "entities_en.txt"


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{what} in a unit test: tests/unit runs in one process and trains nothing; "
            "move the test to tests/integration"
        )

    return refuse


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files named in $PRETRAIN_TESTS_FIRST (the Makefile's LONGEST_FIRST) first, in that
    order, the rest as collected, so that no long test starts last on a pytest-xdist worker.
    (A module-scoped fixture is then built once on each worker that runs one of its tests:
    the long ones are `build_once` fixtures, built once for all workers.)"""
    first = os.environ.get("PRETRAIN_TESTS_FIRST", "").split()
    if first:
        rank = {path: number for number, path in enumerate(first)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(first)))


@pytest.fixture(scope="session")
def build_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable], Path]:
    """`build_once(name, make)`: the directory `name`, made by `make(directory)` once per test
    session and shared by its pytest-xdist workers (the first to ask builds it under a file
    lock, the others wait for it and read it). Read-only to those who read it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    root.mkdir(exist_ok=True)

    def build(name: str, make: Callable[[Path], object]) -> Path:
        path, done = root / name, root / f"{name}.done"
        with FileLock(f"{path}.lock"):
            if not done.exists():
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True)
                make(path)
                done.touch()
        return path

    return build


@pytest.fixture(autouse=True)
def no_distributed_run_leaks_into_the_next_test() -> Iterator[None]:
    """What an in-process distributed run wrote into os.environ (Lightning sets LOCAL_RANK,
    WORLD_SIZE, MASTER_PORT, ...; `zygote.DISTRIBUTED_VARIABLES`) is put back as it was
    after each test: left there, the next test of the worker ran as a launch of a job
    (`storage.corpus.launch_key` saw a MASTER_PORT and reused its corpus mirror)."""
    from zygote import DISTRIBUTED_VARIABLES

    before = {name: os.environ.get(name) for name in DISTRIBUTED_VARIABLES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def unit_tests_stay_in_one_process(request: pytest.FixtureRequest, monkeypatch) -> None:
    """Under tests/unit: a test that starts a subprocess, forks, starts a multiprocessing
    process (data-loader workers included) or fits a Lightning trainer fails, naming what it
    started (the layer is the one a developer runs often). Elsewhere: nothing."""
    if UNIT_DIR not in request.path.parents:
        return
    from lightning.pytorch import Trainer

    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("a subprocess"))
    monkeypatch.setattr(os, "fork", _refuse("os.fork"))
    monkeypatch.setattr(
        multiprocessing.process.BaseProcess, "start", _refuse("a multiprocessing process")
    )
    monkeypatch.setattr(Trainer, "fit", _refuse("a training run (Trainer.fit)"))


@pytest.fixture
def apex_stub(monkeypatch: pytest.MonkeyPatch):
    """apex importable as tests/stubs' stand-in (apex's real signatures), for one test only."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "stubs"))
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in ("apex", "amp_C", "fused_layer_norm_cuda"):
            del sys.modules[name]


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (then as before): the test machine's cores are
    shared, and one thread is much faster for tiny models. Modules that want it for every test
    say `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_english_documents(count: int = SMALL_CORPUS_DOCUMENTS) -> list[str]:
    """`count` short English documents (1 to 7 paragraphs, a few sentences each) cut from the
    help topics that ship with Python; deterministic, no download."""
    paragraphs = [line for _, text in pydoc_topic_documents() for line in text.split("\n")]
    documents, start = [], 0
    while len(documents) < count and start < len(paragraphs):
        size = 1 + len(documents) % 7
        documents.append("\n".join(paragraphs[start : start + size]))
        start += size
    assert len(documents) == count, "the help topics give fewer documents than asked for"
    return documents


def write_text_corpus(path: Path, documents: list[str]) -> Path:
    """Write `documents` as a plain text input (documents separated by blank lines)."""
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def three_file_corpus(root: Path) -> list[str]:
    """Three text inputs under `root` of 100 small English documents each; their paths."""
    documents = small_english_documents()
    root.mkdir(parents=True, exist_ok=True)
    return [
        str(write_text_corpus(root / f"part{i}.txt", documents[i * 100 : (i + 1) * 100]))
        for i in range(3)
    ]


def prepare_small_corpus(root: Path, **settings) -> Path:
    """Prepare the small corpus under `root` (tokenized in this process); returns its shards dir.
    Its source is named `corpus.txt`, relative: document keys hash the source's name and seed
    every mask and random choice, so with the temporary directory's absolute path in it every
    session's corpus differed (and a statistical test passed or failed with the draw)."""
    write_text_corpus(root / "corpus.txt", small_english_documents())
    tokenizer = TokenizerSettings(
        vocab_size=SMALL_CORPUS_VOCAB_SIZE, lowercase=True, min_frequency=2
    )
    config = PrepareConfig(
        inputs=["corpus.txt"],
        out_dir=str(root / "shards"),
        tokenizer=tokenizer,
        docs_per_shard=SMALL_CORPUS_DOCS_PER_SHARD,
        num_proc=1,
    )
    for key, value in settings.items():
        setattr(config, key, value)
    with contextlib.chdir(root):
        return prepare(config, progress=False)


@pytest.fixture(scope="session")
def prepared_corpus(build_once) -> Path:
    """Shards dir of a prepared corpus: 300 short English documents (about 200 kB, Python's
    help topics) in 6 shards of 50, lower-cased WordPiece vocabulary of at most 1500 tokens,
    tokenizer in `<dir>/tokenizer`. Made once per session, in a couple of seconds. Read-only:
    copy it before changing anything."""
    return build_once("prepared_corpus", prepare_small_corpus) / "shards"


def prepare_chinese_corpus(root: Path, **settings) -> Path:
    """Prepare tests/data/chinese_prose.txt under `root` as Chinese BERT-wwm + ERNIE data:
    character-level `chinese` tokenizer, jieba word starts, phrases and the entities of
    tests/data/entities_zh.txt; 2 documents per shard. Returns the shards dir."""
    config = PrepareConfig(
        inputs=[str(CHINESE_PROSE)],
        out_dir=str(root / "shards"),
        tokenizer=TokenizerSettings(kind="chinese", vocab_size=1000, min_frequency=2),
        segmenter="jieba",
        phrases=PhraseSettings(enabled=True, min_count=2, min_npmi=0.3),
        entities=EntitySettings(path=str(CHINESE_ENTITIES)),
        docs_per_shard=2,
        num_proc=1,
    )
    for key, value in settings.items():
        setattr(config, key, value)
    return prepare(config, progress=False)


@pytest.fixture(scope="session")
def prepared_chinese_corpus(build_once) -> Path:
    """Shards dir of a small Chinese corpus (8 documents, 50 sentences, about 1,100 tokens,
    tests/data/chinese_prose.txt) in 4 shards: every CJK character a token, word starts from
    jieba, phrase and entity spans (`<block>.phrases.npy`, lexicon in `<dir>/phrases.txt`).
    Made once per session in about a second. Read-only: copy it before changing anything."""
    return build_once("prepared_chinese_corpus", prepare_chinese_corpus) / "shards"


@pytest.fixture(scope="session")
def prepared_annotated_corpus(build_once) -> Path:
    """The small English corpus of `prepared_corpus` with ERNIE span annotations: phrases
    (min_count 5, npmi >= 0.5) and the entities of tests/data/entities_en.txt. Made once per
    session in a few seconds. Read-only."""

    def make(root: Path) -> None:
        prepare_small_corpus(
            root,
            phrases=PhraseSettings(enabled=True),
            entities=EntitySettings(path=str(ENGLISH_ENTITIES)),
        )

    return build_once("prepared_annotated_corpus", make) / "shards"


def cpu_run_overrides(
    shards_dir: Path, run_dir: Path, *extra: str, batch_size: int = 8
) -> list[str]:
    """Hydra overrides of a tiny CPU training run: `model=bert_tiny` on `shards_dir`, batches
    of `batch_size` sequences of 64 tokens, CSV logs in `run_dir`, no progress bar; then `extra`."""
    return [
        f"data.shards_dir={shards_dir}",
        f"run_dir={run_dir}",
        "logger=csv",
        "trainer=cpu",
        "model=bert_tiny",
        "data.max_seq_length=64",
        f"data.batch_size={batch_size}",
        "data.shuffle_buffer_documents=50",
        "trainer.enable_progress_bar=false",
        *extra,
    ]


def tiny_module_config(objective: dict, **sections: dict) -> dict:
    """A plain run config for building an objective module directly: a 2-layer, 32-wide
    encoder without dropout (64 positions, sequences of 64 tokens), the given `objective`
    settings, and optional extra sections."""
    config = {
        "seed": 0,
        "model": {
            "name": "t",
            "_target_": "pretrain.models.bert.BertEncoder",
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "type_vocab_size": 2,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "layer_norm_eps": 1e-12,
            "initializer_range": 0.02,
        },
        "objective": objective,
        "data": {"max_seq_length": 64},
    }
    config.update(sections)
    return config


def write_raw_shard(path: Path, members: list[tuple[str, np.ndarray | bytes]]) -> None:
    """A tar of the given (member name, array or bytes) pairs, arrays saved as .npy, written
    as-is (no checks), to test what the shard reader does with malformed blocks."""
    with tarfile.open(path, "w") as tar:
        for name, value in members:
            buffer = io.BytesIO()
            if isinstance(value, bytes):
                buffer.write(value)
            else:
                np.save(buffer, value)
            info = tarfile.TarInfo(name)
            info.size = buffer.tell()
            buffer.seek(0)
            tar.addfile(info, buffer)


@pytest.fixture(scope="session")
def tiny_encoder_checkpoint(
    prepared_corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`<run>/checkpoints/last.ckpt`: a `pretrain`-format checkpoint of an untrained 3-layer,
    32-wide BERT encoder (64 positions, seed 0) on the `prepared_corpus` tokenizer, for the
    downstream-evaluation tests. Read-only."""
    import torch

    from pretrain.data.vocab import load_vocabulary
    from pretrain.models.build import build_encoder

    tokenizer_dir = prepared_corpus / "tokenizer"
    vocab = load_vocabulary(tokenizer_dir)
    objective = {"name": "mlm", "_target_": "pretrain.objectives.mlm.MaskedLanguageModel"}
    config = tiny_module_config(objective)
    config["model"]["num_hidden_layers"] = 3  # 4 hidden states: enough for concat_last4
    torch.manual_seed(0)
    encoder = build_encoder(config["model"], vocab.size, vocab.pad)
    config["model_runtime"] = {"vocab_size": vocab.size, "pad_token_id": vocab.pad}
    config["data"]["tokenizer_dir"] = str(tokenizer_dir)
    path = tmp_path_factory.mktemp("tiny_encoder_run") / "checkpoints" / "last.ckpt"
    path.parent.mkdir()
    state_dict = {f"encoder.{key}": value for key, value in encoder.state_dict().items()}
    torch.save({"state_dict": state_dict, "config": config, "global_step": 0, "epoch": 0}, path)
    return path


def first_shard_read(shards_dir: Path) -> Path:
    """The first shard of epoch 0's order in the default tiny CPU run on `shards_dir`."""
    from pretrain.config import compose_config
    from pretrain.data.reading import shard_sharing
    from pretrain.runtime.run import build_stream

    _, spec, _ = build_stream(compose_config(cpu_run_overrides(shards_dir, Path("unused"))))
    return Path(spec.shard_paths[shard_sharing(spec, 0, spec.stream_partitions)[0][0]])


def damage_first_shard(shards_dir: Path) -> Path:
    """Flip one byte in the middle of `first_shard_read` (same size: only its sha256 tells);
    returns its path."""
    shard = first_shard_read(shards_dir)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    return shard


def assert_corrupts_like_the_full_batch(corrupt, full: dict, fields: tuple[str, ...]) -> dict:
    """`corrupt(batch)` (a callable that leaves its argument alone) of `full` with only
    `fields` among `collate`'s per-token arrays (`reading.COLLATED`) equals `corrupt(full)`,
    array for array and dtype for dtype, less the arrays left out; returns that output."""
    from pretrain.data.reading import COLLATED

    left_out = {name for name, _ in COLLATED} - set(fields)
    few = {k: v for k, v in full.items() if k not in left_out}
    expected, got = corrupt(full), corrupt(few)
    assert set(got) == set(expected) - left_out
    for name in got:
        if name != "keys":
            assert got[name].dtype == expected[name].dtype
        np.testing.assert_array_equal(got[name], expected[name])
    return got


def prepare_docstring_corpus(root: Path, tokenizer: Path) -> Path:
    """120 documents of standard-library docstrings, tokenized with `tokenizer`; its source is
    named `docstrings.txt`, relative (as in `prepare_small_corpus`)."""
    documents = []
    for path in stdlib_source_files():
        text = "\n".join(module_docstrings(path.read_text(encoding="utf-8", errors="replace")))
        if len(text.split()) > 40:
            documents.append(text[:3000])
        if len(documents) == 120:
            break
    config = PrepareConfig(
        inputs=["docstrings.txt"],
        out_dir=str(root / "shards"),
        tokenizer=TokenizerSettings(path=str(tokenizer)),
        docs_per_shard=30,
        num_proc=1,
    )
    write_text_corpus(root / "docstrings.txt", documents)
    with contextlib.chdir(root):
        return prepare(config, progress=False)


@pytest.fixture(scope="session")
def docstring_corpus(build_once, prepared_corpus) -> Path:
    """Shards dir of a second corpus for data.sources: 120 documents of the standard
    library's docstrings in 4 shards of 30, tokenized with prepared_corpus's tokenizer."""
    make = lambda root: prepare_docstring_corpus(root, prepared_corpus / "tokenizer")  # noqa: E731
    return build_once("docstring_corpus", make) / "shards"
