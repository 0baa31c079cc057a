"""The batch files of a reader's next epoch built in idle time (src/read/follow/prefetch.rs, NextEpoch): a
reader of a shuffled epoch's batch files has the same directory's next epoch stored in the
kernel's page cache while it reads, so that it reads the next epoch as a warm one, however fast
it comes. A shuffled epoch's batch files are read once: none is written to the local cache
(src/read/follow/page_cache.rs), unless `tensorfs warm` asks for it. The bytes are those any mount
builds; nothing is built past the listed epochs, with shuffle=none (whose epochs share their
files) or with prefetch=0."""

import glob
import os
import time

import pytest

import tfs
from tfs import batch_name

BS, N = 256, 11  # shuf_ds: 2600 rows -> 10 full batches and one of 40


def read_batches(m: tfs.Mount, rel_dir: str, n: int, name: str = "{}.safetensors") -> dict[str, str]:
    """Reads the directory's batch files in order; their digests by path."""
    return {f"{rel_dir}/{name.format(batch_name(i))}": tfs.sha256(m.p(rel_dir, name.format(batch_name(i)))) for i in range(n)}


def cached(m: tfs.Mount, epoch: int, pattern: str = "*.safetensors") -> list[str]:
    return glob.glob(str(m.cache / "v1" / "batches-*" / f"epoch-{epoch}" / "**" / pattern), recursive=True)


def wait_built(m: tfs.Mount, n: int) -> dict:
    """The counters once N files have been built ahead (or after a minute)."""
    deadline = time.monotonic() + 60
    while tfs.stats(m)["next_epoch_files_built"] < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return tfs.stats(m)


def read_warm(m: tfs.Mount, rel_dir: str, n: int, name: str = "{}.safetensors") -> dict[str, str]:
    """READ_BATCHES, asserting that every read came from the page cache (none reached the daemon)."""
    before = tfs.stats(m)
    got = read_batches(m, rel_dir, n, name)
    after = tfs.stats(m)
    assert after["daemon_reads"] == before["daemon_reads"], (before, after)
    return got


# prefetch=2: the prefetcher builds the next epoch's first two batches as the reader comes to
# the end of an epoch; the walk the rest (and more, if it comes first).
DEPTH = 2


@pytest.mark.parametrize("mode", ["window", "global"])
def test_the_next_epochs_batch_files_are_built_ahead_and_read_warm(mounter, shuf_ds, mode):
    opts = (f"shuffle={mode}", f"batch_size={BS}", "epochs=3", f"prefetch={DEPTH}")
    m = mounter(shuf_ds.path, *opts)
    ref = mounter(shuf_ds.path, *opts, "prefetch=0")
    got = read_batches(m, "epoch-0", N)
    # Epoch 1's files, built while epoch 0 was read (from its middle on) and after.
    s = wait_built(m, N - DEPTH)
    assert s["next_epoch_files_built"] >= N - DEPTH, s
    # Read now, every one of them comes from the page cache.
    got.update(read_warm(m, "epoch-1", N))
    # Reading epoch 1 has epoch 2's built; nothing past the listed epochs.
    s = wait_built(m, 2 * (N - DEPTH))
    assert s["next_epoch_files_built"] >= 2 * (N - DEPTH), s
    got.update(read_warm(m, "epoch-2", N))
    s = tfs.idle(m)
    assert s["next_epoch_files_built"] <= 2 * N, s
    # Read once, none was written to the local cache.
    assert s["batch_files_written"] == 0 and not any(cached(m, e) for e in range(4)), s
    # The same bytes as a mount that builds each file only when it is opened.
    want = {rel: tfs.sha256(ref.p(rel)) for rel in got}
    assert got == want
    assert tfs.stats(ref)["next_epoch_files_built"] == 0


