"""Tables as data teams keep them (PRODUCT.md §8): hive-style directories (`key=value/`), whose
keys are columns like any other, equal to `pyarrow.dataset.dataset(SOURCE, partitioning="hive")`
batch for batch, written by pyarrow, polars and duckdb."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import tfs


def epoch_columns(m: tfs.Mount, names) -> dict[str, np.ndarray]:
    """Every tensor of `names`, epoch 0 in order (shuffle=none: the canonical rows)."""
    n = m.dataset()["batches_per_epoch"]
    batches = [tfs.load_safetensors(m.p("epoch-0", f"{tfs.batch_name(i)}.safetensors")) for i in range(n)]
    return {k: np.concatenate([b[k] for b in batches]) for k in names}


def reference(path, columns) -> dict[str, np.ndarray]:
    t = pads.dataset(str(path), partitioning="hive").to_table()
    return {c: t.column(c).to_numpy(zero_copy_only=False) for c in columns}


def table(n=600, seed=0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "x": rng.standard_normal(n).astype(np.float32),
            "year": (2020 + ids % 3).astype(np.int64),
            "shard": (ids % 4).astype(np.int64),
            "day": pa.array([f"2026-11-0{1 + i % 2}" for i in range(n)]),
        }
    )


def test_hive_directories_written_by_pyarrow_add_their_keys_as_columns(mounter, tmp_path):
    src = tmp_path / "hive"
    pq.write_to_dataset(table().drop_columns(["day"]), src, partition_cols=["year", "shard"])
    want = reference(src, ["id", "x", "year", "shard"])
    assert pads.dataset(str(src), partitioning="hive").schema.field("year").type == pa.int32()
    m = mounter(src, "batch_size=64", "shuffle=none")
    dj = m.dataset()
    assert dj["origin"]["partition_columns"] == ["year", "shard"]
    tensors = {t["name"]: t for t in dj["tensors"]}
    assert tensors["year"]["dtype"] == "int32" and tensors["shard"]["dtype"] == "int32"
    got = epoch_columns(m, want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # A shuffled epoch is still a permutation of the same rows, each with its keys.
    s = mounter(src, "batch_size=64", "shuffle=global", "seed=3", "columns=id:year:shard")
    rows = {tuple(r) for r in zip(*epoch_columns(s, ["id", "year", "shard"]).values())}
    assert rows == set(zip(want["id"], want["year"], want["shard"]))
    # Options apply to them: cast, stack.
    c = mounter(src, "batch_size=64", "shuffle=none", "columns=id:year:shard", "cast=year:int64", "cast=shard:int64", "stack=ys:year+shard")
    b = tfs.load_safetensors(c.p("epoch-0", "000000.safetensors"))
    assert b["ys"].dtype == np.int64 and b["ys"].shape == (64, 2)
    np.testing.assert_array_equal(b["ys"][:, 0], want["year"][:64])


def test_string_and_null_keys_are_refused_as_columns_are_with_a_hint_that_mounts(mounter, tmp_path):
    src = tmp_path / "hive"
    t = table()
    pq.write_to_dataset(t.drop_columns(["shard"]), src, partition_cols=["day"])
    mnt = mounter.mountpoint()
    line = tfs.error_line(tfs.run(["mount", src, mnt, "-o", f"cache_dir={mnt}-c"]))
    assert "'day' (string)" in line and "columns=" in line, line
    hint = tfs.hint_options(line)
    m = mounter(src, *hint, "batch_size=100", "shuffle=none")
    assert "day" not in [x["name"] for x in m.dataset()["tensors"]]
    # A key whose value is __HIVE_DEFAULT_PARTITION__ is null: nulls=zero serves it, masked.
    src2 = tmp_path / "nulls"
    for year in ("2021", "__HIVE_DEFAULT_PARTITION__"):
        d = src2 / f"year={year}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"id": np.arange(10, dtype=np.int64)}), d / "part.parquet")
    mnt = mounter.mountpoint()
    line = tfs.error_line(tfs.run(["mount", src2, mnt, "-o", f"cache_dir={mnt}-c"]))
    assert "'year'" in line and "nulls=zero" in line, line
    m = mounter(src2, "nulls=zero", "batch_size=20", "shuffle=none")
    b = tfs.load_safetensors(m.p("epoch-0", "000000.safetensors"))
    want = reference(src2, ["year"])["year"]
    np.testing.assert_array_equal(b["year.mask"], (~np.isnan(want.astype(float))).astype(np.uint8))
    np.testing.assert_array_equal(b["year"][b["year.mask"] == 1], [2021] * 10)


@pytest.mark.parametrize("writer", ["polars", "duckdb"])
def test_hive_directories_written_by_other_tools(mounter, tmp_path, writer):
    t = table(400, seed=1).drop_columns(["day"])
    src = tmp_path / writer
    if writer == "polars":
        pl = pytest.importorskip("polars")
        # Without the keys in the files, as Spark and pyarrow write them (pyarrow cannot read
        # a key that is also a file's column).
        by = pl.PartitionBy(str(src), key=["year", "shard"], include_key=False)
        pl.from_arrow(t).lazy().sink_parquet(by, mkdir=True)
    else:
        duckdb = pytest.importorskip("duckdb")
        con = duckdb.connect()
        con.register("t", t)
        con.execute(f"COPY (SELECT * FROM t ORDER BY id) TO '{src}' (FORMAT PARQUET, PARTITION_BY (year, shard))")
    want = reference(src, ["id", "x", "year", "shard"])
    m = mounter(src, "batch_size=50", "shuffle=none")
    got = epoch_columns(m, want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{writer} {k}")


def test_a_snapshot_of_a_hive_dataset_keeps_its_keys(mounter, tmp_path):
    src = tmp_path / "hive"
    pq.write_to_dataset(table().drop_columns(["day"]), src, partition_cols=["year"])
    pin = tmp_path / "h.snapshot"
    proc = tfs.run(["snapshot", src, pin, "-o", "batch_size=64"])
    assert proc.returncode == 0, proc.stderr
    listed = mounter(src, "batch_size=64", "seed=2")
    m = mounter(src, "batch_size=64", "seed=2", f"snapshot={pin}")
    n = m.dataset()["batches_per_epoch"]
    assert m.dataset()["origin"]["partition_columns"] == ["year"]
    assert tfs.batch_hashes(m, ["epoch-0"], n) == tfs.batch_hashes(listed, ["epoch-0"], n)


def test_a_key_that_is_also_a_column_of_the_files_is_refused(mounter, tmp_path):
    """pyarrow refuses to merge such a dataset; so does tensorfs, in one line naming it."""
    src = tmp_path / "both"
    d = src / "year=2021"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"id": np.arange(5, dtype=np.int64), "year": np.full(5, 2021)}), d / "part.parquet")
    mnt = mounter.mountpoint()
    line = tfs.error_line(tfs.run(["mount", src, mnt, "-o", f"cache_dir={mnt}-c"]))
    assert "column 'year' is both in the files and a partition directory" in line, line
