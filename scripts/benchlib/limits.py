"""The fast path at its limits (issue 51): time to first batch, what a cold epoch writes to the
SSD per GB it delivers, and warm `all/` against local files at four batch sizes.

Time to first batch: from the `tensorfs mount` command (its listing, footers and checks) to the
first batch's arrays in memory, on a fresh cache with the page cache dropped: the first
`epoch-0/000000.safetensors` loaded, or the first batch sliced out of memory-mapped
`all/NAME.npy` files. Against PyArrow from listing the files to its first `iter_batches` batch
as NumPy arrays, and Petastorm from `make_batch_reader` to its first batch (measured in its own
rows, passed in).

SSD bytes per GB: a cold epoch read on a fresh cache, then the daemon's `cache_written_bytes`
once its writes have settled, over the tensor bytes the epoch delivered: batch files under
`shuffle=none` (every epoch reads the same files, so they are kept), the default `block` and
`window`; and `all/` memory maps under `block` (the next epoch's one-open files are built on the
SSD for that reader).

Warm `all/`: the files built by a first read, read again through the mount and as copies on
local disk (page cache), memory-mapped and sliced batch by batch, at each batch size; the median
of three passes each, local and mount interleaved.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from .common import MB, TENSORS, log
from .methods import column_arrays, read_npy_slices, read_safetensors_files
from .mounts import Mount

BATCH_SIZES = (256, 1024, 4096, 8192)


def first_batch_tensorfs(binary: Path, source: str, mnt: Path, options: list[str], kind: str, batch_size: int,
                         mounts: list) -> float:
    """Seconds from the mount command to the first batch's arrays in memory."""
    import numpy as np
    from safetensors.numpy import load_file

    started = time.perf_counter()
    m = Mount(binary, source, mnt, options)
    mounts.append(m)
    try:
        if kind == "safetensors":
            first = load_file(m.mnt / "epoch-0" / "000000.safetensors")
            assert set(first) == set(TENSORS), sorted(first)
        else:
            maps = [np.load(m.mnt / "epoch-0" / "all" / f"{t}.npy", mmap_mode="r") for t in TENSORS]
            first = [np.array(a[:batch_size]) for a in maps]
            assert all(len(a) == min(batch_size, len(maps[0])) for a in first)
        return time.perf_counter() - started
    finally:
        m.unmount()
        mounts.remove(m)


def first_batch_pyarrow(list_files, batch_size: int, open_file=None) -> float:
    """Seconds from listing the files to PyArrow's first batch as NumPy arrays."""
    import pyarrow.parquet as pq

    started = time.perf_counter()
    first = list_files()[0]
    batch = next(pq.ParquetFile(open_file(first) if open_file else first).iter_batches(batch_size=batch_size))
    column_arrays(batch)
    return time.perf_counter() - started


