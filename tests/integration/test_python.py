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
    return pytest.importorskip("torch", reason="PyTorch is not installed (scripts/setup installs it for the tests)")


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
