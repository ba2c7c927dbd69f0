"""SLURM across nodes, for real: on a two-node cluster on this host (`slurm/local-cluster
start --nodes 2`, as .ci/run starts it), real `sbatch` jobs of slurm/train.sbatch:

- DDP and ZeRO-2 (the CPU DeepSpeed strategy) on 2 nodes x 1 task train the same steps with
  the same losses as 1 node x 2 tasks (same global batch, data and masks); the ZeRO-2
  checkpoint exports (`pretrain-export`) to a directory whose `transformers` model gives the
  trained model's logits;
- a 2-node job preempted by USR1 requeues and resumes with the uninterrupted losses;
- a 2-node job warned of its time limit (`--signal=B:USR1@N`) saves on both ranks, says so in
  one line and requeues; relaunched on 1 node and then on 2 again, it ends at max_steps having
  trained at every step the samples of an uninterrupted run, none lost or repeated;
- a sweep through the submitit launcher puts its points on different nodes, each its own run
  directory and wandb run.

Skips, saying why, when the cluster has fewer than two nodes."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from dist_helpers import RECORDING_MLM, read_records
from test_slurm import (
    job_field,
    last_checkpoint,
    release_requeued,
    saved_steps,
    sbatch,
    show_job,
    slurm_env,
    tiny_run,
    wait_for_job,
    wait_for_steps,
    wait_for_text,
)
from test_train import step_losses

from pretrain.paths import REPO_ROOT

TESTS_DIR = Path(__file__).parent


def _nodes() -> int:
    """Nodes of the cluster whose names resolve (rank 0's node name is the rendezvous address)."""
    if shutil.which("sinfo") is None:
        return 0
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], env=slurm_env(), capture_output=True, text=True
    )
    names = set(result.stdout.split()) if result.returncode == 0 else set()
    try:
        return len([socket.gethostbyname(name) for name in names])
    except OSError:
        return 0


two_nodes = pytest.mark.skipif(
    _nodes() < 2,
    reason="needs a SLURM cluster of two nodes whose names resolve: "
    "slurm/local-cluster start --nodes 2",
)


def submit(
    env: dict,
    shards: Path,
    run_dir: Path,
    nodes: int,
    tasks: int,
    *overrides: str,
    options: tuple[str, ...] = (),
) -> str:
    """Submit slurm/train.sbatch as a job of `nodes` x `tasks` ranks (sbatch `options` first);
    returns its id."""
    return sbatch(
        env,
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks}",
        *options,
        "slurm/train.sbatch",
        *tiny_run(shards, run_dir, *overrides),
        f"trainer.num_nodes={nodes}",
        f"trainer.devices={tasks}",
    )


def job_nodes(env: dict, job_id: str) -> list[str]:
    """The NodeList of each job (or array task) `scontrol` knows under `job_id`."""
    return re.findall(r"\bNodeList=(\S+)", show_job(env, job_id))


EQUAL_BATCH_JOBS = (("ddp", 2, 1), ("ddp", 1, 2), ("deepspeed_zero2", 2, 1))


@pytest.fixture(scope="module")
def equal_batch_runs(prepared_corpus, tmp_path_factory) -> dict:
    """{(strategy, nodes): (job id, run dir)} of 6-step runs of 2 ranks, submitted together:
    DDP on 2 nodes x 1 task and 1 node x 2 tasks, ZeRO-2 on 2 nodes x 1 task."""
    env, root = slurm_env(), tmp_path_factory.mktemp("equal_batch")
    runs = {}
    for strategy, nodes, tasks in EQUAL_BATCH_JOBS:
        run_dir = root / f"{strategy}-{nodes}x{tasks}"
        extra = (f"strategy={strategy}", "trainer.max_steps=6")
        job = submit(env, prepared_corpus, run_dir, nodes, tasks, *extra)
        runs[strategy, nodes] = (job, run_dir)
    return runs


