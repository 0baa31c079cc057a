"""Helpers for the tensorfs integration tests: running the binary, mounting and unmounting,
writing Parquet datasets with pyarrow and computing the reference tensors with numpy, and
checking batch files byte for byte.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import safetensors.numpy as stn

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TENSORFS_BIN") or REPO / "target" / "debug" / "tensorfs")
DATA_OFFSET = 4096
ERROR_PREFIX = "tensorfs: error: "

ST_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
}


def require(module: str, why: str):
    """A reference package the test compares with: skipped where it is missing, except where CI
    runs (CI is set), whose setup installs it: there its absence fails the test, so that a
    comparison never passes as a skip."""
    import importlib

    import pytest

    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=why)


# --------------------------------------------------------------------------------------------
# Running tensorfs, mounting, unmounting
# --------------------------------------------------------------------------------------------


def run(args, timeout=120, **kw) -> subprocess.CompletedProcess:
    """Run tensorfs with ARGS; stdout/stderr captured as text."""
    return subprocess.run(
        [str(BIN), *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def _unescape_mount_field(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def canonical(path) -> str:
    """The path as /proc/self/mounts shows it, without touching the (maybe FUSE) path itself."""
    p = Path(path)
    return os.path.join(os.path.realpath(p.parent), p.name)


def mounted_paths() -> set[str]:
    out = set()
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                out.add(_unescape_mount_field(parts[1]))
    return out


def mount_options(path) -> list[str]:
    """The kernel's options for the mount at PATH, from /proc/self/mounts."""
    want, opts = canonical(path), []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and _unescape_mount_field(parts[1]) == want:
                opts = parts[3].split(",")
    return opts


def is_mounted(path) -> bool:
    return canonical(path) in mounted_paths()


