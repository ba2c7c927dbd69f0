"""Two CPU ranks read one corpus from an S3-compatible server (moto's, on 127.0.0.1) through
one shared cache directory, as the ranks of a node do: every shard is downloaded once for the
node, a resumed launch starts from the warm cache without downloading again, and a run
reshaped from 1 rank to 2 on the s3:// corpus trains, micro-batch by micro-batch, what an
uninterrupted 2-rank run on the local copy trains (the same samples, losses to 1e-5)."""

import pytest
from dist_helpers import read_records
from storage_servers import S3_ENV, make_bucket, moto_server
from test_resume_matrix import MLM, RANKS, launch, steps

from pretrain.data.shard_format import load_manifest
from pretrain.storage import publish_corpus
from pretrain.storage.cache import downloads


@pytest.mark.slow
def test_two_ranks_from_s3_share_one_cache_and_match_the_local_run(
    prepared_corpus, tmp_path, monkeypatch
):
    with moto_server() as endpoint:
        env = {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        make_bucket(endpoint, "corpora")
        url = "s3://corpora/small"
        publish_corpus(prepared_corpus, url)
        # the weights held (lr 1e-12): 1 rank and 2 ranks group a step's rows differently
        config = (*MLM, "strategy=ddp", "data.global_batch_size=32", "optim.optimizer.lr=1e-12")
        whole = launch(prepared_corpus, tmp_path / "whole", *config, "trainer.max_steps=6")
        assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-5000:]
        cache = tmp_path / "node-cache"
        remote = (*config, f"data.cache_dir={cache}")
        parts = tmp_path / "parts"
        first = launch(url, parts, *remote, "trainer.max_steps=3", ranks=1, env=env)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
        before = downloads(cache)
        second = launch(url, parts, *remote, "trainer.max_steps=6", env=env)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
        assert "Resuming from" in second.stdout
    names = [name.split("/")[1] for name, _ in downloads(cache)]
    shards = [shard["name"] for shard in load_manifest(prepared_corpus).shards]
    assert sorted(names) == shards  # once per node: not per rank, not again on resume
    assert downloads(cache) == before  # the resumed launch found every shard in the cache
    want = steps(read_records(tmp_path / "whole-records"))
    got = steps(read_records(tmp_path / "parts-records"))
    early = sorted(key for s, keys, _ in got[0] if s < 3 for key in keys)
    assert early == sorted(key for r in want for s, keys, _ in want[r] if s < 3 for key in keys)
    for rank in range(RANKS):
        later = [entry for entry in got[rank] if entry[0] >= 3]
        reference = [entry for entry in want[rank] if entry[0] >= 3]
        assert [s for s, _, _ in later] == [s for s, _, _ in reference] == [3, 4, 5]
        for (step, keys, loss), (_, want_keys, want_loss) in zip(later, reference, strict=True):
            assert keys == want_keys, (rank, step)
            assert loss == pytest.approx(want_loss, abs=1e-5), (rank, step)
