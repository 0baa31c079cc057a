"""The readers measured: each returns (rows, tensor bytes delivered, seconds)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .common import TENSORS
from .dataset import column_arrays


def read_npy_dirs(root: Path, n_batches: int, names=TENSORS):
    """np.load of every NNNNNN/NAME.npy, the way the docs show."""
    import numpy as np

    rows = nbytes = 0
    t = time.perf_counter()
    for i in range(n_batches):
        d = root / f"{i:06d}"
        for name in names:
            a = np.load(d / f"{name}.npy")
            nbytes += a.nbytes
        rows += len(a)
    return rows, nbytes, time.perf_counter() - t


def read_safetensors_files(root: Path, n_batches: int, first: list | None = None):
    """Every batch file read with safetensors; FIRST (where given) gets the seconds to the first."""
    from safetensors.numpy import load_file

    rows = nbytes = 0
    t = time.perf_counter()
    for i in range(n_batches):
        batch = load_file(str(root / f"{i:06d}.safetensors"))
        nbytes += sum(a.nbytes for a in batch.values())
        rows += len(batch["id"])
        if i == 0 and first is not None:
            first.append(time.perf_counter() - t)
    return rows, nbytes, time.perf_counter() - t


def open_cost_us(root: Path, n_batches: int) -> float:
    """Microseconds per open+close of a batch file (the second of two passes)."""
    for _ in range(2):
        t = time.perf_counter()
        for i in range(n_batches):
            os.close(os.open(root / f"{i:06d}.safetensors", os.O_RDONLY))
        dt = time.perf_counter() - t
    return 1e6 * dt / n_batches


def verify(mnt_epoch: Path, npy: Path, n_batches: int, what: str) -> None:
    """Spot-checks that the mount serves the batches the local .npy files hold (outside timing)."""
    import numpy as np
    from safetensors.numpy import load_file

    if not (npy / f"{n_batches - 1:06d}").exists():
        return
    for i in sorted({0, n_batches // 2, n_batches - 1}):
        got = load_file(str(mnt_epoch / f"{i:06d}.safetensors"))
        for name in TENSORS:
            if not np.array_equal(got[name], np.load(npy / f"{i:06d}" / f"{name}.npy")):
                raise RuntimeError(f"{what}: batch {i} tensor {name} differs from the local .npy file")


def check_permutation(root: Path, n_batches: int, rows: int, what: str) -> None:
    """Checks (outside timing) that an epoch's batches hold every row id once."""
    import numpy as np
    from safetensors import safe_open

    ids = []
    for i in range(n_batches):
        with safe_open(str(root / f"{i:06d}.safetensors"), framework="np") as f:
            ids.append(f.get_tensor("id"))
    if not np.array_equal(np.sort(np.concatenate(ids)), np.arange(rows)):
        raise RuntimeError(f"tensorfs {what}: the batches are not a permutation of the rows")


def read_pyarrow(paths: list, batch_size: int, open_file=None):
    import pyarrow.parquet as pq

    rows = nbytes = 0
    t = time.perf_counter()
    for p in paths:
        src = open_file(p) if open_file else p
        for b in pq.ParquetFile(src).iter_batches(batch_size=batch_size):
            arrays = column_arrays(b)
            nbytes += sum(a.nbytes for a in arrays.values())
            rows += b.num_rows
    return rows, nbytes, time.perf_counter() - t


def read_file_sequentially(path: Path, rows: int, chunk: int = 1 << 20):
    """One open, then `chunk`-byte reads into one reused buffer to the end (cat, or a loader
    streaming an epoch file)."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    nbytes = 0
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            n = os.readv(fd, [view])
            if n == 0:
                break
            nbytes += n
    finally:
        os.close(fd)
    return rows, nbytes, time.perf_counter() - t


def read_npy_slices(all_dir: Path, rows: int, batch_size: int, names=TENSORS, first: list | None = None):
    """Each tensor's all/NAME.npy memory-mapped once, then batch after batch sliced out of every
    map and copied into an array of its own (a map-style Dataset over all/); FIRST (where given)
    gets the seconds to the first batch."""
    import numpy as np

    # The opens are timed too: an open of a file still being built waits for it.
    t = time.perf_counter()
    arrays = [np.load(all_dir / f"{name}.npy", mmap_mode="r") for name in names]
    nbytes = 0
    for start in range(0, rows, batch_size):
        for a in arrays:
            nbytes += np.array(a[start:start + batch_size]).nbytes
        if start == 0 and first is not None:
            first.append(time.perf_counter() - t)
    return rows, nbytes, time.perf_counter() - t
