"""Every write-type operation fails with EROFS, and nothing changes."""

import errno
import os

import tfs


def test_write_operations_fail_with_erofs(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "batch_size=256")
    ds = m.p("dataset.json")
    st = m.p("epoch-0", "000000.safetensors")
    npy = m.p("epoch-0", "000000", "id.npy")
    before = {p: tfs.read_exact(p) for p in (ds, st, npy)}

    ops = {
        "open dataset.json r+": lambda: open(ds, "r+b"),
        "open safetensors w": lambda: open(st, "wb"),
        "open npy O_WRONLY": lambda: os.open(npy, os.O_WRONLY),
        "open npy O_RDWR": lambda: os.open(npy, os.O_RDWR),
        "open npy O_APPEND": lambda: open(npy, "ab"),
        "create at root": lambda: open(m.p("new.txt"), "x"),
        "create in epoch": lambda: os.open(m.p("epoch-0", "new.bin"), os.O_CREAT | os.O_WRONLY, 0o644),
        "create in batch dir": lambda: open(m.p("epoch-0", "000000", "new.npy"), "wb"),
        "mkdir at root": lambda: os.mkdir(m.p("newdir")),
        "mkdir in epoch": lambda: os.mkdir(m.p("epoch-0", "newdir")),
        "rename file": lambda: os.rename(ds, m.p("renamed.json")),
        "rename batch": lambda: os.rename(st, m.p("epoch-0", "000099.safetensors")),
        "rename dir": lambda: os.rename(m.p("epoch-0"), m.p("epoch-9")),
        "unlink dataset.json": lambda: os.unlink(ds),
        "unlink npy": lambda: os.unlink(npy),
        "rmdir epoch": lambda: os.rmdir(m.p("epoch-0")),
        "rmdir batch dir": lambda: os.rmdir(m.p("epoch-0", "000000")),
        "chmod": lambda: os.chmod(st, 0o777),
        "chmod dir": lambda: os.chmod(m.p("epoch-0"), 0o777),
        "chown": lambda: os.chown(npy, 1, 1),
        "truncate": lambda: os.truncate(st, 0),
        "truncate grow": lambda: os.truncate(ds, 1 << 20),
        "utime": lambda: os.utime(npy, (0, 0)),
        "symlink": lambda: os.symlink("dataset.json", m.p("link")),
        "hard link": lambda: os.link(ds, m.p("epoch-0", "hard.json")),
        "mknod": lambda: os.mkfifo(m.p("fifo")),
    }
    wrong = []
    for name, op in ops.items():
        try:
            res = op()
        except OSError as e:
            if e.errno != errno.EROFS:
                wrong.append(f"{name}: {e!r}")
        else:
            wrong.append(f"{name}: succeeded")
            if isinstance(res, int):
                os.close(res)
            elif res is not None:
                res.close()
    assert not wrong, "expected EROFS:\n" + "\n".join(wrong)

    for p, data in before.items():
        assert tfs.read_exact(p) == data, f"{p} changed"
    root = set(os.listdir(m.path))
    assert not root & {"new.txt", "newdir", "renamed.json", "link", "fifo", "epoch-9"}, root
