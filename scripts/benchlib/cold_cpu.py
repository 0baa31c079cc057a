"""The cold epoch at the CPU of one decode (issue 62): the daemon's CPU per GB of a cold epoch,
against PyArrow decoding the same files into the same NumPy arrays.

A cold epoch decodes every row group once; PyArrow's `iter_batches` + `to_numpy` does that decode
and nothing else, so its CPU per GB delivered is what one decode costs. The issue's targets: the
daemon's core-seconds per GB of a cold epoch at most 1.5x PyArrow's, and the epoch delivered at
least as fast as PyArrow (1x its MB/s).

Two datasets of int64 `id`, float32 `x`, float32[EMB] `emb` and int32 `label`, snappy, row groups
of --row-group-rows rows: 80-byte rows (EMB 16; --coldcpu-rows rows, 8,000,000 by default: 640 MB
of tensors, in FILES files, written here), where the cost per row (per value) weighs most, and the
bench's own dataset of 272-byte rows (EMB 64; --rows rows in --files files), reused as it is.

Each from two stores: file:// (the files on local disk) and, unless --skip s3, S3: the same
files on the bench's loopback S3 server (moto, `mounts.S3Server`, as the bench's S3 rows: its
bucket, credentials and endpoint options), the 272-byte rows where the bench put them (under its
PREFIX), the 80-byte rows put under PREFIX-coldcpu/ for these rows and taken off again. On S3,
PyArrow opens each object (BUCKET/PREFIX/NAME, named by the driver) with open_input_file of a
pyarrow.fs.S3FileSystem on that endpoint (`mounts.pyarrow_s3_fs`, as `S3Server.pyarrow_fs`; made
before the reader's window opens, as its imports), and tensorfs mounts s3://BUCKET/PREFIX/ with
the endpoint's options (`S3Server.mount_options`). The server's own CPU is neither's.

Each read runs in a fresh Python process of its own, whose CPU is its own resource.getrusage
(RUSAGE_SELF: user + sys, every thread) from after its imports to its last batch, and its wall
time the same window; the page cache is dropped first (when we are root):

  pyarrow           every file through pq.ParquetFile(f).iter_batches(batch_size=B), every column
                    converted to NumPy (`dataset.column_arrays`, the fixed-size list flattened
                    and reshaped), as the bench's pyarrow rows (`methods.read_pyarrow`); on S3,
                    f = fs.open_input_file(key), as the bench's pyarrow S3 row
  tensorfs cold     a mount (file://DATA or s3://BUCKET/PREFIX/, a fresh cache_dir, the default
                    options: shuffle=block; epochs=1) read by a process that memory-maps
                    epoch-0/all/NAME.npy of every tensor and copies out batch after batch of B
                    rows (`np.array(a[i:i + B])`), as tensorfs.numpy does
                    (`methods.read_npy_slices`)
  tensorfs epoch 1  right after, the same way: the next epoch, gathered from the columns the cold
                    epoch cached (not listed by epochs=1, but resolved by name), page cache warm

The daemon's CPU is its processes' CPU clocks (every thread, ended ones too; `cpu.daemon_cpu_s`),
which count from the daemon's start, plus the `tensorfs mount` command's own (it forks the
daemon and exits) and any descendant's: from the mount command to the epoch's last batch. It is
also read once the daemon's work has settled (`cpu.settle`: anything it left for after the
epoch), and its own counters split it: decoding (decode_cpu_ns), gathering batches
(gather_cpu_ns), writing files (batch_write_cpu_ns), and the rest (serving the reads, caching).
core-s/GB: core-seconds per GB of tensor bytes delivered (rows x row bytes). The cold MB/s is the
reader's window, as PyArrow's (the mount command's time is given apart).

A consumer at half PyArrow's cold rate (`stall.stall_experiment`, as the stall section's rows)
reads a cold epoch of the 80-byte rows with the default options (shuffle=block, prefetch=8):
each batch's rows of every epoch-0/all/NAME.npy (each opened once), and, apart, each batch file
(opened and read whole), then sleeps for the time that batch takes at that rate. Its wait beyond
its own copy (the same reads at the same pace once everything is built) is what §6 bounds at 1%
of the epoch.

Run as a module (`python -m benchlib.cold_cpu pyarrow|pyarrow-s3|slices …`) it is one of those
readers, printing one JSON line; imported by bench.py it drives them (after the bench's S3 rows,
on their server).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import MB, REPO, log
from .cpu import daemon_cpu_s, settle
from .dataset import parquet_files, write_dataset
from .mounts import Mount, pyarrow_s3_fs
from .stall import stall_experiment

FILES = 16  # files of the 80-byte dataset
PARTS = ("decode_cpu_ns", "gather_cpu_ns", "batch_write_cpu_ns")


def row_bytes(emb: int) -> int:
    return 8 + 4 + 4 * emb + 4


# --------------------------------------------------------------------------------------------
# In a reader process of its own
# --------------------------------------------------------------------------------------------


def reader_main(argv: list[str]) -> None:
    """`pyarrow B FILE…`, `pyarrow-s3 URL B KEY…` (BUCKET/KEY on the loopback S3 server at URL)
    or `slices ALL_DIR ROWS B`: one pass, its CPU and wall; one JSON line."""
    import numpy  # noqa: F401  (imported before the window opens)
    import pyarrow.parquet  # noqa: F401

    from .methods import read_npy_slices, read_pyarrow

    kind = argv[0]
    fs = pyarrow_s3_fs(argv[1]) if kind == "pyarrow-s3" else None  # made before the window opens
    before = resource.getrusage(resource.RUSAGE_SELF)
    if kind == "pyarrow":
        rows, nbytes, seconds = read_pyarrow([Path(p) for p in argv[2:]], int(argv[1]))
    elif kind == "pyarrow-s3":
        rows, nbytes, seconds = read_pyarrow(argv[3:], int(argv[2]), open_file=fs.open_input_file)
    elif kind == "slices":
        rows, nbytes, seconds = read_npy_slices(Path(argv[1]), int(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"cold_cpu: unknown reader {kind}")
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    print(json.dumps({"rows": rows, "bytes": nbytes, "seconds": seconds, "cpu_s": user + sys_,
                      "user_s": user, "sys_s": sys_}), flush=True)


def run_reader(*args) -> dict:
    """A reader process (reader_main) run to its end: its JSON line, with core-s/GB and MB/s."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "benchlib.cold_cpu", *map(str, args)],
                       capture_output=True, text=True, timeout=3600, env=env, stdin=subprocess.DEVNULL)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
        raise RuntimeError(f"cold_cpu reader {args[0]}: {tail[-1] if tail else f'exit {r.returncode}'}")
    out = json.loads(lines[-1])
    out["core_s_gb"] = out["cpu_s"] / (out["bytes"] / 1e9)
    out["mb_s"] = out["bytes"] / MB / out["seconds"]
    return out


