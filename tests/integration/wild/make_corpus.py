#!/usr/bin/env python3
"""Build the "wild" Parquet corpus: small files written by many writers (pyarrow with unusual
options, fastparquet, polars, duckdb, and Spark's parquet-java when pyspark and Java are there),
each dataset in its own directory, plus manifest.json saying what tensorfs must do with it.

    python make_corpus.py OUT_DIR [--only NAME ...] [--no-spark]

Every entry of the manifest:
    name        the dataset directory under OUT_DIR (mounted as a whole)
    writer      which library wrote it ("pyarrow", "fastparquet", "polars", "duckdb", "spark")
    outcome     "served":   mounts with `options`; every tensor equals pyarrow's reading
                "refused":  `tensorfs inspect` (with `options`) fails with one line naming one
                            of `refuse` (the offending columns)
                "either":   the contract does not say (e.g. time-of-day); a clear refusal naming
                            one of `refuse`, or served exactly as pyarrow reads it
                "refused_or_eio": nulls the statistics cannot show: a refusal naming one of
                            `refuse`, or a mount whose reads of those columns fail with EIO
                "served_or_eio": pyarrow cannot read it (ref_reader gives the values): served
                            exactly, or EIO for the reads with a log line naming the object
    options     mount options to use (pad=, nulls=zero, columns=, ...)
    refuse      the columns (or files) a refusal may name, quoted as tensorfs quotes them: 'col'
    refuse_text phrases a refusal may hold instead (matched with the source's path taken out)
    note        what the entry exercises
    known_failure  why tensorfs does not yet do what `outcome` says (its test is a strict xfail)
    ref_reader  who reads the reference values: "pyarrow", "hive" (pyarrow's dataset with
                partitioning="hive": the key=value directories add columns), or "duckdb" where pyarrow cannot
    files       the Parquet files written (filled in when built), data files only

Entries whose writer package is missing are listed in the manifest's "skipped" with the reason.
"""

from __future__ import annotations

import argparse
import decimal
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

N = 300  # rows in most files
RG = 100  # row group size where the writer allows one

ENTRIES: list[dict] = []


def entry(name, writer, outcome="served", options=(), refuse=(), note="", ref_reader="pyarrow", refuse_text=(),
          known_failure=""):
    """Register the decorated function as the maker of entry NAME (it writes into a directory).
    REF_READER: who gives the reference values ("duckdb" where pyarrow cannot read the file).
    KNOWN_FAILURE: why tensorfs does not yet do what the outcome says (the test is a strict xfail)."""

    def deco(fn):
        ENTRIES.append(
            dict(name=name, writer=writer, outcome=outcome, options=list(options), refuse=list(refuse),
                 refuse_text=list(refuse_text), note=note, ref_reader=ref_reader, known_failure=known_failure,
                 make=fn)
        )
        return fn

    return deco


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def cols(n=N, seed=0) -> dict[str, np.ndarray]:
    """The usual scalar columns as numpy arrays (dates as int32 days, ts as int64 ms)."""
    rng = np.random.default_rng(seed)
    return {
        "id": np.arange(n, dtype=np.int64),
        "i8": rng.integers(-128, 128, n).astype(np.int8),
        "i16": rng.integers(-(2**15), 2**15, n).astype(np.int16),
        "i32": rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32),
        "i64": rng.integers(-(2**62), 2**62, n, dtype=np.int64),
        "u8": rng.integers(0, 256, n).astype(np.uint8),
        "u16": rng.integers(0, 2**16, n).astype(np.uint16),
        "u32": rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
        "u64": rng.integers(0, 2**64, n, dtype=np.uint64),
        "f32": rng.standard_normal(n).astype(np.float32),
        "f64": rng.standard_normal(n),
        "b": rng.random(n) < 0.4,
        "date": rng.integers(-1000, 25000, n).astype(np.int32),
        "ts": rng.integers(1_500_000_000_000, 1_800_000_000_000, n, dtype=np.int64),
    }


def pa_base(n=N, seed=0, with_u32_u64=True) -> pa.Table:
    c = cols(n, seed)
    arrays = {k: pa.array(v) for k, v in c.items() if k not in ("date", "ts")}
    if not with_u32_u64:
        arrays.pop("u32"), arrays.pop("u64")
    arrays["date"] = pa.array(c["date"], type=pa.date32())
    arrays["ts"] = pa.array(c["ts"]).cast(pa.timestamp("ms"))
    return pa.table(arrays)


def lists(n, seed, maxlen=12, dtype=np.int64, nulls=False, empties=True):
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        k = int(rng.integers(0, maxlen + 1))
        if dtype == np.float32 or dtype == np.float64:
            v = rng.standard_normal(k).astype(dtype).tolist()
        elif dtype == bool:
            v = (rng.random(k) < 0.5).tolist()
        else:
            info = np.iinfo(dtype)
            v = rng.integers(max(info.min, -(2**40)), min(info.max, 2**40), k, dtype=np.int64).astype(dtype).tolist()
        out.append(v)
    out[0] = []
    out[1] = list(out[1]) + [out[1][0] if out[1] else 0] * 15  # longer than any L used
    if nulls:
        for r in range(3, n, 17):
            out[r] = None
    return out


def fsl(values: np.ndarray, *dims) -> pa.Array:
    arr = pa.array(values.reshape(-1))
    for d in reversed(dims):
        arr = pa.FixedSizeListArray.from_arrays(arr, d)
    return arr


def with_nulls(values: np.ndarray, every: int, offset=1) -> pa.Array:
    mask = np.zeros(len(values), dtype=bool)
    mask[offset::every] = True
    return pa.array(values, mask=mask)


ODD_NAMES = ["a:b", "c,d", "e+f", "température", "日本語", "with space", "back\\slash", "k=v", "-dash", "pct%", "(paren)", "'quote'"]


# ---------------------------------------------------------------------------------------------
# pyarrow, with unusual options
# ---------------------------------------------------------------------------------------------

for _codec in ["none", "snappy", "gzip", "brotli", "zstd", "lz4"]:

    def _mk(d, codec=_codec):
        pq.write_table(pa_base(seed=1), d / "data.parquet", row_group_size=RG, compression=codec)

    entry(f"pa-codec-{_codec}", "pyarrow", note=f"compression={_codec}, every scalar type")(_mk)


@entry("pa-gzip-level9-page-v2", "pyarrow", note="gzip level 9, data page v2, tiny pages")
def _(d):
    pq.write_table(pa_base(seed=2), d / "data.parquet", row_group_size=RG, compression="gzip",
                   compression_level=9, data_page_version="2.0", data_page_size=256)


@entry("pa-page-v2-dict", "pyarrow", note="data page v2, dictionary on (low cardinality ints), zstd")
def _(d):
    t = pa_base(seed=3)
    rng = np.random.default_rng(3)
    t = t.append_column("low", pa.array(rng.integers(0, 5, N).astype(np.int32)))
    t = t.append_column("lowf", pa.array(rng.integers(0, 3, N).astype(np.float64) / 4))
    pq.write_table(t, d / "data.parquet", row_group_size=RG, compression="zstd", data_page_version="2.0",
                   use_dictionary=True)


@entry("pa-page-v2-nodict", "pyarrow", note="data page v2, dictionary off, uncompressed")
def _(d):
    pq.write_table(pa_base(seed=4), d / "data.parquet", row_group_size=RG, compression="none",
                   data_page_version="2.0", use_dictionary=False)


@entry("pa-dict-only-some", "pyarrow", note="dictionary on for some columns only, tiny dictionary page limit")
def _(d):
    t = pa_base(seed=5)
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_dictionary=["i64", "f64", "u16"],
                   dictionary_pagesize_limit=64)


@entry("pa-byte-stream-split-floats", "pyarrow", note="BYTE_STREAM_SPLIT for float16/32/64")
def _(d):
    t = pa_base(seed=6).append_column("f16", pa.array(np.random.default_rng(6).standard_normal(N).astype(np.float16)))
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_dictionary=False,
                   use_byte_stream_split=["f32", "f64", "f16"])


@entry("pa-byte-stream-split-ints", "pyarrow", note="BYTE_STREAM_SPLIT for int32/int64 (Parquet 2.11)")
def _(d):
    t = pa_base(seed=7)
    enc = {c: "BYTE_STREAM_SPLIT" for c in ["i32", "i64", "u32", "u64", "f32", "f64", "date", "ts"]}
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_dictionary=False, column_encoding=enc)


