"""Files whose footers old or buggy writers left, which pyarrow reads (PRODUCT.md §4, §7; the
issue "Data from the wild"): each is served exactly as pyarrow reads it. The files are good
pyarrow files with their footers rewritten the way those writers wrote them
(footer_surgery.py)."""

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import footer_surgery as fs
import tfs


def good_file(path, rows=500, rg=128):
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            # Few distinct values: dictionary-encoded, so each chunk starts with a dictionary page.
            "k": (ids % 7).astype(np.int32),
            "x": (ids / 2).astype(np.float32),
        }
    )
    pq.write_table(table, path, row_group_size=rg, use_dictionary=["k"], compression="snappy")
    return table


def served_as_pyarrow_reads(mounter, data_dir, file):
    want = pq.read_table(file)
    m = mounter(data_dir, "shuffle=none", "batch_size=100")
    for name in want.column_names:
        got = np.load(m.p("epoch-0", "all", f"{name}.npy"))
        np.testing.assert_array_equal(got, want.column(name).to_numpy(), err_msg=name)
    return m


def test_a_footer_row_count_that_disagrees_with_its_row_groups(mounter, tmp_path):
    """Footer: 0 rows; its row groups: 500. The parquet crate sized its reads by the footer's
    count and read nothing (every read was EIO)."""
    data = tmp_path / "data"
    data.mkdir()
    good_file(data / "f.parquet")
    body, md = fs.read_footer(data / "f.parquet")
    md[3] = (fs.I64, 0)
    fs.write_file(data / "f.parquet", body, md)
    assert pq.ParquetFile(data / "f.parquet").metadata.num_rows == 0
    assert pq.read_table(data / "f.parquet").num_rows == 500
    m = served_as_pyarrow_reads(mounter, data, data / "f.parquet")
    assert m.dataset()["rows"] == 500


def test_column_chunk_sizes_too_short_parquet_816(mounter, tmp_path):
    """parquet-mr 1.2.8 and older left the dictionary page header out of total_compressed_size:
    the chunk's last bytes were never fetched."""
    data = tmp_path / "data"
    data.mkdir()
    good_file(data / "f.parquet")
    body, md = fs.read_footer(data / "f.parquet")
    for cmd in fs.column_meta_data(md):
        if 11 in cmd:  # a dictionary page: its header is what the old writer left out
            t, size = cmd[7]
            cmd[7] = (t, size - 9)
    md[6] = (fs.BINARY, b"parquet-mr version 1.2.8 (build 1234)")
    fs.write_file(data / "f.parquet", body, md)
    served_as_pyarrow_reads(mounter, data, data / "f.parquet")


def test_a_pre_release_parquet_mr_footer(mounter, tmp_path):
    """A field id the format later gave another type (ColumnMetaData 15, now an i32, written as
    a list) made the parquet crate refuse the footer; the same writer stored
    dictionary_page_offset = 0 with the dictionary page at data_page_offset (PARQUET-1402)."""
    data = tmp_path / "data"
    data.mkdir()
    good_file(data / "f.parquet")
    body, md = fs.read_footer(data / "f.parquet")
    for cmd in fs.column_meta_data(md):
        cmd[15] = (fs.LIST, (fs.I16, [1, 2, 3]))
        if 11 in cmd:
            cmd[9] = (fs.I64, cmd[11][1])
            cmd[11] = (fs.I64, 0)
    fs.write_file(data / "f.parquet", body, md)
    served_as_pyarrow_reads(mounter, data, data / "f.parquet")


@pytest.mark.parametrize("damage", ["truncated-footer", "bad-magic", "garbage-footer"])
def test_malformed_footers_fail_the_mount_in_one_line(mounter, tmp_path, damage):
    data = tmp_path / "data"
    data.mkdir()
    good_file(data / "f.parquet")
    b = bytearray((data / "f.parquet").read_bytes())
    if damage == "truncated-footer":
        b = b[:-40] + b[-8:]
    elif damage == "bad-magic":
        b[-4:] = b"PARX"
    else:
        n = int.from_bytes(b[-8:-4], "little")
        b[len(b) - 8 - n : len(b) - 8] = bytes(range(256)) * (n // 256) + bytes(n % 256)
    (data / "f.parquet").write_bytes(bytes(b))
    mp = mounter.mountpoint()
    proc = tfs.run(["mount", data, mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and "f.parquet" in line, line
    assert not tfs.is_mounted(mp)


LZO = 3  # CompressionCodec.LZO in parquet.thrift


def test_a_column_compressed_with_lzo_is_refused_at_mount(mounter, tmp_path):
    """The parquet crate has no LZO decoder: a file whose column chunks say LZO (the codec of
    ColumnMetaData, field 4) is refused at mount time, where the footer shows it, naming the
    file, the column and the codec; the columns= the line offers, pasted back, mounts and serves
    the other columns exactly as pyarrow reads them."""
    data = tmp_path / "data"
    data.mkdir()
    good_file(data / "f.parquet")
    body, md = fs.read_footer(data / "f.parquet")
    changed = 0
    for cmd in fs.column_meta_data(md):
        if cmd[3][1][1] == [b"x"]:  # path_in_schema
            cmd[4] = (fs.I32, LZO)
            changed += 1
    assert changed == 4  # every row group's chunk of x
    fs.write_file(data / "f.parquet", body, md)
    assert pq.ParquetFile(data / "f.parquet").metadata.row_group(0).column(2).compression == "LZO"

    mp = mounter.mountpoint()
    proc = tfs.run(["mount", data, mp, "-o", f"cache_dir={mp.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert not tfs.is_mounted(mp)
    assert line == (
        tfs.ERROR_PREFIX
        + "column 'x' of file 'f.parquet' is compressed with LZO, which tensorfs cannot decode; leave it out with columns=id:k"
    )
    hint = re.search(r"; leave it out with (columns=\S+)$", line).group(1)
    proc = tfs.run(["inspect", data, "-o", hint])
    assert proc.returncode == 0, proc.stderr
    want = pq.read_table(data / "f.parquet", columns=["id", "k"])
    m = mounter(data, "shuffle=none", "batch_size=100", hint)
    assert [t["name"] for t in m.dataset()["tensors"]] == ["id", "k"]
    for name in want.column_names:
        got = np.load(m.p("epoch-0", "all", f"{name}.npy"))
        np.testing.assert_array_equal(got, want.column(name).to_numpy(), err_msg=name)


def test_pages_v2_an_old_parquet_cpp_marked_uncompressed_are_read_as_pyarrow_reads_them(mounter, tmp_path):
    """ARROW-17100.parquet (tests/fixtures/wild/NOTES.md): parquet-cpp 1.5.1 wrote compressed
    data pages v2 whose headers say they are not."""
    src = tfs.REPO / "tests" / "fixtures" / "wild" / "ARROW-17100.parquet"
    data = tmp_path / "data"
    data.mkdir()
    (data / src.name).write_bytes(src.read_bytes())
    want = pq.read_table(src)
    m = mounter(data, "shuffle=none", "columns=col1:col3")
    for name in ("col1", "col3"):
        got = np.load(m.p("epoch-0", "all", f"{name}.npy"))
        np.testing.assert_array_equal(got, want.column(name).to_numpy(), err_msg=name)