def unmount(path) -> None:
    """Unmount PATH: umount, then fusermount3 -u, then a lazy umount as the last resort."""
    gc.collect()  # drop numpy memmaps that still hold the mount busy
    for cmd in (["umount", str(path)], ["fusermount3", "-u", str(path)], ["umount", "-l", str(path)]):
        if not is_mounted(path):
            return
        try:
            subprocess.run(cmd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for _ in range(20):
            if not is_mounted(path):
                return
            time.sleep(0.05)


def daemon_pids(mountpoint) -> list[int]:
    """Processes (other than this one) whose command line names MOUNTPOINT and are not zombies."""
    want = {str(mountpoint), canonical(mountpoint)}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in ("Z", "X"):
            continue
        if any(a.rstrip("/") in want for a in argv):
            pids.append(int(entry))
    return pids


def tensorfs_daemons(m: "Mount") -> list[int]:
    """The tensorfs processes serving mount M (never the fusermount3 that auto_unmount keeps
    beside it, whose command line names the mount point too)."""
    out = []
    for pid in daemon_pids(m.path):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "tensorfs":
                    out.append(pid)
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_exited(pids, timeout) -> list[int]:
    """Wait until none of PIDS is alive; return those still alive after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """Assert PROC is a refusal in the documented form and return its one error line."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, (
        f"expected exit code 1, got {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    )
    assert len(lines) == 1, f"expected exactly one non-empty stderr line, got {len(lines)}:\n{proc.stderr}"
    assert lines[0].startswith(ERROR_PREFIX), f"stderr line does not start with {ERROR_PREFIX!r}: {lines[0]!r}"
    return lines[0]


def refused_mount(mounter, source, *options) -> str:
    """Mounts SOURCE with OPTIONS (and a cache beside the mount point of its own), expecting a
    refusal: its one error line; nothing left mounted."""
    mnt = mounter.mountpoint()
    opts = ",".join([*options, f"cache_dir={mnt.parent / (mnt.name + '-cache')}"])
    proc = run(["mount", source, mnt, "-o", opts])
    line = error_line(proc)
    assert not is_mounted(mnt), line
    return line


@dataclass
class Mount:
    path: Path
    source: str
    options: list[str]
    cache: Path
    pids: list[int] = field(default_factory=list)  # the daemon, found by its command line

    def p(self, *parts) -> Path:
        return self.path.joinpath(*map(str, parts))

    def dataset(self) -> dict:
        return json.loads(read_exact(self.p("dataset.json")))

    def unmount(self, wait=True) -> None:
        """Unmount; with WAIT, also wait (up to 15 s) for the daemon to exit."""
        unmount(self.path)
        if wait:
            wait_exited(self.pids, 15)


class Mounter:
    """Mounts datasets under a per-test directory; everything is unmounted at teardown."""

    def __init__(self, base: Path):
        self.base = base
        self.mounts: list[Mount] = []
        self.count = 0

    def _fresh(self, name):
        self.count += 1
        mnt = self.base / f"{name}-{self.count}"
        cache = self.base / f"cache-{self.count}"
        mnt.mkdir(parents=True)
        return mnt, cache

    def __call__(self, source, *options, form="mount", split=False, name="mnt", cache=None) -> Mount:
        """Mount SOURCE with OPTIONS (each 'k=v' or a flag) plus a private cache_dir.

        form="mount": `tensorfs mount SRC MNT -o ...`; form="helper": `tensorfs SRC MNT -o ...`.
        split=True passes each option as its own -o. CACHE: reuse that cache directory.
        """
        mnt, fresh_cache = self._fresh(name)
        cache = cache or fresh_cache
        opts = [*options, f"cache_dir={cache}"]
        if split:
            oargs = [a for o in opts for a in ("-o", o)]
        else:
            oargs = ["-o", ",".join(opts)]
        args = (["mount"] if form == "mount" else []) + [str(source), str(mnt), *oargs]
        # Output goes to files, not pipes: a daemon that kept our pipes open would hang the test
        # in communicate(); test_cli checks that separately.
        out, err = mnt.parent / f"{mnt.name}.stdout", mnt.parent / f"{mnt.name}.stderr"
        with open(out, "w") as fo, open(err, "w") as fe:
            rc = subprocess.run(
                [str(BIN), *args], stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, timeout=120
            ).returncode
        m = Mount(mnt, str(source), opts, cache)
        self.mounts.append(m)
        assert rc == 0, f"tensorfs {' '.join(args)} exited {rc}:\n{err.read_text()}"
        assert is_mounted(mnt), f"tensorfs mount returned 0 but {mnt} is not mounted"
        m.pids = daemon_pids(mnt)
        return m

    def mountpoint(self, name="mp") -> Path:
        """A fresh empty directory, for commands expected to refuse."""
        mnt, _ = self._fresh(name)
        return mnt

    def cleanup(self):
        for m in reversed(self.mounts):
            m.unmount(wait=False)
        wait_exited([p for m in self.mounts for p in m.pids], 15)
        gc.collect()
        for d in self.base.iterdir() if self.base.exists() else ():
            if d.is_dir() and is_mounted(d):
                unmount(d)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_exact(path) -> bytes:
    """stat, then read: the size stat reports must be the number of bytes read."""
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == size, f"{path}: stat says {size} bytes, read gave {len(data)}"
    return data


def sha256(path) -> str:
    return hashlib.sha256(read_exact(path)).hexdigest()


def batch_name(i: int) -> str:
    return f"{i:06d}"


def load_safetensors(path) -> dict[str, np.ndarray]:
    return stn.load_file(str(path))


def concatenated(m: "Mount", rel_dir: str, n: int, tensors=("id", "x")) -> bytes:
    """The data of the directory's batch files, tensor by tensor: what its all files hold."""
    got = [load_safetensors(m.p(rel_dir, batch_name(i) + ".safetensors")) for i in range(n)]
    return b"".join(np.concatenate([b[t] for b in got]).tobytes() for t in tensors)


def wait_ahead_built(m: "Mount", at_least: int) -> dict:
    """The mount's stats once AT_LEAST one-open files were built ahead (or 60 s passed)."""
    deadline = time.monotonic() + 60
    while True:
        s = stats(m)
        if s["ahead_files_built"] >= at_least or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def parse_safetensors_header(raw: bytes) -> dict:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n])


