"""Bad command lines: a key the schema has no place for is refused naming it, and Hydra's own
errors (an unknown group option, a value of the wrong type, a key the schema lacks, an
override that does not parse) are one line and exit 2 as the README says, like every other
config error."""

import subprocess

import pytest
from fault_helpers import SCRIPTS, script_env

from pretrain.config import compose_config, validate
from pretrain.errors import ConfigError


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["+foo._target_=os.system", "+foo._args_=[echo pwned]"], "foo"),
        (["+trainer.max_step=3"], "trainer.max_step"),
        (["+data.verify_shard=true"], "data.verify_shard"),
        (["+model.hidden_sise=8"], "model.hidden_sise"),
    ],
)
def test_a_key_added_with_plus_is_refused_naming_it(overrides, named):
    with pytest.raises(ConfigError) as refused:
        validate(compose_config(overrides))
    message = str(refused.value)
    assert message.startswith(f"{named}") and "\n" not in message


def test_open_places_still_take_new_keys():
    run = validate(
        compose_config(["+optim.optimizer.foreach=false", "+strategy.deepspeed.steps_per_print=9"])
    )
    assert run.optim.optimizer["foreach"] is False
    assert run.strategy.deepspeed == {"steps_per_print": 9}


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("model=no_such_model", "Could not find 'model/no_such_model'; Available options in "),
        ("trainer.max_steps=many", "trainer.max_steps=many; Value 'many' of type 'str' could"),
        ("trainer.max_stepz=3", "Could not override 'trainer.max_stepz'"),
        ("trainer.max_steps=[", "no viable alternative"),
        ("+foo._target_=os.system", "error: foo: not a setting of the run config"),
    ],
)
def test_hydra_level_errors_exit_2(override, says, tmp_path):
    done = subprocess.run(
        [str(SCRIPTS / "pretrain"), override, f"run_dir={tmp_path / 'run'}", "logger=csv"],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
