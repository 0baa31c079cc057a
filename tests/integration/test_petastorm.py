"""Datasets written by Petastorm 0.13.1's own materialize_dataset (tests/fixtures/petastorm,
made by make.py there) mount as they are (PRODUCT.md §4): every tensor equals what Petastorm's
own make_reader returned for the same rows (the .expected.npz beside each dataset), images
included, byte for byte; refusals name the field and the columns= that leaves it out."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tfs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"


def expected(name: str) -> dict:
    z = np.load(FIXTURES / f"{name}.expected.npz")
    return {k: z[k] for k in z.files}


def epoch_by_id(m: tfs.Mount) -> dict:
    """Every tensor of the whole epoch (one open each), rows sorted by id."""
    names = [t["name"] for t in m.dataset()["tensors"]]
    cols = {n: np.load(m.p("epoch-0", "all", f"{n}.npy")) for n in names}
    order = np.argsort(cols["id"], kind="stable")
    return {n: c[order] for n, c in cols.items()}


@pytest.mark.parametrize("name", ["images", "ndarrays"])
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_every_tensor_equals_what_make_reader_returns(mounter, name, shuffle):
    want = expected(name)
    m = mounter(FIXTURES / name, f"shuffle={shuffle}", "batch_size=7")
    dj = m.dataset()
    assert dj["petastorm"]["unischema"], dj["petastorm"]
    got = epoch_by_id(m)
    fields = [k for k in want if not k.startswith("_")]
    assert sorted(got) == sorted(fields)
    for f in fields:
        assert got[f].dtype == want[f].dtype, f"{f}: {got[f].dtype} vs make_reader's {want[f].dtype}"
        assert got[f].shape == want[f].shape, f"{f}: {got[f].shape} vs {want[f].shape}"
        np.testing.assert_array_equal(got[f], want[f], err_msg=f"{name}.{f}")
    # Batch files hold the same rows as the one-open files.
    batch = tfs.load_safetensors(m.p("epoch-0", tfs.batch_name(1) + ".safetensors"))
    for f in fields:
        np.testing.assert_array_equal(batch[f], np.load(m.p("epoch-0", "all", f"{f}.npy"))[7:14])


def test_nullable_fields_are_zero_filled_with_a_mask(mounter):
    want = expected("nullable")
    # Refused by default, naming the field and both ways out.
    mp = mounter.mountpoint()
    proc = tfs.run(["mount", FIXTURES / "nullable", mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and "maybe_i32" in line and "nulls=zero" in line, line
    m = mounter(FIXTURES / "nullable", "nulls=zero", "shuffle=none", "batch_size=5")
    got = epoch_by_id(m)
    for f in ("maybe_i32", "maybe_f32_3"):
        valid = want[f"{f}__valid"]
        mask = got[f"{f}.mask"]
        assert mask.shape == got[f].shape
        rows_valid = mask.reshape(len(mask), -1).all(axis=1)
        np.testing.assert_array_equal(rows_valid, valid, err_msg=f"{f} mask")
        np.testing.assert_array_equal(got[f][valid], want[f][valid], err_msg=f)
        assert not got[f][~valid].any(), f"{f}: null rows are not zeros"


@pytest.mark.parametrize(
    "name,field,keep",
    [("variable_shape", "points", "id"), ("strings", "label", "id:value"), ("unserved", "price", "id:value")],
)
def test_unservable_fields_are_refused_naming_the_way_out(mounter, name, field, keep):
    mp = mounter.mountpoint()
    proc = tfs.run(["mount", FIXTURES / name, mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and f"'{field}'" in line and f"columns={keep}" in line, line
    m = mounter(FIXTURES / name, f"columns={keep}", "shuffle=none")
    assert [t["name"] for t in m.dataset()["tensors"]] == keep.split(":")
    if name != "variable_shape":
        got = epoch_by_id(m)
        # Only this key: unserved's npz also holds make_reader's Decimal objects (a pickle).
        np.testing.assert_array_equal(got["value"], np.load(FIXTURES / f"{name}.expected.npz")["value"])


def test_a_string_ndarray_and_a_decimal_are_refused_word_for_word():
    """A Petastorm string ndarray (NdarrayCodec of str_) and a Decimal scalar field, written by
    Petastorm itself: each refused in its own line naming it and the columns= that serves the
    rest."""
    proc = tfs.run(["inspect", FIXTURES / "unserved"])
    assert proc.returncode != 0
    refused = [ln.strip() for ln in proc.stdout.splitlines() if ln.startswith("  - ")]
    assert refused == [
        "- column 'price' (decimal(10, 2)) has no tensor mapping (strings, structs, maps and decimals are not "
        "served); leave it out with columns=id:value",
        "- field 'tags' (NdarrayCodec str_ (2,)) has the dtype str_, which has no tensor mapping; leave it out "
        "with columns=id:value",
    ], proc.stdout


def test_inspect_shows_each_fields_codec():
    proc = tfs.run(["inspect", FIXTURES / "images", "-o", "batch_size=4"])
    assert proc.returncode == 0, proc.stderr
    assert "Unischema 'ImagesSchema'" in proc.stdout
    assert "png_rgb    uint8    [4, 12, 16, 3]  from CompressedImageCodec(png) cells" in proc.stdout
    assert "jpeg_gray  uint8    [4, 12, 16]  from CompressedImageCodec(jpeg) cells" in proc.stdout


def test_a_cell_that_disagrees_with_its_unischema_is_eio_naming_field_and_row(mounter, tmp_path):
    """A cell whose image is not the Unischema's shape fails its batch with EIO and a log line
    naming the field and the row; the other batches are served."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "images"
    shutil.copytree(FIXTURES / "images", data)
    part = sorted(data.glob("*.parquet"))[0]
    table = pq.read_table(part)
    cells = table.column("png_gray").to_pylist()
    cells[1] = table.column("png_rgb")[1].as_py()  # an RGB image where gray is declared
    table = table.set_column(table.schema.get_field_index("png_gray"), "png_gray", pa.array(cells, pa.binary()))
    pq.write_table(table, part, row_group_size=3)
    m = mounter(data, "shuffle=none", "batch_size=3", "prefetch=0")
    with pytest.raises(OSError) as e:
        tfs.read_exact(m.p("epoch-0", tfs.batch_name(0), "png_gray.npy"))
    assert e.value.errno == 5
    tfs.read_exact(m.p("epoch-0", tfs.batch_name(5), "png_gray.npy"))
    m.unmount()
    log = (m.cache / "tensorfs.log").read_text()
    assert "field 'png_gray' row 1" in log and "where the Unischema says uint8 (12, 16)" in log, log[-2000:]


