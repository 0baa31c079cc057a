"""Remote (S3) sources, against moto's S3 server on the loopback interface (scripts/s3-server),
with tests/faultproxy.py between tensorfs and moto for the fault tests: the same bytes as the
same files mounted from a local directory, column projection fetching only the needed bytes,
footers kept between mounts, many small objects in lexicographic order, secrets kept out of
sight, retried faults, EIO when the server stays down, objects replaced under a live mount,
and refusals at mount time."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs

tfs.require("moto.server", "moto[server] is not installed (scripts/setup installs it)")
boto3 = tfs.require("boto3", "boto3 is not installed (scripts/setup installs it)")

from conftest import BUCKET, KEY_ID, REGION, SECRET, S3, s3_client, s3_opts  # noqa: E402  (the S3 side)
from tfs import batch_name  # noqa: E402

PAD = 8
EIO = 5

# Every test here runs with no AWS settings or HTTP proxies but ours (conftest.hermetic_env).
pytestmark = pytest.mark.usefixtures("hermetic_env")


# --------------------------------------------------------------------------------------------
# Fixtures: the datasets in a bucket (moto and the fault proxy are in conftest.py: s3, proxy)
# --------------------------------------------------------------------------------------------


@dataclass
class Remote:
    s3: S3
    main: tfs.Dataset
    shuf: tfs.Dataset

    def src(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}/"


@pytest.fixture(scope="session")
def remote(s3, main_ds, shuf_ds) -> Remote:
    """The all-types dataset under main/ and the shuffle dataset under shuf/."""
    s3.upload_dir(main_ds.path, "main")
    s3.upload_dir(shuf_ds.path, "shuf")
    return Remote(s3, main_ds, shuf_ds)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def log_text(m: tfs.Mount) -> str:
    p = m.cache / "tensorfs.log"
    return p.read_text(errors="replace") if p.exists() else ""


READER = r"""
import hashlib, json, sys, time
t = time.monotonic()
try:
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    out = {"ok": True, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
except OSError as e:
    out = {"ok": False, "errno": e.errno, "error": str(e)}
out["seconds"] = time.monotonic() - t
print(json.dumps(out))
"""


def guarded_read(path, timeout: float) -> dict:
    """Read PATH whole in a child process (a read of a FUSE file cannot be interrupted in this
    one); fail the test if it takes longer than TIMEOUT seconds (the child is then killed)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path} did not end within {timeout:g} s")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def daemon_pids(m: tfs.Mount) -> list[int]:
    out = []
    for pid in tfs.daemon_pids(m.path) or m.pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "tensorfs":
                out.append(pid)
        except OSError:
            pass
    return out


def tensorfs_processes() -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == "tensorfs":
                    out.append(int(entry))
            except OSError:
                pass
    return out


# --------------------------------------------------------------------------------------------
# The test infrastructure itself (no tensorfs): moto holds what was uploaded, and the fault
# proxy does what it says. A failure here is a test bug, not a tensorfs bug.
# --------------------------------------------------------------------------------------------