def test_a_rank_view_has_its_own_batches_of_the_next_epoch_built(mounter, shuf_ds):
    """Rank 1 of 3 reads global batches 1, 4, 7, … of each epoch: those of epoch 1 are built
    ahead, and no other."""
    opts = ("shuffle=window", "batch_size=128", "world_size=3", "epochs=2", f"prefetch={DEPTH}")
    m = mounter(shuf_ds.path, *opts)
    ref = mounter(shuf_ds.path, *opts, "prefetch=0")
    rank, n = "rank-1-of-3", m.dataset()["batches_per_epoch"] // 3
    assert n == 7
    read_batches(m, f"epoch-0/{rank}", n)
    wait_built(m, n - DEPTH)
    s = tfs.idle(m)
    assert n - DEPTH <= s["next_epoch_files_built"] <= n, s
    got = read_warm(m, f"epoch-1/{rank}", n)
    assert got == {rel: tfs.sha256(ref.p(rel)) for rel in got}


def test_only_the_files_a_reader_opens_are_built_ahead(mounter, shuf_ds):
    """A reader of one tensor's .npy files has that tensor's files of the next epoch built."""
    opts = ("shuffle=window", f"batch_size={BS}", "epochs=2", f"prefetch={DEPTH}")
    m = mounter(shuf_ds.path, *opts)
    ref = mounter(shuf_ds.path, *opts, "prefetch=0")
    read_batches(m, "epoch-0", N, "{}/x.npy")
    wait_built(m, N - DEPTH)
    s = tfs.idle(m)
    assert N - DEPTH <= s["next_epoch_files_built"] <= N, s
    got = read_warm(m, "epoch-1", N, "{}/x.npy")
    assert got == {rel: tfs.sha256(ref.p(rel)) for rel in got}


@pytest.mark.parametrize("option", ["shuffle=none", "prefetch=0"])
def test_nothing_is_built_ahead_where_epochs_share_their_files_or_prefetch_is_off(mounter, shuf_ds, option):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=3", option)
    read_batches(m, "epoch-0", N)
    s = tfs.idle(m)
    assert s["next_epoch_files_built"] == 0, s
    assert not cached(m, 1), cached(m, 1)


def test_shuffled_epochs_write_no_batch_file_unless_warm_asks(mounter, shuf_ds):
    """Every file kind of three shuffled epochs read from a small cache: no batch file is written
    to the local cache (each is read once), every row group is decoded once (the columns are
    what the cache keeps), and the cache stays within cache_size. `tensorfs warm` is a reader
    that asks to keep: its files are written, and read from there."""
    opts = ("shuffle=window", f"batch_size={BS}", "memory_limit=1M", f"prefetch={DEPTH}")
    probe = mounter(shuf_ds.path, *opts, "epochs=1")
    read_batches(probe, "epoch-0", N)
    probe.unmount()
    cols = sum(os.path.getsize(p) for p in glob.glob(str(probe.cache / "v1" / "cols-*" / "*")))
    limit = cols + (64 << 10)
    m = mounter(shuf_ds.path, *opts, "epochs=3", f"cache_size={limit}")
    ref = mounter(shuf_ds.path, *opts, "epochs=3", "prefetch=0")
    for e in range(3):
        for name in ("{}.safetensors", "{}/x.npy", "{}/id.npy"):
            got = read_batches(m, f"epoch-{e}", N, name)
            assert got == {rel: tfs.sha256(ref.p(rel)) for rel in got}
        tfs.idle(m)
    s = tfs.stats(m)
    assert s["batch_files_written"] == 0 and not any(cached(m, e, "*") for e in range(3)), s
    assert s["row_groups_decoded"] == 13, s
    assert s["cache_bytes"] <= limit, s

    w = mounter(shuf_ds.path, *opts, "epochs=3")
    proc = tfs.run(["warm", w.path, "--epochs", "1..2", "--format", "safetensors"])
    assert proc.returncode == 0, proc.stderr
    assert tfs.stats(w)["batch_files_written"] == N and len(cached(w, 1)) == N, tfs.stats(w)
    before = tfs.stats(w)
    got = read_batches(w, "epoch-1", N)
    assert got == {rel: tfs.sha256(ref.p(rel)) for rel in got}
    after = tfs.stats(w)
    assert after["batch_files_written"] == before["batch_files_written"], (before, after)
    if after["passthrough_opens"] == 0:
        pytest.skip(f"the kernel did not take FUSE passthrough ({after})")
    assert after["passthrough_opens"] - before["passthrough_opens"] == N, (before, after)
