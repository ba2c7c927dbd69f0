"""Data preparation: text cleaning, sentence splitting, inputs, tokenizer, shards, CLI."""

import gzip
import hashlib
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import CHINESE_PROSE, small_english_documents, write_text_corpus
from tokenizers import Tokenizer

from data_pipelines import cli, document_encoding
from data_pipelines.builtin_corpus import builtin_documents, module_docstrings, stdlib_source_files
from data_pipelines.chinese import make_segmenter
from data_pipelines.document_encoding import document_key, encode_sentences, tokenize_document
from data_pipelines.prepare import PrepareError, prepare
from data_pipelines.prepare_config import (
    PrepareConfig,
    PrepareConfigError,
    TokenizerSettings,
    compose_prepare_config,
)
from data_pipelines.shard_format_v1 import read_v1_documents, write_v1_shard
from data_pipelines.sources import (
    SourceError,
    SourceStats,
    UndecodableLinesWarning,
    expand_inputs,
    read_raw_documents,
    read_source,
)
from data_pipelines.text import normalize, split_sentences
from data_pipelines.tokenizer import (
    SPECIAL_TOKENS,
    copy_tokenizer,
    save_tokenizer,
    tokenizer_sha256,
    train_tokenizer,
)
from pretrain.data.shard_format import load_manifest, read_documents


def _config(inputs: list[Path | str], out_dir: Path, **settings) -> PrepareConfig:
    tokenizer = settings.pop("tokenizer", TokenizerSettings(vocab_size=600, min_frequency=1))
    values = {"docs_per_shard": 4, "num_proc": 1, **settings}
    return PrepareConfig(
        inputs=[str(i) for i in inputs], out_dir=str(out_dir), tokenizer=tokenizer, **values
    )


def _all_documents(shards_dir: Path) -> list[dict]:
    return [d for path in load_manifest(shards_dir).shard_paths for d in read_documents(path)]


def _dir_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --- text ---------------------------------------------------------------------------------


def test_normalize_nfc_controls_and_whitespace():
    assert normalize("Cafe\u0301") == "Caf\u00e9"  # NFC composes the accent
    assert normalize("a\tb\u00a0\u3000c\x00d\x07e") == "a b cde"
    assert normalize("  one \r\ntwo\rthree\u2028four\n\n\n five  ") == "one\ntwo\nthree\nfour\nfive"
    assert normalize(" \x00\x01\t\n\r ") == ""


def test_split_sentences_english():
    text = 'It rains. Does it? Yes! "Really?" he asked. See e.g. the docs... And more\nnew line'
    assert split_sentences(text) == [
        "It rains.",
        "Does it?",
        "Yes!",
        '"Really?" he asked.',
        "See e.g. the docs...",
        "And more",
        "new line",
    ]
    assert split_sentences("version 3.11 is out") == ["version 3.11 is out"]
    assert split_sentences("") == []


def test_split_sentences_chinese_needs_no_space():
    text = "我喜欢猫。你呢？他说：“好！”然后走了\n第二行"
    assert split_sentences(text) == ["我喜欢猫。", "你呢？", "他说：“好！”", "然后走了", "第二行"]


# --- inputs -------------------------------------------------------------------------------