def test_infrastructure_moto_and_faultproxy(remote, proxy):
    import http.client

    s3 = remote.s3
    listed = s3.client.list_objects_v2(Bucket=BUCKET, Prefix="main/")["Contents"]
    assert [o["Key"] for o in listed] == [f"main/{f}" for f, _, _ in remote.main.files]
    for o in listed:
        local = remote.main.path / o["Key"].split("/", 1)[1]
        assert o["Size"] == local.stat().st_size
        assert o["ETag"].strip('"') == hashlib.md5(local.read_bytes()).hexdigest()

    key = listed[0]["Key"]
    body = (remote.main.path / key.split("/", 1)[1]).read_bytes()
    via = s3_client(proxy.url, retries={"max_attempts": 1, "mode": "standard"})

    def presigned(op="get_object", **params):
        u = via.generate_presigned_url(op, Params={"Bucket": BUCKET, "Key": key, **params})
        return u.split(str(proxy.port), 1)[1]

    def raw(method, path, headers=None, conn=None):
        c = conn or http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read(), c

    # Healthy: whole and ranged GETs, a listing, HEAD, one keep-alive connection throughout.
    st, data, c = raw("GET", presigned())
    assert (st, data) == (200, body)
    st, data, c = raw("GET", presigned(), {"Range": "bytes=100-4195"}, c)
    assert (st, data) == (206, body[100:4196])
    assert via.get_object(Bucket=BUCKET, Key=key, Range="bytes=0-9")["Body"].read() == body[:10]
    assert len(via.list_objects_v2(Bucket=BUCKET, Prefix="main/")["Contents"]) == len(listed)

    # Status faults; listings and HEADs stay healthy, on the same connection.
    for mode, code, s3code in (("503", 503, "ServiceUnavailable"), ("throttle", 503, "SlowDown"), ("500", 500, "InternalError")):
        proxy.set(mode, rate=1.0)
        st, data, c = raw("GET", presigned())
        assert st == code and f"<Code>{s3code}</Code>".encode() in data, (mode, st, data[:200])
        st, _, c = raw("HEAD", presigned("head_object"), conn=c)
        assert st == 200, (mode, "HEAD", st)
        assert len(via.list_objects_v2(Bucket=BUCKET, Prefix="main/")["Contents"]) == len(listed)

    # truncate: the full Content-Length, part of the body.
    proxy.set("truncate", rate=1.0, seed=1)
    with pytest.raises(http.client.IncompleteRead) as e:
        raw("GET", presigned())
    assert 0 < len(e.value.partial) < len(body)

    # reset: the connection breaks, before or inside the body.
    proxy.set("reset", rate=1.0, seed=2)
    for _ in range(4):
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            raw("GET", presigned())

    # count: at most N faults, then healthy again; rate: about that fraction.
    proxy.set("503", rate=1.0, count=2)
    assert [raw("GET", presigned())[0] for _ in range(4)] == [503, 503, 200, 200]
    proxy.set("503", rate=0.3, seed=5)
    ok = sum(raw("GET", presigned())[0] == 200 for _ in range(60))
    assert 25 <= ok <= 55, ok

    # timeout: held without an answer until the client gives up.
    proxy.set("timeout", rate=1.0, hold=30)
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=1)
    with pytest.raises(TimeoutError):
        raw("GET", presigned(), conn=c)
    c.close()
    assert time.monotonic() - t < 5

    # down: everything refused, listings too; the control endpoint still answers.
    proxy.set("down")
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        raw("GET", f"/{BUCKET}?list-type=2")
    proxy.set("none")
    st, data, _ = raw("GET", presigned())
    assert (st, data) == (200, body)

    s = proxy.stats()
    assert s["faults"]["truncate"] == 1 and s["faults"]["reset"] == 4 and s["faults"]["down"] == 1
    assert s["faults"]["503"] >= 2 and s["faults"]["timeout"] == 1
    assert s["bytes_forwarded"] >= 2 * len(body)
    assert proxy.stats()["requests"] == s["requests"], "control requests are counted as forwarded"


# --------------------------------------------------------------------------------------------
# The same bytes as a local directory
# --------------------------------------------------------------------------------------------

SAME_BYTES_CASES = {
    "none-pad": ("main", ("shuffle=none", "batch_size=256", f"pad=tokens:{PAD}"), ["epoch-0"]),
    "window-transforms": (
        "main",
        (
            "shuffle=window",
            "seed=3",
            "shuffle_window=2",
            "batch_size=500",
            "columns=ts:sx:sy:i16:f32:id:b:tokens",
            "stack=pair:sx+sy",
            "cast=i16:float32",
            "cast=f32:float64",
            "pad=tokens:5",
            "epochs=2",
        ),
        ["epoch-0", "epoch-1"],
    ),
    "global-drop-last": (
        "main",
        ("shuffle=global", "seed=11", "batch_size=700", "drop_last", "columns=id:emb:nest:dict:d:u64:f16:b"),
        ["epoch-0", "epoch-2"],
    ),
    "shuf-window": ("shuf", ("shuffle=window", "batch_size=128", "seed=9"), ["epoch-0"]),
}


