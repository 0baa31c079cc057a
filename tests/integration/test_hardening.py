"""Hardening: many concurrent readers under eviction and a memory limit, the determinism matrix
(threads x prefetch x cache state x world_size x read order), two hosts, unmounting and SIGTERM
under readers, other users with and without allow_other, and bad input (malformed Parquet, odd
option bytes) that must be refused in one line and never panic."""

import ctypes
import errno
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs
from tfs import batch_name
from test_cache import cache_paths, data_size, flip_byte, log_tail, make_wide

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

RANK_REL = re.compile(r"^(epoch-\d+)/rank-(\d+)-of-(\d+)/(\d{6})(.*)$")


def global_rel(rel: str) -> str:
    """The global batch file a rank view's file maps to: rank R batch j = global R + j*W."""
    m = RANK_REL.match(rel)
    if not m:
        return rel
    epoch, r, w, j, rest = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
    return f"{epoch}/{batch_name(r + j * w)}{rest}"


def rank_files(m: tfs.Mount, epoch: int, world: int) -> list[str]:
    per_rank = m.dataset()["rank_batches_per_epoch"]
    return [rel for r in range(world) for rel in tfs.all_files(m, f"epoch-{epoch}/rank-{r}-of-{world}", per_rank)]


def the_daemon(m: tfs.Mount) -> int:
    pids = tfs.tensorfs_daemons(m)
    assert len(pids) == 1, f"expected one tensorfs daemon for {m.path}, found {pids}"
    return pids[0]


def proc_status(pid: int) -> dict[str, int]:
    """The kB fields (as bytes) and Threads of /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            parts = value.split()
            if key.startswith(("Vm", "Rss")) and len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
            elif key == "Threads":
                out[key] = int(parts[0])
    return out


def rss_bytes(pid: int) -> int:
    return proc_status(pid)["VmRSS"]


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def no_panic(text: str, what: str):
    assert "panicked" not in text, f"{what}: tensorfs panicked:\n{text[-3000:]}"


def refused_without_panic(proc: subprocess.CompletedProcess, what: str) -> str:
    """PROC must be a refusal in one line (tfs.error_line), and not a panic: no "panicked" in
    stderr, and not exit code 101, a Rust panic's (a panic hook may print nothing)."""
    no_panic(proc.stderr, what)
    assert proc.returncode != 101, f"{what}: tensorfs exited 101 (a Rust panic); stderr: {proc.stderr[-2000:]!r}"
    return tfs.error_line(proc)


def log_text(cache: Path) -> str:
    try:
        return (cache / "tensorfs.log").read_text(errors="replace")
    except OSError:
        return ""


def compare(got: dict[str, str], want: dict[str, str], what: str, cache: Path):
    """GOT (rel -> sha256, rank-view paths included) against WANT (global rel -> sha256)."""
    bad = sorted(rel for rel, h in got.items() if h != want[global_rel(rel)])
    assert not bad, f"{what}: {len(bad)} of {len(got)} files differ from the reference, e.g. {bad[:6]}\n{log_tail(cache)}"


# --------------------------------------------------------------------------------------------
# 1. 64 concurrent readers, eviction, memory_limit
# --------------------------------------------------------------------------------------------

BIG_BS = 500  # big_ds: 40 row groups x 500 rows, id + emb float32[256]: ~20 MiB decoded, 40 batches
W3 = 3
READERS = 64
MEMORY_LIMIT = 16 * 2**20
RSS_SLACK = 32 * 2**20


@pytest.fixture(scope="module")
def big_ds(tmp_path_factory) -> tfs.Dataset:
    return make_wide(tmp_path_factory.mktemp("big") / "data", row_groups=40, rg_rows=BIG_BS, dim=256)


