#!/usr/bin/env python3
"""Batch files through the mount against the same files on local disk, read alternately, with
each `opens=` mode: a warm epoch read five times, and shuffled epochs 2 to 7 each read once as
soon as its files were built while the epoch before was read. Prints each mode's MB/s and the
ratio of the medians to the local reads (docs/dev/performance.md, "Warm epochs: through the mount against local files").

    .venv/bin/python scripts/bench_opens.py [--rows 1000000] [--bin target/release/tensorfs]
"""

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.dataset import write_dataset  # noqa: E402
from benchlib.methods import read_safetensors_files  # noqa: E402
from benchlib.mounts import Mount  # noqa: E402


def mb_s(r) -> float:
    return r[1] / r[2] / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--bin", default=str(Path(__file__).resolve().parent.parent / "target/release/tensorfs"))
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tensorfs-bench-opens-"))
    try:
        data, local = scratch / "data", scratch / "local"
        write_dataset(data, a.rows, 4, 50_000)
        for mode in ("kernel", "daemon"):
            m = Mount(Path(a.bin), f"file://{data}", scratch / f"mnt-{mode}",
                      ["batch_size=1024", "epochs=8", f"opens={mode}", f"cache_dir={scratch / f'cache-{mode}'}"])
            try:
                n = m.dataset()["batches_per_epoch"]
                read_safetensors_files(m.mnt / "epoch-0", n)
                if not local.exists():
                    local.mkdir()
                    for i in range(n):
                        shutil.copyfile(m.mnt / "epoch-0" / f"{i:06d}.safetensors", local / f"{i:06d}.safetensors")
                read_safetensors_files(local, n)
                warm, warm_local = [], []
                for _ in range(5):
                    warm.append(mb_s(read_safetensors_files(m.mnt / "epoch-0", n)))
                    warm_local.append(mb_s(read_safetensors_files(local, n)))
                read_safetensors_files(m.mnt / "epoch-1", n)
                ahead, ahead_local = [], []
                for e in range(2, 8):
                    m.settled("page_cache_stores" if mode == "kernel" else "next_epoch_files_built")
                    ahead.append(mb_s(read_safetensors_files(m.mnt / f"epoch-{e}", n)))
                    ahead_local.append(mb_s(read_safetensors_files(local, n)))
                for what, mine, theirs in (("warm epoch", warm, warm_local),
                                           ("shuffled epochs built ahead", ahead, ahead_local)):
                    print(f"opens={mode}, {what}: {[round(v) for v in mine]} MB/s, local {[round(v) for v in theirs]}: "
                          f"{statistics.median(mine) / statistics.median(theirs):.2f}x")
            finally:
                m.unmount()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