@pytest.mark.parametrize("case", list(SAME_BYTES_CASES))
def test_same_bytes_as_local_directory(mounter, remote, case):
    prefix, opts, dirs = SAME_BYTES_CASES[case]
    ds = getattr(remote, prefix)
    local = mounter(f"file://{ds.path}", *opts)
    m = mounter(remote.src(prefix), *opts, *s3_opts(remote.s3.url))

    rj = tfs.assert_same_as_local(m, local, dirs)
    assert [tfs.file_name(f) for f in rj["files"]] == [f for f, _, _ in ds.files]
    assert [(f["rows"], f["row_groups"], f["size"]) for f in rj["files"]] == [
        (rows, rgs, (ds.path / f).stat().st_size) for f, rows, rgs in ds.files
    ]


def test_single_object_source(mounter, remote):
    opts = ("shuffle=none", "batch_size=400", "columns=id:i32:emb")
    local = mounter(remote.main.path / "part-001.parquet", *opts)
    m = mounter(f"s3://{BUCKET}/main/part-001.parquet", *opts, *s3_opts(remote.s3.url))
    dj = m.dataset()
    assert dj["rows"] == 900
    assert [tfs.file_name(f) for f in dj["files"]] == ["part-001.parquet"]
    got = tfs.load_safetensors(m.p("epoch-0", "000002.safetensors"))
    tfs.assert_array(got["id"], remote.main.ref["id"][1100 + 800 : 2000], "id")
    assert tfs.batch_hashes(m, ["epoch-0"], 3) == tfs.batch_hashes(local, ["epoch-0"], 3)


