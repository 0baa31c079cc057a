"""Seeds each fuzz target's corpus (fuzz/corpus/TARGET/) from the test fixtures: Parquet footers
written by Spark, Delta, Hudi and Petastorm, Petastorm's Unischema pickles and cells, a snapshot.

    .venv/bin/python fuzz/seed.py target/release/tensorfs
"""

import hashlib
import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

FUZZ = Path(__file__).resolve().parent
FIXTURES = FUZZ.parent / "tests" / "fixtures"


def put(target: str, data: bytes) -> None:
    out = FUZZ / "corpus" / target
    out.mkdir(parents=True, exist_ok=True)
    (out / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main(binary: str) -> None:
    parquet = sorted(FIXTURES.rglob("*.parquet")) + sorted(FIXTURES.rglob("_common_metadata"))
    for p in parquet:
        b = p.read_bytes()
        if len(b) >= 12 and b[-4:] == b"PAR1":
            n = int.from_bytes(b[-8:-4], "little")
            put("footer", b[-8 - n:-8])
    for p in FIXTURES.rglob("_common_metadata"):
        kv = pq.read_metadata(p).metadata or {}
        for k, v in kv.items():
            if b"unischema" in k:
                put("unischema", v)
    for a in (np.arange(12, dtype=np.int32).reshape(3, 4), np.zeros((2, 2, 3), np.uint8), np.array(["ab", "c"]),
              np.float64(1.5), np.ones(5, ">f4")):
        f = io.BytesIO()
        np.save(f, a)
        put("npy", f.getvalue())
        f = io.BytesIO()
        np.savez_compressed(f, arr=a)
        put("npy", f.getvalue())
    with tempfile.TemporaryDirectory() as d:
        snap = Path(d) / "fixture.snapshot"
        src = FIXTURES / "petastorm" / "ndarrays"
        subprocess.run([binary, "snapshot", f"file://{src}", str(snap)], check=True, capture_output=True)
        put("snapshot", snap.read_bytes())
    for t in ("footer", "unischema", "npy", "snapshot"):
        print(t, len(list((FUZZ / "corpus" / t).iterdir())))


if __name__ == "__main__":
    main(sys.argv[1])
