"""shuffle=window and shuffle=global: permutations, variety across epochs and seeds, and
determinism across mounts, thread counts, read orders and cache states."""

import os
import random

import numpy as np
import pytest

import tfs
from tfs import batch_name

BS = 256  # 2600 rows -> 11 batches: 10 x 256 and one of 40
N = 11
MODES = ["window", "global"]


def epoch_ids(m: tfs.Mount, epoch: str, n=N, bs=BS, rows=2600) -> np.ndarray:
    """The ids of an epoch, in batch order; checks each row's x is still its id's x."""
    out = []
    for i in range(n):
        b = tfs.load_safetensors(m.p(epoch, batch_name(i) + ".safetensors"))
        assert set(b) == {"id", "x"}
        expect_len = bs if i < rows // bs else rows - (rows // bs) * bs
        assert len(b["id"]) == expect_len, (epoch, i, len(b["id"]))
        tfs.assert_array(b["x"], (b["id"] / 2).astype(np.float32), f"{epoch}/{i} x")
        out.append(b["id"])
    return np.concatenate(out)


def assert_permutation(ids: np.ndarray, rows=2600):
    assert len(ids) == rows
    assert np.array_equal(np.sort(ids), np.arange(rows)), "not a permutation of all rows"
    assert not np.array_equal(ids, np.arange(rows)), "not shuffled at all"


@pytest.mark.parametrize("mode", MODES)
def test_epochs_are_distinct_permutations(mounter, shuf_ds, mode):
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "epochs=2")
    orders = {}
    for e in ("epoch-0", "epoch-1", "epoch-6"):
        orders[e] = epoch_ids(m, e)
        assert_permutation(orders[e])
    assert not np.array_equal(orders["epoch-0"], orders["epoch-1"])
    assert not np.array_equal(orders["epoch-0"], orders["epoch-6"])
    assert not np.array_equal(orders["epoch-1"], orders["epoch-6"])
    # Not the same set of rows in the first batch either (a mere batch reordering would be weak).
    assert set(orders["epoch-0"][:BS]) != set(orders["epoch-1"][:BS])


@pytest.mark.parametrize("mode", MODES)
def test_seeds_differ(mounter, shuf_ds, mode):
    a = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "seed=0")
    b = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "seed=1")
    ia, ib = epoch_ids(a, "epoch-0"), epoch_ids(b, "epoch-0")
    assert_permutation(ia)
    assert_permutation(ib)
    assert not np.array_equal(ia, ib)


@pytest.mark.parametrize("mode", MODES)
def test_drop_last_shuffled(mounter, shuf_ds, mode):
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "drop_last")
    assert m.dataset()["batches_per_epoch"] == N - 1
    ids = epoch_ids(m, "epoch-0", n=N - 1, rows=(N - 1) * BS)
    assert len(np.unique(ids)) == len(ids) == (N - 1) * BS
    assert ids.min() >= 0 and ids.max() < 2600
    assert not m.p("epoch-0", batch_name(N - 1) + ".safetensors").exists()


def test_window_keeps_locality_global_does_not(mounter, shuf_ds):
    """window: rows are shuffled inside windows of K row groups, so one batch draws from few
    row groups; global: one batch draws from nearly all of them."""
    k = 2
    w = mounter(shuf_ds.path, "shuffle=window", f"shuffle_window={k}", f"batch_size={BS}")
    g = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}")
    wids, gids = epoch_ids(w, "epoch-0"), epoch_ids(g, "epoch-0")
    assert_permutation(wids)
    assert_permutation(gids)
    total_rgs = sum(r for _, _, r in shuf_ds.files)  # 13 row groups of 200 rows
    for i in range(N - 1):
        rgs = set(tfs.row_group_of(wids[i * BS : (i + 1) * BS], shuf_ds, tfs.SHUF_RG))
        # 256 rows span at most 2 windows of 2 row groups; allow some slack.
        assert len(rgs) <= 2 * k + 2, f"window batch {i} draws from {len(rgs)} row groups"
    spread = len(set(tfs.row_group_of(gids[:BS], shuf_ds, tfs.SHUF_RG)))
    assert spread >= total_rgs - 3, f"global batch 0 draws from only {spread} of {total_rgs} row groups"
    # The window mode also shuffles the row groups themselves, so the batches do not walk
    # through the files in order (with windows in file order, batch means would only grow).
    means = [wids[i * BS : (i + 1) * BS].mean() for i in range(N)]
    assert means != sorted(means), "window batches follow the file order"


def hashes(m: tfs.Mount, rels: list[str]) -> dict[str, str]:
    return {rel: tfs.sha256(m.p(rel)) for rel in rels}


