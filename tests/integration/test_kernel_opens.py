"""opens=kernel (src/read/follow/page_cache.rs): the kernel answers every open alone (the daemon never
sees one), reads come from the mount's own page cache, and the prefetcher stores the files it
builds for a reader there ahead of it. Every file reads the same bytes as with the daemon
answering opens; stats.json stays live; the next epoch's batch files, built in idle time, are
read without one request reaching the daemon."""

import errno
import mmap
import os
import time

import numpy as np
import pyarrow as pa
import pytest

import tfs

BS = 256


def digests(m: tfs.Mount, rels) -> dict[str, str]:
    return {rel: tfs.sha256(m.p(rel)) for rel in rels}


def test_every_file_reads_as_it_does_with_the_daemon_answering_opens(mounter, main_ds):
    opts = (f"batch_size={BS}", "epochs=2", "world_size=2", "pad=tokens:8")
    k = mounter(main_ds.path, *opts, "opens=kernel")
    d = mounter(main_ds.path, *opts)
    assert k.dataset()["options"]["opens"] == "kernel"
    assert d.dataset()["options"]["opens"] == "daemon"
    n = d.dataset()["batches_per_epoch"]
    per_rank = n // 2  # 12 batches: none left out of the rank views
    assert n == 12
    rels = [*tfs.all_files(d, "epoch-0", n), *tfs.all_files(d, "epoch-1/rank-1-of-2", per_rank)]
    names = [t["name"] for t in d.dataset()["tensors"]]
    for dir_ in ("epoch-0", "epoch-1", "epoch-1/rank-1-of-2"):
        rels += [f"{dir_}/all.safetensors", *(f"{dir_}/all/{name}.npy" for name in names)]
    want = digests(d, rels)
    # Read twice: the second time from the page cache the first read filled.
    assert digests(k, rels) == want
    assert digests(k, rels) == want
    # Memory maps and O_DIRECT reads at aligned offsets.
    for name in names:
        rel = f"epoch-1/all/{name}.npy"
        np.testing.assert_array_equal(
            np.load(k.p(rel), mmap_mode="r")[BS : 2 * BS], np.load(d.p(rel))[BS : 2 * BS]
        )
    rel = "epoch-0/000001.safetensors"
    size = os.path.getsize(d.p(rel))
    fd = os.open(k.p(rel), os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 1 << 20)
        got = os.preadv(fd, [buf], 4096)
        assert buf[:got] == tfs.read_exact(d.p(rel))[4096:]
        assert got == size - 4096
    finally:
        os.close(fd)
    # A read-only mount either way.
    with pytest.raises(OSError) as e:
        os.open(k.p(rel), os.O_WRONLY)
    assert e.value.errno == errno.EROFS
    # No open reached the daemon; stats.json is read anew at each open all the same.
    before = tfs.stats(k)
    assert before["opens"] == 0, before
    tfs.sha256(k.p("epoch-5/000003.safetensors"))  # past the listed epochs: not prefetched
    after = tfs.stats(k)
    assert after["daemon_reads"] > before["daemon_reads"], (before, after)
    assert after["opens"] == 0, after


@pytest.mark.parametrize("mode", ["window", "global"])
def test_the_next_epochs_batch_files_are_read_from_the_page_cache(mounter, shuf_ds, mode):
    n = 11  # shuf_ds: 2600 rows -> 10 full batches and one of 40
    opts = (f"shuffle={mode}", f"batch_size={BS}", "epochs=3", "prefetch=8")
    k = mounter(shuf_ds.path, *opts, "opens=kernel")
    ref = mounter(shuf_ds.path, *opts, "prefetch=0")
    rels = lambda e: [f"epoch-{e}/{tfs.batch_name(i)}.safetensors" for i in range(n)]  # noqa: E731
    got = {**digests(k, rels(0)), **digests(k, rels(1))}
    # Reading epoch 1 had epoch 2's files built and stored in the page cache, from memory: no
    # batch file is written to the cache.
    s = tfs.idle(k)
    assert s["page_cache_stores"] >= 2 * n, s
    assert s["batch_files_written"] == 0, s
    assert not list((k.cache / "v1").glob("batches-*/epoch-*/*.safetensors"))
    got.update(digests(k, rels(2)))
    after = tfs.stats(k)
    # Every byte of epoch 2 came from the page cache but the first page of a few files, left
    # out so that the daemon sees where its reader is: at the epoch's first batch, and at most
    # every fourth (half the prefetch depth).
    reads = after["daemon_reads"] - s["daemon_reads"]
    assert 1 <= reads <= len(range(0, n, 4)), (s, after)
    assert after["daemon_read_bytes"] - s["daemon_read_bytes"] == reads * 4096, (s, after)
    assert after["opens"] == 0, after
    want = {**digests(ref, rels(0)), **digests(ref, rels(1)), **digests(ref, rels(2))}
    assert got == want