def assert_array(actual: np.ndarray, expected: np.ndarray, what: str):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    if actual.tobytes() != expected.tobytes():
        a = actual.reshape(len(actual), -1) if actual.ndim else actual
        e = expected.reshape(len(expected), -1) if expected.ndim else expected
        bad = [i for i in range(len(a)) if a[i].tobytes() != e[i].tobytes()][:5]
        raise AssertionError(
            f"{what}: values differ, first bad rows {bad}: got {[a[i] for i in bad]}, expected {[e[i] for i in bad]}"
        )


def check_batch(mnt: Mount, rel_dir: str, i: int, expected: dict[str, np.ndarray]):
    """Batch I under REL_DIR (e.g. 'epoch-0') must hold exactly EXPECTED, in both formats,
    through every reader: raw bytes at offset 4096, safetensors.numpy, np.load, np.load(mmap)."""
    name = batch_name(i)

    # --- safetensors -------------------------------------------------------------------------
    st_path = mnt.p(rel_dir, name + ".safetensors")
    raw = read_exact(st_path)
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert 8 + hlen == DATA_OFFSET, f"{st_path}: header length {hlen}, data must start at {DATA_OFFSET}"
    header = parse_safetensors_header(raw)
    header.pop("__metadata__", None)
    assert set(header) == set(expected), f"{st_path}: tensors {sorted(header)}, expected {sorted(expected)}"
    total = 0
    for tname, exp in expected.items():
        h = header[tname]
        assert h["dtype"] == ST_DTYPES[exp.dtype.name], f"{st_path}:{tname} dtype {h['dtype']}"
        assert list(h["shape"]) == list(exp.shape), f"{st_path}:{tname} shape {h['shape']} != {exp.shape}"
        s, e = h["data_offsets"]
        assert raw[DATA_OFFSET + s : DATA_OFFSET + e] == exp.tobytes(), f"{st_path}:{tname}: raw bytes differ"
        total += e - s
    assert len(raw) - DATA_OFFSET == total, f"{st_path}: data buffer is {len(raw) - DATA_OFFSET} bytes, tensors {total}"
    loaded = load_safetensors(st_path)
    for tname, exp in expected.items():
        assert_array(loaded[tname], exp, f"{st_path}:{tname}")

    # --- npy -----------------------------------------------------------------------------------
    bdir = mnt.p(rel_dir, name)
    assert sorted(os.listdir(bdir)) == sorted(t + ".npy" for t in expected), f"{bdir}: {sorted(os.listdir(bdir))}"
    for tname, exp in expected.items():
        npy = bdir / f"{tname}.npy"
        raw = read_exact(npy)
        assert raw[:6] == b"\x93NUMPY", f"{npy}: not an npy file"
        assert raw[DATA_OFFSET:] == exp.tobytes(), f"{npy}: the bytes at offset {DATA_OFFSET} are not the data"
        assert_array(np.load(npy), exp, f"{npy} (np.load)")
        mm = np.load(npy, mmap_mode="r")
        assert mm.offset == DATA_OFFSET, f"{npy}: memmap offset {mm.offset}"
        assert_array(np.array(mm), exp, f"{npy} (mmap)")
        del mm


def all_files(mnt: Mount, rel_dir: str, n_batches: int) -> list[str]:
    """Relative paths of every batch file (safetensors and npy) of N_BATCHES under REL_DIR."""
    out = []
    for i in range(n_batches):
        name = batch_name(i)
        out.append(f"{rel_dir}/{name}.safetensors")
        for f in sorted(os.listdir(mnt.p(rel_dir, name))):
            out.append(f"{rel_dir}/{name}/{f}")
    return out


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


