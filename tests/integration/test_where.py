"""Views (PRODUCT.md §11): `where=EXPR` keeps the rows `pyarrow.dataset`'s filter of the same
expression keeps, pushed down to hive keys, row groups and rows; `bucket(COL, N)` is Iceberg's
bucket transform, as pyiceberg computes it; refusals in one line; snapshots pin the rows.

The rows a mount serves are read from `epoch-0/all/id.npy` under `shuffle=none`: the kept rows,
in the dataset's order.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import tfs

DAYS = 10
ROWS_PER_FILE = 2_000
RG = 500
REGIONS = ["eu", "us"]


def write_hive(path):
    """DAYS × REGIONS hive directories, each one file of ROWS_PER_FILE rows in row groups of
    RG; `id` ascends through the dataset (sorted row groups), `s` has nulls, `f` NaNs."""
    rng = np.random.default_rng(7)
    start = 0
    for day in range(1, DAYS + 1):
        for region in REGIONS:
            n = ROWS_PER_FILE
            ids = np.arange(start, start + n, dtype=np.int64)
            start += n
            s = rng.choice(["a", "b", "c", None], size=n).tolist()
            f = rng.random(n).astype(np.float32)
            f[rng.random(n) < 0.05] = np.nan
            t0 = dt.datetime(2024, 1, 1)
            table = pa.table(
                {
                    "id": ids,
                    "x": rng.random(n).astype(np.float32),
                    "s": pa.array(s, pa.string()),
                    "f": f,
                    "user": rng.integers(0, 500, n).astype(np.int64),
                    "ts": pa.array([t0 + dt.timedelta(hours=int(h)) for h in ids % 240], pa.timestamp("us")),
                    "d": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=int(k)) for k in ids % 9], pa.date32()),
                }
            )
            d = path / f"day={day}" / f"region={region}"
            d.mkdir(parents=True)
            pq.write_table(table, d / "part-0.parquet", row_group_size=RG)
    return path


@pytest.fixture(scope="module")
def hive(tmp_path_factory):
    return write_hive(tmp_path_factory.mktemp("where") / "data")


def served_ids(m: tfs.Mount) -> np.ndarray:
    return np.load(m.p("epoch-0", "all", "id.npy"))


def expected_ids(path, expr) -> np.ndarray:
    table = ds.dataset(path, format="parquet", partitioning="hive").to_table(filter=expr, columns=["id"])
    return np.sort(table.column("id").to_numpy())


F = ds.field
CASES = [
    ("day >= 8", F("day") >= 8),
    ("region = 'eu' and x > 0.5", (F("region") == "eu") & (F("x") > 0.5)),
    ("s is null or s in ('a'\\, 'b')", F("s").is_null() | F("s").isin(["a", "b"])),
    ("not (x between 0.2 and 0.7)", ~((F("x") >= 0.2) & (F("x") <= 0.7))),
    ("s != 'a'", F("s") != "a"),
    ("f > 0.5", F("f") > 0.5),
    ("not f <= 0.5", ~(F("f") <= 0.5)),
    ("id < 1234 or id >= 39000", (F("id") < 1234) | (F("id") >= 39000)),
    ("ts >= '2024-01-05 00:00:00' and d < '2024-01-04'",
     (F("ts") >= pa.scalar(dt.datetime(2024, 1, 5), pa.timestamp("us")))
     & (F("d") < pa.scalar(dt.date(2024, 1, 4), pa.date32()))),
    ("day in (2\\, 3) and not region = 'us' or s is null and id < 100",
     ((F("day").isin([2, 3])) & ~(F("region") == "us")) | (F("s").is_null() & (F("id") < 100))),
]


@pytest.mark.parametrize("expr,reference", CASES, ids=[c[0] for c in CASES])
def test_where_keeps_the_rows_pyarrow_dataset_keeps(mounter, hive, expr, reference):
    m = mounter(hive, "columns=id:x", "shuffle=none", f"where={expr}")
    want = expected_ids(hive, reference)
    got = served_ids(m)
    assert len(got) == len(want) > 0, (len(got), len(want))
    # The kept rows in the dataset's order: the order is the files', then the rows'.
    assert np.array_equal(np.sort(got), want)
    info = m.dataset()
    assert info["where"]["expr"] == expr.replace("\\,", ",")
    assert info["where"]["rows"] == len(want) == info["rows"]


def test_hive_keys_rule_objects_out_and_statistics_row_groups(mounter, hive):
    m = mounter(hive, "columns=id:x", "shuffle=none", "where=day >= 8 and id >= 33250")
    w = m.dataset()["where"]
    # Days 1..7 (14 objects) ruled out by their keys; of days 8..10 (ids 28000..39999), the
    # row groups wholly below 33250 by their statistics, the one across it read.
    assert w["objects_ruled_out"] == 14, w
    assert w["row_groups_ruled_out"] == (33000 - 28000) // RG, w
    assert w["row_groups_read"] == 1, w
    assert w["row_groups_kept_whole"] == (40000 - 33500) // RG, w
    # Files in lexicographic path order: day=10 before day=8.
    assert np.array_equal(np.sort(served_ids(m)), np.arange(33250, 40000))
    # Nothing of the ruled-out objects was read: not even their footers.
    assert len(m.dataset()["files"]) == 6


def test_a_where_drops_rows_before_batches_are_made(mounter, hive):
    """Batches are full batches of kept rows, in every shuffle; partitions hold over them."""
    full = mounter(hive, "columns=id:x", "shuffle=none", "where=region = 'eu'", "batch_size=256")
    kept = np.sort(served_ids(full))
    for opts in (["shuffle=global", "seed=3"], ["partitions=4", "world_size=2"]):
        m = mounter(hive, "columns=id:x", "where=region = 'eu'", "batch_size=256", *opts)
        info = m.dataset()
        assert info["rows"] == len(kept)
        ids = np.load(m.p("epoch-0", "all", "id.npy"))
        assert np.array_equal(np.sort(ids), kept), opts
        first = np.load(m.p("epoch-0", "000000", "id.npy"))
        assert len(first) == 256 and np.isin(first, kept).all()


def test_bucket_splits_by_user_as_pyiceberg_computes_them(mounter, hive):
    transforms = tfs.require("pyiceberg.transforms", "pyiceberg is not installed (scripts/setup installs it)")
    types = tfs.require("pyiceberg.types", "pyiceberg")
    bucket = transforms.BucketTransform(10).transform(types.LongType())
    table = ds.dataset(hive, format="parquet", partitioning="hive").to_table(columns=["id", "user"])
    b = np.array([bucket(int(u)) for u in table.column("user").to_pylist()])
    ids = table.column("id").to_numpy()
    train = mounter(hive, "columns=id", "shuffle=none", "where=bucket(user\\, 10) < 8")
    val = mounter(hive, "columns=id", "shuffle=none", "where=bucket(user\\, 10) >= 8")
    got_train, got_val = np.sort(served_ids(train)), np.sort(served_ids(val))
    assert np.array_equal(got_train, np.sort(ids[b < 8]))
    assert np.array_equal(got_val, np.sort(ids[b >= 8]))
    assert len(np.intersect1d(got_train, got_val)) == 0
    assert len(got_train) + len(got_val) == len(ids)


def test_bucket_of_strings_is_pyiceberg_s(mounter, tmp_path):
    transforms = tfs.require("pyiceberg.transforms", "pyiceberg is not installed (scripts/setup installs it)")
    types = tfs.require("pyiceberg.types", "pyiceberg")
    users = [f"user-{k}" for k in range(3000)] + ["", "ü😀"]
    data = tmp_path / "strings"
    data.mkdir()
    pq.write_table(pa.table({"id": np.arange(len(users)), "user": users}), data / "a.parquet", row_group_size=700)
    bucket = transforms.BucketTransform(7).transform(types.StringType())
    want = [i for i, u in enumerate(users) if bucket(u) in (0, 3)]
    m = mounter(data, "columns=id", "shuffle=none", "where=bucket(user\\, 7) in (0\\, 3)")
    assert served_ids(m).tolist() == want


@pytest.mark.parametrize(
    "expr,words",
    [
        ("regoin = 'eu'", ["no column 'regoin'", "nearest: region"]),
        ("x = 'high'", ["column 'x' is Float32", "string 'high' is a string"]),
        ("d > 'yesterday'", ["column 'd' is Date32", "'yesterday'"]),
        ("x > ", ["where=x >  does not parse", "at column 5"]),
        ("x > 1 and (", ["where=x > 1 and ( does not parse", "at column 12"]),
        ("x >> 1", ["where=x >> 1", "'>>' is no operator"]),
        ("x > 1 1", ["unexpected '1' at column 7"]),
        ("bucket(x\\, 4) = 1", ["bucket() takes", "Float32"]),
    ],
)
def test_a_bad_where_is_refused_in_one_line(mounter, hive, expr, words):
    line = tfs.refused_mount(mounter, hive, "columns=id", f"where={expr}")
    for w in words:
        assert w in line, line


def test_a_where_keeping_nothing_is_refused(mounter, hive):
    line = tfs.refused_mount(mounter, hive, "columns=id", "where=day > 99")
    assert "keeps no object" in line and "where=day > 99" in line, line


def test_a_where_that_drops_every_null_makes_a_nullable_column_servable(mounter, hive):
    line = tfs.refused_mount(mounter, hive, "columns=id:f2", "where=id < 10")
    assert "f2" in line  # no such column: the refusal names it
    # `s` cannot be served (a string), but `f` with nulls can be once its nulls are dropped.
    data = hive.parent / "nulls"
    data.mkdir(exist_ok=True)
    pq.write_table(
        pa.table({"id": np.arange(1000), "v": pa.array([None if k % 10 == 0 else float(k) for k in range(1000)])}),
        data / "a.parquet",
        row_group_size=100,
    )
    refused = tfs.refused_mount(mounter, data, "columns=id:v")
    assert "null" in refused, refused
    m = mounter(data, "columns=id:v", "shuffle=none", "where=v is not null")
    assert m.dataset()["rows"] == 900
    assert np.array_equal(np.load(m.p("epoch-0", "all", "v.npy")), np.array([float(k) for k in range(1000) if k % 10]))


def test_a_snapshot_pins_the_kept_rows(mounter, hive, tmp_path):
    pin = tmp_path / "view.snapshot"
    proc = tfs.run(["snapshot", hive, pin, "-o", "columns=id:x,where=region = 'us' and x < 0.3"])
    assert proc.returncode == 0, proc.stderr
    listed = mounter(hive, "columns=id:x", "shuffle=none", "where=region = 'us' and x < 0.3")
    pinned = mounter(hive, "columns=id:x", "shuffle=none", f"snapshot={pin}")
    assert pinned.dataset()["fingerprint"] == listed.dataset()["fingerprint"] == proc.stdout.strip()
    assert pinned.dataset()["where"]["expr"] == "region = 'us' and x < 0.3"
    assert np.array_equal(served_ids(pinned), served_ids(listed))
    # Another where, or none, is another dataset.
    none = mounter(hive, "columns=id:x", "shuffle=none")
    assert none.dataset()["fingerprint"] != listed.dataset()["fingerprint"]
    line = tfs.refused_mount(mounter, hive, "columns=id:x", f"snapshot={pin}", "where=x < 0.3")
    assert "disagrees with snapshot" in line and "where=region = 'us' and x < 0.3" in line, line


def test_the_cache_key_follows_the_where(mounter, hive):
    """The same file under another where serves other rows: never the first where's columns."""
    cache = hive.parent / "shared-cache"
    a = mounter(hive, "columns=id:x", "shuffle=none", "where=region = 'eu' and x < 0.5", cache=cache)
    ids_a = served_ids(a)
    a.unmount()
    b = mounter(hive, "columns=id:x", "shuffle=none", "where=region = 'eu' and x >= 0.5", cache=cache)
    ids_b = served_ids(b)
    assert len(np.intersect1d(ids_a, ids_b)) == 0
    want = expected_ids(hive, (F("region") == "eu") & (F("x") >= 0.5))
    assert np.array_equal(np.sort(ids_b), want)


