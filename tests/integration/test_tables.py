"""Tables as data teams keep them (PRODUCT.md §8): hive-style directories (`key=value/`), whose
keys are columns like any other, equal to `pyarrow.dataset.dataset(SOURCE, partitioning="hive")`
batch for batch, written by pyarrow, polars and duckdb."""

from __future__ import annotations

import json
import os
from pathlib import Path

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


# --------------------------------------------------------------------------------------------
# Delta Lake tables, written here with the deltalake package (delta-rs), and delta-rs's own
# small test tables (tests/fixtures/delta, see NOTES.md there)
# --------------------------------------------------------------------------------------------

FIXTURES = tfs.REPO / "tests" / "fixtures" / "delta"


def delta_rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    emb = pa.FixedSizeListArray.from_arrays(pa.array((np.repeat(ids, 4) * 0.5).astype(np.float32)), 4)
    days = np.array(["2026-11-01", "2026-11-02"], dtype="datetime64[D]")[ids % 2]
    return pa.table({"id": ids, "x": (ids / 2).astype(np.float32), "emb": emb, "year": (2020 + ids % 3).astype(np.int32), "day": pa.array(days)})


@pytest.fixture(scope="module")
def delta_table(tmp_path_factory):
    """A table of 6 versions: create, append, overwrite, append, compaction, delete (then a
    checkpoint), partitioned by an integer and a date."""
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    path = tmp_path_factory.mktemp("delta") / "table"
    parts = ["year", "day"]
    dl.write_deltalake(str(path), delta_rows(0, 300), partition_by=parts)
    dl.write_deltalake(str(path), delta_rows(300, 200), mode="append", partition_by=parts)
    dl.write_deltalake(str(path), delta_rows(1000, 250), mode="overwrite", partition_by=parts)
    dl.write_deltalake(str(path), delta_rows(2000, 150), mode="append", partition_by=parts)
    metrics = dl.DeltaTable(str(path)).optimize.compact()
    assert metrics["numFilesRemoved"] > 0, metrics
    dl.DeltaTable(str(path)).delete("id % 7 = 0")
    t = dl.DeltaTable(str(path))
    t.create_checkpoint()
    assert t.version() == 5
    return path


def delta_reference(path, version) -> dict[str, np.ndarray]:
    import deltalake

    t = deltalake.DeltaTable(str(path), version=version).to_pyarrow_table().sort_by("id")
    out = {c: t.column(c).to_numpy(zero_copy_only=False) for c in ("id", "x", "year")}
    out["day"] = t.column("day").cast(pa.int32()).to_numpy()
    out["emb"] = np.stack(t.column("emb").to_pylist()).astype(np.float32)
    return out


def test_every_version_of_a_delta_table_is_deltalakes(mounter, delta_table):
    for version in range(6):
        want = delta_reference(delta_table, version)
        m = mounter(delta_table, f"version={version}", "batch_size=128", "shuffle=none", "pad=emb:4")
        dj = m.dataset()
        assert dj["origin"]["from"] == "delta table" and dj["origin"]["version"] == version
        assert dj["origin"]["partition_columns"] == ["year", "day"]
        tensors = {t["name"]: t for t in dj["tensors"]}
        assert tensors["day"]["dtype"] == "int32" and tensors["day"]["unit"] == "D"
        got = epoch_columns(m, ["id", "x", "year", "day", "emb", "emb.len"])
        order = np.argsort(got["id"])
        assert dj["rows"] == len(want["id"]), version
        for k in ("id", "x", "year", "day"):
            np.testing.assert_array_equal(got[k][order], want[k], err_msg=f"version {version} {k}")
        np.testing.assert_array_equal(got["emb"][order], want["emb"], err_msg=f"version {version} emb")
        assert (got["emb.len"] == 4).all()
        m.unmount()
    # The latest, without version=, is the last one.
    latest = mounter(delta_table, "batch_size=128", "pad=emb:4")
    assert latest.dataset()["origin"]["version"] == 5


def test_versions_of_a_delta_table_on_one_cache_are_each_their_own(mounter, delta_table):
    """version= chooses the rows: mounts of two versions on the same cache_dir (each warm from
    the one before) have their own fingerprint and serve their own version, never the bytes the
    other left in the cache."""
    opts = ("batch_size=128", "shuffle=none", "pad=emb:4")
    assert not np.array_equal(delta_reference(delta_table, 2)["x"], delta_reference(delta_table, 3)["x"])
    cache, fingerprints = None, {}
    for version in (2, 3, 2):
        m = mounter(delta_table, f"version={version}", *opts, **({"cache": cache} if cache else {}))
        cache = m.cache
        dj = m.dataset()
        assert dj["origin"]["version"] == version and dj["options"]["version"] == version, dj["origin"]
        fingerprints.setdefault(version, set()).add(dj["fingerprint"])
        want = delta_reference(delta_table, version)
        got = epoch_columns(m, ["id", "x"])
        order = np.argsort(got["id"])
        for k in ("id", "x"):
            np.testing.assert_array_equal(got[k][order], want[k], err_msg=f"version {version} {k}")
        m.unmount()
    assert len(fingerprints[2]) == 1 and fingerprints[2].isdisjoint(fingerprints[3]), fingerprints


def test_a_delta_table_is_refused_in_one_line_where_it_must_be(mounter, delta_table, tmp_path):
    line = tfs.refused_mount(mounter, delta_table, "version=9", "pad=emb:4")
    assert "no version 9" in line, line
    # A list column the table's schema has (Delta has no fixed-size arrays) needs pad=.
    line = tfs.refused_mount(mounter, delta_table)
    assert "emb" in line and "pad=emb" in line, line
    # A Databricks table with column mapping: read, its columns by their logical names (strings,
    # which no tensor serves).
    line = tfs.refused_mount(mounter, FIXTURES / "table_with_column_mapping")
    assert "'Super Name' (string)" in line and "no tensor mapping" in line, line
    line = tfs.refused_mount(mounter, FIXTURES / "delta-0.8.0-partitioned")
    assert "'month' (string)" in line and "no tensor mapping" in line, line
    data = tmp_path / "plain"
    data.mkdir()
    pq.write_table(pa.table({"id": np.arange(4)}), data / "a.parquet")
    line = tfs.refused_mount(mounter, data, "version=1")
    assert "version=1 is for Delta tables" in line, line


def test_delta_rs_test_tables_are_read_as_deltalake_reads_them(mounter):
    import deltalake

    src = FIXTURES / "checkpoint-v2-table"
    # deltalake's pyarrow reader refuses v2 checkpoints; its query engine reads them.
    query = "SELECT id, created_at FROM t ORDER BY id"
    t = pa.table(deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(src))).execute(query))
    m = mounter(src, "columns=id:created_at", "batch_size=16", "shuffle=none")
    got = epoch_columns(m, ["id", "created_at"])
    order = np.argsort(got["id"])
    np.testing.assert_array_equal(got["id"][order], t.column("id").to_numpy())
    np.testing.assert_array_equal(got["created_at"][order], t.column("created_at").cast(pa.int64()).to_numpy())
    # Partitioned by four string columns, whose files lie in their key=value/ directories.
    src = FIXTURES / "partition-type-primitives"
    want = np.sort(deltalake.DeltaTable(str(src)).to_pyarrow_table().column("id").to_numpy())
    m = mounter(src, "columns=id", "batch_size=4", "shuffle=none")
    got = epoch_columns(m, ["id"])["id"]
    assert len(want) == m.dataset()["rows"] and np.array_equal(np.sort(got), want), (got, want)


