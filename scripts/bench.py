#!/usr/bin/env python3
"""The tensorfs benchmark driver (run it through scripts/bench, which builds and sets up first).

One run, one dataset, one machine. It generates a Parquet dataset (int64 `id`, float32 `x`,
FixedSizeList<float32>[64] `emb`, int32 `label`: 272 tensor bytes per row; several files of
several snappy row groups), then reads every row of it, as batches of --batch-size rows converted
to NumPy arrays, in these ways:

  local .npy                the same batches pre-written as .npy files (one per tensor) on local
                            disk, np.load per file: the limit
  local .safetensors        the mount's own batch files copied to local disk, read with
                            safetensors.numpy.load_file: the limit for the same reader and bytes
  pyarrow                   pq.ParquetFile(...).iter_batches(batch_size=B) + to_numpy of every
                            column, from local disk and from the loopback S3 server
  petastorm                 make_batch_reader (thread pool), without and with its local-disk cache,
                            from file://; and without a cache from the loopback S3 server (s3://,
                            through s3fs)
  tensorfs cold             mount with a fresh cache_dir, read every epoch-0/NNNNNN.safetensors
                            with safetensors.numpy.load_file (from file:// and from S3)
  tensorfs warm             the same after a first full read (remounted on the same cache_dir)
  tensorfs shuffled         shuffle=window and shuffle=global, epochs 0 (cold) and 1 (reshuffled,
                            gathered from the columns cached during epoch 0), each checked to be a
                            permutation of the rows

and runs the stall experiment: a consumer that needs half of tensorfs's cold throughput, and how
long it waits on reads. Page caches are dropped before every cold run when we are root.
Prints a table and writes it as a PNG chart.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_PY = REPO / ".venv" / "bin" / "python"
SIDE_VENV = REPO / "target" / "bench-petastorm-venv"
# Petastorm's last release (0.13.1) imports pyarrow.filesystem and uses the legacy
# ParquetDataset, both gone from current pyarrow; these are versions it runs with. Installed
# without petastorm's declared pyspark dependency (hundreds of MB), which make_batch_reader
# does not import.
# Petastorm opens s3:// through fsspec's s3fs: a release of pyarrow 12.0.1's time (s3fs pins
# its fsspec, and the aiobotocore and botocore that go with it).
PETASTORM_S3_PACKAGES = ["s3fs==2023.6.0", "fsspec==2023.6.0"]
SIDE_VENV_PACKAGES = ["pyarrow==12.0.1", "numpy<2", "pandas<2.1", "setuptools<70", "dill", "diskcache",
                      "future", "packaging", "psutil", "six", "pyzmq", *PETASTORM_S3_PACKAGES]
SIDE_VENV_NO_DEPS = ["petastorm==0.13.1"]
TENSORS = ("id", "x", "emb", "label")
ROW_BYTES = 8 + 4 + 64 * 4 + 4  # tensor bytes per row
MB = 1e6


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------


def write_dataset(out: Path, rows: int, files: int, rg_rows: int, emb_as_list: bool = False) -> None:
    """ROWS rows over FILES files of RG_ROWS-row groups; the same values for the same arguments.

    emb_as_list writes `emb` as list<float32> (same values) for Petastorm, which skips
    FixedSizeList columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    start = 0
    for f in range(files):
        n = min(per_file, rows - start)
        if n <= 0:
            break
        rng = np.random.default_rng(1000 + f)
        emb_values = pa.array(rng.standard_normal(64 * n, dtype=np.float32))
        if emb_as_list:
            offsets = pa.array(np.arange(0, 64 * n + 1, 64, dtype=np.int32))
            emb = pa.ListArray.from_arrays(offsets, emb_values)
        else:
            emb = pa.FixedSizeListArray.from_arrays(emb_values, 64)
        table = pa.table(
            {
                "id": np.arange(start, start + n, dtype=np.int64),
                "x": rng.standard_normal(n, dtype=np.float32),
                "emb": emb,
                "label": rng.integers(0, 1000, n, dtype=np.int32),
            }
        )
        pq.write_table(table, out / f"part-{f:05d}.parquet", row_group_size=rg_rows, compression="snappy")
        start += n
        del table, emb, emb_values


def parquet_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith(".parquet"))


def column_arrays(batch) -> dict:
    """A record batch's columns as NumPy arrays (the conversion every Parquet reader pays)."""
    import pyarrow as pa

    out = {}
    for name, col in zip(batch.schema.names, batch.columns):
        if pa.types.is_fixed_size_list(col.type):
            out[name] = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def write_npy_batches(data: Path, out: Path, batch_size: int) -> int:
    """The dataset's canonical order cut into batches, one directory of .npy files per batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    pending: list = []
    n_pending = 0
    i = 0

    def flush(n):
        nonlocal pending, n_pending, i
        table = pa.Table.from_batches(pending).combine_chunks()
        head, rest = table.slice(0, n), table.slice(n)
        d = out / f"{i:06d}"
        d.mkdir()
        for b in head.to_batches():
            for name, arr in column_arrays(b).items():
                np.save(d / f"{name}.npy", np.ascontiguousarray(arr))
        i += 1
        pending = rest.to_batches()
        n_pending = rest.num_rows

    for path in parquet_files(data):
        for b in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            pending.append(b)
            n_pending += b.num_rows
            while n_pending >= batch_size:
                flush(batch_size)
    if n_pending:
        flush(n_pending)
    return i


# --------------------------------------------------------------------------------------------
# Machine helpers
# --------------------------------------------------------------------------------------------


class Caches:
    """Drops the page cache (root only); remembers whether that worked."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.works: bool | None = None

    def drop(self) -> bool:
        if not self.enabled:
            return False
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            self.works = True
        except OSError:
            self.works = False
        return self.works


def _unescape(s: str) -> str:
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def is_mounted(path: Path) -> bool:
    want = os.path.join(os.path.realpath(path.parent), path.name)
    with open("/proc/self/mounts") as f:
        return any(len(p) >= 2 and _unescape(p[1]) == want for p in (line.split() for line in f))


