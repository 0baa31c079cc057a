"""Batches of a tensorfs mount as dicts of NumPy arrays (for NumPy, JAX, or any framework that
takes arrays).

    import tensorfs.numpy
    for batch in tensorfs.numpy.batches("/mnt/train", epoch=3):
        step(batch["x"], batch["y"])
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from tensorfs._view import View, env_rank


def batches(
    mountpoint, epoch: int = 0, rank: int | None = None, world_size: int | None = None, start: int = 0
) -> Iterator[dict[str, np.ndarray]]:
    """Batch `start`, `start + 1`, … of `epoch-E/` (or of `epoch-E/rank-R-of-W/`), in order.

    Each is a dict of arrays that view the directory's `all/NAME.npy` memory maps (read-only;
    copy one to keep it past the next batch's use, or to write to it). `rank` and `world_size`
    default to RANK and WORLD_SIZE from the environment, else the whole epoch.
    """
    if rank is None and world_size is None:
        rank, world_size = env_rank()
    view = View(mountpoint, epoch, rank, world_size)
    for i in range(start, len(view)):
        yield {k: np.asarray(v) for k, v in view.batch(i).items()}
