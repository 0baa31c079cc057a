"""One open per epoch (PRODUCT.md §2): all.safetensors and all/NAME.npy in every batch directory
hold the directory's batches back to back, exact sizes before anything is built, readable by
np.load(mmap_mode="r") and safetensors' lazy slices, and a read builds only what it spans."""

import mmap
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors import safe_open

import tfs
from tfs import batch_name

BS, N = 256, 11  # shuf_ds: 2600 rows -> 10 full batches and one of 40


def batches(m: tfs.Mount, rel_dir: str, n: int) -> list[dict]:
    return [tfs.load_safetensors(m.p(rel_dir, batch_name(i) + ".safetensors")) for i in range(n)]


@pytest.mark.parametrize("mode", ["window", "none"])
def test_all_files_are_the_batches_back_to_back(mounter, shuf_ds, mode):
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "world_size=3", "epochs=2")
    for rel_dir, n in (("epoch-1", N), ("epoch-1/rank-2-of-3", N // 3)):
        # Sizes first, on a cold mount: stat builds nothing.
        size_st = os.stat(m.p(rel_dir, "all.safetensors")).st_size
        size_npy = {t: os.stat(m.p(rel_dir, "all", f"{t}.npy")).st_size for t in ("id", "x")}
        got = batches(m, rel_dir, n)
        want = {t: np.concatenate([b[t] for b in got]) for t in ("id", "x")}
        raw = tfs.read_exact(m.p(rel_dir, "all.safetensors"))
        assert len(raw) == size_st
        header_len = int.from_bytes(raw[:8], "little")
        assert 8 + header_len == tfs.DATA_OFFSET
        # The data buffer is exactly the batch files' data, tensor by tensor.
        assert raw[tfs.DATA_OFFSET:] == b"".join(want[t].tobytes() for t in ("id", "x"))
        with safe_open(str(m.p(rel_dir, "all.safetensors")), "np") as f:
            assert sorted(f.keys()) == ["id", "x"]
            for i in (0, n - 1):
                end = i * BS + len(got[i]["id"])
                tfs.assert_array(f.get_slice("id")[i * BS : end], got[i]["id"], f"{rel_dir} slice {i}")
        for t in ("id", "x"):
            path = m.p(rel_dir, "all", f"{t}.npy")
            assert len(tfs.read_exact(path)) == size_npy[t]
            arr = np.load(path, mmap_mode="r")
            tfs.assert_array(np.asarray(arr), want[t], f"{rel_dir} all/{t}.npy")
            tfs.assert_array(np.asarray(arr[BS : 2 * BS]), got[1][t], f"{rel_dir} all/{t}.npy batch 1")
        assert sorted(os.listdir(m.p(rel_dir, "all"))) == ["id.npy", "x.npy"]
    # Every epoch is a permutation of the rows, read in one open.
    ids = np.load(m.p("epoch-0", "all", "id.npy"))
    assert np.array_equal(np.sort(ids), np.arange(2600))


FAR = 100  # a batch well past what the kernel reads ahead of np.load's header read


def read_far_batch(path: str, how: str, built) -> tuple[np.ndarray, int]:
    """Batch FAR's rows of the int64 tensor `path`, read as `how`, and the batches the read
    built (`built()` counts them)."""
    off = tfs.DATA_OFFSET + FAR * BS * 8
    if how == "mmap":
        # np.load reads the header first; the kernel reads a few pages ahead of it.
        arr = np.load(path, mmap_mode="r")
        # The kernel reads around a page fault (the mount's whole readahead window) unless the
        # mapping says its reads are random; docs/reading.md says so.
        arr._mmap.madvise(mmap.MADV_RANDOM)
        before = built()
        return np.array(arr[FAR * BS : (FAR + 1) * BS]), built() - before
    before = built()
    return read_at(path, how, off), built() - before


def read_at(path: str, how: str, off: int) -> np.ndarray:
    if how == "direct":
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 4096)
        try:
            assert os.preadv(fd, [buf], off) == 4096
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype=np.int64)[:BS]
    fd = os.open(path, os.O_RDONLY)
    try:
        return np.frombuffer(os.pread(fd, BS * 8, off), dtype=np.int64)
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", ["direct", "pread", "mmap"])
def test_a_read_builds_only_the_batches_it_spans(mounter, tmp_path, how):
    data = tmp_path / "ids"
    data.mkdir()
    pq.write_table(pa.table({"id": np.arange(1 << 16, dtype=np.int64)}), data / "p.parquet", row_group_size=8192)
    m = mounter(data, "shuffle=window", f"batch_size={BS}", "prefetch=0")
    got, built = read_far_batch(m.p("epoch-0", "all", "id.npy"), how, lambda: tfs.stats(m)["batches_built"])
    # A 4 KiB page holds two batches of this tensor.
    assert 1 <= built <= 2, f"a read of batch {FAR} ({how}) built {built} batches"
    want = tfs.load_safetensors(m.p("epoch-0", batch_name(FAR) + ".safetensors"))["id"]
    assert got.tolist() == want.tolist()


