"""Parquet files from the wild: written by fastparquet, polars, duckdb, Spark (parquet-java) and
pyarrow with unusual options (see wild/make_corpus.py). Each is served exactly as pyarrow reads
it, or refused at mount time with one clear line whose hint works when pasted back (PRODUCT.md
sections 4 and 7).

The corpus is generated at session start into a temporary directory. Set TENSORFS_WILD_SPARK=0
to leave out the Spark entries (they start a JVM: about 10 s).
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs

sys.path.insert(0, str(Path(__file__).resolve().parent / "wild"))
import make_corpus  # noqa: E402

PAD_L = 8  # the L used for every pad= option in the manifest and for pad= hints
BATCH = 64

ENTRY_NAMES = [e["name"] for e in make_corpus.ENTRIES]
ENTRY_PARAMS = [
    pytest.param(e["name"], marks=pytest.mark.xfail(reason=e["known_failure"], strict=True)) if e.get("known_failure")
    else e["name"]
    for e in make_corpus.ENTRIES
]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("wild")
    spark = os.environ.get("TENSORFS_WILD_SPARK", "1") != "0"
    manifest = make_corpus.build(out, spark=spark)
    entries = {e["name"]: e for e in manifest["entries"]}
    skipped = {s["name"]: s["reason"] for s in manifest["skipped"]}
    return out, entries, skipped


def get_entry(corpus, name):
    out, entries, skipped = corpus
    if name in skipped:
        pytest.skip(f"{name}: not built: {skipped[name]}")
    return out / name, entries[name]


# ---------------------------------------------------------------------------------------------
# pyarrow's reading, as tensors
# ---------------------------------------------------------------------------------------------

# ticks per day of each unit tensorfs or pyarrow may report
TEMPORAL_UNIT = {"D": 1, "s": 86400, "ms": 86400 * 10**3, "us": 86400 * 10**6, "ns": 86400 * 10**9}
DAY_UNITS = ("D", "d", "day", "days")


def temporal(t: pa.DataType):
    """(storage numpy dtype, unit) of a temporal type, else None."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return np.int64, t.unit
    if pa.types.is_date32(t):
        return np.int32, "D"
    if pa.types.is_date64(t):
        return np.int64, "ms"
    if pa.types.is_time32(t):
        return np.int32, t.unit
    if pa.types.is_time64(t):
        return np.int64, t.unit
    return None


def np_dtype(t: pa.DataType):
    if pa.types.is_float16(t):
        return np.dtype(np.float16)
    if pa.types.is_boolean(t):
        return np.dtype(bool)
    tm = temporal(t)
    if tm:
        return np.dtype(tm[0])
    return np.dtype(t.to_pandas_dtype())


def decoded(arr: pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def flat_values(arr: pa.Array):
    """(values, valid) of a primitive or (nested) FixedSizeList array: values with nulls as 0,
    valid of the same shape (a null row makes every element of it invalid)."""
    arr = decoded(arr)
    t = arr.type
    n = len(arr)
    row_valid = np.ones(n, dtype=bool) if arr.null_count == 0 else ~arr.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(t):
        k = t.list_size
        child = arr.values.slice(arr.offset * k, n * k)
        vals, valid = flat_values(child)
        vals = vals.reshape(n, k, *vals.shape[1:])
        valid = valid.reshape(n, k, *valid.shape[1:]) & row_valid.reshape(n, *[1] * (valid.ndim))
        return np.where(valid, vals, np.zeros((), vals.dtype)), valid
    if pa.types.is_boolean(t):
        return arr.fill_null(False).to_numpy(zero_copy_only=False).astype(bool), row_valid
    dt = np_dtype(t)
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or temporal(t)):
        raise TypeError(f"no tensor mapping for {t}")
    if arr.null_count == 0:
        if temporal(t):
            vals = np.frombuffer(arr.buffers()[1], dtype=dt)[arr.offset : arr.offset + n].copy()
        else:
            vals = arr.to_numpy(zero_copy_only=False).astype(dt, copy=False)
    else:
        vals = np.frombuffer(arr.buffers()[1], dtype=dt)[arr.offset : arr.offset + n].copy()
        vals[~row_valid] = 0
    return vals, row_valid