def run_rows(binary: Path, data: Path, scratch: Path, caches, mounts: list, batch_size: int, rows: int,
             extra: list[str]) -> dict:
    from .dataset import parquet_files

    out: dict = {"rows": rows, "batch_size": batch_size, "first": {}, "ssd": {}, "warm_all": {}}
    base = [f"batch_size={batch_size}", *extra]
    cache = scratch / "cache-limits"
    mnt = scratch / "mnt-limits"

    # Time to first batch, file://.
    first = out["first"].setdefault("file", {})
    caches.drop()
    first["pyarrow"] = first_batch_pyarrow(lambda: parquet_files(data), batch_size)
    for shuffle in ("block", "none"):
        for kind in ("safetensors", "all"):
            shutil.rmtree(cache, ignore_errors=True)
            caches.drop()
            first[f"tensorfs {shuffle} {kind}"] = first_batch_tensorfs(
                binary, f"file://{data}", mnt, [*base, f"shuffle={shuffle}", f"cache_dir={cache}"], kind, batch_size,
                mounts)
    log("time to first batch, file://: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in first.items()))

    # SSD bytes written per GB delivered by a cold epoch.
    for shuffle, kind in (("none", "safetensors"), ("block", "safetensors"), ("window", "safetensors"),
                          ("block", "all")):
        shutil.rmtree(cache, ignore_errors=True)
        caches.drop()
        m = Mount(binary, f"file://{data}", mnt, [*base, f"shuffle={shuffle}", "epochs=2", f"cache_dir={cache}"])
        mounts.append(m)
        try:
            n = m.dataset()["batches_per_epoch"]
            if kind == "safetensors":
                _, delivered, seconds = read_safetensors_files(m.mnt / "epoch-0", n)
            else:
                _, delivered, seconds = read_npy_slices(m.mnt / "epoch-0" / "all", rows, batch_size)
            written = m.settled("cache_written_bytes")
            stats = m.stats()
        finally:
            m.unmount()
            mounts.remove(m)
        out["ssd"][f"{shuffle} {kind}"] = {
            "written": written, "delivered": delivered, "per_gb": written / delivered,
            "batch_files_written": stats.get("batch_files_written", 0), "mb_s": delivered / MB / seconds,
        }
        log(f"cold epoch, shuffle={shuffle}, {kind}: {written / MB:.1f} MB written to the cache for "
            f"{delivered / MB:.1f} MB delivered ({written / delivered:.2f} GB/GB)")

    # Warm all/ at four batch sizes, against the same files on local disk.
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    local = scratch / "local-limits-all"
    shutil.rmtree(local, ignore_errors=True)
    m = Mount(binary, f"file://{data}", mnt, [*base, "shuffle=none", "epochs=2", f"cache_dir={cache}"])
    mounts.append(m)
    try:
        root = m.mnt / "epoch-0" / "all"
        read_npy_slices(root, rows, batch_size)  # cold: builds and keeps the files
        shutil.copytree(root, local)
        for b in BATCH_SIZES:
            read_npy_slices(local, rows, b)
            read_npy_slices(root, rows, b)
            passes = {"local": [], "tensorfs": []}
            for _ in range(3):
                for where, path in (("local", local), ("tensorfs", root)):
                    _, nbytes, seconds = read_npy_slices(path, rows, b)
                    passes[where].append(nbytes / MB / seconds)
            local_rate, tfs_rate = statistics.median(passes["local"]), statistics.median(passes["tensorfs"])
            out["warm_all"][b] = {"local_mb_s": local_rate, "tensorfs_mb_s": tfs_rate, "ratio": tfs_rate / local_rate}
            log(f"warm all/, batch {b}: tensorfs {tfs_rate:.0f} MB/s, local {local_rate:.0f} MB/s "
                f"({tfs_rate / local_rate:.2f}x)")
        out["warm_all_stats"] = m.stats()
    finally:
        m.unmount()
        mounts.remove(m)
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return out


def first_batch_s3(out: dict, binary: Path, s3, scratch: Path, caches, mounts: list, batch_size: int,
                   extra: list[str]) -> None:
    """Time to first batch from the loopback S3 server, into OUT's `first` table."""
    first = out["first"].setdefault("s3", {})
    fs = s3.pyarrow_fs()
    caches.drop()
    first["pyarrow"] = first_batch_pyarrow(lambda: s3.parquet_keys(fs), batch_size, open_file=fs.open_input_file)
    cache = scratch / "cache-limits-s3"
    for shuffle in ("block", "none"):
        shutil.rmtree(cache, ignore_errors=True)
        caches.drop()
        first[f"tensorfs {shuffle} safetensors"] = first_batch_tensorfs(
            binary, s3.source, scratch / "mnt-limits-s3",
            [f"batch_size={batch_size}", *extra, *s3.mount_options(), f"shuffle={shuffle}", f"cache_dir={cache}"],
            "safetensors", batch_size, mounts)
    shutil.rmtree(cache, ignore_errors=True)
    log("time to first batch, S3: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in first.items()))


def print_rows(out: dict) -> list[str]:
    lines = [f"Time to first batch (batch {out['batch_size']}; from the mount command, or the listing, to the first "
             "batch's arrays in memory; fresh cache, page cache dropped)"]
    head = f"{'reader':<46}{'file:// ms':>11}{'S3 ms':>9}"
    lines += [head, "-" * len(head)]
    f, s = out["first"].get("file", {}), out["first"].get("s3", {})
    names = list(dict.fromkeys([*f, *s]))
    labels = {"pyarrow": "pyarrow: list, open, first iter_batches batch", "petastorm": "petastorm make_batch_reader"}
    for k in names:
        label = labels.get(k, k.replace("tensorfs ", "tensorfs shuffle=").replace(" all", ", all/*.npy slice")
                           .replace(" safetensors", ", first .safetensors"))
        fv = f"{f[k] * 1e3:.0f}" if k in f else "-"
        sv = f"{s[k] * 1e3:.0f}" if k in s else "-"
        lines.append(f"{label:<46}{fv:>11}{sv:>9}")
    lines += ["", "SSD bytes written by a cold epoch (cache_written_bytes), per GB delivered"]
    head = f"{'cold epoch 0, shuffle, reader':<46}{'MB written':>11}{'GB/GB':>7}{'batch files':>12}{'MB/s':>7}"
    lines += [head, "-" * len(head)]
    for k, v in out["ssd"].items():
        shuffle, kind = k.split(" ")
        label = f"shuffle={shuffle}, " + (".safetensors batch files" if kind == "safetensors" else "all/*.npy slices")
        lines.append(f"{label:<46}{v['written'] / MB:>11.1f}{v['per_gb']:>7.2f}{v['batch_files_written']:>12}"
                     f"{v['mb_s']:>7.0f}")
    lines += ["", "Warm all/*.npy memory maps sliced batch by batch, against the same files on local disk "
              "(page cache; medians of 3; target >= 0.95x)"]
    head = f"{'batch size':<12}{'tensorfs MB/s':>14}{'local MB/s':>11}{'ratio':>7}"
    lines += [head, "-" * len(head)]
    for b, v in out["warm_all"].items():
        lines.append(f"{b:<12}{v['tensorfs_mb_s']:>14.0f}{v['local_mb_s']:>11.0f}{v['ratio']:>7.2f}")
    return lines