def test_gds_links_the_all_files_to_the_main_tree(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "world_size=2")
    assert set(os.listdir(m.p("gds", "epoch-0"))) == set(os.listdir(m.p("epoch-0")))
    for rel in ("epoch-0/all.safetensors", "epoch-0/all/x.npy", "epoch-0/rank-1-of-2/all/id.npy"):
        link = m.p("gds", rel)
        assert os.path.islink(link)
        assert os.path.realpath(link) == os.path.realpath(m.p(rel))
        assert tfs.sha256(link) == tfs.sha256(m.p(rel))


def test_a_cold_reader_of_all_files_finds_the_rows_ahead_of_it_in_the_page_cache(mounter, tmp_path):
    """A reader of all/NAME.npy slices in order, in a cold epoch (the file served by the daemon):
    the rows the prefetcher gathers ahead of it are stored in the file's page cache, so most of
    its reads are no round trip; the few it makes (the tripwire pages that tell the prefetcher
    where it is) and the page cache give the same bytes as the batch files."""
    rows, bs = 64 * 1024, 1024
    ids = np.arange(rows, dtype=np.int64)
    v = np.repeat(ids.astype(np.float32)[:, None], 64, axis=1)
    table = pa.table({"id": ids, "v": tfs.fsl(v.ravel(), 64)})
    tfs.write_dataset(tmp_path / "data", [("part-0.parquet", table)], 8192)
    m = mounter(tmp_path / "data", f"batch_size={bs}", "shuffle=window", "prefetch=8")
    n = rows // bs
    fds = {t: os.open(m.p("epoch-0", "all", f"{t}.npy"), os.O_RDONLY) for t in ("id", "v")}
    got = {"id": [], "v": []}
    try:
        for i in range(n):
            for t, row in (("id", 8), ("v", 256)):
                want = bs * row
                got[t].append(os.pread(fds[t], want, tfs.DATA_OFFSET + i * want))
                assert len(got[t][-1]) == want
            time.sleep(0.003)  # the reader's work on the batch: the prefetcher runs ahead meanwhile
    finally:
        for fd in fds.values():
            os.close(fd)
    st = tfs.stats(m)
    reads = 2 * n
    assert st["rows_stored"] >= reads // 2, st
    assert st["one_open_reads"] < reads // 2, st
    for i in (0, 17, n - 1):
        b = tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))
        assert got["id"][i] == b["id"].tobytes(), f"batch {i} id"
        assert got["v"][i] == b["v"].tobytes(), f"batch {i} v"
    assert np.array_equal(np.sort(np.frombuffer(b"".join(got["id"]), np.int64)), ids)


def test_rows_stored_ahead_of_a_reader_of_all_files_are_held_apart_and_few(mounter, tmp_path):
    """The rows gathered only to be stored in the page cache of the all/ files a cold reader
    reads (memory-mapped, as tensorfs.numpy does) are held apart from the tensors gathered for
    reads, a few times what a reader stores ahead: with memory_limit=256M, 8 MiB. Held
    with the rest, every tensor stored stayed in memory until that memo's share (16 MiB here)
    was full, each in memory fresh from the kernel, a second copy of what the page cache
    holds."""
    rows, bs = 64 * 1024, 1024  # 264-byte rows: 17.3 MB an epoch
    ids = np.arange(rows, dtype=np.int64)
    v = np.repeat(ids.astype(np.float32)[:, None], 64, axis=1)
    table = pa.table({"id": ids, "v": tfs.fsl(v.ravel(), 64)})
    tfs.write_dataset(tmp_path / "data", [("part-0.parquet", table)], 8192)
    m = mounter(tmp_path / "data", f"batch_size={bs}", "memory_limit=256M", "prefetch=8")
    maps = {t: np.load(m.p("epoch-0", "all", f"{t}.npy"), mmap_mode="r") for t in ("id", "v")}
    got = {t: [np.array(a[i : i + bs]) for i in range(0, rows, bs)] for t, a in maps.items()}
    del maps
    st = tfs.idle(m)
    assert st["rows_stored"] >= rows // bs, st
    # The stored rows' 8 MiB, and the few gathered for the reader's own reads (its first
    # batches, before the prefetcher saw it; the tripwire pages): 17 MB before.
    shown = {k: st[k] for k in ("memory_bytes", "rows_stored", "one_open_reads", "tensors_gathered")}
    assert st["memory_bytes"] <= 12 << 20, shown
    for i in (0, 17, rows // bs - 1):
        b = tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))
        assert np.array_equal(got["id"][i], b["id"]), f"batch {i} id"
        assert np.array_equal(got["v"][i], b["v"]), f"batch {i} v"
    assert np.array_equal(np.sort(np.concatenate(got["id"])), ids)


