"""Many hosts (PRODUCT.md §5 "Many hosts: partitions=P", §6; issue 12): W simulated hosts on this
machine, each its own tensorfs mount of the bench dataset's S3 prefix with its own cache_dir,
each reading only its rank view, epoch-0/rank-R-of-W/ then epoch-1/rank-R-of-W/, once with
partitions=1 and once with partitions=W. Per host and epoch: the bytes and requests the daemon
fetched (its `remote_bytes` and `remote_requests`; the footers read at mount time count in epoch
0) and the CPU time its workers spent decoding (`decode_cpu_ns`). The totals are compared with
one mount, the same content options and a fresh cache, reading the whole epoch-0/.

The hosts run one after another (the counters are each daemon's own, so running them at once
would change the times only); each host's cache is removed once it has read both epochs.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .common import MB, log
from .methods import read_safetensors_files
from .mounts import Mount

COUNTERS = ("remote_bytes", "remote_requests", "decode_cpu_ns", "row_groups_decoded")


def _delta(after: dict, before: dict) -> dict:
    return {k: (after.get(k) or 0) - (before.get(k) or 0) for k in COUNTERS}


def _read(m: Mount, rel: str, n: int, what: str) -> tuple[dict, dict]:
    """Read N batch files of REL on M; (counters after, the read's rows/bytes/seconds)."""
    rows, nbytes, seconds = read_safetensors_files(m.mnt / rel, n)
    st = m.stats()
    log(f"many hosts: {what}: {rows} rows in {seconds:.2f} s, remote {(st.get('remote_bytes') or 0) / MB:.1f} MB so far")
    return st, {"rows": rows, "bytes": nbytes, "seconds": seconds}


def run_rows(a, binary: Path, s3, scratch: Path, mounts: list) -> dict:
    """Every measurement of the many-hosts row, as a dict for print_rows and --json."""
    W, B = a.hosts, a.batch_size
    out = {"hosts": W, "batch_size": B, "source": s3.source, "runs": []}
    for P in sorted({1, W}):
        content = [f"batch_size={B}", "shuffle=window", "epochs=2", f"partitions={P}"]
        run = {"partitions": P, "options": ",".join(content), "hosts": []}

        # One mount reading its whole epoch-0/: what W hosts are compared with.
        cache = scratch / f"cache-hosts-one-p{P}"
        shutil.rmtree(cache, ignore_errors=True)
        m = Mount(binary, s3.source, scratch / f"mnt-hosts-one-p{P}", [*content, *s3.mount_options(), f"cache_dir={cache}"])
        mounts.append(m)
        try:
            n = m.dataset()["batches_per_epoch"]
            st, r = _read(m, "epoch-0", n, f"partitions={P}, one mount, whole epoch-0")
            run["one"] = {**_delta(st, {}), **r}
        finally:
            m.unmount()
            mounts.remove(m)
            shutil.rmtree(cache, ignore_errors=True)

        for rank in range(W):
            cache = scratch / f"cache-hosts-{rank}"
            shutil.rmtree(cache, ignore_errors=True)
            t = time.perf_counter()
            m = Mount(binary, s3.source, scratch / f"mnt-hosts-{rank}",
                      [*content, f"world_size={W}", *s3.mount_options(), f"cache_dir={cache}"])
            mounts.append(m)
            mount_s = time.perf_counter() - t
            try:
                dj = m.dataset()
                n = dj["rank_batches_per_epoch"]
                host = {"rank": rank, "batches": n, "mount_seconds": mount_s, "epochs": []}
                before: dict = {}
                for e in (0, 1):
                    st, r = _read(m, f"epoch-{e}/rank-{rank}-of-{W}", n, f"partitions={P}, host {rank}, epoch {e}")
                    host["epochs"].append({**_delta(st, before), **r})
                    before = st
                run["hosts"].append(host)
            finally:
                m.unmount()
                mounts.remove(m)
                shutil.rmtree(cache, ignore_errors=True)
        out["runs"].append(run)
    return out


def _total(run: dict, epoch: int, key: str) -> int:
    return sum(h["epochs"][epoch][key] for h in run["hosts"])


def print_rows(hr: dict) -> None:
    W, runs = hr["hosts"], hr["runs"]
    print(f"\nMany hosts: {W} simulated hosts, each its own mount and cache_dir of {hr['source']}, each reading "
          f"epoch-0/rank-R-of-{W}/ then epoch-1/rank-R-of-{W}/ (shuffle=window, batch_size {hr['batch_size']}); "
          "fetched: the daemon's remote_bytes and remote_requests (epoch 0 includes the footers read at mount); "
          "decode CPU: decode_cpu_ns")
    cols = [f"partitions={r['partitions']}" for r in runs]
    head = f"{'':<24}" + "".join(f"{c:>38}" for c in cols)
    sub = f"{'host, epoch':<24}" + f"{'MB fetched':>12}{'requests':>10}{'decode CPU s':>16}" * len(runs)
    print(head)
    print(sub)
    print("-" * len(sub))

    def cells(d: dict) -> str:
        return f"{d['remote_bytes'] / MB:>12.1f}{d['remote_requests']:>10}{d['decode_cpu_ns'] / 1e9:>16.2f}"

    for rank in range(W):
        for e in (0, 1):
            print(f"{f'host {rank}, epoch {e}':<24}" + "".join(cells(r["hosts"][rank]["epochs"][e]) for r in runs))
    for e in (0, 1):
        print(f"{f'all hosts, epoch {e}':<24}" + "".join(
            cells({k: _total(r, e, k) for k in COUNTERS}) for r in runs))
    print(f"{'one mount, all epoch-0':<24}" + "".join(cells(r["one"]) for r in runs))
    print("-" * len(sub))

    def ratio(r: dict, e: int, key: str) -> str:
        one = r["one"][key]
        return f"{_total(r, e, key) / one:.2f}x" if one else "-"

    for e in (0, 1):
        print(f"{f'all / one, epoch {e}':<24}" + "".join(
            f"{ratio(r, e, 'remote_bytes'):>12}{ratio(r, e, 'remote_requests'):>10}{ratio(r, e, 'decode_cpu_ns'):>16}"
            for r in runs))
    print("row groups decoded per host, epoch 0: " + "; ".join(
        f"partitions={r['partitions']}: " + " ".join(str(h["epochs"][0]["row_groups_decoded"]) for h in r["hosts"])
        + f" (one mount: {r['one']['row_groups_decoded']})" for r in runs))
