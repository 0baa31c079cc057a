"""More mappings and edge cases: every timestamp unit (with and without a time zone), pad on
lists of other element types, an empty file inside the dataset, one batch larger than the data."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tfs
from tfs import check_batch


def test_timestamp_units_and_pad_element_types(mounter, tmp_path):
    rng = np.random.default_rng(11)
    tables, ref = [], {}
    start = 0
    for f, n in enumerate((500, 700)):
        c = {
            "id": np.arange(start, start + n, dtype=np.int64),
            "ts_s": rng.integers(1_500_000_000, 1_800_000_000, n, dtype=np.int64),
            "ts_us": rng.integers(1_500_000_000_000_000, 1_800_000_000_000_000, n, dtype=np.int64),
            "ts_ns": rng.integers(1_500_000_000_000_000_000, 1_800_000_000_000_000_000, n, dtype=np.int64),
            "ts_utc": rng.integers(1_500_000_000_000, 1_800_000_000_000, n, dtype=np.int64),
        }
        flists = [rng.standard_normal(int(k)).astype(np.float32).tolist() for k in rng.integers(0, 6, n)]
        llists = [rng.integers(-(2**62), 2**62, int(k), dtype=np.int64).tolist() for k in rng.integers(0, 6, n)]
        table = pa.table(
            {
                "id": c["id"],
                "ts_s": pa.array(c["ts_s"]).cast(pa.timestamp("s")),
                "ts_us": pa.array(c["ts_us"]).cast(pa.timestamp("us")),
                "ts_ns": pa.array(c["ts_ns"]).cast(pa.timestamp("ns")),
                "ts_utc": pa.array(c["ts_utc"]).cast(pa.timestamp("ms", tz="UTC")),
                "fl": pa.array(flists, type=pa.list_(pa.float32())),
                "ll": pa.array(llists, type=pa.list_(pa.int64())),
            }
        )
        tables.append((f"t{f}.parquet", table))
        for k, v in c.items():
            ref.setdefault(k, []).append(v)
        ref.setdefault("fl", []).extend(flists)
        ref.setdefault("ll", []).extend(llists)
        start += n
    tfs.write_dataset(tmp_path / "ts", tables, 200)
    full = {k: np.concatenate(ref[k]) for k in ("id", "ts_s", "ts_us", "ts_ns", "ts_utc")}
    L = 3
    for col, dtype in (("fl", np.float32), ("ll", np.int64)):
        padded = np.zeros((1200, L), dtype=dtype)
        lens = np.zeros(1200, dtype=np.int32)
        for r, lst in enumerate(ref[col]):
            k = min(len(lst), L)
            padded[r, :k] = lst[:k]
            lens[r] = k
        full[col], full[col + ".len"] = padded, lens

    bs = 512
    m = mounter(tmp_path / "ts", "shuffle=none", f"batch_size={bs}", f"pad=fl:{L}", f"pad=ll:{L}")
    units = {t["name"]: t.get("unit") for t in m.dataset()["tensors"]}
    assert units["ts_us"] == "us" and units["ts_ns"] == "ns" and units["ts_utc"] == "ms", units
    # Parquet has no seconds unit: pyarrow stores timestamp[s] as milliseconds (and the Arrow
    # schema says seconds). Either reading is fine as long as values and unit agree.
    assert units["ts_s"] in ("s", "ms"), units
    if units["ts_s"] == "ms":
        full["ts_s"] = full["ts_s"] * 1000
    for i in range(3):
        check_batch(m, "epoch-0", i, {k: v[i * bs : (i + 1) * bs] for k, v in full.items()})


def test_empty_file_in_dataset_and_one_big_batch(mounter, tmp_path):
    schema = pa.schema([("id", pa.int64()), ("v", pa.float64())])
    ids = np.arange(900, dtype=np.int64)
    tables = [
        ("f0.parquet", pa.table({"id": ids[:400], "v": ids[:400] * 1.5}, schema=schema)),
        ("f1.parquet", schema.empty_table()),
        ("f2.parquet", pa.table({"id": ids[400:], "v": ids[400:] * 1.5}, schema=schema)),
    ]
    path = tmp_path / "withempty"
    path.mkdir()
    for name, t in tables:
        pq.write_table(t, path / name, row_group_size=100)
    m = mounter(path, "shuffle=none", "batch_size=5000")
    dj = m.dataset()
    assert dj["rows"] == 900 and dj["batches_per_epoch"] == 1 and dj["last_batch_rows"] == 900
    check_batch(m, "epoch-0", 0, {"id": ids, "v": ids * 1.5})
    g = mounter(path, "shuffle=global", "batch_size=300")
    got = np.concatenate([tfs.load_safetensors(g.p("epoch-0", f"{i:06d}.safetensors"))["id"] for i in range(3)])
    assert np.array_equal(np.sort(got), ids)