@dataclass
class Dataset:
    path: Path  # directory holding the files
    files: list[tuple[str, int, int]]  # (file name, rows, row groups) in lexicographic order
    ref: dict[str, object] = field(default_factory=dict)  # column -> canonical-order reference

    @property
    def rows(self) -> int:
        return sum(r for _, r, _ in self.files)


def write_dataset(path: Path, tables: list[tuple[str, pa.Table]], row_group_size: int) -> list[tuple[str, int, int]]:
    path.mkdir(parents=True, exist_ok=True)
    out = []
    for name, table in tables:
        pq.write_table(table, path / name, row_group_size=row_group_size)
        md = pq.ParquetFile(path / name).metadata
        assert md.num_row_groups > 1 or table.num_rows <= row_group_size
        out.append((name, md.num_rows, md.num_row_groups))
    return sorted(out)


def fsl(values: np.ndarray, *dims) -> pa.Array:
    """A (nested) FixedSizeList array from VALUES of shape (n, *dims)."""
    arr = pa.array(values.reshape(-1))
    for d in reversed(dims):
        arr = pa.FixedSizeListArray.from_arrays(arr, d)
    return arr


def pad_ref(lists: list, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The padded [n, L] int32 tensor and the int32 [n] lengths (cut to L) of a list column."""
    out = np.zeros((len(lists), length), dtype=np.int32)
    lens = np.zeros(len(lists), dtype=np.int32)
    for r, lst in enumerate(lists):
        if lst:
            k = min(len(lst), length)
            out[r, :k] = lst[:k]
            lens[r] = k
    return out, lens


# The all-types dataset: 3 files, row groups of 300 rows, 3000 rows in all.
MAIN_FILES = [("part-000.parquet", 1100), ("part-001.parquet", 900), ("part-002.parquet", 1000)]
MAIN_RG = 300
DICT_VALUES = np.array([7, -3, 100000, 42, 0, -2**31], dtype=np.int32)
MAIN_SCALARS = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "b"]


def make_main(path: Path) -> Dataset:
    rng = np.random.default_rng(12345)
    tables = []
    ref: dict[str, list] = {}
    start = 0
    for fname, n in MAIN_FILES:
        c: dict[str, np.ndarray] = {
            "id": np.arange(start, start + n, dtype=np.int64),
            "i8": rng.integers(-128, 128, n).astype(np.int8),
            "i16": rng.integers(-(2**15), 2**15, n).astype(np.int16),
            "i32": rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32),
            "i64": rng.integers(-(2**62), 2**62, n, dtype=np.int64),
            "u8": rng.integers(0, 256, n).astype(np.uint8),
            "u16": rng.integers(0, 2**16, n).astype(np.uint16),
            "u32": rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
            "u64": rng.integers(0, 2**64, n, dtype=np.uint64),
            "f16": rng.standard_normal(n).astype(np.float16),
            "f32": rng.standard_normal(n).astype(np.float32),
            "f64": rng.standard_normal(n),
            "b": rng.random(n) < 0.3,
            "sx": rng.standard_normal(n).astype(np.float32),
            "sy": rng.standard_normal(n).astype(np.float32),
            "sz": rng.standard_normal(n).astype(np.float32),
            "emb": rng.standard_normal((n, 4)).astype(np.float32),
            "nest": rng.integers(-1000, 1000, (n, 2, 3)).astype(np.int16),
        }
        dict_idx = rng.integers(0, len(DICT_VALUES), n).astype(np.int32)
        c["dict"] = DICT_VALUES[dict_idx]
        c["d"] = rng.integers(-1000, 25000, n).astype(np.int32)
        c["ts"] = rng.integers(1_500_000_000_000, 1_800_000_000_000, n, dtype=np.int64)
        lens = rng.integers(0, 13, n)
        lens[:3] = [0, 12, 8]  # empty, longer than any pad length used, exactly 8
        tokens = [rng.integers(-(2**31), 2**31, k, dtype=np.int64).astype(np.int32).tolist() for k in lens]

        arrays = {}
        for k in ["id", *MAIN_SCALARS[:-1]]:
            arrays[k] = pa.array(c[k])
        arrays["b"] = pa.array(c["b"], type=pa.bool_())
        for k in ["sx", "sy", "sz"]:
            arrays[k] = pa.array(c[k])
        arrays["emb"] = fsl(c["emb"], 4)
        arrays["nest"] = fsl(c["nest"], 2, 3)
        arrays["dict"] = pa.DictionaryArray.from_arrays(pa.array(dict_idx), pa.array(DICT_VALUES))
        arrays["d"] = pa.array(c["d"], type=pa.date32())
        arrays["ts"] = pa.array(c["ts"]).cast(pa.timestamp("ms"))
        arrays["tokens"] = pa.array(tokens, type=pa.list_(pa.int32()))
        tables.append((fname, pa.table(arrays)))
        for k, v in c.items():
            ref.setdefault(k, []).append(v)
        ref.setdefault("tokens", []).append(tokens)
        start += n

    files = write_dataset(path, tables, MAIN_RG)
    ds = Dataset(path, files)
    for k, parts in ref.items():
        ds.ref[k] = sum(parts, []) if k == "tokens" else np.concatenate(parts)
    # Self-check: what pyarrow reads back is the reference.
    t = pq.read_table(path)
    assert t.num_rows == ds.rows
    assert np.array_equal(t.column("id").to_numpy(), ds.ref["id"])
    assert t.column("tokens").to_pylist() == ds.ref["tokens"]
    return ds


MAIN_ORDER = ["id", *MAIN_SCALARS, "sx", "sy", "sz", "emb", "nest", "dict", "d", "ts", "tokens"]


# The shuffle dataset: id + x = id / 2, 3 files, 13 row groups of 200 rows, 2600 rows.
SHUF_FILES = [("a.parquet", 1000), ("b.parquet", 800), ("c.parquet", 800)]
SHUF_RG = 200


def make_shuffle(path: Path) -> Dataset:
    tables = []
    start = 0
    for fname, n in SHUF_FILES:
        ids = np.arange(start, start + n, dtype=np.int64)
        tables.append((fname, pa.table({"id": ids, "x": (ids / 2).astype(np.float32)})))
        start += n
    files = write_dataset(path, tables, SHUF_RG)
    ds = Dataset(path, files)
    ds.ref["id"] = np.arange(ds.rows, dtype=np.int64)
    return ds


def row_group_of(ids: np.ndarray, ds: Dataset, rg_size: int) -> np.ndarray:
    """Global row-group number of each canonical row id (files in order, row groups of RG_SIZE)."""
    out = np.empty(len(ids), dtype=np.int64)
    file_start, rg_base = 0, 0
    for _, rows, rgs in ds.files:
        sel = (ids >= file_start) & (ids < file_start + rows)
        out[sel] = rg_base + (ids[sel] - file_start) // rg_size
        file_start += rows
        rg_base += rgs
    return out


def stats(m: "Mount") -> dict:
    """The mount's counters (.tensorfs/stats.json), a torn read retried."""
    for _ in range(20):
        try:
            with open(m.p(".tensorfs", "stats.json"), "rb") as f:
                return json.loads(f.read())
        except json.JSONDecodeError:
            continue
    raise AssertionError("stats.json never parsed")


def idle(m: "Mount", limit: float = 90) -> dict:
    """The mount's counters once it has no work pending (`work_pending` 0: every open's and
    read's follow-up run, and what it started ahead ended): nothing more is built until the
    next open or read. Fails after LIMIT seconds (a walk through the next epoch that waits for
    its reader gives up after 30)."""
    deadline = time.monotonic() + limit
    while True:
        s = stats(m)
        if s["work_pending"] == 0:
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"work still pending after {limit} s: {s}")
        time.sleep(0.05)