@pytest.mark.parametrize("name", ["images", "ndarrays"])
def test_without_a_unischema_the_cells_say_what_they_are(mounter, tmp_path, name):
    """A dataset whose _common_metadata is gone: each binary field is read as its first cell
    shows it (.npy, zip, PNG, JPEG), and dataset.json says so."""
    data = tmp_path / name
    shutil.copytree(FIXTURES / name, data)
    (data / "_common_metadata").unlink()
    m = mounter(data, "shuffle=none", "batch_size=8")
    dj = m.dataset()
    assert dj["petastorm"]["from"] == "cells" and dj["petastorm"]["unischema"] is None
    want = expected(name)
    got = epoch_by_id(m)
    for f in (k for k in want if not k.startswith("_")):
        np.testing.assert_array_equal(got[f], want[f], err_msg=f"{name}.{f} without a Unischema")


# --------------------------------------------------------------------------------------------
# The rest of the product, unchanged on Petastorm datasets: shuffles, partitions and ranks, the
# cache, passthrough (PRODUCT.md §4: "The rest of the product unchanged for these datasets").
# --------------------------------------------------------------------------------------------


def epoch_batches(m: tfs.Mount, epoch: int, names: list[str]) -> dict:
    """Every tensor of EPOCH as its batch files hold it, concatenated in batch order."""
    n = m.dataset()["batches_per_epoch"]
    got = {k: [] for k in names}
    for i in range(n):
        b = tfs.load_safetensors(m.p(f"epoch-{epoch}", tfs.batch_name(i) + ".safetensors"))
        for k in names:
            got[k].append(b[k])
    return {k: np.concatenate(v) for k, v in got.items()}


@pytest.mark.parametrize("name", ["images", "ndarrays"])
def test_shuffle_window_serves_make_readers_rows_as_a_permutation(mounter, name):
    """shuffle=window over Petastorm cells: each epoch (epoch 1 gathered from the columns cached
    during epoch 0) is a permutation of the rows, and every tensor, sorted by id, equals what
    make_reader returned, byte for byte."""
    want = expected(name)
    fields = [k for k in want if not k.startswith("_")]
    m = mounter(FIXTURES / name, "shuffle=window", "batch_size=4", "epochs=2", "seed=3")
    orders = []
    for e in (0, 1):
        got = epoch_batches(m, e, fields)
        ids = got["id"]
        assert np.array_equal(np.sort(ids), want["id"]), f"epoch {e} is not a permutation of the rows: {ids}"
        orders.append(ids)
        order = np.argsort(ids, kind="stable")
        for f in fields:
            tfs.assert_array(got[f][order], want[f], f"{name}.{f}, shuffle=window epoch {e}")
    assert not np.array_equal(orders[0], want["id"]), "shuffle=window left epoch 0 in the dataset's order"
    assert not np.array_equal(orders[0], orders[1]), "epochs 0 and 1 have the same order"


