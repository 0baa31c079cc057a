"""Fair batches (PRODUCT.md §5 "Fair batches", issue 47): how fair a sample of the table each
batch is, for tensorfs's shuffle modes and for MosaicML Streaming's default shuffle.

A batch's unfairness is the Kolmogorov-Smirnov distance between its rows' canonical positions
(row index ÷ rows) and the uniform distribution on [0, 1); the measure is its mean over the full
batches of epoch 1. Its own dataset (an int64 `id` that is the canonical row, nothing else): 400,000
rows in 40 objects of 10,000 rows, each 5 row groups of 2,000, read in batches of 1,000.

- P=1: tensorfs `shuffle=block` (the default), `window` and `global` on a fresh mount each,
  `epoch-1/all/id.npy` memory-mapped and cut into batches; against Streaming's `py1e` over
  shards the size of the row groups (200 of 2,000 rows), one canonical node.
- P=8: the same modes with `partitions=8,world_size=8`, every rank view's batches
  (`epoch-1/rank-R-of-8/all/id.npy`); against `py1e` over shards the size of the objects (40 of
  10,000 rows), 8 canonical nodes, each node's contiguous eighth of the order cut into batches.

Streaming's order is its plain function `streaming.base.shuffle.get_shuffle("py1e", shard_sizes,
num_canonical_nodes, seed, epoch, block_size)`, with the block StreamingDataset defaults to,
max(4,000,000 / nodes, 262,144), and its default seed: no MDS files. It runs in Streaming's side
venv (streaming_side.py), since importing any part of the package imports torch and more.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROWS, OBJECTS, RG_ROWS, BATCH, P = 400_000, 40, 2_000, 1_000, 8
MODES = ("block", "window", "global")
STREAMING_SEED = 9176  # StreamingDataset's default shuffle_seed
EPOCH = 1


def write(out: Path) -> None:
    """OBJECTS objects of ROWS/OBJECTS rows in RG_ROWS-row groups; `id` is the canonical row (keys
    sort in row order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    per = ROWS // OBJECTS
    for f in range(OBJECTS):
        ids = np.arange(f * per, (f + 1) * per, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), out / f"part-{f:05d}.parquet", row_group_size=RG_ROWS)


def batch_ks(ids, rows: int, batch_size: int):
    """The KS distance from uniform of each full batch of IDS (an order of canonical rows)."""
    import numpy as np

    n = len(ids) // batch_size
    x = np.sort(np.asarray(ids[:n * batch_size], dtype=np.float64).reshape(n, batch_size) / rows, axis=1)
    k = np.arange(batch_size + 1) / batch_size
    # The empirical CDF is k/B just after the k-th smallest point: the largest gap either side.
    return np.maximum((k[1:] - x).max(axis=1), (x - k[:-1]).max(axis=1))


def tensorfs_ks(binary: Path, data: Path, scratch: Path, mounts: list, mode: str, partitions: int) -> dict:
    """Mean KS of epoch 1's full batches on a fresh mount: the epoch directory (P=1), or every
    rank view's batches (P>1, world_size=P)."""
    import numpy as np

    from .mounts import Mount

    cache = scratch / f"cache-fair-{mode}-p{partitions}"
    shutil.rmtree(cache, ignore_errors=True)
    opts = [f"batch_size={BATCH}", f"shuffle={mode}", "epochs=2", f"cache_dir={cache}"]
    if partitions > 1:
        opts += [f"partitions={partitions}", f"world_size={partitions}"]
    m = Mount(binary, f"file://{data}", scratch / "mnt-fair", opts)
    mounts.append(m)
    try:
        dj = m.dataset()
        views = [f"epoch-{EPOCH}"] if partitions == 1 else [
            f"epoch-{EPOCH}/rank-{r}-of-{partitions}" for r in range(partitions)]
        ks = []
        for v in views:
            ids = np.array(np.load(m.mnt / v / "all" / "id.npy", mmap_mode="r"))
            # The epoch directory is a permutation of the rows: else `id` is no canonical row.
            if partitions == 1 and not np.array_equal(np.sort(ids), np.arange(ROWS)):
                raise RuntimeError(f"shuffle={mode}: {v} is no permutation of the rows")
            ks.append(batch_ks(ids, ROWS, BATCH))
        ks = np.concatenate(ks)
        return {"mean_ks": float(ks.mean()), "batches": len(ks), "shuffle_block_rows": dj.get("shuffle_block_rows"),
                "views": len(views)}
    finally:
        m.unmount()
        mounts.remove(m)
        shutil.rmtree(cache, ignore_errors=True)