@entry("pa-delta-binary-packed", "pyarrow", note="DELTA_BINARY_PACKED for every int column, page v1")
def _(d):
    t = pa_base(seed=8)
    enc = {c: "DELTA_BINARY_PACKED" for c in ["id", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "date", "ts"]}
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_dictionary=False, column_encoding=enc)


@entry("pa-delta-page-v2-sorted", "pyarrow", note="DELTA_BINARY_PACKED, page v2, monotone and constant ints, tiny pages")
def _(d):
    n = 1000
    t = pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "step": pa.array((np.arange(n) * 7 - 3000).astype(np.int32)),
        "const": pa.array(np.full(n, 42, dtype=np.int64)),
        "big": pa.array(np.where(np.arange(n) % 2 == 0, 2**62, -(2**62)).astype(np.int64)),
        "u": pa.array(np.arange(n, dtype=np.uint64) * (2**53)),
    })
    enc = {c: "DELTA_BINARY_PACKED" for c in t.column_names}
    pq.write_table(t, d / "data.parquet", row_group_size=300, use_dictionary=False, column_encoding=enc,
                   data_page_version="2.0", data_page_size=128, compression="snappy")


@entry("pa-version-1.0", "pyarrow", note="format version 1.0: uint32 stored as INT64, ns timestamps coerced")
def _(d):
    c = cols(seed=9)
    t = pa_base(seed=9).append_column("ts_us", pa.array(c["ts"] * 1000).cast(pa.timestamp("us")))
    pq.write_table(t, d / "data.parquet", row_group_size=RG, version="1.0")


@entry("pa-version-2.4", "pyarrow", note="format version 2.4")
def _(d):
    pq.write_table(pa_base(seed=10), d / "data.parquet", row_group_size=RG, version="2.4")


@entry("pa-int96", "pyarrow", note="INT96 timestamps (use_deprecated_int96_timestamps), ms/us/ns and tz")
def _(d):
    c = cols(seed=11)
    t = pa.table({
        "id": pa.array(c["id"]),
        "ts_ms": pa.array(c["ts"]).cast(pa.timestamp("ms")),
        "ts_us": pa.array(c["ts"] * 1000 + 7).cast(pa.timestamp("us")),
        "ts_ns": pa.array(c["ts"] * 1_000_000 + 123).cast(pa.timestamp("ns")),
        "ts_tz": pa.array(c["ts"]).cast(pa.timestamp("ms", tz="Europe/Paris")),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_deprecated_int96_timestamps=True)


@entry("pa-int96-pre-epoch", "pyarrow", note="INT96 timestamps before 1970 and far future")
def _(d):
    ms = np.array([-2208988800000, -1, 0, 1, 253402300799999, -62135596800000] * 50, dtype=np.int64)
    t = pa.table({"id": pa.array(np.arange(len(ms), dtype=np.int64)), "ts": pa.array(ms).cast(pa.timestamp("ms"))})
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_deprecated_int96_timestamps=True, store_schema=False)


@entry("pa-int96-out-of-range-arrow-schema", "pyarrow",
       note="INT96 timestamps of years 1, 1500, 2500 and 9999 with the Arrow schema stored (timestamp[ms]): "
            "pyarrow (26) still reads int64 ns, wrapping those outside 1677-2262, and so does tensorfs")
def _(d):
    ms = np.array([-62135596800000, -14831769600000, 16725225600000, 253402300799999, 0, 1_600_000_000_123] * 50, dtype=np.int64)
    t = pa.table({"id": pa.array(np.arange(len(ms), dtype=np.int64)), "ts": pa.array(ms).cast(pa.timestamp("ms"))})
    pq.write_table(t, d / "data.parquet", row_group_size=RG, use_deprecated_int96_timestamps=True, store_schema=True)


@entry("pa-rg-of-1-row", "pyarrow", note="200 row groups of 1 row")
def _(d):
    pq.write_table(pa_base(200, seed=12), d / "data.parquet", row_group_size=1)


@entry("pa-many-row-groups", "pyarrow", note="3000 rows in 429 row groups of 7")
def _(d):
    pq.write_table(pa_base(3000, seed=13), d / "data.parquet", row_group_size=7)


@entry("pa-empty-file-first", "pyarrow", note="a 0-row file sorted before a non-empty one")
def _(d):
    t = pa_base(seed=14)
    pq.write_table(t.schema.empty_table(), d / "a-empty.parquet")
    pq.write_table(t, d / "b-data.parquet", row_group_size=RG)


@entry("pa-empty-file-between", "pyarrow", note="0-row files between and after non-empty ones (one with a 0-row row group)")
def _(d):
    t = pa_base(seed=15)
    pq.write_table(t.slice(0, 120), d / "part-0.parquet", row_group_size=50)
    pq.write_table(t.schema.empty_table(), d / "part-1.parquet")
    with pq.ParquetWriter(d / "part-2.parquet", t.schema) as w:  # an explicit empty row group, then data
        w.write_table(t.schema.empty_table(), row_group_size=RG)
        w.write_table(t.slice(120), row_group_size=RG)
    pq.write_table(t.schema.empty_table(), d / "part-3.parquet")


@entry("pa-only-empty", "pyarrow", outcome="either", refuse_text=["empty", "0 rows", "no rows", "no data"],
       note="a dataset whose only file has 0 rows (every scalar type, bool included): 0 batches, or a clear refusal")
def _(d):
    pq.write_table(pa_base(seed=16).schema.empty_table(), d / "data.parquet")


@entry("pa-fixed-size-list", "pyarrow", note="FixedSizeList float32[4], uint8[16], nested int16[2][3], float64[1], bool[3]")
def _(d):
    rng = np.random.default_rng(17)
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "emb": fsl(rng.standard_normal((N, 4)).astype(np.float32), 4),
        "pix": fsl(rng.integers(0, 256, (N, 16)).astype(np.uint8), 16),
        "nest": fsl(rng.integers(-999, 999, (N, 2, 3)).astype(np.int16), 2, 3),
        "one": fsl(rng.standard_normal((N, 1)), 1),
        "flags": fsl(rng.random((N, 3)) < 0.5, 3),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-fixed-size-list-no-arrow-schema", "pyarrow", outcome="refused", refuse=["emb"],
       note="FixedSizeList written with store_schema=False: pyarrow reads a variable List back")
def _(d):
    rng = np.random.default_rng(18)
    t = pa.table({"id": pa.array(np.arange(N, dtype=np.int64)), "emb": fsl(rng.standard_normal((N, 4)).astype(np.float32), 4)})
    pq.write_table(t, d / "data.parquet", row_group_size=RG, store_schema=False)


@entry("pa-lists-padded", "pyarrow", options=["pad=tok:8", "pad=big:8", "pad=fl:8", "pad=bo:8", "pad=small:8"],
       note="list<int32>, large_list<int64>, list<float32>, list<bool>, list<uint8> with pad=:8")
def _(d):
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "tok": pa.array(lists(N, 19, dtype=np.int32), type=pa.list_(pa.int32())),
        "big": pa.array(lists(N, 20, dtype=np.int64), type=pa.large_list(pa.int64())),
        "fl": pa.array(lists(N, 21, dtype=np.float32), type=pa.list_(pa.float32())),
        "bo": pa.array(lists(N, 22, dtype=bool), type=pa.list_(pa.bool_())),
        "small": pa.array(lists(N, 23, dtype=np.uint8), type=pa.list_(pa.uint8())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-lists-unpadded", "pyarrow", outcome="refused", refuse=["tok", "big"],
       note="list<int32> and large_list<int64> without pad=")
def _(d):
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "tok": pa.array(lists(N, 24, dtype=np.int32), type=pa.list_(pa.int32())),
        "big": pa.array(lists(N, 25, dtype=np.int64), type=pa.large_list(pa.int64())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-lists-null-lists", "pyarrow", options=["pad=tok:8", "pad=big:8", "nulls=zero"],
       note="list and large_list holding null lists and empty lists, pad= and nulls=zero")
