"""Task file loaders: GLUE-style TSV, SQuAD JSON, JSONL and CSV; errors name file and line."""

import json

import pytest
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.eval.config import EvalRunConfig, TaskConfig, register_eval_schema
from pretrain.eval.formats import TaskFileError, read_task
from pretrain.eval.tasks import SpanExample, TaggingExample, TextExample
from pretrain.paths import CONF_DIR

register_eval_schema()


def write(directory, name, text):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8")


def glue(tmp_path, name, train, dev=None, dev_name="dev.tsv"):
    write(tmp_path, "train.tsv", train)
    write(tmp_path, dev_name, dev or train)
    return read_task(TaskConfig(name=name, format="glue", path=str(tmp_path)))


def test_glue_layouts(tmp_path):
    sst = glue(tmp_path / "sst", "sst2", 'sentence\tlabel\nit\'s "fine"\t1\nbad\t0\n')
    assert sst.kind == "classification" and sst.labels == ("0", "1")
    assert sst.train == [TextExample('it\'s "fine"', None, 1), TextExample("bad", None, 0)]
    cola = glue(tmp_path / "cola", "cola", "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode the.\n")
    assert cola.train[1] == TextExample("Rode the.", None, 0)
    mrpc = glue(
        tmp_path / "mrpc",
        "mrpc",
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA cat.\tThe cat.\n",
    )
    assert mrpc.kind == "pair" and mrpc.train == [TextExample("A cat.", "The cat.", 1)]
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    stsb = glue(tmp_path / "stsb", "stsb", header + "0\tm\tf\t2012\t1\ts\ts\tA.\tB.\t3.8\n")
    assert stsb.kind == "regression" and stsb.train == [TextExample("A.", "B.", 3.8)]
    mnli_rows = "index\tsentence1\tsentence2\tgold_label\n0\tA.\tB.\tneutral\n"
    mnli = glue(tmp_path / "mnli", "mnli", mnli_rows, dev_name="dev_matched.tsv")
    assert mnli.train == [TextExample("A.", "B.", 2)] and len(mnli.labels) == 3
    rte = glue(
        tmp_path / "rte", "rte", "index\tsentence1\tsentence2\tlabel\n0\tA\tB\tnot_entailment\n"
    )
    assert rte.train == [TextExample("A", "B", 1)]


def test_glue_errors_name_file_and_line(tmp_path):
    with pytest.raises(TaskFileError, match=r"train.tsv:3: label 'maybe' is not one of"):
        glue(tmp_path / "a", "sst2", "sentence\tlabel\ngood\t1\nhm\tmaybe\n")
    with pytest.raises(TaskFileError, match=r"train.tsv:2: 1 tab-separated columns"):
        glue(tmp_path / "b", "rte", "index\tsentence1\tsentence2\tlabel\nbroken row\n")
    with pytest.raises(TaskFileError, match=r"train.tsv:1: the header lacks the column 'sentence'"):
        glue(tmp_path / "c", "sst2", "text\tlabel\ngood\t1\n")
    with pytest.raises(TaskFileError, match=r"dev.tsv: task file not found"):
        write(tmp_path / "d", "train.tsv", "sentence\tlabel\n")
        read_task(TaskConfig(name="sst2", format="glue", path=str(tmp_path / "d")))


def squad_json(impossible: bool = True, start: int = 4) -> str:
    qas = [{"id": "q1", "question": "Who?", "answers": [{"text": "cat", "answer_start": start}]}]
    if impossible:
        qas.append({"id": "q2", "question": "Why?", "answers": [], "is_impossible": True})
    paragraph = {"context": "The cat sat.", "qas": qas}
    return json.dumps(
        {"version": "v2.0", "data": [{"title": "t", "paragraphs": [paragraph]}]}, indent=1
    )


def test_squad_json_with_v2_no_answer(tmp_path):
    write(tmp_path, "train.json", squad_json())
    write(tmp_path, "dev.json", squad_json(impossible=False))
    task = read_task(TaskConfig(name="squad", format="squad", path=str(tmp_path)))
    assert task.kind == "qa"
    assert task.train == [
        SpanExample("q1", "Who?", "The cat sat.", (("cat", 4),)),
        SpanExample("q2", "Why?", "The cat sat.", ()),
    ]
    assert len(task.dev) == 1


