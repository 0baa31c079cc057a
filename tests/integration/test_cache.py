"""The local SSD cache: warm remounts, content keys, cache_size and plan-aware eviction, faults
(corrupted, truncated, missing entries; a crashed daemon; a full disk), FUSE passthrough,
O_DIRECT, the gds/ view with its xattr, and the cache's permissions."""

import glob
import json
import math
import mmap
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs
from tfs import batch_name

BS = 256  # shuf_ds: 2600 rows -> 11 batches per epoch
N = 11
XATTR = "user.tensorfs.path"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def read_stats(m: tfs.Mount) -> bytes:
    with open(m.p(".tensorfs", "stats.json"), "rb") as f:
        return f.read()


def delta(after: dict, before: dict, key: str) -> int:
    return after[key] - before[key]


def digests(m: tfs.Mount, rels) -> dict[str, str]:
    return {rel: tfs.sha256(m.p(rel)) for rel in rels}


def epoch_files(m: tfs.Mount, epochs, n=N) -> list[str]:
    return [rel for e in epochs for rel in tfs.all_files(m, f"epoch-{e}", n)]


def assert_same(got: dict, want: dict, what: str):
    assert set(got) == set(want)
    bad = sorted(rel for rel in want if got[rel] != want[rel])
    assert not bad, f"{what}: {len(bad)} files differ from the reference, e.g. {bad[:5]}"


def data_size_at_most(cache: Path, limit: int, tries: int = 5) -> int:
    """data_size, walked again (up to TRIES times) while it is over LIMIT: one walk is not a
    snapshot, since a file counted just before its eviction and the file written after it both
    count. A cache really over LIMIT stays over it in every walk."""
    used = data_size(cache)
    for _ in range(tries - 1):
        if used <= limit:
            break
        time.sleep(0.002)
        used = min(used, data_size(cache))
    return used


def data_size(cache: Path) -> int:
    """Bytes of every file under CACHE/v1/cols-* and CACHE/v1/batches-* (and any meta sidecars)."""
    total = 0
    for top in glob.glob(str(cache / "v1" / "cols-*")) + glob.glob(str(cache / "v1" / "batches-*")):
        for root, _, files in os.walk(top):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except FileNotFoundError:
                    pass
    return total


def cache_paths(cache: Path, pattern: str) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(cache / "v1" / pattern)))


def keep(m: tfs.Mount, epochs: str) -> None:
    """Has the batch files of EPOCHS (e.g. '0', '0..2') written to the cache: `tensorfs warm`,
    which asks for what a shuffled epoch's reader does not keep."""
    proc = tfs.run(["warm", m.path, "--epochs", epochs, "--format", "both"])
    assert proc.returncode == 0, proc.stderr


def backing(m: tfs.Mount, rel: str) -> Path:
    """The cache file behind REL (e.g. 'epoch-0/000001.safetensors'), found by the layout."""
    found = cache_paths(m.cache, f"batches-*/{rel}")
    assert len(found) == 1, f"expected one cached copy of {rel}, found {found}"
    return found[0]


META_XATTR = "user.tensorfs.meta"




def has_meta(path: Path) -> bool:
    try:
        os.getxattr(path, META_XATTR)
        return True
    except OSError:
        return False


def drop_meta(path: Path):
    os.removexattr(path, META_XATTR)


def set_meta(path: Path, value: bytes):
    os.setxattr(path, META_XATTR, value)


def flip_byte(path: Path, offset: int):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def log_tail(cache: Path, n=30) -> str:
    try:
        lines = (cache / "tensorfs.log").read_text(errors="replace").splitlines()
    except OSError:
        return "(no tensorfs.log)"
    return "\n".join(lines[-n:])


def make_wide(path: Path, row_groups=20, rg_rows=200, dim=128) -> tfs.Dataset:
    """One file of ROW_GROUPS row groups: id int64 and emb float32[DIM]."""
    n = row_groups * rg_rows
    rng = np.random.default_rng(7)
    ids = np.arange(n, dtype=np.int64)
    emb = rng.standard_normal((n, dim)).astype(np.float32)
    files = tfs.write_dataset(path, [("w.parquet", pa.table({"id": ids, "emb": tfs.fsl(emb, dim)}))], rg_rows)
    ds = tfs.Dataset(path, files)
    ds.ref["id"] = ids
    return ds


@pytest.fixture(scope="module")
def wide_ds(tmp_path_factory) -> tfs.Dataset:
    return make_wide(tmp_path_factory.mktemp("wide") / "data")


# --------------------------------------------------------------------------------------------
# 0. stats.json
# --------------------------------------------------------------------------------------------


