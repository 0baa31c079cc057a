"""shuffle=none: the bytes of every batch, in both formats and through every reader, against
references computed with pyarrow/numpy; dataset.json; transforms; nulls; drop_last."""

import math
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tfs
from tfs import batch_name, check_batch

PAD = 8


def main_reference(ds: tfs.Dataset, pad: int = PAD) -> dict[str, np.ndarray]:
    """Full-dataset reference tensors of the all-types dataset with pad=tokens:PAD."""
    ref = {k: ds.ref[k] for k in tfs.MAIN_ORDER if k != "tokens"}
    ref["tokens"], ref["tokens.len"] = tfs.pad_ref(ds.ref["tokens"], pad)
    return ref


def batches(ref: dict[str, np.ndarray], rows: int, bs: int, drop_last=False):
    n = rows // bs if drop_last else math.ceil(rows / bs)
    return [{k: v[i * bs : (i + 1) * bs] for k, v in ref.items()} for i in range(n)]


def tensor_names(dj: dict) -> list[str]:
    return [t["name"] for t in dj["tensors"]]


def main_names(names):
    """Tensor names without the derived .len/.mask tensors, whose position is not specified."""
    return [n for n in names if not (n.endswith(".len") or n.endswith(".mask"))]


def test_all_types_shuffle_none(mounter, main_ds):
    bs = 256
    m = mounter(main_ds.path, "shuffle=none", f"batch_size={bs}", f"pad=tokens:{PAD}")
    expected = batches(main_reference(main_ds), main_ds.rows, bs)
    assert len(expected) == 12 and len(expected[-1]["id"]) == 3000 - 11 * 256

    # Sizes from stat, before anything is read, must be exact.
    sizes = {}
    for i, exp in enumerate(expected):
        name = batch_name(i)
        sizes[f"{name}.safetensors"] = os.stat(m.p("epoch-0", f"{name}.safetensors")).st_size
        for t in exp:
            sizes[f"{name}/{t}.npy"] = os.stat(m.p("epoch-0", name, f"{t}.npy")).st_size
    for i, exp in enumerate(expected):
        name = batch_name(i)
        assert sizes[f"{name}.safetensors"] == tfs.DATA_OFFSET + sum(a.nbytes for a in exp.values()), name
        for t, a in exp.items():
            assert sizes[f"{name}/{t}.npy"] == tfs.DATA_OFFSET + a.nbytes, f"{name}/{t}.npy"

    for i, exp in enumerate(expected):
        check_batch(m, "epoch-0", i, exp)

    # Sizes are the same after materialisation.
    for rel, size in sizes.items():
        assert os.stat(m.p("epoch-0", rel)).st_size == size, rel

    # The order of tensors in dataset.json follows the schema.
    assert main_names(tensor_names(m.dataset())) == tfs.MAIN_ORDER
    assert not m.p("epoch-0", batch_name(12) + ".safetensors").exists()


def test_batches_read_out_of_order(mounter, main_ds):
    """Reading the last batch first, then the npy of a middle batch before its safetensors."""
    bs = 256
    m = mounter(main_ds.path, "shuffle=none", f"batch_size={bs}", f"pad=tokens:{PAD}")
    expected = batches(main_reference(main_ds), main_ds.rows, bs)
    for i in (11, 5, 0):
        check_batch(m, "epoch-0", i, expected[i])