def deltalake_query(src, columns, version=None) -> pa.Table:
    """The rows deltalake's query engine reads of table SRC (it applies deletion vectors, which
    its pyarrow reader refuses), ordered by the first column."""
    import deltalake

    t = deltalake.DeltaTable(str(src), version=version)
    query = f"SELECT {', '.join(columns)} FROM t ORDER BY {columns[0]}"
    return pa.table(deltalake.QueryBuilder().register("t", t).execute(query))


def z85(data: bytes) -> str:
    """Z85 (ZeroMQ's base85), as the Delta log writes an inline deletion vector."""
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        out.append("".join(alphabet[v // 85**k % 85] for k in range(4, -1, -1)))
    return "".join(out)


def inline_dv_table(tmp_path) -> Path:
    """table-with-dv-small with its deletion vector written inline in the log (`i`), as a
    writer that keeps small vectors in the log does."""
    import json
    import shutil

    dst = tmp_path / "table-with-inline-dv"
    shutil.copytree(FIXTURES / "table-with-dv-small", dst)
    log = dst / "_delta_log" / "00000000000000000001.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    for a in actions:
        dv = a.get("add", {}).get("deletionVector")
        if dv:
            stored = next(dst.glob("deletion_vector_*.bin")).read_bytes()
            size = int.from_bytes(stored[dv["offset"]:dv["offset"] + 4], "big")
            data = stored[dv["offset"] + 4:dv["offset"] + 4 + size]
            a["add"]["deletionVector"] = {"storageType": "i", "pathOrInlineDv": z85(data),
                                          "sizeInBytes": size, "cardinality": dv["cardinality"]}
    log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    for f in dst.glob("deletion_vector_*.bin"):
        f.unlink()
    return dst


DV_TABLES = [
    ("table-with-dv-small", ["value"], [0, 1]),
    ("table_with_deletion_logs", ["id", "age", "nbr"], [0, 3, 8, 14, 20]),
    ("cdf-table-with-cdc-and-dvs", ["id"], [0, 5, 12, 25]),
]


@pytest.mark.parametrize("name,columns,versions", DV_TABLES)
def test_deletion_vectors_are_applied_as_deltalake_applies_them(mounter, name, columns, versions):
    src = FIXTURES / name
    for version in versions:
        want = deltalake_query(src, columns, version)
        m = mounter(src, f"version={version}", f"columns={':'.join(columns)}", "batch_size=7", "shuffle=none")
        assert m.dataset()["rows"] == want.num_rows, (name, version)
        got = epoch_columns(m, columns)
        order = np.argsort(got[columns[0]], kind="stable")
        for c in columns:
            np.testing.assert_array_equal(got[c][order], want.column(c).to_numpy(), err_msg=f"{name} v{version} {c}")
        m.unmount()


def test_an_inline_deletion_vector_is_applied(mounter, tmp_path):
    src = inline_dv_table(tmp_path)
    want = deltalake_query(src, ["value"])
    assert want.num_rows == 8
    m = mounter(src, "batch_size=3", "shuffle=none")
    got = np.sort(epoch_columns(m, ["value"])["value"])
    np.testing.assert_array_equal(got, want.column("value").to_numpy())
    # The same rows whichever way the vector is kept; another vector is another dataset.
    other = mounter(FIXTURES / "table-with-dv-small", "batch_size=3", "shuffle=none")
    assert np.array_equal(np.sort(epoch_columns(other, ["value"])["value"]), got)
    assert other.dataset()["fingerprint"] != m.dataset()["fingerprint"]


def test_files_inside_a_table_are_never_served_as_loose_files(mounter, tmp_path):
    """A data file of a table, or a directory inside one, holds rows the table deleted or
    replaced: mounted alone it is refused in one line naming the table's root."""
    table = FIXTURES / "table-with-dv-small"
    data = next(table.glob("*.parquet"))
    line = tfs.refused_mount(mounter, data)
    assert "inside the Delta Lake table at" in line and str(table) in line, line
    part = next((FIXTURES / "delta-0.8.0-partitioned").glob("year=*"))
    line = tfs.refused_mount(mounter, part)
    assert "inside the Delta Lake table" in line, line
    hudi = tmp_path / "hudi"
    (hudi / ".hoodie").mkdir(parents=True)
    (hudi / ".hoodie" / "hoodie.properties").write_text("hoodie.table.name=t\n")
    (hudi / "p=1").mkdir()
    pq.write_table(pa.table({"id": np.arange(4)}), hudi / "p=1" / "a.parquet")
    line = tfs.refused_mount(mounter, hudi / "p=1")
    assert "inside the Apache Hudi table" in line, line
    # A directory named metadata that holds no Iceberg metadata makes no table.
    plain = tmp_path / "plain"
    (plain / "metadata").mkdir(parents=True)
    (plain / "metadata" / "notes.txt").write_text("not a table")
    pq.write_table(pa.table({"id": np.arange(4)}), plain / "a.parquet")
    m = mounter(plain, "batch_size=2")
    assert m.dataset()["rows"] == 4


def test_a_snapshot_pins_a_table_s_deletion_vectors(mounter, tmp_path):
    src = FIXTURES / "table_with_deletion_logs"
    opts = ("columns=id:age:nbr", "batch_size=16", "shuffle=none")
    pin = tmp_path / "dv.snapshot"
    proc = tfs.run(["snapshot", src, pin, "-o", ",".join(opts)])
    assert proc.returncode == 0, proc.stderr
    listed = mounter(src, *opts)
    pinned = mounter(src, *opts, f"snapshot={pin}")
    assert pinned.dataset()["fingerprint"] == listed.dataset()["fingerprint"] == proc.stdout.strip()
    assert pinned.dataset()["rows"] == listed.dataset()["rows"] == 98
    n = listed.dataset()["batches_per_epoch"]
    assert tfs.batch_hashes(pinned, ["epoch-0"], n) == tfs.batch_hashes(listed, ["epoch-0"], n)


def test_delta_logs_of_every_shape_are_replayed_as_deltalake_replays_them(mounter, tmp_path):
    """Checkpoints written every third version (the table's own checkpointInterval) beside one
    written by hand, a delete between them, a column added by a later version (null in the files
    before it), then the commits before the last checkpoint cleaned up: every version equal to
    deltalake's, the cleaned ones refused in one line."""
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    path = tmp_path / "log"

    def rows(start, n, late=False):
        t = delta_rows(start, n).drop_columns(["emb"])
        return t.append_column("late", pa.array((np.arange(start, start + n) * 3).astype(np.float32))) if late else t

    dl.write_deltalake(str(path), rows(0, 40), partition_by=["year"], configuration={"delta.checkpointInterval": "3"})
    for k in range(1, 5):
        dl.write_deltalake(str(path), rows(100 * k, 40), mode="append", partition_by=["year"])
    dl.DeltaTable(str(path)).delete("id % 3 = 0")
    dl.DeltaTable(str(path)).create_checkpoint()
    dl.write_deltalake(str(path), rows(900, 40, late=True), mode="append", partition_by=["year"], schema_mode="merge")
    latest = dl.DeltaTable(str(path)).version()
    assert latest >= 6 and len(list((path / "_delta_log").glob("*.checkpoint.parquet"))) >= 2

    def check(version, cols=("id", "x", "year", "day")):
        t = dl.DeltaTable(str(path), version=version).to_pyarrow_table().sort_by("id")
        m = mounter(path, f"version={version}", "batch_size=32", "shuffle=none", "columns=" + ":".join(cols), "nulls=zero")
        got = epoch_columns(m, cols)
        order = np.argsort(got["id"])
        assert m.dataset()["rows"] == t.num_rows, version
        for c in cols:
            want = t.column(c)
            want = want.cast(pa.int32()) if c == "day" else want.fill_null(0) if c == "late" else want
            np.testing.assert_array_equal(got[c][order], want.to_numpy(), err_msg=f"version {version} {c}")
        m.unmount()

    for version in range(latest):
        check(version)
    check(latest, ("id", "x", "year", "day", "late"))
    # The commits up to the last checkpoint cleaned up: that version and later still read, the
    # earlier ones refused.
    checkpoint = max(int(p.name[:20]) for p in (path / "_delta_log").glob("*.checkpoint.parquet"))
    for v in range(checkpoint):
        (path / "_delta_log" / f"{v:020}.json").unlink()
    check(checkpoint)
    mnt = mounter.mountpoint()
    line = tfs.error_line(tfs.run(["mount", path, mnt, "-o", f"version={checkpoint - 1},cache_dir={mnt}-c"]))
    assert f"no version {checkpoint - 1}" in line, line


def test_a_snapshot_pins_a_delta_version(mounter, delta_table, tmp_path):
    pin = tmp_path / "d.snapshot"
    proc = tfs.run(["snapshot", delta_table, pin, "-o", "version=3,pad=emb:4"])
    assert proc.returncode == 0, proc.stderr
    listed = mounter(delta_table, "version=3", "pad=emb:4", "batch_size=64")
    m = mounter(delta_table, f"snapshot={pin}", "pad=emb:4", "batch_size=64")
    dj = m.dataset()
    assert dj["fingerprint"] == listed.dataset()["fingerprint"] == proc.stdout.strip()
    assert dj["origin"]["version"] == 3
    n = dj["batches_per_epoch"]
    assert tfs.batch_hashes(m, ["epoch-0"], n) == tfs.batch_hashes(listed, ["epoch-0"], n)


@pytest.mark.usefixtures("hermetic_env")
def test_a_delta_table_on_s3_reads_none_of_the_files_its_version_removed(mounter, s3, proxy, delta_table):
    from conftest import BUCKET, s3_opts

    prefix = "delta-table"
    for p in sorted(delta_table.rglob("*")):
        if p.is_file():
            s3.put(f"{prefix}/{p.relative_to(delta_table)}", p)
    import deltalake

    uris = set(deltalake.DeltaTable(str(delta_table)).file_uris())
    data = {p for p in delta_table.rglob("*.parquet") if "_delta_log" not in str(p)}
    live = {str(p.relative_to(delta_table)) for p in data if str(p) in uris}
    removed = {str(p.relative_to(delta_table)) for p in data} - live
    assert live and removed
    proxy.reset_stats()
    opts = ("pad=emb:4", "batch_size=64", "partitions=4", "world_size=4", *s3_opts(proxy.url))
    m = mounter(f"s3://{BUCKET}/{prefix}/", *opts)
    n = m.dataset()["batches_per_epoch"]
    local = mounter(delta_table, *opts[:4])
    assert tfs.batch_hashes(m, ["epoch-0"], n) == tfs.batch_hashes(local, ["epoch-0"], n)
    import urllib.parse

    read = {urllib.parse.unquote(k).split(f"/{prefix}/", 1)[1] for k in proxy.stats()["keys"]}
    assert not read & removed, f"files the version removed were read: {sorted(read & removed)}"
    assert live <= read


# --------------------------------------------------------------------------------------------
# Apache Hudi: copy-on-write tables written by Spark (tests/fixtures/hudi, see NOTES.md there),
# against the hudi package's read()
# --------------------------------------------------------------------------------------------

HUDI = tfs.REPO / "tests" / "fixtures" / "hudi"
HUDI_TABLES = [
    ("cow_v6_nonpartitioned", ["id", "intField", "longField", "doubleField", "isActive"]),
    ("cow_v8_nonpartitioned", ["id", "intField", "longField", "doubleField", "isActive"]),
    ("cow_v6_simplekeygen_nonhivestyle_overwritetable", ["id", "intField", "longField", "isActive"]),
    ("cow_v8_complexkeygen_hivestyle", ["id", "intField", "longField", "isActive"]),
    ("cow_v9_txns_simple_nometa", ["txn_ts", "txn_date", "is_international"]),
]


def hudi_table(tmp_path, zip_name: str):
    """The table a fixture zip holds, unpacked under TMP_PATH."""
    import zipfile

    dst = tmp_path / zip_name
    with zipfile.ZipFile(HUDI / f"{zip_name}.zip") as z:
        z.extractall(dst)
    root = [p for p in dst.iterdir() if p.is_dir() and not p.name.startswith("__MACOSX")]
    assert len(root) == 1, root
    return root[0]


def hudi_rows(path, columns, as_of=None) -> list[tuple]:
    """The rows the hudi package reads of COLUMNS (at instant AS_OF), sorted."""
    tfs.require("hudi", "the hudi package is not installed (scripts/setup installs it)")
    import hudi

    table = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    options = hudi.HudiReadOptions()
    if as_of is not None:
        options = options.with_as_of_timestamp(str(as_of))
    batches = table.read(options)
    t = pa.Table.from_batches(batches) if isinstance(batches, list) else batches
    cols = [t.column(c).cast(pa.int32()) if pa.types.is_date32(t.column(c).type) else t.column(c) for c in columns]
    return sorted(zip(*[c.to_pylist() for c in cols]))


def served_rows(m: tfs.Mount, columns) -> list[tuple]:
    got = epoch_columns(m, columns)
    return sorted(zip(*[got[c].tolist() for c in columns]))


def hudi_instants(path) -> list[int]:
    import hudi

    timeline = hudi.HudiTableBuilder.from_base_uri(str(path)).build().get_timeline()
    commits = list(timeline.get_completed_commits()) + list(timeline.get_completed_replacecommits())
    return sorted({int(i.timestamp) for i in commits})


@pytest.mark.parametrize("name,columns", HUDI_TABLES)
def test_hudi_copy_on_write_tables_are_read_as_hudi_reads_them(mounter, tmp_path, name, columns):
    path = hudi_table(tmp_path, name)
    instants = hudi_instants(path)
    assert instants, name
    latest = mounter(path, f"columns={':'.join(columns)}", "batch_size=5", "shuffle=none")
    dj = latest.dataset()
    assert dj["origin"]["from"] == "hudi table" and dj["origin"]["version"] == instants[-1], dj["origin"]
    assert served_rows(latest, columns) == hudi_rows(path, columns), name
    latest.unmount()
    for instant in instants[:-1]:
        m = mounter(path, f"version={instant}", f"columns={':'.join(columns)}", "batch_size=5", "shuffle=none")
        assert served_rows(m, columns) == hudi_rows(path, columns, instant), (name, instant)
        m.unmount()


def timeline_instants(path) -> list[int]:
    """Every completed commit, delta commit and replace commit of a Hudi table, by request
    time (`.hoodie/` up to table version 6; `.hoodie/timeline/REQUEST_COMPLETION.ACTION` from 8 on)."""
    out = set()
    for d in (path / ".hoodie" / "timeline", path / ".hoodie"):
        for f in d.iterdir() if d.is_dir() else []:
            stem, _, action = f.name.partition(".")
            if action in ("commit", "deltacommit", "replacecommit") and stem.split("_")[0].isdigit():
                out.add(int(stem.split("_")[0]))
    return sorted(out)


# hudi-rs's merge-on-read tables: Avro data and delete blocks (table versions 6, 8, 9), Parquet
# data blocks with a rollback command block, a table without meta fields (keys from its key
# field), an insert overwrite, a compaction and a clustering.
HUDI_MOR_TABLES = [
    "mor_avro_v9_txns_simple_nometa",
    "mor_avro_v8_trips_8i3u1d",
    "mor_avro_v6_trips_8i3d",
    "mor_parquet_v6_nonpartitioned_rollback",
    "mor_parquet_v6_simplekeygen_hivestyle_no_metafields",
]


@pytest.mark.parametrize("name", HUDI_MOR_TABLES)
def test_a_hudi_merge_on_read_table_is_its_base_files_and_log_files_merged(mounter, tmp_path, name):
    """At every completed instant, the rows `hudi` reads with the logs merged (its numeric and
    boolean columns, compared as sorted rows)."""
    path = hudi_table(tmp_path, name)
    base = next(p for p in sorted(path.rglob("*.parquet")) if ".hoodie" not in p.parts)
    columns = [
        f.name
        for f in pq.read_schema(base)
        if not f.name.startswith("_hoodie") and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type))
    ][:4]
    assert columns, name
    instants = timeline_instants(path)
    assert instants, name
    opts = (f"columns={':'.join(columns)}", "batch_size=5", "shuffle=none")
    for instant in instants:
        m = mounter(path, f"version={instant}", *opts)
        want = hudi_rows(path, columns, instant)
        assert served_rows(m, columns) == want, (name, instant)
        assert m.dataset()["rows"] == len(want), (name, instant)
        m.unmount()


def test_a_snapshot_pins_a_hudi_merge_on_read_instant_with_its_logs(mounter, tmp_path):
    """A snapshot of a merge-on-read instant whose slices have log files: mounted after the
    log files are gone, it serves the same rows (the merged log records are in the snapshot)."""
    path = hudi_table(tmp_path, "mor_avro_v9_txns_simple_nometa")
    columns = ["txn_ts", "is_international"]
    opts = (f"columns={':'.join(columns)}", "batch_size=5", "shuffle=none")
    instant = timeline_instants(path)[5]
    want = hudi_rows(path, columns, instant)
    pin = tmp_path / "mor.snapshot"
    proc = tfs.run(["snapshot", path, pin, "-o", ",".join([*opts, f"version={instant}"])])
    assert proc.returncode == 0, proc.stderr
    logs = [p for p in path.rglob(".*.log.*")]
    assert logs, "the table has log files"
    for p in logs:
        p.unlink()
    m = mounter(path, *opts, f"snapshot={pin}")
    assert m.dataset()["origin"]["version"] == instant
    assert served_rows(m, columns) == want


def test_hudi_tables_that_cannot_be_read_are_refused_in_one_line(mounter, tmp_path):
    cow = hudi_table(tmp_path, "cow_v6_nonpartitioned")
    line = tfs.refused_mount(mounter, cow, "version=20200101000000000", "columns=id")
    assert "no completed commit at instant 20200101000000000" in line, line
    # A data file of the table alone is no dataset: it holds superseded rows.
    line = tfs.refused_mount(mounter, next(cow.glob("*.parquet")))
    assert "inside the Apache Hudi table" in line, line


def test_a_snapshot_pins_a_hudi_instant(mounter, tmp_path):
    path = hudi_table(tmp_path, "cow_v9_txns_simple_nometa")
    opts = ("columns=txn_ts:is_international", "batch_size=4", "shuffle=none")
    first = hudi_instants(path)[0]
    pin = tmp_path / "hudi.snapshot"
    proc = tfs.run(["snapshot", path, pin, "-o", ",".join([*opts, f"version={first}"])])
    assert proc.returncode == 0, proc.stderr
    m = mounter(path, *opts, f"snapshot={pin}")
    assert m.dataset()["origin"]["version"] == first
    assert served_rows(m, ["txn_ts", "is_international"]) == hudi_rows(path, ["txn_ts", "is_international"], first)


# --------------------------------------------------------------------------------------------
# Apache Iceberg: tables written by pyiceberg (a SQLite catalog on local files), against
# pyiceberg's scan(snapshot_id).to_arrow()
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def iceberg_table(tmp_path_factory):
    """A table of 5 snapshots: an append, an append, a copy-on-write delete, a column added (x2
    = id * 3, null in the files before), a column renamed (x to score) and an append; identity
    partitioned by `part`. Returns (table root, the catalog's table)."""
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType

    base = tmp_path_factory.mktemp("iceberg")
    catalog = SqlCatalog("default", uri=f"sqlite:///{base}/catalog.db", warehouse=f"file://{base}/warehouse")
    catalog.create_namespace("db")

    def rows(start, n):
        ids = np.arange(start, start + n, dtype=np.int64)
        return pa.table({"id": ids, "x": (ids / 2).astype(np.float32), "part": (ids % 3).astype(np.int32)})

    schema = rows(0, 1).schema
    t = catalog.create_table("db.t", schema=schema)
    with t.update_spec() as spec:
        spec.add_identity("part")
    t.append(rows(0, 300))
    t.append(rows(300, 200))
    t.delete("id < 50")
    with t.update_schema() as s:
        s.add_column("x2", LongType())
    t.append(rows(500, 100).append_column("x2", pa.array(np.arange(500, 600, dtype=np.int64) * 3)))
    with t.update_schema() as s:
        s.rename_column("x", "score")
    t = catalog.load_table("db.t")
    t.append(pa.table({"id": np.arange(600, 650, dtype=np.int64), "score": np.ones(50, np.float32),
                       "part": np.zeros(50, np.int32), "x2": np.arange(50, dtype=np.int64)}))
    t = catalog.load_table("db.t")
    root = Path(t.metadata.location.removeprefix("file://"))
    return root, t


def iceberg_rows(table, snapshot_id, columns) -> list[tuple]:
    t = table.scan(snapshot_id=snapshot_id).to_arrow()
    return sorted(zip(*[t.column(c).to_pylist() for c in columns]))


def test_every_snapshot_of_an_iceberg_table_is_pyicebergs(mounter, iceberg_table):
    root, table = iceberg_table
    snapshots = [s.snapshot_id for s in table.snapshots()]
    assert len(snapshots) >= 5
    for sid in snapshots:
        schema = table.scan(snapshot_id=sid).projection()
        columns = [f.name for f in schema.fields]
        m = mounter(root, f"version={sid}", f"columns={':'.join(columns)}", "batch_size=64", "shuffle=none", "nulls=zero")
        dj = m.dataset()
        assert dj["origin"]["from"] == "iceberg table" and dj["origin"]["version"] == sid, dj["origin"]
        want = iceberg_rows(table, sid, columns)
        got = epoch_columns(m, columns + [f"{c}.mask" for c in columns if f"{c}.mask" in {t['name'] for t in dj["tensors"]}])
        # A column added later is null in the older files: zero with its mask, as nulls=zero says.
        served = []
        for c in columns:
            mask = got.get(f"{c}.mask")
            served.append([None if mask is not None and not mask[i] else v for i, v in enumerate(got[c].tolist())])
        assert sorted(zip(*served)) == want, sid
        m.unmount()
    # The current snapshot without version=, its columns renamed and added.
    m = mounter(root, "batch_size=64", "shuffle=none", "columns=id:score:part")
    assert m.dataset()["origin"]["version"] == table.current_snapshot().snapshot_id
    assert served_rows(m, ["id", "score", "part"]) == iceberg_rows(table, None, ["id", "score", "part"])


def test_an_iceberg_table_named_by_its_metadata_file_is_read_by_it(mounter, iceberg_table):
    root, table = iceberg_table
    import json

    # The first metadata file with a snapshot: the table after its first append.
    first = next(p for p in sorted((root / "metadata").glob("*.metadata.json"))
                 if (json.loads(p.read_text()).get("current-snapshot-id") or -1) >= 0)
    m = mounter(first, "batch_size=64", "shuffle=none", "columns=id:x:part")
    sid = m.dataset()["origin"]["version"]
    assert served_rows(m, ["id", "x", "part"]) == iceberg_rows(table, sid, ["id", "x", "part"])


def commit_delete_file(root: Path, delete_path: Path, content: str, record_count: int, partition=(),
                       equality_ids=None) -> int:
    """Commits a snapshot adding the delete file DELETE_PATH (under ROOT/data) to the table at
    ROOT, as a merge-on-read engine commits one: its manifest, a manifest list and a metadata
    file, written with pyiceberg's own writers. CONTENT: "position" or "equality"; PARTITION:
    the partition's values under the current spec (none: unpartitioned). Returns the snapshot's
    id."""
    import json
    import time
    import uuid

    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import (DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntry,
                                    ManifestEntryStatus, ManifestWriterV2, write_manifest_list)

    class DeleteManifestWriter(ManifestWriterV2):
        """pyiceberg's format 2 manifest writer, for a manifest of delete files."""

        def content(self):
            return ManifestContent.DELETES
    from pyiceberg.table import StaticTable
    from pyiceberg.typedef import Record

    metadata = sorted((root / "metadata").glob("*.metadata.json"))[-1]
    t = StaticTable.from_metadata(f"file://{metadata}")
    md, snap, io = t.metadata, t.current_snapshot(), PyArrowFileIO()
    sid, seq = snap.snapshot_id + 1, md.last_sequence_number + 1
    location = md.location
    kind = {"position": DataFileContent.POSITION_DELETES, "equality": DataFileContent.EQUALITY_DELETES}[content]
    extra = {"equality_ids": equality_ids} if equality_ids else {}
    df = DataFile.from_args(content=kind, file_path=f"{location}/data/{delete_path.name}",
                            file_format=FileFormat.PARQUET, partition=Record(*partition), record_count=record_count,
                            file_size_in_bytes=delete_path.stat().st_size, **extra)
    df.spec_id = t.spec().spec_id
    mpath = f"{location}/metadata/{uuid.uuid4()}-m0.avro"
    with DeleteManifestWriter(t.spec(), t.schema(), io.new_output(mpath), sid, "deflate") as w:
        w.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=sid, sequence_number=seq,
                                      file_sequence_number=seq, data_file=df))
    mf = w.to_manifest_file()
    lpath = f"{location}/metadata/snap-{sid}-0-{uuid.uuid4()}.avro"
    with write_manifest_list(2, io.new_output(lpath), sid, snap.snapshot_id, seq, "deflate") as lw:
        lw.add_manifests([*snap.manifests(io), mf])
    j = json.loads(metadata.read_text())
    j["snapshots"].append({"snapshot-id": sid, "parent-snapshot-id": snap.snapshot_id, "sequence-number": seq,
                           "timestamp-ms": int(time.time() * 1000), "manifest-list": lpath,
                           "summary": {"operation": "delete"}, "schema-id": j["current-schema-id"]})
    j["current-snapshot-id"] = sid
    j["refs"] = {"main": {"snapshot-id": sid, "type": "branch"}}
    j["last-sequence-number"] = seq
    number = int(metadata.name.split("-")[0]) + 1
    (root / "metadata" / f"{number:05d}-{uuid.uuid4()}.metadata.json").write_text(json.dumps(j))
    return sid


