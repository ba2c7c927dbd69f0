"""Every `conf/objective/*.yaml` composes with a compatible data format and builds: the
objective module and the data module from the composed config, one batch of the real stream
through `training_step`, a finite loss whose gradient reaches the model. Tiny models, short
sequences, no Trainer: about a second per objective. (Every experiment and data group
composes and validates in tests/integration/test_config.py; the golden curves train each
objective for a few steps.)"""

import math
import warnings
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.paths import CONF_DIR
from pretrain.runtime.run import prepare_run

OBJECTIVES = sorted(path.stem for path in (CONF_DIR / "objective").glob("*.yaml"))

# objective -> (model, data group, corpus fixture, extra overrides); unlisted objectives run
# with the defaults: a tiny BERT on SEGMENT-PAIR inputs of the plain corpus.
DEFAULT_CASE = ("bert_tiny", "segment_pair", "prepared_corpus", ())
TINY_DISTILBERT = (
    "model.hidden_size=128",  # the teacher's (bert_tiny) width: the student starts from it
    "model.num_hidden_layers=1",
    "model.num_attention_heads=2",
    "model.intermediate_size=512",
)
CASES = {
    "mlm": ("roberta_tiny", "full_sentences", "prepared_corpus", ()),
    "ernie": ("bert_tiny", "segment_pair", "prepared_annotated_corpus", ()),
    "span": ("bert_tiny", "full_sentences", "prepared_corpus", ()),
    "electra": ("electra_tiny", "segment_pair", "prepared_corpus", ()),
    "distillation": ("distilbert", "full_sentences", "prepared_corpus", TINY_DISTILBERT),
    "xlnet": ("xlnet_tiny", "xlnet_memory", "prepared_corpus", ()),
    "bart": ("bart_tiny", "full_sentences", "prepared_corpus", ()),
    "mass": ("bart_tiny", "full_sentences", "prepared_corpus", ()),
    "transformer": ("bart_tiny", "full_sentences", "prepared_corpus", ()),
    "causal_lm": ("gpt_tiny", "full_sentences", "prepared_corpus", ()),
}


def test_every_case_names_an_objective_config():
    assert set(CASES) <= set(OBJECTIVES), sorted(set(CASES) - set(OBJECTIVES))


@pytest.fixture(scope="module")
def teacher(prepared_corpus, tmp_path_factory) -> Path:
    """A `pretrain` checkpoint (state dict + run config) of an untrained BERT-tiny with its MLM
    head on the corpus's tokenizer: enough of a teacher to build and step a student."""
    run_dir = tmp_path_factory.mktemp("teacher")
    overrides = ["objective=mlm", "model=bert_tiny", "data=full_sentences"]
    _, module, _ = prepare_run(
        compose_config(cpu_run_overrides(prepared_corpus, run_dir, *overrides))
    )
    path = run_dir / "teacher.ckpt"
    torch.save({"state_dict": module.state_dict(), "config": module.config}, path)
    return path


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_objective_builds_and_steps_one_batch(objective, request, tmp_path):
    model, data, corpus, extra = CASES.get(objective, DEFAULT_CASE)
    if objective == "distillation":
        extra = (*extra, f"objective.teacher={request.getfixturevalue('teacher')}")
    overrides = cpu_run_overrides(
        request.getfixturevalue(corpus),
        tmp_path / "run",
        f"objective={objective}",
        f"model={model}",
        f"data={data}",
        "data.num_workers=0",
        *extra,
        batch_size=2,
    )
    run, module, datamodule = prepare_run(compose_config(overrides))
    assert run.objective.name == objective and run.data.format == data
    batch = next(iter(datamodule.train_dataloader()))
    with warnings.catch_warnings():  # self.log without a Trainer warns and does nothing
        warnings.simplefilter("ignore")
        output = module.training_step(batch, 0)
    loss = output["loss"] if isinstance(output, dict) else output
    assert loss.ndim == 0 and math.isfinite(loss.item()), loss.item()
    loss.backward()
    gradients = [p.grad for p in module.parameters() if p.requires_grad and p.grad is not None]
    assert gradients and any(bool(g.abs().sum() > 0) for g in gradients)