def finished_run(env: dict, job: str, run_dir: Path) -> str:
    """The log of a job that must complete."""
    state = wait_for_job(env, job, 600)
    text = (run_dir / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", text[-3000:]
    assert f"job {job} restart 0: 2 task(s) on " in text
    return text


@pytest.mark.slow
@two_nodes
@pytest.mark.parametrize("strategy", ["ddp", "deepspeed_zero2"])
def test_two_nodes_train_like_two_tasks_on_one(equal_batch_runs, strategy):
    """2 nodes x 1 task, DDP or ZeRO-2, trains the losses of DDP on 1 node x 2 tasks (the
    same arithmetic on the same micro-batches); the ZeRO-2 checkpoint exports with parity."""
    env = slurm_env()
    two = finished_run(env, *equal_batch_runs[strategy, 2])
    assert "n[1-2]" in two or ("n1" in two and "n2" in two), two[-2000:]
    one = finished_run(env, *equal_batch_runs["ddp", 1])
    two_losses = step_losses(equal_batch_runs[strategy, 2][1])
    one_losses = step_losses(equal_batch_runs["ddp", 1][1])
    assert sorted(two_losses) == sorted(one_losses) == list(range(6)), one[-2000:]
    for step, loss in one_losses.items():
        assert two_losses[step] == pytest.approx(loss, abs=1e-5), step
    if strategy == "deepspeed_zero2":
        run_dir = equal_batch_runs[strategy, 2][1]
        assert_export_parity(run_dir / "checkpoints" / "last.ckpt", run_dir / "hf")


def assert_export_parity(checkpoint: Path, out: Path) -> None:
    """`pretrain-export` writes a directory whose `transformers` BertForPreTraining gives the
    logits (MLM and next sentence) of the checkpoint's own model, consolidated from ZeRO."""
    import transformers

    from pretrain.data.vocab import load_vocabulary
    from pretrain.export.checkpoint import read_checkpoint
    from pretrain.objectives.mlm import MaskedLanguageModel

    assert checkpoint.is_dir()  # ZeRO's: a shard per rank, consolidated by the export
    export = Path(sys.executable).with_name("pretrain-export")
    result = subprocess.run(
        [str(export), str(checkpoint), str(out)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    state_dict, config = read_checkpoint(checkpoint)
    module = MaskedLanguageModel(config, load_vocabulary(config["data"]["tokenizer_dir"])).eval()
    missing, unexpected = module.load_state_dict(state_dict, strict=False)
    assert not unexpected and set(missing) <= {"mlm_head.decoder.weight"}, (missing, unexpected)
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    texts = ["The import statement loads a module.", "A list is mutable; a tuple is not."]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = module.encoder(
            encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"]
        )
        mlm, nsp = module.mlm_head(hidden), module.sentence_head(hidden)
        theirs = hf(**encoded)
    real = encoded["attention_mask"].bool()
    torch.testing.assert_close(theirs.prediction_logits[real], mlm[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(theirs.seq_relationship_logits, nsp, rtol=0, atol=1e-5)
    assert mlm.abs().max() > 0.1  # not trivially equal zeros


@pytest.mark.slow
@two_nodes
def test_a_preempted_two_node_job_requeues_and_resumes_exactly(prepared_corpus, tmp_path):
    """`scancel --signal=USR1` of a 2-node job (srun forwards it to both ranks; their
    data-loader workers ignore it): both ranks save one checkpoint at the same step, rank 0
    requeues the job, and the requeued job resumes on both nodes to max_steps with the
    per-step losses of an uninterrupted 2-node run, no traceback in the log."""
    env = slurm_env()
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")])
    steps = 150
    job_args = ("--nodes=2", "--ntasks-per-node=1", "slurm/train.sbatch")
    settings = (
        *RECORDING_MLM,
        "strategy=ddp",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "data.num_workers=2",
        f"trainer.max_steps={steps}",
        "trainer.checkpoint_every_n_steps=10000",
    )
    reference = tmp_path / "reference"
    job = sbatch(env, *job_args, *tiny_run(prepared_corpus, reference, *settings))
    run_dir = tmp_path / "run"
    # rank 0 waits at step 120 until the signal has come (rank 1 in the step's collective)
    held = env | {"PRETRAIN_TEST_HOLD_STEP": "120"}
    preempted = sbatch(held, *job_args, *tiny_run(prepared_corpus, run_dir, *settings))
    log = run_dir / f"slurm-{preempted}.out"
    wait_for_text(log, "Total params", 300)
    wait_for_steps(run_dir)  # trained steps: a save after step 0
    subprocess.run(["scancel", "--signal=USR1", preempted], env=env, check=True)
    wait_for_text(log, "requeueing SLURM job", 300)
    release_requeued(env, preempted)
    assert wait_for_job(env, preempted, 600) == "COMPLETED", log.read_text()[-3000:]
    assert wait_for_job(env, job, 600) == "COMPLETED"
    text = log.read_text()
    (saved,) = set(saved_steps(text))  # both ranks saved the same step
    assert 0 < saved < steps and "restart 1" in text and "Traceback" not in text, text[-3000:]
    assert last_checkpoint(run_dir)["global_step"] == steps
    resumed, expected = step_losses(run_dir), step_losses(reference)
    assert sorted(resumed) == sorted(expected) == list(range(steps))
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, abs=1e-5), step


CHAIN = (  # a run whose ranks record what they train; its global batch stays 8 on any shape
    *RECORDING_MLM,
    "strategy=ddp",
    "optim.schedule=constant",
    "optim.warmup_steps=2",
    "data.batch_size=4",
    "data.global_batch_size=8",
    "trainer.checkpoint_every_n_steps=10000",
)


def keys_by_step(record_dir: Path) -> dict[int, list[str]]:
    """{optimizer step: sorted sample keys trained in it, over all ranks and micro-batches}."""
    steps: dict[int, list[str]] = {}
    for entries in read_records(record_dir).values():
        for entry in entries:
            if "step" in entry:
                steps.setdefault(entry["step"], []).extend(entry["keys"])
    return {step: sorted(keys) for step, keys in sorted(steps.items())}


@pytest.mark.slow
@two_nodes
def test_a_time_limit_on_two_nodes_then_one_node_and_back_loses_no_sample(
    prepared_corpus, tmp_path
):
    """A 2-node job warned of its time limit (`--time` with `--signal=B:USR1@N`, as the
    template asks; srun forwards USR1 to both ranks) saves one checkpoint on both ranks at the
    same step, says in one line what happened, requeues itself and exits with no traceback.
    Relaunched instead on 1 node x 1 task (2 micro-batches a step: the same global batch) for 3
    steps, then on 2 nodes again to max_steps, the chain trains at every step the samples an
    uninterrupted 2-node run trains there: none lost or repeated (the stream's position is
    stored per partition, not per rank)."""
    env = slurm_env()
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")])

    def launch(run_dir: Path, nodes: int, max_steps: int, *options: str, hold: str = "") -> str:
        records = Path(f"{run_dir}-records")
        records.mkdir(parents=True, exist_ok=True)
        return submit(
            env | {"PRETRAIN_TEST_RECORD_DIR": str(records), "PRETRAIN_TEST_HOLD_STEP": hold},
            prepared_corpus,
            run_dir,
            nodes,
            1,
            *CHAIN,
            f"trainer.max_steps={max_steps}",
            options=options,
        )

    run_dir, log = tmp_path / "run", tmp_path / "time-limit.out"
    # SLURM checks time limits every 30 s and sends the warning at the first check within
    # 30 s of the time asked for: 300 - 260 - 30 = 10 to 40 s after the start, when the tasks
    # hold the signal (until their first step, if they are still starting) and the batch shell
    # is srun. A loaded machine has minutes to save before the limit.
    # Rank 0 waits at step 10 until the warning has come (HOLD; rank 1 in the collective),
    # rather than training on meanwhile.
    options = ("--time=5", "--signal=B:USR1@260", f"--output={log}")
    job = launch(run_dir, 2, 100000, *options, hold="10")
    wait_for_text(log, "requeueing SLURM job", 600)
    deadline = time.monotonic() + 240  # a guard: both ranks save, rank 0 requeues, all exit
    while (state := job_field(env, job, "JobState")) != "PENDING":
        assert time.monotonic() < deadline, f"the job was not requeued (state {state})"
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=env, check=True)  # relaunched below, on 1 node
    text = log.read_text()
    steps = saved_steps(text)
    assert len(steps) == 2 and steps[0] == steps[1] > 0, text[-3000:]  # both ranks, one step
    saved = steps[0]
    lines = [line for line in text.splitlines() if line.startswith("preempted at step")]
    assert lines == [
        f"preempted at step {saved} of 100000: saved {run_dir / 'checkpoints' / 'last.ckpt'}; "
        "not finished, the SLURM job was requeued and will resume (exit status 75)"
    ], text[-3000:]
    assert "Traceback" not in text and last_checkpoint(run_dir)["global_step"] == saved

    total = saved + 6
    reference = launch(tmp_path / "reference", 2, total)  # uninterrupted, meanwhile
    for nodes, max_steps in ((1, saved + 3), (2, total)):
        job = launch(run_dir, nodes, max_steps)
        state, text = wait_for_job(env, job, 600), (run_dir / f"slurm-{job}.out").read_text()
        assert state == "COMPLETED", text[-3000:]
        assert f"{nodes} task(s) on " in text and "Resuming from" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    assert last_checkpoint(run_dir)["global_step"] == total
    assert wait_for_job(env, reference, 600) == "COMPLETED"
    got, want = (
        keys_by_step(Path(f"{run_dir}-records")),
        keys_by_step(tmp_path / "reference-records"),
    )
    assert list(got) == list(want) == list(range(total))
    for step, keys in want.items():
        assert got[step] == keys, step
    assert Counter(k for keys in got.values() for k in keys) == Counter(
        k for keys in want.values() for k in keys
    )


@pytest.mark.slow
@two_nodes
def test_sweep_points_run_on_different_nodes(prepared_corpus, tmp_path):
    """`pretrain -m hydra/launcher=slurm` with each point on a node of its own (`--exclusive`):
    the two points run on n1 and n2 (scontrol's NodeList of each array task), each in its own
    run directory with its own offline wandb run, whose id derives from that directory. (On
    a cluster where other jobs hold a node, both points would take turns on the other one.)"""
    from pretrain.runtime.trainer import wandb_run_id

    env = {k: v for k, v in slurm_env().items() if k != "WANDB_API_KEY"}
    env["WANDB_MODE"] = "offline"
    sweep = tmp_path / "sweep"
    point = [o for o in tiny_run(prepared_corpus, sweep / "${run_name}") if o != "logger=csv"]
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("pretrain")),
            "-m",
            "hydra/launcher=slurm",
            "hydra.launcher.timeout_min=20",
            "+hydra.launcher.additional_parameters.exclusive=true",
            f"hydra.sweep.dir={sweep}",
            *point,
            "logger=wandb",
            "trainer.max_steps=2",
            "run_name=lr${optim.optimizer.lr}",
            "optim.optimizer.lr=1e-4,2e-4",
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    tasks = [p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name)]
    jobs = {task.split("_")[0] for task in tasks}
    assert len(jobs) == 1, jobs  # one array job of two tasks
    assert sorted(job_nodes(env, jobs.pop())) == ["n1", "n2"]
    ids = set()
    for lr in ("0.0001", "0.0002"):
        run_dir = sweep / f"lr{lr}"
        assert last_checkpoint(run_dir)["global_step"] == 2
        (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
        assert wandb_dir.name.endswith(f"-{wandb_run_id(run_dir)}"), wandb_dir
        ids.add(wandb_run_id(run_dir))
    assert len(ids) == 2