def _(d):
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "tok": pa.array(lists(N, 26, dtype=np.int32, nulls=True), type=pa.list_(pa.int32())),
        "big": pa.array(lists(N, 27, dtype=np.int64, nulls=True), type=pa.large_list(pa.int64())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


def lists_with_null_elements(n, seed, dtype=np.int32):
    """Lists holding null elements (every 5th row), null lists (every 17th) and empty lists."""
    out = lists(n, seed, dtype=dtype, nulls=True)
    for r in range(2, n, 5):
        if out[r]:
            out[r] = [None if k % 2 == 0 else v for k, v in enumerate(out[r])]
    return out


@entry("pa-lists-null-lists-no-nulls-option", "pyarrow", options=["pad=tok:8", "pad=big:8"],
       note="null lists and empty lists, no null elements, pad= WITHOUT nulls=zero: a null list is length 0, no mask")
def _(d):
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "tok": pa.array(lists(N, 126, dtype=np.int32, nulls=True), type=pa.list_(pa.int32())),
        "big": pa.array(lists(N, 127, dtype=np.int64, nulls=True), type=pa.large_list(pa.int64())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-list-null-elements", "pyarrow", options=["pad=tok:8", "nulls=zero"],
       note="list<int32> holding null elements, null lists and empty lists, pad= and nulls=zero: tok.mask is [B, L]")
def _(d):
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "tok": pa.array(lists_with_null_elements(N, 128), type=pa.list_(pa.int32())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-list-null-elements-no-nulls-option", "pyarrow", outcome="refused", options=["pad=tok:8"], refuse=["tok"],
       note="list<int32> holding null elements, pad= without nulls=zero: refused, naming nulls=zero")
def _(d):
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "tok": pa.array(lists_with_null_elements(N, 129), type=pa.list_(pa.int32())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-only-lists", "pyarrow", outcome="refused", refuse=["tok", "big"],
       note="issue class 5: the only columns are variable-length lists; the refusal must offer pad=")
def _(d):
    t = pa.table({
        "tok": pa.array(lists(N, 130, dtype=np.int32), type=pa.list_(pa.int32())),
        "big": pa.array(lists(N, 131, dtype=np.int64), type=pa.large_list(pa.int64())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-only-lists-and-strings", "pyarrow", outcome="refused", refuse=["label", "tok", "fl"],
       note="issue class 5: variable-length lists and a string column, nothing else; the refusal must offer pad=")
def _(d):
    t = pa.table({
        "label": pa.array([f"x{i}" for i in range(N)]),
        "tok": pa.array(lists(N, 132, dtype=np.int32), type=pa.list_(pa.int32())),
        "fl": pa.array(lists(N, 133, dtype=np.float32), type=pa.list_(pa.float32())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-only-lists-null-elements", "pyarrow", outcome="refused", refuse=["label", "tok"],
       note="issue class 5 with null elements: the hint must offer pad= and nulls=zero")
def _(d):
    t = pa.table({
        "label": pa.array([f"x{i}" for i in range(N)]),
        "tok": pa.array(lists_with_null_elements(N, 134), type=pa.list_(pa.int32())),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-list-of-fsl", "pyarrow", outcome="either", options=["pad=pts:8"], refuse=["pts"],
       note="list<fixed_size_list<float32>[2]> (points): pad= on a list of vectors")
def _(d):
    rng = np.random.default_rng(28)
    pts = [[[float(x), float(y)] for x, y in rng.standard_normal((int(rng.integers(0, 10)), 2)).astype(np.float32)] for _ in range(N)]
    t = pa.table({"id": pa.array(np.arange(N, dtype=np.int64)),
                  "pts": pa.array(pts, type=pa.list_(pa.list_(pa.float32(), 2)))})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-dictionary-ints", "pyarrow", note="pa.dictionary columns with int/uint/float values and int8/int16/int32/uint8 indices")
def _(d):
    rng = np.random.default_rng(29)
    t = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "d8_i32": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 5, N).astype(np.int8)),
                                                 pa.array(np.array([7, -3, 100000, 42, -2**31], dtype=np.int32))),
        "d16_i64": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 3, N).astype(np.int16)),
                                                  pa.array(np.array([2**60, -1, 0], dtype=np.int64))),
        "d32_f64": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 4, N).astype(np.int32)),
                                                  pa.array(np.array([0.5, -1e300, np.inf, np.nan]))),
        "du8_u16": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 2, N).astype(np.uint8)),
                                                  pa.array(np.array([65535, 1], dtype=np.uint16))),
        "d_f32": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 3, N).astype(np.int32)),
                                                pa.array(np.array([1.5, -2.25, 3e-8], dtype=np.float32))),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-dictionary-ints-unused-values", "pyarrow",
       note="dictionary whose values are not all used, and an index order unlike the values' order; dictionary fallback to plain mid-column")
def _(d):
    rng = np.random.default_rng(30)
    n = 3000
    vals = np.arange(1000, dtype=np.int64) * 1_000_003
    t = pa.table({"id": pa.array(np.arange(n, dtype=np.int64)),
                  "dv": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 1000, n).astype(np.int32)), pa.array(vals))})
    pq.write_table(t, d / "data.parquet", row_group_size=1000, dictionary_pagesize_limit=1024)


@entry("pa-nullable-no-nulls", "pyarrow", note="every column nullable in the schema (validity bitmaps present), zero nulls")
def _(d):
    t = pa_base(seed=31)
    no = pa.array(np.zeros(N, dtype=bool))
    arrays = {}
    for k in t.column_names:
        a = t.column(k).combine_chunks()
        # an all-valid validity bitmap, so the writer sees a nullable column with a bitmap
        arrays[k] = pa.Array.from_buffers(a.type, len(a), [pc_invert(no).buffers()[1], *a.buffers()[1:]])
    t = pa.table(arrays)
    assert all(f.nullable for f in t.schema) and all(t.column(k).null_count == 0 for k in t.column_names)
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


def pc_invert(a):
    import pyarrow.compute as pc

    return pc.invert(a)


@entry("pa-required-columns", "pyarrow", note="every column REQUIRED (non-nullable fields)")
def _(d):
    t = pa_base(seed=32)
    schema = pa.schema([f.with_nullable(False) for f in t.schema])
    pq.write_table(t.cast(schema), d / "data.parquet", row_group_size=RG)


@entry("pa-nulls", "pyarrow", outcome="refused", refuse=["s_i32", "s_f64", "s_b", "s_ts"],
       note="nulls in ints, floats, bool, timestamp, default nulls=error")
def _(d):
    _write_pa_nulls(d, 33)


@entry("pa-nulls-zero", "pyarrow", options=["nulls=zero"], note="nulls in ints, floats, bool, timestamp, with nulls=zero")
def _(d):
    _write_pa_nulls(d, 34)


def _write_pa_nulls(d, seed, **kw):
    c = cols(seed=seed)
    t = pa.table({
        "id": pa.array(c["id"]),
        "s_i32": with_nulls(c["i32"], 7),
        "s_f64": with_nulls(c["f64"], 11, 5),
        "s_b": with_nulls(c["b"], 13, 2),
        "s_ts": pa.array(c["ts"], mask=(np.arange(N) % 29 == 28)).cast(pa.timestamp("ms")),
        "s_allnull": pa.array([None] * N, type=pa.int32()),
    })
    pq.write_table(t, d / "data.parquet", row_group_size=RG, **kw)


@entry("pa-nulls-no-statistics", "pyarrow", outcome="refused_or_eio", refuse=["s_i32", "s_f64", "s_b", "s_ts", "s_allnull"],
       note="nulls, write_statistics=False: the null counts are not in the footer")
def _(d):
    _write_pa_nulls(d, 35, write_statistics=False)


@entry("pa-nulls-no-statistics-zero", "pyarrow", options=["nulls=zero"],
       note="nulls, write_statistics=False, nulls=zero")
def _(d):
    _write_pa_nulls(d, 36, write_statistics=False)


@entry("pa-no-statistics", "pyarrow", note="no nulls, write_statistics=False: nothing to refuse")
def _(d):
    pq.write_table(pa_base(seed=37), d / "data.parquet", row_group_size=RG, write_statistics=False)


@entry("pa-float16", "pyarrow", note="float16 (FLOAT16 logical type) with and without the Arrow schema, NaN/inf/-0")
def _(d):
    rng = np.random.default_rng(38)
    h = rng.standard_normal(N).astype(np.float16)
    h[:5] = [np.nan, np.inf, -np.inf, -0.0, 65504]
    t = pa.table({"id": pa.array(np.arange(N, dtype=np.int64)), "h": pa.array(h)})
    pq.write_table(t, d / "data.parquet", row_group_size=RG, store_schema=False)


