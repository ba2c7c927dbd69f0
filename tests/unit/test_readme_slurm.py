"""README's SLURM example (issue 58 item 9): its overrides compose, on the GPU trainer, with
the experiment's global batch (bert_wwm: 256), not 8 accumulated x 16 ranks x 32 = 4,096."""

import re
import shlex
from pathlib import Path

from pretrain.batching import batch_plan
from pretrain.config import compose_config, validate

README = Path(__file__).parents[2] / "README.md"


def slurm_example() -> list[str]:
    """The Hydra overrides of the README's `sbatch ... slurm/train.sbatch` command."""
    text = README.read_text()
    command = re.search(r"sbatch [^\n]*slurm/train\.sbatch \\\n\s+([^\n#]+)", text).group(1)
    return shlex.split(command)


def test_the_readme_slurm_example_trains_the_experiment_global_batch_on_gpus():
    overrides = slurm_example()
    assert "trainer=gpu" in overrides
    run = validate(compose_config(overrides))
    experiment = validate(compose_config([o for o in overrides if o.startswith("experiment=")]))
    plan = batch_plan(run.data, run.trainer, ranks=run.trainer.devices * run.trainer.num_nodes)
    assert run.trainer.precision == "bf16-mixed" and run.trainer.tf32
    assert plan.global_batch_size == experiment.data.global_batch_size == 256
    single = batch_plan(experiment.data, experiment.trainer, ranks=1)
    assert single.global_batch_size == 256 and single.accumulate_grad_batches == 8