# --------------------------------------------------------------------------------------------
# Tables: the rows each kind's own reader keeps under the same filter, deletes applied first.
# --------------------------------------------------------------------------------------------


def test_a_delta_table_s_kept_rows_are_deltalake_s(mounter, tmp_path):
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    path = tmp_path / "delta"

    def rows(start, n):
        ids = np.arange(start, start + n, dtype=np.int64)
        return pa.table({"id": ids, "x": (ids % 97).astype(np.float32), "year": (2020 + ids % 3).astype(np.int32)})

    dl.write_deltalake(str(path), rows(0, 3000), partition_by=["year"])
    dl.write_deltalake(str(path), rows(3000, 2000), mode="append", partition_by=["year"])
    dl.DeltaTable(str(path)).delete("id % 7 = 0")
    expr = "year in (2020\\, 2022) and x < 40"
    m = mounter(path, "columns=id:x", "shuffle=none", f"where={expr}")
    t = dl.DeltaTable(str(path)).to_pyarrow_dataset()
    want = np.sort(t.to_table(filter=F("year").isin([2020, 2022]) & (F("x") < 40), columns=["id"]).column("id").to_numpy())
    assert np.array_equal(np.sort(served_ids(m)), want)
    # The year=2021 files: ruled out by the log's partition values, their footers never read.
    assert m.dataset()["where"]["objects_ruled_out"] > 0


