"""The batch files of a reader's next epoch built in idle time (src/read/prefetch.rs, NextEpoch): a
reader of a shuffled epoch's batch files has the same directory's next epoch built on the local
cache while it reads, so that it reads the next epoch as a warm one, however fast it comes. The
bytes are those any mount builds; nothing is built past the listed epochs, with shuffle=none
(whose epochs share their files) or with prefetch=0."""

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


def inodes(m: tfs.Mount, epoch: int, pattern: str = "*.safetensors") -> dict[str, int]:
    return {p: os.stat(p).st_ino for p in cached(m, epoch, pattern)}


def wait_cached(m: tfs.Mount, epoch: int, n: int, pattern: str = "*.safetensors") -> dict:
    """The counters once the cache holds N files PATTERN of EPOCH (or after a minute)."""
    deadline = time.monotonic() + 60
    while len(cached(m, epoch, pattern)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return tfs.stats(m)


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
    s = wait_cached(m, 1, N)
    assert len(cached(m, 1)) == N, s
    assert s["next_epoch_files_built"] >= N - DEPTH, s
    # Read now, every one of them is the file the cache holds: none is built for its open.
    before = inodes(m, 1)
    got.update(read_batches(m, "epoch-1", N))
    assert inodes(m, 1) == before
    # Reading epoch 1 has epoch 2's built; nothing past the listed epochs.
    s = wait_cached(m, 2, N)
    assert len(cached(m, 2)) == N and s["next_epoch_files_built"] >= 2 * (N - DEPTH), s
    got.update(read_batches(m, "epoch-2", N))
    time.sleep(0.5)
    assert not cached(m, 3), cached(m, 3)
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
    s = wait_cached(m, 1, n)
    time.sleep(0.3)
    s = tfs.stats(m)
    assert s["next_epoch_files_built"] >= n - DEPTH, s
    names = sorted(p.rsplit("/", 1)[1] for p in cached(m, 1))
    assert names == [batch_name(1 + 3 * j) + ".safetensors" for j in range(n)], names
    before = inodes(m, 1)
    got = read_batches(m, f"epoch-1/{rank}", n)
    assert inodes(m, 1) == before
    assert got == {rel: tfs.sha256(ref.p(rel)) for rel in got}


def test_only_the_files_a_reader_opens_are_built_ahead(mounter, shuf_ds):
    """A reader of one tensor's .npy files has that tensor's files of the next epoch built."""
    opts = ("shuffle=window", f"batch_size={BS}", "epochs=2", f"prefetch={DEPTH}")
    m = mounter(shuf_ds.path, *opts)
    ref = mounter(shuf_ds.path, *opts, "prefetch=0")
    read_batches(m, "epoch-0", N, "{}/x.npy")
    s = wait_cached(m, 1, N, "x.npy")
    assert s["next_epoch_files_built"] >= N - DEPTH, s
    assert len(cached(m, 1, "x.npy")) == N and not cached(m, 1, "id.npy") and not cached(m, 1), s
    before = inodes(m, 1, "x.npy")
    got = read_batches(m, "epoch-1", N, "{}/x.npy")
    assert inodes(m, 1, "x.npy") == before
    assert got == {rel: tfs.sha256(ref.p(rel)) for rel in got}


def settled(m: tfs.Mount) -> None:
    """Waits (up to 10 s) until no file has been built ahead for half a second."""
    last, since, deadline = None, time.monotonic(), time.monotonic() + 10
    while time.monotonic() < deadline:
        now = tfs.stats(m)["next_epoch_files_built"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 0.5:
            return
        time.sleep(0.05)


@pytest.mark.parametrize("option", ["shuffle=none", "prefetch=0"])
def test_nothing_is_built_ahead_where_epochs_share_their_files_or_prefetch_is_off(mounter, shuf_ds, option):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=3", option)
    read_batches(m, "epoch-0", N)
    time.sleep(1)
    s = tfs.stats(m)
    assert s["next_epoch_files_built"] == 0, s
    assert not cached(m, 1), cached(m, 1)


def test_the_next_epoch_takes_only_room_nothing_needs(mounter, shuf_ds):
    """A cache that holds the columns and about half an epoch of batch files beside them: the
    next epoch's files are built only into room that nothing the plan needs again takes, so
    some are, no row group is decoded twice, and the cache stays within cache_size."""
    opts = ("shuffle=window", f"batch_size={BS}", "memory_limit=1M", f"prefetch={DEPTH}")
    probe = mounter(shuf_ds.path, *opts, "epochs=1")
    read_batches(probe, "epoch-0", N)
    probe.unmount()
    size = lambda paths: sum(os.path.getsize(p) for p in paths)
    cols = size(glob.glob(str(probe.cache / "v1" / "cols-*" / "*")))
    epoch = size(cached(probe, 0))
    limit = cols + epoch * 6 // 10
    m = mounter(shuf_ds.path, *opts, "epochs=3", f"cache_size={limit}")
    for e in range(3):
        read_batches(m, f"epoch-{e}", N)
        settled(m)
    s = tfs.stats(m)
    print(f"cache_size={limit}: {s['next_epoch_files_built']} built ahead, {s['cache_evictions']} evicted")
    assert 0 < s["next_epoch_files_built"] < 2 * (N - DEPTH), s
    assert s["row_groups_decoded"] == 13, s
    assert s["cache_bytes"] <= limit, s