def file_name(entry: dict) -> str:
    """The file name of a dataset.json `files` entry."""
    return entry["path"].rstrip("/").rsplit("/", 1)[-1]


def batch_hashes(m: "Mount", rel_dirs, n_batches: int) -> dict[str, str]:
    """sha256 of every batch file (safetensors and npy) of N_BATCHES in each of REL_DIRS."""
    return {rel: sha256(m.p(rel)) for d in rel_dirs for rel in all_files(m, d, n_batches)}


def assert_same_as_local(m: "Mount", local: "Mount", dirs=("epoch-0",)):
    """M serves what the file:// mount LOCAL of the same data serves (dataset.json and every
    batch file of DIRS), and read its source remotely; its dataset.json."""
    lj, rj = local.dataset(), m.dataset()
    for k in ("rows", "batch_size", "batches_per_epoch", "last_batch_rows", "tensors", "drop_last"):
        assert rj.get(k) == lj.get(k), f"dataset.json {k}: {rj.get(k)!r} from {m.source}, {lj.get(k)!r} from file://"
    n = rj["batches_per_epoch"]
    assert n > 1
    want = batch_hashes(local, dirs, n)
    got = batch_hashes(m, dirs, n)
    assert sorted(got) == sorted(want)
    bad = [rel for rel in want if got[rel] != want[rel]]
    assert not bad, f"{len(bad)} of {len(want)} files differ from the file:// mount, e.g. {bad[:5]}"
    st = stats(m)
    assert st["remote_requests"] > 0 and st["remote_bytes"] > 0, st
    return rj