def test_64_concurrent_readers_under_eviction_and_memory_limit(mounter, big_ds):
    content = ("shuffle=window", f"batch_size={BIG_BS}", "seed=11")
    listing = ("epochs=3", f"world_size={W3}")
    epochs = [0, 1, 2, 5]  # epoch-5 is not listed (epochs=3) but resolves by name

    # The reference: fresh cache, room for everything, read sequentially.
    ref = mounter(big_ds.path, *content, *listing, "cache_size=4G")
    n = ref.dataset()["batches_per_epoch"]
    assert ref.dataset()["rank_batches_per_epoch"] == n // W3
    global_rels = [rel for e in epochs for rel in tfs.all_files(ref, f"epoch-{e}", n)]
    want = {rel: tfs.sha256(ref.p(rel)) for rel in global_rels}
    pool = global_rels + [rel for e in epochs for rel in rank_files(ref, e, W3)]
    decoded = sum(p.stat().st_size for p in cache_paths(ref.cache, "cols-*/*.cols"))
    ref.unmount()
    assert decoded > MEMORY_LIMIT, f"the decoded dataset ({mib(decoded)}) must not fit memory_limit"
    limit_k = math.ceil(decoded / 3 / 1024)

    m = mounter(big_ds.path, *content, *listing, f"cache_size={limit_k}K", f"memory_limit={MEMORY_LIMIT // 2**20}M")
    pid = the_daemon(m)
    m.dataset()
    idle = 0
    for _ in range(5):
        idle = max(idle, rss_bytes(pid))
        time.sleep(0.05)

    # Every file of the pool at least once (dealt round robin), plus random extra files each.
    rng = random.Random(64)
    order = pool[:]
    rng.shuffle(order)
    plans = [order[k::READERS] + rng.sample(pool, 4) for k in range(READERS)]
    results: list[dict[str, str]] = [{} for _ in range(READERS)]
    errors: list[str] = []
    start = threading.Barrier(READERS + 1)
    done = threading.Event()
    peak = [0, 0, {}]  # max RSS, samples, /proc/PID/status at the max

    def reader(k):
        start.wait()
        for rel in plans[k]:
            try:
                results[k][rel] = tfs.sha256(m.p(rel))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"reader {k}: {rel}: {e!r}")

    def sampler():
        while not done.is_set():
            try:
                st = proc_status(pid)
            except (OSError, KeyError):
                return
            peak[1] += 1
            if st["VmRSS"] > peak[0]:
                peak[0], peak[2] = st["VmRSS"], st
            time.sleep(0.005)

    threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(READERS)]
    for t in threads:
        t.start()
    sam = threading.Thread(target=sampler, daemon=True)
    sam.start()
    t0 = time.monotonic()
    start.wait()
    for t in threads:
        t.join(timeout=120)
    elapsed = time.monotonic() - t0
    done.set()
    sam.join(timeout=5)
    hung = sum(t.is_alive() for t in threads)
    s = tfs.stats(m)
    reads = sum(len(p) for p in plans)
    print(
        f"{READERS} readers, {reads} reads of {len(pool)} files in {elapsed:.1f} s; decoded dataset {mib(decoded)}, "
        f"cache_size={limit_k}K, memory_limit={mib(MEMORY_LIMIT)}; RSS idle {mib(idle)}, max {mib(peak[0])} "
        f"({peak[1]} samples), bound {mib(idle + MEMORY_LIMIT + RSS_SLACK)}; "
        f"evictions={s['cache_evictions']}, cache_bytes={s['cache_bytes']}; at the max: "
        + ", ".join(f"{k} {v if k == 'Threads' else mib(v)}" for k, v in peak[2].items() if k.startswith(("Rss", "Threads")))
    )
    assert not hung, f"{hung} readers hung\n{log_tail(m.cache)}"
    assert not errors, f"{len(errors)} readers failed, e.g. {errors[:3]}\n{log_tail(m.cache)}"
    for k, got in enumerate(results):
        compare(got, want, f"reader {k}", m.cache)
    assert s["cache_evictions"] > 0, f"the cache never evicted: the test did not exercise eviction: {s}"
    # Walking the cache while prefetch still writes and evicts can count a file and its
    # replacement: measure once the counters stand still.
    tfs.idle(m)
    used = data_size(m.cache)
    assert used <= limit_k * 1024, f"{used} bytes cached > cache_size {limit_k}K ({tfs.stats(m)})"
    assert peak[1] > 0, "RSS was never sampled"
    assert peak[0] <= idle + MEMORY_LIMIT + RSS_SLACK, (
        f"daemon RSS reached {mib(peak[0])}: over idle {mib(idle)} + memory_limit {mib(MEMORY_LIMIT)} "
        f"+ {mib(RSS_SLACK)} slack"
    )
    no_panic(log_text(m.cache), "tensorfs.log")


SCHED_OTHER, SCHED_IDLE = 0, 5


