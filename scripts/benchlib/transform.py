"""Your own transform (PRODUCT.md §10, docs/transforms.md), against Petastorm's TransformSpec.

A table of its own: int64 `id`, a `city` string (one of 5000 names, 4000 of them in the
vocabulary), float64 `x`, float32 `f0`..`f7` and int32 `label`, over --files files of
--row-group-rows row groups. The transform turns `city` into int64 vocabulary ids (a name not in
the vocabulary gets the next id) and standardises `x` into float32; the other columns pass
through: 56 tensor bytes a row out. It is written twice, in a directory of its own beside a
vocabulary file (vocab.json):

  features.py       `transform(batch)`: a pyarrow.RecordBatch in, a dict of NumPy arrays out
                    (the ids by pyarrow.compute.index_in), run under .venv's Python
  features_spec.py  `spec`: a petastorm.transform.TransformSpec whose func maps a pandas
                    DataFrame (`Series.map` of the vocabulary), edit_fields giving the new types,
                    run under Petastorm's interpreter (.petastorm-venv, or the bench's side venv)

Measured, with the page cache dropped before each cold epoch (when we are root):

  petastorm         make_batch_reader(url, transform_spec=spec, workers_count=N,
                    shuffle_row_groups=False, num_epochs=1), with its thread pool (its default)
                    and its process pool; batches are row groups. Timed from the reader made to
                    its last batch; its CPU is the process's (every thread) and its pool
                    processes' over that window. Run twice, page cache dropped each
                    time: the faster run is the row.
  tensorfs cold     mount -o transform=…,transform_workers=N,epochs=2 (the default shuffle) on a
                    fresh cache_dir, every epoch-0/NNNNNN.safetensors read with
                    safetensors.numpy.load_file: with the TransformSpec (python= Petastorm's
                    interpreter) and with the plain function (python=.venv's)
  tensorfs epoch 1  the next epoch, read right after (reshuffled from the cached output: the
                    workers' CPU in it is ~0)
  remounted         the TransformSpec mount again on the same cache_dir, page cache dropped,
                    epoch 0 (the cached output; the function is only called by the mount's trial)
  no transform      the same table mounted with columns= leaving `city` out (x float64), epochs 0
                    and 1, for comparison
  Petastorm's batches  the TransformSpec mount delivering what Petastorm's reader does: batch_size
                    a row group and shuffle=none (the rows above are shuffled batches of
                    --batch-size, which Petastorm's reader leaves to the training loop)

The daemon's CPU is utime+stime of its process (every thread) from the end of the mount to the
end of the epoch's last read; the workers' is the same of the daemon's descendant processes (the
transform's workers: those alive at the end; one that died within the window is missing).
core-s/GB: core-seconds per GB of tensor bytes delivered. The served values are checked
(outside timing) against the transform applied here, and Petastorm's by their sums.

Run as a module in Petastorm's interpreter (`python -m benchlib.transform petastorm …`) it is
the Petastorm reader; imported by bench.py it drives the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import MB, REPO, VENV_PY, log, probe

CITIES = 5000
VOCAB = 4000  # cities 0..VOCAB-1 have ids; the rest are UNKNOWN (= VOCAB)
MEAN, STD = 41.7, 12.3
FLOATS = [f"f{k}" for k in range(8)]
OUT_COLUMNS = ["id", "city", "x", *FLOATS, "label"]
OUT_ROW_BYTES = 8 + 8 + 4 + 4 * len(FLOATS) + 4
PLAIN_COLUMNS = ["id", "x", *FLOATS, "label"]  # the no-transform mount: city left out, x float64
PLAIN_ROW_BYTES = 8 + 8 + 4 * len(FLOATS) + 4
PETASTORM_VENV = REPO / ".petastorm-venv"
# The daemon's own counters of where its workers' CPU went (stats.md): decoding (with a
# transform: the Parquet decode, the exchange with the Python worker and the output's decode),
# gathering batches, writing batch files.
PARTS = ("decode_cpu_ns", "gather_cpu_ns", "batch_write_cpu_ns")
PETASTORM_PROBE = "import pandas; from petastorm import make_batch_reader; from petastorm.transform import TransformSpec"


def city_name(k: int) -> str:
    # Names of varied length, as real ones are.
    return f"{'Nor Sud Est Ouest Bad Sankt Port San'.split()[k % 8]}-{k * 7919 % 100003}-{'x' * (k % 11)}"


# --------------------------------------------------------------------------------------------
# The table and the transforms
# --------------------------------------------------------------------------------------------


def write_table(out: Path, rows: int, files: int, rg_rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    names = np.array([city_name(k) for k in range(CITIES)], dtype=object)
    per_file = -(-rows // files)
    for f, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        rng = np.random.default_rng(3000 + f)
        # Skewed, as cities are: a few are most of the rows.
        k = np.minimum(rng.zipf(1.3, n) - 1, CITIES - 1)
        cols = {
            "id": np.arange(start, start + n, dtype=np.int64),
            "city": pa.array(names[k], type=pa.string()),
            "x": rng.normal(MEAN, STD, n),
        }
        cols.update({c: rng.standard_normal(n, dtype=np.float32) for c in FLOATS})
        cols["label"] = rng.integers(0, 2, n, dtype=np.int32)
        pq.write_table(pa.table(cols), out / f"part-{f:05d}.parquet", row_group_size=rg_rows, compression="snappy")


PLAIN_SOURCE = '''"""The bench's transform as a plain function: city names to vocabulary ids, x standardised."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vocab.json")) as f:
    VOCAB = json.load(f)  # {name: id}