def add_position_deletes(root: Path, deletes: dict[str, list[int]]) -> int:
    """Commits a snapshot of position deletes (data file URI -> row positions) to the table at
    ROOT. Returns the snapshot's id."""
    import uuid

    paths = [p for p, pos in deletes.items() for _ in pos]
    positions = [x for pos in deletes.values() for x in pos]
    delete_path = root / "data" / f"pos-deletes-{uuid.uuid4()}.parquet"
    pq.write_table(pa.table({"file_path": paths, "pos": pa.array(positions, pa.int64())}), delete_path)
    return commit_delete_file(root, delete_path, "position", len(positions))


def add_equality_deletes(root: Path, rows: dict[str, tuple[int, pa.Array]], partition=()) -> int:
    """Commits a snapshot of equality deletes to the table at ROOT: ROWS maps each column to
    (its field id, the deleted rows' values); PARTITION the partition they apply to. Returns
    the snapshot's id."""
    import uuid

    fields = [pa.field(name, values.type, metadata={b"PARQUET:field_id": str(fid).encode()})
              for name, (fid, values) in rows.items()]
    table = pa.Table.from_arrays([values for _, values in rows.values()], schema=pa.schema(fields))
    delete_path = root / "data" / f"eq-deletes-{uuid.uuid4()}.parquet"
    pq.write_table(table, delete_path)
    ids = [fid for fid, _ in rows.values()]
    return commit_delete_file(root, delete_path, "equality", table.num_rows, partition, equality_ids=ids)