def thread_policies(pid: int) -> dict[str, list[int]]:
    """The scheduling policy (field 41 of /proc/PID/task/TID/stat) of each thread, by name."""
    out: dict[str, list[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 on
        out.setdefault(name, []).append(int(fields[41 - 3]))
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="leaving SCHED_IDLE needs CAP_SYS_NICE")
def test_builders_yield_to_readers(mounter, shuf_ds):
    """Between reads, the transform workers are idle-class, so a woken reader or FUSE thread
    preempts any building at once; the threads that serve readers are ordinary."""
    m = mounter(shuf_ds.path, "shuffle=window", "batch_size=100", "threads=3")
    pid = the_daemon(m)
    # Builds batch 0 and, behind it, the prefetch of the next ones.
    assert len(m.p(f"epoch-0/{batch_name(0)}.safetensors").read_bytes()) > 4096
    policies = thread_policies(pid)
    workers = [p for name, ps in policies.items() if name.startswith("tensorfs-transf") for p in ps]
    assert workers == [SCHED_IDLE] * 3, policies
    fuse = [p for name, ps in policies.items() if name.startswith("fuser") for p in ps]
    assert fuse and set(fuse) == {SCHED_OTHER}, policies


# --------------------------------------------------------------------------------------------
# 2. The determinism matrix
# --------------------------------------------------------------------------------------------

MATRIX_CONTENT = ("shuffle=window", "shuffle_window=2", "batch_size=256", "seed=5")  # shuf_ds: 11 batches
MATRIX_EPOCHS = (0, 1)
FACTORS = {
    "threads": [1, 4],
    "prefetch": [0, 8],
    "cache": ["cold", "warm", "evicted", "corrupted"],
    "world_size": [None, 2],
    "order": ["forward", "reverse", "random"],
}


PAIRED = [("cache", "world_size"), ("cache", "threads"), ("cache", "prefetch")]


def sample_combinations(n=14, seed=20250611) -> list[dict]:
    """N distinct combinations in which every value of every factor appears (each factor's
    values repeated to length N, shuffled by a fixed seed, zipped), drawn again until every cache
    state also meets both values of world_size, threads and prefetch."""
    rng = random.Random(seed)
    for _ in range(10_000):
        columns = {}
        for name, values in FACTORS.items():
            col = [values[i % len(values)] for i in range(n)]
            rng.shuffle(col)
            columns[name] = col
        combos = [{name: columns[name][i] for name in FACTORS} for i in range(n)]
        distinct = len({tuple(c.values()) for c in combos}) == n
        pairs = all(
            {(c[a], c[b]) for c in combos} == {(x, y) for x in FACTORS[a] for y in FACTORS[b]} for a, b in PAIRED
        )
        if distinct and pairs:
            return combos
    raise AssertionError("no sample found")


COMBINATIONS = sample_combinations()


def combo_id(c: dict) -> str:
    w = c["world_size"] or "unset"
    return f"t{c['threads']}-p{c['prefetch']}-{c['cache']}-w{w}-{c['order']}"


@pytest.fixture(scope="module")
def matrix_ref(shuf_ds, tmp_path_factory) -> dict:
    """sha256 of every global batch file of epochs 0 and 1, keyed by its relative path (so one
    entry per (batch, tensor file) of each global batch), from a fresh mount read sequentially;
    and the size of everything the mount cached."""
    mounts = tfs.Mounter(tmp_path_factory.mktemp("matrix-ref") / "mnt")
    try:
        ref = mounts(shuf_ds.path, *MATRIX_CONTENT, "epochs=2", "cache_size=1G", "threads=1")
        n = ref.dataset()["batches_per_epoch"]
        rels = [rel for e in MATRIX_EPOCHS for rel in tfs.all_files(ref, f"epoch-{e}", n)]
        want = {rel: tfs.sha256(ref.p(rel)) for rel in rels}
        full = data_size(ref.cache)
        return {"want": want, "n": n, "full": full}
    finally:
        mounts.cleanup()


def read_all(m: tfs.Mount, rels: list[str]) -> dict[str, str]:
    return {rel: tfs.sha256(m.p(rel)) for rel in rels}


def matrix_files(m: tfs.Mount, n: int, world) -> list[str]:
    rels = [rel for e in MATRIX_EPOCHS for rel in tfs.all_files(m, f"epoch-{e}", n)]
    if world:
        rels += [rel for e in MATRIX_EPOCHS for rel in rank_files(m, e, world)]
    return rels


def corrupt_cache(cache: Path, seed: int) -> int:
    """Flip one byte at a random offset of every file under CACHE/v1/cols-* and batches-*
    (and any meta sidecars). Returns the number of files damaged."""
    rng = random.Random(seed)
    count = 0
    for top in cache_paths(cache, "cols-*") + cache_paths(cache, "batches-*"):
        for root, _, files in os.walk(top):
            for f in sorted(files):
                p = Path(root) / f
                size = p.stat().st_size
                if size:
                    flip_byte(p, rng.randrange(size))
                    count += 1
    return count


def test_sample_covers_every_factor_value():
    for name, values in FACTORS.items():
        assert {c[name] for c in COMBINATIONS} == set(values), name
    assert 12 <= len(COMBINATIONS) <= 16
    assert len({combo_id(c) for c in COMBINATIONS}) == len(COMBINATIONS)


@pytest.mark.parametrize("combo", COMBINATIONS, ids=[combo_id(c) for c in COMBINATIONS])
def test_determinism_matrix(mounter, shuf_ds, matrix_ref, combo):
    want, n = matrix_ref["want"], matrix_ref["n"]
    world = combo["world_size"]
    opts = [*MATRIX_CONTENT, "epochs=2", f"threads={combo['threads']}", f"prefetch={combo['prefetch']}"]
    if world:
        opts.append(f"world_size={world}")
    state = combo["cache"]
    if state == "evicted":
        limit_k = max(1, matrix_ref["full"] // 4 // 1024)
        opts.append(f"cache_size={limit_k}K")

    cache = None
    if state in ("warm", "corrupted"):
        first = mounter(shuf_ds.path, *opts)
        got = read_all(first, matrix_files(first, n, world))
        compare(got, want, f"{combo_id(combo)}: first mount", first.cache)
        first.unmount()
        cache = first.cache
        if state == "corrupted":
            damaged = corrupt_cache(cache, seed=len(got))
            assert damaged > 0, "nothing to corrupt under cols-*/batches-*"

    m = mounter(shuf_ds.path, *opts, cache=cache)
    rels = matrix_files(m, n, world)
    if combo["order"] == "reverse":
        rels.reverse()
    elif combo["order"] == "random":
        random.Random(7).shuffle(rels)
    got = read_all(m, rels)
    compare(got, want, combo_id(combo), m.cache)
    s = tfs.stats(m)
    print(f"{combo_id(combo)}: {len(got)} files; decoded={s['row_groups_decoded']} "
          f"corrupt_dropped={s['cache_corrupt_dropped']} evictions={s['cache_evictions']}")
    if state == "warm":
        # A shuffled epoch's batches are gathered again from the cached columns (their files
        # were read once, from the page cache): nothing decoded or fetched.
        assert s["row_groups_decoded"] == 0 and s["remote_bytes"] == 0, f"a warm remount decoded: {s}"
    if state == "corrupted":
        assert s["cache_corrupt_dropped"] > 0, f"no corrupted entry was detected: {s}"
    if state == "evicted":
        assert s["cache_evictions"] > 0, f"cache_size={limit_k}K never evicted: {s}"


def test_two_hosts_give_the_same_bytes(mounter, shuf_ds, matrix_ref):
    """Two mounts at once, each with its own cache dir, read concurrently in opposite orders."""
    want, n = matrix_ref["want"], matrix_ref["n"]
    hosts = [
        mounter(shuf_ds.path, *MATRIX_CONTENT, "epochs=2", "world_size=2", "threads=1", "prefetch=0"),
        mounter(shuf_ds.path, *MATRIX_CONTENT, "epochs=2", "world_size=2", "threads=4", "prefetch=8"),
    ]
    assert hosts[0].cache != hosts[1].cache
    rels = matrix_files(hosts[0], n, 2)
    results, errors = [{}, {}], []

    def reader(k):
        order = rels[::-1] if k else rels
        try:
            results[k] = read_all(hosts[k], order)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"host {k}: {e!r}")

    threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a reader hung"
    diff = sorted(rel for rel in rels if results[0][rel] != results[1][rel])
    assert not diff, f"the two hosts differ on {len(diff)} files, e.g. {diff[:6]}"
    assert hosts[0].dataset()["fingerprint"] == hosts[1].dataset()["fingerprint"]
    compare(results[0], want, "host 0", hosts[0].cache)


# --------------------------------------------------------------------------------------------
# 3. Lifecycle: umount with a file open, SIGTERM under readers
# --------------------------------------------------------------------------------------------

MNT_DETACH = 2


def umount2(path, flags: int) -> int:
    """umount2(2): 0, or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(str(path)), flags) == 0:
        return 0
    return ctypes.get_errno()


@pytest.mark.parametrize("passthrough", ["auto", "off"])
def test_umount_while_a_file_is_open(mounter, shuf_ds, passthrough):
    opts = ("shuffle=window", "batch_size=256", f"passthrough={passthrough}")
    ref = mounter(shuf_ds.path, *opts)
    rel = "epoch-0/000003.safetensors"
    want = tfs.read_exact(ref.p(rel))
    m = mounter(shuf_ds.path, *opts)
    pids = tfs.tensorfs_daemons(m)
    fd = os.open(m.p(rel), os.O_RDONLY)
    closed = False
    try:
        got = os.pread(fd, 4096, 0)
        assert got == want[:4096]

        if os.geteuid() == 0:
            err = umount2(m.path, 0)
            assert err == errno.EBUSY, f"umount of a mount with an open file: {os.strerror(err) if err else 'succeeded'}"
            assert tfs.is_mounted(m.path)
            assert umount2(m.path, MNT_DETACH) == 0, "umount -l failed"
        else:
            busy = subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True, text=True, timeout=30)
            assert busy.returncode != 0 and "busy" in busy.stderr.lower(), busy.stderr
            assert tfs.is_mounted(m.path)
            subprocess.run(["fusermount3", "-u", "-z", str(m.path)], check=True, capture_output=True, timeout=30)
        assert not tfs.is_mounted(m.path), "umount -l left the mount in place"

        # The open descriptor: the right bytes, or an error; never wrong bytes, never a silent EOF.
        error = None
        while len(got) < len(want):
            try:
                chunk = os.pread(fd, 8192, len(got))
            except OSError as e:
                error = e
                break
            if not chunk:
                break
            got += chunk
        assert got == want[: len(got)], f"read wrong bytes after umount -l (at or after byte {len(got)})"
        assert len(got) == len(want) or error is not None, (
            f"end of file after {len(got)} of {len(want)} bytes, without an error"
        )
        print(f"passthrough={passthrough}: read {len(got)} of {len(want)} bytes after umount -l; error: {error!r}; "
              f"daemon alive while open: {[tfs.alive(p) for p in pids]}")
        os.close(fd)
        closed = True
        left = tfs.wait_exited(pids, 10)
        assert left == [], f"daemon {left} still running 10 s after the last close\n{log_tail(m.cache)}"
    finally:
        if not closed:
            os.close(fd)
    no_panic(log_text(m.cache), "tensorfs.log")


def test_sigterm_during_reads(mounter, shuf_ds):
    base = ("shuffle=window", "batch_size=64", "epochs=4", "passthrough=off")
    m = mounter(shuf_ds.path, *base)
    n = m.dataset()["batches_per_epoch"]
    rels = [rel for e in range(4) for rel in tfs.all_files(m, f"epoch-{e}", n)]
    pids = tfs.tensorfs_daemons(m)
    done: dict[str, str] = {}
    errors: list[OSError] = []

    def reader():
        for rel in rels:
            try:
                done[rel] = tfs.sha256(m.p(rel))
            except OSError as e:
                errors.append(e)
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while len(done) < 40 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert t.is_alive(), f"the reader finished ({len(done)} of {len(rels)} files) before SIGTERM"
    at_signal = len(done)
    t0 = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    while tfs.is_mounted(m.path) and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    unmounted_after = time.monotonic() - t0
    left = tfs.wait_exited(pids, max(0.1, 5 - unmounted_after))
    exited_after = time.monotonic() - t0
    t.join(timeout=20)
    leftovers = sorted(os.listdir(m.cache / "v1" / "tmp")) if (m.cache / "v1" / "tmp").is_dir() else []
    print(f"SIGTERM after {at_signal} of {len(rels)} files (read in all: {len(done)}): unmounted after {unmounted_after:.2f} s, "
          f"daemon exited after {exited_after:.2f} s; reader error {errors[:1]}; tmp/ before remount: {leftovers}")
    assert not tfs.is_mounted(m.path), f"still mounted 5 s after SIGTERM\n{log_tail(m.cache)}"
    assert left == [], f"daemon {left} still running 5 s after SIGTERM\n{log_tail(m.cache)}"
    assert not t.is_alive(), "the reader hung after SIGTERM"
    no_panic(log_text(m.cache), "tensorfs.log")

    b = mounter(shuf_ds.path, *base, cache=m.cache)
    tmp = b.cache / "v1" / "tmp"
    deadline = time.monotonic() + 5
    while tmp.is_dir() and os.listdir(tmp) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (tmp.is_dir() and os.listdir(tmp)), f"temp files left after a remount: {os.listdir(tmp)}"
    want = read_all(b, rels)
    wrong = sorted(rel for rel, h in done.items() if want[rel] != h)
    assert not wrong, f"files read before SIGTERM differ from the remount's: {wrong[:6]}"
    fresh = mounter(shuf_ds.path, *base)
    compare(want, read_all(fresh, rels), "remount after SIGTERM", b.cache)


# --------------------------------------------------------------------------------------------
# 4. Other users
# --------------------------------------------------------------------------------------------

NOBODY = 65534
CHILD = r"""
import hashlib, json, os, sys
out = {}
try:
    out["list"] = sorted(os.listdir(sys.argv[1]))
except OSError as e:
    out["list_errno"] = e.errno
try:
    with open(sys.argv[2], "rb") as f:
        out["sha256"] = hashlib.sha256(f.read()).hexdigest()
except OSError as e:
    out["read_errno"] = e.errno
print(json.dumps(out))
"""


def as_nobody(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, **kw,
    )


def python_for_nobody() -> str | None:
    seen = set()
    for cand in ("/usr/bin/python3", shutil.which("python3"), sys.executable):
        if not cand or cand in seen:
            continue
        seen.add(cand)
        try:
            if as_nobody([cand, "-c", "pass"]).returncode == 0:
                return cand
        except OSError:
            continue
    return None


@pytest.fixture
def open_dir():
    """A fresh directory every user can traverse (mkdtemp, mode 0711), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="tensorfs-perm-"))
    os.chmod(d, 0o711)
    for parent in d.parents:
        if not os.stat(parent).st_mode & 0o001:
            shutil.rmtree(d)
            pytest.skip(f"{parent} is not traversable by other users")
    yield d
    for sub in d.iterdir():
        if sub.is_dir() and tfs.is_mounted(sub):
            tfs.unmount(sub)
    if not any(tfs.is_mounted(p) for p in d.iterdir()):
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a reader as another user needs root")
def test_other_users_need_allow_other(mounter, shuf_ds, open_dir):
    py = python_for_nobody()
    if py is None:
        pytest.skip("no python3 that user 65534 can run")
    own = tfs.Mounter(open_dir)
    try:
        cases = [("plain", ("auto_unmount=off",), False), ("allow_other", ("allow_other",), True)]
        if shutil.which("fusermount3"):
            # fusermount3 makes the kernel admit every user; the daemon must then refuse them.
            cases.append(("auto_unmount", ("auto_unmount",), False))
        rel = "epoch-0/000001.safetensors"
        for name, extra, admitted in cases:
            m = own(shuf_ds.path, "batch_size=256", *extra, name=name)
            mounter.mounts.append(m)  # the watchdog and teardown know it too
            listing, want = sorted(os.listdir(m.path)), tfs.sha256(m.p(rel))
            proc = as_nobody([py, "-c", CHILD, str(m.path), str(m.p(rel))])
            assert proc.returncode == 0, proc.stderr
            out = json.loads(proc.stdout)
            print(f"{name}: user {NOBODY} got {out}")
            if admitted:
                assert out.get("list") == listing, out
                assert out.get("sha256") == want, out
            else:
                assert out.get("list_errno") in (errno.EACCES, errno.EPERM), f"{name}: listing as user {NOBODY}: {out}"
                assert out.get("read_errno") in (errno.EACCES, errno.EPERM), f"{name}: reading as user {NOBODY}: {out}"
            m.unmount()
    finally:
        own.cleanup()


