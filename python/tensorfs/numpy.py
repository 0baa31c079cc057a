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
    mountpoint,
    epoch: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    start: int = 0,
    global_start: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Batch `start`, `start + 1`, … of `epoch-E/` (or of `epoch-E/rank-R-of-W/`), in order.

    `global_start=G` starts instead at the first batch whose global index (R + j·W for rank R
    of W) is at least G: where a job that has read global batches [0, G) resumes, whatever its
    world size was (docs/many-hosts.md#resizing-and-resuming;
    `tensorfs.torch.BatchDataset.state_dict` counts G).

    Each is a dict of arrays that view the directory's `all/NAME.npy` memory maps (read-only;
    copy one to keep it past the next batch's use, or to write to it). `rank` and `world_size`
    default to RANK and WORLD_SIZE from the environment, else the whole epoch.
    """
    if rank is None and world_size is None:
        rank, world_size = env_rank()
    view = View(mountpoint, epoch, rank, world_size)
    if global_start is not None:
        start = view.first_at(global_start)
    for i in range(start, len(view)):
        yield {k: np.asarray(v) for k, v in view.batch(i).items()}
