"""Your own transforms, pushed down and cached (transform=, PRODUCT.md §10): a Python function
run by worker processes on row groups, its output what the cache keeps.

The transform of most tests hashes a string column (`city`) into int64 ids and scales a float
column, and appends a line to a log file on each call (the first id and the rows it was
given), so the tests count how often each row group was transformed. The reference applies
the same function to the source rows, by `id`."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs
from tfs import batch_name

RG = 250
FILES = 3
RGS_PER_FILE = 4
ROWS = RG * RGS_PER_FILE * FILES
BS = 100
# The workers' interpreter: the tests' own, which has pyarrow and NumPy.
PY = f"python={sys.executable}"
CITIES = ["Amsterdam", "Berlin", "Chennai", "Dakar", "Edmonton", "Fukuoka", "Graz"]


def city_id(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") & ((1 << 62) - 1)


@pytest.fixture(scope="module")
def cities_ds(tmp_path_factory) -> Path:
    """3 files of 4 row groups of 250 rows: id (canonical row), city (string), x (float64),
    note (string the transform drops)."""
    path = tmp_path_factory.mktemp("cities") / "data"
    path.mkdir()
    for f in range(FILES):
        ids = np.arange(f * RG * RGS_PER_FILE, (f + 1) * RG * RGS_PER_FILE, dtype=np.int64)
        table = pa.table({
            "id": ids,
            "city": [CITIES[i * 7 % len(CITIES)] for i in ids],
            "x": ids.astype(np.float64) / 10,
            "note": [f"row {i}" for i in ids],
        })
        pq.write_table(table, path / f"part-{f}.parquet", row_group_size=RG)
    return path


def write_transform(path: Path, log: Path, scale: float = 2.0, extra: str = "") -> Path:
    """The module of the tests' transform, `transform(batch)`, logging each call to LOG."""
    path.write_text(textwrap.dedent(f"""
        import hashlib
        import numpy as np
        import pyarrow as pa

        LOG = {str(log)!r}

        def city_id(name):
            return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") & ((1 << 62) - 1)

        def transform(batch):
            ids = batch.column("id").to_numpy()
            with open(LOG, "a") as f:
                f.write(f"{{ids[0]}} {{len(ids)}}\\n")
            return {{
                "id": ids,
                "city": np.array([city_id(c) for c in batch.column("city").to_pylist()], dtype=np.int64),
                "x": (batch.column("x").to_numpy() * {scale} + 1.0).astype(np.float32),
            }}
    """) + extra)
    os.chmod(path, 0o644)
    return path


def calls(log: Path) -> dict[int, int]:
    """How many times the row group starting at each id was given to the function."""
    out: dict[int, int] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        first, _ = line.split()
        out[int(first)] = out.get(int(first), 0) + 1
    return out


def reference(scale: float = 2.0) -> dict[str, np.ndarray]:
    ids = np.arange(ROWS, dtype=np.int64)
    return {
        "city": np.array([city_id(CITIES[i * 7 % len(CITIES)]) for i in ids], dtype=np.int64),
        "x": (ids.astype(np.float64) / 10 * scale + 1.0).astype(np.float32),
    }


def read_epochs(m: tfs.Mount, epochs, scale: float = 2.0) -> None:
    """Every batch of EPOCHS equal to the function applied to its source rows; each epoch a
    permutation."""
    want = reference(scale)
    n = m.dataset()["batches_per_epoch"]
    for e in epochs:
        seen = []
        for i in range(n):
            b = tfs.load_safetensors(m.p(f"epoch-{e}", batch_name(i) + ".safetensors"))
            assert sorted(b) == ["city", "id", "x"], sorted(b)
            tfs.assert_array(b["city"], want["city"][b["id"]], f"epoch {e} batch {i} city")
            tfs.assert_array(b["x"], want["x"][b["id"]], f"epoch {e} batch {i} x")
            seen.append(b["id"])
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(ROWS)), f"epoch {e}"


FIRST_RG_IDS = [f * RG * RGS_PER_FILE + k * RG for f in range(FILES) for k in range(RGS_PER_FILE)]


