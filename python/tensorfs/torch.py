"""A PyTorch map-style dataset over a tensorfs mount: `ds[i]` is batch i as a dict of tensors.

    from tensorfs.torch import BatchDataset
    ds = BatchDataset("/mnt/train", epoch=0)          # rank and world size from torchrun
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in loader:
            ...

Each item is already a batch of the mount's batch_size rows, so the DataLoader takes
`batch_size=None`. The directory's `all/NAME.npy` memory maps are opened by each worker
itself, on its first item, whatever the start method (fork, spawn, forkserver): nothing of
them is pickled.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.data

from tensorfs._view import View, env_rank


def _distributed() -> tuple[int | None, int | None]:
    """The rank and world size of torch.distributed if it is initialised, else RANK and
    WORLD_SIZE from the environment, else none."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_rank()


class BatchDataset(torch.utils.data.Dataset):
    """Batch i of `epoch-E/` (or `epoch-E/rank-R-of-W/`) of the mount, from batch `start` on.

    `rank`/`world_size` default to torch.distributed's, else RANK/WORLD_SIZE, else the whole
    epoch; a world size that disagrees with the mount's `world_size` is an error naming both.
    `state_dict()`/`load_state_dict()` carry the epoch and the batch to start from, so a job
    resumes mid-epoch (a StatefulDataLoader keeps its sampler's place itself).
    """

    def __init__(self, mountpoint, epoch: int = 0, rank: int | None = None, world_size: int | None = None):
        if rank is None and world_size is None:
            rank, world_size = _distributed()
        self._view = View(mountpoint, epoch, rank, world_size)
        self.start = 0

    @property
    def epoch(self) -> int:
        return self._view.epoch

    @property
    def fingerprint(self) -> str:
        return self._view.meta["fingerprint"]

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch `epoch` from its first batch."""
        self._view.set_epoch(epoch)
        self.start = 0

    def __len__(self) -> int:
        return max(0, len(self._view) - self.start)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        # One copy out of the read-only memory map into memory the tensor owns.
        return {k: torch.from_numpy(np.array(v)) for k, v in self._view.batch(self.start + i).items()}

    def state_dict(self, batches_done: int = 0) -> dict:
        """Where to resume: this epoch, `batches_done` batches past where this dataset starts."""
        return {
            "epoch": self.epoch,
            "start": self.start + int(batches_done),
            "rank": self._view.rank,
            "world_size": self._view.world_size,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at `state["start"]` of `state["epoch"]`; a state saved from another dataset
        (another fingerprint) is refused."""
        saved = state.get("fingerprint")
        if saved is not None and saved != self.fingerprint:
            raise ValueError(
                f"the state was saved from dataset {saved}, but {self._view.mountpoint} serves "
                f"{self.fingerprint}: mount the same snapshot (snapshot=) to resume"
            )
        self.set_epoch(int(state.get("epoch", 0)))
        start = int(state.get("start", 0))
        if not 0 <= start <= len(self._view):
            raise ValueError(f"start {start} is past the {len(self._view)} batches of epoch {self.epoch}")
        self.start = start