def test_every_all_file_a_cold_reader_reads_in_step_is_built_ahead_for_the_next_epoch(mounter, tmp_path):
    """A reader of several all/NAME.npy files, batch by batch, in a cold epoch: past the middle
    its reads of every tensor but one come from the page cache (the rows stored ahead), yet the
    next epoch's file of each tensor it reads is built ahead, and its next epoch opens them."""
    rows, bs = 32 * 1024, 1024
    ids = np.arange(rows, dtype=np.int64)
    v = np.repeat(ids.astype(np.float32)[:, None], 64, axis=1)
    table = pa.table({"id": ids, "x": ids.astype(np.float32), "v": tfs.fsl(v.ravel(), 64)})
    tfs.write_dataset(tmp_path / "data", [("part-0.parquet", table)], 8192)
    m = mounter(tmp_path / "data", f"batch_size={bs}", "shuffle=window", "prefetch=8", "epochs=2")
    n, tensors = rows // bs, (("id", 8), ("v", 256), ("x", 4))
    fds = {t: os.open(m.p("epoch-0", "all", f"{t}.npy"), os.O_RDONLY) for t, _ in tensors}
    try:
        for i in range(n):
            for t, row in tensors:
                assert len(os.pread(fds[t], bs * row, tfs.DATA_OFFSET + i * bs * row)) == bs * row
            time.sleep(0.003)
    finally:
        for fd in fds.values():
            os.close(fd)
    st = tfs.wait_ahead_built(m, len(tensors))
    assert st["ahead_files_built"] == len(tensors) and st["ahead_skipped"] == 0, st
    for t, _ in tensors:
        got = np.load(m.p("epoch-1", "all", f"{t}.npy"))
        assert got.tobytes() == tfs.concatenated(m, "epoch-1", n, (t,)), t
    assert tfs.stats(m)["ahead_opens"] >= len(tensors)


@pytest.mark.parametrize("shuffle", ["none", "window"])
def test_what_a_reader_of_the_all_files_decoded_is_kept_for_later_epochs_and_mounts(mounter, shuf_ds, shuffle):
    """No batch file is written for a reader of the one-open files: the decoded columns are what
    the cache keeps of them, with shuffle=none too (where a reader of batch files keeps those
    instead). A later epoch (nothing built ahead) and a later mount decode nothing and fetch no
    row group again."""
    opts = (f"shuffle={shuffle}", "batch_size=256", "epochs=2", "prefetch=0")
    m = mounter(shuf_ds.path, *opts)
    first = tfs.read_exact(m.p("epoch-0", "all.safetensors"))
    s = tfs.stats(m)
    assert s["row_groups_decoded"] == 13, s
    assert len(list(m.cache.glob("v1/cols-*/*.cols"))) == 13
    tfs.read_exact(m.p("epoch-1", "all", "x.npy"))
    assert tfs.stats(m)["row_groups_decoded"] == 13, tfs.stats(m)
    m.unmount()
    again = mounter(shuf_ds.path, *opts, cache=m.cache)
    assert tfs.read_exact(again.p("epoch-0", "all.safetensors")) == first
    s = tfs.stats(again)
    assert s["row_groups_decoded"] == 0 and s["remote_bytes"] == 0, s


@pytest.mark.parametrize("read", ["all/emb.npy", "batch files, nothing cached"])
def test_batches_larger_than_an_eighth_of_the_memory_are_built_once_per_read_through(mounter, tmp_path, read):
    """Read through the daemon in pieces (1 MiB reads of all/NAME.npy for an epoch not built
    ahead, or batch files when the cache cannot keep them), each piece is served from the batch
    or tensor held in memory. A batch too large for its share of memory_limit (here 16 MiB a
    tensor against 16 MiB; 1,024 images of 150 KB against 128 MB under the default) was built
    again for every piece: 23 gathers a batch. Now the memory holds the one read and those built
    ahead, up to three eighths of the buffers' half."""
    src = tmp_path / "src"
    src.mkdir()
    rows, dim, bs = 8192, 4096, 1024
    ids = np.arange(rows, dtype=np.int64)
    emb = tfs.fsl(np.repeat(ids.astype(np.float32), dim), dim)
    pq.write_table(pa.table({"id": ids, "emb": emb}), src / "big.parquet", row_group_size=2048)
    opts = ["batch_size=1024", "memory_limit=256M", "prefetch=1", "shuffle=window"]
    if read != "all/emb.npy":
        opts.append("cache_size=1M")
    m = mounter(src, *opts)
    n = rows // bs
    before = tfs.stats(m)
    if read == "all/emb.npy":
        got = []
        with open(m.p("epoch-0", "all", "emb.npy"), "rb", buffering=0) as f:
            while piece := f.read(1 << 20):
                got.append(piece)
        counter, after = "tensors_gathered", tfs.stats(m)
        raw = b"".join(got)
        first = np.frombuffer(raw[tfs.DATA_OFFSET:], dtype=np.float32).reshape(rows, dim)[:, 0]
        want = np.load(m.p("epoch-0", "all", "id.npy")).astype(np.float32)
        assert np.array_equal(first, want)
    else:
        for i in range(n):
            b = tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))
            assert np.array_equal(b["emb"][:, 0], b["id"].astype(np.float32)), i
        counter, after = "batches_built", tfs.stats(m)
    built = after[counter] - before[counter]
    # One each, and as many again for the next epoch's file, which may be built meanwhile.
    assert built <= 4 * n, f"{built} {counter} for {n} batches"