def test_an_iceberg_table_s_kept_rows_are_pyiceberg_s(mounter, tmp_path):
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("db")

    def rows(start, n):
        ids = np.arange(start, start + n, dtype=np.int64)
        return pa.table({"id": ids, "x": (ids / 2).astype(np.float32), "part": (ids % 3).astype(np.int32)})

    t = catalog.create_table("db.t", schema=rows(0, 1).schema)
    with t.update_spec() as spec:
        spec.add_identity("part")
    t.append(rows(0, 3000))
    t.append(rows(3000, 2000))
    t.delete("id < 500")
    t = catalog.load_table("db.t")
    root = Path(t.metadata.location.removeprefix("file://"))
    m = mounter(root, "columns=id", "shuffle=none", "where=part = 1 and id between 1000 and 4100")
    want = sorted(t.scan(row_filter="part = 1 and id >= 1000 and id <= 4100").to_arrow().column("id").to_pylist())
    assert sorted(served_ids(m).tolist()) == want


def test_a_hudi_table_s_kept_rows_are_hudi_s(mounter, tmp_path):
    import zipfile

    tfs.require("hudi", "the hudi package is not installed (scripts/setup installs it)")
    import hudi

    dst = tmp_path / "hudi"
    with zipfile.ZipFile(tfs.REPO / "tests" / "fixtures" / "hudi" / "cow_v8_complexkeygen_hivestyle.zip") as z:
        z.extractall(dst)
    root = [p for p in dst.iterdir() if p.is_dir() and not p.name.startswith("__MACOSX")][0]
    read = hudi.HudiTableBuilder.from_base_uri(str(root)).build().read(hudi.HudiReadOptions())
    table = pa.Table.from_batches(read) if isinstance(read, list) else read
    keep = pc.and_(pc.greater(table.column("intField"), 15000), pc.equal(table.column("isActive"), True))
    want = sorted(table.filter(keep).column("longField").to_pylist())
    assert want, "the filter keeps rows"
    m = mounter(root, "columns=longField", "shuffle=none", "batch_size=5", "where=intField > 15000 and isActive")
    assert sorted(np.load(m.p("epoch-0", "all", "longField.npy")).tolist()) == want


