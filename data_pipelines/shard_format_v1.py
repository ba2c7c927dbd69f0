"""Shards of format 1, kept only to convert them (`pretrain-data upgrade`) and to prove that
format 2 holds the same documents (tests).

Format 1: a WebDataset tar per shard with one sample per document, members
`<key>.ids.npy` (manifest dtype), `<key>.sents.npy` (int32 sentence ends), `<key>.words.npy`
(uint8 word starts) and, when annotated, `<key>.phrases.npy` (uint8 span flags); a sample's
members adjacent, in that order.
"""

import io
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from data_pipelines.shard_writer import TokenizedDocument
from pretrain.data.shard_format import ShardError

MEMBERS = ("ids.npy", "sents.npy", "words.npy")


def _document(path: Path, key: str, members: dict[str, bytes]) -> TokenizedDocument:
    if not set(MEMBERS) <= set(members) or not set(members) <= {*MEMBERS, "phrases.npy"}:
        raise ShardError(f"{path}: format-1 sample {key!r} has members {sorted(members)}")
    arrays = {ext: np.load(io.BytesIO(data), allow_pickle=False) for ext, data in members.items()}
    return TokenizedDocument(
        key,
        "",
        arrays["ids.npy"],
        arrays["sents.npy"].astype(np.int32),
        arrays["words.npy"].astype(np.uint8),
        arrays.get("phrases.npy"),
    )


def read_v1_documents(path: str | Path) -> Iterator[TokenizedDocument]:
    """The documents of a format-1 shard in tar order, streamed (ids in the stored dtype).
    Raises ShardError naming the file when it is damaged."""
    path = Path(path)
    key, members = None, {}
    try:
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, _, base = member.name.rpartition("/")
                stem, _, ext = base.partition(".")
                member_key = f"{folder}/{stem}" if folder else stem
                if member_key != key:
                    if key is not None:
                        yield _document(path, key, members)
                    key, members = member_key, {}
                members[ext] = tar.extractfile(member).read()
        if key is not None:
            yield _document(path, key, members)
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:
        if isinstance(error, ShardError):
            raise
        raise ShardError(f"{path}: cannot be read as a format-1 shard ({error})") from error


def write_v1_shard(path: str | Path, documents: Iterable[TokenizedDocument]) -> None:
    """Write `documents` as a format-1 shard at `path` (for tests of the upgrade)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for document in documents:
            members = [("ids.npy", document.ids), ("sents.npy", document.sents)]
            members.append(("words.npy", document.words))
            if document.phrases is not None:
                members.append(("phrases.npy", document.phrases))
            for ext, array in members:
                buffer = io.BytesIO()
                np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
                info = tarfile.TarInfo(f"{document.key}.{ext}")
                info.size, info.mode, info.mtime = buffer.tell(), 0o444, 0
                buffer.seek(0)
                tar.addfile(info, buffer)