# --------------------------------------------------------------------------------------------
# 5. Bad input never panics
# --------------------------------------------------------------------------------------------


def run_bytes(args, timeout=60) -> subprocess.CompletedProcess:
    """tensorfs with ARGS (str or bytes each; bytes pass non-UTF-8 through as they are)."""
    argv = [os.fsencode(str(tfs.BIN))] + [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=timeout)


def good_table(n=600) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids / 2).astype(np.float32)})


def footer_span(raw: bytes) -> tuple[int, int]:
    """[start, end) of the thrift footer of a Parquet file."""
    flen = int.from_bytes(raw[-8:-4], "little")
    return len(raw) - 8 - flen, len(raw) - 8


def pyarrow_rejects(path: Path) -> bool:
    try:
        pq.read_metadata(path)
        pq.read_table(path)
    except Exception:  # noqa: BLE001 - any failure means malformed to pyarrow
        return True
    return False


@pytest.fixture(scope="module")
def malformed(tmp_path_factory) -> dict[str, Path]:
    """Case name -> a dataset directory holding good.parquet and one malformed bad.parquet."""
    base = tmp_path_factory.mktemp("malformed")
    good = base / "good.parquet"
    pq.write_table(good_table(), good, row_group_size=200)
    real = good.read_bytes()
    bad: dict[str, bytes] = {}
    rng = random.Random(99)
    for k in range(3):  # random bytes between magics, with a random footer length
        bad[f"random-{k}"] = b"PAR1" + rng.randbytes(4000 + k * 777) + b"PAR1"
    for k in range(3):  # random bytes as a footer of a plausible length, so the thrift decoder runs
        body = rng.randbytes(3000)
        flen = 200 + 300 * k
        bad[f"random-footer-{k}"] = b"PAR1" + body + flen.to_bytes(4, "little") + b"PAR1"
    bad["truncated"] = real[: len(real) // 2]
    bad["truncated-footer"] = real[: footer_span(real)[0] + (footer_span(real)[1] - footer_span(real)[0]) // 2] + real[-8:]
    start, end = footer_span(real)
    found = 0
    for frac in (0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9):
        if found == 4:
            break
        data = bytearray(real)
        at = start + int((end - start) * frac)
        for i in range(at, min(at + 6, end)):
            data[i] ^= 0xFF
        probe = base / "probe.parquet"
        probe.write_bytes(bytes(data))
        if pyarrow_rejects(probe):
            bad[f"footer-flip-{int(frac * 100)}"] = bytes(data)
            found += 1
    assert found >= 2, "could not make a footer that pyarrow rejects"
    out = {}
    for name, data in bad.items():
        d = base / name
        d.mkdir()
        shutil.copy(good, d / "a-good.parquet")
        (d / "b-bad.parquet").write_bytes(data)
        out[name] = d
    return out


MALFORMED_CASES = ["random-0", "random-1", "random-2", "random-footer-0", "random-footer-1", "random-footer-2",
                   "truncated", "truncated-footer", "footer-flips"]


@pytest.mark.parametrize("case", MALFORMED_CASES)
def test_malformed_parquet_is_refused_without_panic(mounter, malformed, case):
    dirs = [d for name, d in malformed.items() if name == case or (case == "footer-flips" and name.startswith("footer-flip-"))]
    assert dirs, case
    for src in dirs:
        mnt = mounter.mountpoint()
        cache = mnt.parent / f"{mnt.name}-cache"
        proc = run_bytes(["mount", src, mnt, "-o", f"batch_size=64,cache_dir={cache}"])
        no_panic(log_text(cache), f"mount {src.name}: tensorfs.log")
        line = refused_without_panic(proc, f"mount {src.name}")
        assert "b-bad.parquet" in line, f"{src.name}: the error does not name the file: {line}"
        assert not tfs.is_mounted(mnt), f"{src.name}: left mounted"
        assert os.listdir(mnt) == []
        insp = run_bytes(["inspect", src, "-o", "batch_size=64"])
        assert "b-bad.parquet" in refused_without_panic(insp, f"inspect {src.name}")


def _huge(n=10_000) -> str:
    return "9" * n


BAD_OPTION_STRINGS = [
    ("=", None),
    ("==", None),
    ("=batch_size", None),
    (",,,batch_size=0,,,", "batch_size"),
    ("batch_size=", "batch_size"),
    ("batch_size==64", "batch_size"),
    ("batch_size=" + _huge(), "batch_size"),
    ("memory_limit=" + _huge() + "M", "memory_limit"),
    ("columns=" + "a" * 10_000, None),
    ("seed=" + _huge(), "seed"),
    ("x" * 10_000 + "=1", None),
    (os.fsencode("batch_size=\udcff"), None),  # non-UTF-8 bytes, as os.fsencode writes surrogates
    (os.fsencode("\udcff\udcfe"), None),
    (os.fsencode("columns=id:\udcc3("), None),
]


@pytest.mark.parametrize("opt,name", BAD_OPTION_STRINGS, ids=[f"opt{i}" for i in range(len(BAD_OPTION_STRINGS))])
def test_odd_option_strings_are_refused_without_panic(mounter, shuf_ds, opt, name):
    mnt = mounter.mountpoint()
    cache = mnt.parent / f"{mnt.name}-cache"
    proc = run_bytes(["mount", shuf_ds.path, mnt, "-o", opt, "-o", f"cache_dir={cache}"])
    shown = opt[:60]
    line = refused_without_panic(proc, f"-o {shown!r}")
    if name:
        assert name in line, f"-o {shown!r}: the error does not name {name}: {line[:200]}"
    assert not tfs.is_mounted(mnt), f"-o {shown!r}: left mounted"


def test_odd_paths_are_refused_without_panic(mounter, shuf_ds):
    """A source and a mount point whose names are not UTF-8: refused in one line (they do not
    exist), or for the mount point, mounted; never a panic."""
    mnt = mounter.mountpoint()
    cache = mnt.parent / f"{mnt.name}-cache"
    missing = os.fsencode(str(shuf_ds.path.parent)) + b"/no-such-\xff\xfe"
    proc = run_bytes(["mount", missing, mnt, "-o", f"cache_dir={cache}"])
    assert "no-such-" in refused_without_panic(proc, "a non-UTF-8 source")
    assert not tfs.is_mounted(mnt)
    proc = run_bytes(["mount", shuf_ds.path, os.fsencode(str(mnt)) + b"-\xff-missing", "-o", f"cache_dir={cache}"])
    refused_without_panic(proc, "a non-UTF-8 mount point")


def test_empty_option_items_are_skipped(mounter, shuf_ds):
    """`-o ,,,` holds only empty items: like mount(8), tensorfs skips them and mounts."""
    m = mounter(shuf_ds.path, ",,,", "batch_size=128", ",", split=True)
    assert m.dataset()["batch_size"] == 128


def test_a_corrupt_page_is_eio_with_a_log_line_naming_the_column(mounter, tmp_path):
    """A column chunk whose pages are garbage, under a footer that is fine: found only while
    building a batch, so EIO for that read, and a log line at the default level naming the
    object, the row group, the column and the cause. The other row group still serves."""
    src = tmp_path / "src"
    src.mkdir()
    path = src / "corrupt.parquet"
    t = pa.table({"a": np.arange(2000, dtype=np.int64), "b": np.linspace(0, 1, 2000)})
    pq.write_table(t, path, compression="snappy", use_dictionary=False, row_group_size=1000)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(1)
    raw = bytearray(path.read_bytes())
    start = chunk.data_page_offset
    raw[start:start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    path.write_bytes(bytes(raw))

    m = mounter(src, "batch_size=1000", "shuffle=none", "prefetch=0")
    first = tfs.load_safetensors(m.p("epoch-0", "000000.safetensors"))
    assert np.array_equal(first["a"], np.arange(1000))
    with pytest.raises(OSError) as e:
        tfs.read_exact(m.p("epoch-0", "000001.safetensors"))
    assert e.value.errno == errno.EIO
    lines = [ln for ln in log_text(m.cache).splitlines() if " ERROR " in ln]
    assert lines, log_tail(m.cache)
    assert "file 'corrupt.parquet' row group 1 column 'b' cannot be read:" in lines[-1], lines[-1]
    assert tfs.is_mounted(m.path)


MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")


@pytest.fixture
def few_mappings():
    """The kernel's limit on mappings per process (`vm.max_map_count`) lowered to 3000 for the
    test, so that a dataset of a few thousand row groups goes past it; restored after."""
    before = MAX_MAP_COUNT.read_text()
    try:
        MAX_MAP_COUNT.write_text("3000")
    except OSError as e:
        pytest.skip(f"vm.max_map_count cannot be lowered here: {e}")
    try:
        yield 3000
    finally:
        MAX_MAP_COUNT.write_text(before)


def test_global_shuffle_over_more_row_groups_than_a_process_may_map(mounter, tmp_path, few_mappings):
    """`shuffle=global` maps the cached columns of every row group (each batch gathers from all
    of them). A dataset of more row groups than the process may hold mappings used to have its
    maps refused (the cached columns dropped as "missing") and then an allocation fail, which
    aborted the daemon. Now at most half the limit are held mapped, the rest let go and mapped
    again when needed: every epoch is served, a permutation of the rows, the mount stays up."""
    src = tmp_path / "src"
    src.mkdir()
    per_rg, rgs_per_file, files = 5, 100, 36  # 3,600 row groups of 80 KB of columns each
    for f in range(files):
        ids = np.arange(f * per_rg * rgs_per_file, (f + 1) * per_rg * rgs_per_file, dtype=np.int64)
        emb = tfs.fsl(np.repeat(ids, 4096).astype(np.float32), 4096)
        pq.write_table(pa.table({"id": ids, "emb": emb}), src / f"part-{f:03d}.parquet", row_group_size=per_rg)
    rows = per_rg * rgs_per_file * files
    m = mounter(src, "shuffle=global", "batch_size=200", "epochs=2")
    pid = the_daemon(m)
    n = m.dataset()["batches_per_epoch"]
    most_maps = 0
    for e in range(2):
        ids = []
        for i in range(n):
            batch = tfs.load_safetensors(m.p(f"epoch-{e}", batch_name(i) + ".safetensors"))
            assert np.array_equal(batch["emb"][:, 0], batch["id"].astype(np.float32)), (e, i)
            ids.append(batch["id"])
            most_maps = max(most_maps, len(Path(f"/proc/{pid}/maps").read_text().splitlines()))
        assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(rows)), f"epoch {e} is not a permutation"
    assert most_maps < few_mappings, most_maps
    assert tfs.is_mounted(m.path) and tfs.alive(pid)
    assert " missing" not in log_text(m.cache), log_tail(m.cache)


@pytest.mark.parametrize("daemon_hard", ["above", "256"])
def test_readers_may_hold_more_files_open_than_the_daemons_soft_limit(mounter, tmp_path, daemon_hard):
    """The daemon holds a file for each open of a materialised file. Started with a soft limit
    on open files of 256 under a higher hard limit, it raises its soft limit to the hard one, so
    a reader holding 700 batch files of the cache open gets each from the cache. Where both
    limits are then lowered to 256, the opens past them are served from memory, right: no cache
    file is dropped as if corrupt (EMFILE used to drop valid cache files, which were then built
    again), and one log line says why."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit on open files is {hard}")
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": np.arange(6000, dtype=np.int64)}), src / "ids.parquet")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        m = mounter(src, "batch_size=8", "shuffle=none", "prefetch=0")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    daemon = the_daemon(m)
    limits = Path(f"/proc/{daemon}/limits").read_text()
    daemon_soft, daemon_hard_now = re.search(r"Max open files\s+(\S+)\s+(\S+)", limits).groups()
    assert daemon_soft == daemon_hard_now, limits
    for i in range(700):  # every file materialised in the cache first
        tfs.read_exact(m.p("epoch-0", batch_name(i) + ".safetensors"))
    if daemon_hard == "256":
        resource.prlimit(daemon, resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = []
    try:
        for i in range(700):
            held.append(os.open(m.p("epoch-0", batch_name(i) + ".safetensors"), os.O_RDONLY))
            raw = os.pread(held[-1], 1 << 16, 0)
            header = tfs.parse_safetensors_header(raw)
            start = 8 + int.from_bytes(raw[:8], "little")
            ids = np.frombuffer(raw[start + header["id"]["data_offsets"][0]:][:64], dtype=np.int64)
            assert np.array_equal(ids, np.arange(8 * i, 8 * i + 8)), i
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert tfs.stats(m)["cache_corrupt_dropped"] == 0, log_tail(m.cache)
    log = log_text(m.cache)
    assert "dropped" not in log, log_tail(m.cache)
    short = log.count("cache files cannot be opened or read (Too many open files")
    assert short == (daemon_hard == "256"), log_tail(m.cache)


@pytest.mark.parametrize("change", ["truncate", "rewrite", "remove"])
def test_a_cache_file_changed_under_the_mount_never_kills_it(mounter, big_ds, tmp_path, change):
    """Another process (or a disk error, a full disk) changes the columns files the daemon has
    mapped: reads fall back to the source and serve the same bytes; the mount stays up."""
    opts = ("epochs=5", f"batch_size={BIG_BS}")
    cache = tmp_path / "cache"
    first = mounter(big_ds.path, *opts, cache=cache)
    names = [t["name"] for t in first.dataset()["tensors"]]
    for name in names:
        np.load(first.p("epoch-0", "all", f"{name}.npy"))
    first.unmount()
    # A mount that finds the columns cached maps them (the default shuffle gathers each batch
    # from many row groups), and holds the mappings while it reads an epoch no file was built
    # ahead for.
    m = mounter(big_ds.path, *opts, cache=cache)
    fresh = mounter(big_ds.path, *opts)
    for name in names:
        np.load(m.p("epoch-3", "all", f"{name}.npy"))
    assert tfs.stats(m)["column_hits"] > 0, tfs.stats(m)
    cols = sorted(m.cache.rglob("*.cols"))
    assert cols, "the epoch's columns are cached"
    for p in cols:
        size = p.stat().st_size
        if change == "truncate":
            os.truncate(p, size // 3)
        elif change == "rewrite":
            with open(p, "r+b") as f:
                f.write(b"\xff" * (size // 2))
        else:
            p.unlink()
    # Epoch 2: nothing of it was built or gathered before the change.
    for epoch in (2, 4):
        for name in names:
            got = np.load(m.p(f"epoch-{epoch}", "all", f"{name}.npy"))
            want = np.load(fresh.p(f"epoch-{epoch}", "all", f"{name}.npy"))
            np.testing.assert_array_equal(got, want, err_msg=f"epoch {epoch} {name}")
        n = m.dataset()["batches_per_epoch"]
        assert tfs.batch_hashes(m, [f"epoch-{epoch}"], n) == tfs.batch_hashes(fresh, [f"epoch-{epoch}"], n)
    assert tfs.is_mounted(m.path) and all(tfs.alive(p) for p in m.pids), "the daemon died"
    if change != "remove":
        # Changed bytes are never used: the files are dropped and decoded again. A removed
        # file's mapping still holds its bytes (its inode lives while mapped), which are used on.
        assert tfs.stats(m)["cache_corrupt_dropped"] > 0
