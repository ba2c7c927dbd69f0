"""A short training run on the unpadded encoder path (model.unpad=true, issue 14 item 4) has
the losses of the same run on the padded path, step for step."""

import pytest
from conftest import cpu_run_overrides
from test_train import step_losses

from pretrain.config import compose_config
from pretrain.runtime.run import train

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_unpadded_run_has_the_padded_runs_losses(prepared_corpus, tmp_path, capsys):
    losses, printed = {}, {}
    for unpad in ("false", "true"):
        run_dir = tmp_path / unpad
        overrides = cpu_run_overrides(
            prepared_corpus,
            run_dir,
            "data=sentence_pair",  # about 60% padding
            f"model.unpad={unpad}",
            "model.hidden_dropout_prob=0",
            "model.attention_probs_dropout_prob=0",
            "optim.warmup_steps=2",
            "optim.optimizer.lr=3e-3",
            "trainer.max_steps=6",
            "trainer.log_every_n_steps=1",
        )
        train(compose_config(overrides))
        losses[unpad] = step_losses(run_dir)
        printed[unpad] = capsys.readouterr().out
    assert sorted(losses["true"]) == list(range(6))
    for step, loss in losses["false"].items():
        assert losses["true"][step] == pytest.approx(loss, rel=1e-5, abs=1e-5), step
    assert losses["true"][5] < losses["true"][0] - 0.1  # it trains
    assert "unpadded rows: at most 16 buckets" in printed["true"]  # the shape line says so
    assert "unpadded rows" not in printed["false"]