def test_environment_variables_configure_the_store(remote):
    """AWS_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP."""
    env = dict(
        os.environ,
        AWS_ENDPOINT=remote.s3.url,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID=KEY_ID,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_REGION=REGION,
    )
    proc = tfs.run(["inspect", remote.src("shuf"), "--json"], env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    dj = json.loads(proc.stdout)
    assert dj["rows"] == 2600
    assert [t["name"] for t in dj["tensors"]] == ["id", "x"]


# --------------------------------------------------------------------------------------------
# What is fetched
# --------------------------------------------------------------------------------------------


def test_projection_fetches_only_the_columns_needed(mounter, remote):
    """A batch that needs 2 of 22 columns fetches those column chunks, not the files."""
    ds = remote.main
    cols = ["i64", "ts"]
    # shuffle=none and batch_size = the row-group size: batch 0 is row group 0 of part-000.
    m = mounter(
        remote.src("main"), "shuffle=none", f"batch_size={tfs.MAIN_RG}", f"columns={':'.join(cols)}", "prefetch=0",
        *s3_opts(remote.s3.url),
    )
    after_mount = tfs.stats(m)
    assert after_mount["remote_requests"] > 0, "a first mount reads the footers"

    got = tfs.load_safetensors(m.p("epoch-0", "000000.safetensors"))
    tfs.assert_array(got["i64"], ds.ref["i64"][: tfs.MAIN_RG], "i64")
    after_read = tfs.stats(m)

    md = pq.ParquetFile(ds.path / ds.files[0][0]).metadata
    names = [md.schema.column(j).path for j in range(md.num_columns)]
    chunks = sum(md.row_group(0).column(names.index(c)).total_compressed_size for c in cols)
    total = sum((ds.path / f).stat().st_size for f, _, _ in ds.files)
    fetched = after_read["remote_bytes"] - after_mount["remote_bytes"]
    requests = after_read["remote_requests"] - after_mount["remote_requests"]
    assert 1 <= requests <= 4, (requests, after_mount, after_read)
    assert chunks <= fetched <= chunks + 8192, (
        f"batch 0 fetched {fetched} bytes; its 2 column chunks are {chunks} bytes (all files: {total})"
    )
    assert fetched < total / 20
    assert after_read["row_groups_decoded"] - after_mount["row_groups_decoded"] == 1, after_read
    assert after_read["batches_built"] - after_mount["batches_built"] == 1, after_read


def test_remount_reuses_kept_footers(mounter, remote):
    """Footers are kept in cache_dir by ETag: a remount of unchanged objects fetches none."""
    opts = ("shuffle=none", "batch_size=500", f"pad=tokens:{PAD}", *s3_opts(remote.s3.url))
    first = mounter(remote.src("main"), *opts)
    s1 = tfs.stats(first)
    assert s1["remote_requests"] > 0, s1
    fingerprint = first.dataset()["fingerprint"]
    want = tfs.sha256(first.p("epoch-0", "000003.safetensors"))
    first.unmount()

    again = mounter(remote.src("main"), *opts, cache=first.cache)
    s2 = tfs.stats(again)
    assert s2["remote_requests"] == 0, f"a remount with the same cache_dir refetched: {s2}"
    assert s2["remote_bytes"] == 0, s2
    assert again.dataset()["fingerprint"] == fingerprint
    assert tfs.sha256(again.p("epoch-0", "000003.safetensors")) == want


def test_many_small_objects_in_lexicographic_order(mounter, remote, tmp_path):
    n_files, rows = 200, 5
    src = tmp_path / "many"
    src.mkdir()
    for i in range(n_files):  # part-0 ... part-199: lexicographic order is not numeric order
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": (ids * 3).astype(np.int32)}), src / f"part-{i}.parquet")
    prefix = f"many-{uuid.uuid4().hex[:8]}"
    keys = remote.s3.upload_dir(src, prefix)
    assert len(keys) == n_files

    t = time.monotonic()
    m = mounter(remote.src(prefix), "shuffle=none", f"batch_size={n_files * rows}", *s3_opts(remote.s3.url))
    assert time.monotonic() - t < 60
    dj = m.dataset()
    names = sorted(f"part-{i}.parquet" for i in range(n_files))
    assert names[:4] == ["part-0.parquet", "part-1.parquet", "part-10.parquet", "part-100.parquet"]
    assert [tfs.file_name(f) for f in dj["files"]] == names
    assert dj["rows"] == n_files * rows

    order = [int(n[len("part-") : -len(".parquet")]) for n in names]
    want = np.concatenate([np.arange(i * rows, (i + 1) * rows, dtype=np.int64) for i in order])
    got = tfs.load_safetensors(m.p("epoch-0", "000000.safetensors"))
    tfs.assert_array(got["id"], want, "id")
    tfs.assert_array(got["x"], (want * 3).astype(np.int32), "x")


def test_a_large_column_chunk_is_fetched_in_parts(mounter, remote, proxy, tmp_path):
    """One connection to an object store serves far less than a host's bandwidth, so a column
    chunk larger than 16 MiB is fetched as ranged GETs of 16 MiB, several at once, and put back
    together: here a 40 MiB chunk in 3 parts, with resets on some of them (each part retried
    alone), and every byte as the file holds it."""
    rows, dim = 10_240, 1024  # emb: 40 MiB of random float32, which no codec shrinks
    rng = np.random.default_rng(5)
    emb = rng.standard_normal((rows, dim), dtype=np.float32)
    src = tmp_path / "large"
    src.mkdir()
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "emb": tfs.fsl(emb.ravel(), dim)})
    pq.write_table(table, src / "large.parquet", row_group_size=rows, compression="none")
    chunk = pq.ParquetFile(src / "large.parquet").metadata.row_group(0).column(1).total_compressed_size
    assert 32 << 20 < chunk <= 48 << 20, chunk
    prefix = f"large-{uuid.uuid4().hex[:8]}"
    remote.s3.upload_dir(src, prefix)
    m = mounter(remote.src(prefix), "shuffle=none", "batch_size=4096", "prefetch=0", *s3_opts(proxy.url))
    before = tfs.stats(m)
    proxy.reset_stats()
    proxy.set("reset", rate=0.3, seed=3)
    got = tfs.load_safetensors(m.p("epoch-0", "000001.safetensors"))
    proxy.set("none")
    tfs.assert_array(got["emb"], emb[4096:8192], "emb")
    tfs.assert_array(got["id"], np.arange(4096, 8192), "id")
    after = tfs.stats(m)
    # The two chunks lie side by side, one range of 40 MiB: three parts (retries not counted).
    assert after["remote_requests"] - before["remote_requests"] == 3, (before, after)
    assert after["row_groups_decoded"] - before["row_groups_decoded"] == 1, after
    assert proxy.stats()["faults"].get("reset", 0) >= 1, proxy.stats()


# --------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------