UNKNOWN = len(VOCAB)
NAMES = pa.array(sorted(VOCAB, key=VOCAB.get), type=pa.string())  # NAMES[id] = name
MEAN, STD = %(mean)r, %(std)r
PASS = %(passed)r


def transform(batch):
    ids = pc.index_in(batch.column("city"), value_set=NAMES).fill_null(UNKNOWN)
    out = {
        "id": batch.column("id").to_numpy(),
        "city": ids.to_numpy().astype(np.int64),
        "x": ((batch.column("x").to_numpy() - MEAN) / STD).astype(np.float32),
    }
    for name in PASS:
        out[name] = batch.column(name).to_numpy()
    return out
'''

SPEC_SOURCE = '''"""The bench's transform as a Petastorm TransformSpec: the same outputs from a DataFrame."""
import json
import os

import numpy as np
from petastorm.transform import TransformSpec

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vocab.json")) as f:
    VOCAB = json.load(f)  # {name: id}
UNKNOWN = len(VOCAB)
MEAN, STD = %(mean)r, %(std)r


def _features(df):
    df["city"] = df["city"].map(VOCAB).fillna(UNKNOWN).astype(np.int64)
    df["x"] = ((df["x"] - MEAN) / STD).astype(np.float32)
    return df


spec = TransformSpec(_features, edit_fields=[("city", np.int64, (), False), ("x", np.float32, (), False)])
'''


def write_code(code: Path) -> None:
    """vocab.json, features.py and features_spec.py in CODE (mode 0644: a root daemon refuses
    code others may write)."""
    shutil.rmtree(code, ignore_errors=True)
    code.mkdir(parents=True)
    os.chmod(code, 0o755)
    args = {"mean": MEAN, "std": STD, "passed": [*FLOATS, "label"]}
    for name, text in (("vocab.json", json.dumps({city_name(k): k for k in range(VOCAB)})),
                       ("features.py", PLAIN_SOURCE % args), ("features_spec.py", SPEC_SOURCE % args)):
        (code / name).write_text(text)
        os.chmod(code / name, 0o644)


def reference(data: Path) -> dict:
    """The transform's output by id, computed here: city ids and x (float32), plus their sums."""
    import numpy as np
    import pyarrow.parquet as pq

    from .dataset import parquet_files

    t = pq.read_table(parquet_files(data), columns=["id", "city", "x"])
    ids = t.column("id").to_numpy()
    vocab = {city_name(k): k for k in range(VOCAB)}
    city = np.array([vocab.get(c, VOCAB) for c in t.column("city").to_pylist()], dtype=np.int64)
    x = ((t.column("x").to_numpy() - MEAN) / STD).astype(np.float32)
    order = np.argsort(ids)
    if not np.array_equal(ids[order], np.arange(len(ids))):
        raise RuntimeError("transform table: ids are not 0..rows-1")
    return {"city": city[order], "x": x[order], "city_sum": int(city.sum()), "x_sum": float(x.astype(np.float64).sum()),
            "unknown": float((city == VOCAB).mean())}


# --------------------------------------------------------------------------------------------
# CPU of a process and its descendants, from /proc
# --------------------------------------------------------------------------------------------


def _procs() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime in ticks) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def cpu_ticks(roots: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """(ROOTS' ticks, their descendants' ticks), by pid."""
    procs = _procs()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    own = {p: procs[p][1] for p in roots if p in procs}
    below, todo = {}, [k for p in roots for k in kids.get(p, [])]
    while todo:
        p = todo.pop()
        if p in procs and p not in below and p not in own:
            below[p] = procs[p][1]
            todo.extend(kids.get(p, []))
    return own, below


def ticks_delta(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds the processes of AFTER spent since BEFORE (a new one: all of its own)."""
    return sum(t - before.get(p, 0) for p, t in after.items()) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# In Petastorm's interpreter: make_batch_reader with the TransformSpec
# --------------------------------------------------------------------------------------------


def petastorm_main(url: str, code: str, workers: int, pool: str) -> None:
    """One epoch through make_batch_reader with the spec; prints one JSON line."""
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, code)
    import numpy as np
    from petastorm import make_batch_reader

    from features_spec import spec

    me = os.getpid()
    rows = nbytes = city_sum = 0
    x_sum = 0.0
    with make_batch_reader(url, transform_spec=spec, workers_count=workers, reader_pool_type=pool,
                           shuffle_row_groups=False, num_epochs=1) as reader:
        own0, kids0 = cpu_ticks([me])
        t = time.perf_counter()
        for b in reader:
            d = b._asdict()
            if sorted(d) != sorted(OUT_COLUMNS):
                raise RuntimeError(f"petastorm delivered columns {sorted(d)}")
            for k, v in d.items():
                nbytes += np.asarray(v).nbytes
            city_sum += int(np.asarray(d["city"], dtype=np.int64).sum())
            x_sum += float(np.asarray(d["x"], dtype=np.float64).sum())
            rows += len(d["id"])
            if np.asarray(d["city"]).dtype != np.int64 or np.asarray(d["x"]).dtype != np.float32:
                raise RuntimeError(f"petastorm delivered city {np.asarray(d['city']).dtype}, x {np.asarray(d['x']).dtype}")
        seconds = time.perf_counter() - t
        own1, kids1 = cpu_ticks([me])
    print(json.dumps({"rows": rows, "bytes": nbytes, "seconds": seconds, "city_sum": city_sum, "x_sum": x_sum,
                      "cpu_s": ticks_delta(own0, own1) + ticks_delta(kids0, kids1),
                      "pool_processes": len(kids1)}), flush=True)


# --------------------------------------------------------------------------------------------
# In the bench's interpreter: the driver
# --------------------------------------------------------------------------------------------


def petastorm_interpreter(a, skip: set) -> tuple[Path | None, str]:
    """Petastorm's interpreter for the TransformSpec (its reader and tensorfs's workers):
    --petastorm-python, else .petastorm-venv (scripts/setup with SETUP_TESTS=1), else the bench's
    side venv (made when Petastorm is not skipped); or None and why not."""
    from .petastorm_side import SIDE_VENV, petastorm_python

    candidates = [Path(a.petastorm_python)] if a.petastorm_python else [PETASTORM_VENV / "bin" / "python",
                                                                         SIDE_VENV / "bin" / "python"]
    errors = []
    for py in candidates:
        if not py.exists():
            errors.append(f"{py}: missing")
            continue
        err = probe(py, PETASTORM_PROBE)
        if err is None:
            return py, f"petastorm from {py.relative_to(REPO) if py.is_relative_to(REPO) else py}"
        errors.append(f"{py}: {err}")
    if a.petastorm_python or "petastorm" in skip:
        return None, "; ".join(errors)
    py, note = petastorm_python(None, not a.no_side_venv)
    if py is None:
        return None, note
    err = probe(py, PETASTORM_PROBE)
    return (py, note) if err is None else (None, f"{py}: {err}")


def petastorm_run(py: Path, data: Path, code: Path, workers: int, pool: str) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{REPO / 'scripts'}")
    r = subprocess.run([str(py), "-W", "ignore", "-m", "benchlib.transform", "petastorm", f"file://{data}", str(code),
                        str(workers), pool], capture_output=True, text=True, timeout=3600, env=env)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
        raise RuntimeError(tail[-1] if tail else f"exit {r.returncode}")
    return json.loads(lines[-1])


def run_rows(a, binary: Path, scratch: Path, caches, mounts: list, skip: set) -> dict:
    """Writes the table and the transforms, reads them every way above; what print_rows prints."""
    import numpy as np

    from .dataset import parquet_files
    from .methods import read_npy_slices, read_safetensors_files
    from .mounts import Mount

    rows, B, N = a.transform_rows, a.batch_size, a.transform_workers or os.cpu_count()
    data, code = scratch / "data-transform", scratch / "transform-code"
    shutil.rmtree(data, ignore_errors=True)
    log(f"transform: writing {rows} rows (id, city string, x, f0..f7, label) as {a.files} files of "
        f"{a.row_group_rows}-row groups, and the transforms in {code}")
    write_table(data, rows, a.files, a.row_group_rows)
    write_code(code)
    want = reference(data)
    parts = parquet_files(data)
    out = {"rows": rows, "batch_size": B, "workers": N, "files": len(parts), "row_group_rows": a.row_group_rows,
           "parquet_mb": sum(p.stat().st_size for p in parts) / MB, "out_row_bytes": OUT_ROW_BYTES,
           "unknown_share": want["unknown"], "shuffle": a.transform_shuffle or "block (the default)", "results": []}

    def add(key, label, r, nbytes, seconds, **extra):
        row = {"key": key, "method": label, "rows": r, "bytes": nbytes, "seconds": seconds, "rows_s": r / seconds,
               "mb_s": nbytes / MB / seconds, **extra}
        for what in ("daemon", "workers", "process"):
            if f"{what}_cpu_s" in row:
                row[f"{what}_core_s_gb"] = row[f"{what}_cpu_s"] / (nbytes / 1e9)
        out["results"].append(row)
        cpu = ", ".join(f"{w} {row[f'{w}_core_s_gb']:.2f}" for w in ("daemon", "workers", "process")
                        if f"{w}_core_s_gb" in row)
        log(f"transform, {label}: {r} rows, {nbytes / MB:.1f} MB in {seconds:.2f} s = {row['mb_s']:.1f} MB/s"
            + (f"; core-s/GB: {cpu}" if cpu else ""))
        return row

    def unavailable(key, label, why):
        out["results"].append({"key": key, "method": label, "unavailable": why})
        log(f"transform, {label}: unavailable: {why}")

    pet_py, note = petastorm_interpreter(a, skip)
    out["petastorm"] = note
    log(f"transform: {note}")

    # ---- Petastorm: make_batch_reader with the TransformSpec --------------------------------
    for pool in ("thread", "process"):
        key, label = f"tr_petastorm_{pool}", f"petastorm make_batch_reader, TransformSpec, {pool} pool"
        if "petastorm" in skip:
            unavailable(key, label, "--skip petastorm")
            continue
        if pet_py is None:
            unavailable(key, label, note)
            continue
        try:
            # The faster of two cold epochs: one slow run of the peer would flatter every ratio.
            runs = []
            for _ in range(2):
                caches.drop()
                e = petastorm_run(pet_py, data, code, N, pool)
                if e["rows"] != rows or e["city_sum"] != want["city_sum"] or abs(e["x_sum"] - want["x_sum"]) > 1e-3 * rows:
                    raise RuntimeError(f"petastorm's output differs from the transform's: {e['rows']} rows, city sum "
                                       f"{e['city_sum']} (want {want['city_sum']}), x sum {e['x_sum']:.3f} (want {want['x_sum']:.3f})")
                runs.append(e)
            e = min(runs, key=lambda r: r["seconds"])
            add(key, label, e["rows"], e["bytes"], e["seconds"], process_cpu_s=e["cpu_s"],
                pool_processes=e["pool_processes"], runs_seconds=[r["seconds"] for r in runs])
        except Exception as e:  # any failure: say so and go on
            unavailable(key, label, str(e)[-300:])

    # ---- tensorfs: the TransformSpec, the plain function, no transform -----------------------
    def check(m: Mount, what: str) -> None:
        """Epoch 0 through all/ (outside timing): a permutation, and the transform's values."""
        root = m.mnt / "epoch-0" / "all"
        ids = np.load(root / "id.npy")
        if not np.array_equal(np.sort(ids), np.arange(rows)):
            raise RuntimeError(f"tensorfs {what}: epoch 0 is not a permutation of the rows")
        for k in ("city", "x"):
            if not np.array_equal(np.load(root / f"{k}.npy"), want[k][ids]):
                raise RuntimeError(f"tensorfs {what}: {k} differs from the transform applied to the source rows")

    def epochs(key, label, options, verify, remount=False, reader="files", like_petastorm=False):
        cache = scratch / f"cache-{key}"
        mnt = scratch / f"mnt-{key}"
        shutil.rmtree(cache, ignore_errors=True)
        base = [f"batch_size={B}", "epochs=2", f"cache_dir={cache}", *options]
        if like_petastorm:
            # The batches Petastorm's reader gives: a row group each, in the table's order.
            base[0] = f"batch_size={a.row_group_rows}"
            base.append("shuffle=none")
        elif a.transform_shuffle:
            base.append(f"shuffle={a.transform_shuffle}")
        try:
            caches.drop()
            m = Mount(binary, f"file://{data}", mnt, base)
            mounts.append(m)
            n = m.dataset()["batches_per_epoch"]
            names = [t["name"] for t in m.dataset()["tensors"]]
            own, kids, stats = *cpu_ticks(m.pids), m.stats()
            got = {}
            # Petastorm's batches repeat their order: the next epoch is the page cache's, not ours.
            for e, what in ((0, "cold"), (1, "epoch 1, right after"))[:1 if like_petastorm else 2]:
                first: list = []
                if reader == "all":
                    r = read_npy_slices(m.mnt / f"epoch-{e}" / "all", rows, B, names, first=first)
                else:
                    r = read_safetensors_files(m.mnt / f"epoch-{e}", n, first=first)
                own1, kids1 = cpu_ticks(m.pids)
                stats1 = m.stats()
                got[e] = add(f"{key}_e{e}", f"{label}, {what}", *r, first_batch_s=first[0],
                             daemon_cpu_s=ticks_delta(own, own1),
                             workers_cpu_s=ticks_delta(kids, kids1), workers_alive=len(kids1),
                             daemon_parts_s={k: (stats1.get(k, 0) - stats.get(k, 0)) / 1e9 for k in PARTS})
                own, kids, stats = own1, kids1, stats1
            if verify:
                check(m, label)
            m.unmount()
            mounts.remove(m)
            if remount:
                caches.drop()
                m = Mount(binary, f"file://{data}", mnt, base)
                mounts.append(m)
                own, kids = cpu_ticks(m.pids)
                r = read_safetensors_files(m.mnt / "epoch-0", n)
                own1, kids1 = cpu_ticks(m.pids)
                add(f"{key}_remount", f"{label}, remounted, page cache dropped", *r,
                    daemon_cpu_s=ticks_delta(own, own1), workers_cpu_s=ticks_delta(kids, kids1))
                stats = m.stats()
                out[f"{key}_remount_row_groups_decoded"] = stats.get("row_groups_decoded")
                m.unmount()
                mounts.remove(m)
            return got
        except Exception as e:  # any failure: say so and go on
            unavailable(f"{key}_e0", f"{label}, cold", str(e)[-300:])
            for m in [m for m in mounts if m.mnt == mnt]:
                m.unmount()
                mounts.remove(m)
            return None
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    common = [f"transform_workers={N}", "transform_version=vocab-1"]
    if pet_py is not None:
        epochs("tr_tfs_spec", "tensorfs, TransformSpec", [f"transform={code / 'features_spec.py'}:spec",
                                                          f"python={pet_py}", *common], True, remount=True)
        epochs("tr_tfs_spec_rg", "tensorfs, TransformSpec, Petastorm's batches (a row group, in order)",
               [f"transform={code / 'features_spec.py'}:spec", f"python={pet_py}", *common], False,
               like_petastorm=True)
    else:
        unavailable("tr_tfs_spec_e0", "tensorfs, TransformSpec, cold", note)
    epochs("tr_tfs_fn", "tensorfs, plain function", [f"transform={code / 'features.py'}:transform",
                                                     f"python={VENV_PY}", *common], True)
    epochs("tr_tfs_none", "tensorfs, no transform (columns= without city)", [f"columns={':'.join(PLAIN_COLUMNS)}"], False)
    # The fast path (PRODUCT.md §6): the same epochs read through all/NAME.npy memory maps,
    # batch by batch, one open per tensor and epoch instead of one per batch file.
    if pet_py is not None:
        epochs("tr_tfs_spec_all", "tensorfs, TransformSpec, all/*.npy slices",
               [f"transform={code / 'features_spec.py'}:spec", f"python={pet_py}", *common], False, reader="all")
    epochs("tr_tfs_fn_all", "tensorfs, plain function, all/*.npy slices",
           [f"transform={code / 'features.py'}:transform", f"python={VENV_PY}", *common], False, reader="all")
    epochs("tr_tfs_none_all", "tensorfs, no transform, all/*.npy slices", [f"columns={':'.join(PLAIN_COLUMNS)}"],
           False, reader="all")
    shutil.rmtree(data, ignore_errors=True)
    return out


def get(tr: dict, key: str) -> dict | None:
    return next((r for r in tr["results"] if r["key"] == key and "unavailable" not in r), None)


def print_rows(tr: dict) -> None:
    print()
    print(f"Your own transform (transform=, PRODUCT.md §10): {tr['rows']} rows of int64 id, string city "
          f"({100 * tr['unknown_share']:.0f}% not in the vocabulary), float64 x, float32 f0..f7, int32 label "
          f"({tr['parquet_mb']:.0f} MB of Parquet in {tr['files']} files, {tr['row_group_rows']}-row groups); out: city "
          f"int64 ids, x standardised float32, {tr['out_row_bytes']} bytes a row; batch_size {tr['batch_size']}, "
          f"{tr['workers']} workers (transform_workers=, workers_count=), tensorfs shuffle {tr['shuffle']}; {tr['petastorm']}")
    from .report import fmt_rate

    head = (f"{'method':<70} {'rows/s':>9} {'MB/s':>8} {'x petastorm':>12} {'daemon':>7} {'workers':>8} {'total':>7}")
    print(head)
    print(f"{'':<70} {'':>9} {'':>8} {'(thread)':>12} {'core-s/GB delivered':>24}")
    print("-" * len(head))
    base = get(tr, "tr_petastorm_thread")
    for r in tr["results"]:
        if "unavailable" in r:
            print(f"{r['method']:<70} unavailable: {r['unavailable']}")
            continue
        x = f"{r['mb_s'] / base['mb_s']:.2f}" if base else "-"
        d, w = r.get("daemon_core_s_gb"), r.get("workers_core_s_gb")
        total = r.get("process_core_s_gb", (d or 0) + (w or 0) if d is not None else None)
        cell = lambda v: f"{v:.2f}" if v is not None else ""
        print(f"{r['method']:<70} {fmt_rate(r['rows_s']):>9} {r['mb_s']:>8.1f} {x:>12} {cell(d):>7} {cell(w):>8} "
              f"{cell(total):>7}")
    print("(MB/s: tensor bytes delivered as NumPy arrays, 56 a row with the transform, 52 without; petastorm's "
          "total: its process and its pool's; tensorfs: the daemon's and its workers')")
    lines = []
    spec = get(tr, "tr_tfs_spec_e0")
    for pool in ("thread", "process"):
        p = get(tr, f"tr_petastorm_{pool}")
        for key, what in (("tr_tfs_spec_e0", "batch files"), ("tr_tfs_spec_all_e0", "all/*.npy slices")):
            r = get(tr, key)
            if r and p:
                lines.append(f"tensorfs cold with the TransformSpec, {what} / petastorm {pool} pool (MB/s): "
                             f"{r['mb_s'] / p['mb_s']:.2f}")
    like, p = get(tr, "tr_tfs_spec_rg_e0"), get(tr, "tr_petastorm_thread")
    if like and p:
        lines.append(f"tensorfs cold with the TransformSpec, Petastorm's batches (batch_size a row group, shuffle=none) / "
                     f"petastorm thread pool (MB/s): {like['mb_s'] / p['mb_s']:.2f}")
    fn = get(tr, "tr_tfs_fn_e0")
    if fn and spec:
        lines.append(f"plain function / TransformSpec, tensorfs cold (MB/s): {fn['mb_s'] / spec['mb_s']:.2f}")
    none1 = get(tr, "tr_tfs_none_e1")
    for key, what in (("tr_tfs_spec_e1", "TransformSpec"), ("tr_tfs_fn_e1", "plain function")):
        r = get(tr, key)
        if r and none1:
            lines.append(f"epoch 1 with the {what} / without a transform (rows/s): {r['rows_s'] / none1['rows_s']:.2f}")
    for key in ("tr_tfs_spec_e0", "tr_tfs_spec_all_e0", "tr_tfs_spec_rg_e0", "tr_tfs_none_e0"):
        r = get(tr, key)
        if r and r.get("first_batch_s") is not None:
            # Under a shuffle of one block, the first batch waits for the whole table's transform.
            lines.append(f"{r['method']}: the first batch after {r['first_batch_s']:.2f} s of the epoch's "
                         f"{r['seconds']:.2f} s")
    for key in ("tr_tfs_spec_e0", "tr_tfs_fn_e0", "tr_tfs_none_e0"):
        r = get(tr, key)
        if r and r.get("daemon_parts_s"):
            gb = r["bytes"] / 1e9
            parts = ", ".join(f"{k.removesuffix('_cpu_ns')} {v / gb:.2f}" for k, v in r["daemon_parts_s"].items())
            lines.append(f"{r['method']}: the daemon's {r['daemon_core_s_gb']:.2f} core-s/GB, of which its own counters "
                         f"show {parts}; the rest is serving the reads")
    rg = tr.get("tr_tfs_spec_remount_row_groups_decoded")
    if rg is not None:
        lines.append(f"remounted on the same cache: row_groups_decoded {rg} (the function ran only in the mount's trial)")
    if lines:
        print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1] == "petastorm":
        petastorm_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]}")
