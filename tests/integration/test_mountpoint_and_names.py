"""A mount point that is not empty is refused unless `nonempty` (PRODUCT.md §3, §7), and column
names holding separators are named with backslash escapes, in options and in every printed hint
(§4), so a hint can be pasted back as it is."""

import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tfs
from tfs import batch_name


def test_a_mount_point_with_files_is_refused_unless_nonempty(mounter, shuf_ds):
    mp = mounter.mountpoint()
    (mp / "keep.txt").write_text("mine")
    proc = tfs.run(["mount", shuf_ds.path, mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert proc.returncode != 0
    assert "not empty" in line and "nonempty" in line, line
    assert not tfs.is_mounted(mp)
    assert (mp / "keep.txt").read_text() == "mine"
    # The form mount(8) runs refuses the same way.
    proc = tfs.run([shuf_ds.path, mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    assert proc.returncode != 0 and "not empty" in tfs.error_line(proc)

    m = mounter(shuf_ds.path, "nonempty")
    assert m.dataset()["options"]["nonempty"] is True
    # Mounting over files with nonempty hides them while mounted.
    over = mounter.mountpoint("over")
    (over / "hidden.txt").write_text("x")
    proc = tfs.run(["mount", shuf_ds.path, over, "-o", f"nonempty,cache_dir={over.parent / 'c2'}"])
    assert proc.returncode == 0, proc.stderr
    try:
        assert "dataset.json" in {p.name for p in over.iterdir()}
        assert not (over / "hidden.txt").exists()
    finally:
        tfs.unmount(over)
    assert (over / "hidden.txt").read_text() == "x"


def test_column_names_with_separators(mounter, tmp_path):
    data = tmp_path / "names"
    data.mkdir()
    ids = np.arange(100, dtype=np.int64)
    table = pa.table(
        {
            "a:b": ids,
            "c,d": (ids * 2).astype(np.float32),
            "e+f\\g": ids.astype(np.int16),
            "text": pa.array([str(i) for i in ids]),
        }
    )
    pq.write_table(table, data / "part-0.parquet", row_group_size=50)

    # The refusal names the string column, and its columns= hint escapes every separator.
    proc = tfs.run(["inspect", data])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and "'text'" in line
    hint = line.split("columns=", 1)[1].split()[0].rstrip(";,")
    assert hint == "a\\:b:c\\,d:e\\+f\\\\g", line

    # Pasted back as it is, it mounts and names the columns.
    m = mounter(data, "shuffle=none", "batch_size=32", f"columns={hint}")
    names = [t["name"] for t in m.dataset()["tensors"]]
    assert names == ["a:b", "c,d", "e+f\\g"]
    np.testing.assert_array_equal(np.load(m.p("epoch-0", "000000", "a:b.npy")), ids[:32])
    np.testing.assert_array_equal(np.load(m.p("epoch-0", "000001", "c,d.npy")), (ids[32:64] * 2).astype(np.float32))
    # cast= takes an escaped name too.
    m2 = mounter(data, "shuffle=none", "batch_size=32", f"columns={hint}", "cast=c\\,d:float64")
    assert [t["dtype"] for t in m2.dataset()["tensors"]] == ["int64", "float64", "int16"]


def test_the_mount_shows_its_type_and_an_absolute_source(mounter, shuf_ds):
    """findmnt and /proc/mounts show `fuse.tensorfs` and the source as an absolute path, even for
    a relative source."""
    mp = mounter.mountpoint()
    rel = os.path.relpath(shuf_ds.path, mp.parent)
    proc = subprocess.run(
        [str(tfs.BIN), "mount", rel, str(mp), "-o", f"cache_dir={mp.parent / 'c'}"],
        cwd=mp.parent, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    try:
        fields = [line.split() for line in open("/proc/mounts") if line.split()[1] == str(mp)]
        assert len(fields) == 1, fields
        device, _, fstype = fields[0][:3]
        assert fstype == "fuse.tensorfs"
        assert device == os.path.realpath(shuf_ds.path)
    finally:
        tfs.unmount(mp)


def test_every_hint_of_a_refusal_mounts_and_keeps_every_servable_column(mounter, tmp_path):
    """A dataset refused for many reasons at once: every hint printed, pasted back as it is,
    mounts; none keeps a column another refusal names (a name that cannot be a file, one that a
    `.mask` or `.len` tensor would take); a name with a line break is escaped, the line kept
    whole; a variable-length list is kept with its pad=."""
    data = tmp_path / "many"
    data.mkdir()
    n = 64
    ids = np.arange(n, dtype=np.int64)
    long_name = "x" * 252  # 252 + len(".npy") > 255
    table = pa.table({
        "id": ids,
        "a/b": ids.astype(np.int32),
        "..": ids.astype(np.int32),
        long_name: ids.astype(np.int32),
        "n\nl": ids.astype(np.int16),
        "x": pa.array([None if i % 7 == 0 else float(i) for i in ids], pa.float64()),
        "x.mask": ids,
        "l": pa.array([list(range(i % 5)) for i in ids], pa.list_(pa.int64())),
        "l.len": ids.astype(np.int32),
        "s": pa.array([str(i) for i in ids]),
    })
    pq.write_table(table, data / "part-0.parquet", row_group_size=32)

    proc = tfs.run(["inspect", data])
    line = tfs.error_line(proc)
    listed = [ln[len("  - "):] for ln in proc.stdout.splitlines() if ln.startswith("  - ")]
    assert len(listed) >= 5, proc.stdout
    assert any("n\\nl" in ln for ln in listed) or "n\\nl" in line, proc.stdout
    never = {"a/b", "..", long_name, "s"}
    for refusal in [line, *listed]:
        opts = tfs.hint_options(refusal)
        assert opts, f"no hint in: {refusal}"
        m = mounter(data, "shuffle=none", "batch_size=32", *opts)
        names = {t["name"] for t in m.dataset()["tensors"]}
        assert not names & never, (refusal, names)
        assert "id" in names and "n\nl" in names, (refusal, names)
        # The mask of x, or the column x.mask, never both; the same for l.len.
        assert ("x" in names) <= ("x.mask" in names), names
        assert ("l" in names) <= ("l.len" in names), names
        np.testing.assert_array_equal(np.load(m.p("epoch-0", "000001", "n\nl.npy")), ids[32:].astype(np.int16))
        m.unmount()


def test_batch_names_are_six_digits_and_widen_only_past_999999(mounter, tmp_path):
    """Batch i is `{i:06d}` whatever the epoch's length: batch 0 of an epoch of a million and one
    batches is 000000, its last is 1000000, and no other spelling names a batch."""
    data = tmp_path / "long"
    data.mkdir()
    rows = 1_000_001
    pq.write_table(pa.table({"v": np.arange(rows, dtype=np.int32)}), data / "part-0.parquet", row_group_size=250_000)
    m = mounter(data, "shuffle=none", "batch_size=1")
    assert m.dataset()["batches_per_epoch"] == rows
    for i in (0, 999_999, 1_000_000):
        name = batch_name(i)
        assert tfs.load_safetensors(m.p("epoch-0", name + ".safetensors"))["v"].tolist() == [i]
        assert np.load(m.p("epoch-0", name, "v.npy")).tolist() == [i]
    assert batch_name(1_000_000) == "1000000"
    for wrong in ("0000000", "01000000", "1000001", "00000", "999999 "):
        assert not os.path.exists(m.p("epoch-0", wrong + ".safetensors")), wrong
        assert not os.path.exists(m.p("epoch-0", wrong)), wrong
    # The last epoch a mount shows, and none past it.
    for far in ("epoch-4294967296", "epoch-9223372036854775807"):
        assert tfs.load_safetensors(m.p(far, batch_name(7) + ".safetensors"))["v"].tolist() == [7]
    assert not os.path.exists(m.p("epoch-9223372036854775808"))
    assert not os.path.exists(m.p("epoch-18446744073709551615"))