def test_text_jsonl_and_gzip_inputs(tmp_path):
    write_text_corpus(tmp_path / "a.txt", ["first doc\nstill first", "second doc"])
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n  \ngz doc one\n\n\ngz doc two\n")
    records = [{"body": "json one", "id": 1}, {"body": "json two\n\nsame doc"}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": "gz json"}) + "\n")
    read = {
        name: list(read_source(str(tmp_path / name), SourceStats(name), text_field="body"))
        for name in ("a.txt", "b.txt.gz", "c.jsonl", "d.jsonl.gz")
    }
    assert read == {
        "a.txt": ["first doc\nstill first", "second doc"],
        "b.txt.gz": ["gz doc one", "gz doc two"],
        "c.jsonl": ["json one", "json two\n\nsame doc"],
        "d.jsonl.gz": ["gz json"],
    }


def test_jsonl_without_the_text_field_names_file_line_and_key(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(SourceError, match=r"c\.jsonl:2: no string field 'text'.*text_field"):
        list(read_source(str(tmp_path / "c.jsonl"), SourceStats("c")))


LATIN_1 = b"good one\n\xff\xfe broken\nstill good\n\ncaf\xe9 latin-1\n\nlast \xc3\xa9\n"


def test_undecodable_lines_are_an_error_naming_file_first_line_and_count(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(LATIN_1)
    with pytest.raises(SourceError) as refused:
        list(read_source(str(path), SourceStats(str(path))))
    message = str(refused.value)
    assert message.startswith(f"{path}: line 2 is not UTF-8 (2 such line(s) in all)")
    assert "undecodable=skip" in message and "undecodable=replace" in message
    assert "\n" not in message


def test_undecodable_lines_are_skipped_counted_and_warned(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(LATIN_1)
    stats = SourceStats(str(path))
    with pytest.warns(UndecodableLinesWarning, match=r"bad\.txt: skipped 2 undecodable"):
        documents = list(read_source(str(path), stats, undecodable="skip"))
    assert documents == ["good one\nstill good", "last \u00e9"]
    assert (stats.documents, stats.undecodable_lines) == (2, 2)


def test_undecodable_lines_are_replaced_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(LATIN_1)
    stats = SourceStats(str(path))
    documents = list(read_source(str(path), stats, undecodable="replace"))
    assert documents == [
        "good one\n\ufffd\ufffd broken\nstill good",
        "caf\ufffd latin-1",
        "last \u00e9",
    ]
    assert (stats.undecodable_lines, stats.replaced_lines) == (0, 2)


@pytest.mark.parametrize("policy", ["error", "skip", "replace"])
def test_a_binary_file_is_refused_whatever_the_policy(tmp_path, policy):
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04\x00\x00 some header\n\x89\x00\x01\n")
    with pytest.raises(SourceError, match=r"model\.bin: line 1 holds a NUL byte: a binary"):
        list(read_source(str(path), SourceStats(str(path)), undecodable=policy))


def test_expand_directories_globs_and_errors(tmp_path):
    for name in ("b/z.txt", "b/a/y.jsonl", "a.txt", "b/.hidden/x.txt", "c/q.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    names = expand_inputs(
        [str(tmp_path / "b"), str(tmp_path / "*.txt"), "builtin", str(tmp_path / "b/z.txt")]
    )
    assert names == [
        str(tmp_path / "b/a/y.jsonl"),
        str(tmp_path / "b/z.txt"),
        str(tmp_path / "a.txt"),
        "builtin",
    ]
    assert expand_inputs([str(tmp_path / "**/*.txt")]) == sorted(
        str(p) for p in (tmp_path / "a.txt", tmp_path / "b/z.txt", tmp_path / "c/q.txt")
    )
    with pytest.raises(SourceError, match="missing.txt"):
        expand_inputs([str(tmp_path / "missing.txt")])
    with pytest.raises(SourceError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.parquet")])


def test_builtin_corpus_is_deterministic_prose_without_imports():
    before = set(sys.modules)
    documents = list(builtin_documents())
    assert documents == list(builtin_documents())
    names = [name for name, _ in documents]
    assert len(names) == len(set(names)) > 300
    assert names[0].startswith("pydoc:") and names[-1].startswith("stdlib:")
    assert not any(
        part in name for name in names for part in ("/test/", "idlelib", "lib2to3", "site-packages")
    )
    assert "stdlib:json/decoder.py" in names
    assert sum(len(text) for _, text in documents) > 1_500_000
    assert not {"antigravity", "this", "turtle", "tkinter"} & (set(sys.modules) - before)
    files = stdlib_source_files()
    assert files and all(f.suffix == ".py" for f in files)


def test_module_docstrings_in_source_order():
    source = (
        '"""Module."""\nif True:\n    def f():\n        """In an if."""\nclass C:\n    """Class."""\n'
        '    def m(self):\n        """Method."""\nx = "not a docstring"\n'
    )
    assert module_docstrings(source) == ["Module.", "In an if.", "Class.", "Method."]
    assert module_docstrings("def broken(:\n") == []


# --- tokenizer ----------------------------------------------------------------------------


@pytest.mark.parametrize("lowercase", [True, False])
def test_saved_tokenizer_loads_with_autotokenizer_and_encodes_alike(tmp_path, lowercase):
    transformers = pytest.importorskip("transformers")
    documents = small_english_documents(120)
    tokenizer = train_tokenizer(
        lambda: documents, vocab_size=800, lowercase=lowercase, min_frequency=1
    )
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    save_tokenizer(tokenizer, tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto.is_fast and auto.pad_token_id == 0 and auto.mask_token == "[MASK]"
    for first, second in [
        ("The Assert statement, Crème brûlée!", "Second part here."),
        ("unbelievably", None),
    ]:
        expected = tokenizer.encode(first, second) if second else tokenizer.encode(first)
        encoded = auto(first, second)
        assert encoded["input_ids"] == expected.ids
        assert encoded["token_type_ids"] == expected.type_ids
    assert (auto.tokenize("The END") == auto.tokenize("the end")) == lowercase
    assert (
        tokenizer_sha256(tmp_path)
        == hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    )


def test_copy_tokenizer_keeps_bytes_and_writes_missing_companions(tmp_path):
    tokenizer = train_tokenizer(
        lambda: small_english_documents(50), vocab_size=300, min_frequency=1
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))  # a bare tokenizer.json only
    copy_tokenizer(tmp_path, tmp_path / "copy")
    assert tokenizer_sha256(tmp_path / "copy") == tokenizer_sha256(tmp_path)
    assert (tmp_path / "copy/vocab.txt").read_text().split("\n")[:5] == list(SPECIAL_TOKENS)


def test_word_starts_follow_wordpiece_continuations(tmp_path):
    tokenizer = train_tokenizer(
        lambda: small_english_documents(80), vocab_size=400, min_frequency=1
    )
    sentences = ["Unbelievably, the interpreter's grammar isn't trivial.", "##", "Zyxwv qqq!"]
    ids, sents, words = encode_sentences(
        tokenizer, ["   ", *sentences], "uint16"
    )  # "   " gives no token
    tokens = [tokenizer.id_to_token(int(i)) for i in ids]
    assert (ids.dtype, sents.dtype, words.dtype) == (np.uint16, np.int32, np.uint8)
    assert (
        sents.tolist()
        == np.cumsum(
            [len(tokenizer.encode(s, add_special_tokens=False).ids) for s in sentences]
        ).tolist()
    )
    assert words.tolist() == [int(not token.startswith("##")) for token in tokens]
    assert words[np.concatenate(([0], sents[:-1]))].all()
    assert any(token.startswith("##") for token in tokens)


# --- prepare ------------------------------------------------------------------------------


def test_round_trip_reads_back_what_was_tokenized(tmp_path):
    documents = small_english_documents(30) + ["第一句。第二句！"]
    source = write_text_corpus(tmp_path / "corpus.txt", documents)
    out = prepare(_config([source], tmp_path / "out"), progress=False)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer/tokenizer.json"))
    read = _all_documents(out)
    assert [d["key"] for d in read] == [document_key(str(source), i) for i in range(len(documents))]
    assert [d["key"] for d in read][0] == hashlib.sha1(str(source).encode()).hexdigest()[
        :8
    ] + "_00000000"
    for document, text in zip(read, documents, strict=True):
        encodings = [
            tokenizer.encode(s, add_special_tokens=False) for s in split_sentences(normalize(text))
        ]
        assert document["ids"].tolist() == [i for e in encodings for i in e.ids]
        assert document["sents"].tolist() == np.cumsum([len(e.ids) for e in encodings]).tolist()
        assert document["ids"].dtype == np.int64 and document["words"].dtype == bool


def test_prepare_twice_gives_byte_identical_output(tmp_path, monkeypatch):
    source = write_text_corpus(tmp_path / "corpus.txt", small_english_documents(60))
    blocks = {"tokens_per_block": 300}  # several blocks a shard
    first = prepare(_config([source], tmp_path / "one", num_proc=1, **blocks), progress=False)
    monkeypatch.setattr(document_encoding, "CHUNK_BYTES", 3000)  # tasks cross shard ends
    second = prepare(_config([source], tmp_path / "two", num_proc=2, **blocks), progress=False)
    one, two = _dir_bytes(first), _dir_bytes(second)
    assert sorted(one) == sorted(two) and len([n for n in one if n.endswith(".tar")]) == 15
    assert [n for n in one if one[n] != two[n]] == []


def _reference_documents(
    names: list[str], tokenizer_dir: Path, segmenter: str, shard: Path
) -> list[tuple]:
    """The documents the per-document path (`tokenize_document`, as prepare worked before
    shard format 2) makes of `names`, through a format-1 shard and back."""
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    stats = [SourceStats(name) for name in names]
    word_segmenter = make_segmenter(segmenter)
    documents = [
        tokenize_document(raw, tokenizer, "uint16", word_segmenter)
        for raw in read_raw_documents(names, stats)
    ]
    write_v1_shard(shard, [d for d in documents if len(d.ids)])
    return [
        (d.key, d.ids.tolist(), d.sents.tolist(), d.words.astype(bool).tolist())
        for d in read_v1_documents(shard)
    ]


def _prepared_documents(shards_dir: Path) -> list[tuple]:
    return [
        (d["key"], d["ids"].tolist(), d["sents"].tolist(), d["words"].tolist())
        for path in load_manifest(shards_dir).shard_paths
        for d in read_documents(path)
    ]


def test_format2_holds_the_documents_of_the_per_document_path(
    prepared_corpus, prepared_chinese_corpus, tmp_path
):
    chinese = _reference_documents(
        [str(CHINESE_PROSE)],
        prepared_chinese_corpus / "tokenizer",
        "jieba",
        tmp_path / "chinese.tar",
    )
    assert _prepared_documents(prepared_chinese_corpus) == chinese
    tokenizer_dir = prepared_corpus / "tokenizer"
    builtin = prepare(
        _config(
            ["builtin"],
            tmp_path / "builtin",
            tokenizer=TokenizerSettings(path=str(tokenizer_dir)),
            docs_per_shard=100,
            num_proc=2,
        ),
        progress=False,
    )
    reference = _reference_documents(["builtin"], tokenizer_dir, "none", tmp_path / "b.tar")
    assert _prepared_documents(builtin) == reference
    counts = load_manifest(builtin).counts
    assert (counts["documents"], counts["sentences"], counts["tokens"]) == (
        len(reference),
        sum(len(d[2]) for d in reference),
        sum(len(d[1]) for d in reference),
    )


def test_manifest_counts_sources_and_undecodable_lines(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(
        b"One sentence. Two sentences.\n\n\x07\n\n\xff bad line\nThird doc here.\n\n\xfe\n"
    )
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(
        '{"text": "Json doc. With two."}\n{"text": ""}\nnot json\n{"text": "\\u0007"}\n'
    )
    with pytest.warns(UndecodableLinesWarning) as warned:
        out = prepare(_config([text, jsonl], tmp_path / "out", undecodable="skip"), progress=False)
    assert sorted(str(w.message).split(":")[0] for w in warned) == [str(text), str(jsonl)]
    manifest = load_manifest(out)
    assert manifest.counts == {
        "documents": 3,
        "sentences": 5,
        "tokens": manifest.counts["tokens"],
        "empty_documents": 3,
        "undecodable_lines": 3,
    }
    read = _all_documents(out)
    assert manifest.counts["tokens"] == sum(len(d["ids"]) for d in read) > 0
    assert [len(d["sents"]) for d in read] == [2, 1, 2]
    assert [d["key"].split("_")[1] for d in read] == ["00000000", "00000002", "00000000"]
    assert manifest.raw["sources"] == [
        {"path": str(text), "documents": 2, "empty_documents": 1, "undecodable_lines": 2},
        {"path": str(jsonl), "documents": 1, "empty_documents": 2, "undecodable_lines": 1},
    ]
    assert manifest.raw["tokenizer"]["dir"] == "tokenizer"
    assert manifest.dtype == ("uint8" if manifest.vocab_size <= 256 else "uint16")
    assert (
        manifest.raw["config"]["inputs"] == [str(text), str(jsonl)]
        and "out_dir" not in manifest.raw["config"]
    )
    assert sum(s["documents"] for s in manifest.shards) == 3


def test_prepare_reads_directories_globs_and_gzip(tmp_path):
    documents = small_english_documents(12)
    (tmp_path / "in/sub").mkdir(parents=True)
    write_text_corpus(tmp_path / "in/sub/b.txt", documents[:4])
    with gzip.open(tmp_path / "in/a.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in documents[4:8])
    write_text_corpus(tmp_path / "extra1.txt", documents[8:10])
    write_text_corpus(tmp_path / "extra2.txt", documents[10:])
    out = prepare(
        _config([tmp_path / "in", str(tmp_path / "extra*.txt")], tmp_path / "out"), progress=False
    )
    manifest = load_manifest(out)
    assert [s["path"] for s in manifest.raw["sources"]] == [
        str(tmp_path / p) for p in ("in/a.jsonl.gz", "in/sub/b.txt", "extra1.txt", "extra2.txt")
    ]
    assert manifest.counts["documents"] == 12 and len(_all_documents(out)) == 12


def test_existing_tokenizer_is_used_not_retrained(prepared_corpus, tmp_path):
    source = write_text_corpus(tmp_path / "c.txt", ["Completely different text. Zebra quokka!"])
    settings = TokenizerSettings(path=str(prepared_corpus / "tokenizer"), vocab_size=100)
    out = prepare(_config([source], tmp_path / "out", tokenizer=settings), progress=False)
    manifest = load_manifest(out)
    assert manifest.tokenizer_sha256 == load_manifest(prepared_corpus).tokenizer_sha256
    assert manifest.vocab_size == load_manifest(prepared_corpus).vocab_size != 100


def test_out_dir_is_never_lost(tmp_path):
    source = write_text_corpus(tmp_path / "c.txt", small_english_documents(5))
    out = prepare(_config([source], tmp_path / "out"), progress=False)
    before = _dir_bytes(out)
    with pytest.raises(PrepareError, match="out_dir=.*not empty.*overwrite=true"):
        prepare(_config([source], out), progress=False)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep/notes.txt").write_text("mine")
    with pytest.raises(PrepareError, match="not a prepared corpus"):
        prepare(_config([source], tmp_path / "keep", overwrite=True), progress=False)
    assert (tmp_path / "keep/notes.txt").read_text() == "mine"
    write_text_corpus(source, small_english_documents(8))
    prepare(_config([source], out, overwrite=True), progress=False)
    assert load_manifest(out).counts["documents"] == 8 and _dir_bytes(out) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "keep", "out"]


def test_interrupted_prepare_leaves_no_dataset(tmp_path, monkeypatch):
    source = write_text_corpus(tmp_path / "c.txt", small_english_documents(10))
    import data_pipelines.shard_writer as writer_module

    original = writer_module.TarWriter.add
    calls = []

    def failing_add(self, name, data):
        calls.append(name)
        if len(calls) == 6:  # inside the second shard
            raise KeyboardInterrupt
        original(self, name, data)

    monkeypatch.setattr(writer_module.TarWriter, "add", failing_add)
    with pytest.raises(KeyboardInterrupt):
        prepare(_config([source], tmp_path / "out"), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


# --- config and CLI -----------------------------------------------------------------------


def test_compose_prepare_config_with_overrides():
    cfg = compose_prepare_config(
        ["inputs=[a.txt,b/]", "tokenizer.vocab_size=2000", "tokenizer.lowercase=false"]
    )
    assert isinstance(cfg, PrepareConfig) and cfg.inputs == ["a.txt", "b/"]
    assert (cfg.tokenizer.vocab_size, cfg.tokenizer.lowercase, cfg.docs_per_shard) == (
        2000,
        False,
        1000,
    )
    assert compose_prepare_config([]).inputs == ["builtin"]


@pytest.mark.parametrize(
    "override, key",
    [
        ("docs_per_shard=0", "docs_per_shard"),
        ("workers=0", "workers"),
        ("tokenizer.vocab_size=3", "tokenizer.vocab_size"),
        ("tokenizer.min_frequency=0", "tokenizer.min_frequency"),
        ("inputs=[]", "inputs"),
        ("docs_per_shard=many", "docs_per_shard"),
        ("+vocab=5", "vocab"),
        ("tokenizer.lowercase=maybe", "lowercase"),
    ],
)
def test_bad_config_values_name_the_key(override, key):
    with pytest.raises(PrepareConfigError, match=key):
        compose_prepare_config([override])


def test_cli_prepare_info_and_errors(tmp_path, capsys):
    source = write_text_corpus(tmp_path / "c.txt", small_english_documents(6))
    out = tmp_path / "out"
    args = [
        f"inputs=[{source}]",
        f"out_dir={out}",
        "tokenizer.vocab_size=300",
        "num_proc=1",
        "docs_per_shard=4",
    ]
    assert cli.main(["prepare", *args]) == 0
    assert "documents" in capsys.readouterr().out
    assert cli.main(["info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^shards +2 ", printed, re.M) and re.search(r"^documents +6$", printed, re.M)
    assert cli.main(["prepare", *args]) == 2
    assert "not empty" in capsys.readouterr().err
    assert cli.main(["info", str(tmp_path)]) == 1
    assert "manifest.json" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2


def test_cli_prepare_input_policy_and_a_smaller_vocabulary(tmp_path, capsys):
    """Latin-1 text is an error naming the file and line (exit 2, nothing written); skip and
    replace say in the summary how many lines; a vocabulary smaller than asked for is
    reported with both sizes."""
    good = write_text_corpus(tmp_path / "good.txt", small_english_documents(6))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\u00e9 au lait.\n\nNa\u00efve text here.\n".encode("latin-1"))
    out = tmp_path / "out"
    args = [f"inputs=[{good},{latin}]", f"out_dir={out}", "num_proc=1", "docs_per_shard=4"]
    assert cli.main(["prepare", *args, "tokenizer.vocab_size=300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"pretrain-data prepare: error: {latin}: line 1 is not UTF-8 (2 such")
    assert "\n" not in err and not out.exists()
    for policy, said in (("skip", "2 undecodable line(s) dropped"), ("replace", "2 line(s)")):
        run = [*args, f"undecodable={policy}", "overwrite=true", "tokenizer.vocab_size=300"]
        assert cli.main(["prepare", *run]) == 0
        printed = capsys.readouterr().out
        assert f"warning: {said}" in printed, printed
    assert load_manifest(out).raw["config"]["undecodable"] == "replace"
    assert cli.main(["prepare", f"inputs=[{good}]", f"out_dir={out}", "overwrite=true",
                     "num_proc=1", "tokenizer.vocab_size=30522"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    gave = load_manifest(out).vocab_size
    assert f"warning: tokenizer.vocab_size=30522 was asked for, the corpus gave {gave:,}" in printed
    assert "undecodable" not in load_manifest(out).raw["config"]  # the default: as before
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert cli.main(["prepare", f"inputs=[{binary}]", f"out_dir={tmp_path / 'b'}"]) == 2
    assert "holds a NUL byte: a binary" in capsys.readouterr().err


def test_cli_preview_dispatches_to_the_preview_module(monkeypatch):
    received = []
    fake = types.ModuleType("pretrain.runtime.preview")
    fake.main = lambda args: received.append(args) or 0
    monkeypatch.setitem(sys.modules, "pretrain.runtime.preview", fake)
    assert cli.main(["preview", "data.batch_size=2", "experiment=demo"]) == 0
    assert received == [["data.batch_size=2", "experiment=demo"]]