@entry("pa-no-arrow-schema", "pyarrow", options=["pad=big:8"],
       note="store_schema=False: uint, timestamps, large_list known only from Parquet logical types")
def _(d):
    t = pa_base(seed=39)
    t = t.append_column("ts_ns", pa.array(cols(seed=39)["ts"] * 1_000_000 + 5).cast(pa.timestamp("ns", tz="UTC")))
    t = t.append_column("big", pa.array(lists(N, 39, dtype=np.int64), type=pa.large_list(pa.int64())))
    pq.write_table(t, d / "data.parquet", row_group_size=RG, store_schema=False)


@entry("pa-timestamp-seconds", "pyarrow", note="timestamp[s] (stored as ms), date64 written as DATE")
def _(d):
    c = cols(seed=40)
    t = pa.table({"id": pa.array(c["id"]), "ts_s": pa.array(c["ts"] // 1000).cast(pa.timestamp("s"))})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-date64", "pyarrow", note="date64 column: written as DATE (int32 days), pyarrow reads date32 back")
def _(d):
    c = cols(seed=41)
    t = pa.table({"id": pa.array(c["id"]), "d64": pa.array(c["date"].astype(np.int64) * 86_400_000).cast(pa.date64())})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-checksums-page-index", "pyarrow", note="page checksums (CRC), page index, 16 rows per page, bloom-free")
def _(d):
    pq.write_table(pa_base(seed=42), d / "data.parquet", row_group_size=RG, write_page_checksum=True,
                   write_page_index=True, max_rows_per_page=16)


@entry("pa-sorting-columns-metadata", "pyarrow", note="sorting_columns and custom key-value metadata in the footer")
def _(d):
    t = pa_base(seed=43).sort_by("i32")
    t = t.replace_schema_metadata({**(t.schema.metadata or {}), b"origin": b"wild", b"pandas": b"not json"})
    pq.write_table(t, d / "data.parquet", row_group_size=RG,
                   sorting_columns=[pq.SortingColumn(t.column_names.index("i32"))])


@entry("pa-odd-names", "pyarrow", note="column names with : , + = / % space backslash and unicode")
def _(d):
    rng = np.random.default_rng(44)
    t = pa.table({name: pa.array(rng.integers(-1000, 1000, N).astype(np.int32) * (i + 1)) for i, name in enumerate(ODD_NAMES)})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-slash-name", "pyarrow", outcome="either", refuse=["x/y"],
       note="a column named x/y (pandas-style 'km/h'): no file name can hold it; served under some name, or refused")
def _(d):
    rng = np.random.default_rng(49)
    pq.write_table(pa.table({"id": pa.array(np.arange(N, dtype=np.int64)), "x/y": pa.array(rng.standard_normal(N))}),
                   d / "data.parquet", row_group_size=RG)


@entry("pa-odd-names-refused", "pyarrow", outcome="refused", refuse=["label"],
       note="odd column names beside a string column: the columns= hint must escape them")
def _(d):
    rng = np.random.default_rng(45)
    arrays = {name: pa.array(rng.integers(-1000, 1000, N).astype(np.int32)) for name in ODD_NAMES}
    arrays["label"] = pa.array([f"row{i}" for i in range(N)])
    pq.write_table(pa.table(arrays), d / "data.parquet", row_group_size=RG)


@entry("pa-derived-name-collision", "pyarrow", outcome="either", options=["pad=x:8", "nulls=zero"], refuse=["x.len", "x.mask", "x"],
       note="a list column x beside real columns named x.len and x.mask (pad= and nulls=zero derive those names)")
def _(d):
    rng = np.random.default_rng(46)
    t = pa.table({"x": pa.array(lists(N, 46, dtype=np.int32, nulls=True), type=pa.list_(pa.int32())),
                  "x.len": pa.array(rng.integers(0, 9, N).astype(np.int64)),
                  "x.mask": pa.array(rng.integers(0, 2, N).astype(np.int64))})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


def _refused_type(name, col, arr_fn, note, extra_refuse=()):
    @entry(name, "pyarrow", outcome="refused", refuse=[col, *extra_refuse], note=note)
    def _(d):
        c = cols(seed=zlib.crc32(name.encode()) % 1000)
        t = pa.table({"id": pa.array(c["id"]), col: arr_fn(), "f32": pa.array(c["f32"])})
        pq.write_table(t, d / "data.parquet", row_group_size=RG)


_refused_type("pa-refused-string", "label", lambda: pa.array([f"x{i}" for i in range(N)]), "utf8 string")
_refused_type("pa-refused-large-string", "label", lambda: pa.array([f"x{i}" for i in range(N)], type=pa.large_string()), "large_string")
_refused_type("pa-refused-string-view", "label", lambda: pa.array([f"x{i}" for i in range(N)], type=pa.string_view()), "string_view")
_refused_type("pa-refused-binary", "blob", lambda: pa.array([bytes([i % 256]) * 4 for i in range(N)]), "binary")
_refused_type("pa-refused-fixed-binary", "blob", lambda: pa.array([bytes([i % 256]) * 4 for i in range(N)], type=pa.binary(4)), "fixed_size_binary(4)")
_refused_type("pa-refused-dict-string", "cat", lambda: pa.array([["a", "bb", "c"][i % 3] for i in range(N)]).dictionary_encode(), "dictionary<string>")
_refused_type("pa-refused-struct", "st", lambda: pa.array([{"a": i, "b": float(i)} for i in range(N)]), "struct<int64, double>")
_refused_type("pa-refused-map", "mp", lambda: pa.array([[("k", i)] for i in range(N)], type=pa.map_(pa.string(), pa.int32())), "map<string, int32>")
_refused_type("pa-refused-decimal128", "price", lambda: pa.array([decimal.Decimal(i) / 4 for i in range(N)], type=pa.decimal128(10, 2)), "decimal128(10,2)")
_refused_type("pa-refused-decimal-int32", "price", lambda: pa.array([decimal.Decimal(i) / 4 for i in range(N)], type=pa.decimal128(5, 2)), "decimal128(5,2), stored as INT32")
_refused_type("pa-refused-decimal256", "price", lambda: pa.array([decimal.Decimal(i) / 4 for i in range(N)], type=pa.decimal256(50, 2)), "decimal256(50,2)")
_refused_type("pa-refused-null-type", "nothing", lambda: pa.nulls(N), "the null type (an all-None pandas column)")
_refused_type("pa-refused-list-of-string", "tags", lambda: pa.array([["a", "b"][: i % 3] for i in range(N)]), "list<string>: pad= cannot help")
_refused_type("pa-refused-list-of-struct", "ev", lambda: pa.array([[{"t": i}] * (i % 3) for i in range(N)]), "list<struct>")


@entry("pa-time-and-duration", "pyarrow", outcome="either", refuse=["t32", "t64", "dur"],
       note="time32[ms], time64[us], duration[ns]: not in the contract's table")
def _(d):
    c = cols(seed=47)
    t = pa.table({"id": pa.array(c["id"]),
                  "t32": pa.array((c["ts"] % 86_400_000).astype(np.int32)).cast(pa.time32("ms")),
                  "t64": pa.array((c["ts"] % 86_400_000) * 1000).cast(pa.time64("us")),
                  "dur": pa.array(c["i64"] // 1000).cast(pa.duration("ns"))})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-many-refused", "pyarrow", outcome="refused", refuse=["s", "st", "price", "tok"],
       note="string, struct, decimal and an unpadded list together: one line, a hint keeping every servable column")
def _(d):
    c = cols(seed=48)
    t = pa.table({"s": pa.array([f"x{i}" for i in range(N)]), "id": pa.array(c["id"]),
                  "st": pa.array([{"a": i} for i in range(N)]), "f64": pa.array(c["f64"]),
                  "price": pa.array([decimal.Decimal(i) for i in range(N)], type=pa.decimal128(12, 0)),
                  "tok": pa.array(lists(N, 48, dtype=np.int32), type=pa.list_(pa.int32())),
                  "emb": fsl(np.random.default_rng(48).standard_normal((N, 3)).astype(np.float32), 3)})
    pq.write_table(t, d / "data.parquet", row_group_size=RG)


@entry("pa-wide-400-columns", "pyarrow", note="400 float32/int16 columns, 100 rows: a large footer")
def _(d):
    rng = np.random.default_rng(90)
    arrays = {}
    for k in range(400):
        arrays[f"c{k:03d}"] = pa.array(rng.standard_normal(100).astype(np.float32) if k % 2 else rng.integers(-9, 9, 100).astype(np.int16))
    pq.write_table(pa.table(arrays), d / "data.parquet", row_group_size=40)


@entry("pa-wide-1000-columns", "pyarrow", note="1,000 columns of five types, 64 rows: a footer of ~0.5 MB")
def _(d):
    rng = np.random.default_rng(92)
    kinds = [np.float32, np.int16, np.float64, np.int64, np.uint8]
    arrays = {}
    for k in range(1000):
        t = kinds[k % len(kinds)]
        v = rng.standard_normal(64) * 50 if np.issubdtype(t, np.floating) else rng.integers(0, 100, 64)
        arrays[f"col_{k:04d}"] = pa.array(v.astype(t))
    pq.write_table(pa.table(arrays), d / "data.parquet", row_group_size=32)


@entry("pa-bloom-filters", "pyarrow", note="bloom filters written beside the column chunks")
def _(d):
    t = pa_base(seed=93)
    pq.write_table(t, d / "data.parquet", row_group_size=RG,
                   bloom_filter_options={"i32": {"ndv": 100, "fpp": 0.01}, "i64": True})


@entry("pa-one-long-row-group", "pyarrow", note="200,000 rows in one row group (pages of 1,024 rows)")
def _(d):
    n = 200_000
    ids = np.arange(n, dtype=np.int64)
    t = pa.table({"id": ids, "x": (ids % 1000).astype(np.float32), "k": (ids % 7).astype(np.int8)})
    pq.write_table(t, d / "data.parquet", row_group_size=n, data_page_size=8192)


@entry("mixed-nullability", "pyarrow", note="the same columns REQUIRED in one file and OPTIONAL (no nulls) in the next")
def _(d):
    t = pa_base(seed=91)
    req = pa.schema([f.with_nullable(False) for f in t.schema])
    pq.write_table(t.slice(0, 150).cast(req), d / "a.parquet", row_group_size=RG)
    pq.write_table(t.slice(150), d / "b.parquet", row_group_size=RG)


@entry("mixed-writers", "mixed", note="one dataset, one file each from pyarrow, polars, duckdb and fastparquet: "
       "id int64, x float64, k int32, ts timestamp[us]")
def _(d):
    import duckdb  # noqa: F401  (the writers must all be there)
    import fastparquet  # noqa: F401
    import pandas as pd
    import polars as pl

    def part(lo, hi):
        i = np.arange(lo, hi, dtype=np.int64)
        return i, i / 8, (i * 3 - 500).astype(np.int32), 1_600_000_000_000_000 + i * 1_000_001

    i, x, k, ts = part(0, 100)
    pq.write_table(pa.table({"id": i, "x": x, "k": k, "ts": pa.array(ts).cast(pa.timestamp("us"))}), d / "p0-pyarrow.parquet", row_group_size=50)
    i, x, k, ts = part(100, 200)
    pl.DataFrame({"id": i, "x": x, "k": k, "ts": pl.Series(ts).cast(pl.Datetime("us"))}).write_parquet(d / "p1-polars.parquet", row_group_size=50)
    _duck(f"COPY (SELECT i::BIGINT AS id, i / 8 AS x, (i * 3 - 500)::INTEGER AS k, make_timestamp(1600000000000000 + i * 1000001) AS ts "
          f"FROM range(200, 300) t(i) ORDER BY i) TO '{d / 'p2-duckdb.parquet'}' (FORMAT PARQUET)")
    i, x, k, ts = part(300, 400)
    _fp_write(d / "p3-fastparquet.parquet", pd.DataFrame({"id": i, "x": x, "k": k, "ts": pd.Series(ts.astype("datetime64[us]"))}),
              row_group_offsets=[0, 50])


@entry("mixed-column-order", "pyarrow", outcome="either", refuse=["a.parquet", "b.parquet"],
       note="the same columns in a different order in the second file: served by name, or refused naming both files")
def _(d):
    t = pa_base(seed=92)
    pq.write_table(t.slice(0, 150), d / "a.parquet", row_group_size=RG)
    pq.write_table(t.slice(150).select(list(reversed(t.column_names))), d / "b.parquet", row_group_size=RG)


@entry("hive-partitioned", "pyarrow", ref_reader="hive",
       note="pq.write_to_dataset(partition_cols=['k']): files under k=0/, k=1/ without the k column, "
            "which the directories give (PRODUCT.md §8)")
def _(d):
    t = pa.table({"id": pa.array(np.arange(N, dtype=np.int64)), "k": pa.array(np.arange(N) % 2), "x": pa.array(np.arange(N) / 4)})
    pq.write_to_dataset(t, str(d), partition_cols=["k"], basename_template="part-{i}.parquet")


# ---------------------------------------------------------------------------------------------
# fastparquet (its own writer; pandas in)
# ---------------------------------------------------------------------------------------------


def _pandas_df(n=N, seed=0, nullable=False):
    import pandas as pd

    c = cols(n, seed)
    df = pd.DataFrame({k: c[k] for k in ["id", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64", "b"]})
    df["ts"] = pd.to_datetime(c["ts"], unit="ms").astype("datetime64[ns]")
    if nullable:
        for k in ["i32", "i64", "u16"]:
            df[k] = df[k].astype({"i32": "Int32", "i64": "Int64", "u16": "UInt16"}[k])
        df["b"] = df["b"].astype("boolean")
    return df


def _fp_write(path, df, **kw):
    import fastparquet

    fastparquet.write(str(path), df, **kw)


@entry("fp-simple-snappy", "fastparquet", note="fastparquet, 3 row groups, SNAPPY, every numpy dtype, datetime64[ns]")
def _(d):
    _fp_write(d / "data.parquet", _pandas_df(seed=50), row_group_offsets=[0, 100, 200], compression="SNAPPY")


for _codec in ["GZIP", "ZSTD", "BROTLI", "LZ4", "LZ4_RAW", None]:

    def _mk(d, codec=_codec):
        _fp_write(d / "data.parquet", _pandas_df(seed=51), row_group_offsets=[0, 150], compression=codec)

    entry(f"fp-codec-{str(_codec).lower()}", "fastparquet", note=f"fastparquet compression={_codec}")(_mk)


@entry("fp-per-column-codecs", "fastparquet", note="a different codec per column")
def _(d):
    df = _pandas_df(seed=52)
    comp = {k: ["GZIP", "ZSTD", "SNAPPY", "BROTLI", None][i % 5] for i, k in enumerate(df.columns)}
    _fp_write(d / "data.parquet", df, row_group_offsets=100, compression=comp)


@entry("fp-int96", "fastparquet", note="times='int96'")
def _(d):
    _fp_write(d / "data.parquet", _pandas_df(seed=53), row_group_offsets=[0, 100, 200], times="int96")


@entry("fp-hive-many-files", "fastparquet", note="file_scheme='hive': part.0..part.11 (lexicographic != numeric) + _metadata + _common_metadata")
def _(d):
    _fp_write(d, _pandas_df(n=600, seed=54), row_group_offsets=50, file_scheme="hive", compression="ZSTD")


@entry("fp-nullable-no-nulls", "fastparquet", note="pandas nullable Int32/Int64/UInt16/boolean, no nulls")
def _(d):
    _fp_write(d / "data.parquet", _pandas_df(seed=55, nullable=True), row_group_offsets=[0, 100])


@entry("fp-nullable-with-nulls", "fastparquet", options=["nulls=zero"], note="pandas nullable ints/bool and float NaN-free with pd.NA, nulls=zero")
def _(d):
    df = _pandas_df(seed=56, nullable=True)
    df.loc[df.index % 9 == 4, "i32"] = None
    df.loc[df.index % 13 == 1, "b"] = None
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100])


@entry("fp-float-nan", "fastparquet", note="float columns holding NaN (not nulls: fastparquet writes NaN as a value)")
def _(d):
    df = _pandas_df(seed=57)
    df.loc[df.index % 5 == 0, "f64"] = np.nan
    df.loc[df.index % 7 == 0, "f32"] = np.nan
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100], has_nulls=False)


@entry("fp-required", "fastparquet", note="has_nulls=False: every column REQUIRED")
def _(d):
    _fp_write(d / "data.parquet", _pandas_df(seed=58), row_group_offsets=[0, 100, 200], has_nulls=False)


@entry("fp-strings-object", "fastparquet", outcome="refused", refuse=["name"], note="object_encoding='utf8' strings beside ints")
def _(d):
    df = _pandas_df(seed=59)
    df["name"] = [f"n{i}" for i in range(N)]
    df["name"] = df["name"].astype(object)
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100], object_encoding="utf8")


@entry("fp-strings-object-dropped", "fastparquet", options=["columns=id:i32:f64:ts"], note="the same, served with columns=")
def _(d):
    df = _pandas_df(seed=60)
    df["name"] = pd_obj([f"n{i}" for i in range(N)])
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100], object_encoding="utf8")


