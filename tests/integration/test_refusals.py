"""Refusals: exit code 1, exactly one stderr line `tensorfs: error: ...` naming the culprit,
nothing mounted. `tensorfs inspect` refuses the same way and describes good datasets."""

import decimal
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs


def write(path: Path, tables: dict[str, pa.Table], rg=100) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, t in tables.items():
        pq.write_table(t, path / name, row_group_size=rg)
    return path


def ids(n, start=0):
    return pa.array(np.arange(start, start + n, dtype=np.int64))


BAD_TYPES = {
    "label_text": pa.array([f"row {i}" for i in range(300)]),
    "blob_bin": pa.array([bytes([i % 256]) * 3 for i in range(300)], type=pa.binary()),
    "meta_struct": pa.array([{"a": i, "b": float(i)} for i in range(300)]),
    "attrs_map": pa.array([[("k", i)] for i in range(300)], type=pa.map_(pa.string(), pa.int32())),
    "price_dec": pa.array([decimal.Decimal(i) / 4 for i in range(300)], type=pa.decimal128(10, 2)),
    "tokens_list": pa.array([[i, i + 1][: i % 3] for i in range(300)], type=pa.list_(pa.int32())),
    # Parquet writes an empty fixed-size list as a null at the list's level.
    "empty_fsl": pa.array([[]] * 300, pa.list_(pa.int32(), 0)),
}


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """Datasets that must be refused, by case name: (source, expected names in the message)."""
    base = tmp_path_factory.mktemp("bad")
    out = {}
    for col, arr in BAD_TYPES.items():
        src = write(base / f"type-{col}", {"p0.parquet": pa.table({"id": ids(300), col: arr})})
        out[f"type-{col}"] = (src, [col, "columns"])

    # Nulls only in the second file's last row group.
    vals = np.arange(300, dtype=np.float32)
    mask = np.zeros(300, dtype=bool)
    mask[290] = True
    src = write(
        base / "nulls",
        {
            "p0.parquet": pa.table({"id": ids(300), "score_nullable": pa.array(vals)}),
            "p1.parquet": pa.table({"id": ids(300, 300), "score_nullable": pa.array(vals, mask=mask)}),
        },
    )
    out["nulls"] = (src, ["score_nullable"])

    # Schemas that disagree: a type, and a column name.
    src = write(
        base / "schema-type",
        {
            "part-a.parquet": pa.table({"id": ids(200), "x": pa.array(np.zeros(200, np.float32))}),
            "part-b.parquet": pa.table({"id": ids(200, 200), "x": pa.array(np.zeros(200, np.float64))}),
        },
    )
    out["schema-type"] = (src, ["part-a.parquet", "part-b.parquet"])
    src = write(
        base / "schema-name",
        {
            "one.parquet": pa.table({"id": ids(200), "x": pa.array(np.zeros(200, np.float32))}),
            "zzz.parquet": pa.table({"id": ids(200, 200), "y": pa.array(np.zeros(200, np.float32))}),
        },
    )
    out["schema-name"] = (src, ["one.parquet", "zzz.parquet"])

    # A file that is not Parquet at all.
    src = write(base / "malformed", {"good.parquet": pa.table({"id": ids(200)})})
    (src / "broken.parquet").write_bytes(b"PAR1 this is not a parquet file at all" * 10)
    out["malformed"] = (src, ["broken.parquet"])

    # Sources that do not exist, and one with nothing in it.
    out["missing-path"] = (base / "does-not-exist", ["does-not-exist"])
    out["missing-file-url"] = (f"file://{base}/no-such-dir-url", ["no-such-dir-url"])
    empty = base / "empty-dir"
    empty.mkdir()
    (empty / "notes.txt").write_text("no parquet here\n")
    out["empty-source"] = (empty, ["empty-dir"])
    return out