def padded_values(arr: pa.Array, L: int):
    """(values [n, L, ...], lens [n] int32, valid [n, L, ...]) of a (large) list array, cut to L."""
    arr = decoded(arr)
    n = len(arr)
    lens_full = arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = arr.flatten()
    fv, fvalid = flat_values(flat)
    out = np.zeros((n, L, *fv.shape[1:]), dtype=fv.dtype)
    valid = np.zeros((n, L, *fv.shape[1:]), dtype=bool)
    starts = np.concatenate([[0], np.cumsum(lens_full)[:-1]])
    lens = np.minimum(lens_full, L).astype(np.int32)
    for r in range(n):
        k = lens[r]
        out[r, :k] = fv[starts[r] : starts[r] + k]
        valid[r, :k] = fvalid[starts[r] : starts[r] + k]
    return out, lens, valid


def parse_opts(options):
    pads, cols, nulls_zero = {}, None, False
    for o in options:
        k, _, v = o.partition("=")
        if k == "pad":
            c, _, L = v.rpartition(":")
            pads[c] = int(L)
        elif k == "columns":
            cols = tfs.split_escaped(v)
        elif k == "nulls":
            nulls_zero = v == "zero"
    return pads, cols, nulls_zero


def read_reference(path: Path, reader: str, src: Path) -> pa.Table:
    if reader == "hive":  # the file with the columns its key=value directories under SRC give
        import pyarrow.dataset as ds

        dataset = ds.dataset(str(src), format="parquet", partitioning="hive")
        fragment = next(f for f in dataset.get_fragments() if Path(f.path) == path)
        return fragment.to_table(schema=dataset.schema)
    if reader == "duckdb":  # only where pyarrow cannot read the file (see the manifest's note)
        import duckdb

        con = duckdb.connect()
        con.execute("SET TimeZone='UTC'")
        return con.sql(f"SELECT * FROM read_parquet('{path}')").to_arrow_table()
    return pq.read_table(path)


def reference(src: Path, files: list[str], options: list[str], reader="pyarrow"):
    """Per column: dict(values, valid, lens, unit, has_nulls, padded), and the expected tensor
    names, from pyarrow reading each file (in the dataset's lexicographic order)."""
    pads, cols, nulls_zero = parse_opts(options)
    tables = [read_reference(src / f, reader, src) for f in files]
    names = cols if cols is not None else tables[0].column_names
    ref, expected_names = {}, []
    for name in names:
        t0 = tables[0].schema.field(name).type
        t0 = t0.value_type if pa.types.is_dictionary(t0) else t0
        parts = [decoded(t.column(name)) for t in tables]
        if name in pads:
            vals, lens, valid = zip(*[padded_values(p, pads[name]) for p in parts]) if parts else ((), (), ())
            r = dict(values=np.concatenate(vals), lens=np.concatenate(lens), valid=np.concatenate(valid), padded=True)
            # A null or empty list is length 0, not a null (no mask, no nulls=zero needed). A null
            # ELEMENT is a null: with nulls=zero, COL.mask has the padded shape [B, L], 1 for each
            # element present, 0 for a null element and for the padding (docs/dev/reliability.md).
            # `valid` is already False past each row's length.
            real = np.arange(pads[name])[None, :] < r["lens"][:, None]
            real = real.reshape(real.shape + (1,) * (r["valid"].ndim - 2))
            r["has_nulls"] = bool((real & ~r["valid"]).any())
        else:
            vals, valid = zip(*[flat_values(p) for p in parts])
            r = dict(values=np.concatenate(vals), valid=np.concatenate(valid), padded=False)
            r["has_nulls"] = bool((~r["valid"]).any())
        base = t0.value_type if (name in pads and hasattr(t0, "value_type")) else t0
        while pa.types.is_fixed_size_list(base) or pa.types.is_list(base) or pa.types.is_large_list(base):
            base = base.value_type
        r["unit"] = temporal(base)[1] if temporal(base) else None
        r["type"] = str(t0)
        ref[name] = r
        expected_names.append(name)
        if name in pads:
            expected_names.append(name + ".len")
        if nulls_zero and r["has_nulls"]:
            expected_names.append(name + ".mask")
    return ref, expected_names, sum(t.num_rows for t in tables)


# ---------------------------------------------------------------------------------------------
# Reading the mount
# ---------------------------------------------------------------------------------------------


