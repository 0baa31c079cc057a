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


def stall_experiment(binary, source, options, scratch, caches, cold_mb_s, n_batches, name, prefetch, batch_size,
                     rg_first_rows):
    """A consumer needing half the cold throughput: per batch, open+read it, then 'compute' for
    the time that batch takes at 0.5 × cold_mb_s. Returns the measurements."""
    rate = 0.5 * cold_mb_s * MB  # bytes/s the consumer consumes
    cache = scratch / f"cache-stall-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    m = Mount(binary, source, scratch / f"mnt-stall-{name}", [*options, f"prefetch={prefetch}", f"cache_dir={cache}"])
    try:
        root = m.mnt / "epoch-0"
        sizes = [os.stat(root / f"{i:06d}.safetensors").st_size for i in range(n_batches)]
        buf = bytearray(max(sizes))
        view = memoryview(buf)
        opened = readt = 0.0
        waits = []
        slept = 0.0
        t0 = time.perf_counter()
        for i in range(n_batches):
            a = time.perf_counter()
            fd = os.open(root / f"{i:06d}.safetensors", os.O_RDONLY)
            b = time.perf_counter()
            got = read_into(fd, view, sizes[i])
            c = time.perf_counter()
            if got != sizes[i]:
                raise RuntimeError(f"short read of batch {i}: {got} of {sizes[i]}")
            if i > 0:
                opened += b - a
                readt += c - b
                waits.append((c - a, i))
            compute = (sizes[i] - 4096) / rate  # tensor bytes at half the cold rate
            time.sleep(compute)
            slept += compute
        wall = time.perf_counter() - t0
        stats = m.stats()
        # The same reads again, now that every batch is materialised: what open+read costs
        # when nothing waits (the copy itself).
        t = time.perf_counter()
        for i in range(1, n_batches):
            read_into(os.open(root / f"{i:06d}.safetensors", os.O_RDONLY), view, sizes[i])
        ready_read = time.perf_counter() - t
    finally:
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
                                               "prefetch_scheduled", "prefetch_deferred",
                                               "passthrough_opens", "batch_file_hits", "batch_file_misses")},
    }