def split_escaped(v: str) -> list[str]:
    """columns=a\\:b:c -> ['a:b', 'c'] (a backslash escapes the next character; `\\n` and
    `\\r` are line breaks)."""
    out, cur, i = [], "", 0
    while i < len(v):
        ch = v[i]
        if ch == "\\" and i + 1 < len(v):
            cur += {"n": "\n", "r": "\r"}.get(v[i + 1], v[i + 1])
            i += 2
            continue
        if ch == ":":
            out.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    out.append(cur)
    return out


# The hint at the end of a refusal: `with columns=...` (which may carry more options after a
# comma), and where only variable-length lists are left to serve, the pad= (and nulls=) they need:
#   ... leave it out with columns=tok:fl and give the variable-length lists a length L (longer
#   ones are cut) with pad=tok:L,pad=fl:L,nulls=zero (and 2 more: listed above)
HINT = re.compile(
    r"\bwith (columns=.*?)"
    r"(?: and give the variable-length lists? a length L \(longer ones are cut\) with (pad=.*?))?"
    r"(?: \(and \d+ more: [^()]*\))?$"
)


def hint_options(line: str, pad_len: int = 8) -> list[str] | None:
    """The options a refusal line offers as the way to leave the culprit out: its `columns=...`
    (which may carry more options after a comma), plus pad=C:PAD_LEN for each pad=C:L it offers for a
    column the hint keeps, plus the nulls=zero offered with them. None when there is no
    columns= hint."""
    m = HINT.search(line)
    if not m:
        return None
    opts = split_options(m.group(1))
    kept = set()
    for o in opts:
        if o.startswith("columns="):
            kept |= set(split_escaped(o[len("columns="):]))
    if m.group(2):
        for o in split_options(m.group(2)):
            if o.startswith("pad="):
                assert o.endswith(":L"), f"a pad= hint without :L: {o!r} in {line}"
                continue  # added below, with the other pad=C:L the line offers
            opts.append(o)
    for c in re.findall(r"pad=((?:\\.|[^\s\\])+?):L(?=[\s,;]|$)", line):
        cname = split_escaped(c)
        if len(cname) == 1 and cname[0] in kept and f"pad={c}:{pad_len}" not in opts:
            opts.append(f"pad={c}:{pad_len}")
    return opts


def split_options(s: str) -> list[str]:
    """Split an -o string at unescaped commas."""
    out, cur, i = [], "", 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            cur += s[i : i + 2]
            i += 2
            continue
        if s[i] == ",":
            out.append(cur)
            cur = ""
        else:
            cur += s[i]
        i += 1
    out.append(cur)
    return [o for o in out if o]
