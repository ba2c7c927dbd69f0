"""The options tables of README.md and conf/README.md list what conf/ holds."""

import re

from pretrain.cli.conf_tables import description, group_options, shorten, stale_files
from pretrain.paths import CONF_DIR, REPO_ROOT


def test_committed_tables_are_current():
    stale = stale_files()
    assert not stale, (
        f"stale options tables in {', '.join(map(str, stale))}: "
        "run `python -m pretrain.cli.conf_tables` and commit the result"
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


README_FILES = ("README.md", "conf/README.md", "slurm/README.md", "docker/README.md")
README_FILES += ("data_pipelines/README.md", "src/pretrain/data/README.md", "slurm/train.sbatch")
USER_CONFIG_EXAMPLES = {"experiment=mine", "model=bert_wide"}  # conf/README.md: your own configs


def test_readme_commands_name_configs_that_exist():
    groups = "|".join(re.escape(group) for group in group_options())
    pattern = re.compile(rf"(?<![\w.])\+?({groups})=([a-z][a-z0-9_]*)\b")
    missing = [
        f"{name}: {match.group(0)}"
        for name in README_FILES
        if (REPO_ROOT / name).is_file()
        for match in pattern.finditer((REPO_ROOT / name).read_text(encoding="utf-8"))
        if match.group(0).lstrip("+") not in USER_CONFIG_EXAMPLES
        and not (CONF_DIR / match.group(1) / f"{match.group(2)}.yaml").is_file()
    ]
    assert not missing, missing