def pd_obj(values):
    import pandas as pd

    return pd.Series(values, dtype=object)


@entry("fp-categorical-int", "fastparquet", note="pandas categorical of ints (fastparquet writes a dictionary page)")
def _(d):
    import pandas as pd

    df = _pandas_df(seed=61)[["id", "i32"]]
    df["cat"] = pd.Categorical(np.random.default_rng(61).choice([10, 20, 30, -5], N))
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100])


@entry("fp-categorical-str", "fastparquet", outcome="refused", refuse=["cat"], note="pandas categorical of strings")
def _(d):
    import pandas as pd

    df = _pandas_df(seed=62)[["id", "i32"]]
    df["cat"] = pd.Categorical(np.random.default_rng(62).choice(["x", "y", "z"], N))
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100])


@entry("fp-odd-names", "fastparquet", note="odd column names")
def _(d):
    import pandas as pd

    rng = np.random.default_rng(63)
    df = pd.DataFrame({name: rng.integers(-9, 9, N).astype(np.int16) for name in ODD_NAMES})
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100])


@entry("fp-with-index", "fastparquet", note="a non-range pandas index written as a column (__index_level_0__ or its name)")
def _(d):
    df = _pandas_df(seed=64)[["i32", "f64"]]
    df.index = np.arange(N, dtype=np.int64) * 3 + 1000
    df.index.name = "rowkey"
    _fp_write(d / "data.parquet", df, row_group_offsets=[0, 100], write_index=True)


