"""The options tables of README.md and conf/README.md list what conf/ holds."""

from pretrain.conf_tables import description, shorten, stale_files


def test_committed_tables_are_current():
    stale = stale_files()
    assert not stale, (
        f"stale options tables in {', '.join(map(str, stale))}: "
        "run `python -m pretrain.conf_tables` and commit the result"
    )


def test_description_is_the_first_sentence_of_the_header_comment(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(
        "# @package _global_\n# Tiny BERT (Devlin et al., 2019): L=2 | H=128.\n"
        "# More detail, e.g. this.\nname: x\n# not the header\n"
    )
    assert description(path) == "Tiny BERT (Devlin et al., 2019): L=2 \\| H=128."
    path.write_text("name: x\n")
    assert description(path) == "—"


def test_long_sentences_are_cut_after_a_clause_outside_brackets():
    sentence = "Model (a, b, c): " + ", ".join(f"part {i}" for i in range(40)) + "."
    short = shorten(sentence, limit=60)
    assert short.endswith(" …") and len(short) <= 62 and "(a, b, c)" in short
    assert shorten("short.", limit=60) == "short."