@pytest.mark.parametrize("name", ["images", "ndarrays"])
def test_partitions_and_rank_views(mounter, name):
    """partitions=2, world_size=2: rank R's batch j is global batch R + 2j, byte for byte, the
    two ranks' rows apart; world_size does not change the global batches."""
    opts = ("shuffle=window", "batch_size=3", "partitions=2", "seed=4")
    m = mounter(FIXTURES / name, *opts, "world_size=2")
    plain = mounter(FIXTURES / name, *opts)
    dj = m.dataset()
    rows = len(expected(name)["id"])
    assert dj["partitions"] == 2 and dj["world_size"] == 2
    per_rank = dj["rank_batches_per_epoch"]
    assert per_rank == dj["single_partition_batches"] // 2 > 0, dj
    names = [t["name"] for t in dj["tensors"]]
    held = [set(), set()]
    for r in range(2):
        rd = f"epoch-0/rank-{r}-of-2"
        for j in range(per_rank):
            g = r + 2 * j
            for tail in [".safetensors"] + [f"/{n}.npy" for n in names]:
                mine = tfs.read_exact(m.p(rd, tfs.batch_name(j) + tail))
                glob = tfs.read_exact(m.p("epoch-0", tfs.batch_name(g) + tail))
                assert mine == glob, f"{name}: rank {r} batch {j}{tail} != global batch {g}"
                assert tfs.read_exact(plain.p("epoch-0", tfs.batch_name(g) + tail)) == glob, (
                    f"{name}: world_size=2 changed global batch {g}{tail}")
            # the fixtures' ids are their row numbers (make_reader's order)
            held[r].update(tfs.load_safetensors(m.p(rd, tfs.batch_name(j) + ".safetensors"))["id"].tolist())
    assert not held[0] & held[1], f"{name}: the two partitions' batches share rows"
    got = epoch_batches(m, 0, ["id"])["id"]
    assert np.array_equal(np.sort(got), expected(name)["id"]), "partitions=2: the epoch is not a permutation"


@pytest.mark.parametrize("name", ["images", "ndarrays"])
def test_warm_remount_decodes_nothing(mounter, name):
    """The decoded cells are cached like any other column: a remount on the same cache_dir
    serves the same bytes (batch files, .npy files, all/) without decoding a row group."""
    opts = ("shuffle=window", "batch_size=4", "seed=9")
    a = mounter(FIXTURES / name, *opts)
    n = a.dataset()["batches_per_epoch"]
    names = [t["name"] for t in a.dataset()["tensors"]]
    rels = tfs.all_files(a, "epoch-0", n) + ["epoch-0/all.safetensors"] + [f"epoch-0/all/{k}.npy" for k in names]
    first = {rel: tfs.sha256(a.p(rel)) for rel in rels}
    cold = tfs.stats(a)
    assert cold["row_groups_decoded"] > 0, cold
    a.unmount()
    b = mounter(FIXTURES / name, *opts, cache=a.cache)
    second = {rel: tfs.sha256(b.p(rel)) for rel in rels}
    s = tfs.stats(b)
    bad = sorted(rel for rel in rels if first[rel] != second[rel])
    assert not bad, f"{name}: the warm remount served other bytes: {bad[:5]}"
    assert s["row_groups_decoded"] == 0, s


def test_passthrough_serves_petastorm_batches(mounter):
    """A materialised batch file of a Petastorm dataset (shuffle=none: every epoch reads it, so it
    is written to the cache) is opened in FUSE passthrough (when the kernel takes it) and reads
    the same bytes as with passthrough=off."""
    m = mounter(FIXTURES / "images", "shuffle=none", "batch_size=4")
    rel = "epoch-0/000002.safetensors"
    first = tfs.read_exact(m.p(rel))
    s1 = tfs.stats(m)
    second = tfs.read_exact(m.p(rel))
    s2 = tfs.stats(m)
    assert second == first
    off = mounter(FIXTURES / "images", "shuffle=none", "batch_size=4", "passthrough=off")
    assert tfs.read_exact(off.p(rel)) == first
    so = tfs.stats(off)
    assert so["passthrough_opens"] == 0 and so["daemon_read_bytes"] >= len(first), so
    if s2["passthrough_opens"] == 0:
        pytest.skip(f"the kernel did not take FUSE passthrough (opens={s2['opens']}, passthrough_opens=0)")
    assert s2["passthrough_opens"] > s1["passthrough_opens"], (s1, s2)
    assert s2["daemon_reads"] == s1["daemon_reads"], f"a passthrough read reached the daemon: {s1} -> {s2}"


def test_inspect_shows_scalar_codec_fields():
    """ScalarCodec fields show their codec as cell fields do ('  NAME  DTYPE  [SHAPE]  from CODEC ...')."""
    import re

    proc = tfs.run(["inspect", FIXTURES / "ndarrays", "-o", "batch_size=4"])
    assert proc.returncode == 0, proc.stderr
    for field, dtype in [("id", "int32"), ("s_f32", "float32"), ("s_i64", "int64"), ("s_f64", "float64"),
                         ("s_bool", "bool"), ("s_i16", "int16"), ("s_i8", "int8")]:
        line = rf"^  {field} +{dtype} +\[4\]  from ScalarCodec\b"
        assert re.search(line, proc.stdout, re.M), f"no line matching {line!r} in:\n{proc.stdout}"
    # Cell fields keep their line.
    assert re.search(r"^  f32_4 +float32 +\[4, 4\]  from NdarrayCodec cells$", proc.stdout, re.M), proc.stdout
