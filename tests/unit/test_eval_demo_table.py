"""`make demo-eval`'s statistics and table (pretrain.eval.demo): mean and sample standard
deviation over seeds, the difference of the means with the deviation of the paired
per-seed differences, and its command line."""

import math

import pytest

from pretrain.eval.demo import DEMO_TASKS, RECIPES, mean_std, parse_arguments, table


def test_mean_and_sample_standard_deviation():
    assert mean_std([0.7, 0.8, 0.9]) == pytest.approx((0.8, 0.1))  # n - 1 in the denominator
    assert mean_std([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])[1] == pytest.approx(math.sqrt(32 / 7))
    assert mean_std([0.5]) == (0.5, 0.0)


def test_table_pairs_the_seeds_for_the_difference():
    # the random scores move with the pretrained ones seed by seed: the difference is steady
    rows = [("builtin_order", "accuracy", "probe", [0.80, 0.90, 0.70], [0.60, 0.70, 0.50])]
    header, rule, line = table(rows).splitlines()
    assert header == "| task | metric | mode | pretrained | random | difference |"
    assert rule.count("|") == header.count("|")
    assert line == (
        "| builtin_order | accuracy | probe | 0.800 ± 0.100 | 0.600 ± 0.100 | +0.200 ± 0.000 |"
    )
    worse = table([("builtin_next", "accuracy", "finetune", [0.5, 0.5], [0.6, 0.4])])
    assert worse.splitlines()[2].endswith("| +0.000 ± 0.141 |")
    below = table([("builtin_next", "accuracy", "finetune", [0.4], [0.6])])
    assert below.splitlines()[2].endswith("| -0.200 ± 0.000 |")


def test_command_line_reads_lists_and_overrides_in_any_order():
    args = parse_arguments(
        ["--tasks", "builtin_next", "eval.epochs=1", "--seeds", "3", "4", "--modes", "probe"]
    )
    assert (args.tasks, args.modes, args.seeds) == (["builtin_next"], ["probe"], [3, 4])
    assert args.overrides == ["eval.epochs=1"]
    default = parse_arguments(["out_dir=x"])
    assert (default.tasks, default.modes, default.seeds) == (
        list(DEMO_TASKS),
        list(RECIPES),
        [0, 1, 2],
    )
    assert default.overrides == ["out_dir=x"]
    last = parse_arguments(["--seeds", "0", "encoder.path=x"])  # an override after --seeds
    assert (last.seeds, last.overrides) == ([0], ["encoder.path=x"])
    for wrong in (["--modes", "linear"], ["--seeds", "one"]):
        with pytest.raises(SystemExit):
            parse_arguments(wrong)


def test_both_recipes_pool_the_same_way_and_only_the_probe_freezes():
    assert "eval.mode=features" in RECIPES["probe"]
    assert "eval.mode=finetune" in RECIPES["finetune"]
    assert all("eval.pooling=mean" in recipe for recipe in RECIPES.values())