# ---------------------------------------------------------------------------------------------
# polars (its own Rust writer)
# ---------------------------------------------------------------------------------------------


def _pl_df(n=N, seed=0):
    import polars as pl

    c = cols(n, seed)
    df = pl.DataFrame({k: c[k] for k in ["id", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64", "b"]})
    return df.with_columns(
        pl.Series("date", c["date"]).cast(pl.Date),
        pl.Series("ts_ms", c["ts"]).cast(pl.Datetime("ms")),
        pl.Series("ts_us", c["ts"] * 1000 + 3).cast(pl.Datetime("us")),
        pl.Series("ts_ns_tz", c["ts"] * 1_000_000 + 9).cast(pl.Datetime("ns", time_zone="America/New_York")),
    )


for _codec in ["zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed"]:

    def _mk(d, codec=_codec):
        _pl_df(seed=70).write_parquet(d / "data.parquet", compression=codec, row_group_size=RG)

    entry(f"pl-codec-{_codec}", "polars", note=f"polars compression={_codec}, row_group_size=100")(_mk)


@entry("pl-no-statistics-small-pages", "polars", note="statistics=False, data_page_size=512, zstd level 22")
def _(d):
    _pl_df(seed=71).write_parquet(d / "data.parquet", statistics=False, data_page_size=512, compression="zstd",
                                  compression_level=22, row_group_size=RG)


@entry("pl-nulls-zero", "polars", options=["nulls=zero"], note="nulls in int/float/bool/date, nulls=zero")
def _(d):
    _pl_nulls().write_parquet(d / "data.parquet", row_group_size=RG)


@entry("pl-nulls-no-statistics", "polars", outcome="refused_or_eio", refuse=["ni", "nf", "nb", "nd"],
       note="nulls with statistics=False, default nulls=error")
def _(d):
    _pl_nulls().write_parquet(d / "data.parquet", row_group_size=RG, statistics=False)


@entry("pl-nulls-no-statistics-zero", "polars", options=["nulls=zero"], note="nulls with statistics=False, nulls=zero")
def _(d):
    _pl_nulls().write_parquet(d / "data.parquet", row_group_size=RG, statistics=False)


def _pl_nulls():
    import polars as pl

    c = cols(seed=72)
    return pl.DataFrame({
        "id": c["id"],
        "ni": pl.Series([None if i % 7 == 3 else int(v) for i, v in enumerate(c["i32"])], dtype=pl.Int32),
        "nf": pl.Series([None if i % 5 == 0 else float(v) for i, v in enumerate(c["f64"])], dtype=pl.Float64),
        "nb": pl.Series([None if i % 11 == 0 else bool(v) for i, v in enumerate(c["b"])], dtype=pl.Boolean),
        "nd": pl.Series([None if i % 13 == 0 else int(v) for i, v in enumerate(c["date"])], dtype=pl.Int32).cast(pl.Date),
    })


@entry("pl-list", "polars", options=["pad=li:8", "pad=lf:8"], note="List(Int64) and List(Float32) (large_list in Arrow), pad=")
def _(d):
    import polars as pl

    pl.DataFrame({"id": np.arange(N, dtype=np.int64),
                  "li": pl.Series(lists(N, 73, dtype=np.int64), dtype=pl.List(pl.Int64)),
                  "lf": pl.Series(lists(N, 74, dtype=np.float32), dtype=pl.List(pl.Float32))}).write_parquet(
        d / "data.parquet", row_group_size=RG)


@entry("pl-array", "polars", note="Array(Float32, 4) and Array(Int16, (2, 3)): fixed-size lists")
def _(d):
    import polars as pl

    rng = np.random.default_rng(75)
    pl.DataFrame({"id": np.arange(N, dtype=np.int64),
                  "emb": pl.Series(rng.standard_normal((N, 4)).astype(np.float32)),
                  "grid": pl.Series(rng.integers(-99, 99, (N, 2, 3)).astype(np.int16))}).write_parquet(
        d / "data.parquet", row_group_size=RG)


@entry("pl-categorical", "polars", outcome="refused", refuse=["cat", "en"], note="Categorical and Enum (dictionary<string>)")
def _(d):
    import polars as pl

    pl.DataFrame({"id": np.arange(N, dtype=np.int64),
                  "cat": pl.Series([["a", "b", "c"][i % 3] for i in range(N)], dtype=pl.Categorical),
                  "en": pl.Series([["lo", "hi"][i % 2] for i in range(N)], dtype=pl.Enum(["lo", "hi"]))}).write_parquet(
        d / "data.parquet", row_group_size=RG)


@entry("pl-string-struct-decimal", "polars", outcome="refused", refuse=["s", "st", "dec"], note="String, Struct, Decimal beside ints")
def _(d):
    import polars as pl

    pl.DataFrame({"id": np.arange(N, dtype=np.int64),
                  "s": [f"s{i}" for i in range(N)],
                  "st": [{"a": i, "b": -i} for i in range(N)],
                  "dec": pl.Series([decimal.Decimal(i) / 8 for i in range(N)], dtype=pl.Decimal(12, 3)),
                  "x": np.arange(N, dtype=np.float32)}).write_parquet(d / "data.parquet", row_group_size=RG)


@entry("pl-time-duration", "polars", outcome="either", refuse=["t", "du"], note="Time and Duration(us)")
def _(d):
    import polars as pl

    pl.DataFrame({"id": np.arange(N, dtype=np.int64),
                  "t": pl.Series((np.arange(N, dtype=np.int64) * 123_456_789) % 86_400_000_000_000).cast(pl.Time),
                  "du": pl.Series(np.arange(N, dtype=np.int64) * -987_654).cast(pl.Duration("us"))}).write_parquet(
        d / "data.parquet", row_group_size=RG)


@entry("pl-odd-names", "polars", note="odd column names")
def _(d):
    import polars as pl

    rng = np.random.default_rng(76)
    pl.DataFrame({name: rng.standard_normal(N) for name in ODD_NAMES}).write_parquet(d / "data.parquet", row_group_size=RG)


@entry("pl-int128", "polars", outcome="refused", refuse=["big", "data.parquet"],
       note="Int128 (FIXED_LEN_BYTE_ARRAY(16) INTEGER(128)): pyarrow itself cannot read it; a clear refusal expected")
def _(d):
    import polars as pl

    pl.DataFrame({"id": np.arange(N, dtype=np.int64),
                  "big": pl.Series(np.arange(N, dtype=np.int64) * 3).cast(pl.Int128)}).write_parquet(d / "data.parquet")


# ---------------------------------------------------------------------------------------------
# duckdb (its own C++ writer)
# ---------------------------------------------------------------------------------------------

DK_SCALARS = """
    i AS id,
    ((hash(i) % 256)::INT - 128)::TINYINT AS i8,
    ((hash(i * 3) % 65536)::INT - 32768)::SMALLINT AS i16,
    ((hash(i * 5) % 4294967296)::BIGINT - 2147483648)::INTEGER AS i32,
    (hash(i * 7)::HUGEINT - 9223372036854775807)::BIGINT AS i64,
    (hash(i * 11) % 256)::UTINYINT AS u8,
    (hash(i * 13) % 65536)::USMALLINT AS u16,
    (hash(i * 17) % 4294967296)::UINTEGER AS u32,
    hash(i * 19)::UBIGINT AS u64,
    ((hash(i * 23) % 100000)::DOUBLE / 997 - 50)::FLOAT AS f32,
    (hash(i * 29) % 1000000)::DOUBLE / 7919 - 60 AS f64,
    (hash(i * 31) % 2 = 0) AS b,
    DATE '1970-01-01' + ((hash(i * 37) % 30000)::INT - 5000) AS date,
    TIMESTAMP '2001-02-03 04:05:06' + to_microseconds((hash(i * 41) % 100000000000)::BIGINT) AS ts,
    TIMESTAMP_NS '2021-02-03 04:05:06.123456789' + to_microseconds(i) AS ts_ns,
    TIMESTAMPTZ '2011-02-03 04:05:06+00' + to_microseconds(i * 1000) AS ts_tz
"""


def _duck(sql: str):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads=1")
    con.execute("SET TimeZone='UTC'")
    con.execute(sql)
    con.close()


def _dk_copy(d, select, n=N, opts="", name="data.parquet"):
    _duck(f"COPY (SELECT {select} FROM range({n}) t(i) ORDER BY i) TO '{d / name}' (FORMAT PARQUET{opts})")


for _codec in ["snappy", "zstd", "gzip", "lz4", "brotli", "uncompressed"]:

    def _mk(d, codec=_codec):
        _dk_copy(d, DK_SCALARS, n=5000, opts=f", COMPRESSION {codec}, ROW_GROUP_SIZE 2048")

    entry(f"dk-codec-{_codec}", "duckdb", note=f"duckdb COMPRESSION {_codec}, every scalar type, 5000 rows")(_mk)


@entry("dk-parquet-v2", "duckdb", outcome="served_or_eio", note="PARQUET_VERSION V2 (data page v2, DELTA_* and BYTE_STREAM_SPLIT encodings), "
       "full-range INT32 columns: pyarrow cannot read those (DELTA_BINARY_PACKED 'InitBlock EOF'), so duckdb gives the reference",
       ref_reader="duckdb")
def _(d):
    _dk_copy(d, DK_SCALARS, n=5000, opts=", PARQUET_VERSION V2, ROW_GROUP_SIZE 2048")


@entry("dk-parquet-v2-narrow", "duckdb", note="PARQUET_VERSION V2 with INT32 values of a narrow range (pyarrow reads it)")
def _(d):
    sel = DK_SCALARS.replace("(hash(i * 17) % 4294967296)::UINTEGER", "(hash(i * 17) % 100000)::UINTEGER").replace(
        "((hash(i * 5) % 4294967296)::BIGINT - 2147483648)::INTEGER", "((hash(i * 5) % 200000)::BIGINT - 100000)::INTEGER")
    assert sel != DK_SCALARS
    _dk_copy(d, sel, n=5000, opts=", PARQUET_VERSION V2, ROW_GROUP_SIZE 2048")


@entry("dk-small-row-groups", "duckdb", note="ROW_GROUP_SIZE 100 with 300 rows, a low-cardinality dictionary column")
def _(d):
    _dk_copy(d, DK_SCALARS + ", (i % 4)::INTEGER AS low", opts=", ROW_GROUP_SIZE 100")


@entry("dk-hugeint-and-double", "duckdb", outcome="either", refuse=["h"], note="HUGEINT (duckdb writes it as DOUBLE) and UHUGEINT")
def _(d):
    _dk_copy(d, "i AS id, (i * 1000000007)::HUGEINT AS h")


@entry("dk-nulls-zero", "duckdb", options=["nulls=zero"], note="NULLs in INTEGER/DOUBLE/BOOLEAN/DATE, nulls=zero")
def _(d):
    _dk_copy(d, "i AS id, CASE WHEN i % 7 = 3 THEN NULL ELSE i::INTEGER * 5 END AS ni, "
                "CASE WHEN i % 5 = 0 THEN NULL ELSE i / 3 END AS nf, "
                "CASE WHEN i % 11 = 0 THEN NULL ELSE i % 2 = 1 END AS nb, "
                "CASE WHEN i % 13 = 0 THEN NULL ELSE DATE '2000-01-01' + i::INT END AS nd")


@entry("dk-nulls", "duckdb", outcome="refused", refuse=["ni"], note="NULLs in an INTEGER column, default nulls=error")
def _(d):
    _dk_copy(d, "i AS id, CASE WHEN i % 7 = 3 THEN NULL ELSE i::INTEGER * 5 END AS ni")


@entry("dk-list", "duckdb", options=["pad=l:8", "pad=lf:8"], note="INTEGER[] and DOUBLE[] lists, pad=")
def _(d):
    _dk_copy(d, "i AS id, CASE WHEN i % 10 = 1 THEN range(i::INT % 20) ELSE range(i::INT % 6) END::INTEGER[] AS l, "
                "list_transform(range(i::INT % 4), lambda x: x / 2.0)::DOUBLE[] AS lf")


@entry("dk-list-with-nulls", "duckdb", options=["pad=l:8", "nulls=zero"], note="INTEGER[] holding NULL lists and NULL elements, nulls=zero")
def _(d):
    _dk_copy(d, "i AS id, CASE WHEN i % 9 = 2 THEN NULL WHEN i % 9 = 4 THEN [1, NULL, 3] ELSE range(i::INT % 5)::INTEGER[] END AS l")


@entry("dk-array", "duckdb", outcome="refused", refuse=["emb"],
       note="FLOAT[4] ARRAY type: duckdb writes a plain list, which pyarrow reads as list<float>: needs pad=")
def _(d):
    _dk_copy(d, "i AS id, [i / 1.0, i / 2.0, i / 3.0, i / 4.0]::FLOAT[4] AS emb")


for _name, _expr, _col in [
    ("varchar", "'v' || i::VARCHAR", "s"),
    ("struct", "{'a': i, 'b': i * 2}", "st"),
    ("map", "MAP {'k': i}", "mp"),
    ("decimal", "(i / 8)::DECIMAL(12, 3)", "dec"),
    ("decimal-int64", "(i / 8)::DECIMAL(18, 3)", "dec"),
    ("uuid", "uuid()", "u"),
    ("interval", "to_seconds(i)", "iv"),
    ("enum", "(['lo', 'hi'])[i % 2 + 1]::ENUM('lo', 'hi')", "en"),
    ("blob", "'\\xAA\\xBB'::BLOB", "bl"),
]:

    def _mk(d, expr=_expr, col=_col):
        _dk_copy(d, f"i AS id, {expr} AS {col}, (i * 0.5)::DOUBLE AS half")

    entry(f"dk-refused-{_name}", "duckdb", outcome="refused", refuse=[_col], note=f"duckdb {_name} column beside servable ones")(_mk)


@entry("dk-time", "duckdb", outcome="either", refuse=["t"], note="TIME (time64[us])")
def _(d):
    _dk_copy(d, "i AS id, TIME '01:02:03' + to_seconds(i) AS t")


@entry("dk-odd-names", "duckdb", note="odd column names")
def _(d):
    sel = ", ".join(f"(i * {k + 1})::INTEGER AS \"{n}\"" for k, n in enumerate(ODD_NAMES))
    _dk_copy(d, sel)


@entry("dk-many-files", "duckdb", note="FILE_SIZE_BYTES: duckdb splits the output into data_0.parquet ... data_N.parquet (N >= 10)")
def _(d):
    _duck(f"COPY (SELECT {DK_SCALARS} FROM range(24000) t(i) ORDER BY i) TO '{d / 'out'}' "
          "(FORMAT PARQUET, ROW_GROUP_SIZE 500, FILE_SIZE_BYTES '1KB')")
    for f in (d / "out").iterdir():
        f.rename(d / f.name)
    (d / "out").rmdir()


# ---------------------------------------------------------------------------------------------
# Spark (parquet-java), in one JVM started by a subprocess
# ---------------------------------------------------------------------------------------------

SPARK_JOBS = {
    # name: (note, outcome, options, refuse, conf, select expressions)
    "spark-default": ("Spark defaults: snappy, INT96 timestamps, _SUCCESS and .crc files", "served", [], [],
                      {}, ["id", "cast(id % 200 - 100 as tinyint) as i8", "cast(id * 7 as short) as i16",
                            "cast(id * 1000003 as int) as i32", "id * 1000000007 as i64", "cast(id / 3 as float) as f32",
                            "id / 7.0d as f64", "id % 3 = 0 as b", "date_add(date'2000-01-01', cast(id as int)) as d",
                            "timestamp_seconds(1600000000 + id * 3601) as ts"]),
    "spark-micros-zstd": ("outputTimestampType=TIMESTAMP_MICROS, zstd", "served", [], [],
                          {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS", "spark.sql.parquet.compression.codec": "zstd"},
                          ["id", "timestamp_seconds(1600000000 + id * 3601) as ts", "cast(id as double) as x"]),
    "spark-millis-gzip": ("outputTimestampType=TIMESTAMP_MILLIS, gzip", "served", [], [],
                          {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MILLIS", "spark.sql.parquet.compression.codec": "gzip"},
                          ["id", "timestamp_millis(1600000000000 + id * 3601) as ts"]),
    "spark-array": ("array<int> and array<double> (3-level list), pad=", "served", ["pad=a:8", "pad=ad:8"], [], {},
                    ["id", "sequence(0, cast(id % 11 as int)) as a", "transform(sequence(0, cast(id % 3 as int)), x -> x / 2.0d) as ad"]),
    "spark-array-legacy": ("writeLegacyFormat=true: 2-level list (bag/array), pad=", "served", ["pad=a:8"], [],
                           {"spark.sql.parquet.writeLegacyFormat": "true"},
                           ["id", "sequence(0, cast(id % 11 as int)) as a"]),
    "spark-nulls": ("nulls in int and double, nulls=zero", "served", ["nulls=zero"], [], {},
                    ["id", "if(id % 7 = 3, null, cast(id as int)) as ni", "if(id % 5 = 0, null, id / 2.0d) as nf"]),
    "spark-refused": ("string, struct, decimal(10,2) (INT64 legacy off), map beside ints", "refused", [], ["s", "st", "dec", "m"], {},
                      ["id", "cast(id as string) as s", "named_struct('a', id) as st", "cast(id / 4 as decimal(10,2)) as dec",
                       "map('k', id) as m", "cast(id as float) as f"]),
    "spark-decimal-legacy": ("writeLegacyFormat=true decimal (FIXED_LEN_BYTE_ARRAY)", "refused", [], ["dec"],
                             {"spark.sql.parquet.writeLegacyFormat": "true"},
                             ["id", "cast(id / 4 as decimal(10,2)) as dec"]),
}

SPARK_SCRIPT = r"""
import json, os, shutil, sys
from pyspark.sql import SparkSession
jobs = json.loads(sys.argv[2])
out = sys.argv[1]
spark = (SparkSession.builder.master("local[1]").appName("wild")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
         .config("spark.driver.memory", "512m").config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
for name, (conf, select) in jobs.items():
    for k, v in conf.items():
        spark.conf.set(k, v)
    df = spark.range(0, %d, 1, 2).selectExpr(*select)
    df.write.mode("overwrite").option("parquet.block.size", 4096).parquet(os.path.join(out, name))
    for k in conf:
        spark.conf.unset(k)
spark.stop()
""" % N


def spark_available() -> str | None:
    """None if Spark can run here, else why not."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "java is not installed"
    return None


for _name, (_note, _outcome, _opts, _refuse, _conf, _select) in SPARK_JOBS.items():
    entry(_name, "spark", outcome=_outcome, options=_opts, refuse=_refuse, note=_note)(None)


def build_spark(out: Path, names: list[str]):
    jobs = {n: (SPARK_JOBS[n][4], SPARK_JOBS[n][5]) for n in names}
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", SPARK_SCRIPT, str(out), json.dumps(jobs)], env=env,
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"spark job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------

WRITER_MODULES = {"pyarrow": "pyarrow", "fastparquet": "fastparquet", "polars": "polars", "duckdb": "duckdb", "mixed": "pyarrow"}

METADATA_NAMES = {"_metadata", "_common_metadata", "_SUCCESS"}


def data_files(d: Path) -> list[str]:
    """The dataset's data files as tensorfs takes them: *.parquet (in subdirectories too, as an
    object-store listing finds them), by relative path in lexicographic order, no metadata."""
    return sorted(str(f.relative_to(d)) for f in d.rglob("*.parquet") if f.is_file() and f.name not in METADATA_NAMES)


def writer_missing(writer: str) -> str | None:
    if writer == "spark":
        return spark_available()
    try:
        __import__(WRITER_MODULES[writer])
    except ImportError as e:
        return f"{WRITER_MODULES[writer]} is not installed ({e})"
    return None


def public(e: dict) -> dict:
    return {k: v for k, v in e.items() if k != "make"}


def build(out: Path, only: list[str] | None = None, spark: bool = True) -> dict:
    """Write the corpus under OUT and return (and write) the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"entries": [], "skipped": []}
    timings = {}
    spark_names = []
    for e in ENTRIES:
        if only and e["name"] not in only:
            continue
        why = writer_missing(e["writer"]) if (spark or e["writer"] != "spark") else "spark disabled (--no-spark)"
        if why:
            manifest["skipped"].append({**public(e), "reason": why})
            continue
        d = out / e["name"]
        if d.exists():
            shutil.rmtree(d)
        if e["writer"] == "spark":
            spark_names.append(e["name"])
            continue
        d.mkdir()
        t0 = time.monotonic()
        try:
            e["make"](d)
        except Exception as ex:  # the writer refused these options: report it, go on
            manifest["skipped"].append({**public(e), "reason": f"writer failed: {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"})
            shutil.rmtree(d, ignore_errors=True)
            continue
        timings[e["name"]] = time.monotonic() - t0
        manifest["entries"].append({**public(e), "files": data_files(d)})
    if spark_names:
        t0 = time.monotonic()
        try:
            build_spark(out, spark_names)
            for n in spark_names:
                e = next(x for x in ENTRIES if x["name"] == n)
                manifest["entries"].append({**public(e), "files": data_files(out / n)})
        except Exception as ex:  # a broken Spark is reported, not fatal to the rest of the corpus
            for n in spark_names:
                e = next(x for x in ENTRIES if x["name"] == n)
                manifest["skipped"].append({**public(e), "reason": f"spark failed: {str(ex).splitlines()[0]}"})
        timings["spark (all)"] = time.monotonic() - t0
    manifest["timings"] = timings
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*", help="build only these entries")
    ap.add_argument("--no-spark", action="store_true", help="leave out the Spark entries")
    ap.add_argument("--schemas", action="store_true", help="print what pyarrow reads for every entry")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    m = build(args.out, args.only, spark=not args.no_spark)
    for s in m["skipped"]:
        print(f"skipped {s['name']}: {s['reason']}", file=sys.stderr)
    print(f"{len(m['entries'])} entries in {time.monotonic() - t0:.1f} s -> {args.out / 'manifest.json'}", file=sys.stderr)
    if args.schemas:
        for e in m["entries"]:
            print(f"== {e['name']} ({e['writer']}, {e['outcome']}) files={e['files']}")
            for f in e["files"][:1]:
                try:
                    print(textwrap.indent(str(pq.read_schema(args.out / e["name"] / f)), "    "))
                except Exception as ex:
                    print(f"    pyarrow cannot read it: {ex}")


if __name__ == "__main__":
    main()
