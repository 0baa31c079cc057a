"""More mappings and edge cases: every timestamp unit (with and without a time zone), pad on
lists of other element types, an empty file inside the dataset, one batch larger than the data."""

import base64

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


def test_files_that_write_one_type_differently_are_one_dataset(mounter, tmp_path):
    """Files whose columns differ only in how they are written, as pyarrow reads them as one
    dataset: a column dictionary-encoded in one file and plain in the next, a list whose
    element is named `element` in one file and `item` (pyarrow before 13) in the next, and the
    same for a fixed-size list. Served as one dataset, equal to pyarrow's reading."""
    import pyarrow.dataset as pads

    src = tmp_path / "mixed"
    src.mkdir()
    rng = np.random.default_rng(5)
    for f, compliant in enumerate((True, False)):
        n = 300
        ids = np.arange(f * n, (f + 1) * n, dtype=np.int64)
        k = rng.integers(0, 4, n).astype(np.int64)
        lists = [rng.integers(0, 100, int(m)).tolist() for m in rng.integers(0, 5, n)]
        vec = rng.standard_normal((n, 3)).astype(np.float32)
        table = pa.table({
            "id": ids,
            "k": pa.array(k).dictionary_encode() if f == 0 else pa.array(k),
            "l": pa.array(lists, pa.list_(pa.int64())),
            "v": tfs.fsl(vec, 3),
        })
        pq.write_table(table, src / f"part-{f}.parquet", row_group_size=100, use_compliant_nested_type=compliant)
    names = [pq.read_schema(src / f"part-{f}.parquet").field("l").type.value_field.name for f in (0, 1)]
    assert names == ["element", "item"], "the premise: the list elements are named differently"
    stored = base64.b64decode(pq.read_metadata(src / "part-0.parquet").metadata[b"ARROW:schema"])
    stored = pa.ipc.read_schema(pa.py_buffer(stored))
    assert pa.types.is_dictionary(stored.field("k").type), "the premise: k is stored as a dictionary"

    want = pads.dataset(str(src), format="parquet").to_table()
    m = mounter(src, "shuffle=none", "batch_size=256", "pad=l:4")
    dj = m.dataset()
    assert dj["rows"] == 600
    k_ref = np.array(want.column("k").to_pylist(), dtype=np.int64)
    l_ref, l_len = tfs.pad_ref(want.column("l").to_pylist(), 4)
    v_ref = np.array(want.column("v").to_pylist(), dtype=np.float32)
    for b in range(dj["batches_per_epoch"]):
        rows = slice(b * 256, (b + 1) * 256)
        check_batch(m, "epoch-0", b, {
            "id": np.arange(600, dtype=np.int64)[rows], "k": k_ref[rows],
            "l": l_ref.astype(np.int64)[rows], "l.len": l_len[rows], "v": v_ref[rows],
        })


def test_a_table_of_hundreds_of_columns_is_shuffled(mounter, tmp_path):
    """600 columns: the cached columns of a row group take a header of more than 4096 bytes.
    Each shuffled epoch is a permutation of the rows, every column of a row its own."""
    rows, cols = 300, 600
    ids = np.arange(rows, dtype=np.int64)
    table = {"id": ids, **{f"c{k:03d}": ((ids * 7 + k) % 251).astype(np.int16) for k in range(cols)}}
    d = tmp_path / "wide"
    d.mkdir()
    pq.write_table(pa.table(table), d / "data.parquet", row_group_size=100)
    m = mounter(d, "shuffle=window", "batch_size=64", "epochs=2")
    n = m.dataset()["batches_per_epoch"]
    for e in range(2):
        got = [tfs.load_safetensors(m.p(f"epoch-{e}", tfs.batch_name(i) + ".safetensors")) for i in range(n)]
        order = np.concatenate([b["id"] for b in got])
        assert np.array_equal(np.sort(order), ids)
        for k in (0, 299, cols - 1):
            name = f"c{k:03d}"
            tfs.assert_array(np.concatenate([b[name] for b in got]), table[name][order], f"epoch {e} {name}")