def test_a_transform_runs_once_per_row_group_and_its_output_is_served(mounter, cities_ds, tmp_path):
    log = tmp_path / "calls.log"
    fn = write_transform(tmp_path / "features.py", log)
    opts = (f"transform={fn}:transform", PY, f"batch_size={BS}", "epochs=3", "transform_workers=2")
    m = mounter(cities_ds, *opts)
    dj = m.dataset()
    assert [(t["name"], t["dtype"]) for t in dj["tensors"]] == [("id", "int64"), ("city", "int64"), ("x", "float32")]
    assert dj["transform"]["function"] == f"{fn}:transform"
    assert len(dj["transform"]["digest"]) == 64
    # The mount tried the function twice on the first row group (two workers), nothing else.
    assert calls(log) == {0: 2}
    read_epochs(m, range(3))
    # Three shuffled epochs: each row group transformed once (the first: twice more at mount).
    assert calls(log) == {i: (3 if i == 0 else 1) for i in FIRST_RG_IDS}
    cache = m.cache
    m.unmount()

    # A remount on the same cache: only the mount-time trial calls the function.
    log.unlink()
    again = mounter(cities_ds, *opts, "epochs=3", cache=cache)
    read_epochs(again, range(3))
    assert calls(log) == {0: 2}, calls(log)
    again.unmount()

    # Another batch size on the same cache: the transformed columns are what the cache keeps.
    log.unlink()
    other = mounter(cities_ds, *opts, "batch_size=64", cache=cache)
    assert other.dataset()["batches_per_epoch"] == -(-ROWS // 64)
    tfs.read_exact(other.p("epoch-0", "all.safetensors"))
    assert calls(log) == {0: 2}, calls(log)
    other.unmount()

    # The function's file changed: it runs again, and its new output is served, never mixed.
    log.unlink()
    write_transform(fn, log, scale=3.0)
    changed = mounter(cities_ds, *opts, cache=cache)
    assert changed.dataset()["transform"]["digest"] != dj["transform"]["digest"]
    read_epochs(changed, [0], scale=3.0)
    assert calls(log) == {i: (3 if i == 0 else 1) for i in FIRST_RG_IDS}
    changed.unmount()

    # transform_version= for what the digest cannot see: another version runs again too.
    log.unlink()
    versioned = mounter(cities_ds, *opts, "transform_version=vocab-2", cache=cache)
    tfs.read_exact(versioned.p("epoch-0", "all.safetensors"))
    assert calls(log) == {i: (3 if i == 0 else 1) for i in FIRST_RG_IDS}


def test_inspect_shows_the_transformed_tensors(cities_ds, tmp_path):
    fn = write_transform(tmp_path / "features.py", tmp_path / "calls.log")
    proc = tfs.run(["inspect", cities_ds, "-o", f"transform={fn}:transform,{PY}"])
    assert proc.returncode == 0, proc.stderr
    assert "transform    " in proc.stdout and "the tensors below are its output's" in proc.stdout
    for line in ("city", "x"):
        assert any(l.split()[:1] == [line] for l in proc.stdout.splitlines()), proc.stdout
    # Without the transform, the string columns are refused.
    plain = tfs.run(["inspect", cities_ds])
    shown = plain.stdout + plain.stderr
    assert "city" in shown and "string" in shown, shown


def test_a_transform_reading_only_its_columns(mounter, cities_ds, tmp_path):
    """transform_columns= gives the function only the columns it reads: `note`, which it does
    not read, is never fetched."""
    log = tmp_path / "calls.log"
    fn = write_transform(tmp_path / "features.py", log)
    m = mounter(cities_ds, f"transform={fn}:transform", PY, "transform_columns=id:city:x", f"batch_size={BS}")
    read_epochs(m, [0])
    assert m.dataset()["transform"]["input_columns"] == 3
    line = refused(mounter, cities_ds, f"transform={fn}:transform", PY, "transform_columns=id:town")
    assert "transform_columns=town" in line and "no column 'town'" in line, line


def refused(mounter, source, *options) -> str:
    """Mount SOURCE expecting a refusal: its one error line; nothing mounted."""
    mnt = mounter.mountpoint()
    opts = ",".join([*options, f"cache_dir={mnt.parent / (mnt.name + '-cache')}"])
    proc = tfs.run(["mount", source, mnt, "-o", opts])
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and not tfs.is_mounted(mnt), line
    assert "\n" not in line
    return line


@pytest.mark.parametrize("case,body,expect", [
    ("raises", "def transform(batch):\n    raise ValueError('no vocabulary for this city')",
     ["ValueError: no vocabulary for this city", "first row group", "part-0.parquet"]),
    ("rows", "def transform(batch):\n    return batch.slice(0, 1)", ["returned 1 rows for 250"]),
    ("random", "import random\nimport pyarrow as pa\n"
               "def transform(batch):\n    return pa.record_batch({'r': [random.random() for _ in range(batch.num_rows)]})",
     ["not deterministic"]),
    ("strings", "def transform(batch):\n    return batch", ["city", "columns="]),
    ("type", "def transform(batch):\n    return 42", ["returned int", "pandas.DataFrame"]),
    ("missing", "def other(batch):\n    return batch", ["has no 'transform'"]),
    ("syntax", "def transform(batch:\n    return batch", ["SyntaxError"]),
])
def test_a_transform_that_cannot_serve_refuses_the_mount_in_one_line(mounter, cities_ds, tmp_path, case, body, expect):
    fn = tmp_path / f"{case}_transform.py"
    fn.write_text(body + "\n")
    os.chmod(fn, 0o644)
    line = refused(mounter, cities_ds, f"transform={fn}:transform", PY)
    for e in expect:
        assert e in line, line


def test_options_that_need_a_transform_and_bad_paths_are_refused(mounter, cities_ds, tmp_path):
    line = refused(mounter, cities_ds, "transform_version=2")
    assert "transform_version=" in line and "transform=FILE.py:NAME" in line, line
    line = refused(mounter, cities_ds, f"transform={tmp_path / 'none.py'}:f", PY)
    assert "no such file" in line, line
    line = refused(mounter, cities_ds, "transform=nosuchmodule_tfs:f", PY)
    assert "nosuchmodule_tfs" in line, line
    line = refused(mounter, cities_ds, "transform=json:dumps", "python=/nonexistent/python3")
    assert "python=/nonexistent/python3" in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is for root")
def test_as_root_a_transform_others_may_write_is_refused(mounter, cities_ds, tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o755)
    fn = write_transform(d / "features.py", tmp_path / "calls.log")
    os.chmod(fn, 0o666)
    line = refused(mounter, cities_ds, f"transform={fn}:transform", PY)
    assert "writable by other users" in line, line
    os.chmod(fn, 0o644)
    os.chmod(d, 0o777)
    line = refused(mounter, cities_ds, f"transform={fn}:transform", PY)
    assert "writable by other users" in line and "shared" in line, line


def test_a_module_on_transform_path(mounter, cities_ds, tmp_path):
    pkg = tmp_path / "features_pkg"
    pkg.mkdir()
    write_transform(pkg / "cities.py", tmp_path / "calls.log")
    m = mounter(cities_ds, "transform=cities:transform", PY, f"transform_path={pkg}", f"batch_size={BS}")
    read_epochs(m, [0])


def test_an_exception_later_fails_only_the_reads_that_need_its_row_group(mounter, cities_ds, tmp_path):
    bad_first = FIRST_RG_IDS[5]  # part-1.parquet, row group 1: rows 1250..1500
    fn = write_transform(tmp_path / "features.py", tmp_path / "calls.log", extra=textwrap.dedent(f"""
        _inner = transform
        def transform(batch):
            if batch.column("id")[0].as_py() == {bad_first}:
                raise KeyError("city not in the vocabulary")
            return _inner(batch)
    """))
    m = mounter(cities_ds, f"transform={fn}:transform", PY, f"batch_size={BS}", "shuffle=none")
    want = reference()
    bad_rows = set(range(bad_first, bad_first + RG))
    for i in range(ROWS // BS):
        path = m.p("epoch-0", batch_name(i) + ".safetensors")
        if set(range(i * BS, (i + 1) * BS)) & bad_rows:
            with pytest.raises(OSError) as e:
                tfs.read_exact(path)
            assert e.value.errno == errno.EIO, (i, e.value)
            continue
        b = tfs.load_safetensors(path)
        tfs.assert_array(b["x"], want["x"][b["id"]], f"batch {i}")
    log = (m.cache / "tensorfs.log").read_text(errors="replace")
    lines = [l for l in log.splitlines() if "KeyError" in l]
    assert lines and "part-1.parquet" in lines[0] and "row group 1" in lines[0], log[-2000:]
    # The mount goes on.
    assert tfs.read_exact(m.p("epoch-0", batch_name(0) + ".safetensors"))


def test_row_groups_past_the_shared_areas_first_size_are_transformed_whole(mounter, tmp_path):
    """Row groups of 450,000 rows go to the worker and back through memory shared with it, past
    the 1 MiB each area starts at: the request (10.8 MB) and the answer (wider than the request:
    a [B, 4] feature, 18 MB, past the 16 MiB whose pages an area keeps, so they are given back
    after each call) grow their areas, and with one worker its two answer areas alternate (or
    the pipe carries an answer while both are still read). Every row of three shuffled epochs
    is the function's output for its source row."""
    rows_per_group, groups = 450_000, 3
    data = tmp_path / "data"
    data.mkdir()
    ids = np.arange(rows_per_group * groups, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float64) / 7, "label": (ids % 5).astype(np.int64)}),
                   data / "part-0.parquet", row_group_size=rows_per_group)
    fn = tmp_path / "wide.py"
    fn.write_text(textwrap.dedent("""
        import numpy as np

        def transform(batch):
            ids = batch.column("id").to_numpy()
            x = batch.column("x").to_numpy()
            feat = np.stack([x, x * 2, x + ids, -x], axis=1).astype(np.float64)
            return {"id": ids, "feat": feat}
    """))
    os.chmod(fn, 0o644)
    m = mounter(data, f"transform={fn}:transform", PY, "batch_size=8192", "epochs=3", "transform_workers=1")
    x = ids.astype(np.float64) / 7
    want = np.stack([x, x * 2, x + ids, -x], axis=1)
    n = m.dataset()["batches_per_epoch"]
    for e in range(3):
        seen = []
        for i in range(n):
            b = tfs.load_safetensors(m.p(f"epoch-{e}", batch_name(i) + ".safetensors"))
            tfs.assert_array(b["feat"], want[b["id"]], f"epoch {e} batch {i} feat")
            seen.append(b["id"])
        assert np.array_equal(np.sort(np.concatenate(seen)), ids), f"epoch {e}"