def test_secret_never_shown(mounter, remote):
    secret = f"tfs-secret-{uuid.uuid4().hex}"
    key_id = f"AKID{uuid.uuid4().hex[:16].upper()}"  # distinctive: a masked key id hides nothing else
    opts = [o for o in s3_opts(remote.s3.url, secret=secret) if not o.startswith("aws_access_key_id=")]
    opts.append(f"aws_access_key_id={key_id}")
    m = mounter(remote.src("shuf"), "batch_size=256", "log=debug", *opts)
    assert tfs.load_safetensors(m.p("epoch-0", "000001.safetensors"))["id"].shape == (256,)

    raw = tfs.read_exact(m.p("dataset.json")).decode()
    assert secret not in raw, "the secret is in dataset.json"
    assert secret not in json.dumps(tfs.stats(m))
    assert (m.cache / "tensorfs.log").exists(), "no CACHE/tensorfs.log"
    assert secret not in log_text(m), "the secret is in CACHE/tensorfs.log"

    daemons = daemon_pids(m)
    assert daemons, "no tensorfs daemon found for the mount"
    for pid in sorted(set(daemons) | set(tensorfs_processes())):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert secret.encode() not in cmdline, f"the secret is in /proc/{pid}/cmdline: {cmdline!r}"

    proc = tfs.run(["inspect", remote.src("shuf"), "-o", ",".join(opts), "--json"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout and secret not in proc.stderr


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def test_hiding_secrets_leaves_the_rest_of_the_command_line(mounter, remote):
    """Credentials are masked in the daemon's /proc/PID/cmdline, and only they: a key id such
    as `test` that also occurs in the bucket name and the mountpoint's path leaves those
    intact, so that ps (and tools that find a mount's daemon by its command line) still work."""
    m = mounter(remote.src("shuf"), "batch_size=256", *s3_opts(remote.s3.url))
    assert KEY_ID in BUCKET and KEY_ID in str(m.path) and KEY_ID in SECRET  # the premise
    others = {pid: " ".join(cmdline(pid)) for pid in tensorfs_processes()}
    daemons = daemon_pids(m)
    assert daemons, f"no tensorfs process names {m.path} in its command line: {others}"
    for pid in daemons:
        argv = cmdline(pid)
        assert remote.src("shuf") in argv, argv
        # The secret's value is masked whole (here it holds the key id: masking that first
        # must not leave the rest of the secret to be read).
        shown = [o.split("=", 1)[1] for a in argv for o in a.split(",") if o.startswith("aws_secret_access_key=")]
        assert all(set(v) <= {"*"} for v in shown), f"the secret shows as {shown}"


# --------------------------------------------------------------------------------------------
# Faults, through the fault proxy
# --------------------------------------------------------------------------------------------

FAULT_OPTS = (
    "shuffle=window",
    "seed=7",
    "batch_size=256",
    "columns=id:i64:f64:emb:nest:ts:tokens",
    "pad=tokens:6",
)


@pytest.mark.parametrize("mode", ["503", "throttle", "reset", "truncate"])
def test_faults_are_retried(mounter, remote, proxy, mode):
    """Faults on about a quarter of the object GETs, from the mount on: every batch is still
    byte-identical to the file:// mount."""
    local = mounter(f"file://{remote.main.path}", *FAULT_OPTS)
    n = local.dataset()["batches_per_epoch"]
    want = tfs.batch_hashes(local, ["epoch-0"], n)

    proxy.set(mode, rate=0.25, seed=11)
    m = mounter(remote.src("main"), *FAULT_OPTS, *s3_opts(proxy.url))
    got = tfs.batch_hashes(m, ["epoch-0"], n)
    bad = [rel for rel in want if got.get(rel) != want[rel]]
    assert not bad, f"{mode}: {len(bad)} files differ, e.g. {bad[:5]}"
    s = proxy.stats()
    assert s["faults"].get(mode, 0) >= 1, f"the proxy injected no {mode} fault: {s}"


def test_a_request_timeout_is_retried(mounter, remote, proxy):
    """One object GET held past the client's timeout (the proxy then closes it): the batch is
    still right. Slow by nature: one client timeout (about 30 s)."""
    opts = ("shuffle=none", "batch_size=500", "columns=id:f32:ts", "prefetch=0")
    m = mounter(remote.src("main"), *opts, *s3_opts(proxy.url))
    proxy.set("timeout", rate=1.0, count=1, hold=40)
    rel = ("epoch-0", "000002.safetensors")
    got = guarded_read(m.p(*rel), timeout=120)
    assert proxy.stats()["faults"].get("timeout") == 1
    assert got["ok"], f"reading after one held request failed: {got}\n{log_text(m)[-3000:]}"
    local = mounter(f"file://{remote.main.path}", *opts)
    assert got["sha256"] == tfs.sha256(local.p(*rel))


def test_server_down_gives_eio_then_recovers(mounter, remote, proxy):
    opts = ("shuffle=none", "batch_size=256", "columns=id:i32:f64", "prefetch=0")
    m = mounter(remote.src("main"), *opts, *s3_opts(proxy.url))
    local = mounter(f"file://{remote.main.path}", *opts)
    rel = ("epoch-0", "000005.safetensors")

    proxy.set("down")
    t = time.monotonic()
    got = guarded_read(m.p(*rel), timeout=90)
    took = time.monotonic() - t
    assert not got["ok"] and got["errno"] == EIO, f"with the server down: {got}"
    assert took < 75, f"EIO took {took:.0f} s"
    assert proxy.stats()["faults"].get("down", 0) >= 1

    # The mount stays up (its daemon too: a dead one would fail this read with ENOTCONN) and
    # serves what needs no remote read.
    assert tfs.is_mounted(m.path)
    assert m.dataset()["rows"] == 3000

    proxy.set("none")
    got = guarded_read(m.p(*rel), timeout=60)
    assert got["ok"], f"after the server came back: {got}"
    assert got["sha256"] == tfs.sha256(local.p(*rel))


# --------------------------------------------------------------------------------------------
# An object replaced under a live mount
# --------------------------------------------------------------------------------------------


def test_object_replaced_under_a_live_mount(mounter, remote, tmp_path):
    prefix = f"replace-{uuid.uuid4().hex[:8]}"
    src, new = tmp_path / "v1", tmp_path / "v2"
    src.mkdir()
    new.mkdir()
    ids = np.arange(2000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids[:1000], "x": ids[:1000] * 2}), src / "a.parquet", row_group_size=250)
    pq.write_table(pa.table({"id": ids[1000:], "x": ids[1000:] * 2}), src / "b.parquet", row_group_size=250)
    # The new b: the same layout and row count, other values.
    pq.write_table(pa.table({"id": ids[1000:] + 10**6, "x": ids[1000:] * 2 + 1}), new / "b.parquet", row_group_size=250)
    remote.s3.upload_dir(src, prefix)

    # Nothing is read before the replacement, so nothing of b can have been built ahead.
    m = mounter(remote.src(prefix), "shuffle=none", "batch_size=300", "prefetch=0", *s3_opts(remote.s3.url))
    remote.s3.put(f"{prefix}/b.parquet", new / "b.parquet")

    # Batch 5 is rows 1500..1800, all from b; batch 3 is rows 900..1200, from a and b.
    for rel in (("000005.safetensors",), ("000003.safetensors",), ("000006", "id.npy")):
        got = guarded_read(m.p("epoch-0", *rel), timeout=90)
        assert not got["ok"] and got["errno"] == EIO, f"{'/'.join(rel)} of the replaced object was served: {got}"
    key = f"{prefix}/b.parquet"
    lines = [line for line in log_text(m).splitlines() if key in line]
    assert lines, f"no line of CACHE/tensorfs.log names {key}:\n{log_text(m)[-3000:]}"
    # Batches of the unchanged object are still served, right.
    tfs.assert_array(tfs.load_safetensors(m.p("epoch-0", "000001.safetensors"))["id"], ids[300:600], "id")
    assert tfs.is_mounted(m.path)