# --------------------------------------------------------------------------------------------
# In the bench's process: the driver
# --------------------------------------------------------------------------------------------


def children_cpu_s(pids: list[int]) -> float:
    """CPU seconds of the live descendants of PIDS that are not PIDS themselves (a transform's
    workers; none without one), in ticks."""
    from .transform import cpu_ticks

    _, below = cpu_ticks(pids)
    return sum(below.values()) / os.sysconf("SC_CLK_TCK")


def daemon_total_s(m: Mount, mount_cmd_s: float) -> float:
    return daemon_cpu_s(m.pids) + children_cpu_s(m.pids) + mount_cmd_s


def reader_row(r: dict) -> dict:
    """A tensorfs reader's JSON line, its core-s/GB named as the reader's (beside the daemon's)."""
    return {("reader_core_s_gb" if k == "core_s_gb" else k): v for k, v in r.items()}


def parts(before: dict, after: dict, cpu_s: float) -> dict:
    """The daemon's CPU seconds by its own counters, and the rest of CPU_S."""
    out = {k.removesuffix("_cpu_ns"): (after.get(k, 0) - before.get(k, 0)) / 1e9 for k in PARTS}
    out["rest"] = cpu_s - sum(out.values())
    return out


def variant(name: str, data: Path, rows: int, emb: int, binary: Path, scratch: Path, caches, mounts: list,
            batch_size: int, extra: list[str], s3=None, prefix: str = "") -> dict:
    """PyArrow, then tensorfs's cold epoch and epoch 1, of the dataset in DATA: from file://, or,
    where S3 (an `S3Server`) is given, the same files on that server under PREFIX."""
    import numpy as np
    import pyarrow.parquet as pq

    files = parquet_files(data)
    md = [pq.ParquetFile(p).metadata for p in files]
    store = "file://" if s3 is None else "S3"
    out = {"name": name, "store": store, "rows": rows, "row_bytes": row_bytes(emb),
           "tensor_bytes": rows * row_bytes(emb), "files": len(files), "row_groups": sum(x.num_row_groups for x in md),
           "parquet_bytes": sum(p.stat().st_size for p in files)}
    label = f"{name}, {rows:,} rows, {store}"

    caches.drop()
    if s3 is None:
        pa_ = out["pyarrow"] = run_reader("pyarrow", batch_size, *files)
        source, where = f"file://{data}", []
    else:
        pa_ = out["pyarrow"] = run_reader("pyarrow-s3", s3.url, batch_size,
                                          *(f"{s3.BUCKET}/{prefix}/{p.name}" for p in files))
        source, where = f"s3://{s3.BUCKET}/{prefix}/", s3.mount_options()
        out["source"] = source
    log(f"coldcpu: {label}: pyarrow {pa_['core_s_gb']:.2f} core-s/GB, {pa_['mb_s']:.0f} MB/s")

    cache = scratch / "cache-coldcpu"
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    m = Mount(binary, source, scratch / "mnt-coldcpu", [f"batch_size={batch_size}", "epochs=1", *where,
                                                        f"cache_dir={cache}", *extra])
    mount_s = time.perf_counter() - t
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The mount command's process (reaped: in RUSAGE_CHILDREN), which forked the daemon.
    mount_cmd_s = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    mounts.append(m)
    try:
        cold = run_reader("slices", m.mnt / "epoch-0" / "all", rows, batch_size)
        end = daemon_total_s(m, mount_cmd_s)
        settled = settle(m.pids) + children_cpu_s(m.pids) + mount_cmd_s
        stats1 = m.stats()
        gb = cold["bytes"] / 1e9
        tf = out["tensorfs"] = {
            **reader_row(cold), "mount_s": mount_s, "mount_cmd_cpu_s": mount_cmd_s,
            "daemon_cpu_s": end, "daemon_core_s_gb": end / gb,
            "daemon_settled_cpu_s": settled, "daemon_settled_core_s_gb": settled / gb,
            "daemon_parts_s": parts({}, stats1, settled),
            "row_groups_decoded": stats1.get("row_groups_decoded"),
            "cache_written_bytes": stats1.get("cache_written_bytes"),
        }
        log(f"coldcpu: {label}: tensorfs cold, daemon {tf['daemon_core_s_gb']:.2f} core-s/GB "
            f"({tf['daemon_settled_core_s_gb']:.2f} settled), reader {tf['reader_core_s_gb']:.2f}, "
            f"{tf['mb_s']:.0f} MB/s; {tf['row_groups_decoded']} of {out['row_groups']} row groups decoded")

        # Epoch 1, right after: gathered from the columns the cold epoch cached.
        before = daemon_total_s(m, mount_cmd_s)
        e1 = run_reader("slices", m.mnt / "epoch-1" / "all", rows, batch_size)
        after = settle(m.pids) + children_cpu_s(m.pids) + mount_cmd_s
        stats2 = m.stats()
        out["epoch1"] = {**reader_row(e1), "daemon_cpu_s": after - before,
                         "daemon_core_s_gb": (after - before) / (e1["bytes"] / 1e9),
                         "daemon_parts_s": parts(stats1, stats2, after - before),
                         "row_groups_decoded": stats2.get("row_groups_decoded", 0) - stats1.get("row_groups_decoded", 0)}
        log(f"coldcpu: {label}: tensorfs epoch 1, daemon {out['epoch1']['daemon_core_s_gb']:.2f} core-s/GB, "
            f"reader {e1['core_s_gb']:.2f}, {e1['mb_s']:.0f} MB/s")

        # Outside every window: both epochs delivered every row once.
        for e in (0, 1):
            ids = np.sort(np.load(m.mnt / f"epoch-{e}" / "all" / "id.npy"))
            if not np.array_equal(ids, np.arange(rows)):
                raise RuntimeError(f"coldcpu: {label}: epoch {e}'s all/id.npy is not a permutation of the rows")
    finally:
        m.unmount()
        mounts.remove(m)
        shutil.rmtree(cache, ignore_errors=True)
    out["daemon_x_pyarrow"] = out["tensorfs"]["daemon_core_s_gb"] / pa_["core_s_gb"]
    out["mb_s_x_pyarrow"] = out["tensorfs"]["mb_s"] / pa_["mb_s"]
    return out


