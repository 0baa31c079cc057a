"""One-open files of the next epoch built whole ahead of their reader (src/read/produce/ahead.rs): a reader
of a directory's all.safetensors or all/NAME.npy past its middle has the next epoch's built on
the local cache, and the next epoch's open is served from it (by passthrough where the kernel
takes it). The bytes are the same as those the daemon serves: the batch files back to back."""

import glob
import mmap
import os

import numpy as np
import pytest

import tfs

BS, N = 256, 11  # shuf_ds: 2600 rows -> 10 full batches and one of 40


def kept_files(m: tfs.Mount) -> list[str]:
    """The one-open files built ahead that the mount's cache keeps (meta sidecars left out)."""
    return sorted(p for p in glob.glob(str(m.cache / "v1" / "batches-*" / "all" / "*")))


def kept_names(m: tfs.Mount) -> list[str]:
    """The names of the files of kept_files."""
    return [os.path.basename(p) for p in kept_files(m)]


@pytest.mark.parametrize("mode", ["window", "global"])
def test_the_next_epochs_all_files_are_built_ahead_and_served_from_them(mounter, shuf_ds, mode):
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "world_size=3", "epochs=3")
    # A reader of epoch 0's files has epoch 1's built.
    tfs.read_exact(m.p("epoch-0", "all.safetensors"))
    tfs.read_exact(m.p("epoch-0", "all", "x.npy"))
    tfs.read_exact(m.p("epoch-0", "rank-2-of-3", "all.safetensors"))
    s = tfs.wait_ahead_built(m, 3)
    assert s["ahead_files_built"] == 3 and s["ahead_skipped"] == 0, s
    # Built ahead, the file has a backing path: under gds/ and as user.tensorfs.path.
    path = os.readlink(m.p("gds", "epoch-1", "all.safetensors"))
    assert os.path.isabs(path), path
    assert os.getxattr(m.p("epoch-1", "all.safetensors"), "user.tensorfs.path").decode() == path
    assert "user.tensorfs.path" in os.listxattr(m.p("epoch-1", "all.safetensors"))
    with open(path, "rb") as f:
        assert f.read() == tfs.read_exact(m.p("epoch-1", "all.safetensors"))
    for rel_dir, n in (("epoch-1", N), ("epoch-1/rank-2-of-3", N // 3)):
        raw = tfs.read_exact(m.p(rel_dir, "all.safetensors"))
        assert raw[tfs.DATA_OFFSET :] == tfs.concatenated(m, rel_dir, n), rel_dir
    x = np.load(m.p("epoch-1", "all", "x.npy"), mmap_mode="r")
    assert np.asarray(x).tobytes() == tfs.concatenated(m, "epoch-1", N, ("x",))
    del x
    s = tfs.stats(m)
    assert s["ahead_opens"] >= 3, s
    if s["passthrough_opens"] == 0:
        pytest.skip(f"the kernel did not take FUSE passthrough ({s})")
    assert s["passthrough_opens"] >= 3, s
    # Opening epoch 1's files built ahead has epoch 2's built; nothing past the listed epochs.
    s = tfs.wait_ahead_built(m, 6)
    assert s["ahead_files_built"] == 6, s
    raw = tfs.read_exact(m.p("epoch-2", "all.safetensors"))
    assert raw[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-2", N)
    s = tfs.idle(m)
    assert s["ahead_files_built"] == 6, s
    # Every epoch a permutation, read through the files built ahead.
    ids = np.load(m.p("epoch-2", "rank-2-of-3", "all", "id.npy"))
    assert len(set(ids.tolist())) == len(ids)


def test_the_npy_files_a_reader_reads_are_built_together(mounter, shuf_ds):
    """A reader of several all/NAME.npy files has the next epoch's built in one pass over its
    batches: each batch is gathered once for all of them (batches_built grows by one epoch's
    batches, not one per file), and each file holds its tensor's rows."""
    m = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}", "epochs=3")
    for name in ("id", "x"):
        tfs.read_exact(m.p("epoch-0", "all", f"{name}.npy"))
    s = tfs.wait_ahead_built(m, 2)
    assert s["ahead_files_built"] == 2 and s["ahead_skipped"] == 0, s
    # Opening epoch 1's files built ahead has epoch 2's built, both at once (counted from the
    # moment the work for epoch 0's reader has ended).
    before = tfs.idle(m)["batches_built"]
    got = {name: np.load(m.p("epoch-1", "all", f"{name}.npy")) for name in ("id", "x")}
    s = tfs.wait_ahead_built(m, 4)
    assert s["ahead_files_built"] == 4, s
    assert N <= s["batches_built"] - before < 2 * N, (before, s["batches_built"])
    for e, arrays in ((1, got), (2, {name: np.load(m.p("epoch-2", "all", f"{name}.npy")) for name in ("id", "x")})):
        for name, a in arrays.items():
            assert a.tobytes() == tfs.concatenated(m, f"epoch-{e}", N, (name,)), (e, name)


def test_a_file_changed_after_it_was_built_is_not_served(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=2")
    tfs.read_exact(m.p("epoch-0", "all.safetensors"))
    assert tfs.wait_ahead_built(m, 1)["ahead_files_built"] == 1
    built = kept_files(m)
    assert len(built) == 1, built
    with open(built[0], "r+b") as f:
        f.seek(tfs.DATA_OFFSET)
        f.write(b"\xff" * 64)
    raw = tfs.read_exact(m.p("epoch-1", "all.safetensors"))
    assert raw[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-1", N)
    assert tfs.stats(m)["ahead_opens"] == 0


def test_nothing_is_built_ahead_without_prefetch_or_room(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=2", "prefetch=0")
    tfs.read_exact(m.p("epoch-0", "all.safetensors"))
    s = tfs.idle(m)
    assert s["ahead_files_built"] == 0, s
    # A cache smaller than the file: not built, and the next epoch is served by the daemon.
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=2", "cache_size=16K")
    tfs.read_exact(m.p("epoch-0", "all.safetensors"))
    s = tfs.idle(m)
    assert s["ahead_skipped"] == 1 and s["ahead_files_built"] == 0, s
    assert s["cache_bytes"] <= s["cache_capacity"], s
    raw = tfs.read_exact(m.p("epoch-1", "all.safetensors"))
    assert raw[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-1", N)


def test_a_file_gone_by_is_written_over_only_where_nobody_can_read_it(mounter, shuf_ds):
    """A built file of an epoch behind the reader is written over by the next build, unless a
    reader still has it open or its path was handed out: those read on, unchanged."""
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=8")

    def read_epoch(e: int) -> bytes:
        raw = tfs.read_exact(m.p(f"epoch-{e}", "all.safetensors"))
        assert tfs.wait_ahead_built(m, e + 1)["ahead_files_built"] == e + 1
        return raw

    read_epoch(0)
    read_epoch(1)
    # Reading epoch 2 lets epoch 1's file go, which epoch 3's build writes over.
    read_epoch(2)
    assert tfs.stats(m)["ahead_written_over"] == 1
    expect3 = tfs.concatenated(m, "epoch-3", N)
    assert read_epoch(3)[tfs.DATA_OFFSET :] == expect3
    assert tfs.stats(m)["ahead_written_over"] == 2
    # Epoch 3's file held by a memory map alone (its descriptor closed) while epoch 4 is read:
    # not written over.
    with open(m.p("epoch-3", "all.safetensors"), "rb") as f:
        held = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert read_epoch(4)[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-4", N)
    assert tfs.stats(m)["ahead_written_over"] == 2
    assert held[tfs.DATA_OFFSET :] == expect3
    held.close()
    # Epoch 5's path handed out (gds/; that has epoch 6 built, over epoch 4's file, nobody's),
    # then epoch 6 read: epoch 7 is built in a new file, epoch 5's is not written over.
    path5 = os.readlink(m.p("gds", "epoch-5", "all.safetensors"))
    with open(path5, "rb") as by_path:
        read_epoch(5)
        assert tfs.stats(m)["ahead_written_over"] == 3
        read_epoch(6)
        assert tfs.stats(m)["ahead_written_over"] == 3
        assert by_path.read()[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-5", N)
    assert tfs.read_exact(m.p("epoch-7", "all.safetensors"))[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-7", N)


def test_files_built_ahead_are_kept_for_a_later_mount_of_the_cache(mounter, shuf_ds):
    """A job restarted on the same cache reads the epochs its last mount built ahead from the
    files that mount kept, each checked against its checksum first; a kept file that changed
    meanwhile is dropped, and its epoch served by the daemon, right."""
    opts = (f"batch_size={BS}", "epochs=3", "world_size=2")
    rank_x = ("rank-1-of-2", "all", "x.npy")
    a = mounter(shuf_ds.path, *opts)
    tfs.read_exact(a.p("epoch-0", "all.safetensors"))
    tfs.read_exact(a.p("epoch-0", *rank_x))
    assert tfs.wait_ahead_built(a, 2)["ahead_files_built"] == 2
    # Reading epoch 1's files has epoch 2's built.
    first = tfs.read_exact(a.p("epoch-1", "all.safetensors"))
    first_x = tfs.read_exact(a.p("epoch-1", *rank_x))
    assert tfs.wait_ahead_built(a, 4)["ahead_files_built"] == 4
    a.unmount()
    kept = kept_names(a)
    assert kept == [
        "epoch-1.rank-1-of-2.t1.npy",
        "epoch-1.safetensors",
        "epoch-2.rank-1-of-2.t1.npy",
        "epoch-2.safetensors",
    ], kept

    b = mounter(shuf_ds.path, *opts, cache=a.cache)
    assert tfs.read_exact(b.p("epoch-1", "all.safetensors")) == first
    assert tfs.read_exact(b.p("epoch-1", *rank_x)) == first_x
    s = tfs.stats(b)
    assert s["ahead_opens"] == 2 and s["ahead_files_built"] == 0, s
    # Opening them had epoch 2's checked, not built again.
    s = tfs.idle(b)
    assert s["ahead_kept_checked"] == 4 and s["ahead_files_built"] == 0, s
    assert s["cache_bytes"] <= s["cache_capacity"], s
    if s["passthrough_opens"] == 0:
        pytest.skip(f"the kernel did not take FUSE passthrough ({s})")
    assert first[tfs.DATA_OFFSET :] == tfs.concatenated(b, "epoch-1", N)
    x = np.load(b.p("epoch-1", *rank_x))
    assert x.tobytes() == tfs.concatenated(b, "epoch-1/rank-1-of-2", N // 2, ("x",))
    b.unmount()

    # Epoch 2's all.safetensors changed while nothing was mounted: dropped on its first open.
    (changed,) = [p for p in kept_files(b) if p.endswith("epoch-2.safetensors")]
    with open(changed, "r+b") as f:
        f.seek(tfs.DATA_OFFSET + 100)
        f.write(b"\x00\x01" * 32)
    c = mounter(shuf_ds.path, *opts, cache=a.cache)
    raw = tfs.read_exact(c.p("epoch-2", "all.safetensors"))
    assert raw[tfs.DATA_OFFSET :] == tfs.concatenated(c, "epoch-2", N)
    s = tfs.stats(c)
    assert s["cache_corrupt_dropped"] == 1 and s["ahead_opens"] == 0, s
    assert not os.path.exists(changed)
    # The rank's file beside it was not changed: its path is given (checked first, by the
    # readlink), and opens are served from it.
    assert "user.tensorfs.path" in os.listxattr(c.p("epoch-2", *rank_x))
    path = os.readlink(c.p("gds", "epoch-2", *rank_x))
    assert os.path.isabs(path) and path.endswith("epoch-2.rank-1-of-2.t1.npy"), path
    assert os.getxattr(c.p("epoch-2", *rank_x), "user.tensorfs.path").decode() == path
    with open(path, "rb") as f:
        assert f.read() == tfs.read_exact(c.p("epoch-2", *rank_x))
    s = tfs.stats(c)
    assert s["ahead_opens"] == 1 and s["ahead_kept_checked"] == 1, s
    # The one dropped has no path to give: its gds/ link leads back to the mount.
    assert not os.path.isabs(os.readlink(c.p("gds", "epoch-2", "all.safetensors")))


def test_a_file_built_on_several_threads_holds_every_batch_and_its_checksum(mounter, shuf_ds):
    """With small batches a build spans many runs of batches, gathered and written by several
    threads at once: the file still holds every batch in order, and the crc32c it is kept with
    (combined from the runs') is the one a later mount checks it against."""
    bs, n = 24, -(-2600 // 24)  # 109 batches: seven runs of 16
    opts = (f"batch_size={bs}", "shuffle=global", "epochs=2", "threads=2")
    a = mounter(shuf_ds.path, *opts)
    tfs.read_exact(a.p("epoch-0", "all.safetensors"))
    tfs.read_exact(a.p("epoch-0", "all", "x.npy"))
    assert tfs.wait_ahead_built(a, 2)["ahead_files_built"] == 2
    built = tfs.read_exact(a.p("epoch-1", "all.safetensors"))
    assert built[tfs.DATA_OFFSET :] == tfs.concatenated(a, "epoch-1", n)
    x = tfs.read_exact(a.p("epoch-1", "all", "x.npy"))
    assert x[tfs.DATA_OFFSET :] == tfs.concatenated(a, "epoch-1", n, ("x",))
    assert tfs.stats(a)["ahead_opens"] == 2
    a.unmount()
    b = mounter(shuf_ds.path, *opts, cache=a.cache)
    assert tfs.read_exact(b.p("epoch-1", "all.safetensors")) == built
    assert tfs.read_exact(b.p("epoch-1", "all", "x.npy")) == x
    s = tfs.stats(b)
    assert s["ahead_kept_checked"] == 2 and s["cache_corrupt_dropped"] == 0 and s["ahead_opens"] == 2, s


def test_with_shuffle_none_the_file_read_is_built_and_kept(mounter, shuf_ds):
    """With shuffle=none every epoch shares its files: where a next epoch is listed, a reader's
    one-open file is built whole, for its re-reads and later mounts of the cache."""
    opts = (f"batch_size={BS}", "shuffle=none", "epochs=2")
    a = mounter(shuf_ds.path, *opts)
    raw = tfs.read_exact(a.p("epoch-0", "all", "x.npy"))
    assert tfs.wait_ahead_built(a, 1)["ahead_files_built"] == 1
    assert tfs.read_exact(a.p("epoch-0", "all", "x.npy")) == raw
    assert tfs.stats(a)["ahead_opens"] == 1
    a.unmount()
    assert kept_names(a) == ["epoch-0.t1.npy"]
    b = mounter(shuf_ds.path, *opts, cache=a.cache)
    assert tfs.read_exact(b.p("epoch-0", "all", "x.npy")) == raw
    s = tfs.stats(b)
    assert s["ahead_kept_checked"] == 1 and s["ahead_opens"] == 1 and s["ahead_files_built"] == 0, s
    assert np.load(b.p("epoch-0", "all", "x.npy")).tobytes() == tfs.concatenated(b, "epoch-0", N, ("x",))


def test_warm_builds_one_open_files_that_a_reader_opens_by_passthrough(mounter, shuf_ds):
    # prefetch=0: only what warm asks for is built (a read builds nothing ahead).
    m = mounter(shuf_ds.path, f"batch_size={BS}", "world_size=2", "epochs=3", "prefetch=0")
    proc = tfs.run(["warm", m.path, "--epochs", "0..2", "--format", "all"])
    assert proc.returncode == 0, proc.stderr
    assert "(2 files," in proc.stderr, proc.stderr
    proc = tfs.run(["warm", m.path, "--epochs", "1", "--rank", "1-of-2", "--format", "all-npy"])
    assert proc.returncode == 0, proc.stderr
    s = tfs.stats(m)
    assert s["ahead_files_built"] == 4 and s["batch_files_written"] == 0, s
    kept = kept_names(m)
    assert kept == [
        "epoch-0.safetensors",
        "epoch-1.rank-1-of-2.t0.npy",
        "epoch-1.rank-1-of-2.t1.npy",
        "epoch-1.safetensors",
    ], kept
    # Asked again, a built file is ready at once: nothing is built twice.
    assert os.getxattr(m.p("epoch-1", "all.safetensors"), "user.tensorfs.warm") == b"ready"
    assert "user.tensorfs.warm" not in os.listxattr(m.p("epoch-1", "all.safetensors"))
    decoded = tfs.stats(m)["row_groups_decoded"]
    got = {
        rel: tfs.read_exact(m.p(*rel.split("/")))
        for rel in ("epoch-0/all.safetensors", "epoch-1/all.safetensors", "epoch-1/rank-1-of-2/all/x.npy")
    }
    s = tfs.stats(m)
    assert s["ahead_opens"] == 3 and s["row_groups_decoded"] == decoded, s
    if s["passthrough_opens"] < 3:
        pytest.skip(f"the kernel did not take FUSE passthrough ({s})")
    for rel_dir, n in (("epoch-0", N), ("epoch-1", N)):
        assert got[f"{rel_dir}/all.safetensors"][tfs.DATA_OFFSET :] == tfs.concatenated(m, rel_dir, n)
    x = got["epoch-1/rank-1-of-2/all/x.npy"]
    assert x[tfs.DATA_OFFSET :] == tfs.concatenated(m, "epoch-1/rank-1-of-2", N // 2, ("x",))
    # A cache without room for the file: warm says so in one line, and fails.
    m = mounter(shuf_ds.path, f"batch_size={BS}", "cache_size=16K")
    bad = tfs.run(["warm", m.path, "--format", "all"])
    assert bad.returncode != 0 and "no room in the cache" in tfs.error_line(bad), bad.stderr
