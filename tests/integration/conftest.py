"""Fixtures for the tensorfs integration tests (see tfs.py for the helpers)."""

import os
import signal
import sys
import threading

import pytest

import tfs

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