def test_objects_ruled_out_on_s3_are_never_fetched(mounter, s3, proxy, hive):
    import urllib.parse

    from conftest import BUCKET, s3_opts

    prefix = "where-hive"
    for p in sorted(hive.rglob("*.parquet")):
        s3.put(f"{prefix}/{p.relative_to(hive)}", p)
    proxy.reset_stats()
    m = mounter(f"s3://{BUCKET}/{prefix}/", "columns=id:x", "shuffle=none", "where=day >= 8", *s3_opts(proxy.url))
    got = served_ids(m)
    assert np.array_equal(np.sort(got), expected_ids(hive, F("day") >= 8))
    read = {urllib.parse.unquote(k).split(f"/{prefix}/", 1)[1] for k in proxy.stats()["keys"]}
    read = {k for k in read if k.endswith(".parquet")}
    assert read, proxy.stats()
    assert all(int(k.split("/")[0].removeprefix("day=")) >= 8 for k in read), sorted(read)


def test_a_delta_table_s_file_statistics_rule_files_out_before_their_footers(mounter, tmp_path):
    """Each append is one file of its own id range; Delta's add.stats rule files out with no
    footer read, and a maximum the log truncated (timestamps to milliseconds) still bounds."""
    dl = tfs.require("deltalake", "the deltalake package is not installed (scripts/setup installs it)")
    path = tmp_path / "delta-stats"
    t0 = np.datetime64("2026-01-01T00:00:00", "us")
    for k in range(6):
        ids = np.arange(k * 1000, (k + 1) * 1000, dtype=np.int64)
        # Each file's last time is 0.7 ms past a whole millisecond: its stats say less.
        ts = t0 + (ids * 1000 + 700).astype("timedelta64[us]")
        dl.write_deltalake(str(path), pa.table({"id": ids, "ts": pa.array(ts, pa.timestamp("us"))}), mode="append")
    m = mounter(path, "columns=id", "shuffle=none", "where=id >= 3500")
    assert m.dataset()["where"]["objects_ruled_out"] == 3
    assert np.array_equal(np.sort(served_ids(m)), np.arange(3500, 6000))
    # The last row of the file of ids 2000..2999 lies 0.7 ms past its stats' maximum.
    edge = str(t0 + np.timedelta64(2999 * 1000 + 500, "us")).replace("T", " ")
    m = mounter(path, "columns=id", "shuffle=none", f"where=ts > '{edge}'")
    want = dl.DeltaTable(str(path)).to_pyarrow_dataset().to_table(
        filter=F("ts") > pa.scalar(t0 + np.timedelta64(2999 * 1000 + 500, "us"), pa.timestamp("us")), columns=["id"])
    assert np.array_equal(np.sort(served_ids(m)), np.sort(want.column("id").to_numpy()))
    assert 2999 in served_ids(m)
    assert m.dataset()["where"]["objects_ruled_out"] == 2


