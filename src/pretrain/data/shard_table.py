"""The shard table a data-loader worker holds, as compact numpy arrays (issue 54 item 1): a
worker of a 100,000-shard corpus keeps a few MB of it, not a Python object per shard.

`ShardPaths` is the stream's shard paths (a sequence of str, built on access) and
`ShardSharing` an epoch's shard order with each shard's readers (`reading.shard_sharing`),
both pickled to every worker and rebuilt there at their size. A `ShardPaths` also carries
the shard table registered for each of its directories (`manifest_table`), registered again
where it is unpickled, so a worker maps the node's table instead of parsing the manifest.
"""

import os
from collections.abc import Iterator, Sequence

import numpy as np

from pretrain.data.manifest_table import register_table, registered_table


def _narrowest(names: np.ndarray) -> np.ndarray:
    """The bytes array `names` as the narrowest fixed-width bytes dtype that holds its longest
    name (a taken subset may be narrower than the table it came from; at least 1 wide)."""
    return names.astype(f"S{int(np.char.str_len(names).max(initial=1))}")


class ShardPaths(Sequence[str]):
    """Shard paths as the directories they lie in and, per shard, its directory's number and
    its file name (one fixed-width bytes array): `paths[i]` is the i-th path as given."""

    def __init__(self, paths: Sequence[str]) -> None:
        if isinstance(paths, ShardPaths):  # already compact (its arrays are never changed)
            self.__dict__.update(paths.__dict__)
            return
        paths = [str(path) for path in paths]
        directories: dict[str, int] = {}
        numbers = [directories.setdefault(os.path.dirname(p), len(directories)) for p in paths]
        self.directories = tuple(directories)
        self.numbers = np.asarray(numbers, np.int32)
        encoded = [os.path.basename(p).encode() for p in paths]
        self.names = np.asarray(encoded, dtype=f"S{max(map(len, encoded), default=1)}")
        self.tables = tuple(registered_table(d) if d else None for d in self.directories)

    @classmethod
    def in_directory(cls, directory: str, names: np.ndarray) -> "ShardPaths":
        """The paths `os.path.join(directory, name)` of the file names `names` (a bytes
        array, such as a manifest table's), in order, without a str or Path per shard: the
        same `ShardPaths` as one built from those paths (`directory` absolute, each name a
        plain file name)."""
        paths = cls.__new__(cls)
        paths.directories = (directory,)
        paths.numbers = np.zeros(len(names), np.int32)
        paths.names = _narrowest(np.asarray(names))  # a copy, not a map
        paths.tables = (registered_table(directory) if directory else None,)
        return paths

    def take(self, numbers: Sequence[int]) -> "ShardPaths":
        """The paths at places `numbers` (a range or list of ints), in that order."""
        numbers = np.asarray(numbers, np.int64)
        if not len(numbers):
            return ShardPaths(())
        taken = type(self).__new__(type(self))
        taken.__dict__.update(self.__dict__)
        taken.names = _narrowest(self.names[numbers])
        taken.numbers = self.numbers[numbers]
        return taken

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for directory, table in zip(
            self.directories, self.__dict__.get("tables", ()), strict=False
        ):
            if table:
                register_table(directory, table)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index):  # int -> str (a slice -> list of str)
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        name = self.names[index].decode()
        return os.path.join(self.directories[self.numbers[index]], name)

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash((self.directories, self.numbers.tobytes(), self.names.tobytes()))

    def nbytes(self) -> int:
        """Bytes its arrays hold."""
        return self.numbers.nbytes + self.names.nbytes + sum(map(len, self.directories))


class ShardSharing:
    """An epoch's shards in the order they are read, each with {reader: units of it}, as
    flat arrays: `order[o]` the shard index at place o, its sharers `readers[start:stop]`
    with `units[start:stop]` (start, stop = `bounds[o]`, `bounds[o + 1]`)."""

    def __init__(self, shares: list[tuple[int, dict[int, int]]]) -> None:
        self.order = np.asarray([index for index, _ in shares], np.int64)
        sizes = [len(share) for _, share in shares]
        self.bounds = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.readers = np.fromiter((r for _, s in shares for r in s), np.int32, int(sum(sizes)))
        self.units = np.fromiter(
            (u for _, s in shares for u in s.values()), np.int32, len(self.readers)
        )

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, place: int) -> tuple[int, dict[int, int]]:
        """(shard index, {reader: units}) at `place` in the epoch's order."""
        return int(self.order[place]), self.share(place)

    def share(self, place: int) -> dict[int, int]:
        """{reader: units} of the shard at `place` in the epoch's order."""
        start, stop = self.bounds[place], self.bounds[place + 1]
        return dict(
            zip(self.readers[start:stop].tolist(), self.units[start:stop].tolist(), strict=True)
        )

    def places(self, reader: int) -> np.ndarray:
        """The places in the epoch's order of the shards `reader` reads, rising."""
        where = np.flatnonzero(self.readers == reader)
        return np.unique(np.searchsorted(self.bounds, where, side="right") - 1)

    def nbytes(self) -> int:
        """Bytes its arrays hold."""
        return self.order.nbytes + self.bounds.nbytes + self.readers.nbytes + self.units.nbytes
