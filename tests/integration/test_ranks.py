"""Rank views: rank-R-of-W/ batch j is global batch R + j*W, byte for byte; every rank has
floor(N/W) batches; world_size does not change the global order."""

import errno
import os

import numpy as np
import pytest

import tfs
from tfs import batch_name

BS, N, W = 256, 11, 3  # 11 batches, 11 mod 3 = 2 left out of rank views


def batch_files(m: tfs.Mount, rel_dir: str, j: int) -> list[str]:
    name = batch_name(j)
    return [f"{rel_dir}/{name}.safetensors"] + [f"{rel_dir}/{name}/{f}" for f in ("id.npy", "x.npy")]


@pytest.mark.parametrize("mode", ["window", "none"])
def test_rank_views_match_global_batches(mounter, shuf_ds, mode):
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", f"world_size={W}", "epochs=2")
    plain = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", "epochs=2")

    dj = m.dataset()
    assert dj["world_size"] == W
    assert dj["rank_batches_per_epoch"] == N // W == 3
    assert dj["batches_per_epoch"] == N

    per_rank = N // W
    for epoch in ("epoch-0", "epoch-1"):
        # Rank files first, on a cold cache: they must not depend on the global files being read.
        rank_hashes = {}
        for r in range(W):
            rd = f"{epoch}/rank-{r}-of-{W}"
            names = sorted(os.listdir(m.p(rd)))
            assert names == sorted([batch_name(j) + ".safetensors" for j in range(per_rank)] + [batch_name(j) for j in range(per_rank)] + ["all.safetensors", "all"])
            for j in range(per_rank):
                for rel in batch_files(m, rd, j):
                    rank_hashes[(r, j, rel.split("/", 2)[2])] = tfs.sha256(m.p(rel))
            with pytest.raises(OSError) as e:
                os.stat(m.p(rd, batch_name(per_rank) + ".safetensors"))
            assert e.value.errno == errno.ENOENT
        for (r, j, tail), h in rank_hashes.items():
            g = r + j * W
            grel = f"{epoch}/{tail.replace(batch_name(j), batch_name(g), 1)}"
            assert tfs.sha256(m.p(grel)) == h, f"{epoch} rank {r} batch {j} != global batch {g} ({tail})"
            assert tfs.sha256(plain.p(grel)) == h, f"world_size changed global batch {g} of {epoch} ({tail})"

    # Rank batch files have the full batch size and content of their global batch.
    b = tfs.load_safetensors(m.p("epoch-0", f"rank-2-of-{W}", batch_name(2) + ".safetensors"))
    g = tfs.load_safetensors(m.p("epoch-0", batch_name(2 + 2 * W) + ".safetensors"))
    tfs.assert_array(b["id"], g["id"], "rank-2 batch 2 ids")
    assert len(b["id"]) == BS


def test_rank_views_all_ranks_cover_the_epoch_but_the_tail(mounter, shuf_ds):
    """Across ranks, the rank views hold exactly the rows of global batches 0..floor(N/W)*W-1."""
    m = mounter(shuf_ds.path, "shuffle=global", f"batch_size={BS}", f"world_size={W}")
    rank_ids, global_ids = [], []
    for r in range(W):
        for j in range(N // W):
            rank_ids.append(tfs.load_safetensors(m.p("epoch-0", f"rank-{r}-of-{W}", batch_name(j) + ".safetensors"))["id"])
    for i in range((N // W) * W):
        global_ids.append(tfs.load_safetensors(m.p("epoch-0", batch_name(i) + ".safetensors"))["id"])
    ri, gi = np.sort(np.concatenate(rank_ids)), np.sort(np.concatenate(global_ids))
    assert np.array_equal(ri, gi)
    assert len(np.unique(ri)) == len(ri) == (N // W) * W * BS
