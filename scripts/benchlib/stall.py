"""The stall experiment: a consumer at half the cold rate, and how long it waits on reads."""

from __future__ import annotations

import os
import shutil
import time

from .common import MB
from .mounts import Mount


def read_into(fd: int, view: memoryview, size: int) -> int:
    """Reads up to SIZE bytes of FD into VIEW (one reused buffer), closes FD; the bytes read."""
    got = 0
    try:
        while got < size:
            k = os.readv(fd, [view[got:size]])
            if k == 0:
                break
            got += k
    finally:
        os.close(fd)
    return got


class BatchFiles:
    """Batch i is epoch-0/NNNNNN.safetensors: one open and one read per batch."""

    def __init__(self, root, n_batches):
        self.root = root
        self.sizes = [os.stat(root / f"{i:06d}.safetensors").st_size for i in range(n_batches)]
        self.view = memoryview(bytearray(max(self.sizes)))

    def tensor_bytes(self, i):
        return self.sizes[i] - 4096

    def read(self, i):
        """(seconds opening, seconds reading)."""
        a = time.perf_counter()
        fd = os.open(self.root / f"{i:06d}.safetensors", os.O_RDONLY)
        b = time.perf_counter()
        got = read_into(fd, self.view, self.sizes[i])
        if got != self.sizes[i]:
            raise RuntimeError(f"short read of batch {i}: {got} of {self.sizes[i]}")
        return b - a, time.perf_counter() - b

    def close(self):
        pass


class AllFiles:
    """Batch i is rows [i*B, (i+1)*B) of every epoch-0/all/NAME.npy, each file opened once for
    the epoch: one pread per tensor per batch, as a memory-mapped slice reads it."""

    def __init__(self, root, n_batches, batch_size):
        self.fds, self.row_bytes = [], []
        for path in sorted((root / "all").iterdir()):
            fd = os.open(path, os.O_RDONLY)
            self.fds.append(fd)
            rows = None
            with open(path, "rb") as f:
                head = f.read(4096).decode("latin1")
            shape = head[head.index("'shape': (") + 10:head.index(")", head.index("'shape': ("))]
            rows = int(shape.split(",")[0])
            self.row_bytes.append((os.fstat(fd).st_size - 4096) // rows)
        self.rows, self.B = rows, batch_size
        self.view = memoryview(bytearray(max(self.row_bytes) * batch_size))

    def tensor_bytes(self, i):
        n = min(self.B, self.rows - i * self.B)
        return n * sum(self.row_bytes)

    def read(self, i):
        a = time.perf_counter()
        n = min(self.B, self.rows - i * self.B)
        for fd, rb in zip(self.fds, self.row_bytes):
            want, off, got = n * rb, 4096 + i * self.B * rb, 0
            while got < want:
                k = os.preadv(fd, [self.view[got:want]], off + got)
                if k == 0:
                    raise RuntimeError(f"short read of batch {i}")
                got += k
        return 0.0, time.perf_counter() - a

    def close(self):
        for fd in self.fds:
            os.close(fd)


def paced(reader, n_batches, rate):
    """Reads every batch, then 'computes' for the time that batch takes at RATE bytes/s: (seconds
    opening, seconds reading, [(wait, batch)], seconds computing, wall seconds), batch 0's
    open and read left out."""
    opened = readt = slept = 0.0
    waits = []
    t0 = time.perf_counter()
    for i in range(n_batches):
        o, r = reader.read(i)
        if i > 0:
            opened += o
            readt += r
            waits.append((o + r, i))
        compute = reader.tensor_bytes(i) / rate
        time.sleep(compute)
        slept += compute
    return opened, readt, waits, slept, time.perf_counter() - t0


def stall_experiment(binary, source, options, scratch, caches, cold_mb_s, n_batches, name, prefetch, batch_size,
                     rg_first_rows, layout="batch", shuffled=False):
    """A consumer needing half the cold throughput: per batch, read it (`layout` "batch": open
    and read its batch file; "all": pread its rows of every all/NAME.npy, each opened once),
    then 'compute' for the time that batch takes at 0.5 × cold_mb_s. With `shuffled`, the
    mount is shuffle=window and the consumer goes through epoch 0 at that pace first, then
    epoch 1 (a new order, gathered from the cached columns) is measured. Returns the
    measurements."""
    rate = 0.5 * cold_mb_s * MB  # bytes/s the consumer consumes
    name = name if layout == "batch" else f"{name}, all/"
    name = f"{name}, shuffled epoch 1" if shuffled else name
    tag = name.replace(", all/", "-all").replace(", shuffled epoch 1", "-e1")
    cache = scratch / f"cache-stall-{tag}"
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    if shuffled:
        options = [*(o for o in options if not o.startswith(("shuffle=", "epochs="))), "shuffle=window", "epochs=2"]
    m = Mount(binary, source, scratch / f"mnt-stall-{tag}", [*options, f"prefetch={prefetch}", f"cache_dir={cache}"])
    reader = None

    def open_reader(epoch):
        root = m.mnt / f"epoch-{epoch}"
        return BatchFiles(root, n_batches) if layout == "batch" else AllFiles(root, n_batches, batch_size)

    try:
        if shuffled:
            reader = open_reader(0)
            paced(reader, n_batches, rate)
            reader.close()
        reader = open_reader(1 if shuffled else 0)
        opened, readt, waits, slept, wall = paced(reader, n_batches, rate)
        stats = m.stats()
        # The same reads again at the same pace, now that every batch is materialised: what
        # open+read costs the consumer when nothing waits (its own copy). Paced, not back to
        # back: a read after a sleep finds colder caches, and took up to twice as long here.
        opened_again, read_again, _, _, _ = paced(reader, n_batches, rate)
        ready_read = opened_again + read_again
    finally:
        if reader is not None:
            reader.close()
        m.unmount()
        shutil.rmtree(cache, ignore_errors=True)
    by_wait = sorted(waits, reverse=True)
    # Batches holding the first row of a row group (where that row group must be decoded).
    starts = {r // batch_size for r in rg_first_rows if r > 0}
    slow = [(w, i) for w, i in waits if w > 0.002]
    blocked = opened + readt
    return {
        "name": name, "cold_mb_s": cold_mb_s, "consumer_mb_s": rate / MB, "batches": n_batches,
        "wall_s": wall, "compute_s": slept, "blocked_s": blocked, "open_s": opened, "read_s": readt,
        "blocked_share": blocked / wall, "open_share": opened / wall,
        "ready_read_s": ready_read, "excess_share": max(0.0, blocked - ready_read) / wall,
        "prefetch": prefetch,
        "max_wait_ms": 1e3 * (by_wait[0][0] if waits else 0),
        "p99_wait_ms": 1e3 * (by_wait[len(waits) // 100][0] if waits else 0),
        "slow_batches": len(slow), "slow_s": sum(w for w, _ in slow),
        "slow_at_row_group_start": sum(1 for _, i in slow if i in starts),
        "slow_at_row_group_start_s": sum(w for w, i in slow if i in starts),
        "row_group_starts": len(starts),
        "worst": [(i, round(1e3 * w, 2)) for w, i in by_wait[:8]],
        "slow": [(i, round(1e3 * w, 2)) for w, i in slow],
        "daemon": {k: stats.get(k) for k in ("stall_count", "stall_ns", "stall_p99_us", "opens",
                                               "prefetch_scheduled",
                                               "passthrough_opens", "batch_file_hits", "batch_file_misses",
                                               "ahead_files_built", "ahead_opens")},
    }