def test_the_worker_answers_in_the_area_named_and_through_the_pipe_where_none_is(cities_ds, tmp_path):
    """The worker's side of the exchange, driven as the daemon drives it: each request in the
    request area, the answer written into the area named (grown from nothing: the area's file
    is made longer, never shorter) or, given none, sent through the pipe; the same output
    either way."""
    import struct

    fn = write_transform(tmp_path / "features.py", tmp_path / "calls.log")
    areas = [os.memfd_create(name) for name in ("request", "answer-0", "answer-1")]
    worker = (tfs.REPO / "src" / "udf" / "worker.py").read_text()
    env = dict(os.environ, TENSORFS_SHARED_FDS=",".join(map(str, areas)))
    proc = subprocess.Popen([sys.executable, "-c", worker, f"{fn}:transform"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, pass_fds=areas)

    def message():
        head = proc.stdout.read(9)
        (n,) = struct.unpack("<Q", head[1:])
        return head[:1], proc.stdout.read(n)

    try:
        kind, hello = message()
        assert kind == b"R", hello
        want = reference()
        source = pq.read_table(cities_ds / "part-0.parquet")
        for rows, area in [(RG, 1), (RG * 2, 255), (RG * 4, 0), (RG, 1)]:
            sink = pa.BufferOutputStream()
            request = source.slice(0, rows).combine_chunks().to_batches()[0]
            with pa.ipc.new_stream(sink, request.schema) as w:
                w.write_batch(request)
            stream = sink.getvalue().to_pybytes()
            if os.fstat(areas[0]).st_size < len(stream):
                os.ftruncate(areas[0], len(stream))
            os.pwrite(areas[0], stream, 0)
            proc.stdin.write(b"S" + struct.pack("<Q", 9) + struct.pack("<QB", len(stream), area))
            proc.stdin.flush()
            kind, body = message()
            if area == 255:
                assert kind == b"B", body
                out = body
            else:
                assert kind == b"A", body
                (n,) = struct.unpack("<Q", body)
                assert os.fstat(areas[1 + area]).st_size >= n
                out = os.pread(areas[1 + area], n, 0)
            got = pa.ipc.open_stream(pa.py_buffer(out)).read_next_batch()
            ids = got.column("id").to_numpy()
            assert np.array_equal(ids, np.arange(rows))
            assert np.array_equal(got.column("city").to_numpy(), want["city"][ids])
            assert np.array_equal(got.column("x").to_numpy(), want["x"][ids])
        assert os.fstat(areas[1]).st_size > 0 and os.fstat(areas[2]).st_size > 0
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        for fd in areas:
            os.close(fd)


def test_a_worker_that_dies_is_replaced(mounter, cities_ds, tmp_path):
    """A row group whose call kills its worker (os._exit) fails its reads; the pool replaces the
    worker and every other row group is served."""
    kill_first = FIRST_RG_IDS[7]
    fn = write_transform(tmp_path / "features.py", tmp_path / "calls.log", extra=textwrap.dedent(f"""
        import os
        _inner = transform
        def transform(batch):
            if batch.column("id")[0].as_py() == {kill_first}:
                os._exit(3)
            return _inner(batch)
    """))
    m = mounter(cities_ds, f"transform={fn}:transform", PY, f"batch_size={BS}", "shuffle=none", "transform_workers=1")
    killed = set(range(kill_first, kill_first + RG))
    served = 0
    for i in range(ROWS // BS):
        path = m.p("epoch-0", batch_name(i) + ".safetensors")
        if set(range(i * BS, (i + 1) * BS)) & killed:
            with pytest.raises(OSError):
                tfs.read_exact(path)
            continue
        tfs.load_safetensors(path)
        served += 1
    assert served == sum(1 for i in range(ROWS // BS) if not set(range(i * BS, (i + 1) * BS)) & killed)
    log = (m.cache / "tensorfs.log").read_text(errors="replace")
    assert "replaced" in log, log[-2000:]


# --------------------------------------------------------------------------------------------
# A Petastorm TransformSpec, as it is, against Petastorm's own make_batch_reader
# --------------------------------------------------------------------------------------------

PETASTORM_PY = tfs.REPO / ".petastorm-venv" / "bin" / "python"


def petastorm_python() -> Path | None:
    if PETASTORM_PY.exists():
        return PETASTORM_PY
    if os.environ.get("CI"):
        pytest.fail(f"{PETASTORM_PY} is missing: scripts/setup makes it where tests run")
    pytest.skip("no petastorm venv (scripts/setup with SETUP_TESTS=1 makes .petastorm-venv)")


SPEC_MODULE = """
import hashlib
import numpy as np
from petastorm.transform import TransformSpec

def city_id(name):
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") & ((1 << 62) - 1)

def _features(df):
    df["city"] = df["city"].map(city_id).astype(np.int64)
    df["x"] = (df["x"] * 2.0 + 1.0).astype(np.float32)
    return df

def _two(df):
    return _features(df)[["x", "id"]]

%s
"""

REMOVED = """spec = TransformSpec(_features, edit_fields=[("city", np.int64, (), False), ("x", np.float32, (), False)],
                     removed_fields=["note"])"""
# Petastorm takes only a function that returns the selected fields itself.
SELECTED = """spec = TransformSpec(_two, edit_fields=[("x", np.float32, (), False)], selected_fields=["x", "id"])"""


@pytest.mark.parametrize("fields, served", [(REMOVED, ["city", "id", "x"]), (SELECTED, ["id", "x"])],
                         ids=["removed_fields", "selected_fields"])
def test_a_petastorm_transform_spec_serves_what_make_batch_reader_returns(mounter, cities_ds, tmp_path, fields,
                                                                          served):
    py = petastorm_python()
    fn = tmp_path / "spec.py"
    fn.write_text(SPEC_MODULE % fields)
    os.chmod(fn, 0o644)
    m = mounter(cities_ds, f"transform={fn}:spec", f"python={py}", f"batch_size={BS}", "shuffle=none")
    dj = m.dataset()
    assert dj["transform"]["petastorm_transform_spec"] is True
    assert sorted(t["name"] for t in dj["tensors"]) == served
    got = {k: np.concatenate([tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))[k]
                              for i in range(dj["batches_per_epoch"])]) for k in served}
    reader = textwrap.dedent(f"""
        import json, sys, numpy as np
        sys.path.insert(0, {str(tmp_path)!r})
        from spec import spec
        from petastorm import make_batch_reader
        out = {{k: [] for k in {served!r}}}
        with make_batch_reader("file://{cities_ds}", transform_spec=spec, num_epochs=1,
                               reader_pool_type="dummy", shuffle_row_groups=False) as r:
            for b in r:
                for k in out:
                    out[k] += np.asarray(getattr(b, k)).tolist()
        print(json.dumps(out))
    """)
    proc = subprocess.run([str(py), "-c", reader], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    want = json.loads(proc.stdout.strip().splitlines()[-1])
    order = np.argsort(want["id"])
    assert np.array_equal(np.asarray(want["id"])[order], got["id"])
    if "city" in served:
        assert np.array_equal(np.asarray(want["city"], dtype=np.int64)[order], got["city"])
    assert np.array_equal(np.asarray(want["x"], dtype=np.float32)[order], got["x"])


def test_more_workers_than_threads_run_at_once(mounter, cities_ds, tmp_path):
    """A call waits on its Python worker holding none of the daemon's threads: with threads=1,
    transform_workers=3 calls go to all three workers."""
    pids = tmp_path / "pids.log"
    fn = write_transform(tmp_path / "features.py", tmp_path / "calls.log", extra=textwrap.dedent(f"""
        import os, time
        _inner = transform
        def transform(batch):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(0.2)
            return _inner(batch)
    """))
    m = mounter(cities_ds, f"transform={fn}:transform", PY, "threads=1", "transform_workers=3", f"batch_size={BS}")
    read_epochs(m, [0])
    assert len(set(pids.read_text().split())) == 3, pids.read_text()


def test_nulls_a_transform_returns_later_are_zeros_with_a_mask_or_eio(mounter, cities_ds, tmp_path):
    """The first row group's output has no nulls; a later one's has some. nulls=zero serves
    every output column with its mask; nulls=error fails the reads of that row group."""
    later = FIRST_RG_IDS[4]
    fn = write_transform(tmp_path / "features.py", tmp_path / "calls.log", extra=textwrap.dedent(f"""
        _inner = transform
        def transform(batch):
            out = _inner(batch)
            if out["id"][0] == {later}:
                out["x"] = pa.array([None if i % 2 else v for i, v in enumerate(out["x"].tolist())], pa.float32())
            return out
    """))
    zero = mounter(cities_ds, f"transform={fn}:transform", PY, f"batch_size={BS}", "shuffle=none", "nulls=zero")
    names = [t["name"] for t in zero.dataset()["tensors"]]
    assert "x.mask" in names and "city.mask" in names, names
    b = tfs.load_safetensors(zero.p("epoch-0", batch_name(later // BS) + ".safetensors"))
    odd = (b["id"] - later) % 2 == 1
    assert (b["x.mask"][odd] == 0).all() and (b["x"][odd] == 0).all() and (b["x.mask"][~odd] == 1).all()
    strict = mounter(cities_ds, f"transform={fn}:transform", PY, f"batch_size={BS}", "shuffle=none")
    with pytest.raises(OSError) as e:
        tfs.read_exact(strict.p("epoch-0", batch_name(later // BS) + ".safetensors"))
    assert e.value.errno == errno.EIO
    tfs.read_exact(strict.p("epoch-0", batch_name(0) + ".safetensors"))