def test_dataset_json(mounter, main_ds):
    bs = 256
    m = mounter(main_ds.path, "shuffle=none", f"batch_size={bs}", f"pad=tokens:{PAD}", "epochs=3")
    dj = m.dataset()
    assert isinstance(dj["fingerprint"], str) and re.fullmatch(r"[0-9a-f]{8,}", dj["fingerprint"]), dj["fingerprint"]
    assert dj["rows"] == 3000
    assert dj["batch_size"] == bs
    assert dj["drop_last"] is False
    assert dj["batches_per_epoch"] == 12
    assert dj["last_batch_rows"] == 3000 - 11 * bs
    assert dj["epochs"] == 3
    assert dj["world_size"] is None
    assert dj["rank_batches_per_epoch"] is None

    assert len(dj["files"]) == 3
    for entry, (fname, rows, rgs) in zip(dj["files"], main_ds.files):
        assert os.path.basename(entry["path"]) == fname, entry
        assert entry["rows"] == rows, entry
        assert entry["row_groups"] == rgs, entry
        assert entry["size"] == os.path.getsize(main_ds.path / fname), entry

    ref = main_reference(main_ds)
    tensors = {t["name"]: t for t in dj["tensors"]}
    assert set(tensors) == set(ref)
    for name, arr in ref.items():
        t = tensors[name]
        assert t["dtype"] == arr.dtype.name, t
        assert list(t["shape"]) == [bs, *arr.shape[1:]], t
    assert tensors["d"]["unit"] == "D"
    assert tensors["ts"]["unit"] == "ms"
    for name in ref:
        if name not in ("d", "ts"):
            assert tensors[name].get("unit") is None, tensors[name]

    assert isinstance(dj["options"], dict)
    assert str(dj["options"].get("batch_size")) == str(bs), dj["options"]
    assert str(dj["options"].get("shuffle")) == "none", dj["options"]

    # The fingerprint depends on the data, not on the mount.
    m2 = mounter(main_ds.path, "shuffle=none", f"batch_size={bs}", f"pad=tokens:{PAD}", "epochs=3")
    assert m2.dataset()["fingerprint"] == dj["fingerprint"]


def test_fingerprint_changes_with_data(mounter, tmp_path, shuf_ds):
    a = mounter(shuf_ds.path, "shuffle=none").dataset()["fingerprint"]
    other = tmp_path / "other"
    other.mkdir()
    for fname, _, _ in shuf_ds.files:
        t = pq.read_table(shuf_ds.path / fname)
        if fname == "c.parquet":
            t = t.set_column(1, "x", pa.array(np.zeros(t.num_rows, dtype=np.float32)))
        pq.write_table(t, other / fname, row_group_size=tfs.SHUF_RG)
    b = mounter(other, "shuffle=none").dataset()["fingerprint"]
    assert a != b


def test_drop_last(mounter, main_ds):
    bs = 256
    m = mounter(main_ds.path, "shuffle=none", f"batch_size={bs}", f"pad=tokens:{PAD}", "drop_last")
    dj = m.dataset()
    assert dj["drop_last"] is True
    assert dj["batches_per_epoch"] == 11
    assert dj["last_batch_rows"] == bs
    names = sorted(os.listdir(m.p("epoch-0")))
    assert names == sorted([batch_name(i) + ".safetensors" for i in range(11)] + [batch_name(i) for i in range(11)] + ["all.safetensors", "all"])
    expected = batches(main_reference(main_ds), main_ds.rows, bs, drop_last=True)
    check_batch(m, "epoch-0", 10, expected[10])
    check_batch(m, "epoch-0", 0, expected[0])
    assert not m.p("epoch-0", batch_name(11) + ".safetensors").exists()
    assert not m.p("epoch-0", batch_name(11)).exists()


def test_exact_division(mounter, main_ds):
    """3000 rows / 500: six full batches, with and without drop_last."""
    for extra in ([], ["drop_last"]):
        m = mounter(main_ds.path, "shuffle=none", "batch_size=500", "columns=id:f64", *extra)
        dj = m.dataset()
        assert dj["batches_per_epoch"] == 6
        assert dj["last_batch_rows"] == 500
        exp = {"id": main_ds.ref["id"][2500:], "f64": main_ds.ref["f64"][2500:]}
        check_batch(m, "epoch-0", 5, exp)