def test_position_deletes_of_an_iceberg_table_are_applied(mounter, tmp_path):
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import StaticTable

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    ids = np.arange(1000, dtype=np.int64)
    t = catalog.create_table("db.p", schema=pa.schema([("id", pa.int64()), ("x", pa.float32())]))
    t.append(pa.table({"id": ids[:600], "x": ids[:600].astype(np.float32)}))
    t.append(pa.table({"id": ids[600:], "x": ids[600:].astype(np.float32)}))
    root = Path(t.metadata.location.removeprefix("file://"))
    data = sorted(f"{t.metadata.location}/data/{p.name}" for p in (root / "data").glob("*.parquet"))
    sid = add_position_deletes(root, {data[0]: [0, 5, 17, 300], data[1]: [1, 2, 399]})
    latest = sorted((root / "metadata").glob("*.metadata.json"))[-1]
    ref = StaticTable.from_metadata(f"file://{latest}")
    want = iceberg_rows(ref, sid, ["id", "x"])
    assert len(want) == 1000 - 7
    m = mounter(root, "batch_size=50", "shuffle=none")
    assert m.dataset()["origin"]["version"] == sid and m.dataset()["rows"] == 993
    assert served_rows(m, ["id", "x"]) == want
    # Pinned by a snapshot: the same rows, the deletes with them.
    pin = tmp_path / "p.snapshot"
    assert tfs.run(["snapshot", root, pin]).returncode == 0
    pinned = mounter(root, "batch_size=50", "shuffle=none", f"snapshot={pin}")
    assert served_rows(pinned, ["id", "x"]) == want


