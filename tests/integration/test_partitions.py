"""partitions=P (PRODUCT.md §5 "Many hosts"): fixed partitions, batch i < n*P drawn from
partition i mod P, leftover rows in the last batches, rank views of the single-partition
batches only, the same global order for every world_size, and each host fetching only its
share (counted in row groups decoded and remote bytes, not timed)."""

import os

import numpy as np
import pytest

import tfs
from tfs import batch_name

BS = 64
ROWS = 2600  # shuf_ds: 13 row groups of 200 rows


def ids(m: tfs.Mount, rel_dir: str, i: int) -> np.ndarray:
    return tfs.load_safetensors(m.p(rel_dir, batch_name(i) + ".safetensors"))["id"]


@pytest.mark.parametrize("mode", ["window", "global", "none"])
def test_batches_come_from_their_partition_and_the_epoch_is_a_permutation(mounter, shuf_ds, mode):
    P = 4
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", f"partitions={P}", "epochs=2", "seed=5")
    dj = m.dataset()
    # 4 partitions of 650 rows: 10 full batches each, 10 rows of each left over.
    assert dj["partitions"] == P and dj["options"]["partitions"] == P
    assert dj["partition_rows"] == [650] * 4
    assert dj["partition_row_ranges"] == [[0, 650], [650, 1300], [1300, 1950], [1950, 2600]]
    assert dj["batches_per_partition"] == 10
    assert dj["single_partition_batches"] == 40
    assert dj["leftover_rows"] == 40
    assert dj["leftover_batches"] == 1
    assert dj["batches_per_epoch"] == 41 and dj["last_batch_rows"] == 40
    leftovers = []
    for e in (0, 1):
        seen = []
        for i in range(41):
            b = tfs.load_safetensors(m.p(f"epoch-{e}", batch_name(i) + ".safetensors"))
            tfs.assert_array(b["x"], (b["id"] / 2).astype(np.float32), f"epoch {e} batch {i} x")
            if i < 40:
                lo, hi = dj["partition_row_ranges"][i % P]
                assert len(b["id"]) == BS
                assert ((b["id"] >= lo) & (b["id"] < hi)).all(), f"epoch {e} batch {i} left partition {i % P}"
            seen.append(b["id"])
        allids = np.concatenate(seen)
        assert np.array_equal(np.sort(allids), np.arange(ROWS)), f"epoch {e} is not a permutation"
        leftovers.append(set(seen[-1].tolist()))
        if mode == "none":
            # Canonical order inside each partition.
            assert np.array_equal(seen[0], np.arange(0, BS)) and np.array_equal(seen[1], np.arange(650, 650 + BS))
    if mode != "none":
        assert leftovers[0] != leftovers[1], "the leftover rows should change with the epoch's shuffle"


def test_the_global_order_does_not_depend_on_world_size(mounter, shuf_ds):
    opts = ("shuffle=window", f"batch_size={BS}", "partitions=4", "seed=2")
    plain = mounter(shuf_ds.path, *opts)
    ranked = {w: mounter(shuf_ds.path, *opts, f"world_size={w}") for w in (2, 3, 4)}
    glob = {i: tfs.sha256(plain.p("epoch-0", batch_name(i) + ".safetensors")) for i in range(41)}
    for w, m in ranked.items():
        dj = m.dataset()
        per_rank = 40 // w
        assert dj["rank_batches_per_epoch"] == per_rank
        assert dj["rank_left_out_batches"] == 41 - per_rank * w
        for r in range(w):
            rd = f"epoch-0/rank-{r}-of-{w}"
            names = sorted(n for n in os.listdir(m.p(rd)) if n.endswith(".safetensors") and n != "all.safetensors")
            assert names == [batch_name(j) + ".safetensors" for j in range(per_rank)]
            for j in range(per_rank):
                got = tfs.sha256(m.p(rd, batch_name(j) + ".safetensors"))
                assert got == glob[r + j * w], f"W={w} rank {r} batch {j} != global batch {r + j * w}"
        for i in (0, 17, 40):
            assert tfs.sha256(m.p("epoch-0", batch_name(i) + ".safetensors")) == glob[i]