def test_transforms(mounter, main_ds):
    """columns= (projection and order), stack=, cast= (repeated), pad=, each -o given separately."""
    bs, L = 500, 5
    m = mounter(
        main_ds.path,
        "shuffle=none",
        f"batch_size={bs}",
        "columns=ts:sx:sy:i16:f32:id:b:tokens",
        "stack=pair:sx+sy",
        "cast=i16:float32",
        "cast=f32:float64",
        "cast=id:int32",
        "cast=b:uint8",
        f"pad=tokens:{L}",
        split=True,
    )
    r = main_ds.ref
    ref = {
        "ts": r["ts"],
        "pair": np.stack([r["sx"], r["sy"]], axis=1),
        "i16": r["i16"].astype(np.float32),
        "f32": r["f32"].astype(np.float64),
        "id": r["id"].astype(np.int32),
        "b": r["b"].astype(np.uint8),
    }
    ref["tokens"], ref["tokens.len"] = tfs.pad_ref(r["tokens"], L)
    dj = m.dataset()
    assert main_names(tensor_names(dj)) == ["ts", "pair", "i16", "f32", "id", "b", "tokens"]
    tensors = {t["name"]: t for t in dj["tensors"]}
    assert tensors["pair"]["dtype"] == "float32" and list(tensors["pair"]["shape"]) == [bs, 2]
    assert tensors["i16"]["dtype"] == "float32"
    assert tensors["tokens"]["dtype"] == "int32" and list(tensors["tokens"]["shape"]) == [bs, L]
    assert tensors["tokens.len"]["dtype"] == "int32" and list(tensors["tokens.len"]["shape"]) == [bs]
    assert tensors["ts"]["unit"] == "ms"
    for i, exp in enumerate(batches(ref, main_ds.rows, bs)):
        check_batch(m, "epoch-0", i, exp)


def test_stack_three_columns_and_order(mounter, main_ds):
    """A stack in the middle of the schema takes its first member's place; members vanish."""
    bs = 1024
    m = mounter(main_ds.path, "shuffle=none", f"batch_size={bs}", "columns=id:sx:sy:sz:f32", "stack=xyz:sx+sy+sz")
    r = main_ds.ref
    ref = {"id": r["id"], "xyz": np.stack([r["sx"], r["sy"], r["sz"]], axis=1), "f32": r["f32"]}
    assert tensor_names(m.dataset()) == ["id", "xyz", "f32"]
    got = batches(ref, main_ds.rows, bs)
    assert len(got) == 3
    for i, exp in enumerate(got):
        check_batch(m, "epoch-0", i, exp)


def test_default_batch_size(mounter, main_ds):
    m = mounter(main_ds.path, "shuffle=none", "columns=id:emb:nest")
    dj = m.dataset()
    assert dj["batch_size"] == 1024
    assert dj["batches_per_epoch"] == 3
    assert dj["last_batch_rows"] == 3000 - 2048
    r = main_ds.ref
    check_batch(m, "epoch-0", 2, {"id": r["id"][2048:], "emb": r["emb"][2048:], "nest": r["nest"][2048:]})


# --- nulls -------------------------------------------------------------------------------------


def make_nulls(path):
    """2 files x 600 rows, row groups of 200: id (no nulls); score float32 with nulls in both
    files; cnt int32 with nulls in the second file only; vec FixedSizeList<float32>[2] with
    null rows (whose hidden child values are non-zero); flag bool with nulls."""
    rng = np.random.default_rng(7)
    tables, ref = [], {}
    for f, fname in enumerate(["n0.parquet", "n1.parquet"]):
        n = 600
        ids = np.arange(f * n, (f + 1) * n, dtype=np.int64)
        score = rng.standard_normal(n).astype(np.float32)
        score_null = rng.random(n) < 0.2
        cnt = rng.integers(-1000, 1000, n).astype(np.int32)
        cnt_null = (rng.random(n) < 0.1) if f == 1 else np.zeros(n, dtype=bool)
        vec = rng.standard_normal((n, 2)).astype(np.float32) + 5
        vec_null = rng.random(n) < 0.15
        flag = rng.random(n) < 0.5
        flag_null = rng.random(n) < 0.1
        # Nested: int16 [2, 3] per row, null at the outer level and at the leaves.
        grid = rng.integers(-100, 100, (n, 2, 3)).astype(np.int16)
        grid_null = rng.random(n) < 0.15
        leaf_null = rng.random((n, 2, 3)) < 0.05
        grid_ok = ~(grid_null[:, None, None] | leaf_null)
        pairs = pa.FixedSizeListArray.from_arrays(pa.array(grid.reshape(-1), mask=leaf_null.reshape(-1)), 3)
        table = pa.table(
            {
                "id": pa.array(ids),
                "score": pa.array(score, mask=score_null),
                "cnt": pa.array(cnt, mask=cnt_null),
                "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 2, mask=pa.array(vec_null)),
                "flag": pa.array(flag, mask=flag_null),
                "grid": pa.FixedSizeListArray.from_arrays(pairs, 2, mask=pa.array(grid_null)),
            }
        )
        tables.append((fname, table))
        parts = {
            "id": ids,
            "score": np.where(score_null, 0, score).astype(np.float32),
            "score.mask": (~score_null).astype(np.uint8),
            "cnt": np.where(cnt_null, 0, cnt).astype(np.int32),
            "cnt.mask": (~cnt_null).astype(np.uint8),
            "vec": np.where(vec_null[:, None], 0, vec).astype(np.float32),
            "vec.mask": np.repeat((~vec_null).astype(np.uint8)[:, None], 2, axis=1),
            "flag": np.where(flag_null, False, flag),
            "flag.mask": (~flag_null).astype(np.uint8),
            "grid": np.where(grid_ok, grid, 0).astype(np.int16),
            "grid.mask": grid_ok.astype(np.uint8),
        }
        for k, v in parts.items():
            ref.setdefault(k, []).append(v)
    files = tfs.write_dataset(path, tables, 200)
    ds = tfs.Dataset(path, files)
    ds.ref = {k: np.concatenate(v) for k, v in ref.items()}
    assert pq.read_table(path).column("vec").null_count > 0
    return ds