def mapped_reads(data: Path, rows: int, binary: Path, scratch: Path, caches, mounts: list, batch_size: int,
                 extra: list[str]) -> dict:
    """Memory-mapped all/ reads over the epochs after the cold one, against the same files read
    the same way from local disk (their copy, in the page cache): a mount with epochs=3 on a fresh
    cache_dir, its epoch 0 read cold, then epoch 1 right after (built ahead only as far as the
    cold epoch let it), epoch 0 again (warm: the mount's page cache), and epoch 2 once it is built
    ahead (the daemon's count of files built ahead settled). Each read a fresh
    process (`read_npy_slices`), the best of three for the warm rows."""
    cache, local = scratch / "cache-mapped", scratch / "local-mapped"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(local, ignore_errors=True)
    caches.drop()
    m = Mount(binary, f"file://{data}", scratch / "mnt-mapped", [f"batch_size={batch_size}", "epochs=3",
                                                                  f"cache_dir={cache}", *extra])
    mounts.append(m)
    out = {}
    try:
        epoch = lambda e: m.mnt / f"epoch-{e}" / "all"  # noqa: E731
        best = lambda d: max(run_reader("slices", d, rows, batch_size)["mb_s"] for _ in range(3))  # noqa: E731
        out["cold"] = run_reader("slices", epoch(0), rows, batch_size)["mb_s"]
        out["next"] = run_reader("slices", epoch(1), rows, batch_size)["mb_s"]
        shutil.copytree(epoch(0), local)
        out["local"] = best(local)
        out["warm"] = best(epoch(0))
        # Epoch 2's files, built ahead from epoch 1's first read on: read once their builds end.
        m.settled("ahead_files_built")
        out["built"] = best(epoch(2))
        log(f"coldcpu: mapped reads, 80-byte rows: local {out['local']:.0f} MB/s; warm {out['warm']:.0f}, "
            f"next epoch right after {out['next']:.0f}, built ahead {out['built']:.0f}, cold {out['cold']:.0f}")
    finally:
        m.unmount()
        mounts.remove(m)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    return out