def test_stats_json_reads_are_whole(mounter, shuf_ds):
    """Every read of stats.json is one whole JSON document (one snapshot per open), even while
    a reader elsewhere keeps its counters, and so its length, changing."""
    m = mounter(shuf_ds.path, "shuffle=window", "batch_size=64", "epochs=4")
    n = m.dataset()["batches_per_epoch"]
    rels = [f"epoch-{e}/{batch_name(i)}.safetensors" for e in range(4) for i in range(n)]
    done = threading.Event()

    def reader():
        try:
            for rel in rels:
                tfs.sha256(m.p(rel))
        finally:
            done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    torn, reads = [], 0
    while reads < 10000 or not done.is_set():
        raw = read_stats(m)
        reads += 1
        try:
            json.loads(raw)
        except json.JSONDecodeError:
            torn.append(raw[-60:])
    t.join(timeout=30)
    assert not torn, f"{len(torn)} of {reads} reads of stats.json were not one JSON document, e.g. ...{torn[0]!r}"


def test_stats_json_is_the_size_a_stat_reports(mounter, shuf_ds):
    """Like every file of the mount, stats.json is as long as its stat says (padded with
    whitespace, which ends a JSON document), while its counters change."""
    m = mounter(shuf_ds.path, "shuffle=window", "batch_size=64")
    path = m.p(".tensorfs", "stats.json")
    for i in range(20):
        tfs.sha256(m.p("epoch-0", batch_name(i) + ".safetensors"))
        size = os.stat(path).st_size
        raw = read_stats(m)
        assert len(raw) == size, (i, len(raw), size)
        assert size % 4096 == 0 and raw.endswith(b"\n")
        json.loads(raw)


# --------------------------------------------------------------------------------------------
# 1. Warm remount
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", ["window", "none"])
def test_warm_remount_reads_nothing_remote(mounter, main_ds, shuffle):
    """Remounted on its cache, a mount fetches and decodes nothing: a shuffled epoch is gathered
    from the cached columns, and with shuffle=none the batch files themselves are kept."""
    opts = (f"shuffle={shuffle}", "batch_size=512", "pad=tokens:8")
    a = mounter(main_ds.path, *opts)
    n = a.dataset()["batches_per_epoch"]
    rels = epoch_files(a, [0], n)
    first = digests(a, rels)
    cold = tfs.stats(a)
    assert cold["row_groups_decoded"] > 0 and cold["remote_bytes"] > 0, cold
    a.unmount()

    b = mounter(main_ds.path, *opts, cache=a.cache)
    second = digests(b, rels)
    s = tfs.stats(b)
    print("warm stats:", {k: s[k] for k in ("row_groups_decoded", "remote_bytes", "remote_requests", "batches_built", "batch_file_hits")})
    assert_same(second, first, "warm remount")
    assert s["row_groups_decoded"] == 0, s
    assert s["remote_bytes"] == 0, s
    assert s["remote_requests"] == 0, s
    if shuffle == "none":
        assert s["batches_built"] == 0, s


# --------------------------------------------------------------------------------------------
# 2. Content options are part of the cache key
# --------------------------------------------------------------------------------------------


def test_content_options_never_serve_stale_bytes(mounter, shuf_ds):
    base = ("shuffle=window", f"batch_size={BS}")
    a = mounter(shuf_ds.path, *base)
    rels = epoch_files(a, [0])
    first = digests(a, rels)
    cache = a.cache
    a.unmount()

    variants = [("cast=x:float64",), ("seed=7",), ("batch_size=200",)]
    for extra in variants:
        m = mounter(shuf_ds.path, *base, *extra, cache=cache)
        ref = mounter(shuf_ds.path, *base, *extra)
        n = ref.dataset()["batches_per_epoch"]
        vrels = epoch_files(ref, [0], n)
        got, want = digests(m, vrels), digests(ref, vrels)
        assert_same(got, want, f"shared cache with {extra}")
        # x (and so every safetensors file) must differ from the first mount's bytes.
        changed = [r for r in vrels if r.endswith(".safetensors") or r.endswith("x.npy")]
        same = [r for r in changed if first.get(r) == got[r]]
        assert not same, f"{extra}: served the first mount's bytes for {same[:5]}"
        m.unmount()
        ref.unmount()

    # And the first options are still served from the shared cache, unchanged.
    again = mounter(shuf_ds.path, *base, cache=cache)
    assert_same(digests(again, rels), first, "first options after other options used the cache")


# --------------------------------------------------------------------------------------------
# 3. cache_size is never exceeded
# --------------------------------------------------------------------------------------------