def test_nulls_zero_with_mask(mounter, tmp_path):
    ds = make_nulls(tmp_path / "nulls")
    bs = 256
    m = mounter(ds.path, "shuffle=none", f"batch_size={bs}", "nulls=zero")
    dj = m.dataset()
    tensors = {t["name"]: t for t in dj["tensors"]}
    assert set(tensors) == set(ds.ref), "a .mask tensor exactly for each column with nulls"
    assert main_names(tensor_names(dj)) == ["id", "score", "cnt", "vec", "flag", "grid"]
    for name in ("score", "cnt", "vec", "flag", "grid"):
        assert tensors[name + ".mask"]["dtype"] == "uint8"
        assert tensors[name + ".mask"]["shape"] == tensors[name]["shape"]
    got = batches(ds.ref, ds.rows, bs)
    assert len(got) == 5
    for i, exp in enumerate(got):
        check_batch(m, "epoch-0", i, exp)


def test_null_and_empty_lists_with_pad(mounter, tmp_path):
    """pad= on a list column holding null lists, empty lists and lists longer than L."""
    rng = np.random.default_rng(3)
    tables, lists = [], []
    for f in range(2):
        n = 300
        col = []
        for r in range(n):
            k = int(rng.integers(0, 8))
            if r % 7 == 0:
                col.append(None)
            elif r % 11 == 0:
                col.append([])
            else:
                col.append(rng.integers(1, 1000, k).astype(np.int32).tolist())
        col[1] = [1, 2, 3, 4, 5, 6, 7]
        tables.append((f"l{f}.parquet", pa.table({"id": np.arange(f * n, (f + 1) * n), "tokens": pa.array(col, type=pa.list_(pa.int32()))})))
        lists += col
    path = tmp_path / "lists"
    tfs.write_dataset(path, tables, 100)
    L, bs = 4, 128
    m = mounter(path, "shuffle=none", f"batch_size={bs}", f"pad=tokens:{L}", "nulls=zero")
    padded, lens = tfs.pad_ref(lists, L)
    assert lens[0] == 0 and lens[1] == L
    n_batches = math.ceil(600 / bs)
    assert m.dataset()["batches_per_epoch"] == n_batches
    for i in range(n_batches):
        got = tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))
        assert set(got) <= {"id", "tokens", "tokens.len", "tokens.mask"}, sorted(got)
        tfs.assert_array(got["tokens"], padded[i * bs : (i + 1) * bs], f"batch {i} tokens")
        tfs.assert_array(got["tokens.len"], lens[i * bs : (i + 1) * bs], f"batch {i} tokens.len")
        tfs.assert_array(np.load(m.p("epoch-0", batch_name(i), "tokens.npy")), padded[i * bs : (i + 1) * bs], "npy")
