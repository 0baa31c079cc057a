"""A dataset written by Petastorm itself, read three ways: Petastorm's make_reader, tensorfs cold,
tensorfs from its cache (PRODUCT.md §4; the rows of issue 14).

The dataset is what a Petastorm user holds: written by Petastorm 0.13.1's own materialize_dataset
with Spark, a Unischema of an int32 `id` (ScalarCodec), a 64x64x3 uint8 `image`
(CompressedImageCodec, PNG by default) and a float32[16] `vec` (NdarrayCodec). It is written once,
in Petastorm's interpreter (the bench's side venv, given pyspark and OpenCV), and kept under
target/bench-petastorm-data/ for later runs.

  make_reader   petastorm.make_reader(url) with its defaults (thread pool of 10 workers,
                shuffle_row_groups=True, one epoch): it returns rows, each field already a NumPy
                array; the loop stacks every B rows into one array per field, as a training
                loop's collate does. Timed from the first row to the last, the reader made.
  tensorfs cold mount -o batch_size=B,shuffle=none with a fresh cache_dir, page cache dropped,
                every epoch-0/NNNNNN.safetensors read with safetensors.numpy.load_file.
  tensorfs warm the same epoch read again on the same mount (page cache), and after a remount on
                the same cache_dir with the page cache dropped (checked to decode nothing).

Rows of a sample (every SAMPLE_EVERY-th id) are checked equal, byte for byte, between what
make_reader returned and what the mount serves.

Run as a module in Petastorm's interpreter (`python -m benchlib.petastorm_dataset write|read ...`)
it is the writer and the reader; imported by bench.py it drives them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import MB, REPO, log

DATA_ROOT = REPO / "target" / "bench-petastorm-data"
H = W = 64
VEC = 16
ROW_BYTES = 4 + H * W * 3 + 4 * VEC  # id int32, image uint8 [64, 64, 3], vec float32 [16]
FILES = 4  # Spark partitions = part files
ROW_GROUP_MB = 16  # materialize_dataset(row_group_size_mb=...)
SAMPLE_EVERY = 97
# What writing (Spark) and decoding images (OpenCV) need beside Petastorm: the versions of the
# test fixtures (tests/fixtures/petastorm/README.md).
WRITER_PACKAGES = ["pyspark==3.5.9", "opencv-python-headless==4.9.0.80", "numpy<2"]
WRITER_PROBE = ("import cv2, pyspark; from petastorm.etl.dataset_metadata import materialize_dataset; "
                "from petastorm import make_reader")


# --------------------------------------------------------------------------------------------
# In Petastorm's interpreter: the writer and the reader
# --------------------------------------------------------------------------------------------


def make_row(i: int) -> dict:
    """Row I: a function of I alone. The image is smooth (two gradients and a disc) with some
    noise, so it compresses about as much as a small photo does."""
    import numpy as np

    rng = np.random.default_rng(7919 + i)
    yy, xx = np.mgrid[0:H, 0:W]
    base = rng.integers(0, 256, 3)
    gx, gy = rng.uniform(-3, 3, 3), rng.uniform(-3, 3, 3)
    img = base + xx[..., None] * gx + yy[..., None] * gy
    cx, cy, r = rng.uniform(10, 54), rng.uniform(10, 54), rng.uniform(6, 18)
    disc = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
    img[disc] = rng.integers(0, 256, 3)
    img = img + rng.integers(-6, 7, (H, W, 3))
    return {
        "id": np.int32(i),
        "image": np.clip(img, 0, 255).astype(np.uint8),
        "vec": rng.standard_normal(VEC).astype(np.float32),
    }


def unischema(codec: str):
    import numpy as np
    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import IntegerType

    return Unischema("BenchImagesSchema", [
        UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("image", np.uint8, (H, W, 3), CompressedImageCodec(codec), False),
        UnischemaField("vec", np.float32, (VEC,), NdarrayCodec(), False),
    ])


def write_main(out: str, rows: int, codec: str) -> None:
    """Writes the dataset to OUT with materialize_dataset + Spark, as a Petastorm user does."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row
    from pyspark.sql import SparkSession

    schema = unischema(codec)
    spark = (SparkSession.builder.master("local[2]").appName("tensorfs-bench-petastorm")
             .config("spark.driver.memory", "2g").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    url = "file://" + out
    try:
        with materialize_dataset(spark, url, schema, row_group_size_mb=ROW_GROUP_MB):
            rdd = (spark.sparkContext.parallelize(range(rows), FILES)
                   .map(make_row).map(lambda r: dict_to_spark_row(schema, r)))
            spark.createDataFrame(rdd, schema.as_spark_schema()).write.mode("overwrite").parquet(url)
    finally:
        spark.stop()
    for p in Path(out).glob(".*.crc"):  # Hadoop's checksums; Petastorm never reads them
        p.unlink()


def read_main(url: str, batch_size: int, sample_out: str) -> None:
    """make_reader with its defaults over every row, collated into batches; prints one JSON line."""
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    from petastorm import make_reader

    sample = {}
    with make_reader(url) as reader:
        rows = nbytes = 0
        buf = []
        t = time.perf_counter()
        for row in reader:
            buf.append(row)
            if len(buf) == batch_size:
                batch = {k: np.stack([getattr(r, k) for r in buf]) for k in row._fields}
                nbytes += sum(a.nbytes for a in batch.values())
                rows += len(buf)
                buf = []
            if row.id % SAMPLE_EVERY == 0:
                sample[int(row.id)] = row
        if buf:
            batch = {k: np.stack([getattr(r, k) for r in buf]) for k in buf[0]._fields}
            nbytes += sum(a.nbytes for a in batch.values())
            rows += len(buf)
        seconds = time.perf_counter() - t
    ids = sorted(sample)
    np.savez(sample_out, **{k: np.stack([getattr(sample[i], k) for i in ids]) for k in ("id", "image", "vec")})
    print(json.dumps({"rows": rows, "bytes": nbytes, "seconds": seconds}), flush=True)


# --------------------------------------------------------------------------------------------
# In the bench's interpreter: the driver
# --------------------------------------------------------------------------------------------


def side_run(py: Path, *args, timeout=3600) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    r = subprocess.run([str(py), "-W", "ignore", "-m", "benchlib.petastorm_dataset", *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        tail = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
        raise RuntimeError(tail[-1] if tail else f"exit {r.returncode}")
    return r.stdout


def writer_python(a) -> tuple[Path, str]:
    """Petastorm's interpreter, with pyspark and OpenCV added to the bench's side venv."""
    from .common import pip_install, probe
    from .petastorm_side import SIDE_VENV, petastorm_python

    py, note = petastorm_python(a.petastorm_python, not a.no_side_venv)
    if py is None:
        raise RuntimeError(note)
    err = probe(py, WRITER_PROBE)
    if err and "No module named" in err and py == SIDE_VENV / "bin" / "python":
        log(f"installing {' '.join(WRITER_PACKAGES)} into target/{SIDE_VENV.name} (Spark writes the dataset, OpenCV decodes its images)")
        err = pip_install(py, *WRITER_PACKAGES) or probe(py, WRITER_PROBE)
    if err:
        raise RuntimeError(f"{py}: {err}")
    return py, note


def dataset(py: Path, rows: int, codec: str) -> Path:
    """The dataset for ROWS and CODEC, written by Petastorm unless an earlier run wrote it."""
    out = DATA_ROOT / f"{codec}-{rows}rows-{FILES}files-{ROW_GROUP_MB}mb-v1"
    done = out / "_BENCH_COMPLETE"
    if done.exists():
        log(f"petastorm dataset: reusing {out.relative_to(REPO)}")
        return out
    if shutil.which("java") is None:
        raise RuntimeError("no Java runtime for Spark (SETUP_TESTS=1 scripts/setup installs one)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    log(f"petastorm dataset: writing {rows} rows with materialize_dataset + Spark to {out.relative_to(REPO)}")
    t = time.perf_counter()
    side_run(py, "write", tmp, rows, codec)
    tmp.rename(out)
    done.write_text(json.dumps({"rows": rows, "codec": codec, "files": FILES, "row_group_size_mb": ROW_GROUP_MB}))
    log(f"petastorm dataset: written in {time.perf_counter() - t:.0f} s")
    return out


def run_rows(a, binary: Path, scratch: Path, caches, mounts: list) -> dict:
    """Writes (once) and reads the dataset; returns what report() prints (see print_rows)."""
    import numpy as np
    import pyarrow.parquet as pq

    from .methods import read_safetensors_files
    from .mounts import Mount

    rows, codec, B = a.petastorm_ds_rows, a.petastorm_ds_codec, a.petastorm_ds_batch_size
    py, note = writer_python(a)
    data = dataset(py, rows, codec)
    parts = sorted(data.glob("*.parquet"))
    row_groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in parts)
    out = {"rows": rows, "codec": codec, "batch_size": B, "files": len(parts), "row_groups": row_groups,
           "parquet_mb": sum(p.stat().st_size for p in parts) / MB, "tensor_mb": rows * ROW_BYTES / MB,
           "petastorm": note, "results": []}

    def add(key, label, r, bytes_, s, note=""):
        row = {"key": key, "method": label, "rows": r, "bytes": bytes_, "seconds": s,
               "rows_s": r / s, "mb_s": bytes_ / MB / s, "note": note}
        out["results"].append(row)
        log(f"petastorm dataset, {label}: {r} rows, {bytes_ / MB:.1f} MB in {s:.2f} s = {row['mb_s']:.1f} MB/s")
        return row

    # make_reader
    sample_npz = scratch / "petastorm-ds-sample.npz"
    caches.drop()
    e = json.loads(side_run(py, "read", f"file://{data}", B, sample_npz).strip().splitlines()[-1])
    add("pds_make_reader", "petastorm make_reader (rows, stacked into batches)", e["rows"], e["bytes"], e["seconds"])
    want = dict(np.load(sample_npz))

    # tensorfs cold, warm, and warm remounted
    cache = scratch / "cache-petastorm-ds"
    shutil.rmtree(cache, ignore_errors=True)
    opts = [f"batch_size={B}", "shuffle=none", f"cache_dir={cache}"]
    caches.drop()
    m = Mount(binary, f"file://{data}", scratch / "mnt-petastorm-ds", opts)
    mounts.append(m)
    n = m.dataset()["batches_per_epoch"]
    root = m.mnt / "epoch-0"
    add("pds_tfs_cold", "tensorfs cold, batch files", *read_safetensors_files(root, n))
    out["cold_stats"] = m.stats()
    add("pds_tfs_warm", "tensorfs warm (page cache), batch files", *read_safetensors_files(root, n))
    # Check (outside timing): the epoch holds every id once, and the sample equals make_reader's.
    ids = np.load(m.mnt / "epoch-0" / "all" / "id.npy")
    if not np.array_equal(np.sort(ids), np.arange(rows)):
        raise RuntimeError("tensorfs: epoch 0 is not a permutation of the rows")
    at = np.argsort(ids)[want["id"]]
    for k in ("id", "image", "vec"):
        got = np.load(m.mnt / "epoch-0" / "all" / f"{k}.npy", mmap_mode="r")
        got = np.array(got[at])
        if got.dtype != want[k].dtype or got.shape != want[k].shape or got.tobytes() != want[k].tobytes():
            raise RuntimeError(f"tensorfs: {k} of the sampled rows differs from make_reader's "
                               f"({got.dtype} {got.shape} vs {want[k].dtype} {want[k].shape})")
        del got
    out["checked_rows"] = len(want["id"])
    log(f"petastorm dataset: {len(want['id'])} sampled rows equal make_reader's, byte for byte")
    m.unmount()
    mounts.remove(m)
    if caches.drop():
        m = Mount(binary, f"file://{data}", scratch / "mnt-petastorm-ds", opts)
        mounts.append(m)
        add("pds_tfs_warm_disk", "tensorfs warm, remounted, page cache dropped", *read_safetensors_files(root, n))
        out["warm_remount_stats"] = s = m.stats()
        if s.get("row_groups_decoded"):
            raise RuntimeError(f"tensorfs: the warm remount decoded {s['row_groups_decoded']} row groups")
        m.unmount()
        mounts.remove(m)
    shutil.rmtree(cache, ignore_errors=True)
    return out


def print_rows(pds: dict) -> None:
    print()
    print(f"Petastorm dataset (written by petastorm 0.13.1 materialize_dataset + Spark): {pds['rows']} rows of int32 id, "
          f"uint8 image [64, 64, 3] ({pds['codec'].upper()}), float32 vec [16] ({pds['tensor_mb']:.0f} MB of tensors, "
          f"{ROW_BYTES} bytes a row; {pds['parquet_mb']:.0f} MB of Parquet in {pds['files']} files, "
          f"{pds['row_groups']} row groups), batch_size {pds['batch_size']}; {pds['petastorm']}")
    base = next((r for r in pds["results"] if r["key"] == "pds_make_reader"), None)
    head = f"{'method':<50} {'rows/s':>9} {'MB/s':>9} {'x make_reader':>14}"
    print(head)
    print("-" * len(head))
    for r in pds["results"]:
        x = f"{r['mb_s'] / base['mb_s']:.2f}" if base else "-"
        print(f"{r['method']:<50} {r['rows_s'] / 1e3:>8.1f}k {r['mb_s']:>9.1f} {x:>14}")
    cs = pds.get("cold_stats") or {}
    ws = pds.get("warm_remount_stats")
    print(f"tensorfs cold: row_groups_decoded {cs.get('row_groups_decoded')}, decode {(cs.get('decode_ns') or 0) / 1e9:.2f} s"
          + (f"; warm remount: row_groups_decoded {ws.get('row_groups_decoded')}" if ws else "")
          + f"; {pds.get('checked_rows', 0)} sampled rows equal to make_reader's")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write_main(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "read":
        read_main(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]}")
