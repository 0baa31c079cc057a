"""The daemon's life: a second mount on a busy mount point, SIGTERM, SIGKILL with and without
auto_unmount, and mount(8) through the helper in mount/ (a `-t fuse.tensorfs` line and an
fstab line)."""

import os
import shutil
import signal
import subprocess
import time

import pytest

import tfs

REPO = tfs.BIN.parents[2] if tfs.BIN.parent.name in ("debug", "release") else None


def tensorfs_pids(m) -> list[int]:
    out = tfs.tensorfs_daemons(m)
    assert out, f"no tensorfs daemon among {m.pids}"
    return out


def wait_unmounted(path, timeout=10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not tfs.is_mounted(path):
            return True
        time.sleep(0.05)
    return False


def test_second_mount_on_the_same_mount_point_is_refused(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "batch_size=64")
    proc = tfs.run(["mount", shuf_ds.path, m.path, "-o", f"cache_dir={m.cache}"])
    line = tfs.error_line(proc)
    assert str(m.path) in line and "already" in line
    # The first mount still serves.
    assert m.dataset()["batch_size"] == 64


def test_sigterm_unmounts_cleanly(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "batch_size=64")
    tfs.load_safetensors(m.p("epoch-0", "000000.safetensors"))
    for pid in tensorfs_pids(m):
        os.kill(pid, signal.SIGTERM)
    assert wait_unmounted(m.path), "SIGTERM left the mount in place"
    assert tfs.wait_exited(m.pids, 10) == []


@pytest.mark.skipif(not shutil.which("fusermount3"), reason="auto_unmount needs fusermount3")
@pytest.mark.parametrize("asked", [(), ("auto_unmount",)], ids=["default", "asked"])
def test_sigkill_with_auto_unmount_leaves_no_dead_mount(mounter, shuf_ds, asked):
    """auto_unmount is on by default where fusermount3 exists (PRODUCT.md §3)."""
    m = mounter(shuf_ds.path, "batch_size=64", *asked)
    for pid in tensorfs_pids(m):
        os.kill(pid, signal.SIGKILL)
    assert wait_unmounted(m.path), "a killed daemon with auto_unmount left its mount behind"
    # The mount point is usable again at once.
    again = tfs.run(["mount", shuf_ds.path, m.path, "-o", f"batch_size=32,cache_dir={m.cache}"])
    assert again.returncode == 0, again.stderr
    assert m.dataset()["batch_size"] == 32
    m.pids = tfs.daemon_pids(m.path)


def test_dead_mount_is_named_on_the_next_mount(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "batch_size=64", "auto_unmount=off")
    for pid in tensorfs_pids(m):
        os.kill(pid, signal.SIGKILL)
    tfs.wait_exited(m.pids, 10)
    proc = tfs.run(["mount", shuf_ds.path, m.path, "-o", f"cache_dir={m.cache}"])
    line = tfs.error_line(proc)
    assert "died" in line or "already" in line, line


@pytest.fixture
def mount_helper():
    """Installs mount/mount.fuse.tensorfs where mount(8) looks for it, for this test only."""
    if os.geteuid() != 0 or REPO is None:
        pytest.skip("needs root and a repository build of tensorfs")
    src = REPO / "mount" / "mount.fuse.tensorfs"
    dest = "/sbin/mount.fuse.tensorfs"
    if os.path.exists(dest):
        pytest.skip(f"{dest} exists already; not replacing it")
    shutil.copy(src, dest)
    os.chmod(dest, 0o755)
    try:
        yield dict(os.environ, TENSORFS_BIN=str(tfs.BIN))
    finally:
        os.unlink(dest)


def test_mount_t_fuse_tensorfs_and_an_fstab_line(mounter, shuf_ds, mount_helper, tmp_path):
    mnt = mounter.mountpoint()
    cache = tmp_path / "cache"
    proc = subprocess.run(
        ["mount", "-t", "fuse.tensorfs", str(shuf_ds.path), str(mnt), "-o", f"batch_size=64,nofail,cache_dir={cache}"],
        capture_output=True, text=True, timeout=60, env=mount_helper, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    m = tfs.Mount(mnt, str(shuf_ds.path), [], cache, pids=tfs.daemon_pids(mnt))
    mounter.mounts.append(m)
    assert m.dataset()["batch_size"] == 64
    m.unmount()
    assert not tfs.is_mounted(mnt)

    fstab = tmp_path / "fstab"
    fstab.write_text(f"{shuf_ds.path} {mnt} fuse.tensorfs batch_size=32,noauto,_netdev,cache_dir={cache} 0 0\n")
    proc = subprocess.run(
        ["mount", "-T", str(fstab), str(mnt)],
        capture_output=True, text=True, timeout=60, env=mount_helper, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    m.pids = tfs.daemon_pids(mnt)
    assert m.dataset()["batch_size"] == 32

    # A refusal through mount(8) still fails the mount and leaves nothing mounted.
    m.unmount()
    bad = subprocess.run(
        ["mount", "-t", "fuse.tensorfs", str(shuf_ds.path), str(mnt), "-o", "batch_size=0"],
        capture_output=True, text=True, timeout=60, env=mount_helper, stdin=subprocess.DEVNULL,
    )
    assert bad.returncode != 0
    assert "batch_size" in bad.stderr
    assert not tfs.is_mounted(mnt)


def test_the_mount_helper_passes_the_options_tensorfs_takes():
    """mount/test-helper.sh runs mount.fuse.tensorfs against a fake tensorfs that prints its
    arguments: generic mount(8) options dropped, the rest kept whole (escaped commas too)."""
    if REPO is None:
        pytest.skip("needs the repository's mount/ directory")
    proc = subprocess.run(["sh", str(REPO / "mount" / "test-helper.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all cases passed" in proc.stdout


@pytest.mark.parametrize("how", [["umount", "-l"], ["umount", "-f"], ["fusermount3", "-u", "-z"]])
def test_an_unmount_while_readers_are_busy_is_a_normal_end(tmp_path, shuf_ds, how):
    """Eight threads read random files while the mount is taken away, five times over: the
    daemon (in the foreground, so its exit status is seen) exits 0 each time, however the
    kernel ended the connection under the requests in flight: detached (-l, -z) or aborted
    (-f). A plain umount of a mount with files open is refused by the kernel (busy), and the
    daemon serves on: test_foreground covers it once the files are closed."""
    import random
    import threading

    if shutil.which(how[0]) is None:
        pytest.skip(f"{how[0]} is not installed")
    for round_ in range(5):
        mnt = tmp_path / f"busy-{round_}"
        mnt.mkdir()
        log = tmp_path / f"busy-{round_}.log"
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [str(tfs.BIN), "mount", str(shuf_ds.path), str(mnt), "-o",
                 f"batch_size=64,epochs=4,cache_dir={tmp_path / 'c'}", "--foreground"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while not tfs.is_mounted(mnt):
                assert proc.poll() is None, f"exited {proc.returncode} before mounting: {log.read_text()}"
                assert time.monotonic() < deadline
                time.sleep(0.05)
            stop = threading.Event()

            def reader(seed):
                rng = random.Random(seed)
                while not stop.is_set():
                    rel = f"epoch-{rng.randrange(4)}/{tfs.batch_name(rng.randrange(41))}.safetensors"
                    try:
                        with open(mnt / rel, "rb") as f:
                            while f.read(1 << 16):
                                pass
                    except OSError:
                        pass  # the mount going away under a read is the point

            threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(8)]
            for t in threads:
                t.start()
            time.sleep(0.5 + round_ * 0.2)
            subprocess.run([*how, str(mnt)], timeout=30, capture_output=True)
            code = proc.wait(timeout=60)
            stop.set()
            for t in threads:
                t.join(timeout=10)
            assert code == 0, f"{' '.join(how)} round {round_}: the daemon exited {code}: {log.read_text()[-2000:]}"
        finally:
            tfs.unmount(mnt)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