def refuse(cmd_args, mountpoint=None) -> str:
    proc = tfs.run(cmd_args, timeout=60)
    line = tfs.error_line(proc)
    if mountpoint is not None:
        assert not tfs.is_mounted(mountpoint), f"{mountpoint} was left mounted"
        if os.path.isdir(mountpoint):
            assert os.listdir(mountpoint) == []
    return line


DATA_CASES = [
    *[f"type-{c}" for c in BAD_TYPES],
    "nulls",
    "schema-type",
    "schema-name",
    "malformed",
    "missing-path",
    "missing-file-url",
    "empty-source",
]


@pytest.mark.parametrize("case", DATA_CASES)
def test_refused_dataset(bad, mounter, case):
    src, names = bad[case]
    mnt = mounter.mountpoint()
    opts = f"batch_size=64,cache_dir={mnt.parent / 'cache'}"
    line = refuse(["mount", src, mnt, "-o", opts], mnt)
    for n in names:
        assert n in line, f"{n!r} not named in: {line}"
    if case.startswith("type-") or case == "nulls":
        # The columns= option the message offers must leave the culprit out.
        col = case.removeprefix("type-") if case != "nulls" else "score_nullable"
        offered = re.findall(r"columns=([A-Za-z0-9_.:]+)", line)
        assert offered, f"no columns= option offered in: {line}"
        for value in offered:
            assert col not in value.split(":"), f"columns={value} does not leave out {col!r}: {line}"
    # inspect refuses the same way, without a mountpoint.
    line = refuse(["inspect", src, "-o", "batch_size=64"])
    for n in names:
        assert n in line, f"inspect: {n!r} not named in: {line}"


@pytest.mark.parametrize("col", list(BAD_TYPES))
def test_unsupported_column_excluded_by_columns(bad, mounter, col):
    src, _ = bad[f"type-{col}"]
    m = mounter(src, "columns=id", "shuffle=none", "batch_size=100")
    assert [t["name"] for t in m.dataset()["tensors"]] == ["id"]
    got = tfs.load_safetensors(m.p("epoch-0", "000002.safetensors"))
    tfs.assert_array(got["id"], np.arange(200, 300, dtype=np.int64), "id")


def test_nulls_error_is_the_default_and_explicit(bad, mounter):
    src, _ = bad["nulls"]
    mnt = mounter.mountpoint()
    line = refuse(["mount", src, mnt, "-o", f"nulls=error,cache_dir={mnt.parent / 'c'}"], mnt)
    assert "score_nullable" in line
    m = mounter(src, "nulls=zero", "shuffle=none", "batch_size=300")
    assert {t["name"] for t in m.dataset()["tensors"]} == {"id", "score_nullable", "score_nullable.mask"}


BAD_OPTIONS = [
    ("batch_size=0", "batch_size"),
    ("batch_size=abc", "batch_size"),
    ("batch_size=", "batch_size"),
    ("batch_size=-5", "batch_size"),
    ("shuffle=foo", "shuffle"),
    ("frobnicate=1", "frobnicate"),
    ("cast=id:complex128", "cast"),
    ("cast=id", "cast"),
    ("columns=id:nosuchcol", "columns"),
    ("nulls=maybe", "nulls"),
    ("passthrough=maybe", "passthrough"),
    ("shuffle_window=0", "shuffle_window"),
    ("world_size=0", "world_size"),
    ("epochs=abc", "epochs"),
    ("seed=abc", "seed"),
    ("memory_limit=12Q", "memory_limit"),
    ("pad=id:abc", "pad"),
    ("pad=nosuchcol:4", "nosuchcol"),
    ("cast=nosuchcol:float16", "nosuchcol"),
    ("stack=s:id+x", "stack"),  # int64 + float32: not one dtype
]


@pytest.mark.parametrize("opt,name", BAD_OPTIONS, ids=[o for o, _ in BAD_OPTIONS])
def test_refused_option(shuf_ds, mounter, opt, name):
    mnt = mounter.mountpoint()
    line = refuse(["mount", shuf_ds.path, mnt, "-o", f"{opt},cache_dir={mnt.parent / 'cache'}"], mnt)
    assert name in line, f"{name!r} not named in: {line}"