def test_cache_size_is_never_exceeded(mounter, shuf_ds):
    base = ("shuffle=window", f"batch_size={BS}", "epochs=3")
    ref = mounter(shuf_ds.path, *base)
    rels = {e: epoch_files(ref, [e]) for e in range(3)}
    want = {e: digests(ref, rels[e]) for e in range(3)}
    full = data_size(ref.cache)
    limit_k = math.ceil(full / 2 / 1024)
    limit = limit_k * 1024
    print(f"all cols + batch files: {full} bytes; cache_size={limit_k}K")

    m = mounter(shuf_ds.path, *base, f"cache_size={limit_k}K")
    for e in range(3):
        got = {}
        for rel in rels[e]:
            got[rel] = tfs.sha256(m.p(rel))
            used = data_size_at_most(m.cache, limit)
            assert used <= limit, (
                f"while reading {rel}: {used} bytes under cols-*/batches-* > cache_size {limit}\n{log_tail(m.cache)}"
            )
        assert_same(got, want[e], f"epoch {e} with cache_size={limit_k}K")
        for _ in range(4):  # a few samples: prefetch may still be writing
            used = data_size_at_most(m.cache, limit)
            s = tfs.stats(m)
            assert used <= limit, f"after epoch {e}: {used} bytes under cols-*/batches-* > cache_size {limit}"
            assert s["cache_bytes"] <= s["cache_capacity"], s
            assert s["cache_capacity"] <= limit, s
            time.sleep(0.05)
        print(f"epoch {e}: {used} bytes on disk, cache_bytes={s['cache_bytes']}, evictions={s['cache_evictions']}")
    assert tfs.stats(m)["cache_evictions"] > 0


# --------------------------------------------------------------------------------------------
# 4. Plan-aware eviction
# --------------------------------------------------------------------------------------------


def test_epochs_in_one_order_share_their_files(mounter, wide_ds):
    """shuffle=none: every epoch is epoch 0 byte for byte, so its batch files are built and kept
    once, and the batch files are all that is kept (no columns written beside them)."""
    m = mounter(wide_ds.path, "shuffle=none", "batch_size=200", "epochs=3")
    ref = mounter(wide_ds.path, "shuffle=none", "batch_size=200", "epochs=3")
    n = m.dataset()["batches_per_epoch"]
    rels = {e: epoch_files(m, [e], n) for e in range(3)}
    assert_same(digests(m, rels[0]), digests(ref, rels[0]), "epoch 0")
    written = tfs.stats(m)["batch_files_written"]
    assert written >= len(rels[0]), tfs.stats(m)
    for e in (1, 2):
        assert_same(digests(m, rels[e]), digests(ref, rels[e]), f"epoch {e}")
        first = os.readlink(m.p("gds", rels[0][0]))
        assert os.readlink(m.p("gds", rels[e][0])) == first, f"epoch {e} has files of its own"
    assert tfs.stats(m)["batch_files_written"] == written, f"later epochs wrote files: {tfs.stats(m)}"
    assert not cache_paths(m.cache, "cols-*/*.cols"), "columns kept beside the batch files"


def test_eviction_of_repeated_epochs_follows_the_plan(mounter, wide_ds):
    """shuffle=none, batch files about twice the cache: every epoch reads them in the same order,
    where an LRU cache would have evicted each file before it is read again and rebuild all of
    them every epoch; evicting what the plan needs furthest ahead keeps about half."""
    epochs = 4
    base = ("shuffle=none", "batch_size=200", f"epochs={epochs}", "memory_limit=1M", "prefetch=2")
    probe = mounter(wide_ds.path, *base)
    n = probe.dataset()["batches_per_epoch"]
    rels = [f"epoch-0/{batch_name(i)}.safetensors" for i in range(n)]
    digests(probe, rels)
    full = data_size(probe.cache)
    probe.unmount()

    limit_k = math.ceil(full / 2 / 1024)
    ref = mounter(wide_ds.path, *base)
    m = mounter(wide_ds.path, *base, f"cache_size={limit_k}K")
    built = []
    for e in range(epochs):
        before = tfs.stats(m)
        rels = [f"epoch-{e}/{batch_name(i)}.safetensors" for i in range(n)]
        assert_same(digests(m, rels), digests(ref, rels), f"epoch {e}")
        built.append(delta(tfs.stats(m), before, "batch_files_written"))
    s = tfs.stats(m)
    print(f"{n} batch files, {full} B in all, cache_size={limit_k}K: written per epoch {built}; evictions={s['cache_evictions']}")
    assert s["cache_evictions"] > 0, "the cache never evicted: the test did not exercise eviction"
    assert data_size(m.cache) <= limit_k * 1024, s
    assert built[0] >= n, f"epoch 0 wrote {built[0]} of {n} files"
    for e in range(1, epochs):
        assert built[e] <= 0.75 * n, (
            f"epoch {e} rebuilt {built[e]} of {n} batch files (all: {built}); "
            f"eviction is not using the plan\n{log_tail(m.cache)}"
        )