# --------------------------------------------------------------------------------------------
# Refusals at mount time
# --------------------------------------------------------------------------------------------


def refusal(mounter, source: str, endpoint: str, timeout=120) -> tuple[str, float]:
    mnt = mounter.mountpoint()
    opts = ",".join([*s3_opts(endpoint), f"cache_dir={mnt.parent / (mnt.name + '-cache')}"])
    t = time.monotonic()
    proc = tfs.run(["mount", source, mnt, "-o", opts], timeout=timeout)
    took = time.monotonic() - t
    line = tfs.error_line(proc)
    assert not tfs.is_mounted(mnt), f"{source}: refused, but mounted"
    return line, took


def test_refused_bucket_that_does_not_exist(mounter, remote):
    src = "s3://no-such-bucket-tfs/data/"
    line, _ = refusal(mounter, src, remote.s3.url)
    assert "no-such-bucket-tfs" in line, line


@pytest.mark.parametrize("what", ["empty-prefix", "no-parquet", "missing-object"])
def test_refused_nothing_to_mount(mounter, remote, what):
    prefix = f"{what}-{uuid.uuid4().hex[:8]}"
    if what == "no-parquet":
        remote.s3.client.put_object(Bucket=BUCKET, Key=f"{prefix}/_SUCCESS", Body=b"")
        remote.s3.client.put_object(Bucket=BUCKET, Key=f"{prefix}/README.txt", Body=b"not data\n")
    src = remote.src(prefix) if what != "missing-object" else f"s3://{BUCKET}/main/part-999.parquet"
    line, _ = refusal(mounter, src, remote.s3.url)
    assert src.rstrip("/") in line, line