def test_options_naming_a_column_that_columns_leaves_out_are_no_error(shuf_ds, mounter):
    """A columns= hint pasted beside the cast= or pad= the user gave mounts: options on a
    column of the dataset that columns= leaves out have nothing to do."""
    m = mounter(shuf_ds.path, "columns=id", "cast=x:float16", "pad=x:4")
    assert [t["name"] for t in m.dataset()["tensors"]] == ["id"]


def test_refused_option_in_a_repeated_o(shuf_ds, mounter):
    mnt = mounter.mountpoint()
    args = ["mount", shuf_ds.path, mnt, "-o", "batch_size=64", "-o", "shuffle=sideways", "-o", f"cache_dir={mnt.parent / 'c'}"]
    assert "shuffle" in refuse(args, mnt)


def test_refused_in_helper_form(shuf_ds, mounter):
    mnt = mounter.mountpoint()
    assert "batch_size" in refuse([shuf_ds.path, mnt, "-o", f"batch_size=zero,cache_dir={mnt.parent / 'c'}"], mnt)


def test_refused_missing_mountpoint(shuf_ds, tmp_path):
    mnt = tmp_path / "no-such-mountpoint"
    line = refuse(["mount", shuf_ds.path, mnt, "-o", f"cache_dir={tmp_path / 'c'}"], mnt)
    assert "no-such-mountpoint" in line


def test_inspect_good(main_ds, mounter):
    opts = "shuffle=none,batch_size=256,pad=tokens:8"
    proc = tfs.run(["inspect", main_ds.path, "-o", opts])
    assert proc.returncode == 0, proc.stderr
    for name in ["tokens.len", "emb", "nest", "f16", "u64", "dict", "ts"]:
        assert name in proc.stdout, f"{name} not in inspect output:\n{proc.stdout}"

    m = mounter(main_ds.path, *opts.split(","))
    proc = tfs.run(["inspect", main_ds.path, "-o", ",".join(m.options), "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == m.dataset()


def test_inspect_without_options(shuf_ds):
    proc = tfs.run(["inspect", shuf_ds.path, "--json"])
    assert proc.returncode == 0, proc.stderr
    dj = json.loads(proc.stdout)
    assert dj["rows"] == 2600
    assert dj["batch_size"] == 1024
    assert dj["batches_per_epoch"] == 3
    assert [t["name"] for t in dj["tensors"]] == ["id", "x"]
    assert [t["dtype"] for t in dj["tensors"]] == ["int64", "float32"]


def test_footers_count_against_memory_limit(mounter, tmp_path):
    """The decoded footers stay in memory for the mount's life (about 5 KiB an object): they
    count against memory_limit, and a mount where they would take more than half of it is
    refused, naming what to raise it to; with enough, it mounts."""
    src = tmp_path / "many"
    src.mkdir()
    t = pa.table({f"c{k}": np.arange(4, dtype=np.float32) for k in range(16)})
    for i in range(300):
        pq.write_table(t, src / f"part-{i:04d}.parquet")
    mp = mounter.mountpoint()
    proc = tfs.run(["mount", src, mp, "-o", f"memory_limit=1M,cache_dir={mp.parent / 'c'}"])
    assert proc.returncode != 0 and not tfs.is_mounted(mp)
    line = tfs.error_line(proc)
    m = re.fullmatch(r"tensorfs: error: the footers of the dataset's 300 files and dataset\.json take "
                     r"([\d.]+) MiB of memory_limit=1\.0 MiB: raise memory_limit to at least ([\d.]+) MiB", line)
    assert m, line
    held, need = float(m.group(1)), float(m.group(2))
    assert 0.5 < held and abs(need - 2 * held) < 0.11, line
    mounted = mounter(src, f"memory_limit={math.ceil(need) + 1}M")
    assert len(mounted.dataset()["tensors"]) == 16
