"""A training process that may use one core starts no data-loader workers (issue 57
follow-up): a worker would share that core and start a second interpreter (the forkserver's
torch import) before the first batch, for no parallelism. The batches are the same with any
number of workers (tests/integration/test_worker_shares.py)."""

import os

from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.runtime.run import prepare_run
from pretrain.runtime.threads import loader_workers


def data_workers(prepared_corpus, tmp_path, cores: set[int]) -> int:
    """The workers of the data module `prepare_run` builds for `data.num_workers=1` while
    this thread may run on `cores` only."""
    cfg = compose_config(cpu_run_overrides(prepared_corpus, tmp_path / "run", "data.num_workers=1"))
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        return prepare_run(cfg)[2].num_workers
    finally:
        os.sched_setaffinity(0, mask)


def test_one_core_runs_the_stream_in_the_training_process(prepared_corpus, tmp_path, capsys):
    one_core = {min(os.sched_getaffinity(0))}
    assert data_workers(prepared_corpus, tmp_path, one_core) == 0
    assert "data.num_workers=1: none started" in capsys.readouterr().out
    if len(os.sched_getaffinity(0)) > 1:  # more cores: the setting stands
        assert data_workers(prepared_corpus, tmp_path, os.sched_getaffinity(0)) == 1


def test_a_remote_corpus_or_more_cores_keep_their_workers():
    assert loader_workers(2, remote_corpus=True, cores=1) == 2  # they overlap network waits
    assert loader_workers(2, remote_corpus=False, cores=2) == 2
    assert loader_workers(0, remote_corpus=False, cores=1) == 0