@pytest.mark.usefixtures("hermetic_env")
def test_equality_deletes_of_an_iceberg_table_are_applied(mounter, tmp_path, s3, proxy):
    """Equality deletes as a merge-on-read engine commits them: by key (an id deleted, one
    written again after the delete and so kept), by a column with nulls (null equal to null,
    a column the mount does not serve), and scoped to a partition. pyiceberg refuses to read
    equality deletes, so the reference is the rows appended less those the deletes match in
    older data files."""
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    schema = pa.schema([("id", pa.int64()), ("x", pa.float32()), ("g", pa.int32())])

    def rows(ids, g):
        ids = np.asarray(ids, dtype=np.int64)
        return pa.table({"id": ids, "x": ids.astype(np.float32) / 2, "g": pa.array(g, pa.int32())}, schema=schema)

    t = catalog.create_table("db.e", schema=schema)
    appended = [rows(range(600), [None if i % 7 == 0 else i % 5 for i in range(600)]),
                rows(range(600, 1000), [i % 5 for i in range(600, 1000)])]
    for a in appended:
        t.append(a)
    root = Path(t.metadata.location.removeprefix("file://"))
    field = {f.name: f.field_id for f in t.schema().fields}
    live = {(r["id"], r["x"], r["g"]) for a in appended for r in a.to_pylist()}

    # Ids deleted (5000 matches nothing); then 3 and 10 appended again, after the delete.
    sid1 = add_equality_deletes(root, {"id": (field["id"], pa.array([3, 10, 700, 999, 5000], pa.int64()))})
    live = {r for r in live if r[0] not in {3, 10, 700, 999}}
    want1 = sorted((i, x) for i, x, _ in live)
    again = rows([3, 10], [None, 1])
    # The catalog knows the table as it was before the delete: it is registered again at its
    # newest metadata file, and appended to from there.
    latest = sorted((root / "metadata").glob("*.metadata.json"))[-1]
    t = catalog.register_table("db.e_after", f"file://{latest}")
    t.append(again)
    live |= {(r["id"], r["x"], r["g"]) for r in again.to_pylist()}
    sid_again = t.current_snapshot().snapshot_id
    want_again = sorted((i, x) for i, x, _ in live)
    # Every row whose g is null, in every data file older than this delete: id 3, appended
    # again with a null g, too.
    sid2 = add_equality_deletes(root, {"g": (field["g"], pa.array([None], pa.int32()))})
    live = {r for r in live if r[2] is not None}
    want2 = sorted((i, x) for i, x, _ in live)
    assert len(want1) == 996 and {(3, 1.5), (10, 5.0)} <= set(want_again)
    assert (3, 1.5) not in want2 and (10, 5.0) in want2 and (0, 0.0) not in want2

    for sid, want in ((sid1, want1), (sid_again, want_again), (sid2, want2)):
        m = mounter(root, f"version={sid}", "columns=id:x", "batch_size=50", "shuffle=none")
        assert m.dataset()["rows"] == len(want), sid
        assert served_rows(m, ["id", "x"]) == want, sid
        m.unmount()
    # Pinned by a snapshot: the rows the deletes leave, without reading them again.
    pin = tmp_path / "e.snapshot"
    assert tfs.run(["snapshot", root, pin, "-o", "columns=id:x"]).returncode == 0
    pinned = mounter(root, "columns=id:x", "batch_size=50", "shuffle=none", f"snapshot={pin}")
    assert served_rows(pinned, ["id", "x"]) == want2
    # From object storage: the key columns read by ranged requests.
    from conftest import BUCKET, s3_opts

    for f in sorted(root.rglob("*")):
        if f.is_file():
            s3.put(f"eq/{f.relative_to(root)}", f)
    remote = mounter(f"s3://{BUCKET}/eq/", "columns=id:x", "batch_size=50", "shuffle=none", *s3_opts(proxy.url))
    assert served_rows(remote, ["id", "x"]) == want2

    # Scoped to a partition: ids 1, 2, 4, 7 deleted in partition part=1 only (2 is in part=2).
    p = catalog.create_table("db.p", schema=pa.schema([("id", pa.int64()), ("part", pa.int32())]))
    with p.update_spec() as spec:
        spec.add_identity("part")
    ids = np.arange(30, dtype=np.int64)
    p.append(pa.table({"id": ids, "part": (ids % 3).astype(np.int32)}))
    proot = Path(p.metadata.location.removeprefix("file://"))
    pfield = {f.name: f.field_id for f in p.schema().fields}
    sid = add_equality_deletes(proot, {"id": (pfield["id"], pa.array([1, 2, 4, 7], pa.int64()))}, partition=(1,))
    m = mounter(proot, f"version={sid}", "batch_size=8", "shuffle=none")
    assert served_rows(m, ["id"]) == sorted((i,) for i in range(30) if i not in {1, 4, 7})


