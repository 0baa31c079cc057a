"""MosaicML Streaming on the bench's rows (information, issue 31): its per-sample reader beside
the per-batch files tensorfs serves.

The bench dataset's first rows are written as MDS shards on local disk (`MDSWriter`, no
compression, the four tensors as int64, float32, ndarray float32[64] and int32), then read
once by `StreamingDataset(shuffle=True)` in one process, sample by sample, as a map-style
dataset is read by a DataLoader without workers. Its rate per sample does not depend on how
many rows there are, so a subset keeps the run short.

Streaming 0.13 pins NumPy < 2.2 and xxhash < 4 without needing them (it runs with the .venv's);
it imports torch, torchvision and transformers. So it runs in a side venv that sees the .venv's
packages (a .pth file) and adds only what the .venv lacks; where the .venv has no torch, the row
is left out, saying why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from .common import MB, REPO, ROW_BYTES, VENV_PY, log, make_venv, pip_install, probe

SIDE_VENV = REPO / "target" / "bench-streaming-venv"
NO_DEPS = ["mosaicml-streaming==0.13.0"]
PACKAGES = ["xxhash", "catalogue", "zstd", "python-snappy", "Brotli", "pillow", "torchvision", "transformers<5"]


# What a working MosaicML Streaming imports.
STREAMING = "import streaming, torch"


def streaming_python() -> tuple[Path | None, str]:
    """(interpreter, note), or (None, why there is none)."""
    r = subprocess.run([str(VENV_PY), "-c", "import site, torch; print(site.getsitepackages()[0])"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, "no torch in .venv (MosaicML Streaming imports it)"
    py = SIDE_VENV / "bin" / "python"
    if not py.exists() or probe(py, STREAMING) is not None:
        log(f"setting up a side venv for MosaicML Streaming: target/{SIDE_VENV.name}")
        made = make_venv(SIDE_VENV)
        if made:
            return None, f"side venv: {made}"
        site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True).stdout.strip()
        (Path(site) / "tensorfs-bench-main-venv.pth").write_text(r.stdout.strip() + "\n")
        err = pip_install(py, "--no-deps", *NO_DEPS) or pip_install(py, *PACKAGES) or probe(py, STREAMING)
        if err:
            return None, f"MosaicML Streaming does not install or import: {err}"
    return py, "MosaicML Streaming 0.13.0 (side venv over .venv)"


def worker(parquet_dir: str, out: str, rows: int) -> None:
    """Runs under the side interpreter: writes ROWS rows as MDS, reads them once shuffled, prints
    one JSON line."""
    import shutil
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    import pyarrow.dataset as ds
    from streaming import MDSWriter, StreamingDataset

    table = ds.dataset(parquet_dir, format="parquet").head(rows)
    ids = table.column("id").to_numpy()
    xs = table.column("x").to_numpy()
    emb = np.asarray(table.column("emb").combine_chunks().flatten()).reshape(len(ids), 64)
    labels = table.column("label").to_numpy()
    mds = Path(out)
    shutil.rmtree(mds, ignore_errors=True)
    columns = {"id": "int64", "x": "float32", "emb": "ndarray:float32:64", "label": "int32"}
    with MDSWriter(out=str(mds), columns=columns, compression=None) as w:
        for k in range(len(ids)):
            w.write({"id": ids[k], "x": xs[k], "emb": emb[k], "label": labels[k]})
    dataset = StreamingDataset(local=str(mds), shuffle=True, shuffle_seed=7, batch_size=1)
    seen = nbytes = 0
    t = time.perf_counter()
    for sample in dataset:
        nbytes += sum(np.asarray(v).nbytes for v in sample.values())
        seen += 1
    seconds = time.perf_counter() - t
    if seen != len(ids) or nbytes != seen * ROW_BYTES:
        raise RuntimeError(f"read {seen} samples, {nbytes} bytes, of {len(ids)} rows")
    print(json.dumps({"rows": seen, "bytes": nbytes, "seconds": seconds}))


def streaming_row(data: Path, scratch: Path, rows: int) -> dict:
    """The measurement, or {"skipped": why}."""
    py, note = streaming_python()
    if py is None:
        log(f"MosaicML Streaming left out: {note}")
        return {"skipped": note}
    log(f"MosaicML Streaming: {note}; {rows} rows as MDS on local disk, one shuffled epoch, one process")
    r = subprocess.run([str(py), "-m", "benchlib.streaming_side", str(data), str(scratch / "mds"), str(rows)],
                       cwd=REPO / "scripts", capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["?"])[-1]
        log(f"MosaicML Streaming failed: {why}")
        return {"skipped": why}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["mb_s"] = out["bytes"] / MB / out["seconds"]
    out["samples_s"] = out["rows"] / out["seconds"]
    out["note"] = note
    log(f"MosaicML Streaming: {out['mb_s']:.2f} MB/s, {out['samples_s']:.0f} samples/s")
    return out


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
