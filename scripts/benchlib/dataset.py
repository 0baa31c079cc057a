"""The benchmark's Parquet dataset, and the same batches as local .npy files (the limit)."""

from __future__ import annotations

from pathlib import Path


def write_dataset(out: Path, rows: int, files: int, rg_rows: int, emb_as_list: bool = False, emb_dim: int = 64) -> None:
    """ROWS rows over FILES files of RG_ROWS-row groups; the same values for the same arguments.
    `emb` is float32[EMB_DIM] (64: 272 tensor bytes a row; 16: 80).

    emb_as_list writes `emb` as list<float32> (same values) for Petastorm, which skips
    FixedSizeList columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    start = 0
    for f in range(files):
        n = min(per_file, rows - start)
        if n <= 0:
            break
        rng = np.random.default_rng(1000 + f)
        emb_values = pa.array(rng.standard_normal(emb_dim * n, dtype=np.float32))
        if emb_as_list:
            offsets = pa.array(np.arange(0, emb_dim * n + 1, emb_dim, dtype=np.int32))
            emb = pa.ListArray.from_arrays(offsets, emb_values)
        else:
            emb = pa.FixedSizeListArray.from_arrays(emb_values, emb_dim)
        table = pa.table(
            {
                "id": np.arange(start, start + n, dtype=np.int64),
                "x": rng.standard_normal(n, dtype=np.float32),
                "emb": emb,
                "label": rng.integers(0, 1000, n, dtype=np.int32),
            }
        )
        pq.write_table(table, out / f"part-{f:05d}.parquet", row_group_size=rg_rows, compression="snappy")
        start += n
        del table, emb, emb_values


# The small-row dataset: 80 tensor bytes a row, in many scalar columns and one small vector.
SMALL_SCALARS = [f"f{k}" for k in range(10)] + [f"i{k}" for k in range(4)]
SMALL_TENSORS = ("id", *SMALL_SCALARS, "v")
SMALL_ROW_BYTES = 8 + 10 * 4 + 4 * 4 + 4 * 4


def write_small_rows_dataset(out: Path, rows: int, files: int, rg_rows: int) -> None:
    """ROWS rows of int64 `id`, float32 `f0`..`f9`, int32 `i0`..`i3` and float32[4] `v`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for f, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        rng = np.random.default_rng(2000 + f)
        cols = {"id": np.arange(start, start + n, dtype=np.int64)}
        cols.update({c: rng.standard_normal(n, dtype=np.float32) for c in SMALL_SCALARS if c[0] == "f"})
        cols.update({c: rng.integers(0, 1 << 20, n, dtype=np.int32) for c in SMALL_SCALARS if c[0] == "i"})
        cols["v"] = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(4 * n, dtype=np.float32)), 4)
        pq.write_table(pa.table(cols), out / f"part-{f:05d}.parquet", row_group_size=rg_rows, compression="snappy")


def parquet_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith(".parquet"))


def column_arrays(batch) -> dict:
    """A record batch's columns as NumPy arrays (the conversion every Parquet reader pays)."""
    import pyarrow as pa

    out = {}
    for name, col in zip(batch.schema.names, batch.columns):
        if pa.types.is_fixed_size_list(col.type):
            out[name] = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def write_npy_batches(data: Path, out: Path, batch_size: int) -> int:
    """The dataset's canonical order cut into batches, one directory of .npy files per batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    pending: list = []
    n_pending = 0
    i = 0

    def flush(n):
        nonlocal pending, n_pending, i
        table = pa.Table.from_batches(pending).combine_chunks()
        head, rest = table.slice(0, n), table.slice(n)
        d = out / f"{i:06d}"
        d.mkdir()
        for b in head.to_batches():
            for name, arr in column_arrays(b).items():
                np.save(d / f"{name}.npy", np.ascontiguousarray(arr))
        i += 1
        pending = rest.to_batches()
        n_pending = rest.num_rows

    for path in parquet_files(data):
        for b in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            pending.append(b)
            n_pending += b.num_rows
            while n_pending >= batch_size:
                flush(batch_size)
    if n_pending:
        flush(n_pending)
    return i
