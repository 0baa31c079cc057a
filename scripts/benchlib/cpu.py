"""The daemon's CPU per GB of shuffled epochs read from cached columns (PRODUCT.md §6, issue 31).

For each shuffle mode (`block`, the default, and `window`) and each file kind (`all/NAME.npy`
memory maps sliced batch by batch, `.safetensors` batch files, per-tensor `NNNNNN/NAME.npy`
files), a mount of the bench dataset on a fresh cache with `shuffle=MODE,epochs=6` is read: epoch 0 (cold: it decodes and caches the columns) and epoch 1,
each until the daemon's work for it has settled. Then epoch 2, and the daemon's utime+stime from
the settled end of epoch 1 to the settled end of epoch 2, divided by the tensor bytes epoch 2
delivered, is what a job's every epoch costs it: the epoch read and the next one built
(`built` says how many epochs of batches the daemon gathered in that window: 1.00). Two epochs
read back to back in one window held one epoch's builds, not two: the first epoch's files were
built while the work of the epoch before settled, outside the window, and the second's as it
was read. The rates: epoch 2 (its files ready), and epoch 4 read right after epoch 3, as a job
reads, with whatever was built ahead by then.

Beside them, the peers of the same run: the same kind of shuffled batches gathered with
`np.take` from the columns held in RAM by one thread (its process CPU per GB and its rate: the
medians of passes spread through the run), and epoch 2's files copied to local disk and read the
same way from the page cache.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

from .common import MB, TENSORS, log
from .methods import read_npy_dirs, read_npy_slices, read_safetensors_files
from .mounts import Mount

KINDS = {
    "all": "all/NAME.npy memory maps",
    "safetensors": ".safetensors batch files",
    "npy": "NNNNNN/NAME.npy files",
}


def daemon_cpu_s(pids: list[int]) -> float:
    """The CPU seconds of the daemon's processes (all their threads, ended ones too), to the
    nanosecond: each process's CPU clock (clock_getcpuclockid's id, `~pid << 3 | 2`), where
    utime + stime count 10 ms ticks, a tenth of the CPU an epoch of the bench's rows costs
    the daemon. Ticks where the clock cannot be read."""
    total = 0.0
    for pid in pids:
        try:
            total += time.clock_gettime_ns((~pid << 3) | 2) / 1e9
            continue
        except OSError:
            pass
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def settle(pids: list[int], quiet: float = 1.0, limit: float = 300) -> float:
    """The daemon's CPU seconds once they have not grown for QUIET seconds (its work done)."""
    last, since, deadline = daemon_cpu_s(pids), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = daemon_cpu_s(pids)
        if now > last + 0.01:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return daemon_cpu_s(pids)


def read_kind(kind: str, root: Path, rows: int, batch_size: int, n_batches: int):
    if kind == "all":
        return read_npy_slices(root / "all", rows, batch_size)
    if kind == "safetensors":
        return read_safetensors_files(root, n_batches)
    return read_npy_dirs(root, n_batches)


