"""One directory of a mount's batches, read through its `all/NAME.npy` memory maps.

Shared by `tensorfs.numpy` and `tensorfs.torch`. Nothing here imports more than NumPy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def dataset_json(mountpoint) -> dict:
    """The mount's dataset.json: its tensors, batch counts, options and fingerprint."""
    path = Path(mountpoint) / "dataset.json"
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise FileNotFoundError(f"{mountpoint} is not a tensorfs mount (no dataset.json)") from None


def env_rank() -> tuple[int | None, int | None]:
    """RANK and WORLD_SIZE from the environment (torchrun sets them), or None."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None, None
    return int(rank), int(world)


class View:
    """Batches of `epoch-E/` (or of `epoch-E/rank-R-of-W/`) of the mount at MOUNTPOINT.

    Batch i is rows [i·B, (i+1)·B) of each `all/NAME.npy` (B the mount's batch_size), as
    docs/reading.md defines those files; the arrays are memory maps, opened on first use in each
    process (and again after a fork), never pickled.
    """

    def __init__(self, mountpoint, epoch: int = 0, rank: int | None = None, world_size: int | None = None):
        self.mountpoint = Path(mountpoint)
        self.meta = dataset_json(mountpoint)
        if (rank is None) != (world_size is None):
            raise ValueError(f"give rank and world_size together (rank={rank}, world_size={world_size})")
        mounted = self.meta.get("world_size")
        if world_size is not None:
            if mounted is not None and mounted != world_size:
                raise ValueError(
                    f"world_size {world_size} disagrees with the mount's world_size={mounted} "
                    f"({self.mountpoint}): mount with world_size={world_size}, or run {mounted} ranks"
                )
            if not 0 <= rank < world_size:
                raise ValueError(f"rank {rank} is not within world_size {world_size}")
        self.rank, self.world_size = rank, world_size
        self.batch_size = int(self.meta["batch_size"])
        self.names = [t["name"] for t in self.meta["tensors"]]
        self.epoch = 0
        self._arrays = None
        self._pid = None
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch {epoch} is negative")
        self.epoch = int(epoch)
        self._arrays, self._pid = None, None

    @property
    def directory(self) -> Path:
        d = self.mountpoint / f"epoch-{self.epoch}"
        if self.world_size is not None:
            d = d / f"rank-{self.rank}-of-{self.world_size}"
        return d

    def __len__(self) -> int:
        """Batches in the directory, as dataset.json counts them."""
        if self.world_size is None:
            return int(self.meta["batches_per_epoch"])
        partitions = int(self.meta.get("partitions") or 1)
        single = int(self.meta.get("single_partition_batches", self.meta["batches_per_epoch"]))
        shared = single if partitions > 1 else int(self.meta["batches_per_epoch"])
        return shared // self.world_size

    def shared(self) -> int:
        """The epoch's batches this view's world reads: all of them for the global view; for rank
        views the first W × (batches per rank), the tail being left out of rank views
        (docs/many-hosts.md#what-the-plan-does)."""
        return len(self) * (self.world_size or 1)

    def first_at(self, global_index: int) -> int:
        """The first batch of this directory whose global index (R + j·W, or j for the global
        view) is at least `global_index`."""
        if self.world_size is None:
            return max(0, global_index)
        return max(0, -(-(global_index - self.rank) // self.world_size))

    def arrays(self) -> dict[str, np.ndarray]:
        """Each tensor's `all/NAME.npy` of the directory, memory-mapped in this process."""
        if self._arrays is None or self._pid != os.getpid():
            self._arrays = {n: np.load(self.directory / "all" / f"{n}.npy", mmap_mode="r") for n in self.names}
            self._pid = os.getpid()
        return self._arrays

    def batch(self, i: int) -> dict[str, np.ndarray]:
        """Batch i: a view of each tensor's rows in the memory maps (no copy)."""
        n = len(self)
        if not 0 <= i < n:
            raise IndexError(f"batch {i} of {n} in {self.directory}")
        lo, hi = i * self.batch_size, (i + 1) * self.batch_size
        return {name: a[lo:hi] for name, a in self.arrays().items()}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_arrays"], state["_pid"] = None, None
        return state
