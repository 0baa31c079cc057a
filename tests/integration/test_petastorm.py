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
    [("variable_shape", "points", "id"), ("strings", "label", "id:value")],
)
def test_unservable_fields_are_refused_naming_the_way_out(mounter, name, field, keep):
    mp = mounter.mountpoint()
    proc = tfs.run(["mount", FIXTURES / name, mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and f"'{field}'" in line and f"columns={keep}" in line, line
    m = mounter(FIXTURES / name, f"columns={keep}", "shuffle=none")
    assert [t["name"] for t in m.dataset()["tensors"]] == keep.split(":")
    want = expected(name) if name != "variable_shape" else None
    if want:
        got = epoch_by_id(m)
        np.testing.assert_array_equal(got["value"], want["value"])


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