def test_eviction_follows_the_plan(mounter, wide_ds):
    """shuffle=window: the transformed columns are about twice the cache. A cache that evicts
    what the plan needs furthest ahead keeps about half of them from epoch to epoch, where an
    LRU cache (on disk or in memory) would decode every row group again in each epoch.
    memory_limit is at its minimum (1M, under half the columns) so memory cannot hide the disk."""
    shuffle = "window"
    epochs = 4
    # A shuffled epoch's batch files are not written: the columns are all the cache holds.
    base = (f"shuffle={shuffle}", "batch_size=200", f"epochs={epochs}", "memory_limit=1M", "prefetch=2")
    probe = mounter(wide_ds.path, *base)
    n = probe.dataset()["batches_per_epoch"]
    rgs = probe.dataset()["row_groups"]
    tfs.sha256(probe.p("epoch-0", "000000.safetensors"))
    cols = cache_paths(probe.cache, "cols-*/*.cols")
    assert cols, "no cols file written"
    cols_size = max(p.stat().st_size for p in cols)
    probe.unmount()

    limit_k = math.ceil(rgs * cols_size / 2 / 1024)
    print(f"{rgs} row groups, cols file {cols_size} B -> cache_size={limit_k}K")
    ref = mounter(wide_ds.path, *base)
    m = mounter(wide_ds.path, *base, f"cache_size={limit_k}K")
    decoded, hits = [], []
    for e in range(epochs):
        before = tfs.stats(m)
        rels = [f"epoch-{e}/{batch_name(i)}.safetensors" for i in range(n)]
        assert_same(digests(m, rels), digests(ref, rels), f"epoch {e}")
        after = tfs.stats(m)
        decoded.append(delta(after, before, "row_groups_decoded"))
        hits.append(delta(after, before, "column_hits"))
    s = tfs.stats(m)
    print(f"row groups decoded per epoch: {decoded} of {rgs}; column_hits {hits}; evictions={s['cache_evictions']}")
    assert s["cache_evictions"] > 0, "the cache never evicted: the test did not exercise eviction"
    used = data_size(m.cache)
    assert used <= limit_k * 1024, f"{used} bytes under cols-*/batches-* > cache_size {limit_k}K: {s}"
    assert decoded[0] == rgs, f"epoch 0 decoded {decoded[0]} of {rgs} row groups: {decoded}\n{log_tail(m.cache)}"
    # Over the later epochs together: one epoch's count moves with the prefetcher's timing
    # (13-16 of 20 seen for one epoch, 40-42 for the three), where an LRU cache decodes all.
    later = decoded[1:]
    assert sum(later) <= 0.75 * rgs * len(later) and max(later) < rgs, (
        f"epochs 1-{epochs - 1} decoded {later} of {rgs} row groups each (all: {decoded}); "
        f"eviction is not using the plan\n{log_tail(m.cache)}"
    )


# --------------------------------------------------------------------------------------------
# 5. Corrupted, truncated and missing entries
# --------------------------------------------------------------------------------------------


