"""Writing an export directory all at once: fill a temporary sibling, then rename it into place."""

import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from pretrain.export.checkpoint import ExportError

# Files of a model directory that a tokenizer directory must not contribute.
MODEL_FILES = frozenset(
    {"config.json", "model.safetensors", "pytorch_model.bin", "generation_config.json"}
)


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def write_directory(
    out_dir: str | Path,
    fill: Callable[[Path], None],
    overwrite: bool = False,
    keep: Iterable[str | Path] = (),
) -> Path:
    """Create `out_dir` with the files `fill(tmp_dir)` writes; returns its resolved path.

    A non-empty `out_dir` is refused unless `overwrite`; paths in `keep` (the checkpoint, the
    tokenizer) may not lie inside `out_dir`, so overwriting never deletes a run's inputs.
    The files appear at once by a rename; on failure nothing of the new export is left behind.
    """
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a directory; choose another output directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: directory is not empty; pass --overwrite to replace it")
    for path in keep:
        if _inside(Path(path).resolve(), out):
            raise ExportError(
                f"{out}: contains {path}, an input of the export; choose another output directory"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; an export is meant to be shared
        fill(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
            try:
                tmp.rename(out)
            except BaseException:
                (old / out.name).rename(out)  # put the previous export back
                old.rmdir()
                raise
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def copy_tokenizer_files(tokenizer_dir: str | Path, out_dir: Path) -> list[str]:
    """Copy the files at the top of `tokenizer_dir` into `out_dir`; returns their names.

    Model files (config.json, weights) are skipped so they cannot shadow the export's own.
    """
    source = Path(tokenizer_dir)
    if not source.is_dir():
        raise ExportError(
            f"{source}: tokenizer directory (config.data.tokenizer_dir of the checkpoint) not found; "
            "the export copies the tokenizer from there, restore it or export on the machine that trained"
        )
    copied = []
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in MODEL_FILES:
            shutil.copy2(path, out_dir / path.name)
            copied.append(path.name)
    if not copied:
        raise ExportError(f"{source}: tokenizer directory holds no files")
    return copied