def streaming_order_ks(shard_sizes: list[int], nodes: int) -> dict:
    """Runs under Streaming's interpreter: mean KS of py1e's epoch, each node's section batched."""
    import warnings

    import numpy as np

    warnings.simplefilter("ignore")
    from streaming.base.shuffle import get_shuffle

    block = max(4_000_000 // nodes, 1 << 18)
    order = get_shuffle("py1e", np.array(shard_sizes, np.int64), nodes, STREAMING_SEED, EPOCH, block)
    rows = int(sum(shard_sizes))
    assert np.array_equal(np.sort(order), np.arange(rows)), "py1e's order is no permutation"
    # Node k's samples: the k-th contiguous 1/nodes of the global order.
    cuts = [rows * k // nodes for k in range(nodes + 1)]
    ks = np.concatenate([batch_ks(order[a:b], rows, BATCH) for a, b in zip(cuts, cuts[1:])])
    return {"mean_ks": float(ks.mean()), "batches": len(ks), "block": block}


def streaming_ks(cases: list[tuple[list[int], int]]) -> list[dict]:
    """The Streaming rows for each (shard sizes, nodes), or each {"skipped": why}. One process
    for all: importing streaming takes seconds."""
    from .common import REPO
    from .streaming_side import streaming_python

    py, note = streaming_python()
    if py is None:
        return [{"skipped": note}] * len(cases)
    r = subprocess.run([str(py), "-m", "benchlib.fairness", json.dumps(cases)],
                       cwd=REPO / "scripts", capture_output=True, text=True)
    if r.returncode != 0:
        return [{"skipped": (r.stderr.strip().splitlines() or ["?"])[-1]}] * len(cases)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_rows(binary: Path, scratch: Path, mounts: list, streaming: bool) -> dict:
    import pyarrow.parquet as pq

    from .common import log
    from .dataset import parquet_files

    data = scratch / "data-fair"
    shutil.rmtree(data, ignore_errors=True)
    write(data)
    mds = [pq.ParquetFile(p).metadata for p in parquet_files(data)]
    shards = {1: [md.row_group(g).num_rows for md in mds for g in range(md.num_row_groups)],
              P: [md.num_rows for md in mds]}
    out = {"rows": ROWS, "objects": OBJECTS, "row_group_rows": RG_ROWS, "batch_size": BATCH, "epoch": EPOCH, "runs": []}
    try:
        for parts in (1, P):
            run = {"partitions": parts, "tensorfs": {}}
            for mode in MODES:
                t = run["tensorfs"][mode] = tensorfs_ks(binary, data, scratch, mounts, mode, parts)
                log(f"fairness: P={parts}, tensorfs shuffle={mode}: mean KS {t['mean_ks']:.4f} over {t['batches']} batches")
            out["runs"].append(run)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    cases = [(shards[run["partitions"]], run["partitions"]) for run in out["runs"]]
    got = streaming_ks(cases) if streaming else [{"skipped": "--skip streaming"}] * len(cases)
    for run, (sizes, nodes), s in zip(out["runs"], cases, got):
        run["streaming"] = {"shards": len(sizes), "shard_rows": sizes[0], "nodes": nodes, **s}
        for t in run["tensorfs"].values():
            t["vs_streaming"] = t["mean_ks"] / s["mean_ks"] if "mean_ks" in s else None
        log(f"fairness: Streaming py1e, {len(sizes)} shards, {nodes} canonical nodes: "
            + (f"mean KS {s['mean_ks']:.4f}" if "mean_ks" in s else f"left out ({s['skipped']})"))
    return out


def print_rows(fr: dict) -> None:
    print(f"\nFair batches: mean Kolmogorov-Smirnov distance of a batch's canonical positions from uniform, "
          f"epoch {fr['epoch']}'s full batches ({fr['rows']} rows in {fr['objects']} objects of "
          f"{fr['rows'] // fr['objects']}, {fr['row_group_rows']}-row groups; batch_size {fr['batch_size']}; "
          "target: the default <= 1.25x Streaming)")
    head = f"{'order':<66} {'mean KS':>9} {'batches':>8} {'÷ Streaming':>12}"
    print(head)
    print("-" * len(head))
    for run in fr["runs"]:
        parts, s = run["partitions"], run["streaming"]
        base = s.get("mean_ks")
        where = f"epoch-{fr['epoch']}/" if parts == 1 else f"partitions={parts}, every rank-R-of-{parts}/"
        for mode, t in run["tensorfs"].items():
            label = f"tensorfs shuffle={mode}{' (default)' * (mode == 'block')}, {where}"
            ratio = f"{t['vs_streaming']:.2f}" if t["vs_streaming"] else "-"
            print(f"{label:<66} {t['mean_ks']:>9.4f} {t['batches']:>8} {ratio:>12}")
        label = f"Streaming py1e, {s['shards']} shards of {s['shard_rows']}, {s['nodes']} node{'s' * (s['nodes'] > 1)}"
        if base is None:
            print(f"{label:<66} left out: {s['skipped']}")
        else:
            print(f"{label:<66} {base:>9.4f} {s['batches']:>8} {'1.00':>12}")


if __name__ == "__main__":
    print(json.dumps([streaming_order_ks(sizes, nodes) for sizes, nodes in json.loads(sys.argv[1])]))
