"""Ways of reading: partial preads before a batch is materialised, O_DIRECT at aligned offsets,
many threads at once."""

import mmap
import os
import random
import threading

import numpy as np

import tfs
from tfs import batch_name

BS, N = 256, 11


def test_partial_reads_before_full_read(mounter, shuf_ds):
    a = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}")
    b = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}")
    rng = random.Random(1)
    for rel in ("epoch-0/000004.safetensors", "epoch-0/000010/x.npy", "epoch-0/000002/id.npy"):
        size = os.stat(a.p(rel)).st_size
        fd = os.open(a.p(rel), os.O_RDONLY)
        try:
            pieces = [(size - 3, 100), (4096, 8), (0, 10), (rng.randrange(size), 777), (size, 10), (size + 5000, 10)]
            got = [(off, n, os.pread(fd, n, off)) for off, n in pieces]
        finally:
            os.close(fd)
        full = tfs.read_exact(b.p(rel))  # the same file from another mount, read whole
        assert len(full) == size
        for off, n, data in got:
            assert data == full[off : off + n], f"{rel}: pread({n}) at {off} of {size} gave {len(data)} bytes that differ"


def test_o_direct_aligned_reads(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "shuffle=none", f"batch_size={BS}")
    rel = "epoch-0/000001/id.npy"
    size = os.stat(m.p(rel)).st_size
    assert size == 4096 + BS * 8
    buf = mmap.mmap(-1, 8192)  # page-aligned
    fd = os.open(m.p(rel), os.O_RDONLY | os.O_DIRECT)
    try:
        n = os.preadv(fd, [buf], 4096)
    finally:
        os.close(fd)
    assert n == BS * 8
    ids = np.frombuffer(buf[:n], dtype="<i8")
    assert np.array_equal(ids, np.arange(BS, 2 * BS))


def test_concurrent_readers(mounter, shuf_ds):
    """8 threads read every file of two epochs in different orders from one cold mount."""
    a = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}", "epochs=2", "threads=2", "prefetch=2")
    ref = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}", "epochs=2", "threads=1")
    rels = [f"epoch-{e}/{batch_name(i)}.safetensors" for e in range(2) for i in range(N)]
    rels += [f"epoch-{e}/{batch_name(i)}/{t}.npy" for e in range(2) for i in range(N) for t in ("id", "x")]
    results, errors = [{} for _ in range(8)], []

    def reader(k):
        order = rels[:]
        random.Random(k).shuffle(order)
        try:
            for rel in order:
                results[k][rel] = tfs.sha256(a.p(rel))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "readers hung"
    expected = {rel: tfs.sha256(ref.p(rel)) for rel in rels}
    for k, r in enumerate(results):
        assert r == expected, f"thread {k} read different bytes"