def test_the_next_block_is_decoded_while_the_reader_is_in_this_one(mounter, shuf_ds):
    """Under the default shuffle a batch draws from every row group of its block, so the next
    block's row groups are decoded while the reader goes through this one, with the kernel
    answering opens too: its prefetcher claims the files it will store as it schedules them,
    and a claimed file's batch still needs its rows. (Counted as built, they left the next
    block to the reader's first batch in it, which waited a whole block's decode.)"""
    bs = 50  # 52 batches; two blocks of 1,300 rows, 26 batches each
    opts = (f"batch_size={bs}", "shuffle_block=1300", "epochs=1", "prefetch=8", "opens=kernel")
    k = mounter(shuf_ds.path, *opts)
    assert k.dataset()["shuffle_block_rows"] == 1300
    rgs = sum(n for _, _, n in shuf_ds.files)
    for i in range(3):
        tfs.sha256(k.p(f"epoch-0/{tfs.batch_name(i)}.safetensors"))
    s = tfs.idle(k)
    # Both blocks' row groups, the reader still in the first block.
    assert s["row_groups_decoded"] == rgs, s
    ref = mounter(shuf_ds.path, *opts[:-1], "prefetch=0")
    rel = f"epoch-0/{tfs.batch_name(26)}.safetensors"
    assert tfs.sha256(k.p(rel)) == tfs.sha256(ref.p(rel))


def test_batch_files_stored_ahead_are_made_known_by_listings_not_a_lookup_each(mounter, shuf_ds):
    """The daemon answering opens: the next epoch's batch files, stored in the page cache in idle
    time, are made known to the kernel by a listing of their epoch directory from the first one
    on (a READDIRPLUS, after one lookup), not by a lookup each; the reader then looks nothing
    up, and reads every byte from the page cache. A listing the kernel answers without making
    its files known would leave them unstored (a store to an unknown inode is dropped without
    an error): the daemon would serve their reads."""
    n = 11  # shuf_ds: 2600 rows -> 10 full batches and one of 40
    opts = ("shuffle=global", f"batch_size={BS}", "epochs=4", "prefetch=8")
    m = mounter(shuf_ds.path, *opts)
    ref = mounter(shuf_ds.path, *opts, "prefetch=0")
    rels = lambda e: [f"epoch-{e}/{tfs.batch_name(i)}.safetensors" for i in range(n)]  # noqa: E731
    got = digests(m, rels(0))
    before = tfs.idle(m)
    for e in (1, 2):
        got.update(digests(m, rels(e)))
        tfs.idle(m)
    after = tfs.stats(m)
    lookups = after["lookups"] - before["lookups"]
    print(f"epochs 1-2 ({2 * n} files, epochs 2-3 stored ahead): {lookups} lookups")
    # A lookup a file came to 2n (22; 29 with the directories); a listing per epoch directory
    # takes a lookup of its first file and one of the directory itself (4 here), a few more
    # where files are stored out of order by jobs side by side (6 in a loaded CI run).
    assert lookups < n, (before, after)
    assert after["page_cache_stores"] - before["page_cache_stores"] >= 2 * n, (before, after)
    assert after["daemon_reads"] == before["daemon_reads"], (before, after)
    want = {**digests(ref, rels(0)), **digests(ref, rels(1)), **digests(ref, rels(2))}
    assert got == want