def test_an_iceberg_table_s_column_bounds_rule_files_out_before_their_footers(mounter, tmp_path):
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("db")

    def rows(k):
        ids = np.arange(k * 1000, (k + 1) * 1000, dtype=np.int64)
        names = [f"n{i:06d}" for i in ids]
        return pa.table({"id": ids, "name": names, "x": (ids / 3).astype(np.float64)})

    t = catalog.create_table("db.b", schema=rows(0).schema)
    for k in range(5):
        t.append(rows(k))
    t = catalog.load_table("db.b")
    root = Path(t.metadata.location.removeprefix("file://"))
    for expr, pyice, ruled_out in [
        ("id >= 3100", "id >= 3100", 3),
        ("name < 'n001500'", "name < 'n001500'", 3),
        ("x between 700 and 800", "x >= 700 and x <= 800", 4),
    ]:
        m = mounter(root, "columns=id", "shuffle=none", f"where={expr}")
        want = sorted(t.scan(row_filter=pyice).to_arrow().column("id").to_pylist())
        assert sorted(served_ids(m).tolist()) == want, expr
        assert m.dataset()["where"]["objects_ruled_out"] == ruled_out, expr


@pytest.mark.parametrize("name", ["cow_v8_complexkeygen_hivestyle", "cow_v6_simplekeygen_nonhivestyle_overwritetable"])
def test_a_hudi_table_s_partition_paths_rule_files_out_before_their_footers(mounter, tmp_path, name):
    import zipfile

    tfs.require("hudi", "the hudi package is not installed (scripts/setup installs it)")
    import hudi

    dst = tmp_path / "hudi"
    with zipfile.ZipFile(tfs.REPO / "tests" / "fixtures" / "hudi" / f"{name}.zip") as z:
        z.extractall(dst)
    root = [p for p in dst.iterdir() if p.is_dir() and not p.name.startswith("__MACOSX")][0]
    read = hudi.HudiTableBuilder.from_base_uri(str(root)).build().read(hudi.HudiReadOptions())
    table = pa.Table.from_batches(read) if isinstance(read, list) else read
    values = sorted(set(table.column("byteField").to_pylist()))
    keep = values[0]
    want = sorted(table.filter(pc.equal(table.column("byteField"), keep)).column("longField").to_pylist())
    m = mounter(root, "columns=longField", "shuffle=none", "batch_size=5", f"where=byteField = {keep}")
    assert sorted(np.load(m.p("epoch-0", "all", "longField.npy")).tolist()) == want
    # The other partitions' files, ruled out by their paths (the non-hive-style table's latest
    # version holds one partition).
    assert (m.dataset()["where"]["objects_ruled_out"] >= 1) == (len(values) >= 2), values


def test_an_iceberg_manifest_whose_partitions_are_ruled_out_is_never_read(mounter, tmp_path):
    """The manifest list's partition summaries rule manifests out: their files are never even
    listed. Shown by removing those manifests: the mount with where= still reads the table."""
    tfs.require("pyiceberg", "pyiceberg is not installed (scripts/setup installs it)")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("db")

    def rows(part, n=400):
        ids = np.arange(part * 1000, part * 1000 + n, dtype=np.int64)
        return pa.table({"id": ids, "part": np.full(n, part, dtype=np.int32)})

    t = catalog.create_table("db.m", schema=rows(0).schema)
    with t.update_spec() as spec:
        spec.add_identity("part")
    for part in range(3):
        t.append(rows(part))
    t = catalog.load_table("db.m")
    root = Path(t.metadata.location.removeprefix("file://"))
    want = sorted(t.scan(row_filter="part = 1").to_arrow().column("id").to_pylist())
    manifests = t.current_snapshot().manifests(t.io)
    others = [m for m in manifests if m.partitions and m.partitions[0].lower_bound != (1).to_bytes(4, "little")]
    assert len(others) == 2, manifests
    for m in others:
        Path(m.manifest_path.removeprefix("file://")).unlink()
    m = mounter(root, "columns=id", "shuffle=none", "where=part = 1")
    assert sorted(served_ids(m).tolist()) == want
    assert m.dataset()["where"]["objects_ruled_out"] == 2
    # Without where=, those manifests are needed: their loss is a refusal.
    line = tfs.refused_mount(mounter, root, "columns=id")
    assert "manifest" in line, line