@pytest.mark.parametrize("mode", MODES)
def test_deterministic(mounter, shuf_ds, mode):
    """Two mounts at once (threads=1 vs threads=4, default seed vs seed=0), read in different
    orders, then a remount on a warm cache: every file's sha256 is the same."""
    a = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "epochs=2", "threads=1")
    b = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "epochs=2", "threads=4", "seed=0", "prefetch=1")
    rels = []
    for e in ("epoch-0", "epoch-1"):
        rels += tfs.all_files(a, e, N)
    assert len(rels) == 2 * N * 3

    ha = hashes(a, rels)  # forward
    shuffled = rels[:]
    random.Random(42).shuffle(shuffled)
    hb = hashes(b, list(reversed(rels[: len(rels) // 2])) + shuffled)  # reverse, then random
    assert ha == {rel: hb[rel] for rel in rels}

    # Every epoch file hashed differently from the same-numbered one of the other epoch.
    assert ha["epoch-0/000000.safetensors"] != ha["epoch-1/000000.safetensors"]

    # A remount reusing a's (now warm) cache directory serves the same bytes.
    a.unmount()
    c = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "epochs=2", cache=a.cache)
    hc = hashes(c, shuffled)
    assert ha == {rel: hc[rel] for rel in rels}
    assert b.dataset()["fingerprint"] == c.dataset()["fingerprint"]


def test_shuffle_modes_differ(mounter, shuf_ds):
    ids = {}
    for mode in ("none", "window", "global"):
        m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}")
        ids[mode] = epoch_ids(m, "epoch-0")
    assert np.array_equal(ids["none"], np.arange(2600))
    assert not np.array_equal(ids["window"], ids["global"])


def test_default_shuffle_is_block(mounter, shuf_ds):
    """The default mixes each batch from blocks of MosaicML Streaming's default size (PRODUCT.md
    §5 Fair batches): for a dataset this small, one block, the whole dataset."""
    d = mounter(shuf_ds.path, f"batch_size={BS}")
    w = mounter(shuf_ds.path, f"batch_size={BS}", "shuffle=block", "shuffle_block=262144")
    dj = d.dataset()
    assert dj["options"]["shuffle"] == "block" and dj["options"]["shuffle_block"] == 4_000_000
    assert dj["shuffle_block_rows"] == 2600
    for i in (0, N - 1):
        rel = f"epoch-0/{batch_name(i)}.safetensors"
        assert tfs.sha256(d.p(rel)) == tfs.sha256(w.p(rel))
    # Batch 0 draws from all over the table, not from a window of 4 row groups.
    first = tfs.load_safetensors(d.p("epoch-0", batch_name(0) + ".safetensors"))["id"]
    assert len(np.unique(first // 200)) > 4
    for i in (0, N - 1):
        rel = f"epoch-0/{batch_name(i)}.safetensors"
        assert tfs.sha256(d.p(rel)) == tfs.sha256(w.p(rel))


def test_batch_resumption_reads_one_batch(mounter, shuf_ds):
    """Opening batch k of a fresh mount first (mid-epoch resumption) gives the same bytes."""
    a = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}")
    b = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}")
    rel = f"epoch-0/{batch_name(7)}/id.npy"
    first = tfs.sha256(b.p(rel))
    for i in range(N):
        tfs.sha256(a.p(f"epoch-0/{batch_name(i)}.safetensors"))
    assert tfs.sha256(a.p(rel)) == first
    assert os.stat(a.p(rel)).st_size == tfs.DATA_OFFSET + BS * 8


def test_corrupted_cache_is_rebuilt(mounter, shuf_ds):
    """Remounting on a cache whose files were damaged serves the same bytes as a fresh mount."""
    opts = ("shuffle=global", f"batch_size={BS}")
    a = mounter(shuf_ds.path, *opts)
    rels = tfs.all_files(a, "epoch-0", N)
    before = hashes(a, rels)
    a.unmount()
    for dirpath, _, files in os.walk(a.cache):
        for k, f in enumerate(sorted(files)):
            p = os.path.join(dirpath, f)
            if f.endswith(".log") or not os.path.isfile(p) or os.path.islink(p):
                continue
            size = os.path.getsize(p)
            if k % 2 and size:
                os.truncate(p, size // 2)
            elif size:
                with open(p, "r+b") as fh:
                    fh.seek(size // 2)
                    byte = fh.read(1)
                    fh.seek(size // 2)
                    fh.write(bytes([byte[0] ^ 0xFF]))
    b = mounter(shuf_ds.path, *opts, cache=a.cache)
    assert hashes(b, list(reversed(rels))) == before
