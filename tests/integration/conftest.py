"""Fixtures for the tensorfs integration tests (see tfs.py for the helpers): mounts with a
watchdog, the datasets, and the S3 side shared by test_remote and test_partitions (moto's S3
server on the loopback interface, scripts/s3-server, and tests/faultproxy.py in front of it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

import tfs

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
import faultproxy  # noqa: E402

S3_SERVER = tfs.REPO / "scripts" / "s3-server"
BUCKET = "tensorfs-test"
REGION = "us-east-1"
KEY_ID = "test"
SECRET = "tfs-test-secret-0f3a9c"  # moto accepts any; it holds KEY_ID on purpose (test_remote)

# A read from a FUSE mount whose daemon hangs blocks forever, out of reach of signals. So each
# test that mounts has a watchdog: past this many seconds it kills the test's own tensorfs
# daemons (started by this test), which makes the pending reads fail, and the test with them.
TEST_TIMEOUT = float(os.environ.get("TENSORFS_TEST_TIMEOUT", "180"))


def pytest_sessionstart(session):
    if not (tfs.BIN.is_file() and os.access(tfs.BIN, os.X_OK)):
        raise pytest.UsageError(f"tensorfs binary not found at {tfs.BIN}: run `cargo build` or set TENSORFS_BIN")
    if not os.path.exists("/dev/fuse"):
        raise pytest.UsageError("/dev/fuse is missing: these tests need FUSE")


@pytest.fixture
def mounter(tmp_path, request):
    """mounter(source, *options, form=..., split=..., cache=...) -> tfs.Mount.

    Every mount gets its own cache_dir under the test's tmp_path; all are unmounted at teardown."""
    m = tfs.Mounter(tmp_path / "mnt")
    expired = threading.Event()

    def on_timeout():
        expired.set()
        pids = [p for mount in m.mounts for p in mount.pids]
        print(f"\n[watchdog] {request.node.nodeid}: over {TEST_TIMEOUT:.0f} s, killing tensorfs {pids}", file=sys.stderr)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    timer = threading.Timer(TEST_TIMEOUT, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        yield m
    finally:
        timer.cancel()
        m.cleanup()
    if expired.is_set():
        pytest.fail(f"timed out after {TEST_TIMEOUT:.0f} s (the tensorfs daemon was killed)")


@pytest.fixture(scope="session")
def main_ds(tmp_path_factory) -> tfs.Dataset:
    """3 files x 3-4 row groups, 3000 rows, every supported column type."""
    return tfs.make_main(tmp_path_factory.mktemp("main") / "data")


@pytest.fixture(scope="session")
def shuf_ds(tmp_path_factory) -> tfs.Dataset:
    """3 files, 13 row groups of 200 rows, 2600 rows: id and x = id / 2."""
    return tfs.make_shuffle(tmp_path_factory.mktemp("shuf") / "data")


# --------------------------------------------------------------------------------------------
# S3: moto, a bucket, the fault proxy (moto and boto3 are imported only by the tests using them)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hermetic_env():
    """tensorfs (a child of this process) sees no cloud settings or HTTP proxies but ours."""
    saved = dict(os.environ)
    for k in list(os.environ):
        if k.startswith(("AWS_", "AZURE_", "AZURITE_", "GOOGLE_", "GCS_", "STORAGE_EMULATOR")) or k.lower() in (
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "no_proxy",
        ):
            del os.environ[k]
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def s3_client(endpoint: str, **config):
    boto3 = tfs.require("boto3", "boto3 is not installed (scripts/setup installs it)")
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30, **config),
    )


def s3_opts(endpoint: str, secret: str = SECRET) -> list[str]:
    """The mount options that point tensorfs at the S3 server (or proxy) at ENDPOINT."""
    return [
        f"aws_endpoint={endpoint}",
        "aws_allow_http=true",
        f"aws_access_key_id={KEY_ID}",
        f"aws_secret_access_key={secret}",
        f"aws_region={REGION}",
    ]


@dataclass
class S3:
    url: str
    proc: subprocess.Popen
    client: object

    def upload_dir(self, path: Path, prefix: str) -> list[str]:
        """Upload PATH's *.parquet files under PREFIX/; returns the keys."""
        keys = []
        for p in sorted(path.iterdir()):
            if p.name.endswith(".parquet"):
                key = f"{prefix}/{p.name}"
                self.client.upload_file(str(p), BUCKET, key)
                keys.append(key)
        assert keys, f"no .parquet files in {path}"
        return keys

    def put(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), BUCKET, key)

    @staticmethod
    def src(prefix: str) -> str:
        """The mount source of PREFIX in the test bucket."""
        return f"s3://{BUCKET}/{prefix}/"

    @staticmethod
    def opts(endpoint: str) -> list[str]:
        """s3_opts(ENDPOINT): through the proxy, pass the proxy's URL."""
        return s3_opts(endpoint)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto's S3 server (scripts/s3-server) on a free loopback port, with the test bucket."""
    tfs.require("moto.server", "moto[server] is not installed (scripts/setup installs it)")
    tfs.require("boto3", "boto3 is not installed (scripts/setup installs it)")
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(S3_SERVER), "--quiet", "--lifetime", "3600"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        url = faultproxy._readline_within(proc, 60).strip()
        assert url.startswith("http://127.0.0.1:"), f"s3-server did not start: {url!r}\n{log.read_text()[-3000:]}"
        client = s3_client(url)
        client.create_bucket(Bucket=BUCKET)
        yield S3(url, proc, client)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def proxy(s3, tmp_path):
    """A fault proxy in front of moto, healthy until told otherwise; its log is in tmp_path.
    proxy.stats() counts what went through it (requests, by_method, object_gets,
    bytes_forwarded); proxy.reset_stats() zeroes the counters."""
    with open(tmp_path / "faultproxy.log", "w") as err:
        p = faultproxy.start(s3.url, lifetime=900, stderr=err, verbose=True)
    try:
        yield p
    finally:
        p.stop()