def test_faults_while_mounted(mounter, wide_ds):
    """memory_limit=1M holds under half of wide_ds's columns, so a far epoch reads cols files."""
    base = ("shuffle=window", "batch_size=200", "memory_limit=1M")
    ref = mounter(wide_ds.path, *base)
    m = mounter(wide_ds.path, *base)
    n = m.dataset()["batches_per_epoch"]
    rels0 = epoch_files(m, [0], n)
    want0 = digests(ref, rels0)
    assert_same(digests(m, rels0), want0, "first read")
    # Read once, a shuffled epoch's files are not written: `tensorfs warm` asks to keep them.
    keep(m, "0")

    flipped = backing(m, "epoch-0/000000.safetensors")
    flip_byte(flipped, tfs.DATA_OFFSET + 17)
    truncated = backing(m, "epoch-0/000001.safetensors")
    os.truncate(truncated, truncated.stat().st_size // 2)
    npy_flipped = backing(m, "epoch-0/000003/emb.npy")
    flip_byte(npy_flipped, tfs.DATA_OFFSET + 5)
    deleted = backing(m, "epoch-0/000002.safetensors")
    deleted.unlink()
    cols = cache_paths(m.cache, "cols-*/*.cols")
    assert len(cols) == m.dataset()["row_groups"], cols
    for c in cols:  # every cols file: whatever the memory holds, a far epoch meets some of them
        flip_byte(c, c.stat().st_size - 5)

    before = tfs.stats(m)
    touched = ["epoch-0/000000.safetensors", "epoch-0/000001.safetensors", "epoch-0/000002.safetensors", "epoch-0/000003/emb.npy"]
    assert_same(digests(m, touched), {r: want0[r] for r in touched}, "after corrupting the cache")
    mid = tfs.stats(m)
    assert delta(mid, before, "cache_corrupt_dropped") >= 3, (before, mid)
    # An epoch far from anything prefetched needs every row group's columns.
    rels7 = epoch_files(m, [7], n)
    assert_same(digests(m, rels7), digests(ref, rels7), "epoch 7 after corrupting the cols files")
    after = tfs.stats(m)
    print(f"cache_corrupt_dropped +{delta(after, before, 'cache_corrupt_dropped')}, "
          f"row_groups_decoded +{delta(after, mid, 'row_groups_decoded')}, column_hits +{delta(after, mid, 'column_hits')}")
    assert delta(after, mid, "row_groups_decoded") > 0, "epoch 7 decoded nothing: the cols files were not needed"
    assert delta(after, mid, "cache_corrupt_dropped") >= 1, "corrupted cols files were read without being dropped"
    # Reading everything once more still gives the reference.
    assert_same(digests(m, rels0), want0, "second full read")


def test_faults_between_mounts(mounter, shuf_ds):
    base = ("shuffle=window", f"batch_size={BS}")
    ref = mounter(shuf_ds.path, *base)
    a = mounter(shuf_ds.path, *base)
    rels0 = epoch_files(a, [0])
    want0 = digests(ref, rels0)
    assert_same(digests(a, rels0), want0, "first read")
    keep(a, "0")
    paths = {r: backing(a, r) for r in rels0}
    a.unmount()

    flip_byte(paths["epoch-0/000000.safetensors"], tfs.DATA_OFFSET + 3)
    os.truncate(paths["epoch-0/000001.safetensors"], 100)
    paths["epoch-0/000002.safetensors"].unlink()
    set_meta(paths["epoch-0/000003.safetensors"], b"\x00garbage\xff" * 3)
    drop_meta(paths["epoch-0/000004/id.npy"])  # data file left without its meta
    flip_byte(paths["epoch-0/000005/x.npy"], 2)  # the npy header
    cols = cache_paths(a.cache, "cols-*/*.cols")
    assert len(cols) == 13, cols
    flip_byte(cols[3], cols[3].stat().st_size - 1)
    flip_byte(cols[4], 10)  # the header
    os.truncate(cols[5], 4096)
    cols[6].unlink()

    b = mounter(shuf_ds.path, *base, cache=a.cache)
    before = tfs.stats(b)
    assert_same(digests(b, rels0), want0, "remount over a corrupted cache")
    rels9 = epoch_files(b, [9])
    assert_same(digests(b, rels9), digests(ref, rels9), "epoch 9 from corrupted cols")
    s = tfs.stats(b)
    print(f"cache_corrupt_dropped={s['cache_corrupt_dropped']} (before reads: {before['cache_corrupt_dropped']}), "
          f"row_groups_decoded={s['row_groups_decoded']}")
    # flipped + truncated batch files and three damaged cols files, at least.
    assert s["cache_corrupt_dropped"] >= 5, s


# --------------------------------------------------------------------------------------------
# 6. A crashed daemon
# --------------------------------------------------------------------------------------------


def test_crash_leftovers_are_cleaned(mounter, shuf_ds):
    base = ("shuffle=window", "batch_size=64", "epochs=2")
    ref = mounter(shuf_ds.path, *base)
    n = ref.dataset()["batches_per_epoch"]
    rels = epoch_files(ref, [0, 1], n)
    want = digests(ref, rels)

    m = mounter(shuf_ds.path, *base)
    planted_rel = f"epoch-1/{batch_name(n - 1)}.safetensors"
    planted_size = os.stat(m.p(planted_rel)).st_size
    progress, errors = [0], []

    def reader():
        try:
            for rel in rels:
                tfs.sha256(m.p(rel))
                progress[0] += 1
        except OSError as e:  # the daemon is killed under us
            errors.append(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while progress[0] < 20 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    pids = tfs.tensorfs_daemons(m)
    assert pids, "no tensorfs daemon found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert tfs.wait_exited(pids, 10) == []
    t.join(timeout=30)
    assert not t.is_alive(), "reader hung after the daemon was killed"
    print(f"killed after {progress[0]} of {len(rels)} files; reader error: {errors[:1]}")
    tfs.unmount(m.path)
    assert not tfs.is_mounted(m.path)

    tmp_file = m.cache / "v1" / "tmp" / "999999-0"
    tmp_file.parent.mkdir(parents=True, exist_ok=True)
    tmp_file.write_bytes(os.urandom(5000))
    keys = cache_paths(m.cache, "batches-*")
    assert len(keys) == 1, keys
    planted = keys[0] / planted_rel
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(os.urandom(planted_size))  # right size, wrong bytes, no meta
    if has_meta(planted):
        drop_meta(planted)

    b = mounter(shuf_ds.path, *base, cache=m.cache)
    deadline = time.monotonic() + 5
    while tmp_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tmp_file.exists(), "a crash's temp file survived the next mount"
    assert not (planted.exists() and not has_meta(planted)), "a batch file without its meta survived the mount"
    assert_same(digests(b, rels), want, "after a crash")
    assert not (planted.exists() and not has_meta(planted))


# --------------------------------------------------------------------------------------------
# 7. A full disk
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_full_disk_serves_from_memory(mounter, shuf_ds, tmp_path):
    base = ("shuffle=window", f"batch_size={BS}", "epochs=3")
    ref = mounter(shuf_ds.path, *base)
    rels = epoch_files(ref, range(3))
    want = digests(ref, rels)
    # The columns are what the cache keeps of shuffled epochs.
    assert data_size(ref.cache) > 64 * 1024, "the data must not fit the small disk"

    small = tmp_path / "small"
    small.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    m = None
    try:
        m = mounter(shuf_ds.path, *base, "cache_size=100M", cache=small / "cache")
        assert_same(digests(m, rels), want, "on a full disk")
        s = tfs.stats(m)
        print({k: s[k] for k in ("cache_write_failures", "cache_bytes", "cache_capacity", "cache_evictions")})
        assert s["cache_write_failures"] > 0, f"{s}\n{log_tail(m.cache)}"
        assert m.dataset()["batch_size"] == BS
        assert tfs.is_mounted(m.path)
        # Still serving, twice.
        assert_same(digests(m, rels[:12]), {r: want[r] for r in rels[:12]}, "second read on a full disk")
    finally:
        if m is not None:
            m.unmount()
        if subprocess.run(["umount", str(small)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(small)], capture_output=True)


# --------------------------------------------------------------------------------------------
# 8. Passthrough
# --------------------------------------------------------------------------------------------


def test_a_shuffled_file_read_again_comes_from_the_page_cache(mounter, shuf_ds):
    """Read once, a shuffled epoch's batch file is not written to the cache; read again, it
    comes from the kernel's page cache, kept across opens: no read reaches the daemon."""
    m = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}")
    rel = "epoch-0/000004.safetensors"
    first = tfs.read_exact(m.p(rel))
    s1 = tfs.stats(m)
    assert tfs.read_exact(m.p(rel)) == first
    s2 = tfs.stats(m)
    assert s2["daemon_reads"] == s1["daemon_reads"] and s2["opens"] > s1["opens"], (s1, s2)
    assert s2["batch_files_written"] == 0 and not cache_paths(m.cache, "batches-*/**/*.safetensors"), s2


def on_disk(tops: list[Path]) -> int:
    """Bytes of the files under TOPS, with their extended attributes (a batch file's meta, where
    the filesystem keeps it; a sidecar file where it does not)."""
    files = [p for top in tops for p in top.rglob("*") if p.is_file()]
    meta = sum(len(os.getxattr(p, a)) for p in files for a in os.listxattr(p) if a.startswith("user."))
    return sum(p.stat().st_size for p in files) + meta


@pytest.mark.parametrize("shuffle", ["block", "none"])
def test_a_cold_epoch_writes_what_later_epochs_read_once(mounter, shuf_ds, shuffle):
    """A shuffled cold epoch writes the decoded columns and no batch (each is read once); with
    shuffle=none, every epoch reads the same batch files, which are then what is written.
    cache_written_bytes counts it all, and a second epoch writes nothing more."""
    m = mounter(shuf_ds.path, f"shuffle={shuffle}", f"batch_size={BS}", "epochs=2")
    n = m.dataset()["batches_per_epoch"]
    for i in range(n):
        tfs.read_exact(m.p("epoch-0", f"{i:06d}.safetensors"))
    s0 = tfs.idle(m)
    cols = on_disk(cache_paths(m.cache, "cols-*"))
    batches = on_disk(cache_paths(m.cache, "batches-*"))
    if shuffle == "none":
        assert s0["batch_files_written"] == n and batches > 0, s0
    else:
        assert s0["batch_files_written"] == 0 and batches == 0 and cols > 0, s0
    assert s0["cache_written_bytes"] == cols + batches, (s0, cols, batches)
    for i in range(n):
        tfs.read_exact(m.p("epoch-1", f"{i:06d}.safetensors"))
    s1 = tfs.idle(m)
    assert s1["cache_written_bytes"] == s0["cache_written_bytes"], (s0, s1)


def test_passthrough_bypasses_the_daemon(mounter, shuf_ds):
    """shuffle=none: every epoch reads the same files, so they are written to the cache, and
    opened by passthrough."""
    m = mounter(shuf_ds.path, "shuffle=none", f"batch_size={BS}")
    rel = "epoch-0/000004.safetensors"
    first = tfs.read_exact(m.p(rel))
    s1 = tfs.stats(m)
    second = tfs.read_exact(m.p(rel))
    s2 = tfs.stats(m)
    assert second == first
    if s2["passthrough_opens"] == 0:
        pytest.skip(f"the kernel did not take FUSE passthrough (opens={s2['opens']}, passthrough_opens=0)")
    assert s2["passthrough_opens"] > s1["passthrough_opens"], (s1, s2)
    assert s2["daemon_reads"] == s1["daemon_reads"], f"a passthrough read reached the daemon: {s1} -> {s2}"

    off = mounter(shuf_ds.path, "shuffle=none", f"batch_size={BS}", "passthrough=off")
    assert tfs.read_exact(off.p(rel)) == first
    so = tfs.stats(off)
    assert so["daemon_reads"] > 0 and so["daemon_read_bytes"] >= len(first), so
    assert so["passthrough_opens"] == 0, so


# --------------------------------------------------------------------------------------------
# 9. O_DIRECT
# --------------------------------------------------------------------------------------------


def direct_read(path, offset: int, length: int) -> bytes:
    n = -(-length // 4096) * 4096 or 4096
    buf = mmap.mmap(-1, n)  # page-aligned
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        got = os.preadv(fd, [buf], offset)
    finally:
        os.close(fd)
    data = buf[:got]
    buf.close()
    return data


@pytest.mark.parametrize("passthrough", ["auto", "off"])
def test_o_direct_on_mount_and_gds_paths(mounter, shuf_ds, passthrough):
    m = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}", f"passthrough={passthrough}")
    for rel in ("epoch-0/000002.safetensors", "epoch-0/000002/x.npy", "epoch-0/000005/id.npy"):
        for path in (m.p(rel), m.p("gds", rel)):
            size = os.stat(path).st_size
            data = direct_read(path, 4096, size - 4096)
            full = direct_read(path, 0, size)
            buffered = tfs.read_exact(m.p(rel))
            assert data == buffered[4096:], f"{path}: O_DIRECT read at 4096 differs ({len(data)} bytes)"
            assert full == buffered, f"{path}: O_DIRECT read at 0 differs ({len(full)} bytes)"


# --------------------------------------------------------------------------------------------
# 10. The gds/ view and the xattr
# --------------------------------------------------------------------------------------------


def test_gds_view_and_xattr(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}", "world_size=2", "epochs=2")
    cache_root = os.path.realpath(m.cache) + os.sep
    assert {"epoch-0", "epoch-1"} <= set(os.listdir(m.p("gds"))), os.listdir(m.p("gds"))
    assert set(os.listdir(m.p("gds", "epoch-0"))) == set(os.listdir(m.p("epoch-0")))

    cases = [
        ("epoch-0/000000.safetensors", "epoch-0/000000.safetensors"),
        ("epoch-0/000000/x.npy", "epoch-0/000000/x.npy"),
        ("epoch-1/000007/id.npy", "epoch-1/000007/id.npy"),
        ("epoch-0/rank-1-of-2/000000.safetensors", "epoch-0/000001.safetensors"),
        ("epoch-0/rank-0-of-2/000002/x.npy", "epoch-0/000004/x.npy"),
    ]
    for rel, global_rel in cases:
        link = m.p("gds", rel)
        target = os.readlink(link)
        assert os.path.isabs(target), f"{rel}: readlink gave a relative path {target!r}"
        assert os.path.realpath(target).startswith(cache_root), f"{rel}: {target} is not under the cache dir"
        with open(target, "rb") as f:
            backing_bytes = f.read()
        assert backing_bytes == tfs.read_exact(m.p(global_rel)), f"{rel}: the backing file differs from {global_rel}"
        assert backing_bytes == tfs.read_exact(m.p(rel)), f"{rel}: the backing file differs from the mount's file"
        st = os.lstat(link)
        assert stat.S_ISLNK(st.st_mode), f"{rel}: lstat mode {oct(st.st_mode)}"
        assert st.st_size == len(os.fsencode(target)), f"{rel}: symlink st_size {st.st_size}, target {len(target)}"
        # The xattr on the main tree's file names the same backing file.
        assert XATTR in os.listxattr(m.p(rel)), os.listxattr(m.p(rel))
        assert os.fsdecode(os.getxattr(m.p(rel), XATTR)) == target, f"{rel}: xattr differs from readlink"


# --------------------------------------------------------------------------------------------
# 11. Permissions
# --------------------------------------------------------------------------------------------


def test_cache_is_private(mounter, shuf_ds):
    old = os.umask(0)  # tensorfs must not rely on the caller's umask
    try:
        m = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}", "epochs=2")
    finally:
        os.umask(old)
    digests(m, epoch_files(m, [0, 1]))
    keep(m, "0..2")
    mode = stat.S_IMODE(os.stat(m.cache).st_mode)
    assert mode == 0o700, f"cache dir mode {oct(mode)}"
    seen, bad = 0, []
    for root, _, files in os.walk(m.cache / "v1"):
        for f in files:
            p = os.path.join(root, f)
            mode = stat.S_IMODE(os.lstat(p).st_mode)
            seen += 1
            if mode != 0o600:
                bad.append((os.path.relpath(p, m.cache), oct(mode)))
    assert seen > 40, f"only {seen} files under v1"
    assert not bad, f"{len(bad)} cache files are not 0600: {bad[:8]}"
    kinds = {Path(p).suffix for _, _, fs in os.walk(m.cache / "v1") for p in fs}
    assert {".cols", ".safetensors", ".npy"} <= kinds, kinds