def gather_columns(data_files: list[Path]) -> list:
    """The bench dataset's tensor columns as NumPy arrays in RAM."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(data_files)
    cols = []
    for name in TENSORS:
        c = table.column(name).combine_chunks()
        if name == "emb":
            cols.append(np.asarray(c.flatten()).reshape(len(c), -1))
        else:
            cols.append(np.asarray(c))
    return cols


def numpy_gather(cols: list, rows: int, batch_size: int) -> dict:
    """Shuffled batches gathered with np.take from the columns in RAM, one thread."""
    import numpy as np

    order = np.random.default_rng(7).permutation(rows)
    nbytes = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, rows, batch_size):
        idx = order[start:start + batch_size]
        for c in cols:
            nbytes += np.take(c, idx, axis=0).nbytes
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"bytes": nbytes, "seconds": wall, "cpu_s": cpu, "core_s_gb": cpu / (nbytes / 1e9), "mb_s": nbytes / MB / wall}


SHUFFLES = ("block", "window")


def run_rows(binary: Path, data: Path, data_files: list[Path], scratch: Path, rows: int, batch_size: int,
             mounts: list, extra: list[str]) -> dict:
    out = {"rows": rows, "batch_size": batch_size, "kinds": {}}
    # The gather is timed twice before the first kind and once after each: one pass of it moved
    # by up to 2x between passes minutes apart on the VM this was written on, so the ratios use
    # the medians.
    cols = gather_columns(data_files)
    gathers = []

    def gather():
        g = numpy_gather(cols, rows, batch_size)
        log(f"cpu: np.take gather from RAM: {g['mb_s']:.0f} MB/s, {g['core_s_gb']:.2f} core-s/GB")
        gathers.append(g)

    gather()
    gather()
    for shuffle, (kind, label) in ((s, k) for s in SHUFFLES for k in KINDS.items()):
        label = f"{label}, {shuffle}"
        cache = scratch / f"cache-cpu-{kind}"
        shutil.rmtree(cache, ignore_errors=True)
        m = Mount(binary, f"file://{data}", scratch / f"mnt-cpu-{kind}",
                  [f"batch_size={batch_size}", f"shuffle={shuffle}", "epochs=6", f"cache_dir={cache}", *extra])
        mounts.append(m)
        try:
            n = m.dataset()["batches_per_epoch"]
            read_kind(kind, m.mnt / "epoch-0", rows, batch_size, n)
            settle(m.pids)
            read_kind(kind, m.mnt / "epoch-1", rows, batch_size, n)
            before, stats0 = settle(m.pids), m.stats()
            ready = read_kind(kind, m.mnt / "epoch-2", rows, batch_size, n)
            after, stats1 = settle(m.pids), m.stats()
            nbytes = ready[1]
            read_kind(kind, m.mnt / "epoch-3", rows, batch_size, n)
            right_after = read_kind(kind, m.mnt / "epoch-4", rows, batch_size, n)
            # Epoch 2 copied to local disk, read the same way from the page cache.
            local = scratch / f"local-cpu-{kind}"
            shutil.rmtree(local, ignore_errors=True)
            shutil.copytree(m.mnt / "epoch-2", local, ignore=shutil.ignore_patterns("gds", "rank-*"))
            read_kind(kind, local, rows, batch_size, n)
            lr = read_kind(kind, local, rows, batch_size, n)
            shutil.rmtree(local, ignore_errors=True)
            k = out["kinds"][f"{shuffle}/{kind}"] = {
                "label": label, "bytes": nbytes, "daemon_cpu_s": after - before,
                "core_s_gb": (after - before) / (nbytes / 1e9),
                "ready_mb_s": ready[1] / MB / ready[2], "next_mb_s": right_after[1] / MB / right_after[2],
                "local_mb_s": lr[1] / MB / lr[2],
                "batch_files_written": stats1.get("batch_files_written", 0) - stats0.get("batch_files_written", 0),
                # Batches gathered in the window (the one-open files' included), in epochs.
                "epochs_built": (stats1.get("batches_built", 0) - stats0.get("batches_built", 0)) / n,
            }
            log(f"cpu: {label}, epoch 2: daemon {k['core_s_gb']:.2f} core-s/GB; epoch 2 {k['ready_mb_s']:.0f} MB/s, "
                f"epoch 4 right after epoch 3 {k['next_mb_s']:.0f} MB/s, local {k['local_mb_s']:.0f} MB/s, "
                f"{k['epochs_built']:.2f} epochs built, {k['batch_files_written']} batch files written")
        finally:
            m.unmount()
            mounts.remove(m)
            shutil.rmtree(cache, ignore_errors=True)
        gather()
    cpus, rates = [g["core_s_gb"] for g in gathers], [g["mb_s"] for g in gathers]
    out["gather"] = {"core_s_gb": statistics.median(cpus), "mb_s": statistics.median(rates), "passes": gathers,
                     "core_s_gb_range": [min(cpus), max(cpus)]}
    return out


def print_rows(cpu: dict) -> list[str]:
    g = cpu["gather"]
    lines = [f"Daemon CPU, shuffled epochs from cached columns ({cpu['rows']} rows, batch {cpu['batch_size']}; "
             "target: <= 2x the gather's core-s/GB; the epoch read right after the one before >= 0.6x its rate)"]
    head = (f"{'reader (epoch 2), shuffle':<46}{'core-s/GB':>10}{'x gather':>9}{'MB/s e2':>9}{'MB/s e4':>9}"
            f"{'e4 x gather':>12}{'e2 x local':>11}{'built':>7}")
    lines += [head, "-" * len(head)]
    rate = g["mb_s"]
    lines.append(f"{'np.take gather from RAM, 1 thread':<46}{g['core_s_gb']:>10.2f}{'1.00':>9}{rate:>9.0f}"
                 f"{rate:>9.0f}{'1.00':>12}{'':>11}{'':>7}")
    for k in cpu["kinds"].values():
        built = f"{k['epochs_built']:.2f}" if "epochs_built" in k else ""
        lines.append(f"{'tensorfs ' + k['label']:<46}{k['core_s_gb']:>10.2f}{k['core_s_gb'] / g['core_s_gb']:>9.2f}"
                     f"{k['ready_mb_s']:>9.0f}{k['next_mb_s']:>9.0f}{k['next_mb_s'] / rate:>12.2f}"
                     f"{k['ready_mb_s'] / k['local_mb_s']:>11.2f}{built:>7}")
    lines.append("(built: the epochs of batches the daemon gathered while epoch 2 was read and its work settled: "
                 "1.00 where the next epoch was built, as in a job; e4: epoch 4 read right after epoch 3)")
    if "core_s_gb_range" in g:
        lo, hi = g["core_s_gb_range"]
        lines.append(f"(np.take: the medians of {len(g['passes'])} passes spread through the run, "
                     f"{lo:.2f}-{hi:.2f} core-s/GB)")
    st = cpu.get("streaming")
    if st and "skipped" in st:
        lines.append(f"MosaicML Streaming: left out ({st['skipped']})")
    elif st:
        lines.append(f"{'MosaicML Streaming, MDS, shuffle=True':<46}{'':>10}{'':>9}{st['mb_s']:>9.2f}{'':>9}"
                     f"{'':>12}{'':>11}   ({st['rows']} rows, {st['samples_s']:.0f} samples/s, one process)")
    return lines