def s3_variant(name: str, data: Path, rows: int, emb: int, binary: Path, scratch: Path, caches, mounts: list,
               batch_size: int, extra: list[str], s3, prefix: str, upload: bool) -> dict:
    """`variant` of DATA's files on server S3 under PREFIX: put there first where UPLOAD (and
    taken off again), else already there. A failure is the row's, said in it."""
    client = s3.client() if upload else None
    try:
        if upload:
            for p in parquet_files(data):
                client.upload_file(str(p), s3.BUCKET, f"{prefix}/{p.name}")
        return variant(name, data, rows, emb, binary, scratch, caches, mounts, batch_size, extra, s3, prefix)
    except Exception as e:  # any failure: say so and go on
        log(f"coldcpu: {name}, S3: unavailable: {str(e)[-300:]}")
        return {"name": name, "store": "S3", "rows": rows, "unavailable": str(e)[-300:]}
    finally:
        if client is not None:
            s3.remove_prefix(client, prefix)


def run_rows(a, binary: Path, data: Path, scratch: Path, caches, mounts: list, s3=None,
             s3_unavailable: str | None = None) -> dict:
    """Every measurement of the section, as a dict for print_rows and --json: the 80-byte dataset
    (written here, removed after) and the bench's own in DATA, from file://, then, where S3 (the
    bench's `S3Server`, holding DATA's files under its PREFIX) is given, from S3; S3_UNAVAILABLE:
    why there is none though S3 was not skipped."""
    extra = a.tensorfs_options.split(",") if a.tensorfs_options else []
    out = {"batch_size": a.batch_size, "row_group_rows": a.row_group_rows, "variants": []}
    if s3 is not None:
        out["s3"] = s3.how
    elif s3_unavailable:
        out["s3_unavailable"] = s3_unavailable
    if a.coldcpu_rows > 0:
        small = scratch / "data-coldcpu"
        shutil.rmtree(small, ignore_errors=True)
        log(f"coldcpu: writing {a.coldcpu_rows} rows of {row_bytes(16)} bytes as {FILES} Parquet files, "
            f"{a.row_group_rows}-row groups")
        write_dataset(small, a.coldcpu_rows, FILES, a.row_group_rows, emb_dim=16)
        try:
            out["variants"].append(variant("80-byte rows", small, a.coldcpu_rows, 16, binary, scratch, caches, mounts,
                                           a.batch_size, extra))
            out["mapped"] = mapped_reads(small, a.coldcpu_rows, binary, scratch, caches, mounts, a.batch_size, extra)
            half_of = out["variants"][-1]["pyarrow"]["mb_s"]
            out["stalls"] = [stall_experiment(binary, f"file://{small}", [f"batch_size={a.batch_size}", *extra], scratch,
                                              caches, half_of, -(-a.coldcpu_rows // a.batch_size), "80-byte rows", 8,
                                              a.batch_size, first_rows(small), layout)
                             for layout in ("all", "batch")]
            if s3 is not None:
                out["variants"].append(s3_variant("80-byte rows", small, a.coldcpu_rows, 16, binary, scratch, caches,
                                                  mounts, a.batch_size, extra, s3, f"{s3.PREFIX}-coldcpu", True))
        finally:
            shutil.rmtree(small, ignore_errors=True)
    out["variants"].append(variant("272-byte rows", data, a.rows, 64, binary, scratch, caches, mounts, a.batch_size,
                                   extra))
    if s3 is not None:
        out["variants"].append(s3_variant("272-byte rows", data, a.rows, 64, binary, scratch, caches, mounts,
                                          a.batch_size, extra, s3, s3.PREFIX, False))
    out["page_cache_dropped"] = bool(caches.works)
    return out


def first_rows(data: Path) -> list[int]:
    """The first row of each row group of the dataset in DATA, in the mount's order."""
    import pyarrow.parquet as pq

    out, at = [], 0
    for f in parquet_files(data):
        md = pq.ParquetFile(f).metadata
        for g in range(md.num_row_groups):
            out.append(at)
            at += md.row_group(g).num_rows
    return out


def print_rows(cc: dict) -> None:
    print(f"\nCold CPU (issue 62): the daemon's core-seconds per GB of a cold epoch against PyArrow's decode of the same "
          f"files; targets: daemon <= 1.5x PyArrow's core-s/GB, MB/s >= 1x PyArrow's. Batches of {cc['batch_size']} "
          f"rows, {cc['row_group_rows']}-row groups, snappy; each reader a fresh process (its own getrusage), page "
          f"cache dropped first: {'yes' if cc['page_cache_dropped'] else 'no'}.")
    print("PyArrow: iter_batches + to_numpy of every column; tensorfs: mount -o epochs=1 (shuffle=block) on a fresh "
          "cache_dir, epoch-0/all/NAME.npy memory-mapped and copied out batch by batch; daemon: from the mount "
          "command to the epoch's last batch.")
    if "s3" in cc:
        print(f"S3: the same files on the bench's loopback S3 server ({cc['s3']}); PyArrow through "
              "pyarrow.fs.S3FileSystem, tensorfs mounting s3://BUCKET/PREFIX/; the server's CPU is neither's.")
    elif cc.get("s3_unavailable"):
        print(f"S3: unavailable: {cc['s3_unavailable']}")
    if "mapped" in cc:
        mr = cc["mapped"]
        print(f"memory-mapped all/ reads of the 80-byte rows (epochs=3, file://), against the same files read the same "
              f"way from local disk ({mr['local']:.0f} MB/s, page cache): warm epoch 0 {mr['warm']:.0f} MB/s "
              f"({mr['warm'] / mr['local']:.2f}x; target 0.95x), epoch 1 right after the cold epoch {mr['next']:.0f} "
              f"({mr['next'] / mr['local']:.2f}x; target 0.6x), epoch 2 built ahead {mr['built']:.0f} "
              f"({mr['built'] / mr['local']:.2f}x)")
    for st in cc.get("stalls", []):
        print(f"stall, {st['name']}, cold epoch, the default shuffle: a consumer at {st['consumer_mb_s']:.0f} MB/s (half "
              f"PyArrow's cold rate) blocked {100 * st['blocked_share']:.2f}% of the epoch after batch 0, "
              f"{100 * st['excess_share']:.2f}% beyond its own copy (target < 1%); worst read "
              f"{st['max_wait_ms']:.1f} ms, {st['slow_batches']} over 2 ms")
    for v in cc["variants"]:
        store = v.get("store", "file://")
        if "unavailable" in v:
            print(f"cold CPU, {v['name']}, {v['rows']:,} rows, {store}: unavailable: {v['unavailable']}")
            continue
        pa_, tf, e1 = v["pyarrow"], v["tensorfs"], v["epoch1"]
        print(f"cold CPU, {v['name']}, {v['rows']:,} rows, {store}: PyArrow {pa_['core_s_gb']:.2f} core-s/GB "
              f"({pa_['mb_s']:.0f} MB/s); tensorfs daemon {tf['daemon_core_s_gb']:.2f} core-s/GB "
              f"({v['daemon_x_pyarrow']:.2f}x), reader {tf['reader_core_s_gb']:.2f} core-s/GB, {tf['mb_s']:.0f} MB/s "
              f"({v['mb_s_x_pyarrow']:.2f}x)")
        gb = tf["bytes"] / 1e9
        split = ", ".join(f"{k} {s / gb:.2f}" for k, s in tf["daemon_parts_s"].items())
        print(f"  {v['tensor_bytes'] / MB:.0f} MB of tensors, {v['parquet_bytes'] / MB:.0f} MB of Parquet in "
              f"{v['files']} files; {tf['row_groups_decoded']} of {v['row_groups']} row groups decoded; mount command "
              f"{tf['mount_s']:.2f} s; daemon once settled {tf['daemon_settled_core_s_gb']:.2f} core-s/GB, by its "
              f"counters: {split}")
        print(f"  epoch 1 right after (from the cached columns): daemon {e1['daemon_core_s_gb']:.2f} core-s/GB, "
              f"reader {e1['reader_core_s_gb']:.2f} core-s/GB, {e1['mb_s']:.0f} MB/s ({e1['mb_s'] / pa_['mb_s']:.2f}x "
              f"PyArrow), {e1['row_groups_decoded']} row groups decoded")


if __name__ == "__main__":
    reader_main(sys.argv[1:])
