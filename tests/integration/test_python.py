"""The Python package (PRODUCT.md §9): `tensorfs.numpy.batches` and `tensorfs.torch.BatchDataset`
read a mount's `all/` memory maps, batch for batch equal to its batch files, under every
multiprocessing start method, and resume mid-epoch."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

import tfs

sys.path.insert(0, str(tfs.REPO / "python"))

import tensorfs  # noqa: E402
import tensorfs.numpy  # noqa: E402


def batch_file(m: tfs.Mount, rel_dir: str, i: int) -> dict[str, np.ndarray]:
    return tfs.load_safetensors(m.p(rel_dir, f"{tfs.batch_name(i)}.safetensors"))


def assert_same(got: dict, want: dict, what: str):
    assert sorted(got) == sorted(want), what
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=f"{what} {k}")


def test_numpy_batches_are_the_batch_files(mounter, shuf_ds, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m = mounter(shuf_ds.path, "batch_size=300", "epochs=2", "world_size=2")
    n = m.dataset()["batches_per_epoch"]
    got = list(tensorfs.numpy.batches(m.path, epoch=1))
    assert len(got) == n == 9
    for i, b in enumerate(got):
        assert_same(b, batch_file(m, "epoch-1", i), f"epoch 1 batch {i}")
    assert len(list(tensorfs.numpy.batches(m.path, epoch=1, start=7))) == 2
    # A rank's view: from the environment, as torchrun sets it, or given.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ranked = list(tensorfs.numpy.batches(m.path, epoch=0))
    assert len(ranked) == m.dataset()["rank_batches_per_epoch"] == 4
    for i, b in enumerate(ranked):
        assert_same(b, batch_file(m, "epoch-0/rank-1-of-2", i), f"rank 1 batch {i}")
    with pytest.raises(ValueError, match=r"world_size 4 disagrees with the mount's world_size=2"):
        next(tensorfs.numpy.batches(m.path, rank=0, world_size=4))
    assert tensorfs.dataset_json(m.path)["fingerprint"] == m.dataset()["fingerprint"]


@pytest.fixture(scope="module")
def torch():
    return tfs.require("torch", "PyTorch is not installed (scripts/setup installs it for the tests)")


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_torch_dataloader_reads_every_batch_under_each_start_method(mounter, shuf_ds, torch, method, monkeypatch):
    from tensorfs.torch import BatchDataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m = mounter(shuf_ds.path, "batch_size=256", "epochs=2")
    ds = BatchDataset(m.path, epoch=1)
    n = len(ds)
    assert n == m.dataset()["batches_per_epoch"]
    first = ds[0]
    assert all(isinstance(t, torch.Tensor) for t in first.values())
    # The memory maps opened here are not what a worker gets: nothing of them is pickled.
    assert len(pickle.dumps(ds)) < 64 << 10
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=workers, multiprocessing_context=method if workers else None
        )
        got = list(loader)
        assert len(got) == n
        for i, b in enumerate(got):
            assert_same({k: v.numpy() for k, v in b.items()}, batch_file(m, "epoch-1", i), f"{method}/{workers} batch {i}")
    ds.set_epoch(0)
    assert_same({k: v.numpy() for k, v in ds[3].items()}, batch_file(m, "epoch-0", 3), "epoch 0 batch 3")


def test_a_torch_dataset_resumes_mid_epoch_and_checks_its_dataset(mounter, shuf_ds, torch, tmp_path, monkeypatch):
    from tensorfs.torch import BatchDataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m = mounter(shuf_ds.path, "batch_size=200", "epochs=3", "world_size=2")
    ds = BatchDataset(m.path, epoch=2, rank=1, world_size=2)
    n = len(ds)
    assert n == m.dataset()["rank_batches_per_epoch"]
    state = ds.state_dict(batches_done=4)
    assert (state["epoch"], state["start"]) == (2, 4)
    again = BatchDataset(m.path, rank=1, world_size=2)
    again.load_state_dict(state)
    assert (again.epoch, len(again)) == (2, n - 4)
    assert_same({k: v.numpy() for k, v in again[0].items()}, batch_file(m, "epoch-2/rank-1-of-2", 4), "resumed")
    assert again.state_dict(batches_done=1)["start"] == 5
    # A state saved from another dataset is refused, naming both.
    other = tmp_path / "other"
    tfs.make_shuffle(other)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": np.arange(5, dtype=np.int64), "x": np.zeros(5, np.float32)}), other / "z.parquet")
    o = mounter(other, "batch_size=200", "world_size=2")
    with pytest.raises(ValueError, match="saved from dataset"):
        BatchDataset(o.path, rank=1, world_size=2).load_state_dict(state)
    # torch.distributed's world size, or WORLD_SIZE, must agree with the mount's.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"world_size 3 disagrees with the mount's world_size=2"):
        BatchDataset(m.path)


def ranked_reader(m: tfs.Mount, epoch: int):
    """read(ds, i) -> (global index, batch): ds[i] as NumPy, found in the epoch's global order by
    its ids (every id is in one batch) and checked against that global batch file."""
    bs = m.dataset()["batch_size"]
    where = {int(v): row // bs for row, v in enumerate(np.load(m.p(f"epoch-{epoch}", "all", "id.npy")))}

    def read(ds, i):
        got = {k: v.numpy() for k, v in ds[i].items()}
        g = where[int(got["id"][0])]
        assert_same(got, batch_file(m, f"epoch-{epoch}", g), f"global batch {g}")
        return g

    return read


def test_a_torch_dataset_resumes_at_another_world_size(mounter, shuf_ds, torch, monkeypatch):
    """PRODUCT.md §5, elastic resume: a W=4 job's state resumed at W=2, then at W=3, then by the
    global view: no global batch is read twice, none the ranks share is skipped."""
    from tensorfs.torch import BatchDataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # No world_size on the mount: every rank-R-of-W/ resolves by name. 26 batches: W=4 and W=3
    # share 24 of them (6 and 8 a rank), W=2 all 26.
    m = mounter(shuf_ds.path, "batch_size=100", "epochs=2")
    assert m.dataset()["batches_per_epoch"] == 26
    read = ranked_reader(m, 1)
    seen: list[int] = []

    def ranks(w):
        return [BatchDataset(m.path, epoch=1, rank=r, world_size=w) for r in range(w)]

    def states(dss, k):
        sts = [ds.state_dict(batches_done=k) for ds in dss]
        # Every rank records the same progress; only its own next batch differs.
        assert len({(s["global_done"], s["epoch"], s["world_size"]) for s in sts}) == 1, sts
        return sts

    # W=4: every rank reads 2 batches, so the job has read global batches [0, 8).
    w4 = ranks(4)
    seen += [read(ds, i) for ds in w4 for i in range(2)]
    s4 = states(w4, 2)
    assert (s4[1]["format"], s4[1]["global_done"], s4[1]["start"], s4[1]["world_size"]) == (2, 8, 2, 4)
    assert s4[1]["options"]["batch_size"] == s4[1]["batch_size"] == 100

    # W=2 from rank 3's state: both start at local 4 (global 8 and 9); 3 batches each -> [0, 14).
    w2 = ranks(2)
    for ds in w2:
        ds.load_state_dict(s4[3])
    assert [(ds.epoch, ds.start, len(ds)) for ds in w2] == [(1, 4, 9), (1, 4, 9)]
    seen += [read(ds, i) for ds in w2 for i in range(3)]
    s2 = states(w2, 3)
    assert s2[0]["global_done"] == 14

    # The global view continues at global batch 14.
    whole = BatchDataset(m.path, epoch=0)
    whole.load_state_dict(s2[1])
    assert (whole.epoch, len(whole), read(whole, 0)) == (1, 12, 14)

    # W=3 from rank 0's state: ranks start at globals 15, 16, 14 (local 5, 5, 4): uneven, 3, 3
    # and 4 batches left of the 24 that three ranks share.
    w3 = ranks(3)
    for ds in w3:
        ds.load_state_dict(s2[0])
    assert [len(ds) for ds in w3] == [3, 3, 4]
    assert [ds.state_dict()["start"] for ds in w3] == [5, 5, 4]
    assert states(w3, 2)[0]["global_done"] == 20  # in step: [0, 14 + 2·3)
    seen += [read(ds, i) for ds in w3 for i in range(len(ds))]
    # Run to its end, the longer rank records every shared batch read.
    assert w3[2].state_dict(batches_done=4)["global_done"] == 24

    # Across the three worlds: each of the 24 shared batches exactly once.
    assert sorted(seen) == list(range(24)), sorted(seen)

    # set_epoch starts over, and a fresh state_dict counts from there.
    w3[1].set_epoch(0)
    assert (len(w3[1]), w3[1].state_dict(batches_done=1)["global_done"]) == (8, 3)
    with pytest.raises(ValueError, match=r"batches_done 9 is not within the 8 batches"):
        w3[1].state_dict(batches_done=9)


def test_a_torch_dataset_continues_an_old_state_and_refuses_what_it_cannot(mounter, shuf_ds, torch, tmp_path, monkeypatch):
    from tensorfs.torch import BatchDataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # An older tensorfs had no shuffle=block: its states continue on a mount of its options.
    m = mounter(shuf_ds.path, "batch_size=100", "epochs=2", "shuffle=window")
    fp = m.dataset()["fingerprint"]
    read = ranked_reader(m, 1)

    # A state of before format 2 (rank 1 of 4 at its batch 2): the job read start·W = 8 global
    # batches; the same rank continues exactly, and other worlds where no batch repeats.
    old = {"epoch": 1, "start": 2, "rank": 1, "world_size": 4, "fingerprint": fp}
    ds = BatchDataset(m.path, rank=1, world_size=4)
    ds.load_state_dict(old)
    assert (ds.start, len(ds), read(ds, 0)) == (2, 4, 9)
    assert ds.state_dict(batches_done=1)["global_done"] == 12
    two = BatchDataset(m.path, rank=0, world_size=2)
    two.load_state_dict(old)
    assert (two.start, read(two, 0)) == (4, 8)
    whole = BatchDataset(m.path)
    whole.load_state_dict({"epoch": 1, "start": 5, "rank": None, "world_size": None, "fingerprint": fp})
    assert (whole.start, len(whole), read(whole, 0)) == (5, 21, 5)
    # tensorfs.numpy.batches takes the same global position.
    got = list(tensorfs.numpy.batches(m.path, epoch=1, rank=0, world_size=2, global_start=8))
    assert len(got) == 9
    assert_same(got[0], batch_file(m, "epoch-1", 8), "numpy global_start")

    state = BatchDataset(m.path, epoch=1, rank=0, world_size=2).state_dict(batches_done=3)
    # Another dataset.
    other = tmp_path / "other"
    tfs.make_shuffle(other)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": np.arange(5, dtype=np.int64), "x": np.zeros(5, np.float32)}), other / "z.parquet")
    o = mounter(other, "batch_size=100")
    with pytest.raises(ValueError, match=rf"saved from dataset {fp}, but .* serves "):
        BatchDataset(o.path, rank=0, world_size=2).load_state_dict(state)
    # Other order options: batch i holds other rows.
    b = mounter(shuf_ds.path, "batch_size=200")
    with pytest.raises(ValueError, match=r"saved with batch_size=100, but .* serves batch_size=200"):
        BatchDataset(b.path, rank=0, world_size=2).load_state_dict(state)
    s = mounter(shuf_ds.path, "batch_size=100", "seed=7")
    with pytest.raises(ValueError, match=r"saved with seed=0, but .* serves seed=7"):
        BatchDataset(s.path, rank=1, world_size=3).load_state_dict(state)
    # No older job's order is a shuffle=block mount's: its state is refused there.
    with pytest.raises(ValueError, match=r"saved by an older tensorfs, which had no shuffle=block"):
        BatchDataset(b.path, rank=1, world_size=4).load_state_dict(old)
    # Past the batches the new world shares: the global view read 25 of 26, four ranks share 24.
    end = BatchDataset(m.path, epoch=1).state_dict(batches_done=25)
    with pytest.raises(ValueError, match=r"has read 25 global batches of epoch 1, past the 24 that the 4 ranks share"):
        BatchDataset(m.path, rank=3, world_size=4).load_state_dict(end)
    BatchDataset(m.path, rank=1, world_size=2).load_state_dict(end)  # two ranks share all 26


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_set_epoch_reaches_persistent_workers(mounter, shuf_ds, torch, method, monkeypatch):
    """persistent_workers=True keeps each worker's copy of the dataset across epochs: the epoch
    the training loop sets must reach it, or epoch 0 is trained on again and again."""
    from tensorfs.torch import BatchDataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m = mounter(shuf_ds.path, "batch_size=256", "epochs=3")
    ds = BatchDataset(m.path)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=method
    )
    for epoch in (0, 2, 1):
        ds.set_epoch(epoch)
        got = list(loader)
        assert len(got) == m.dataset()["batches_per_epoch"]
        for i, b in enumerate(got):
            assert_same({k: v.numpy() for k, v in b.items()}, batch_file(m, f"epoch-{epoch}", i), f"{method} epoch {epoch} batch {i}")
    # A resume mid-epoch reaches them too.
    ds.set_epoch(1)
    state = ds.state_dict(batches_done=3)
    ds.set_epoch(0)
    ds.load_state_dict(state)
    got = list(loader)
    assert len(got) == len(ds) == m.dataset()["batches_per_epoch"] - 3
    assert_same({k: v.numpy() for k, v in got[0].items()}, batch_file(m, "epoch-1", 3), f"{method} resumed")
    # A plain pickle takes the place as it is, detached from the workers'.
    copy = pickle.loads(pickle.dumps(ds))
    assert (copy.epoch, copy.start) == (1, 3)


def test_a_resume_refuses_a_change_of_any_option_that_changes_the_batches(mounter, shuf_ds, torch, monkeypatch):
    from tensorfs.torch import BatchDataset

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    m = mounter(shuf_ds.path, "batch_size=256")
    names = m.dataset()["order_options"]
    for name in ("batch_size", "seed", "shuffle", "columns", "transform_columns", "partitions"):
        assert name in names, names
    assert "prefetch" not in names and "cache_dir" not in names
    state = BatchDataset(m.path).state_dict(batches_done=1)
    other = mounter(shuf_ds.path, "batch_size=256", "shuffle_window=2")
    with pytest.raises(ValueError, match=r"saved with shuffle_window=4"):
        BatchDataset(other.path).load_state_dict(state)