def test_each_host_fetches_only_its_share(mounter, shuf_ds):
    """Two hosts (fresh caches) each read their rank view of partitions=2: together they decode
    and fetch about what one mount reading the whole epoch does, not twice that."""
    opts = ("shuffle=window", f"batch_size={BS}", "partitions=2")
    # Every host reads the files' footers at mount: on a dataset this small they weigh as much
    # as the data, so the share is checked on the bytes fetched after the mount.
    footers = tfs.stats(mounter(shuf_ds.path, *opts))["remote_bytes"]
    whole = mounter(shuf_ds.path, *opts)
    for i in range(whole.dataset()["batches_per_epoch"]):
        tfs.read_exact(whole.p("epoch-0", batch_name(i) + ".safetensors"))
    one = tfs.stats(whole)
    assert one["row_groups_decoded"] == 13
    hosts = []
    for r in range(2):
        m = mounter(shuf_ds.path, *opts, "world_size=2")
        rd = f"epoch-0/rank-{r}-of-2"
        n = m.dataset()["rank_batches_per_epoch"]
        assert n == 20
        for j in range(n):
            got = ids(m, rd, j)
            lo, hi = (0, 1300) if r == 0 else (1300, 2600)
            assert ((got >= lo) & (got < hi)).all()
        hosts.append(tfs.stats(m))
    # Partition 0 is rows 0..1300: row groups 0..6 (row group 6 is split with partition 1).
    assert [h["row_groups_decoded"] for h in hosts] == [7, 7]
    total = sum(h["remote_bytes"] - footers for h in hosts)
    alone = one["remote_bytes"] - footers
    assert alone > 0
    assert total <= 1.2 * alone, f"two hosts fetched {total} bytes of data, one mount {alone}"


def test_a_resized_job_fetches_nothing_it_has(mounter, shuf_ds, tmp_path):
    """Elastic: world_size 2 -> 4 on the same cache: rank 0 of 4 and rank 2 of 4 read only what
    rank 0 of 2 had, so nothing is fetched or decoded again."""
    cache = tmp_path / "host-cache"
    opts = ("shuffle=window", f"batch_size={BS}", "partitions=4")
    a = mounter(shuf_ds.path, *opts, "world_size=2", cache=cache)
    for j in range(20):
        tfs.read_exact(a.p("epoch-0/rank-0-of-2", batch_name(j) + ".safetensors"))
    first = {j: tfs.sha256(a.p("epoch-0/rank-0-of-2", batch_name(j) + ".safetensors")) for j in range(20)}
    a.unmount()
    b = mounter(shuf_ds.path, *opts, "world_size=4", cache=cache)
    for r in (0, 2):
        for j in range(10):
            h = tfs.sha256(b.p(f"epoch-0/rank-{r}-of-4", batch_name(j) + ".safetensors"))
            # Global batch r + 4j is rank 0 of 2's batch (r + 4j) / 2.
            assert h == first[(r + 4 * j) // 2]
    s = tfs.stats(b)
    assert s["row_groups_decoded"] == 0, s
    assert s["batch_files_written"] == 0, s


def test_warm_materialises_one_ranks_share(mounter, shuf_ds):
    m = mounter(shuf_ds.path, "shuffle=window", f"batch_size={BS}", "partitions=4", "world_size=4", "prefetch=0")
    proc = tfs.run(["warm", m.path, "--epochs", "0", "--rank", "1-of-4", "--rank", "3-of-4"])
    assert proc.returncode == 0, proc.stderr
    s = tfs.stats(m)
    assert s["batch_files_written"] == 20, s
    # Partitions 1 and 3: rows 650..1300 and 1950..2600, row groups 3..6 and 9..12.
    assert s["row_groups_decoded"] == 8, s
    bad = tfs.run(["warm", m.path, "--rank", "4-of-4"])
    assert bad.returncode != 0 and "R-of-W" in tfs.error_line(bad)


def test_inspect_shows_the_partitions(shuf_ds):
    proc = tfs.run(["inspect", shuf_ds.path, "-o", f"batch_size={BS},partitions=4,world_size=3"])
    assert proc.returncode == 0, proc.stderr
    assert "partitions   4 of 650..650 rows: 10 batches each" in proc.stdout
    assert "does not divide partitions=4" in proc.stdout
    bad = tfs.run(["inspect", shuf_ds.path, "-o", "partitions=0"])
    assert bad.returncode != 0 and "partitions=0" in tfs.error_line(bad)