PAGED_ROWS = 40_000


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    """One row group of PAGED_ROWS rows in pages of about 1,000 (a page index written): `k`
    ascends (three apart), `v` is random, `s` has nulls."""
    rng = np.random.default_rng(3)
    n = PAGED_ROWS
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "k": np.arange(n, dtype=np.int64) * 3,
            "v": rng.random(n).astype(np.float32),
            "s": pa.array(rng.choice(["x", "y", None], n).tolist(), pa.string()),
        }
    )
    path = tmp_path_factory.mktemp("paged") / "data"
    path.mkdir()
    pq.write_table(
        table, path / "p.parquet", row_group_size=n, write_page_index=True, data_page_size=8 * 1024, use_dictionary=False
    )
    md = pq.ParquetFile(path / "p.parquet").metadata
    assert md.num_row_groups == 1 and md.row_group(0).column(1).has_offset_index
    return path


PAGED_CASES = [
    ("k between 3000 and 5999", (F("k") >= 3000) & (F("k") <= 5999), True),
    ("k < 600 or k >= 119000", (F("k") < 600) | (F("k") >= 119000), True),
    ("k >= 60000 and v > 0.5", (F("k") >= 60000) & (F("v") > 0.5), False),
    ("s is null and k < 30000", F("s").is_null() & (F("k") < 30000), False),
    ("not (k > 3000)", ~(F("k") > 3000), True),
]


@pytest.mark.parametrize("expr,reference,narrow", PAGED_CASES, ids=[c[0] for c in PAGED_CASES])
def test_the_page_index_settles_pages_without_reading_them(mounter, paged, expr, reference, narrow):
    """A row group the statistics leave open is decided page by page where the file has a page
    index: the rows are pyarrow's, and the pages the index settles are not read."""
    m = mounter(paged, "columns=id", "shuffle=none", f"where={expr}")
    assert np.array_equal(np.sort(served_ids(m)), expected_ids(paged, reference))
    w = m.dataset()["where"]
    assert w["row_groups_read"] == 1, w
    settled = w["rows_settled_by_page_index"]
    # A narrow range of the sorted column settles all but a page or two at each end.
    assert settled >= (0.9 if narrow else 0.2) * PAGED_ROWS, w


def test_pages_the_index_settles_are_never_fetched_from_s3(mounter, s3, proxy, paged, tmp_path):
    """The same file with and without a page index, the same where=: with it, the pages of k
    the index settles are not fetched (without it, k's whole chunk is read to decide)."""
    from conftest import BUCKET, s3_opts

    table = pq.read_table(paged / "p.parquet")
    plain = tmp_path / "plain.parquet"
    pq.write_table(table, plain, row_group_size=PAGED_ROWS, data_page_size=8 * 1024, use_dictionary=False)
    k_chunk = pq.ParquetFile(plain).metadata.row_group(0).column(1).total_compressed_size
    fetched = {}
    for name, path in [("indexed", paged / "p.parquet"), ("plain", plain)]:
        s3.put(f"paged-{name}/p.parquet", path)
        proxy.reset_stats()
        where = "where=k between 3000 and 5999"
        m = mounter(f"s3://{BUCKET}/paged-{name}/", "columns=id", "shuffle=none", where, *s3_opts(proxy.url))
        assert np.array_equal(np.sort(served_ids(m)), np.arange(1000, 2000))
        fetched[name] = proxy.stats()["bytes_forwarded"]
    assert fetched["indexed"] < fetched["plain"] - k_chunk / 2, (fetched, k_chunk)


def test_epoch_rows_without_a_mixture_is_refused_in_one_line(mounter, hive):
    """epoch_rows= sizes a mixture's epochs (tests/integration/test_mix.py): one source has none."""
    line = tfs.refused_mount(mounter, hive, "columns=id", "epoch_rows=100")
    assert "epoch_rows=100" in line and "mixture" in line, line