def daemon_pids(mnt: Path) -> list[int]:
    want = {str(mnt), os.path.join(os.path.realpath(mnt.parent), mnt.name)}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
        except OSError:
            continue
        if any(a.rstrip("/") in want for a in argv):
            pids.append(int(entry))
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def mount_env() -> dict:
    """The environment for tensorfs daemons: without AWS_* (credentials and endpoint come from
    the mount options; e.g. AWS_CA_BUNDLE would change the S3 client) and proxies."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


class Mount:
    """A tensorfs mount, daemonised; unmount() waits for the daemon to exit."""

    def __init__(self, binary: Path, source: str, mnt: Path, options: list[str]):
        self.mnt, self.pids = mnt, []
        mnt.mkdir(parents=True, exist_ok=True)
        err = mnt.parent / f"{mnt.name}.mount-stderr"
        with open(err, "w") as fe:
            rc = subprocess.run(
                [str(binary), "mount", source, str(mnt), "-o", ",".join(options)],
                stdin=subprocess.DEVNULL,
                stdout=fe,
                stderr=fe,
                timeout=300,
                env=mount_env(),
            ).returncode
        if rc != 0 or not is_mounted(mnt):
            raise RuntimeError(f"tensorfs mount {source} failed (exit {rc}): {err.read_text().strip()[-500:]}")
        self.pids = daemon_pids(mnt)

    def stats(self) -> dict:
        with open(self.mnt / ".tensorfs" / "stats.json", "rb") as f:
            return json.loads(f.read())

    def dataset(self) -> dict:
        with open(self.mnt / "dataset.json", "rb") as f:
            return json.loads(f.read())

    def unmount(self) -> None:
        gc.collect()
        for cmd in (["umount", str(self.mnt)], ["fusermount3", "-u", str(self.mnt)], ["umount", "-l", str(self.mnt)]):
            if not is_mounted(self.mnt):
                break
            try:
                subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for _ in range(40):
                if not is_mounted(self.mnt):
                    break
                time.sleep(0.05)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=2) as r:
                r.read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} does not answer")
            time.sleep(0.2)


class S3Server:
    """moto's S3 server on loopback (scripts/s3-server when present), holding the dataset."""

    BUCKET, PREFIX = "bench", "ds"

    def __init__(self, data: Path, scratch: Path):
        self.proc = None
        self.pid = None
        self.url = None
        script = REPO / "scripts" / "s3-server"
        logf = scratch / "s3-server.log"
        if script.exists():
            r = subprocess.run(
                [str(VENV_PY), str(script), "--background", "--quiet", "--log", str(logf),
                 "--bucket", self.BUCKET, "--upload", f"{data}={self.BUCKET}/{self.PREFIX}"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
            )
            lines = r.stdout.split()
            if r.returncode != 0 or len(lines) < 2:
                raise RuntimeError(f"scripts/s3-server failed: {(r.stderr or r.stdout).strip()[-300:]}")
            self.url, self.pid = lines[0], int(lines[1])
            self.how = "scripts/s3-server (moto)"
        else:
            port = free_port()
            self.proc = subprocess.Popen(
                [str(VENV_PY), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL, stdout=open(logf, "ab"), stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.url = f"http://127.0.0.1:{port}"
            wait_http(self.url, 60)
            self.how = "python -m moto.server"
            s3 = self.client()
            s3.create_bucket(Bucket=self.BUCKET)
            for p in parquet_files(data):
                s3.upload_file(str(p), self.BUCKET, f"{self.PREFIX}/{p.name}")

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.url, aws_access_key_id="test", aws_secret_access_key="test",
            region_name="us-east-1", config=Config(s3={"addressing_style": "path"}),
        )

    @property
    def source(self) -> str:
        return f"s3://{self.BUCKET}/{self.PREFIX}/"

    def mount_options(self) -> list[str]:
        return [f"aws_endpoint={self.url}", "aws_allow_http=true", "aws_access_key_id=test",
                "aws_secret_access_key=test", "aws_region=us-east-1"]

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        elif self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass
            deadline = time.monotonic() + 20
            while alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# Readers: each returns (rows, tensor bytes delivered, seconds)
# --------------------------------------------------------------------------------------------


def read_npy_dirs(root: Path, n_batches: int):
    import numpy as np

    rows = nbytes = 0
    t = time.perf_counter()
    for i in range(n_batches):
        d = root / f"{i:06d}"
        for name in TENSORS:
            a = np.load(d / f"{name}.npy")
            nbytes += a.nbytes
        rows += len(a)
    return rows, nbytes, time.perf_counter() - t


def read_safetensors_files(root: Path, n_batches: int):
    from safetensors.numpy import load_file

    rows = nbytes = 0
    t = time.perf_counter()
    for i in range(n_batches):
        batch = load_file(str(root / f"{i:06d}.safetensors"))
        nbytes += sum(a.nbytes for a in batch.values())
        rows += len(batch["id"])
    return rows, nbytes, time.perf_counter() - t


def open_cost_us(root: Path, n_batches: int) -> float:
    """Microseconds per open+close of a batch file (the second of two passes)."""
    for _ in range(2):
        t = time.perf_counter()
        for i in range(n_batches):
            os.close(os.open(root / f"{i:06d}.safetensors", os.O_RDONLY))
        dt = time.perf_counter() - t
    return 1e6 * dt / n_batches


def verify(mnt_epoch: Path, npy: Path, n_batches: int, what: str) -> None:
    """Spot-checks that the mount serves the batches the local .npy files hold (outside timing)."""
    import numpy as np
    from safetensors.numpy import load_file

    if not (npy / f"{n_batches - 1:06d}").exists():
        return
    for i in sorted({0, n_batches // 2, n_batches - 1}):
        got = load_file(str(mnt_epoch / f"{i:06d}.safetensors"))
        for name in TENSORS:
            if not np.array_equal(got[name], np.load(npy / f"{i:06d}" / f"{name}.npy")):
                raise RuntimeError(f"{what}: batch {i} tensor {name} differs from the local .npy file")


def check_permutation(root: Path, n_batches: int, rows: int, what: str) -> None:
    """Checks (outside timing) that an epoch's batches hold every row id once."""
    import numpy as np
    from safetensors import safe_open

    ids = []
    for i in range(n_batches):
        with safe_open(str(root / f"{i:06d}.safetensors"), framework="np") as f:
            ids.append(f.get_tensor("id"))
    if not np.array_equal(np.sort(np.concatenate(ids)), np.arange(rows)):
        raise RuntimeError(f"tensorfs {what}: the batches are not a permutation of the rows")


def read_pyarrow(paths: list, batch_size: int, open_file=None):
    import pyarrow.parquet as pq

    rows = nbytes = 0
    t = time.perf_counter()
    for p in paths:
        src = open_file(p) if open_file else p
        for b in pq.ParquetFile(src).iter_batches(batch_size=batch_size):
            arrays = column_arrays(b)
            nbytes += sum(a.nbytes for a in arrays.values())
            rows += b.num_rows
    return rows, nbytes, time.perf_counter() - t


def petastorm_worker(url: str, rows_total: int, cache_dir: str | None, workers: int, endpoint: str | None) -> None:
    """Runs under the interpreter that has a working petastorm; prints one JSON line.

    With a cache, reads two epochs with one reader (petastorm deletes its cache when a reader
    stops) and times each: the first fills the cache, the second is served from it. With an
    ENDPOINT, URL is s3://bucket/prefix on that S3 server (moto: any key is accepted)."""
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    from petastorm import make_batch_reader

    kw = dict(reader_pool_type="thread", workers_count=workers, shuffle_row_groups=False)
    if endpoint:
        import s3fs
        from pyarrow.filesystem import S3FSWrapper

        class S3(S3FSWrapper):
            """pyarrow's legacy wrapper of s3fs, listing through s3fs's walk: its own walk calls
            s3fs's _ls, a coroutine since s3fs 0.5."""

            def walk(self, path):
                return self.fs.walk(str(path).replace("s3://", "", 1))

        # Petastorm would make this s3fs filesystem itself from storage_options=, but hands it
        # unwrapped to pyarrow 12's ParquetDataset, which then takes the new Dataset API and
        # fails ("Keyword 'validate_schema' is not yet supported"). Wrapped, it takes the legacy
        # path, as file:// does (pyarrow.localfs); the URL still names the dataset.
        fs = s3fs.S3FileSystem(key="test", secret="test",
                               client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
        kw["filesystem"] = S3(fs)
    epochs = 1
    if cache_dir:
        epochs = 2
        kw.update(cache_type="local-disk", cache_location=cache_dir,
                  cache_size_limit=4 * rows_total * ROW_BYTES + (1 << 30), cache_row_size_estimate=ROW_BYTES)
    out = []
    with make_batch_reader(url, num_epochs=epochs, **kw) as reader:
        rows = nbytes = 0
        t = time.perf_counter()
        for b in reader:
            d = b._asdict()
            if set(d) != set(TENSORS):
                raise RuntimeError(f"petastorm delivered columns {sorted(d)}")
            n = len(d["id"])
            for k, v in d.items():
                v = np.asarray(v)
                if k == "emb" and v.shape != (n, 64):
                    raise RuntimeError(f"petastorm emb has shape {v.shape}")
                nbytes += v.nbytes
            rows += n
            if rows >= rows_total:
                now = time.perf_counter()
                out.append({"rows": rows, "bytes": nbytes, "seconds": now - t})
                rows = nbytes = 0
                t = now
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------------
# Petastorm: which interpreter can run it
# --------------------------------------------------------------------------------------------


def _probe(python: Path, code: str = "from petastorm import make_batch_reader") -> str | None:
    """None if PYTHON runs CODE (by default: imports petastorm's make_batch_reader), else the
    error's last line."""
    r = subprocess.run(
        [str(python), "-W", "ignore", "-c", code],
        capture_output=True, text=True, timeout=300,
    )
    if r.returncode == 0:
        return None
    lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
    return lines[-1] if lines else f"exit {r.returncode}"


def _pip(python: Path, *pkgs) -> str | None:
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", *pkgs], capture_output=True, text=True)
    if r.returncode != 0:
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        return lines[-1] if lines else f"pip exit {r.returncode}"
    return None


def petastorm_python(explicit: str | None, allow_side_venv: bool) -> tuple[Path | None, str]:
    """(interpreter, note) or (None, reason it is unavailable)."""
    if explicit:
        err = _probe(Path(explicit))
        return (Path(explicit), f"petastorm from {explicit}") if err is None else (None, err)
    err = _probe(VENV_PY)
    if err and "No module named 'petastorm'" in err:
        log("installing petastorm into .venv (pip install petastorm)")
        err = _pip(VENV_PY, "petastorm") or _probe(VENV_PY)
    if err is None:
        return VENV_PY, "petastorm in .venv"
    import pyarrow

    first = f"petastorm does not run with pyarrow {pyarrow.__version__} in .venv ({err})"
    log(first)
    if not allow_side_venv:
        return None, first
    py = SIDE_VENV / "bin" / "python"
    if not py.exists() or _probe(py) is not None:
        log(f"setting up a side venv for petastorm: target/{SIDE_VENV.name} ({' '.join(SIDE_VENV_NO_DEPS + SIDE_VENV_PACKAGES)})")
        if not py.exists():
            r = subprocess.run([sys.executable, "-m", "venv", str(SIDE_VENV)], capture_output=True, text=True)
            if r.returncode != 0:
                return None, f"{first}; side venv: {r.stderr.strip()[-200:]}"
        e2 = _pip(py, *SIDE_VENV_PACKAGES) or _pip(py, "--no-deps", *SIDE_VENV_NO_DEPS) or _probe(py)
        if e2:
            return None, f"{first}; side venv: {e2}"
    ver = subprocess.run([str(py), "-c", "import pyarrow, petastorm; print(petastorm.__version__, pyarrow.__version__)"],
                         capture_output=True, text=True).stdout.split()
    return py, f"petastorm {ver[0]} with pyarrow {ver[1]} (side venv: current pyarrow lacks APIs it uses)"


def petastorm_s3fs(py: Path) -> str | None:
    """None if petastorm's interpreter PY has s3fs (for s3:// URLs), else why not. Installs it
    into our side venv when missing there (a side venv made before it was on the list)."""
    err = _probe(py, "import s3fs")
    side = SIDE_VENV / "bin" / "python"
    if err and "No module named" in err and py == side:
        log(f"installing s3fs into target/{SIDE_VENV.name} ({' '.join(PETASTORM_S3_PACKAGES)})")
        err = _pip(py, *PETASTORM_S3_PACKAGES) or _probe(py, "import s3fs")
    return f"s3fs in {py}: {err}" if err else None


def petastorm_epochs(py: Path, url: str, a, cache: Path | None = None, endpoint: str | None = None) -> list:
    """Runs petastorm_worker under PY in a fresh process; its epochs' measurements."""
    args = [str(py), "-W", "ignore", str(Path(__file__).resolve()), "--petastorm-worker", url,
            "--rows", str(a.rows), "--petastorm-workers", str(a.petastorm_workers)]
    if cache:
        args += ["--petastorm-cache", str(cache)]
    if endpoint:
        args += ["--petastorm-endpoint", endpoint]
    r = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    lines = [x for x in r.stdout.splitlines() if x.startswith("[")]
    if r.returncode != 0 or not lines:
        tail = [x for x in r.stderr.strip().splitlines() if x.strip()]
        raise RuntimeError(tail[-1] if tail else f"exit {r.returncode}")
    return json.loads(lines[-1])


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


class Results:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, key, label, rows, nbytes, seconds, note=""):
        r = {"key": key, "method": label, "rows": rows, "bytes": nbytes, "seconds": seconds,
             "rows_s": rows / seconds, "mb_s": nbytes / MB / seconds, "note": note}
        self.rows.append(r)
        log(f"{label}: {rows} rows, {nbytes / MB:.1f} MB in {seconds:.2f} s = {r['mb_s']:.1f} MB/s")
        return r

    def unavailable(self, key, label, reason):
        self.rows.append({"key": key, "method": label, "unavailable": reason})
        log(f"{label}: unavailable: {reason}")

    ORDER = ["npy", "npy_disk", "st_local", "st_local_disk", "tfs_warm", "tfs_warm_npy", "tfs_warm_disk",
             "tfs_cold", "tfs_cold_s3", "pyarrow", "pyarrow_s3", "petastorm", "petastorm_s3", "petastorm_fill",
             "petastorm_cached"]

    def ordered(self) -> list[dict]:
        return sorted(self.rows, key=lambda r: self.ORDER.index(r["key"]) if r["key"] in self.ORDER else 99)

    def get(self, key):
        for r in self.rows:
            if r["key"] == key and "unavailable" not in r:
                return r
        return None


def read_into(fd: int, view: memoryview, size: int) -> int:
    """Reads up to SIZE bytes of FD into VIEW (one reused buffer), closes FD; the bytes read."""
    got = 0
    try:
        while got < size:
            k = os.readv(fd, [view[got:size]])
            if k == 0:
                break
            got += k
    finally:
        os.close(fd)
    return got


def stall_experiment(binary, source, options, scratch, caches, cold_mb_s, n_batches, name, prefetch, batch_size,
                     rg_first_rows):
    """A consumer needing half the cold throughput: per batch, open+read it, then 'compute' for
    the time that batch takes at 0.5 × cold_mb_s. Returns the measurements."""
    rate = 0.5 * cold_mb_s * MB  # bytes/s the consumer consumes
    cache = scratch / f"cache-stall-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    caches.drop()
    m = Mount(binary, source, scratch / f"mnt-stall-{name}", [*options, f"prefetch={prefetch}", f"cache_dir={cache}"])
    try:
        root = m.mnt / "epoch-0"
        sizes = [os.stat(root / f"{i:06d}.safetensors").st_size for i in range(n_batches)]
        buf = bytearray(max(sizes))
        view = memoryview(buf)
        opened = readt = 0.0
        waits = []
        slept = 0.0
        t0 = time.perf_counter()
        for i in range(n_batches):
            a = time.perf_counter()
            fd = os.open(root / f"{i:06d}.safetensors", os.O_RDONLY)
            b = time.perf_counter()
            got = read_into(fd, view, sizes[i])
            c = time.perf_counter()
            if got != sizes[i]:
                raise RuntimeError(f"short read of batch {i}: {got} of {sizes[i]}")
            if i > 0:
                opened += b - a
                readt += c - b
                waits.append((c - a, i))
            compute = (sizes[i] - 4096) / rate  # tensor bytes at half the cold rate
            time.sleep(compute)
            slept += compute
        wall = time.perf_counter() - t0
        stats = m.stats()
        # The same reads again, now that every batch is materialised: what open+read costs
        # when nothing waits (the copy itself).
        t = time.perf_counter()
        for i in range(1, n_batches):
            read_into(os.open(root / f"{i:06d}.safetensors", os.O_RDONLY), view, sizes[i])
        ready_read = time.perf_counter() - t
    finally:
        m.unmount()
        shutil.rmtree(cache, ignore_errors=True)
    by_wait = sorted(waits, reverse=True)
    # Batches holding the first row of a row group (where that row group must be decoded).
    starts = {r // batch_size for r in rg_first_rows if r > 0}
    slow = [(w, i) for w, i in waits if w > 0.002]
    blocked = opened + readt
    return {
        "name": name, "cold_mb_s": cold_mb_s, "consumer_mb_s": rate / MB, "batches": n_batches,
        "wall_s": wall, "compute_s": slept, "blocked_s": blocked, "open_s": opened, "read_s": readt,
        "blocked_share": blocked / wall, "open_share": opened / wall,
        "ready_read_s": ready_read, "excess_share": max(0.0, blocked - ready_read) / wall,
        "prefetch": prefetch,
        "max_wait_ms": 1e3 * (by_wait[0][0] if waits else 0),
        "p99_wait_ms": 1e3 * (by_wait[len(waits) // 100][0] if waits else 0),
        "slow_batches": len(slow), "slow_s": sum(w for w, _ in slow),
        "slow_at_row_group_start": sum(1 for _, i in slow if i in starts),
        "slow_at_row_group_start_s": sum(w for w, i in slow if i in starts),
        "row_group_starts": len(starts),
        "worst": [(i, round(1e3 * w, 2)) for w, i in by_wait[:8]],
        "slow": [(i, round(1e3 * w, 2)) for w, i in slow],
        "daemon": {k: stats.get(k) for k in ("stall_count", "stall_ns", "stall_p99_us", "opens",
                                               "prefetch_scheduled", "prefetch_deferred",
                                               "passthrough_opens", "batch_file_hits", "batch_file_misses")},
    }


def run(a) -> int:
    import numpy as np  # noqa: F401  (fail early if the venv is broken)
    import pyarrow
    import pyarrow.parquet

    binary = Path(a.bin).resolve()
    if not binary.exists():
        raise SystemExit(f"bench: {binary} is missing (build it: cargo build --release)")
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    known = {"npy", "pyarrow", "petastorm", "s3", "tensorfs", "warm", "shuffle", "stall"}
    if skip - known:
        raise SystemExit(f"bench: unknown --skip {sorted(skip - known)}; known: {sorted(known)}")
    own_scratch = a.out_dir is None
    scratch = Path(tempfile.mkdtemp(prefix="tensorfs-bench-")) if own_scratch else Path(a.out_dir).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    caches = Caches(enabled=not a.no_drop_caches)
    res = Results()
    stalls = []
    mounts: list[Mount] = []
    s3 = None
    B = a.batch_size
    try:
        # ---- data ----------------------------------------------------------------------
        data = scratch / "data"
        log(f"writing {a.rows} rows as {a.files} Parquet files, {a.row_group_rows}-row groups, to {data}")
        shutil.rmtree(data, ignore_errors=True)
        write_dataset(data, a.rows, a.files, a.row_group_rows)
        pq_bytes = sum(p.stat().st_size for p in parquet_files(data))
        rg_first_rows, at = [], 0
        for p in parquet_files(data):
            md = pyarrow.parquet.ParquetFile(p).metadata
            for g in range(md.num_row_groups):
                rg_first_rows.append(at)
                at += md.row_group(g).num_rows
        n_batches = -(-a.rows // B)
        log(f"Parquet: {pq_bytes / MB:.1f} MB; tensors: {a.rows * ROW_BYTES / MB:.1f} MB in {n_batches} batches of {B}")
        meta = {
            "rows": a.rows, "batch_size": B, "batches": n_batches, "files": a.files,
            "row_group_rows": a.row_group_rows, "parquet_mb": pq_bytes / MB,
            "tensor_mb": a.rows * ROW_BYTES / MB, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "pyarrow": pyarrow.__version__,
        }

        # ---- 1. local .npy --------------------------------------------------------------
        if "npy" not in skip:
            npy = scratch / "npy"
            shutil.rmtree(npy, ignore_errors=True)
            log("writing the batches as local .npy files")
            write_npy_batches(data, npy, B)
            if caches.drop():
                res.add("npy_disk", "local .npy, page cache dropped", *read_npy_dirs(npy, n_batches))
            read_npy_dirs(npy, n_batches)  # into the page cache
            res.add("npy", "local .npy (page cache)", *read_npy_dirs(npy, n_batches))

        # ---- 2. PyArrow -----------------------------------------------------------------
        if "pyarrow" not in skip:
            caches.drop()
            res.add("pyarrow", "pyarrow iter_batches+to_numpy, local", *read_pyarrow(parquet_files(data), B),
                    note="page cache dropped" if caches.works else "")

        # ---- 3. Petastorm ---------------------------------------------------------------
        # Petastorm's interpreter and its twin dataset, kept for its S3 row (step 5); or why
        # Petastorm cannot run.
        pet_py, pet_err = None, None
        pdata = scratch / "data-petastorm"
        if "petastorm" not in skip:
            label = "petastorm make_batch_reader"
            try:
                py, note = petastorm_python(a.petastorm_python, not a.no_side_venv)
                if py is None:
                    pet_err = note
                    raise RuntimeError(note)
                log(f"petastorm: {note}")
                meta["petastorm"] = note
                # Petastorm skips FixedSizeList columns ('unsupported field'): it reads a twin
                # dataset with emb as list<float32>, same values, same files and row groups.
                shutil.rmtree(pdata, ignore_errors=True)
                write_dataset(pdata, a.rows, a.files, a.row_group_rows, emb_as_list=True)
                pet_py = py
                for cached in (False, True):
                    pcache = scratch / "petastorm-cache"
                    shutil.rmtree(pcache, ignore_errors=True)
                    caches.drop()
                    try:
                        epochs = petastorm_epochs(py, f"file://{pdata}", a, cache=pcache if cached else None)
                    finally:
                        shutil.rmtree(pcache, ignore_errors=True)
                    if not cached:
                        e = epochs[0]
                        res.add("petastorm", f"{label}, no cache", e["rows"], e["bytes"], e["seconds"])
                    else:
                        e1, e2 = epochs[0], epochs[1]
                        res.add("petastorm_fill", f"{label}, disk cache, 1st epoch", e1["rows"], e1["bytes"], e1["seconds"])
                        res.add("petastorm_cached", f"{label}, disk cache, 2nd epoch", e2["rows"], e2["bytes"], e2["seconds"])
            except Exception as e:  # any failure: say so and go on
                res.unavailable("petastorm", label, str(e)[-300:])
            if pet_py is None or "s3" in skip:
                shutil.rmtree(pdata, ignore_errors=True)

        # ---- 4. tensorfs cold from file://, 6. warm --------------------------------------
        opts = [f"batch_size={B}", "shuffle=none"]
        if a.tensorfs_options:
            opts += a.tensorfs_options.split(",")
        if "tensorfs" not in skip:
            cache = scratch / "cache-file"
            shutil.rmtree(cache, ignore_errors=True)
            src = f"file://{data}"
            caches.drop()
            m = Mount(binary, src, scratch / "mnt-file", [*opts, f"cache_dir={cache}"])
            mounts.append(m)
            ds = m.dataset()
            assert ds["batches_per_epoch"] == n_batches, ds["batches_per_epoch"]
            root = m.mnt / "epoch-0"
            res.add("tfs_cold", "tensorfs cold, file://", *read_safetensors_files(root, n_batches))
            verify(root, scratch / "npy", n_batches, "tensorfs, file://")
            meta["tensorfs_cold_file_stats"] = m.stats()
            if "warm" not in skip:
                res.add("tfs_warm", "tensorfs warm (page cache)", *read_safetensors_files(root, n_batches))
                # The mount's own files, copied to local disk: the same bytes, the same reader.
                st = scratch / "safetensors"
                shutil.rmtree(st, ignore_errors=True)
                st.mkdir()
                for i in range(n_batches):
                    shutil.copyfile(root / f"{i:06d}.safetensors", st / f"{i:06d}.safetensors")
                read_safetensors_files(st, n_batches)
                res.add("st_local", "local .safetensors (page cache)", *read_safetensors_files(st, n_batches),
                        note="the mount's files copied to local disk")
                meta["open_us"] = {"mount": open_cost_us(root, n_batches), "local": open_cost_us(st, n_batches)}
                if "npy" not in skip:
                    read_npy_dirs(root, n_batches)  # materialise the .npy files
                    res.add("tfs_warm_npy", "tensorfs warm, .npy files (page cache)", *read_npy_dirs(root, n_batches))
                m.unmount()
                mounts.remove(m)
                if caches.drop():
                    read_st_disk = read_safetensors_files(st, n_batches)
                    caches.drop()
                    m = Mount(binary, src, scratch / "mnt-file", [*opts, f"cache_dir={cache}"])
                    mounts.append(m)
                    res.add("tfs_warm_disk", "tensorfs warm, remounted, page cache dropped",
                            *read_safetensors_files(m.mnt / "epoch-0", n_batches))
                    meta["tensorfs_warm_remount_stats"] = m.stats()
                    res.add("st_local_disk", "local .safetensors, page cache dropped", *read_st_disk)
                shutil.rmtree(st, ignore_errors=True)
            m.unmount()
            mounts.remove(m)
            shutil.rmtree(cache, ignore_errors=True)

        # ---- 6b. shuffled epochs: window against global --------------------------------------
        if "shuffle" not in skip and "tensorfs" not in skip:
            base = [o for o in opts if not o.startswith("shuffle=")]
            for mode in ("window", "global"):
                cache = scratch / f"cache-{mode}"
                shutil.rmtree(cache, ignore_errors=True)
                caches.drop()
                m = Mount(binary, f"file://{data}", scratch / f"mnt-{mode}",
                          [*base, f"shuffle={mode}", "epochs=2", f"cache_dir={cache}"])
                mounts.append(m)
                n = m.dataset()["batches_per_epoch"]
                for e, what in ((0, "epoch 0 (cold)"), (1, "epoch 1 (cached columns)")):
                    res.add(f"tfs_{mode}_e{e}", f"tensorfs shuffle={mode}, {what}",
                            *read_safetensors_files(m.mnt / f"epoch-{e}", n))
                    check_permutation(m.mnt / f"epoch-{e}", n, a.rows, f"shuffle={mode} epoch {e}")
                m.unmount()
                mounts.remove(m)
                shutil.rmtree(cache, ignore_errors=True)

        # ---- 5. S3 ------------------------------------------------------------------------
        if "s3" not in skip:
            try:
                log("starting the loopback S3 server and uploading the dataset")
                t = time.perf_counter()
                s3 = S3Server(data, scratch)
                log(f"S3 at {s3.url} ({s3.how}), upload took {time.perf_counter() - t:.1f} s")
                meta["s3"] = s3.how
            except Exception as e:
                s3 = None
                res.unavailable("tfs_cold_s3", "tensorfs cold, S3 (loopback moto)", str(e)[-300:])
                if "petastorm" not in skip:
                    res.unavailable("petastorm_s3", "petastorm make_batch_reader, S3", str(e)[-300:])
            if s3 is not None:
                if "pyarrow" not in skip:
                    try:
                        import pyarrow.fs as pafs

                        fs = pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                                               endpoint_override=s3.url, scheme="http")
                        keys = sorted(
                            i.path for i in fs.get_file_info(pafs.FileSelector(f"{s3.BUCKET}/{s3.PREFIX}"))
                            if i.path.endswith(".parquet")
                        )
                        res.add("pyarrow_s3", "pyarrow iter_batches+to_numpy, S3",
                                *read_pyarrow(keys, B, open_file=fs.open_input_file))
                    except Exception as e:
                        res.unavailable("pyarrow_s3", "pyarrow iter_batches+to_numpy, S3", str(e)[-300:])
                if "tensorfs" not in skip:
                    cache = scratch / "cache-s3"
                    shutil.rmtree(cache, ignore_errors=True)
                    caches.drop()
                    try:
                        m = Mount(binary, s3.source, scratch / "mnt-s3", [*opts, *s3.mount_options(), f"cache_dir={cache}"])
                        mounts.append(m)
                        res.add("tfs_cold_s3", "tensorfs cold, S3 (loopback moto)",
                                *read_safetensors_files(m.mnt / "epoch-0", n_batches))
                        verify(m.mnt / "epoch-0", scratch / "npy", n_batches, "tensorfs, S3")
                        meta["tensorfs_cold_s3_stats"] = m.stats()
                        m.unmount()
                        mounts.remove(m)
                    except Exception as e:
                        res.unavailable("tfs_cold_s3", "tensorfs cold, S3 (loopback moto)", str(e)[-300:])
                    shutil.rmtree(cache, ignore_errors=True)
                if "petastorm" not in skip:
                    # Petastorm's twin dataset on the same server, read through s3:// (s3fs) by a
                    # fresh reader without a cache, configured as its file:// row.
                    label = "petastorm make_batch_reader, S3"
                    prefix = f"{s3.PREFIX}-petastorm"
                    client = None
                    try:
                        if pet_py is None:
                            raise RuntimeError(pet_err or "petastorm did not run from file://")
                        err = petastorm_s3fs(pet_py)
                        if err:
                            raise RuntimeError(err)
                        client = s3.client()
                        for p in parquet_files(pdata):
                            client.upload_file(str(p), s3.BUCKET, f"{prefix}/{p.name}")
                        e = petastorm_epochs(pet_py, f"s3://{s3.BUCKET}/{prefix}", a, endpoint=s3.url)[0]
                        res.add("petastorm_s3", label, e["rows"], e["bytes"], e["seconds"])
                    except Exception as e:  # any failure: say so and go on
                        res.unavailable("petastorm_s3", label, str(e)[-300:])
                    # Off the server again, so the stall experiment finds it as before.
                    try:
                        if client is not None:
                            for o in client.list_objects_v2(Bucket=s3.BUCKET, Prefix=f"{prefix}/").get("Contents", []):
                                client.delete_object(Bucket=s3.BUCKET, Key=o["Key"])
                    except Exception:
                        pass

        shutil.rmtree(pdata, ignore_errors=True)

        # ---- 7. the stall experiment ----------------------------------------------------------
        if "stall" not in skip and "tensorfs" not in skip:
            cold = res.get("tfs_cold")
            if cold:
                log(f"stall experiment, file://: consumer at half of {cold['mb_s']:.1f} MB/s")
                stalls.append(stall_experiment(binary, f"file://{data}", opts, scratch, caches, cold["mb_s"], n_batches, "file",
                                               a.stall_prefetch, B, rg_first_rows))
            cold_s3 = res.get("tfs_cold_s3")
            if cold_s3 and s3 is not None:
                log(f"stall experiment, S3: consumer at half of {cold_s3['mb_s']:.1f} MB/s")
                stalls.append(stall_experiment(binary, s3.source, [*opts, *s3.mount_options()], scratch, caches,
                                               cold_s3["mb_s"], n_batches, "s3", a.stall_prefetch, B, rg_first_rows))
    finally:
        for m in mounts:
            try:
                m.unmount()
            except Exception:
                pass
        if s3 is not None:
            s3.stop()
        if own_scratch and not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    meta["page_cache_dropped"] = bool(caches.works)
    report(res, stalls, meta, a)
    return 0


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def report(res: Results, stalls: list, meta: dict, a) -> None:
    warm, pa_ = res.get("tfs_warm"), res.get("pyarrow")
    lines = []
    head = (f"{'method':<50} {'rows/s':>9} {'MB/s':>9} {'x warm':>8} {'x pyarrow':>10}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in res.ordered():
        if "unavailable" in r:
            lines.append(f"{r['method']:<50} unavailable: {r['unavailable']}")
            continue
        rw = f"{r['mb_s'] / warm['mb_s']:.2f}" if warm else "-"
        rp = f"{r['mb_s'] / pa_['mb_s']:.2f}" if pa_ else "-"
        if warm and abs(r["rows_s"] / warm["rows_s"] - r["mb_s"] / warm["mb_s"]) > 0.005:
            rw += f" (rows {r['rows_s'] / warm['rows_s']:.2f})"
        lines.append(f"{r['method']:<50} {fmt_rate(r['rows_s']):>9} {r['mb_s']:>9.1f} {rw:>8} {rp:>10}")
    desc = (f"{meta['rows']} rows ({meta['tensor_mb']:.0f} MB of tensors, {meta['parquet_mb']:.0f} MB of Parquet in "
            f"{meta['files']} files, {meta['row_group_rows']}-row groups), batch_size {meta['batch_size']} "
            f"({meta['batches']} batches); {meta['cores']} cores, Linux {meta['kernel']}; "
            f"page cache dropped before cold runs: {'yes' if meta['page_cache_dropped'] else 'no'}")
    print()
    print(desc)
    print("MB/s: tensor bytes delivered as NumPy arrays. 'x warm', 'x pyarrow': ratio to 'tensorfs warm (page cache)'"
          " and to 'pyarrow iter_batches+to_numpy, local' (the same for rows/s: every method delivers 272 bytes a row).")
    print()
    print("\n".join(lines))
    for s in stalls:
        d = s["daemon"]
        print()
        print(f"stall experiment ({s['name']}): a consumer needing {s['consumer_mb_s']:.1f} MB/s "
              f"(half of tensorfs cold {s['cold_mb_s']:.1f} MB/s), prefetch={s['prefetch']}, {s['batches']} batches")
        print(f"  epoch wall {s['wall_s']:.2f} s; blocked in open+read after the first batch {s['blocked_s'] * 1e3:.1f} ms"
              f" = {100 * s['blocked_share']:.2f}% of the epoch (open {s['open_s'] * 1e3:.1f} ms, read {s['read_s'] * 1e3:.1f} ms)")
        print(f"  the same open+reads once materialised take {s['ready_read_s'] * 1e3:.1f} ms: waiting beyond the copy "
              f"{100 * s['excess_share']:.2f}% of the epoch; per-batch wait p99 {s['p99_wait_ms']:.2f} ms, max {s['max_wait_ms']:.2f} ms")
        print(f"  daemon: stall_count {d['stall_count']}, stall_ns {d['stall_ns']} ({(d['stall_ns'] or 0) / 1e6:.1f} ms), "
              f"stall_p99_us {d['stall_p99_us']}, prefetch_scheduled {d['prefetch_scheduled']}, "
              f"prefetch_deferred {d['prefetch_deferred']}, passthrough_opens {d['passthrough_opens']}")
        print(f"  batches that waited > 2 ms: {s['slow_batches']} ({s['slow_s'] * 1e3:.0f} ms in all); of them "
              f"{s['slow_at_row_group_start']} ({s['slow_at_row_group_start_s'] * 1e3:.0f} ms) are the first batch of a row "
              f"group ({s['row_group_starts']} such batches); worst (batch, ms): {s['worst']}")
    if meta.get("open_us"):
        print(f"\nopen+close of a materialised batch file: {meta['open_us']['mount']:.0f} us through the mount, "
              f"{meta['open_us']['local']:.0f} us for the local copy")
    for key, label in (("tensorfs_cold_file_stats", "cold, file://"), ("tensorfs_cold_s3_stats", "cold, S3")):
        st = meta.get(key)
        if st:
            print(f"\ntensorfs {label} counters: row_groups_decoded {st.get('row_groups_decoded')}, decode "
                  f"{(st.get('decode_ns') or 0) / 1e9:.2f} s, remote_requests {st.get('remote_requests')}, remote "
                  f"{(st.get('remote_bytes') or 0) / MB:.0f} MB, batch_files_written {st.get('batch_files_written')}, "
                  f"stall_ns {(st.get('stall_ns') or 0) / 1e6:.0f} ms, stall_p99_us {st.get('stall_p99_us')}")
    pairs = [(f"epoch {e}", res.get(f"tfs_global_e{e}"), res.get(f"tfs_window_e{e}")) for e in (0, 1)]
    if any(g and w for _, g, w in pairs):
        print("\nshuffle=global / shuffle=window (MB/s): " + ", ".join(
            f"{what} {g['mb_s'] / w['mb_s']:.2f}" for what, g, w in pairs if g and w))
    if meta.get("petastorm"):
        print(f"\npetastorm: {meta['petastorm']}; it skips FixedSizeList columns, so it read a twin dataset with emb as "
              f"list<float32> (same values); workers_count={a.petastorm_workers}, batches are row groups")
    # tensorfs against Petastorm on the same data: cold from S3 against Petastorm from the same
    # server when that row ran (else, said so, against Petastorm from file://), cold file://
    # against file://, warm against Petastorm's cached 2nd epoch.
    pet_s3, pet = res.get("petastorm_s3"), res.get("petastorm")
    pairs = [
        ("tfs_cold_s3", "tensorfs cold S3", pet_s3 or pet,
         "petastorm S3, no cache" if pet_s3 else "petastorm file://, no cache (its S3 row did not run)"),
        ("tfs_cold", "tensorfs cold file://", pet, "petastorm file://, no cache"),
        ("tfs_warm", "tensorfs warm", res.get("petastorm_cached"), "petastorm's cached 2nd epoch"),
    ]
    vs = [f"  {mine_label} / {theirs_label}: {res.get(mine)['mb_s'] / theirs['mb_s']:.2f}"
          for mine, mine_label, theirs, theirs_label in pairs if res.get(mine) and theirs]
    if vs:
        print("\ntensorfs / petastorm (MB/s):")
        print("\n".join(vs))
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "results": res.rows, "stall": stalls}, indent=1))
    if a.png:
        try:
            chart(res, stalls, desc, Path(a.png))
            print(f"\nchart: {a.png}")
        except Exception as e:
            print(f"\nchart: not written: {e}")


def chart(res: Results, stalls: list, desc: str, png: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        log("installing matplotlib into .venv")
        err = _pip(Path(sys.executable), "matplotlib")
        if err:
            raise RuntimeError(f"matplotlib: {err}")
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.transforms

    warm, pa_ = res.get("tfs_warm"), res.get("pyarrow")
    rows = list(reversed(res.ordered()))
    labels = [r["method"] for r in rows]
    values = [r.get("mb_s", 0.0) for r in rows]
    colors = []
    for r in rows:
        if "unavailable" in r:
            colors.append("#cccccc")
        elif r["key"].startswith("tfs"):
            colors.append("#d95f02")
        elif r["key"] in ("npy", "npy_disk", "st_local", "st_local_disk"):
            colors.append("#7570b3")
        else:
            colors.append("#1b9e77")
    fig, ax = plt.subplots(figsize=(14, 0.5 * len(rows) + 2.6))
    ax.barh(range(len(rows)), values, color=colors)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("MB/s of tensor bytes delivered as NumPy arrays (log scale)")
    top = max(values) if any(values) else 1
    ax.set_xlim(min(v for v in values if v > 0) / 2 if any(values) else 1, top * 1.5)
    # The figures in a column right of the plot, so no label runs off the figure.
    right = matplotlib.transforms.blended_transform_factory(ax.transAxes, ax.transData)
    for y, r in enumerate(rows):
        if "unavailable" in r:
            ax.text(1.02, y, "unavailable: " + r["unavailable"][:60], transform=right, va="center", fontsize=8)
            continue
        parts = [f"{r['mb_s']:.0f} MB/s, {fmt_rate(r['rows_s'])} rows/s"]
        if warm:
            parts.append(f"{r['mb_s'] / warm['mb_s']:.2f}x warm")
        if pa_:
            parts.append(f"{r['mb_s'] / pa_['mb_s']:.2f}x pyarrow")
        ax.text(1.02, y, "  ".join(parts), transform=right, va="center", fontsize=8)
    import textwrap

    fig.text(0.01, 0.99, "tensorfs benchmark\n" + textwrap.fill(desc, 150), fontsize=9, va="top")
    foot = []
    for s in stalls:
        foot.append(f"stall ({s['name']}): consumer at {s['consumer_mb_s']:.0f} MB/s (half of cold) blocked "
                    f"{100 * s['blocked_share']:.2f}% of the epoch in open+read after batch 0 "
                    f"({100 * s['excess_share']:.2f}% beyond the copy), prefetch={s['prefetch']}; daemon stall_p99 {s['daemon']['stall_p99_us']} us")
    if foot:
        fig.text(0.01, 0.01, "\n".join(foot), fontsize=8, va="bottom")
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.27, right=0.64, top=1 - 0.75 / h, bottom=(0.75 + 0.16 * len(foot)) / h)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description="tensorfs benchmark driver (see scripts/bench)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows in the dataset (default 1000000: ~272 MB)")
    ap.add_argument("--size", help="dataset size instead of --rows, e.g. 2G (tensor bytes; 272 a row)")
    ap.add_argument("--batch-size", type=int, default=1024, help="rows per batch (default 1024, tensorfs's default)")
    ap.add_argument("--files", type=int, default=4, help="Parquet files (default 4)")
    ap.add_argument("--row-group-rows", type=int, default=50_000, help="rows per row group (default 50000)")
    ap.add_argument("--out-dir", help="scratch directory (default: a new temporary directory, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary scratch directory")
    ap.add_argument("--png", default="bench.png", help="chart to write (default bench.png); '' for none")
    ap.add_argument("--json", help="also write every measurement as JSON here")
    ap.add_argument("--skip", default="", help="comma-separated: npy,pyarrow,petastorm,s3,tensorfs,warm,shuffle,stall "
                    "(s3 skips every S3 row, Petastorm's too)")
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "tensorfs"), help="tensorfs binary")
    ap.add_argument("--stall-prefetch", type=int, default=8, help="prefetch= of the stall experiment's mounts (default 8)")
    ap.add_argument("--tensorfs-options", default="", help="extra -o options for every mount")
    ap.add_argument("--no-drop-caches", action="store_true", help="never drop the page cache")
    ap.add_argument("--petastorm-python", help="an interpreter with a working petastorm")
    ap.add_argument("--no-side-venv", action="store_true",
                    help=f"if petastorm fails in .venv, do not build target/{SIDE_VENV.name} with versions it runs with")
    ap.add_argument("--petastorm-workers", type=int, default=10, help="petastorm workers_count (default 10, its default)")
    ap.add_argument("--petastorm-worker", help=argparse.SUPPRESS)
    ap.add_argument("--petastorm-cache", help=argparse.SUPPRESS)
    ap.add_argument("--petastorm-endpoint", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.size:
        s = a.size.strip().upper().rstrip("B").rstrip("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
        a.rows = max(1, int(float(s.rstrip("KMGT")) * mult) // ROW_BYTES)
    if a.petastorm_worker:
        petastorm_worker(a.petastorm_worker, a.rows, a.petastorm_cache, a.petastorm_workers, a.petastorm_endpoint)
        return 0
    if a.rows < 1 or a.batch_size < 1 or a.files < 1 or a.row_group_rows < 1:
        raise SystemExit("bench: --rows, --batch-size, --files and --row-group-rows must be positive")
    try:
        return run(a)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