def test_iceberg_tables_that_cannot_be_read_are_refused_in_one_line(mounter, iceberg_table):
    root, table = iceberg_table

    line = tfs.refused_mount(mounter, root, "version=12345")
    assert "no snapshot 12345" in line, line
    line = tfs.refused_mount(mounter, next((root / "data").rglob("*.parquet")))
    assert "inside the Apache Iceberg table" in line, line


@pytest.mark.usefixtures("hermetic_env")
def test_every_table_kind_on_s3_and_from_a_snapshot_of_it(mounter, s3, proxy, iceberg_table, tmp_path):
    """A Delta table with deletion vectors, a Hudi table and an Iceberg table, each uploaded to
    the S3 emulator: mounted from it, and from a snapshot of it written to it, they serve the
    bytes the same table serves from local files."""
    from conftest import BUCKET, s3_opts

    tables = {
        "delta-dv": (FIXTURES / "table_with_deletion_logs", "columns=id:age:nbr"),
        "hudi": (hudi_table(tmp_path, "cow_v9_txns_simple_nometa"), "columns=txn_ts:is_international"),
        "iceberg": (iceberg_table[0], "columns=id:score:part"),
    }
    for prefix, (root, columns) in tables.items():
        for p in sorted(root.rglob("*")):
            if p.is_file():
                s3.put(f"{prefix}/{p.relative_to(root)}", p)
        opts = (columns, "batch_size=16", "shuffle=none")
        src = f"s3://{BUCKET}/{prefix}/"
        remote = mounter(src, *opts, *s3_opts(proxy.url))
        local = mounter(root, *opts)
        n = local.dataset()["batches_per_epoch"]
        want = tfs.batch_hashes(local, ["epoch-0"], n)
        assert remote.dataset()["fingerprint"] != local.dataset()["fingerprint"]  # another place
        assert tfs.batch_hashes(remote, ["epoch-0"], n) == want, prefix
        pin = f"s3://{BUCKET}/pins/{prefix}.snapshot"
        proc = tfs.run(["snapshot", src, pin, "-o", ",".join([*opts, *s3_opts(proxy.url)])])
        assert proc.returncode == 0, proc.stderr
        proxy.reset_stats()
        pinned = mounter(src, *opts, f"snapshot={pin}", *s3_opts(proxy.url))
        assert proxy.stats()["listings"] == 0, prefix
        assert pinned.dataset()["origin"]["version"] == local.dataset()["origin"]["version"], prefix
        assert tfs.batch_hashes(pinned, ["epoch-0"], n) == want, prefix


