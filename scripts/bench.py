#!/usr/bin/env python3
"""The tensorfs benchmark driver (run it through scripts/bench, which builds and sets up first).

One run, one dataset, one machine. It generates a Parquet dataset (int64 `id`, float32 `x`,
FixedSizeList<float32>[64] `emb`, int32 `label`: 272 tensor bytes per row; several files of
several snappy row groups), then reads every row of it, as batches of --batch-size rows converted
to NumPy arrays, in these ways:

  local .npy                the same batches pre-written as .npy files (one per tensor) on local
                            disk, np.load per file: the limit
  local .safetensors        the mount's own batch files copied to local disk, read with
                            safetensors.numpy.load_file: the limit for the same reader and bytes
  pyarrow                   pq.ParquetFile(...).iter_batches(batch_size=B) + to_numpy of every
                            column, from local disk and from the loopback S3 server
  petastorm                 make_batch_reader (thread pool), without and with its local-disk cache,
                            from file://; and without a cache from the loopback S3 server (s3://,
                            through s3fs)
  tensorfs cold             mount with a fresh cache_dir, read every epoch-0/NNNNNN.safetensors
                            with safetensors.numpy.load_file (from file:// and from S3)
  tensorfs warm             the same after a first full read, and remounted on the same cache_dir
                            with the page cache dropped, the batch files and all.safetensors (kept
                            whole on the cache by the first mount's reader of it)
  tensorfs shuffled         shuffle=block (the default), window (the default before it: issue
                            47's before and after, side by side) and global, epochs 0 (cold) and 1
                            (reshuffled, gathered from the columns cached during epoch 0) back to back, and
                            epoch 2 once its batch files are built ahead in idle time (the walk
                            through the next epoch, src/read/follow/prefetch.rs), each checked to be a
                            permutation of the rows; then, remounted, epoch 3 read as its
                            all.safetensors with 1 MiB reads (one open; gathered into memory, no
                            batch files), and epoch 4's all.safetensors, which that reader had
                            built whole on the cache ahead of it (src/read/produce/ahead.rs), once built
  a Petastorm dataset       (own table) written by Petastorm's materialize_dataset + Spark: id,
                            a 64x64x3 PNG image and a float32[16] ndarray; read by Petastorm's
                            make_reader and through tensorfs cold and warm (petastorm_dataset.py)
  daemon CPU                (own table) shuffle=global, each file kind (all/NAME.npy maps,
                            .safetensors, NNNNNN/NAME.npy): the daemon's core-seconds per GB of
                            epochs 1 and 2 (from cached columns, in steady state), beside np.take
                            gathering the same kind of batches from RAM (cpu.py); beside it,
                            MosaicML Streaming reading the first --streaming-rows rows as MDS
                            shards on local disk, shuffled, one process (streaming_side.py)
  fair batches              (own table) the mean KS distance from uniform of epoch 1's batches'
                            canonical positions, tensorfs's shuffle modes at partitions=1 and 8
                            against MosaicML Streaming's py1e order (fairness.py)
  many hosts                (own table) --hosts W simulated hosts, each its own mount and cache_dir
                            of the S3 prefix, reading its rank view's epochs 0 and 1 with
                            partitions=1 and partitions=W: bytes fetched and decode CPU per host
                            per epoch, against one mount reading the whole epoch (hosts.py)
  your own transform        (own table, --transform-rows) a string column turned into int64 ids and
                            a float scaled, as a Petastorm TransformSpec and as a plain function:
                            a cold epoch through tensorfs (transform=, transform_workers=N) against
                            Petastorm's make_batch_reader(transform_spec=, workers_count=N), the
                            next epoch (from the cached output) against the table without a
                            transform, the daemon's and the workers' CPU per GB, and the cold
                            epoch again in Petastorm's own batches (a row group each, in order;
                            transform.py)
  views                     (own table) a hive-partitioned table of 10 days on the S3 server, read
                            whole, with where=day >= 8 and with where=id between A and B (~2% of
                            the rows): the bytes and requests a cold tensorfs mount fetches and
                            PyArrow's dataset filter of the same rows fetches, counted by
                            tests/faultproxy.py in front of the server, against the table's bytes
                            (views.py)

  cold CPU                  (own table) the daemon's core-seconds per GB of a cold epoch (a fresh
                            mount, epochs=1, epoch-0/all/NAME.npy sliced batch by batch) against
                            PyArrow's iter_batches+to_numpy of the same files, each reader a
                            process of its own with its getrusage, page cache dropped: 80-byte
                            rows (--coldcpu-rows, 16 files) and the bench's 272-byte rows, from
                            file:// and from the loopback S3 server (PyArrow's S3FileSystem,
                            s3://); then epoch 1 right after (issue 62: daemon <= 1.5x PyArrow;
                            cold_cpu.py)

  the fast path's limits (own tables) time to first batch from the mount command against
                            PyArrow's and Petastorm's, file:// and S3; the SSD bytes a cold epoch
                            writes per GB it delivers, per shuffle mode and reader; warm all/ memory
                            maps against local files at batch sizes 256 to 8192 (limits.py)

and runs the stall experiment: a consumer that needs half of tensorfs's cold throughput, and how
long it waits on reads. Page caches are dropped before every cold run when we are root.
Prints a table and writes it as a PNG chart.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchlib.common import MB, REPO, ROW_BYTES, log
from benchlib.dataset import (SMALL_ROW_BYTES, SMALL_TENSORS, parquet_files, write_dataset, write_npy_batches,
                              write_small_rows_dataset)
from benchlib.cold_cpu import print_rows as print_coldcpu
from benchlib.cold_cpu import run_rows as coldcpu_rows
from benchlib.cpu import print_rows as print_cpu
from benchlib.cpu import run_rows as cpu_rows
from benchlib.fairness import print_rows as print_fairness
from benchlib.fairness import run_rows as fairness_rows
from benchlib.streaming_side import streaming_row
from benchlib.hosts import print_rows as print_hosts
from benchlib.hosts import run_rows as hosts_rows
from benchlib.limits import first_batch_s3
from benchlib.limits import print_rows as print_limits
from benchlib.limits import run_rows as limits_rows
from benchlib.methods import (check_permutation, open_cost_us, read_file_sequentially, read_npy_dirs, read_npy_slices,
                              read_pyarrow, read_safetensors_files, verify)
from benchlib.mounts import Caches, Mount, S3Server, close_all
from benchlib.petastorm_dataset import print_rows as print_petastorm_dataset
from benchlib.petastorm_dataset import run_rows as petastorm_dataset_rows
from benchlib.petastorm_side import SIDE_VENV, petastorm_epochs, petastorm_python, petastorm_s3fs, petastorm_worker
from benchlib.report import Results, report
from benchlib.stall import stall_experiment
from benchlib.transform import print_rows as print_transform
from benchlib.transform import run_rows as transform_rows
from benchlib.views import print_rows as print_views
from benchlib.views import run_rows as views_rows


def one_open_rows(res: Results, root: Path, local: Path, rows: int, batch_size: int) -> None:
    """The epoch's all.safetensors and all/NAME.npy through the mount (once read, so warm) and as
    the same files copied to local disk (page cache), each read the same way: sequential 1 MiB
    reads of all.safetensors, and batch slices of memory-mapped all/NAME.npy files."""
    shutil.copyfile(root / "all.safetensors", local / "all.safetensors")
    shutil.copytree(root / "all", local / "all")
    for where, key, what in ((local, "all_local", "local"), (root, "tfs_all", "tensorfs warm")):
        read_file_sequentially(where / "all.safetensors", rows)  # into the page cache
        res.add(f"{key}_seq", f"{what} all.safetensors, 1 MiB reads", *read_file_sequentially(where / "all.safetensors", rows))
        read_npy_slices(where / "all", rows, batch_size)
        res.add(f"{key}_mmap", f"{what} all/*.npy, mmap batch slices", *read_npy_slices(where / "all", rows, batch_size))


def small_rows(res: Results, a, binary: Path, scratch: Path, caches: Caches, mounts: list) -> None:
    """The small-row dataset (80 bytes a row in 16 columns): PyArrow against tensorfs cold and
    warm, read as batch files, as per-tensor .npy files (the docs' way), and through all/."""
    data = scratch / "data-small"
    rows, B = a.small_rows, a.batch_size
    shutil.rmtree(data, ignore_errors=True)
    log(f"writing the small-row dataset: {rows} rows of {SMALL_ROW_BYTES} bytes in {len(SMALL_TENSORS)} columns")
    write_small_rows_dataset(data, rows, a.files, a.row_group_rows)
    n = -(-rows // B)
    caches.drop()
    res.add("small_pyarrow", "small rows: pyarrow iter_batches+to_numpy", *read_pyarrow(parquet_files(data), B))
    cache = scratch / "cache-small"
    # Cold through the other file kinds first, each on a fresh cache (PRODUCT.md §6: cold faster
    # than PyArrow whichever file kind is read).
    for key, label, read in (
        ("small_tfs_cold_npy", "small rows: tensorfs cold, .npy files", lambda r: read_npy_dirs(r, n, SMALL_TENSORS)),
        ("small_tfs_cold_all", "small rows: tensorfs cold, all/*.npy slices",
         lambda r: read_npy_slices(r / "all", rows, B, SMALL_TENSORS)),
    ):
        shutil.rmtree(cache, ignore_errors=True)
        caches.drop()
        m = Mount(binary, f"file://{data}", scratch / "mnt-small", [f"batch_size={B}", "shuffle=none", f"cache_dir={cache}"])
        mounts.append(m)
        res.add(key, label, *read(m.mnt / "epoch-0"))
        m.unmount()
        mounts.remove(m)
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    m = Mount(binary, f"file://{data}", scratch / "mnt-small", [f"batch_size={B}", "shuffle=none", f"cache_dir={cache}"])
    mounts.append(m)
    root = m.mnt / "epoch-0"
    res.add("small_tfs_cold", "small rows: tensorfs cold, batch files", *read_safetensors_files(root, n))
    res.add("small_tfs_warm", "small rows: tensorfs warm, batch files", *read_safetensors_files(root, n))
    read_npy_dirs(root, n, SMALL_TENSORS)
    res.add("small_tfs_npy", "small rows: tensorfs warm, .npy files", *read_npy_dirs(root, n, SMALL_TENSORS))
    # The same per-tensor files as local files in the page cache, read the same way: what
    # np.load's own cost per file leaves of any reader of them.
    local = scratch / "local-small-npy"
    shutil.rmtree(local, ignore_errors=True)
    for i in range(n):
        shutil.copytree(root / f"{i:06d}", local / f"{i:06d}")
    read_npy_dirs(local, n, SMALL_TENSORS)
    res.add("small_local_npy", "small rows: the same .npy files, local (page cache)", *read_npy_dirs(local, n, SMALL_TENSORS))
    shutil.rmtree(local, ignore_errors=True)
    read_npy_slices(root / "all", rows, B, SMALL_TENSORS)
    res.add("small_tfs_all", "small rows: tensorfs warm, all/*.npy slices",
            *read_npy_slices(root / "all", rows, B, SMALL_TENSORS))
    m.unmount()
    mounts.remove(m)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)


def run(a) -> int:
    import numpy as np  # noqa: F401  (fail early if the venv is broken)
    import pyarrow
    import pyarrow.parquet

    binary = Path(a.bin).resolve()
    if not binary.exists():
        raise SystemExit(f"bench: {binary} is missing (build it: cargo build --release)")
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    known = {"npy", "pyarrow", "petastorm", "petastorm-ds", "s3", "tensorfs", "warm", "all", "shuffle", "small", "stall",
             "hosts", "cpu", "streaming", "fairness", "transform", "limits", "views", "coldcpu"}
    if skip - known:
        raise SystemExit(f"bench: unknown --skip {sorted(skip - known)}; known: {sorted(known)}")
    own_scratch = a.out_dir is None
    scratch = Path(tempfile.mkdtemp(prefix="tensorfs-bench-")) if own_scratch else Path(a.out_dir).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    caches = Caches(enabled=not a.no_drop_caches)
    res = Results()
    stalls = []
    mounts: list[Mount] = []
    s3 = None
    pds = None
    hosts = None
    views = None
    cpu = None
    coldcpu = None
    fair = None
    tr = None
    lim = None
    B = a.batch_size
    try:
        # ---- data ----------------------------------------------------------------------
        data = scratch / "data"
        log(f"writing {a.rows} rows as {a.files} Parquet files, {a.row_group_rows}-row groups, to {data}")
        shutil.rmtree(data, ignore_errors=True)
        write_dataset(data, a.rows, a.files, a.row_group_rows)
        pq_bytes = sum(p.stat().st_size for p in parquet_files(data))
        rg_first_rows, at = [], 0
        for p in parquet_files(data):
            md = pyarrow.parquet.ParquetFile(p).metadata
            for g in range(md.num_row_groups):
                rg_first_rows.append(at)
                at += md.row_group(g).num_rows
        n_batches = -(-a.rows // B)
        log(f"Parquet: {pq_bytes / MB:.1f} MB; tensors: {a.rows * ROW_BYTES / MB:.1f} MB in {n_batches} batches of {B}")
        meta = {
            "rows": a.rows, "batch_size": B, "batches": n_batches, "files": a.files,
            "row_group_rows": a.row_group_rows, "parquet_mb": pq_bytes / MB,
            "tensor_mb": a.rows * ROW_BYTES / MB, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "pyarrow": pyarrow.__version__,
        }

        # ---- 1. local .npy --------------------------------------------------------------
        if "npy" not in skip:
            npy = scratch / "npy"
            shutil.rmtree(npy, ignore_errors=True)
            log("writing the batches as local .npy files")
            write_npy_batches(data, npy, B)
            if caches.drop():
                res.add("npy_disk", "local .npy, page cache dropped", *read_npy_dirs(npy, n_batches))
            read_npy_dirs(npy, n_batches)  # into the page cache
            res.add("npy", "local .npy (page cache)", *read_npy_dirs(npy, n_batches))

        # ---- 2. PyArrow -----------------------------------------------------------------
        if "pyarrow" not in skip:
            caches.drop()
            res.add("pyarrow", "pyarrow iter_batches+to_numpy, local", *read_pyarrow(parquet_files(data), B),
                    note="page cache dropped" if caches.works else "")

        # ---- 3. Petastorm ---------------------------------------------------------------
        # Petastorm's interpreter and its twin dataset, kept for its S3 row (step 5); or why
        # Petastorm cannot run.
        pet_py, pet_err = None, None
        pet_first: dict = {}  # Petastorm's time to first batch, by store
        pdata = scratch / "data-petastorm"
        if "petastorm" not in skip:
            label = "petastorm make_batch_reader"
            try:
                py, note = petastorm_python(a.petastorm_python, not a.no_side_venv)
                if py is None:
                    pet_err = note
                    raise RuntimeError(note)
                log(f"petastorm: {note}")
                meta["petastorm"] = note
                # Petastorm skips FixedSizeList columns ('unsupported field'): it reads a twin
                # dataset with emb as list<float32>, same values, same files and row groups.
                shutil.rmtree(pdata, ignore_errors=True)
                write_dataset(pdata, a.rows, a.files, a.row_group_rows, emb_as_list=True)
                pet_py = py
                for cached in (False, True):
                    pcache = scratch / "petastorm-cache"
                    shutil.rmtree(pcache, ignore_errors=True)
                    caches.drop()
                    try:
                        epochs = petastorm_epochs(py, f"file://{pdata}", a, cache=pcache if cached else None)
                    finally:
                        shutil.rmtree(pcache, ignore_errors=True)
                    if not cached:
                        e = epochs[0]
                        res.add("petastorm", f"{label}, no cache", e["rows"], e["bytes"], e["seconds"])
                        pet_first["file"] = e["first_s"]
                    else:
                        e1, e2 = epochs[0], epochs[1]
                        res.add("petastorm_fill", f"{label}, disk cache, 1st epoch", e1["rows"], e1["bytes"], e1["seconds"])
                        res.add("petastorm_cached", f"{label}, disk cache, 2nd epoch", e2["rows"], e2["bytes"], e2["seconds"])
            except Exception as e:  # any failure: say so and go on
                res.unavailable("petastorm", label, str(e)[-300:])
            if pet_py is None or "s3" in skip:
                shutil.rmtree(pdata, ignore_errors=True)

        # ---- 4. tensorfs cold from file://, 6. warm --------------------------------------
        # Two epochs listed: a reader of the one-open files then has them built and kept (with
        # shuffle=none every epoch's are the same), which the remounted all.safetensors row reads.
        opts = [f"batch_size={B}", "shuffle=none", "epochs=2"]
        if a.tensorfs_options:
            opts += a.tensorfs_options.split(",")
        if "tensorfs" not in skip:
            cache = scratch / "cache-file"
            shutil.rmtree(cache, ignore_errors=True)
            src = f"file://{data}"
            caches.drop()
            m = Mount(binary, src, scratch / "mnt-file", [*opts, f"cache_dir={cache}"])
            mounts.append(m)
            ds = m.dataset()
            assert ds["batches_per_epoch"] == n_batches, ds["batches_per_epoch"]
            root = m.mnt / "epoch-0"
            res.add("tfs_cold", "tensorfs cold, file://", *read_safetensors_files(root, n_batches))
            verify(root, scratch / "npy", n_batches, "tensorfs, file://")
            meta["tensorfs_cold_file_stats"] = m.stats()
            if "warm" not in skip:
                res.add("tfs_warm", "tensorfs warm (page cache)", *read_safetensors_files(root, n_batches))
                # The mount's own files, copied to local disk: the same bytes, the same reader.
                st = scratch / "safetensors"
                shutil.rmtree(st, ignore_errors=True)
                st.mkdir()
                for i in range(n_batches):
                    shutil.copyfile(root / f"{i:06d}.safetensors", st / f"{i:06d}.safetensors")
                read_safetensors_files(st, n_batches)
                res.add("st_local", "local .safetensors (page cache)", *read_safetensors_files(st, n_batches),
                        note="the mount's files copied to local disk")
                meta["open_us"] = {"mount": open_cost_us(root, n_batches), "local": open_cost_us(st, n_batches)}
                if "npy" not in skip:
                    read_npy_dirs(root, n_batches)  # materialise the .npy files
                    res.add("tfs_warm_npy", "tensorfs warm, .npy files (page cache)", *read_npy_dirs(root, n_batches))
                if "all" not in skip:
                    one_open_rows(res, root, st, a.rows, B)
                m.unmount()
                mounts.remove(m)
                if caches.drop():
                    read_st_disk = read_safetensors_files(st, n_batches)
                    caches.drop()
                    m = Mount(binary, src, scratch / "mnt-file", [*opts, f"cache_dir={cache}"])
                    mounts.append(m)
                    res.add("tfs_warm_disk", "tensorfs warm, remounted, page cache dropped",
                            *read_safetensors_files(m.mnt / "epoch-0", n_batches))
                    meta["tensorfs_warm_remount_stats"] = m.stats()
                    res.add("st_local_disk", "local .safetensors, page cache dropped", *read_st_disk)
                    if "all" not in skip:
                        # The first mount's reader of all.safetensors had it built whole and kept
                        # (src/read/produce/ahead.rs): the remount checks it on its first open, then passes reads
                        # through to it.
                        caches.drop()
                        res.add("all_local_disk", "local all.safetensors, 1 MiB reads, page cache dropped",
                                *read_file_sequentially(st / "all.safetensors", a.rows))
                        caches.drop()
                        res.add("tfs_all_disk", "tensorfs all.safetensors, remounted, page cache dropped",
                                *read_file_sequentially(m.mnt / "epoch-0" / "all.safetensors", a.rows))
                        meta["tensorfs_all_remount_stats"] = m.stats()
                shutil.rmtree(st, ignore_errors=True)
            m.unmount()
            mounts.remove(m)
            shutil.rmtree(cache, ignore_errors=True)

        # ---- 6b. shuffled epochs: block (the default), window (the one before it), global -----
        if "shuffle" not in skip and "tensorfs" not in skip:
            base = [o for o in opts if not o.startswith(("shuffle=", "epochs="))]
            for mode in ("block", "window", "global"):
                cache = scratch / f"cache-{mode}"
                shutil.rmtree(cache, ignore_errors=True)
                caches.drop()
                # Batch files: epochs 0 and 1 back to back, then epoch 2 once its files are
                # built ahead (epochs=3: nothing past it, so the one-open rows below, on a
                # second mount of the same cache, find no batch files of their epochs).
                m = Mount(binary, f"file://{data}", scratch / f"mnt-{mode}",
                          [*base, f"shuffle={mode}", "epochs=3", f"cache_dir={cache}"])
                mounts.append(m)
                n = m.dataset()["batches_per_epoch"]
                for e, what in ((0, "epoch 0 (cold)"), (1, "epoch 1 (cached columns)")):
                    before = m.stats()
                    res.add(f"tfs_{mode}_e{e}", f"tensorfs shuffle={mode}, {what}",
                            *read_safetensors_files(m.mnt / f"epoch-{e}", n))
                    # Where the building time went: the workers' CPU per batch, by part.
                    after = m.stats()
                    per = {k: (after[k] - before[k]) / 1e3 / n
                           for k in ("decode_cpu_ns", "gather_cpu_ns", "batch_write_cpu_ns")}
                    meta.setdefault("build_cpu_us_per_batch", {})[f"{mode}_e{e}"] = per
                    log(f"shuffle={mode} epoch {e}, workers' CPU per batch: {per['decode_cpu_ns']:.0f} us decoding, "
                        f"{per['gather_cpu_ns']:.0f} us gathering, {per['batch_write_cpu_ns']:.0f} us writing its file; "
                        f"{before.get('next_epoch_files_built', 0)} batch files of epoch 1 built ahead before epoch 1 was read"
                        * (e == 1))
                    check_permutation(m.mnt / f"epoch-{e}", n, a.rows, f"shuffle={mode} epoch {e}")
                # Epoch 2's batch files, built in idle time from epoch 1's first read on (the
                # walk through the next epoch, src/read/follow/prefetch.rs); a trainer busy with epoch 1, or
                # saving a checkpoint, would not wait for them. The wait is logged.
                waited, built = time.monotonic(), m.settled("next_epoch_files_built")
                log(f"shuffle={mode}: {built} batch files built ahead of their epoch, the last "
                    f"{time.monotonic() - waited - 1:.2f} s after epoch 1 was read "
                    f"(epoch 1 read in {res.get(f'tfs_{mode}_e1')['seconds']:.2f} s)")
                res.add(f"tfs_{mode}_e2_ahead", f"tensorfs shuffle={mode}, epoch 2, batch files built ahead",
                        *read_safetensors_files(m.mnt / "epoch-2", n))
                check_permutation(m.mnt / "epoch-2", n, a.rows, f"shuffle={mode} epoch 2")
                m.unmount()
                mounts.remove(m)
                # The same reads with opens=kernel (the kernel answers opens alone; the files
                # built for the reader are stored in its page cache), on a new cache.
                kcache = scratch / f"cache-{mode}-kernel"
                shutil.rmtree(kcache, ignore_errors=True)
                caches.drop()
                m = Mount(binary, f"file://{data}", scratch / f"mnt-{mode}",
                          [*base, f"shuffle={mode}", "epochs=3", "opens=kernel", f"cache_dir={kcache}"])
                mounts.append(m)
                for key, e, what in (("e0", 0, "epoch 0 (cold)"), ("warm", 0, "epoch 0 again (warm)"),
                                     ("e1", 1, "epoch 1 (right after epoch 0)")):
                    res.add(f"tfs_{mode}_kernel_{key}", f"tensorfs shuffle={mode}, opens=kernel, {what}",
                            *read_safetensors_files(m.mnt / f"epoch-{e}", n))
                m.settled("page_cache_stores")
                res.add(f"tfs_{mode}_kernel_e2_ahead", f"tensorfs shuffle={mode}, opens=kernel, epoch 2, built ahead",
                        *read_safetensors_files(m.mnt / "epoch-2", n))
                check_permutation(m.mnt / "epoch-2", n, a.rows, f"shuffle={mode} opens=kernel epoch 2")
                m.unmount()
                mounts.remove(m)
                shutil.rmtree(kcache, ignore_errors=True)
                # One-open files, on the same cache (its columns): epoch 3 read as its
                # all.safetensors with 1 MiB reads, gathered into memory tensor by tensor and
                # served by the daemon, no batch file written.
                m = Mount(binary, f"file://{data}", scratch / f"mnt-{mode}",
                          [*base, f"shuffle={mode}", "epochs=7", f"cache_dir={cache}"])
                mounts.append(m)
                res.add(f"tfs_{mode}_e3_all", f"tensorfs shuffle={mode}, epoch 3, all.safetensors",
                        *read_file_sequentially(m.mnt / "epoch-3" / "all.safetensors", a.rows))
                # That reader has epoch 4's all.safetensors built whole on the cache meanwhile
                # (src/read/produce/ahead.rs); a trainer busy with epoch 3 would not wait for it. The wait
                # here is logged beside epoch 3's read time.
                waited = time.monotonic()
                while m.stats()["ahead_files_built"] < 1 and time.monotonic() - waited < 300:
                    time.sleep(0.01)
                waited = time.monotonic() - waited
                log(f"shuffle={mode}: epoch 4's all.safetensors built ahead {waited:.2f} s after epoch 3's was read "
                    f"(epoch 3 read in {res.get(f'tfs_{mode}_e3_all')['seconds']:.2f} s)")
                started = time.monotonic()
                res.add(f"tfs_{mode}_e4_ahead", f"tensorfs shuffle={mode}, epoch 4, all.safetensors built ahead",
                        *read_file_sequentially(m.mnt / "epoch-4" / "all.safetensors", a.rows))
                if m.stats()["ahead_opens"] < 1:
                    log(f"shuffle={mode}: epoch 4's all.safetensors was not served from the file built ahead")
                # How fast the next file is built: epoch 5's (a new file) from epoch 4's first
                # read, then epoch 6's (written over epoch 4's, which nobody holds now) from
                # epoch 5's.
                rates = {}
                for e, how in ((5, "new"), (6, "written_over")):
                    if e == 6:
                        started = time.monotonic()
                        read_file_sequentially(m.mnt / "epoch-5" / "all.safetensors", a.rows)
                    while m.stats()["ahead_files_built"] < e - 3 and time.monotonic() - started < 300:
                        time.sleep(0.005)
                    rates[how] = res.get(f"tfs_{mode}_e4_ahead")["bytes"] / 1e6 / (time.monotonic() - started)
                over = m.stats()["ahead_written_over"]
                meta.setdefault("ahead_build_mb_s", {})[mode] = {**rates, "files_written_over": over}
                log(f"shuffle={mode}: the next epoch's all.safetensors built at {rates['new']:.0f} MB/s as a new file, "
                    f"{rates['written_over']:.0f} MB/s over a file gone by ({over} written over)")
                m.unmount()
                mounts.remove(m)
                shutil.rmtree(cache, ignore_errors=True)
                # `tensorfs warm --format all` on a new cache: epoch 0's all.safetensors built
                # whole before the job (decoding the dataset), then read as the job would.
                caches.drop()
                m = Mount(binary, f"file://{data}", scratch / f"mnt-{mode}",
                          [*base, f"shuffle={mode}", "epochs=1", f"cache_dir={cache}"])
                mounts.append(m)
                started = time.monotonic()
                warm = subprocess.run([str(binary), "warm", str(m.mnt), "--format", "all"], capture_output=True, text=True)
                if warm.returncode != 0:
                    res.unavailable(f"tfs_{mode}_e0_warmed", f"tensorfs shuffle={mode}, epoch 0 warmed", warm.stderr.strip())
                else:
                    log(f"shuffle={mode}: tensorfs warm --format all took {time.monotonic() - started:.2f} s")
                    res.add(f"tfs_{mode}_e0_warmed",
                            f"tensorfs shuffle={mode}, epoch 0, all.safetensors after warm --format all",
                            *read_file_sequentially(m.mnt / "epoch-0" / "all.safetensors", a.rows))
                m.unmount()
                mounts.remove(m)
                shutil.rmtree(cache, ignore_errors=True)

        # ---- 6c. a small-row dataset -----------------------------------------------------------
        if "small" not in skip and "tensorfs" not in skip and a.small_rows > 0:
            small_rows(res, a, binary, scratch, caches, mounts)

        # ---- 6h. the fast path at its limits: first batch, SSD bytes per GB, warm all/ by batch size
        if "limits" not in skip and "tensorfs" not in skip:
            lim = limits_rows(binary, data, scratch, caches, mounts, B, a.rows,
                              a.tensorfs_options.split(",") if a.tensorfs_options else [])
            meta["limits"] = lim

        # ---- 6f. fair batches: KS of epoch 1's batches, tensorfs's modes against Streaming -----
        if "fairness" not in skip and "tensorfs" not in skip:
            try:
                fair = fairness_rows(binary, scratch, mounts, "streaming" not in skip)
            except Exception as e:  # any failure: say so and go on
                fair = {"unavailable": str(e)[-300:]}
                log(f"fair batches: unavailable: {fair['unavailable']}")
            meta["fairness"] = fair

        # ---- 6e. the daemon's CPU per GB of shuffled epochs from cached columns -------------------
        if "cpu" not in skip and "tensorfs" not in skip:
            cpu = cpu_rows(binary, data, parquet_files(data), scratch, a.rows, B, mounts,
                           a.tensorfs_options.split(",") if a.tensorfs_options else [])
            meta["cpu"] = cpu
            if "streaming" not in skip and a.streaming_rows > 0:
                cpu["streaming"] = streaming_row(data, scratch, a.streaming_rows)

        # ---- 6d. a dataset written by Petastorm: make_reader against tensorfs ----------------
        if "petastorm-ds" not in skip:
            try:
                pds = petastorm_dataset_rows(a, binary, scratch, caches, mounts)
                meta["petastorm_dataset"] = pds
            except Exception as e:  # any failure: say so and go on
                pds = {"unavailable": str(e)[-300:]}
                meta["petastorm_dataset"] = pds
                log(f"petastorm dataset: unavailable: {pds['unavailable']}")

        # ---- 6g. your own transform: a TransformSpec and a function, against Petastorm's -------
        if "transform" not in skip and "tensorfs" not in skip and a.transform_rows > 0:
            try:
                tr = transform_rows(a, binary, scratch, caches, mounts, skip)
            except Exception as e:  # any failure: say so and go on
                tr = {"unavailable": str(e)[-300:]}
                log(f"transform: unavailable: {tr['unavailable']}")
            meta["transform"] = tr

        # ---- 5. S3 ------------------------------------------------------------------------
        if "s3" not in skip:
            try:
                log("starting the loopback S3 server and uploading the dataset")
                t = time.perf_counter()
                s3 = S3Server(data, scratch)
                log(f"S3 at {s3.url} ({s3.how}), upload took {time.perf_counter() - t:.1f} s")
                meta["s3"] = s3.how
            except Exception as e:
                s3 = None
                res.unavailable("tfs_cold_s3", "tensorfs cold, S3 (loopback moto)", str(e)[-300:])
                if "petastorm" not in skip:
                    res.unavailable("petastorm_s3", "petastorm make_batch_reader, S3", str(e)[-300:])
            if s3 is not None:
                stats = s3_rows(s3, "", ("S3", "S3 (loopback moto)"), skip, B, binary, opts, scratch, caches, mounts,
                                res, n_batches)
                if stats is not None:
                    meta["tensorfs_cold_s3_stats"] = stats
                # The same server as a remote store looks (issue 51's 2x PyArrow on S3): a
                # round trip per request and a cap per connection, which loopback has neither of.
                if "pyarrow" not in skip and "tensorfs" not in skip and a.remote_mb_s > 0:
                    meta["s3_remote"] = remote_rows(s3, a, binary, opts, scratch, caches, mounts, res, n_batches)
                if "petastorm" not in skip:
                    # Petastorm's twin dataset on the same server, read through s3:// (s3fs) by a
                    # fresh reader without a cache, configured as its file:// row.
                    label = "petastorm make_batch_reader, S3"
                    prefix = f"{s3.PREFIX}-petastorm"
                    client = None
                    try:
                        if pet_py is None:
                            raise RuntimeError(pet_err or "petastorm did not run from file://")
                        err = petastorm_s3fs(pet_py)
                        if err:
                            raise RuntimeError(err)
                        client = s3.client()
                        for p in parquet_files(pdata):
                            client.upload_file(str(p), s3.BUCKET, f"{prefix}/{p.name}")
                        e = petastorm_epochs(pet_py, f"s3://{s3.BUCKET}/{prefix}", a, endpoint=s3.url)[0]
                        res.add("petastorm_s3", label, e["rows"], e["bytes"], e["seconds"])
                        pet_first["s3"] = e["first_s"]
                    except Exception as e:  # any failure: say so and go on
                        res.unavailable("petastorm_s3", label, str(e)[-300:])
                    # Off the server again, so the stall experiment finds it as before.
                    if client is not None:
                        s3.remove_prefix(client, prefix)
                if lim is not None and "tensorfs" not in skip:
                    try:
                        first_batch_s3(lim, binary, s3, scratch, caches, mounts, B,
                                       a.tensorfs_options.split(",") if a.tensorfs_options else [])
                    except Exception as e:  # any failure: say so and go on
                        log(f"time to first batch, S3: unavailable: {str(e)[-300:]}")
                # ---- 5b. many hosts: rank views of the S3 prefix, partitions=1 and =W ------------
                if "hosts" not in skip:
                    try:
                        hosts = hosts_rows(a, binary, s3, scratch, mounts)
                        meta["hosts"] = hosts
                    except Exception as e:  # any failure: say so and go on
                        hosts = {"unavailable": str(e)[-300:]}
                        meta["hosts"] = hosts
                        log(f"many hosts: unavailable: {hosts['unavailable']}")
                # ---- 5c. views: bytes fetched under where=, against PyArrow's filter ------------
                if "views" not in skip:
                    try:
                        views = views_rows(a, binary, s3, scratch, mounts)
                    except Exception as e:  # any failure: say so and go on
                        views = {"unavailable": str(e)[-300:]}
                        log(f"views: unavailable: {views['unavailable']}")
                    meta["views"] = views

        shutil.rmtree(pdata, ignore_errors=True)

        # ---- 6i. the cold epoch at the CPU of one decode: the daemon's core-s/GB against PyArrow's,
        # from file:// and from S3 (step 5's server) -----------------------------------------------
        if "coldcpu" not in skip and "tensorfs" not in skip:
            try:
                coldcpu = coldcpu_rows(a, binary, data, scratch, caches, mounts, s3,
                                       None if "s3" in skip else "the loopback S3 server did not start")
            except Exception as e:  # any failure: say so and go on
                coldcpu = {"unavailable": str(e)[-300:]}
                log(f"cold CPU: unavailable: {coldcpu['unavailable']}")
            meta["coldcpu"] = coldcpu

        # ---- 7. the stall experiment ----------------------------------------------------------
        if "stall" not in skip and "tensorfs" not in skip:
            cold = res.get("tfs_cold")
            if cold:
                log(f"stall experiment, file://: consumer at half of {cold['mb_s']:.1f} MB/s")
                for layout, shuffled in (("batch", False), ("all", False), ("batch", True), ("all", True)):
                    stalls.append(stall_experiment(binary, f"file://{data}", opts, scratch, caches, cold["mb_s"], n_batches,
                                                   "file", a.stall_prefetch, B, rg_first_rows, layout, shuffled))
            cold_s3 = res.get("tfs_cold_s3")
            if cold_s3 and s3 is not None:
                log(f"stall experiment, S3: consumer at half of {cold_s3['mb_s']:.1f} MB/s")
                stalls.append(stall_experiment(binary, s3.source, [*opts, *s3.mount_options()], scratch, caches,
                                               cold_s3["mb_s"], n_batches, "s3", a.stall_prefetch, B, rg_first_rows))
    finally:
        close_all(mounts, s3)
        if own_scratch and not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    meta["page_cache_dropped"] = bool(caches.works)
    if lim is not None:
        for store, t in pet_first.items():
            lim["first"].setdefault(store, {})["petastorm"] = t
    report(res, stalls, meta, a)
    if cpu is not None:
        print("\n" + "\n".join(print_cpu(cpu)))
    if lim is not None:
        print("\n" + "\n".join(print_limits(lim)))
    if coldcpu is not None:
        if "unavailable" in coldcpu:
            print(f"\nCold CPU: unavailable: {coldcpu['unavailable']}")
        else:
            print_coldcpu(coldcpu)
    if fair is not None:
        if "unavailable" in fair:
            print(f"\nFair batches: unavailable: {fair['unavailable']}")
        else:
            print_fairness(fair)
    if pds is not None:
        if "unavailable" in pds:
            print(f"\nPetastorm dataset (make_reader against tensorfs): unavailable: {pds['unavailable']}")
        else:
            print_petastorm_dataset(pds)
    if tr is not None:
        if "unavailable" in tr:
            print(f"\nYour own transform: unavailable: {tr['unavailable']}")
        else:
            print_transform(tr)
    if hosts is not None:
        if "unavailable" in hosts:
            print(f"\nMany hosts: unavailable: {hosts['unavailable']}")
        else:
            print_hosts(hosts)
    if views is not None:
        if "unavailable" in views:
            print(f"\nViews: unavailable: {views['unavailable']}")
        else:
            print_views(views)
    return 0


def s3_rows(s3, suffix, where, skip, batch_size, binary, opts, scratch, caches, mounts, res, n_batches) -> dict | None:
    """PyArrow and a cold tensorfs epoch on S3 server `s3` (rows keyed `pyarrow_s3SUFFIX` and
    `tfs_cold_s3SUFFIX`, labelled by `where`: PyArrow's and tensorfs's); tensorfs's counters."""
    pyarrow_label, tfs_label = f"pyarrow iter_batches+to_numpy, {where[0]}", f"tensorfs cold, {where[1]}"
    if "pyarrow" not in skip:
        try:
            fs = s3.pyarrow_fs()
            res.add(f"pyarrow_s3{suffix}", pyarrow_label,
                    *read_pyarrow(s3.parquet_keys(fs), batch_size, open_file=fs.open_input_file))
        except Exception as e:
            res.unavailable(f"pyarrow_s3{suffix}", pyarrow_label, str(e)[-300:])
    if "tensorfs" in skip:
        return None
    cache = scratch / f"cache-s3{suffix}"
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    stats = None
    try:
        m = Mount(binary, s3.source, scratch / f"mnt-s3{suffix}", [*opts, *s3.mount_options(), f"cache_dir={cache}"])
        mounts.append(m)
        res.add(f"tfs_cold_s3{suffix}", tfs_label, *read_safetensors_files(m.mnt / "epoch-0", n_batches))
        verify(m.mnt / "epoch-0", scratch / "npy", n_batches, f"tensorfs, {where[0]}")
        stats = m.stats()
        m.unmount()
        mounts.remove(m)
    except Exception as e:
        res.unavailable(f"tfs_cold_s3{suffix}", tfs_label, str(e)[-300:])
    shutil.rmtree(cache, ignore_errors=True)
    return stats


def remote_rows(s3, a, binary, opts, scratch, caches, mounts, res, n_batches) -> str | None:
    """PyArrow and a cold tensorfs epoch on S3 as a remote store looks (`S3Server.behind`); how
    it was made to look so."""
    where = ("S3 as remote", "S3 as remote")
    try:
        front = s3.behind(a.remote_mb_s * 1e6, a.remote_latency_ms / 1e3)
    except Exception as e:  # any failure: say so and go on
        res.unavailable("pyarrow_s3_remote", f"pyarrow iter_batches+to_numpy, {where[0]}", str(e)[-300:])
        res.unavailable("tfs_cold_s3_remote", f"tensorfs cold, {where[1]}", str(e)[-300:])
        return None
    log(f"S3 as a remote store: {front.how}")
    try:
        s3_rows(front, "_remote", where, set(), a.batch_size, binary, opts, scratch, caches, mounts, res, n_batches)
    finally:
        front.stop()
    return front.how


def main() -> int:
    ap = argparse.ArgumentParser(description="tensorfs benchmark driver (see scripts/bench)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows in the dataset (default 1000000: ~272 MB)")
    ap.add_argument("--size", help="dataset size instead of --rows, e.g. 2G (tensor bytes; 272 a row)")
    ap.add_argument("--batch-size", type=int, default=1024, help="rows per batch (default 1024, tensorfs's default)")
    ap.add_argument("--files", type=int, default=4, help="Parquet files (default 4)")
    ap.add_argument("--small-rows", type=int, default=2_000_000,
                    help="rows of the small-row dataset (80 bytes a row; default 2000000; 0 skips it)")
    ap.add_argument("--coldcpu-rows", type=int, default=8_000_000,
                    help="rows of the cold CPU section's 80-byte-row dataset (default 8000000: 640 MB of tensors, in "
                         "16 files of --row-group-rows groups; 0 leaves it out: the section then reads the bench's "
                         "272-byte rows only)")
    ap.add_argument("--row-group-rows", type=int, default=50_000, help="rows per row group (default 50000)")
    ap.add_argument("--out-dir", help="scratch directory (default: a new temporary directory, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary scratch directory")
    ap.add_argument("--png", default="bench.png", help="chart to write (default bench.png); '' for none")
    ap.add_argument("--json", help="also write every measurement as JSON here")
    ap.add_argument("--remote-mb-s", type=float, default=100,
                    help="the S3 rows again through a proxy capping each connection at this many MB/s "
                         "(default 100, about one connection to a remote store; 0 skips them)")
    ap.add_argument("--remote-latency-ms", type=float, default=20,
                    help="and holding each request this long (default 20 ms)")
    ap.add_argument("--skip", default="", help="comma-separated: npy,pyarrow,petastorm,petastorm-ds,s3,tensorfs,warm,all,shuffle,"
                    "small,stall,hosts,cpu,streaming,fairness,transform,limits,views,coldcpu (s3 skips every S3 row, Petastorm's, the many hosts', "
                    "the views' and the cold CPU section's S3 rows too; petastorm-ds, the dataset written by Petastorm, has its own tensorfs rows; hosts, "
                    "the many-hosts row, and views, bytes fetched under where=, run on S3; streaming also "
                    "leaves Streaming out of the fair-batches rows; petastorm also leaves Petastorm's rows out of the transform table)")
    ap.add_argument("--streaming-rows", type=int, default=20_000,
                    help="rows MosaicML Streaming reads beside the daemon CPU table (default 20000; 0: none)")
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "tensorfs"), help="tensorfs binary")
    ap.add_argument("--stall-prefetch", type=int, default=8, help="prefetch= of the stall experiment's mounts (default 8)")
    ap.add_argument("--tensorfs-options", default="", help="extra -o options for every mount")
    ap.add_argument("--no-drop-caches", action="store_true", help="never drop the page cache")
    ap.add_argument("--petastorm-python", help="an interpreter with a working petastorm")
    ap.add_argument("--no-side-venv", action="store_true",
                    help=f"if petastorm fails in .venv, do not build target/{SIDE_VENV.name} with versions it runs with")
    ap.add_argument("--petastorm-workers", type=int, default=10, help="petastorm workers_count (default 10, its default)")
    ap.add_argument("--petastorm-ds-rows", type=int, default=30_000,
                    help="rows of the dataset written by Petastorm (default 30000; 12356 tensor bytes a row)")
    ap.add_argument("--petastorm-ds-codec", choices=("png", "jpeg"), default="png",
                    help="its image codec (default png)")
    ap.add_argument("--petastorm-ds-batch-size", type=int, default=256,
                    help="rows per batch reading it (default 256)")
    ap.add_argument("--hosts", type=int, default=4,
                    help="simulated hosts W of the many-hosts row (default 4; it runs partitions=1 and partitions=W)")
    ap.add_argument("--transform-rows", type=int, default=500_000,
                    help="rows of the transform table (default 500000; 0 skips it; --files files of --row-group-rows groups)")
    ap.add_argument("--transform-workers", type=int, default=0,
                    help="transform_workers= and Petastorm's workers_count of the transform rows (default: the cores)")
    ap.add_argument("--transform-shuffle", default="",
                    help="shuffle= of the transform rows' mounts (default: tensorfs's default, block)")
    ap.add_argument("--petastorm-worker", help=argparse.SUPPRESS)
    ap.add_argument("--petastorm-cache", help=argparse.SUPPRESS)
    ap.add_argument("--petastorm-endpoint", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.size:
        s = a.size.strip().upper().rstrip("B").rstrip("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
        a.rows = max(1, int(float(s.rstrip("KMGT")) * mult) // ROW_BYTES)
    if a.petastorm_worker:
        petastorm_worker(a.petastorm_worker, a.rows, a.petastorm_cache, a.petastorm_workers, a.petastorm_endpoint)
        return 0
    if a.rows < 1 or a.batch_size < 1 or a.files < 1 or a.row_group_rows < 1 or a.hosts < 1:
        raise SystemExit("bench: --rows, --batch-size, --files, --row-group-rows and --hosts must be positive")
    try:
        return run(a)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