def read_all(m: tfs.Mount, t: dict, n_batches: int) -> np.ndarray:
    """The whole column from epoch-0/all/NAME.npy, or the batch files where all/ is missing."""
    npy = t.get("npy") or t["name"] + ".npy"
    if os.path.exists(m.p("epoch-0", "all")):
        paths = [m.p("epoch-0", "all", npy)]
    else:
        paths = [m.p("epoch-0", tfs.batch_name(i), npy) for i in range(n_batches)]
    # read() raises EIO where np.load would only see a short file
    return np.concatenate([np.load(io.BytesIO(tfs.read_exact(p))) for p in paths])


def first_diff(got: np.ndarray, exp: np.ndarray) -> str:
    g = got.reshape(len(got), -1) if got.ndim else got
    e = exp.reshape(len(exp), -1) if exp.ndim else exp
    bad = [i for i in range(min(len(g), len(e))) if g[i].tobytes() != e[i].tobytes()]
    if not bad:
        return "(rows equal)"
    i = bad[0]
    return f"{len(bad)} rows differ, first at row {i}: got {g[i].tolist()[:8]}, expected {e[i].tolist()[:8]}"


def compare(name: str, got: np.ndarray, exp: np.ndarray, problems: list[str]):
    if got.shape != exp.shape:
        problems.append(f"{name}: shape {got.shape}, pyarrow {exp.shape}")
        return
    if got.dtype != exp.dtype:
        try:
            same = bool(np.array_equal(got, exp, equal_nan=got.dtype.kind == "f" and exp.dtype.kind == "f"))
        except (TypeError, ValueError):
            same = False
        common = np.promote_types(got.dtype, exp.dtype)
        problems.append(f"{name}: dtype {got.dtype}, pyarrow reads {exp.dtype}" + (" (values equal)" if same else f"; {first_diff(got.astype(common), exp.astype(common))}"))
        return
    if got.tobytes() != exp.tobytes():
        problems.append(f"{name}: {first_diff(got, exp)}")