def test_files_added_to_an_iceberg_table_without_field_ids_are_read_by_name(mounter, tmp_path):
    """Files written elsewhere and added to a table (pyiceberg's add_files, a migration) carry no
    field ids: their columns are the table's by name, as pyiceberg's name mapping reads them."""
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    t = catalog.create_table("db.added", schema=pa.schema([("id", pa.int64()), ("x", pa.float32())]))
    loose = tmp_path / "loose.parquet"
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64), "x": np.arange(40, dtype=np.float32) / 4}), loose)
    root = Path(t.metadata.location.removeprefix("file://"))
    (root / "data").mkdir(parents=True, exist_ok=True)
    added = root / "data" / "loose.parquet"
    added.write_bytes(loose.read_bytes())
    t.add_files([f"{t.metadata.location}/data/loose.parquet"])
    t = catalog.load_table("db.added")
    m = mounter(root, "batch_size=8", "shuffle=none")
    assert served_rows(m, ["id", "x"]) == iceberg_rows(t, None, ["id", "x"])


def test_a_snapshot_and_another_version_are_refused_together(mounter, tmp_path):
    src = FIXTURES / "table_with_deletion_logs"
    pin = tmp_path / "v8.snapshot"
    assert tfs.run(["snapshot", src, pin, "-o", "version=8,columns=id"]).returncode == 0
    mnt = mounter.mountpoint()
    proc = tfs.run(["mount", src, mnt, "-o", f"snapshot={pin},version=9,columns=id,cache_dir={mnt}-c"])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and "version=9 disagrees with snapshot" in line and "pins version 8" in line, line
    m = mounter(src, f"snapshot={pin}", "version=8", "columns=id")
    assert m.dataset()["origin"]["version"] == 8


# --------------------------------------------------------------------------------------------
# Time travel by time: version= as an ISO 8601 time (PRODUCT.md §8)
# --------------------------------------------------------------------------------------------


def iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_delta_version_by_time_is_the_last_commit_at_or_before_it(mounter, tmp_path):
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    import datetime as dt

    path = tmp_path / "delta-times"
    for k in range(4):
        dl.write_deltalake(str(path), delta_rows(100 * k, 50), mode="append")
    # Commits a day apart, as a table appended daily has them (a version's time is its commit
    # file's, by the protocol).
    day0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp()
    for k in range(4):
        t = day0 + k * 86400
        os.utime(path / "_delta_log" / f"{k:020}.json", (t, t))
    for when, version in [("2026-11-02T12:00:00Z", 1), ("2026-11-03", 2), ("2026-11-09T00:00:00+02:00", 3)]:
        m = mounter(path, f"version={when}", "columns=id", "shuffle=none")
        dj = m.dataset()
        assert dj["origin"]["version"] == version, when
        t = dl.DeltaTable(str(path))
        t.load_as_version(dt.datetime.fromisoformat(when.replace("Z", "+00:00")) if "T" in when else dt.datetime(2026, 11, 3, tzinfo=dt.timezone.utc))
        assert t.version() == version
        assert dj["rows"] == t.to_pyarrow_table().num_rows
        m.unmount()
    line = tfs.refused_mount(mounter, path, "version=2026-10-01T00:00:00Z", "columns=id")
    assert "no version at or before 2026-10-01T00:00:00.000Z" in line and "its first, version 0" in line, line


def test_an_iceberg_snapshot_by_time_is_the_one_current_then(mounter, iceberg_table):
    root, table = iceberg_table
    log = table.metadata.snapshot_log
    assert len(log) >= 3
    for entry in log[1:]:
        at = entry.timestamp_ms
        for t in (at, at + 1):
            m = mounter(root, f"version={iso(t)}", "columns=id", "shuffle=none")
            assert m.dataset()["origin"]["version"] == table.snapshot_as_of_timestamp(t).snapshot_id
            m.unmount()
    line = tfs.refused_mount(mounter, root, f"version={iso(log[0].timestamp_ms - 1000)}", "columns=id")
    assert "no snapshot at or before" in line, line


def test_a_hudi_instant_by_time_is_the_last_completed_at_or_before_it(mounter, tmp_path, monkeypatch):
    import datetime as dt

    # The fixtures' timelines are in local time (Hudi's default): the daemon's zone is UTC.
    monkeypatch.setenv("TZ", "UTC")
    path = hudi_table(tmp_path, "cow_v8_complexkeygen_hivestyle")
    instants = hudi_instants(path)
    assert instants
    for instant in instants:
        s = str(instant)
        t = dt.datetime.strptime(s[:14], "%Y%m%d%H%M%S").replace(tzinfo=dt.timezone.utc)
        when = (t + dt.timedelta(milliseconds=int(s[14:] or 0))).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        m = mounter(path, f"version={when}", "columns=intField", "shuffle=none")
        assert m.dataset()["origin"]["version"] == instant, when
        m.unmount()


# --------------------------------------------------------------------------------------------
# Delta column mapping (name mode, as deltalake and Databricks write it)
# --------------------------------------------------------------------------------------------


def mapped_rows(path, columns) -> list[tuple]:
    """The table's rows as its files hold them, each file read by its physical column names
    and mapped back to the logical names of the latest schema (deltalake 1.6 reads such tables
    back as nulls), partition values added."""
    import deltalake

    t = deltalake.DeltaTable(str(path))
    logs = sorted((path / "_delta_log").glob("*.json"))
    meta = None
    for log in logs:
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                meta = action["metaData"]
    schema = json.loads(meta["schemaString"])
    physical = {f["metadata"]["delta.columnMapping.physicalName"]: f["name"] for f in schema["fields"]}
    rows = []
    for uri in t.file_uris():
        file = Path(uri.removeprefix("file://"))
        data = pq.read_table(file)
        data = data.rename_columns([physical.get(c, c) for c in data.column_names])
        rows += list(zip(*[data.column(c).to_pylist() for c in columns]))
    return sorted(rows)