def test_refused_unreachable_endpoint(mounter, remote):
    src = remote.src("main")
    line, took = refusal(mounter, src, "http://127.0.0.1:1", timeout=90)
    assert src.rstrip("/") in line, line
    assert took < 60, f"the refusal took {took:.0f} s"


def test_refused_plain_http_endpoint_names_aws_allow_http(mounter, remote):
    """object_store refuses a plain http:// endpoint unless allowed: the line names the option."""
    src = remote.src("main")
    mnt = mounter.mountpoint()
    opts = [o for o in s3_opts(remote.s3.url) if not o.startswith("aws_allow_http")]
    proc = tfs.run(["mount", src, mnt, "-o", ",".join([*opts, f"cache_dir={mnt.parent / 'c'}"])], timeout=90)
    line = tfs.error_line(proc)
    assert proc.returncode != 0 and not tfs.is_mounted(mnt)
    assert "aws_allow_http=true" in line and src.rstrip("/") in line, line


# --------------------------------------------------------------------------------------------
# Credentials as the AWS CLI reads them: profiles in the shared credentials and config files
# --------------------------------------------------------------------------------------------


ROLE = "arn:aws:iam::123456789012:role/train"


def aws_files(tmp_path, proxy_url: str, monkeypatch) -> tuple[Path, Path]:
    """A credentials and a config file, as `aws configure` writes them, pointed at by the
    environment the daemon inherits; the config's profiles reach the S3 server at PROXY_URL."""
    creds, config = tmp_path / "credentials", tmp_path / "config"
    creds.write_text(
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n\n"
        "[team]\naws_access_key_id = AKIDTEAM\naws_secret_access_key = s2\naws_session_token = tok\n"
    )
    marker = tmp_path / "process-ran"
    process = tmp_path / "creds.sh"
    process.write_text(
        "#!/bin/sh\n"
        f"echo run >> {marker}\n"
        'echo \'{"Version": 1, "AccessKeyId": "AKIDPROCESS", "SecretAccessKey": "s3", '
        '"SessionToken": "t", "Expiration": "2099-01-01T00:00:00Z"}\'\n'
    )
    process.chmod(0o755)
    config.write_text(
        f"[default]\nregion = {REGION}\nendpoint_url = {proxy_url}\n\n"
        f"[profile team]\nregion = {REGION}\nendpoint_url = {proxy_url}\ns3 =\n  addressing_style = path\n\n"
        f"[profile tool]\nregion = {REGION}\nendpoint_url = {proxy_url}\ncredential_process = {process}\n\n"
        f"[profile assumed]\nregion = {REGION}\nendpoint_url = {proxy_url}\nrole_arn = {ROLE}\nsource_profile = default\n"
        "role_session_name = train-job\n\n"
        f"[profile chained]\nregion = {REGION}\nendpoint_url = {proxy_url}\nrole_arn = {ROLE}-2\nsource_profile = assumed\n\n"
        f"[profile fromenv]\nregion = {REGION}\nendpoint_url = {proxy_url}\nrole_arn = {ROLE}\ncredential_source = Environment\n\n"
        f"[profile imds]\nrole_arn = {ROLE}\ncredential_source = Ec2InstanceMetadata\n\n"
        f"[profile orphan]\nrole_arn = {ROLE}\nsource_profile = nobody\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return creds, marker


def test_credentials_and_endpoint_come_from_the_aws_cli_s_profiles(mounter, remote, proxy, tmp_path, monkeypatch):
    _, marker = aws_files(tmp_path, proxy.url, monkeypatch)
    src = remote.src("shuf")
    local = mounter(remote.shuf.path, "batch_size=256")
    n = local.dataset()["batches_per_epoch"]
    want = tfs.batch_hashes(local, ["epoch-0"], n)
    for how, opts, key in [
        ("the default profile", [], "AKIDDEFAULT"),
        ("AWS_PROFILE", [], "AKIDTEAM"),
        ("aws_profile=", ["aws_profile=tool"], "AKIDPROCESS"),
    ]:
        if how == "AWS_PROFILE":
            monkeypatch.setenv("AWS_PROFILE", "team")
        else:
            monkeypatch.delenv("AWS_PROFILE", raising=False)
        proxy.reset_stats()
        m = mounter(src, "batch_size=256", *opts)
        assert tfs.batch_hashes(m, ["epoch-0"], n) == want, how
        keys = proxy.stats()["access_keys"]
        assert set(keys) == {key}, (how, keys)
        m.unmount()
    # The process ran once for the mount: its credential holds until it expires.
    assert marker.read_text().count("run") == 1
    # The environment's own keys win over the default profile.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s4")
    proxy.reset_stats()
    m = mounter(src, "batch_size=256")
    assert set(proxy.stats()["access_keys"]) == {"AKIDENV"}
    m.unmount()


def test_a_profile_that_cannot_be_used_is_refused_in_one_line(mounter, remote, proxy, tmp_path, monkeypatch):
    aws_files(tmp_path, proxy.url, monkeypatch)
    line = tfs.refused_mount(mounter, remote.src("shuf"), "aws_profile=nobody")
    assert "AWS profile 'nobody' is in neither" in line, line
    line = tfs.refused_mount(mounter, remote.src("shuf"), "aws_profile=imds")
    assert "assumes role arn:aws:iam::123456789012:role/train" in line and "Ec2InstanceMetadata" in line, line
    line = tfs.refused_mount(mounter, remote.src("shuf"), "aws_profile=orphan")
    assert "source_profile 'nobody'" in line, line


def test_a_profile_s_role_is_assumed_through_sts(mounter, remote, proxy, tmp_path, monkeypatch):
    """role_arn with source_profile (and a role assumed from another role's credentials, and
    from the environment's keys): the mount signs its reads with the role's credentials, which
    STS (moto's, through the proxy) gave for a request signed with the source's."""
    aws_files(tmp_path, proxy.url, monkeypatch)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    src = remote.src("shuf")
    local = mounter(remote.shuf.path, "batch_size=256")
    n = local.dataset()["batches_per_epoch"]
    want = tfs.batch_hashes(local, ["epoch-0"], n)
    for profile, source_keys in [("assumed", {"AKIDDEFAULT"}), ("chained", {"AKIDDEFAULT"}), ("fromenv", {"AKIDENV"})]:
        if profile == "fromenv":
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s4")
        proxy.reset_stats()
        m = mounter(src, "batch_size=256", f"aws_profile={profile}")
        assert tfs.batch_hashes(m, ["epoch-0"], n) == want, profile
        keys = set(proxy.stats()["access_keys"])
        role_keys = {k for k in keys if k.startswith("ASIA")}
        # The chained profile's first role signs the call for the second: two role keys.
        assert len(role_keys) == (2 if profile == "chained" else 1), (profile, keys)
        assert keys - role_keys == source_keys, (profile, keys)
        m.unmount()