def check_served(mounter, src: Path, entry: dict, options: list[str], allow_eio=False):
    """Mount SRC with OPTIONS and compare every tensor with pyarrow's reading. ALLOW_EIO: a read
    may fail with EIO instead (for files pyarrow cannot read), with a log line naming the file."""
    ref, expected_names, rows = reference(src, entry["files"], options, entry.get("ref_reader", "pyarrow"))
    m = mounter(src, "shuffle=none", f"batch_size={BATCH}", *options)
    note(entry["name"], f"served with {options}")
    dj = m.dataset()
    tensors = dj["tensors"]
    names = [t["name"] for t in tensors]
    problems = []
    if dj["rows"] != rows:
        problems.append(f"dataset.json rows {dj['rows']}, pyarrow {rows}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        problems.append(f"tensor names repeated in dataset.json: {dup}")
    missing = [n for n in expected_names if n not in names]
    if missing:
        problems.append(f"tensors missing from dataset.json: {missing} (has {names})")
    base = [n for n in names if n in ref]
    if base != [n for n in expected_names if n in ref]:
        problems.append(f"column tensors {base}, expected {[n for n in expected_names if n in ref]}")
    # a COL.mask is there exactly where COL has nulls (nulls=zero): none for a column without
    extra = [n for n in names if n not in expected_names]
    if extra:
        problems.append(f"unexpected tensors {extra}")
    n_batches = dj["batches_per_epoch"]
    seen, eio = set(), []
    alls = {}
    for t in tensors:
        name = t["name"]
        if name in seen:
            continue
        seen.add(name)
        try:
            got = alls[name] = read_all(m, t, n_batches)
        except OSError as e:
            if allow_eio and e.errno == errno.EIO:
                eio.append(name)
            else:
                problems.append(f"{name}: reading failed: {e}")
            continue
        if name in ref:
            r = ref[name]
            exp = r["values"]
            unit = t.get("unit")
            if r["unit"] is not None:
                if unit is None:
                    problems.append(f"{name}: {r['type']} but dataset.json gives no unit")
                elif unit != r["unit"] and not (unit in DAY_UNITS and r["unit"] == "D"):
                    a, b = TEMPORAL_UNIT.get(unit), TEMPORAL_UNIT.get(r["unit"])
                    if a and b and a > b:
                        exp = exp.astype(np.int64) * (a // b)
                    elif a and b:
                        exp = exp // (b // a)
                        if not np.array_equal(exp * (b // a), r["values"]):
                            problems.append(f"{name}: unit {unit} loses precision of pyarrow's {r['unit']}")
                    else:
                        problems.append(f"{name}: unit {unit!r}, pyarrow reads {r['unit']!r}")
            compare(name, got, exp, problems)
        elif name.endswith(".len") and name[:-4] in ref and ref[name[:-4]]["padded"]:
            compare(name, got, ref[name[:-4]]["lens"], problems)
        elif name.endswith(".mask") and name[:-5] in ref:
            r = ref[name[:-5]]
            if got.dtype != np.uint8:
                problems.append(f"{name}: dtype {got.dtype}, expected uint8")
            elif r["padded"]:
                # [B, L]: 1 where an element is present, 0 for a null element and for padding
                if got.shape != r["valid"].shape:
                    problems.append(f"{name}: shape {got.shape}, expected the padded shape {r['valid'].shape}")
                else:
                    bad = np.argwhere(got != r["valid"].astype(np.uint8))
                    if len(bad):
                        i = tuple(bad[0])
                        problems.append(f"{name}: {len(bad)} mask bytes wrong, first at {list(i)}: {got[i]}, expected "
                                        f"{int(r['valid'][i])} (row length {r['lens'][i[0]]})")
            else:
                compare(name, got, r["valid"].astype(np.uint8), problems)
        else:
            problems.append(f"{name}: no reference for this tensor")
    for name, r in ref.items():
        if r["has_nulls"] and not any(n == name + ".mask" for n in names):
            problems.append(f"{name}: pyarrow reads nulls but there is no {name}.mask tensor")
    # batch 0 as safetensors holds the first rows of all/ (the same tensors through the other format)
    if n_batches and not eio and len(alls) == len(seen):
        try:
            st = tfs.load_safetensors(m.p("epoch-0", tfs.batch_name(0) + ".safetensors"))
            for name, full in alls.items():
                if name not in st:
                    problems.append(f"{name}: not in {tfs.batch_name(0)}.safetensors")
                elif st[name].dtype != full.dtype or st[name].tobytes() != full[:BATCH].tobytes():
                    problems.append(f"{name}: batch 0 safetensors differs from all/ rows 0..{BATCH}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"batch 0 safetensors cannot be read: {e!r}")
    if eio:
        log = (m.cache / "tensorfs.log").read_text(errors="replace") if (m.cache / "tensorfs.log").exists() else ""
        named = [ln for ln in log.splitlines() if any(f in ln for f in entry["files"]) and "row group" in ln]
        if not named:
            problems.append(f"EIO reading {eio} but no log line names the file and row group")
        else:
            note(entry["name"], f"EIO for {eio}; log: {named[0][:300]}")
    assert not problems, f"{src.name} mounted with {options}:\n  " + "\n  ".join(problems)
    return m


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------

# Every refusal of the corpus, word for word, as `tensorfs inspect` prints it (after the
# "tensorfs: error: " prefix; <src> stands for the source's path). A refusal not listed here fails
# its test: a new refusal is read and pinned, not matched loosely.
REFUSAL_LINES = {
    'pa-fixed-size-list-no-arrow-schema':
        "column 'emb' is a variable-length list (list of float32); give it a fixed length with pad=emb:L (longer lists are cut), or leave it out with columns=id",
    'pa-lists-unpadded':
        "column 'tok' is a variable-length list (list of int32); give it a fixed length with pad=tok:L (longer lists are cut), or leave it out with columns=id:big and give the variable-length list a length L (longer ones are cut) with pad=big:L (and 1 more: listed above)",
    'pa-list-null-elements-no-nulls-option':
        "column 'tok' has null values (in 'data.parquet'); mount with nulls=zero to fill them with zeros and add a 'tok.mask' tensor, or leave the columns with nulls out with columns=id",
    'pa-only-lists':
        "column 'tok' is a variable-length list (list of int32); give it a fixed length with pad=tok:L (longer lists are cut), or leave it out with columns=big and give the variable-length list a length L (longer ones are cut) with pad=big:L (and 1 more: listed above)",
    'pa-only-lists-and-strings':
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=tok:fl and give the variable-length lists a length L (longer ones are cut) with pad=tok:L,pad=fl:L (and 2 more: listed above)",
    'pa-only-lists-null-elements':
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=tok and give the variable-length list a length L (longer ones are cut) with pad=tok:L,nulls=zero (and 1 more: listed above)",
    'pa-list-of-fsl':
        "column 'pts' (list of list of 2 float32) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id (and 1 more: listed above)",
    'pa-nulls':
        "column 's_i32' has null values (in 'data.parquet'); mount with nulls=zero to fill them with zeros and add a 's_i32.mask' tensor, or leave the columns with nulls out with columns=id (and 4 more: listed above)",
    'pa-nulls-no-statistics':
        "column 's_i32' has null values (in 'data.parquet'); mount with nulls=zero to fill them with zeros and add a 's_i32.mask' tensor, or leave the columns with nulls out with columns=id (and 4 more: listed above)",
    'pa-slash-name':
        "tensor 'x/y' cannot be a file name; rename it with stack=, or leave its column out with columns=id",
    'pa-odd-names-refused':
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=a\\:b:c\\,d:e\\+f:température:日本語:with space:back\\\\slash:k\\=v:-dash:pct%:(paren):'quote'",
    'pa-derived-name-collision':
        "two tensors are named 'x.len'; rename one with stack=",
    'pa-refused-string':
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-large-string':
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-string-view':
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-binary':
        "column 'blob' (binary) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-fixed-binary':
        "column 'blob' (fixed-size binary of 4 bytes) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-dict-string':
        "column 'cat' (dictionary of string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-struct':
        "column 'st' (struct) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-map':
        "column 'mp' (map) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-decimal128':
        "column 'price' (decimal(10, 2)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-decimal-int32':
        "column 'price' (decimal(5, 2)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-decimal256':
        "column 'price' (decimal(50, 2)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-null-type':
        "column 'nothing' (null) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-list-of-string':
        "column 'tags' (list of string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-refused-list-of-struct':
        "column 'ev' (list of struct) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:f32",
    'pa-many-refused':
        "columns 's' (string), 'st' (struct), 'price' (decimal(12, 0)) have no tensor mapping (strings, structs, maps and decimals are not served); leave them out with columns=id:f64:tok:emb and give the variable-length list a length L (longer ones are cut) with pad=tok:L (and 1 more: listed above)",
    'mixed-column-order':
        "files 'a.parquet' and 'b.parquet' have different schemas: columns [id, i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, b, date, ts] and [ts, date, b, f64, f32, u64, u32, u16, u8, i64, i32, i16, i8, id]",
    'fp-strings-object':
        "column 'name' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:i8:i16:i32:i64:u8:u16:u32:u64:f32:f64:b:ts",
    'fp-categorical-str':
        "column 'cat' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:i32",
    'pl-nulls-no-statistics':
        "column 'ni' has null values (in 'data.parquet'); mount with nulls=zero to fill them with zeros and add a 'ni.mask' tensor, or leave the columns with nulls out with columns=id (and 3 more: listed above)",
    'pl-categorical':
        "columns 'cat' (dictionary of string), 'en' (dictionary of string) have no tensor mapping (strings, structs, maps and decimals are not served); leave them out with columns=id",
    'pl-string-struct-decimal':
        "columns 's' (string), 'st' (struct), 'dec' (decimal(12, 3)) have no tensor mapping (strings, structs, maps and decimals are not served); leave them out with columns=id:x",
    'pl-int128':
        "file 'data.parquet' is not a readable Parquet file: External: Parser error: Int type with bit width of 128 and signed of true not supported",
    'dk-nulls':
        "column 'ni' has null values (in 'data.parquet'); mount with nulls=zero to fill them with zeros and add a 'ni.mask' tensor, or leave the columns with nulls out with columns=id",
    'dk-array':
        "column 'emb' is a variable-length list (list of float32); give it a fixed length with pad=emb:L (longer lists are cut), or leave it out with columns=id",
    'dk-refused-varchar':
        "column 's' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-struct':
        "column 'st' (struct) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-map':
        "column 'mp' (map) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-decimal':
        "column 'dec' (decimal(12, 3)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-decimal-int64':
        "column 'dec' (decimal(18, 3)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-uuid':
        "column 'u' (fixed-size binary of 16 bytes) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-interval':
        "column 'iv' (interval(daytime)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-enum':
        "column 'en' (string) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'dk-refused-blob':
        "column 'bl' (binary) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id:half",
    'spark-refused':
        "columns 's' (string), 'st' (struct), 'dec' (decimal(10, 2)), 'm' (map) have no tensor mapping (strings, structs, maps and decimals are not served); leave them out with columns=id:f",
    'spark-decimal-legacy':
        "column 'dec' (decimal(10, 2)) has no tensor mapping (strings, structs, maps and decimals are not served); leave it out with columns=id",
}


def plain_type(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return plain_type(t.value_type)
    if pa.types.is_fixed_size_list(t):
        return plain_type(t.value_type)
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_timestamp(t)
            or pa.types.is_date(t))


def plainly_servable(src: Path, entry: dict) -> list[str]:
    """Columns every file of the entry holds with a plain tensor type and no nulls."""
    try:
        tables = [read_reference(src / f, entry.get("ref_reader", "pyarrow"), src) for f in entry["files"]]
    except Exception:  # noqa: BLE001  (a file pyarrow cannot read: nothing to demand)
        return []
    if not tables:
        return []
    out = []
    for name in tables[0].column_names:
        if all(name in t.column_names and plain_type(t.schema.field(name).type) and t.column(name).null_count == 0
               for t in tables):
            out.append(name)
    return out


def check_refused(mounter, src: Path, entry: dict, proc=None):
    opts = entry["options"]
    if proc is None:
        proc = tfs.run(["inspect", src, *(["-o", ",".join(opts)] if opts else [])], timeout=60)
    line = tfs.error_line(proc)
    note(entry["name"], "refused: " + line)
    names, phrases = entry["refuse"], entry.get("refuse_text", [])
    bare = line.replace(str(src), "<src>").replace(str(src).lstrip("/"), "<src>")
    assert any(f"'{n}'" in bare for n in names) or any(p in bare for p in phrases), (
        f"none of {[f'{n!r}' for n in names] + phrases} in: {line}")
    want = REFUSAL_LINES.get(entry["name"])
    assert want is not None, f"{entry['name']}: refused with a line no test pins: {bare!r}"
    assert bare == tfs.ERROR_PREFIX + want, f"{entry['name']}: the refusal changed:\n got:  {bare}\n want: {tfs.ERROR_PREFIX + want}"
    hint = tfs.hint_options(line, PAD_L)
    if hint is None:
        return line
    # The hint keeps every column that is plainly servable (a number, bool, date or timestamp,
    # fixed-size lists and dictionaries of those, without nulls) ...
    kept = set()
    for o in hint:
        if o.startswith("columns="):
            kept |= set(tfs.split_escaped(o[len("columns="):]))
    if kept:
        plain = plainly_servable(src, entry)
        lost = [c for c in plain if c not in kept and c not in entry["refuse"]]
        assert not lost, f"the hint {hint} leaves out servable columns {lost}: {line}"
    # ... and, pasted back as it is, makes the dataset servable: inspect accepts it ...
    kept = set()
    for o in hint:
        if o.startswith("columns="):
            kept |= set(tfs.split_escaped(o[len("columns="):]))
    keep = [o for o in opts if not o.startswith("columns=")
            and not (o.startswith("pad=") and tfs.split_escaped(o[4:].rpartition(":")[0])[0] not in kept)]
    hopts = [*keep, *[o for o in hint if o not in keep]]
    proc2 = tfs.run(["inspect", src, "-o", ",".join(hopts)], timeout=60)
    err2 = [x for x in proc2.stderr.splitlines() if x.strip()]
    assert proc2.returncode == 0, f"refused with: {line}\nbut the hint {hopts} is refused too: {err2[-1] if err2 else proc2.returncode}"
    # ... and the mount serves the columns it keeps exactly as pyarrow reads them.
    check_served(mounter, src, entry, hopts)
    return line


# ---------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------


def note(name, text):
    """With TENSORFS_WILD_REPORT=FILE, append how the entry went (served / refused: line)."""
    path = os.environ.get("TENSORFS_WILD_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"name": name, "how": text}, ensure_ascii=False) + "\n")


@pytest.mark.parametrize("name", ENTRY_PARAMS)
def test_wild(corpus, mounter, name):
    src, entry = get_entry(corpus, name)
    outcome = entry["outcome"]
    opts = entry["options"]
    if outcome == "served":
        proc = tfs.run(["inspect", src, *(["-o", ",".join(opts)] if opts else [])], timeout=60)
        err = [x for x in proc.stderr.splitlines() if x.strip()]
        assert proc.returncode == 0, f"pyarrow reads it, but tensorfs inspect refuses: {err[-1] if err else proc.returncode}"
        check_served(mounter, src, entry, opts)
    elif outcome == "refused":
        check_refused(mounter, src, entry)
    elif outcome == "either":
        proc = tfs.run(["inspect", src, *(["-o", ",".join(opts)] if opts else [])], timeout=60)
        if proc.returncode == 0:
            check_served(mounter, src, entry, opts)
        else:
            check_refused(mounter, src, entry, proc)
    elif outcome == "served_or_eio":
        proc = tfs.run(["inspect", src, *(["-o", ",".join(opts)] if opts else [])], timeout=60)
        err = [x for x in proc.stderr.splitlines() if x.strip()]
        assert proc.returncode == 0, f"tensorfs inspect refuses: {err[-1] if err else proc.returncode}"
        check_served(mounter, src, entry, opts, allow_eio=True)
    elif outcome == "refused_or_eio":
        proc = tfs.run(["inspect", src, *(["-o", ",".join(opts)] if opts else [])], timeout=60)
        if proc.returncode != 0:
            check_refused(mounter, src, entry, proc)
            return
        m = mounter(src, "shuffle=none", f"batch_size={BATCH}", *opts)
        dj = m.dataset()
        served = []
        for t in dj["tensors"]:
            if t["name"] not in entry["refuse"]:
                continue
            try:
                read_all(m, t, dj["batches_per_epoch"])
                served.append(t["name"])
            except OSError as e:
                assert e.errno == errno.EIO, f"{t['name']}: expected EIO, got {e!r}"
        assert not served, f"nulls served without nulls=zero (no refusal, no EIO): {served}"
        log = (m.cache / "tensorfs.log").read_text(errors="replace") if (m.cache / "tensorfs.log").exists() else ""
        assert "data.parquet" in log, "EIO without a log line naming the object"
    else:
        raise AssertionError(f"unknown outcome {outcome}")


# ---------------------------------------------------------------------------------------------
# The cases, one by one
# ---------------------------------------------------------------------------------------------


def mount_refusal(mounter, src: Path, *options) -> str:
    """`tensorfs mount SRC` expecting a refusal: its one line, nothing left mounted."""
    mp = mounter.mountpoint()
    opts = ",".join([*options, f"cache_dir={mp.parent / (mp.name + '-cache')}"])
    proc = tfs.run(["mount", src, mp, "-o", opts], timeout=60)
    line = tfs.error_line(proc)
    assert not tfs.is_mounted(mp), f"refused, but {mp} is mounted"
    return line


ONLY_LISTS_CASES = {
    # entry: (its refusal by `mount`, the hint's options, the tensors the hint serves)
    "pa-only-lists-and-strings": (
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); "
        "leave it out with columns=tok:fl and give the variable-length lists a length L (longer ones are cut) "
        "with pad=tok:L,pad=fl:L (and 2 more: `tensorfs inspect` lists them)",
        ["columns=tok:fl", f"pad=tok:{PAD_L}", f"pad=fl:{PAD_L}"],
        ["tok", "tok.len", "fl", "fl.len"],
    ),
    "pa-only-lists-null-elements": (
        "column 'label' (string) has no tensor mapping (strings, structs, maps and decimals are not served); "
        "leave it out with columns=tok and give the variable-length list a length L (longer ones are cut) "
        "with pad=tok:L,nulls=zero (and 1 more: `tensorfs inspect` lists them)",
        ["columns=tok", "nulls=zero", f"pad=tok:{PAD_L}"],
        ["tok", "tok.len", "tok.mask"],
    ),
}


@pytest.mark.parametrize("name", list(ONLY_LISTS_CASES))
def test_only_variable_length_lists_left_the_refusal_offers_pad(corpus, mounter, name):
    """The issue's class 5: the only columns that can be served are variable-length lists (beside
    a string column). The refusal offers columns= with pad= (and nulls= where the lists hold null
    elements); pasted back, the mount serves the lists padded, exactly as pyarrow reads them."""
    src, entry = get_entry(corpus, name)
    want_line, want_hint, want_tensors = ONLY_LISTS_CASES[name]
    line = mount_refusal(mounter, src)
    assert line == tfs.ERROR_PREFIX + want_line
    hint = tfs.hint_options(line, PAD_L)
    assert hint == want_hint, line
    m = check_served(mounter, src, entry, hint)
    assert [t["name"] for t in m.dataset()["tensors"]] == want_tensors


def python_lists(src: Path, col: str) -> list:
    return pq.read_table(src / "data.parquet").column(col).to_pylist()


def test_a_null_list_under_pad_is_length_0_without_nulls_zero(corpus, mounter):
    """PRODUCT.md §4: with pad=, an empty or null list has length 0. A null list is not a null
    value: pad= alone mounts (no nulls=zero needed), the row is all zeros with COL.len 0, and no
    COL.mask is added."""
    src, entry = get_entry(corpus, "pa-lists-null-lists-no-nulls-option")
    assert entry["options"] == [f"pad=tok:{PAD_L}", f"pad=big:{PAD_L}"]
    m = check_served(mounter, src, entry, entry["options"])
    assert [t["name"] for t in m.dataset()["tensors"]] == ["id", "tok", "tok.len", "big", "big.len"]
    for col in ("tok", "big"):
        lists_ = python_lists(src, col)
        nulls = [r for r, v in enumerate(lists_) if v is None]
        assert len(nulls) >= 10, "the premise: null lists"
        data = np.load(m.p("epoch-0", "all", f"{col}.npy"))
        lens = np.load(m.p("epoch-0", "all", f"{col}.len.npy"))
        assert lens.dtype == np.int32 and data.shape == (len(lists_), PAD_L)
        assert (lens[nulls] == 0).all() and not data[nulls].any()
        assert lens.tolist() == [min(len(v or []), PAD_L) for v in lists_]


def test_null_elements_of_a_list_under_pad(corpus, mounter):
    """A null ELEMENT of a list is a null: without nulls=zero the mount is refused naming
    nulls=zero; with it, the element is 0 and COL.mask is uint8 of the padded shape [B, L]: 1 for
    each element present, 0 for a null element and for the padding (docs/dev/reliability.md)."""
    src, entry = get_entry(corpus, "pa-list-null-elements")
    line = mount_refusal(mounter, src, f"pad=tok:{PAD_L}")
    assert line == tfs.ERROR_PREFIX + (
        "column 'tok' has null values (in 'data.parquet'); mount with nulls=zero to fill them with zeros and add "
        "a 'tok.mask' tensor, or leave the columns with nulls out with columns=id")

    m = check_served(mounter, src, entry, [f"pad=tok:{PAD_L}", "nulls=zero"])
    dj = m.dataset()
    assert [(t["name"], t["dtype"], t["shape"]) for t in dj["tensors"]] == [
        ("id", "int64", [BATCH]),
        ("tok", "int32", [BATCH, PAD_L]),
        ("tok.len", "int32", [BATCH]),
        ("tok.mask", "uint8", [BATCH, PAD_L]),
    ]
    lists_ = python_lists(src, "tok")
    want = np.zeros((len(lists_), PAD_L), dtype=np.uint8)
    for r, v in enumerate(lists_):
        for k, x in enumerate((v or [])[:PAD_L]):
            want[r, k] = x is not None
    assert sum(x is None for v in lists_ if v for x in v[:PAD_L]) >= 10, "the premise: null elements"
    mask = np.load(m.p("epoch-0", "all", "tok.mask.npy"))
    assert mask.dtype == np.uint8 and mask.shape == (len(lists_), PAD_L)
    np.testing.assert_array_equal(mask, want)
    data = np.load(m.p("epoch-0", "all", "tok.npy"))
    assert not data[mask == 0].any(), "a null element or padding is not 0"


def test_every_refused_entry_is_pinned_word_for_word():
    refused = [e["name"] for e in make_corpus.ENTRIES if e["outcome"] == "refused"]
    assert not [n for n in refused if n not in REFUSAL_LINES], "refused entries without a pinned line"
    unknown = [n for n in REFUSAL_LINES if n not in ENTRY_NAMES]
    assert not unknown, f"pinned lines of no entry: {unknown}"
