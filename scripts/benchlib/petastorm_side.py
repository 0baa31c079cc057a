"""Petastorm: the reader run in its own interpreter, and finding (or making) one that runs it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from .common import REPO, ROW_BYTES, TENSORS, VENV_PY, log, make_venv, pip_install, probe


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
    first_s = None
    opened = time.perf_counter()
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
            if first_s is None:
                first_s = time.perf_counter() - opened  # from make_batch_reader to a first batch
            if rows >= rows_total:
                now = time.perf_counter()
                out.append({"rows": rows, "bytes": nbytes, "seconds": now - t, "first_s": first_s})
                rows = nbytes = 0
                t = now
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------------
# Petastorm: which interpreter can run it
# --------------------------------------------------------------------------------------------


# What a working petastorm imports.
PETASTORM = "from petastorm import make_batch_reader"


def petastorm_python(explicit: str | None, allow_side_venv: bool) -> tuple[Path | None, str]:
    """(interpreter, note) or (None, reason it is unavailable)."""
    if explicit:
        err = probe(Path(explicit), PETASTORM)
        return (Path(explicit), f"petastorm from {explicit}") if err is None else (None, err)
    err = probe(VENV_PY, PETASTORM)
    if err and "No module named 'petastorm'" in err:
        log("installing petastorm into .venv (pip install petastorm)")
        err = pip_install(VENV_PY, "petastorm") or probe(VENV_PY, PETASTORM)
    if err is None:
        return VENV_PY, "petastorm in .venv"
    import pyarrow

    first = f"petastorm does not run with pyarrow {pyarrow.__version__} in .venv ({err})"
    log(first)
    if not allow_side_venv:
        return None, first
    py = SIDE_VENV / "bin" / "python"
    if not py.exists() or probe(py, PETASTORM) is not None:
        log(f"setting up a side venv for petastorm: target/{SIDE_VENV.name} ({' '.join(SIDE_VENV_NO_DEPS + SIDE_VENV_PACKAGES)})")
        made = make_venv(SIDE_VENV)
        if made:
            return None, f"{first}; side venv: {made}"
        e2 = pip_install(py, *SIDE_VENV_PACKAGES) or pip_install(py, "--no-deps", *SIDE_VENV_NO_DEPS) or probe(py, PETASTORM)
        if e2:
            return None, f"{first}; side venv: {e2}"
    ver = subprocess.run([str(py), "-c", "import pyarrow, petastorm; print(petastorm.__version__, pyarrow.__version__)"],
                         capture_output=True, text=True).stdout.split()
    return py, f"petastorm {ver[0]} with pyarrow {ver[1]} (side venv: current pyarrow lacks APIs it uses)"


def petastorm_s3fs(py: Path) -> str | None:
    """None if petastorm's interpreter PY has s3fs (for s3:// URLs), else why not. Installs it
    into our side venv when missing there (a side venv made before it was on the list)."""
    err = probe(py, "import s3fs")
    side = SIDE_VENV / "bin" / "python"
    if err and "No module named" in err and py == side:
        log(f"installing s3fs into target/{SIDE_VENV.name} ({' '.join(PETASTORM_S3_PACKAGES)})")
        err = pip_install(py, *PETASTORM_S3_PACKAGES) or probe(py, "import s3fs")
    return f"s3fs in {py}: {err}" if err else None


def petastorm_epochs(py: Path, url: str, a, cache: Path | None = None, endpoint: str | None = None) -> list:
    """Runs petastorm_worker under PY in a fresh process; its epochs' measurements."""
    args = [str(py), "-W", "ignore", str(REPO / "scripts" / "bench.py"), "--petastorm-worker", url,
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
