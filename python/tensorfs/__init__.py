"""tensorfs: read the batches a tensorfs mount serves.

The `tensorfs` command mounts a Parquet dataset as per-epoch tensor batch files; this package
is the glue a training loop needs on top of those files:

- `tensorfs.numpy.batches(mountpoint, epoch=0, rank=None, world_size=None, start=0)`: the
  batches as dicts of NumPy arrays, in order (NumPy only).
- `tensorfs.torch.BatchDataset(mountpoint, epoch=0, rank=None, world_size=None)`: a PyTorch
  map-style dataset, `ds[i]` batch i as a dict of tensors (needs PyTorch).

Both read a directory's `all/NAME.npy` memory maps: one open per tensor per epoch.
"""

from tensorfs._view import dataset_json

__all__ = ["dataset_json"]