def test_a_delta_table_with_column_mapping_is_read_by_its_logical_names(mounter, tmp_path):
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    path = tmp_path / "mapped"

    def rows(start, n):
        ids = np.arange(start, start + n, dtype=np.int64)
        return pa.table({"id": ids, "x": (ids / 4).astype(np.float64), "part": [f"p{i % 2}" for i in ids]})

    config = {"delta.columnMapping.mode": "name"}
    dl.write_deltalake(str(path), rows(0, 300), partition_by=["part"], configuration=config)
    dl.write_deltalake(str(path), rows(300, 200), mode="append", partition_by=["part"])
    # A rename, as Databricks commits one: the schema's logical name changes, the physical one
    # (what the files store) stays.
    log = path / "_delta_log"
    meta = [json.loads(l) for l in (log / f"{0:020}.json").read_text().splitlines()]
    meta = next(a["metaData"] for a in meta if "metaData" in a)
    schema = json.loads(meta["schemaString"])
    for f in schema["fields"]:
        if f["name"] == "x":
            f["name"] = "score"
    meta["schemaString"] = json.dumps(schema)
    (log / f"{2:020}.json").write_text(json.dumps({"metaData": meta}) + "\n")
    m = mounter(path, "columns=id:score", "shuffle=none")
    assert m.dataset()["origin"]["version"] == 2
    got = epoch_columns(m, ["id", "score"])
    assert sorted(zip(got["id"].tolist(), got["score"].tolist())) == mapped_rows(path, ["id", "score"])
    assert len(got["id"]) == 500
    # Before the rename the column is x; partition values and statistics (physical names) still
    # rule files out.
    old = mounter(path, "version=1", "columns=id:x", "shuffle=none", "where=part = 'p1' and x < 50")
    want = sorted(i for i in range(500) if i % 2 == 1 and i / 4 < 50)
    assert sorted(epoch_columns(old, ["id"])["id"].tolist()) == want
    assert old.dataset()["where"]["objects_ruled_out"] >= 1
    # Mode id: the files' field ids find the columns, whatever their names.
    meta["configuration"]["delta.columnMapping.mode"] = "id"
    for f in schema["fields"]:
        f["metadata"]["delta.columnMapping.physicalName"] = "not-" + f["metadata"]["delta.columnMapping.physicalName"]
    meta["schemaString"] = json.dumps(schema)
    (log / f"{3:020}.json").write_text(json.dumps({"metaData": meta}) + "\n")
    by_id = mounter(path, "columns=id:score", "shuffle=none")
    got_id = epoch_columns(by_id, ["id", "score"])
    assert sorted(zip(got_id["id"].tolist(), got_id["score"].tolist())) == sorted(zip(got["id"].tolist(), got["score"].tolist()))


# --------------------------------------------------------------------------------------------
# Iceberg tables behind a REST catalog (tests/iceberg_rest_server.py over a pyiceberg SQL catalog)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def rest_catalog(tmp_path):
    """A REST catalog on loopback holding db.events (two appends and a delete), its URL, and
    the SQL catalog behind it."""
    import subprocess
    import sys

    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog

    uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse"
    backing = SqlCatalog("backing", uri=uri, warehouse=warehouse)
    backing.create_namespace("db")
    rows = lambda s, n: pa.table({"id": np.arange(s, s + n, dtype=np.int64), "x": (np.arange(s, s + n) / 2).astype(np.float32)})
    t = backing.create_table("db.events", schema=rows(0, 1).schema)
    t.append(rows(0, 300))
    t.append(rows(300, 200))
    t.delete("id < 40")
    proc = subprocess.Popen(
        [sys.executable, str(tfs.REPO / "tests" / "iceberg_rest_server.py"), uri, warehouse,
         "--token", "tok-1", "--credential", "trainer:s3cret", "--prefix", "w1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url, backing
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_iceberg_table_is_read_through_a_rest_catalog_as_pyiceberg_reads_it(mounter, rest_catalog, tmp_path):
    from pyiceberg.catalog import load_catalog

    url, backing = rest_catalog
    reference = load_catalog("rest", type="rest", uri=url, token="tok-1").load_table("db.events")
    want = sorted(reference.scan().to_arrow().column("id").to_pylist())
    for auth in ("iceberg_token=tok-1", "iceberg_credential=trainer:s3cret"):
        m = mounter("iceberg:db.events", f"iceberg_uri={url}", auth, "columns=id", "shuffle=none")
        dj = m.dataset()
        assert dj["source"] == "iceberg:db.events"
        assert dj["origin"]["version"] == reference.current_snapshot().snapshot_id
        assert sorted(np.load(m.p("epoch-0", "all", "id.npy")).tolist()) == want
        # Credentials stay out of dataset.json.
        assert "tok-1" not in json.dumps(dj) and "s3cret" not in json.dumps(dj)
        m.unmount()
    # A snapshot of it, and a mount of the snapshot after the table moved on.
    pin = tmp_path / "events.snapshot"
    proc = tfs.run(["snapshot", "iceberg:db.events", pin, "-o", f"iceberg_uri={url},iceberg_token=tok-1,columns=id"])
    assert proc.returncode == 0, proc.stderr
    backing.load_table("db.events").append(pa.table({"id": np.arange(900, 950, dtype=np.int64), "x": np.zeros(50, np.float32)}))
    pinned = mounter("iceberg:db.events", f"iceberg_uri={url}", "iceberg_token=tok-1", f"snapshot={pin}", "columns=id", "shuffle=none")
    assert sorted(np.load(pinned.p("epoch-0", "all", "id.npy")).tolist()) == want
    now = mounter("iceberg:db.events", f"iceberg_uri={url}", "iceberg_token=tok-1", "columns=id", "shuffle=none")
    assert now.dataset()["rows"] == len(want) + 50


def test_a_rest_catalog_that_says_no_is_refused_in_one_line(mounter, rest_catalog):
    url, _ = rest_catalog
    line = tfs.refused_mount(mounter, "iceberg:db.nothing", f"iceberg_uri={url}", "iceberg_token=tok-1")
    assert "table db.nothing: HTTP 404: NoSuchTableException" in line, line
    line = tfs.refused_mount(mounter, "iceberg:db.events", f"iceberg_uri={url}", "iceberg_token=wrong")
    assert "HTTP 401: NotAuthorizedException" in line, line
    line = tfs.refused_mount(mounter, "iceberg:db.events")
    assert "-o iceberg_uri=URL" in line, line


def test_a_delta_version_by_time_follows_in_commit_timestamps(mounter, tmp_path):
    """A table with in-commit timestamps (Databricks writes them by default) times a version
    by its commitInfo's inCommitTimestamp, not by its commit file's modification time.
    deltalake 1.6 cannot write them: the commits are given them here as such a writer does
    (its commitInfo first), and their files all one modification time, now."""
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    import datetime as dt

    path = tmp_path / "delta-ict"
    for k in range(4):
        dl.write_deltalake(str(path), delta_rows(100 * k, 50), mode="append")
    day0 = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
    for k in range(4):
        commit = path / "_delta_log" / f"{k:020}.json"
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        info["inCommitTimestamp"] = day0 + k * 86_400_000
        rest = [a for a in actions if "commitInfo" not in a]
        commit.write_text("\n".join(json.dumps(a) for a in [{"commitInfo": info}, *rest]) + "\n")
    for when, version in [("2026-01-02T12:00:00Z", 1), ("2026-01-03", 2), ("2026-02-01", 3)]:
        m = mounter(path, f"version={when}", "columns=id", "shuffle=none")
        assert m.dataset()["origin"]["version"] == version, when
        assert m.dataset()["rows"] == 50 * (version + 1)
        m.unmount()
    line = tfs.refused_mount(mounter, path, "version=2025-12-31T00:00:00Z", "columns=id")
    assert "its first, version 0, was committed at 2026-01-01T00:00:00.000Z" in line, line
