"""`prepare` into a URL (out_dir=s3://bucket/corpus, gs://, az://): the corpus is written as
usual into a local staging directory, `.pretrain-staging/<corpus key>` under the working
directory (shared by the array tasks of a SLURM prepare, as the slices are), then uploaded,
shards and tokenizer first and the manifest last, so a reader never sees a manifest whose
shards are not all there. Credentials and endpoints come from the environment
(AWS_ENDPOINT_URL, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, ...)."""

import shutil
from pathlib import Path

from pretrain.storage import corpus_key, is_url, local_path, publish_corpus, redact
from pretrain.storage.urls import check_writable

STAGING_DIR = ".pretrain-staging"


def local_out_dir(out_dir: str) -> Path:
    """Where `prepare` writes the corpus of `out_dir` on this machine (absolute): out_dir
    itself for a local path, the staging directory for a URL."""
    if not is_url(out_dir):
        return Path(local_path(out_dir)).resolve()
    check_writable(out_dir)
    return (Path(STAGING_DIR) / corpus_key(out_dir)).resolve()


def check_remote_out_dir(out_dir: str, overwrite: bool) -> None:
    """For a URL out_dir: an error (PrepareError) when a corpus is there already and
    overwrite is false."""
    from data_pipelines.prepare_config import PrepareError
    from pretrain.storage import remote_manifest_exists

    if is_url(out_dir) and not overwrite and remote_manifest_exists(out_dir):
        raise PrepareError(
            f"out_dir={redact(out_dir)}: holds a prepared corpus; choose another out_dir, "
            "or replace it with overwrite=true"
        )


def publish(out_dir: str, written: Path) -> Path | str:
    """Upload the corpus written at `written` to the URL `out_dir` and remove the staging
    copy; returns the URL (a local out_dir: `written`, untouched)."""
    if not is_url(out_dir):
        return written
    publish_corpus(written, out_dir)
    shutil.rmtree(written, ignore_errors=True)
    return out_dir
