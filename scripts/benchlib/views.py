"""Views (docs/views.md): the bytes a mount with `where=EXPR` fetches from S3, against the whole
table's and against PyArrow reading the same filter from the same server in the same run.

The table of its own: 10 days as hive directories (`day=1/` … `day=10/`), each of FILES_PER_DAY
Parquet files of int64 `id` (ascending through the days, so the row groups' statistics are
sorted), float32 `x` and float32[EMB] `emb`; --rows rows in all, row groups of --row-group-rows
rows or fewer, so that every file has at least RG_PER_FILE of them (a narrow range can then be
told from a whole file by statistics at any --rows).

Each row is one reader on a fresh start, behind tests/faultproxy.py in front of the loopback S3
server, its counters zeroed first: the listing, the footers and the columns all count. tensorfs:
a mount (`shuffle=none`, a fresh cache_dir) reading every tensor of `epoch-0/all/` cold, with
its own `remote_bytes` and `remote_requests` beside the proxy's; PyArrow:
`pyarrow.dataset.dataset(..., partitioning="hive").to_table(filter=..., columns=...)` on an
S3FileSystem pointed at the proxy. Both keep the same rows (checked by their ids).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file (scripts/benchlib/views.py): import the package it belongs to.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchlib"

from .common import MB, log  # noqa: E402
from .mounts import Mount, S3Server, close_all  # noqa: E402

DAYS, FILES_PER_DAY, RG_PER_FILE, EMB = 10, 2, 4, 16
TENSORS = ("id", "x", "emb")


def write_views_dataset(out: Path, rows: int, rg_rows: int) -> int:
    """ROWS rows as DAYS hive directories of FILES_PER_DAY files; the row-group size written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = DAYS * FILES_PER_DAY
    per_file = -(-rows // files)
    rg_rows = max(1, min(rg_rows, -(-per_file // RG_PER_FILE)))
    start = 0
    for f in range(files):
        n = min(per_file, rows - start)
        if n <= 0:
            break
        rng = np.random.default_rng(3000 + f)
        table = pa.table({
            "id": np.arange(start, start + n, dtype=np.int64),
            "x": rng.standard_normal(n, dtype=np.float32),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(EMB * n, dtype=np.float32)), EMB),
        })
        d = out / f"day={f // FILES_PER_DAY + 1}"
        d.mkdir(parents=True, exist_ok=True)
        # No dictionaries: of random floats, a row group's dictionary is as big as its values, and
        # its indices would come on top.
        pq.write_table(table, d / f"part-{f % FILES_PER_DAY:05d}.parquet", row_group_size=rg_rows,
                       compression="snappy", use_dictionary=False)
        start += n
    return rg_rows


def _fetched(proxy) -> dict:
    """What the proxy's clients fetched since its counters were zeroed."""
    st = proxy.stats()
    return {"bytes": st["bytes_forwarded"], "requests": st["requests"],
            "objects": sum(1 for k in st["keys"] if k.endswith(".parquet"))}


def _tensorfs(binary: Path, front, source: str, scratch: Path, mounts: list, options: list[str], where: str | None):
    """A cold mount reading every tensor of epoch-0/all/: (its row, the ids it served)."""
    import numpy as np

    cache = scratch / "cache-views"
    shutil.rmtree(cache, ignore_errors=True)
    front.proxy.reset_stats()
    m = Mount(binary, source, scratch / "mnt-views",
              [*options, *([f"where={where}"] if where else []), *front.mount_options(), f"cache_dir={cache}"])
    mounts.append(m)
    try:
        arrays = {t: np.load(m.mnt / "epoch-0" / "all" / f"{t}.npy") for t in TENSORS}
        # Anything the daemon still has in flight belongs to this read.
        m.settled("remote_bytes")
        st, info = m.stats(), m.dataset()
        row = {**_fetched(front.proxy), "rows": len(arrays["id"]),
               "remote_bytes": st.get("remote_bytes") or 0, "remote_requests": st.get("remote_requests") or 0,
               "where": info.get("where")}
    finally:
        m.unmount()
        mounts.remove(m)
        shutil.rmtree(cache, ignore_errors=True)
    return row, np.sort(arrays["id"])


def _pyarrow(front, prefix: str, expr):
    """pyarrow.dataset's to_table of the tensors with filter EXPR: (its row, the ids it read)."""
    import numpy as np
    import pyarrow.dataset as pads

    front.proxy.reset_stats()
    d = pads.dataset(f"{front.BUCKET}/{prefix}", filesystem=front.pyarrow_fs(), format="parquet", partitioning="hive")
    table = d.to_table(columns=list(TENSORS), filter=expr)
    row = {**_fetched(front.proxy), "rows": table.num_rows}
    return row, np.sort(table.column("id").to_numpy())


def run_rows(a, binary: Path, s3, scratch: Path, mounts: list) -> dict:
    """Every measurement of the views table, as a dict for print_rows and --json. The table is
    put on the server S3 under a prefix of its own, and taken off it again."""
    import numpy as np
    import pyarrow.dataset as pads

    data = scratch / "data-views"
    prefix = f"{s3.PREFIX}-views"
    shutil.rmtree(data, ignore_errors=True)
    rg_rows = write_views_dataset(data, a.rows, a.row_group_rows)
    files = sorted(data.rglob("*.parquet"))
    table_bytes = sum(p.stat().st_size for p in files)
    log(f"views: {a.rows} rows in {len(files)} files under {DAYS} day=N/ directories, {rg_rows}-row groups, "
        f"{table_bytes / MB:.1f} MB of Parquet")
    # About 2% of the rows, from the middle of a day: as with any range, the row group at either
    # end may be fetched whole though only part of it is kept.
    lo = a.rows * 45 // 100
    hi = lo + max(1, a.rows // 50) - 1
    F = pads.field
    filters = [
        ("whole table", None, None),
        ("day >= 8", "day >= 8", F("day") >= 8),
        (f"id between {lo} and {hi}", f"id between {lo} and {hi}", (F("id") >= lo) & (F("id") <= hi)),
    ]
    options = [f"batch_size={a.batch_size}", "shuffle=none", f"columns={':'.join(TENSORS)}"]
    if a.tensorfs_options:
        options += a.tensorfs_options.split(",")
    out = {"rows": a.rows, "files": len(files), "days": DAYS, "row_group_rows": rg_rows, "emb": EMB,
           "table_bytes": table_bytes, "options": ",".join(options), "filters": []}
    client = s3.client()
    front = None
    try:
        for p in files:
            client.upload_file(str(p), s3.BUCKET, f"{prefix}/{p.relative_to(data).as_posix()}")
        front = s3.behind()
        out["how"] = front.how
        source = f"s3://{s3.BUCKET}/{prefix}/"
        for name, where, expr in filters:
            tfs, tfs_ids = _tensorfs(binary, front, source, scratch, mounts, options, where)
            log(f"views: tensorfs, {name}: {tfs['rows']} rows, {tfs['bytes'] / MB:.1f} MB in {tfs['requests']} requests")
            pa_, pa_ids = _pyarrow(front, prefix, expr)
            log(f"views: pyarrow, {name}: {pa_['rows']} rows, {pa_['bytes'] / MB:.1f} MB in {pa_['requests']} requests")
            if not np.array_equal(tfs_ids, pa_ids):
                raise RuntimeError(f"views: {name}: tensorfs kept {len(tfs_ids)} rows, pyarrow {len(pa_ids)}, "
                                   "not the same ids")
            out["filters"].append({"name": name, "where": where, "tensorfs": tfs, "pyarrow": pa_})
    finally:
        if front is not None:
            front.stop()
        s3.remove_prefix(client, prefix)
        shutil.rmtree(data, ignore_errors=True)
    return out


def print_rows(vr: dict) -> None:
    total = vr["table_bytes"]
    print(f"\nViews: bytes fetched from S3 under where=: {vr['rows']} rows of int64 id (ascending), float32 x, "
          f"float32[{vr['emb']}] emb in {vr['files']} files under day=1/ … day={vr['days']}/, {vr['row_group_rows']}-row "
          f"groups, {total / MB:.1f} MB of Parquet.")
    print(f"Each reader from a fresh start, every tensor column: tensorfs ({vr['options']}) reading epoch-0/all/ cold; "
          "pyarrow.dataset(partitioning='hive').to_table(filter=...).")
    print(f"Fetched: response bytes and requests through {vr['how']}, listings and footers included; objects: "
          "Parquet objects any byte was fetched of; x table: fetched / the table's bytes; remote: tensorfs's own "
          "remote_bytes and remote_requests")
    head = (f"{'reader, filter':<42}{'rows kept':>11}{'MB fetched':>12}{'requests':>10}{'objects':>9}{'x table':>9}"
            f"{'remote MB':>11}{'remote req':>12}")
    print(head)
    print("-" * len(head))
    for f in vr["filters"]:
        for who in ("tensorfs", "pyarrow"):
            r = f[who]
            what = f"where={f['where']}" if who == "tensorfs" and f["where"] else f["name"]
            own = (f"{r['remote_bytes'] / MB:>11.2f}{r['remote_requests']:>12}" if who == "tensorfs"
                   else f"{'':>11}{'':>12}")
            print(f"{f'{who}, {what}':<42}{r['rows']:>11}{r['bytes'] / MB:>12.2f}{r['requests']:>10}{r['objects']:>9}"
                  f"{r['bytes'] / total:>9.3f}" + own)
    print("-" * len(head))
    print("tensorfs / pyarrow, bytes fetched: " + "; ".join(
        f"{f['name']} {f['tensorfs']['bytes'] / f['pyarrow']['bytes']:.2f}x" for f in vr["filters"] if f["pyarrow"]["bytes"]))
    for f in vr["filters"]:
        w = f["tensorfs"].get("where")
        if w:
            print(f"tensorfs where={f['where']}: {w.get('rows')} rows kept; ruled out before their footers: "
                  f"{w.get('objects_ruled_out')} objects; by statistics: {w.get('row_groups_ruled_out')} row groups "
                  f"({w.get('row_groups_kept_whole')} kept whole); {w.get('row_groups_read')} row groups read to decide")


def main() -> int:
    import argparse
    import tempfile

    from .common import REPO

    ap = argparse.ArgumentParser(description="tensorfs benchmark, views alone: bytes fetched from S3 under where= "
                                             "(scripts/bench.py runs it too, unless --skip views)")
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "tensorfs"), help="tensorfs binary")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows in the table (default 1000000: ~77 MB of Parquet)")
    ap.add_argument("--row-group-rows", type=int, default=50_000,
                    help=f"rows per row group at most (default 50000; fewer where a file would have under {RG_PER_FILE})")
    ap.add_argument("--batch-size", type=int, default=1024, help="batch_size= of the mounts (default 1024)")
    ap.add_argument("--tensorfs-options", default="", help="extra -o options for every mount")
    ap.add_argument("--out-dir", help="scratch directory (default: a new temporary directory, removed after)")
    a = ap.parse_args()
    binary = Path(a.bin).resolve()
    if not binary.exists():
        raise SystemExit(f"views: {binary} is missing (build it: cargo build --release)")
    scratch = Path(a.out_dir or tempfile.mkdtemp(prefix="tensorfs-bench-views-")).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    mounts: list[Mount] = []
    s3 = None
    try:
        s3 = S3Server(None, scratch)
        vr = run_rows(a, binary, s3, scratch, mounts)
    finally:
        close_all(mounts, s3)
        if a.out_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print_rows(vr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