def test_squad_errors_name_file_and_line_of_the_question(tmp_path):
    write(tmp_path, "train.json", squad_json(start=5))
    write(tmp_path, "dev.json", squad_json())
    line = squad_json(start=5).splitlines().index('       "id": "q1",') + 1
    with pytest.raises(
        TaskFileError,
        match=rf"train.json:{line} \(question q1\): answer 'cat' is not at character 5",
    ):
        read_task(TaskConfig(name="squad", format="squad", path=str(tmp_path)))
    write(tmp_path, "train.json", '{"data": [\n  {"paragraphs": [}\n]}')
    with pytest.raises(TaskFileError, match=r"train.json:2: not JSON"):
        read_task(TaskConfig(name="squad", format="squad", path=str(tmp_path)))


def test_jsonl_and_csv_with_named_columns(tmp_path):
    rows = [{"q": "is it", "doc": "it is", "y": "yes"}, {"q": "no", "doc": "x", "y": "no"}]
    write(tmp_path, "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows) + "\n")
    write(tmp_path, "dev.jsonl", json.dumps(rows[0]) + "\n")
    config = TaskConfig(
        name="mine",
        format="jsonl",
        kind="pair",
        path=str(tmp_path),
        text_a="q",
        text_b="doc",
        label="y",
    )
    task = read_task(config)
    assert task.labels == ("no", "yes")
    assert task.train == [TextExample("is it", "it is", 1), TextExample("no", "x", 0)]
    write(tmp_path, "train.csv", "words,tags\nthe cat,O B\na dog ran,O B O\n")
    write(tmp_path, "dev.csv", "words,tags\nthe dog,O B\n")
    config = TaskConfig(
        name="tags", format="csv", kind="tagging", path=str(tmp_path), text_a="words", label="tags"
    )
    task = read_task(config)
    assert task.labels == ("B", "O")
    assert task.dev == [TaggingExample(("the", "dog"), (1, 0))]
    write(
        tmp_path,
        "train.jsonl",
        json.dumps({"q": "Who?", "c": "The cat.", "a": [{"text": "cat", "answer_start": 4}]})
        + "\n",
    )
    config = TaskConfig(
        name="qa", format="jsonl", kind="qa", path=str(tmp_path), text_a="q", text_b="c", label="a"
    )
    write(
        tmp_path, "dev.jsonl", json.dumps({"id": "d1", "q": "Who?", "c": "A dog.", "a": []}) + "\n"
    )
    task = read_task(config)
    assert task.train[0].answers == (("cat", 4),) and task.dev[0] == SpanExample(
        "d1", "Who?", "A dog.", ()
    )


def test_jsonl_and_csv_errors_name_file_and_line(tmp_path):
    write(tmp_path, "train.jsonl", '{"text_a": "a", "label": 1}\n\n{"text_a": "b", "label": 1\n')
    write(tmp_path, "dev.jsonl", '{"text_a": "a", "label": 1}\n')
    config = TaskConfig(name="x", format="jsonl", kind="classification", path=str(tmp_path))
    with pytest.raises(TaskFileError, match=r"train.jsonl:3: not JSON"):
        read_task(config)
    write(tmp_path, "train.jsonl", '{"text_a": "a", "label": 1}\n{"text": "b", "label": 0}\n')
    with pytest.raises(TaskFileError, match=r"train.jsonl:2: no column 'text_a'"):
        read_task(config)
    write(tmp_path, "train.csv", 'text_a,label\ngood,1\n"bad",0,extra\n')
    write(tmp_path, "dev.csv", "text_a,label\ngood,1\n")
    config = TaskConfig(name="x", format="csv", kind="classification", path=str(tmp_path))
    with pytest.raises(TaskFileError, match=r"train.csv:3: 3 columns where the header has 2"):
        read_task(config)
    write(tmp_path, "train.csv", "text_a,label\ngood,1\nbad,0\n")
    write(tmp_path, "dev.csv", "text_a,label\ngood,2\n")
    with pytest.raises(
        TaskFileError, match=r"dev.csv:2: label '2' is not one of the task's labels \(0, 1\)"
    ):
        read_task(config)


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "eval").glob("*.yaml")))
def test_every_eval_option_composes_into_the_typed_config(option):
    cfg = compose_config([f"eval={option}", "eval.task.path=somewhere"], "evaluate")
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, EvalRunConfig)
    assert run.result_name == run.eval.task.name
