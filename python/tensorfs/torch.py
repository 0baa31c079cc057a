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

import multiprocessing
import multiprocessing.context

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


# The options that decide which rows batch i of an epoch holds, beside the fingerprint: a state
# saved under other values counts other batches. dataset.json names them (`order_options`, from
# the mount options' own declarations); these are the ones a tensorfs that did not name them
# had. Those that dataset.json's `options` lacks are left out.
ORDER_OPTIONS = (
    "batch_size", "drop_last", "columns", "seed", "shuffle", "shuffle_window", "shuffle_block",
    "partitions", "cast", "stack", "pad", "nulls", "transform", "transform_version",
)


class BatchDataset(torch.utils.data.Dataset):
    """Batch i of `epoch-E/` (or `epoch-E/rank-R-of-W/`) of the mount, from batch `start` on.

    `rank`/`world_size` default to torch.distributed's, else RANK/WORLD_SIZE, else the whole
    epoch; a world size that disagrees with the mount's `world_size` is an error naming both.

    `state_dict()`/`load_state_dict()` resume mid-epoch, at any world size
    (docs/many-hosts.md#resizing-and-resuming): the state records how far the job got in the
    epoch's global order, and a rank of the new world starts at its first batch not yet read, so
    no global batch is read twice and none the new ranks share is skipped. After a resume at
    another world size the ranks' remaining counts may differ by one; `len(ds)` is this rank's.
    Train on uneven inputs with `torch.distributed.algorithms.Join`, or run every rank for the
    smallest `len(ds)` across ranks (an all_reduce with MIN) and leave the rest of that epoch's
    batches unread.
    (A StatefulDataLoader keeps its sampler's place itself.)
    """

    def __init__(self, mountpoint, epoch: int = 0, rank: int | None = None, world_size: int | None = None):
        if rank is None and world_size is None:
            rank, world_size = _distributed()
        self._view = View(mountpoint, epoch, rank, world_size)
        # Where this dataset serves from: its epoch, the first batch of the directory it serves
        # (`start`) and the global batches [0, done) the job had read when it started. In
        # memory shared with the DataLoader's workers, which hold their own copies of the
        # dataset: `set_epoch` and `load_state_dict` in the training loop then reach workers
        # that live across epochs (persistent_workers=True) under every start method.
        self._place = multiprocessing.RawArray("q", [self._view.epoch, 0, 0])

    @property
    def start(self) -> int:
        """The first batch of the directory this dataset serves (set by `load_state_dict`,
        reset by `set_epoch`; read-only, since the place a resume saves goes with it)."""
        return int(self._place[1])

    def _set_place(self, start: int, done: int) -> None:
        self._place[1], self._place[2] = int(start), int(done)

    @property
    def _done(self) -> int:
        return int(self._place[2])

    def __getstate__(self):
        state = dict(self.__dict__)
        # Shared memory goes to a process being started (a DataLoader's worker); any other
        # pickle takes the place as it is now.
        if multiprocessing.context.get_spawning_popen() is None:
            state["_place"] = list(self._place)
        return state

    def __setstate__(self, state):
        place = state["_place"]
        if isinstance(place, list):
            state["_place"] = multiprocessing.RawArray("q", place)
        self.__dict__.update(state)

    def _follow(self) -> None:
        """This copy's view at the epoch the training loop last set."""
        epoch = int(self._place[0])
        if epoch != self._view.epoch:
            self._view.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        self._follow()
        return self._view.epoch

    @property
    def fingerprint(self) -> str:
        return self._view.meta["fingerprint"]

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch `epoch` from its first batch, in this process and in every DataLoader
        worker, persistent ones included."""
        self._view.set_epoch(epoch)
        self._set_place(0, 0)
        self._place[0] = self._view.epoch

    def __len__(self) -> int:
        return max(0, len(self._view) - self.start)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i < 0:
            i += len(self)
        self._follow()
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        # One copy out of the read-only memory map into memory the tensor owns.
        return {k: torch.from_numpy(np.array(v)) for k, v in self._view.batch(self.start + i).items()}

    def _order_options(self) -> dict:
        options = self._view.meta.get("options") or {}
        names = self._view.meta.get("order_options") or ORDER_OPTIONS
        return {k: options[k] for k in names if k in options}

    def state_dict(self, batches_done: int = 0) -> dict:
        """Where to resume, once every rank has read `batches_done` batches of this dataset
        (`ds[0]` … `ds[batches_done - 1]`): synchronous data parallelism, every rank in step.
        Save it mid-epoch; at an epoch's end go on with `set_epoch`.

        `global_done` is how far the job got: global batches [0, global_done) are read. `start`
        (this rank's next batch in its directory) and `rank` are kept for reading, and for an
        older tensorfs."""
        k = int(batches_done)
        if not 0 <= k <= len(self):
            raise ValueError(f"batches_done {k} is not within the {len(self)} batches this dataset serves")
        world = self._view.world_size
        # The job had read [0, _done) when the ranks started. Each rank's first batch then was a
        # different one of _done, _done+1, …, _done+W-1 (load_state_dict starts each at its
        # first global index >= _done), and it steps by W: after k batches each, the ranks have
        # read exactly [0, _done + k·W), and this rank's next global index, R + (start+k)·W, is
        # one of the W after that. Only a rank with the one extra batch of an uneven resume
        # (see the class) goes past the shared batches, when all of them are read: hence min.
        done = min(self._done + k * (world or 1), self._view.shared())
        return {
            "format": 2,
            "epoch": self.epoch,
            "global_done": done,
            "world_size": world,
            "batch_size": self._view.batch_size,
            "options": self._order_options(),
            "fingerprint": self.fingerprint,
            "start": self.start + k,
            "rank": self._view.rank,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` (from `state_dict()` on any rank of any world size, or of the
        global view) says the job got: this rank starts at its first batch whose global index
        is at least `global_done`, the global view at `global_done`.

        A state of an older tensorfs ({epoch, start, rank, world_size, fingerprint}) names one
        rank's next batch: the job is taken to have read start × world_size global batches (all
        ranks in step, as `state_dict` assumes), which continues it exactly at the same world
        size. Refused, naming why: a state from another dataset (fingerprint), one saved under
        other order options (batch_size, seed, …), and one past the batches this world shares."""
        saved = state.get("fingerprint")
        if saved is not None and saved != self.fingerprint:
            raise ValueError(
                f"the state was saved from dataset {saved}, but {self._view.mountpoint} serves "
                f"{self.fingerprint}: mount the same snapshot (snapshot=) to resume"
            )
        if "format" in state:
            if state["format"] != 2:
                raise ValueError(f"the state has format {state['format']!r}; this tensorfs reads format 2")
            mine = self._order_options()
            for key, value in (state.get("options") or {}).items():
                if key in mine and mine[key] != value:
                    raise ValueError(
                        f"the state was saved with {key}={value!r}, but {self._view.mountpoint} serves "
                        f"{key}={mine[key]!r}: batch i holds other rows; mount with {key}={value!r} to resume"
                    )
            done = int(state["global_done"])
        else:
            # An older tensorfs had no shuffle=block (its default was window): no order of an
            # older job is a block mount's, so its state cannot be continued there exactly.
            if self._order_options().get("shuffle") == "block":
                raise ValueError(
                    f"the state was saved by an older tensorfs, which had no shuffle=block, but "
                    f"{self._view.mountpoint} serves shuffle=block: mount with the options that job ran "
                    f"with (its default was shuffle=window) to resume it exactly"
                )
            done = int(state.get("start", 0)) * int(state.get("world_size") or 1)
        self.set_epoch(int(state.get("epoch", 0)))
        shared = self._view.shared()
        if not 0 <= done <= shared:
            world = self._view.world_size
            who = f"the {world} ranks share" if world is not None else "the global view holds"
            raise ValueError(
                f"the state has read {done} global batches of epoch {self.epoch}, past the {shared} "
                f"that {who}: resume with a world size that shares them, or go on with the next epoch"
            )
        self._set_place(self._view.first_at(done), done)
