"""The shape of the tree: readdir, lookups, ENOENT."""

import errno
import os
import stat

import tfs
from tfs import batch_name

BS = 256  # shuffle dataset: 2600 rows -> 11 batches (10 full, last 40 rows)
N = 11


def batch_entries(n):
    """A batch directory's entries: each batch's file and directory, and the one-open
    all.safetensors and all/ (PRODUCT.md §2)."""
    return sorted([batch_name(i) + ".safetensors" for i in range(n)] + [batch_name(i) for i in range(n)] + ["all.safetensors", "all"])


def test_root_and_epoch_listing(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=2")
    root = set(os.listdir(m.path))
    assert {"dataset.json", "epoch-0", "epoch-1"} <= root, root
    assert {e for e in root if e.startswith("epoch-")} == {"epoch-0", "epoch-1"}
    # Anything else at the root is one of the documented extras.
    assert root - {"dataset.json", "epoch-0", "epoch-1"} <= {"gds", ".tensorfs"}, root
    assert stat.S_ISREG(os.stat(m.p("dataset.json")).st_mode)
    assert stat.S_ISDIR(os.stat(m.path).st_mode)

    for e in ("epoch-0", "epoch-1"):
        assert stat.S_ISDIR(os.stat(m.p(e)).st_mode)
        assert sorted(os.listdir(m.p(e))) == batch_entries(N)
        for i in (0, N - 1):
            assert stat.S_ISREG(os.stat(m.p(e, batch_name(i) + ".safetensors")).st_mode)
            assert stat.S_ISDIR(os.stat(m.p(e, batch_name(i))).st_mode)
            assert sorted(os.listdir(m.p(e, batch_name(i)))) == ["id.npy", "x.npy"]
            assert stat.S_ISREG(os.stat(m.p(e, batch_name(i), "x.npy")).st_mode)

    # scandir's d_type agrees with stat.
    with os.scandir(m.p("epoch-0")) as it:
        for entry in it:
            assert entry.is_dir() == (not entry.name.endswith(".safetensors")), entry.name


def test_a_listing_carries_attributes(mounter, shuf_ds):
    """A directory listed (readdirplus: the kernel's first buffer carries attributes) then
    stat'ed entry by entry costs no lookup per entry, and the attributes the listing gave are
    those stat gives: exact sizes before anything is built. gds/ entries list as symlinks,
    batch files as files."""
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=2")
    os.stat(m.p("epoch-1"))
    os.stat(m.p("gds", "epoch-1"))
    before = tfs.stats(m)["lookups"]
    with os.scandir(m.p("epoch-1")) as it:
        listed = {e.name: (e.is_dir(follow_symlinks=False), e.is_symlink()) for e in it}
    assert sorted(listed) == batch_entries(N)
    sizes = {name: os.stat(m.p("epoch-1", name)).st_size for name in listed}
    assert tfs.stats(m)["lookups"] == before, "stat after a listing looked names up"
    assert tfs.stats(m)["batches_built"] == 0
    for name, (is_dir, is_link) in listed.items():
        assert not is_link, name
        assert is_dir == (not name.endswith(".safetensors")), name
    # The sizes stat gave are the files' real lengths.
    for i in (0, N - 1):
        name = batch_name(i) + ".safetensors"
        assert len(tfs.read_exact(m.p("epoch-1", name))) == sizes[name]
    assert len(tfs.read_exact(m.p("epoch-1", "all.safetensors"))) == sizes["all.safetensors"]
    with os.scandir(m.p("gds", "epoch-1")) as it:
        kinds = {e.name: (e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in it}
    for name, (is_link, is_dir) in kinds.items():
        assert is_link == name.endswith(".safetensors"), (name, is_link)
        assert is_dir == (not name.endswith(".safetensors")), (name, is_dir)


def test_epoch_beyond_epochs_resolves(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "epochs=2")
    assert "epoch-7" not in os.listdir(m.path)
    assert os.path.isdir(m.p("epoch-7"))
    assert sorted(os.listdir(m.p("epoch-7"))) == batch_entries(N)
    ids = tfs.load_safetensors(m.p("epoch-7", batch_name(0) + ".safetensors"))["id"]
    assert len(ids) == BS
    assert os.path.isfile(m.p("epoch-123456", batch_name(N - 1), "x.npy"))


def test_rank_view_listing(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "world_size=2")
    entries = sorted(os.listdir(m.p("epoch-0")))
    assert entries == sorted(batch_entries(N) + ["rank-0-of-2", "rank-1-of-2"])
    for r in range(2):
        rd = m.p("epoch-0", f"rank-{r}-of-2")
        assert stat.S_ISDIR(os.stat(rd).st_mode)
        assert sorted(os.listdir(rd)) == batch_entries(N // 2)
        assert sorted(os.listdir(rd / batch_name(0))) == ["id.npy", "x.npy"]
    # Rank views in an epoch beyond `epochs` too.
    assert sorted(os.listdir(m.p("epoch-5", "rank-1-of-2"))) == batch_entries(N // 2)


def test_no_rank_views_without_world_size(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}")
    assert not any(e.startswith("rank-") for e in os.listdir(m.p("epoch-0")))


ENOENT_PATHS = [
    "nope",
    "epoch-x",
    "epoch-",
    "epoch--1",
    "epoch-0/nope",
    "epoch-0/99999999.safetensors",
    f"epoch-0/{N:06d}.safetensors",
    f"epoch-0/{N:06d}",
    "epoch-0/0.safetensors",
    "epoch-0/000000.npy",
    "epoch-0/000000/nope.npy",
    "epoch-0/000000/id",
    "epoch-0/rank-3-of-2",
    "epoch-0/rank-2-of-2",
    f"epoch-0/rank-0-of-2/{N // 2:06d}.safetensors",
    "epoch-0/rank-0-of-2/000000/nope.npy",
]


def test_enoent(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "world_size=2")
    wrong = []
    for rel in ENOENT_PATHS:
        for op in (os.stat, lambda p: open(p, "rb").close()):
            try:
                op(m.p(rel))
                wrong.append(f"{rel}: exists")
                break
            except OSError as e:
                if e.errno != errno.ENOENT:
                    wrong.append(f"{rel}: {e!r}")
                    break
    assert not wrong, "expected ENOENT:\n" + "\n".join(wrong)


def test_dataset_json_is_small_and_valid(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}")
    raw = tfs.read_exact(m.p("dataset.json"))
    assert raw.lstrip().startswith(b"{")
    assert m.dataset()["batches_per_epoch"] == N