def test_global_shuffle_needs_the_decoded_dataset_in_the_cache(mounter, shuf_ds):
    """shuffle=global gathers every batch from all row groups: refused when the cache cannot hold
    them, served (a permutation of all rows) when it can."""
    mnt = mounter.mountpoint()
    proc = tfs.run(["mount", shuf_ds.path, mnt, "-o", f"shuffle=global,cache_size=8K,cache_dir={mnt.parent / 'c'}"])
    line = tfs.error_line(proc)
    assert "shuffle=global" in line and "cache_size" in line
    assert not tfs.is_mounted(mnt)
    m = mounter(shuf_ds.path, "shuffle=global", "batch_size=256", "cache_size=64M")
    ids = np.concatenate([
        tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))["id"]
        for i in range(m.dataset()["batches_per_epoch"])
    ])
    assert np.array_equal(np.sort(ids), np.arange(len(ids)))


@pytest.mark.parametrize("shuffle", ["none", "window"])
def test_a_row_group_too_large_to_hold_is_decoded_once(mounter, tmp_path, shuffle):
    """A row group larger than the memory for decoded row groups holds several of (here 20 MiB
    of columns under memory_limit=32M, which holds 16 MiB of them; a million rows of a kilobyte
    under the default 2G) used to be decoded again (`shuffle=none`, whose columns are not kept)
    or read whole from the cache again (`window`) for each few of its batches: an epoch of such
    row groups took minutes. Its columns are now kept and mapped: one decode, no reloads, every
    batch right."""
    src = tmp_path / "src"
    src.mkdir()
    rows, dim = 20_000, 256
    ids = np.arange(rows, dtype=np.int64)
    emb = tfs.fsl(np.repeat((ids % 977).astype(np.float32), dim), dim)
    pq.write_table(pa.table({"id": ids, "emb": emb}), src / "one.parquet", row_group_size=rows)
    m = mounter(src, f"shuffle={shuffle}", "batch_size=500", "memory_limit=32M")
    n = m.dataset()["batches_per_epoch"]
    seen = []
    for i in range(n):
        b = tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))
        assert np.array_equal(b["emb"], np.repeat((b["id"] % 977).astype(np.float32)[:, None], dim, axis=1)), i
        seen.append(b["id"])
    seen = np.concatenate(seen)
    assert np.array_equal(np.sort(seen), ids)
    if shuffle == "none":
        assert np.array_equal(seen, ids)
    st = tfs.stats(m)
    assert st["row_groups_decoded"] == 1, st
    assert st["column_hits"] <= 1, st