def test_batches_stored_in_the_page_cache_are_held_apart_and_few(mounter, tmp_path):
    """A batch built only to be stored in the page cache (the reader's next, the next epoch's
    in idle time) is held apart from those built for reads, only while its reader may yet want
    another of its files: a few times what it stores ahead, at least 8 MiB. Held with the rest,
    every batch stored stayed in memory until an eighth of memory_limit was full, each taking
    memory fresh from the kernel, a second copy of what the page cache holds."""
    rows, dim = 160_000, 32  # 136-byte rows: 21.8 MB an epoch, 157 batches of 1,024
    emb = np.random.default_rng(5).standard_normal((rows, dim), dtype=np.float32)
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "emb": tfs.fsl(emb, dim)})
    tfs.write_dataset(tmp_path / "data", [("part-0.parquet", table)], 20_000)
    opts = ("shuffle=global", "batch_size=1024", "epochs=3", "prefetch=8")
    m = mounter(tmp_path / "data", *opts)
    n = m.dataset()["batches_per_epoch"]
    assert n == 157
    rels = lambda e: [f"epoch-{e}/{tfs.batch_name(i)}.safetensors" for i in range(n)]  # noqa: E731
    got = digests(m, rels(0))
    before = tfs.idle(m)
    got.update(digests(m, rels(1)))
    after = tfs.idle(m)
    # Epoch 1's batch files were read from the page cache, epoch 2's stored while it was read.
    assert after["page_cache_stores"] - before["page_cache_stores"] >= n, (before, after)
    assert after["daemon_reads"] == before["daemon_reads"], (before, after)
    assert after["memory_bytes"] <= 12 << 20, after
    ref = mounter(tmp_path / "data", *opts, "prefetch=0")
    assert got == digests(ref, [*rels(0), *rels(1)])


def test_the_names_of_files_the_cache_keeps_are_known_before_their_reader_opens_them(
    mounter, main_ds
):
    """shuffle=none: the batch files the cache keeps are served by passthrough, which no store
    makes known to the kernel; the prefetcher makes their names known ahead of the reader by
    listings (a batch's directory, its epoch's from the batch on), so that the reader's path
    walk to each file is no round trip. Measured: 28 lookups for 276 per-tensor files and 12
    batch files (those of the first batches, which the reader reaches first), where a lookup a
    file came to 301."""
    opts = (f"batch_size={BS}", "shuffle=none", "prefetch=8", "pad=tokens:8")
    m = mounter(main_ds.path, *opts)
    ref = mounter(main_ds.path, *opts, "prefetch=0")
    n = m.dataset()["batches_per_epoch"]
    names = [t["name"] for t in m.dataset()["tensors"]]
    assert len(names) >= 4, names
    rels = [f"epoch-0/{tfs.batch_name(i)}/{name}.npy" for i in range(n) for name in names]
    rels += [f"epoch-0/{tfs.batch_name(i)}.safetensors" for i in range(n)]
    before = tfs.stats(m)["lookups"]
    got = digests(m, rels)
    lookups = tfs.stats(m)["lookups"] - before
    print(f"{len(rels)} files: {lookups} lookups")
    assert lookups < len(rels) // 4, lookups
    assert tfs.stats(m)["passthrough_opens"] > 0
    assert got == digests(ref, rels)


def test_per_tensor_files_are_stored_with_a_lookup_per_batch_not_per_file(mounter, main_ds):
    """The prefetcher makes a batch's per-tensor files known to the kernel by one listing of
    their directory (a READDIRPLUS instantiates the entries of its page, about 20), not a
    lookup each (and the batch directories by listings of their epoch's): reading three epochs
    of 23 tensors, the daemon answered 53 lookups for 828 files in 36 directories (83-85 with a
    lookup a batch directory), where a lookup a file came to 888. Their bytes are those a mount
    with the daemon answering opens reads."""
    epochs = 3
    opts = (f"batch_size={BS}", f"epochs={epochs}", "prefetch=8", "pad=tokens:8")
    k = mounter(main_ds.path, *opts, "opens=kernel")
    ref = mounter(main_ds.path, *opts, "prefetch=0")
    n = k.dataset()["batches_per_epoch"]
    names = [t["name"] for t in k.dataset()["tensors"]]
    assert len(names) >= 4, names
    dirs = [f"epoch-{e}/{tfs.batch_name(i)}" for e in range(epochs) for i in range(n)]
    rels = [f"{d}/{name}.npy" for d in dirs for name in names]
    before = tfs.stats(k)["lookups"]
    got = digests(k, rels)
    lookups = tfs.idle(k)["lookups"] - before
    print(f"{len(rels)} files in {len(dirs)} directories: {lookups} lookups")
    assert lookups < len(rels) // 4, lookups
    assert got == digests(ref, rels)
