"""partitions=P (PRODUCT.md §5 "Many hosts"): fixed partitions that are spread samples of the
whole dataset, batch i < n*P drawn from partition i mod P, leftover rows in the last batches,
rank views of the single-partition batches only, the same global order for every world_size,
and each host fetching only its share (counted in row groups decoded and remote bytes, not
timed). Simulated hosts on one S3
prefix (separate mounts and caches, through tests/faultproxy.py, which counts every byte): the
fetches of one epoch against one mount's, the next epoch, a job grown on the same caches, and
shuffle=global's cache check on one rank's share."""

import os

import numpy as np
import pytest

import tfs
from tfs import batch_name

BS = 64
ROWS = 2600  # shuf_ds: 13 row groups of 200 rows


def ids(m: tfs.Mount, rel_dir: str, i: int) -> np.ndarray:
    return tfs.load_safetensors(m.p(rel_dir, batch_name(i) + ".safetensors"))["id"]


def partition_sets(m: tfs.Mount, epochs, P: int, single: int) -> list[set]:
    """The rows each partition's batches (i < SINGLE, i mod P) hold over EPOCHS."""
    out = [set() for _ in range(P)]
    for e in epochs:
        for i in range(single):
            out[i % P].update(ids(m, f"epoch-{e}", i).tolist())
    return out


@pytest.mark.parametrize("mode", ["block", "window", "global", "none"])
def test_batches_come_from_their_partition_and_the_epoch_is_a_permutation(mounter, shuf_ds, mode):
    P = 4
    m = mounter(shuf_ds.path, f"shuffle={mode}", f"batch_size={BS}", f"partitions={P}", "epochs=2", "seed=5")
    dj = m.dataset()
    # 2600 rows in 4 partitions: 10 full batches each (640 rows), the 40 rows left over.
    assert dj["partitions"] == P and dj["options"]["partitions"] == P
    assert sum(dj["partition_rows"]) == ROWS and min(dj["partition_rows"]) >= 10 * BS, dj["partition_rows"]
    # 3 files are too few for whole objects a partition: row groups have homes.
    assert dj["partition_units"] == "row_groups"
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
                assert len(b["id"]) == BS
            seen.append(b["id"])
        allids = np.concatenate(seen)
        assert np.array_equal(np.sort(allids), np.arange(ROWS)), f"epoch {e} is not a permutation"
        leftovers.append(set(seen[-1].tolist()))
        if mode == "none":
            # Canonical order inside each partition.
            assert all(np.all(np.diff(np.concatenate(seen[p:40:P])) > 0) for p in range(P))
    # The partitions are fixed: over both epochs, each partition's batches draw from its own
    # rows, which no other partition's batches touch.
    sets = partition_sets(m, (0, 1), P, 40)
    for p in range(P):
        for q in range(p + 1, P):
            assert not sets[p] & sets[q], f"partitions {p} and {q} share rows"
        assert len(sets[p]) <= dj["partition_rows"][p]
        # A spread sample, not a contiguous quarter of the table: rows from across it.
        rows = np.array(sorted(sets[p]))
        assert rows.max() - rows.min() > ROWS / 2, f"partition {p} holds rows {rows.min()}..{rows.max()} only"
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
    hosts, held = [], []
    for r in range(2):
        m = mounter(shuf_ds.path, *opts, "world_size=2")
        rd = f"epoch-0/rank-{r}-of-2"
        n = m.dataset()["rank_batches_per_epoch"]
        assert n == 20
        held.append(set(np.concatenate([ids(m, rd, j) for j in range(n)]).tolist()))
        hosts.append(tfs.stats(m))
    assert not held[0] & held[1], "the two ranks' batches share rows"
    # Each host decodes the row groups its partition draws from (dataset.json counts them),
    # 13 between them and the row groups split between the two.
    row_groups = whole.dataset()["partition_row_groups"]
    assert [h["row_groups_decoded"] for h in hosts] == row_groups, row_groups
    assert sum(row_groups) <= 13 + 2
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
    proc = tfs.run(["warm", m.path, "--epochs", "0", "--rank", "1-of-4", "--rank", "3-of-4", "--format", "safetensors"])
    assert proc.returncode == 0, proc.stderr
    s = tfs.stats(m)
    assert s["batch_files_written"] == 20, s
    # Partitions 1 and 3 only: the row groups they draw from (one split between them counts
    # once), of the 13.
    per = m.dataset()["partition_row_groups"]
    assert max(per[1], per[3]) <= s["row_groups_decoded"] <= per[1] + per[3] < 13, (s, per)
    bad = tfs.run(["warm", m.path, "--rank", "4-of-4"])
    assert bad.returncode != 0 and "R-of-W" in tfs.error_line(bad)


def test_inspect_shows_the_partitions(shuf_ds):
    proc = tfs.run(["inspect", shuf_ds.path, "-o", f"batch_size={BS},partitions=4,world_size=3"])
    assert proc.returncode == 0, proc.stderr
    assert "partitions   4 of 640..680 rows (row groups drawn from the seed): 10 batches each" in proc.stdout
    assert "does not divide partitions=4" in proc.stdout
    bad = tfs.run(["inspect", shuf_ds.path, "-o", "partitions=0"])
    assert bad.returncode != 0 and "partitions=0" in tfs.error_line(bad)


# --------------------------------------------------------------------------------------------
# Several simulated hosts on one S3 prefix (PRODUCT.md §6 "Many hosts"): separate mounts, each
# with its own cache_dir, all through the byte-counting fault proxy, each reading only its rank
# view. Bytes are counted whole at the proxy: listings, footers and column chunks alike.
# --------------------------------------------------------------------------------------------

HOSTS_RG = 1000  # rows per row group
HOSTS_FILES = [("part-0.parquet", 16), ("part-1.parquet", 16)]  # (name, row groups): 32 in all
HOSTS_ROWS = HOSTS_RG * sum(n for _, n in HOSTS_FILES)
HOSTS_BS = 256
EMB = 64  # float32 per row: the data (about 8.6 MB) outweighs what each mount reads to start


@pytest.fixture(scope="module")
def hosts_ds(tmp_path_factory) -> tfs.Dataset:
    """2 files x 16 row groups of 1000 rows: id, x = id / 2, emb = 64 random float32 (which
    compress to nothing, so the bytes fetched track the rows read)."""
    import pyarrow as pa

    rng = np.random.default_rng(2024)
    tables, start = [], 0
    for name, rgs in HOSTS_FILES:
        n = rgs * HOSTS_RG
        idv = np.arange(start, start + n, dtype=np.int64)
        emb = rng.standard_normal((n, EMB)).astype(np.float32)
        tables.append((name, pa.table({"id": idv, "x": (idv / 2).astype(np.float32), "emb": tfs.fsl(emb, EMB)})))
        start += n
    path = tmp_path_factory.mktemp("hosts") / "data"
    ds = tfs.Dataset(path, tfs.write_dataset(path, tables, HOSTS_RG))
    assert [rgs for _, _, rgs in ds.files] == [n for _, n in HOSTS_FILES]
    return ds


@pytest.fixture(scope="module")
def hosts_prefix(s3, hosts_ds, hermetic_env) -> str:
    """hosts_ds uploaded to the test bucket; the mount source."""
    s3.upload_dir(hosts_ds.path, "hosts")
    return s3.src("hosts")


def chunk_bytes(ds: tfs.Dataset, row_groups) -> int:
    """The compressed size of every column chunk of the global row groups ROW_GROUPS."""
    import pyarrow.parquet as pq

    want, total, base = set(row_groups), 0, 0
    for name, _, rgs in ds.files:
        md = pq.ParquetFile(ds.path / name).metadata
        for g in range(rgs):
            if base + g in want:
                total += sum(md.row_group(g).column(c).total_compressed_size for c in range(md.num_columns))
        base += rgs
    return total


def batch_files(m: tfs.Mount, rel_dir: str) -> list[str]:
    """The batch .safetensors files of REL_DIR, in batch order (all.safetensors left out)."""
    return sorted(n for n in os.listdir(m.p(rel_dir)) if n.endswith(".safetensors") and n != "all.safetensors")


def read_view(m: tfs.Mount, rel_dir: str) -> dict[str, str]:
    """Read every file of REL_DIR as a training job would, batch files in order first (what the
    prefetcher follows), then the npy files and the one-open files; their sha256 by path."""
    out = {}
    names = batch_files(m, rel_dir)
    assert names, f"{rel_dir} lists no batch files"
    for n in names:
        out[f"{rel_dir}/{n}"] = tfs.sha256(m.p(rel_dir, n))
    out.update(tfs.batch_hashes(m, [rel_dir], len(names)))
    out[f"{rel_dir}/all.safetensors"] = tfs.sha256(m.p(rel_dir, "all.safetensors"))
    for n in sorted(os.listdir(m.p(rel_dir, "all"))):
        out[f"{rel_dir}/all/{n}"] = tfs.sha256(m.p(rel_dir, "all", n))
    return out


def fetched(proxy) -> tuple[int, int]:
    """(bytes forwarded, requests) through PROXY since its last reset."""
    s = proxy.stats()
    return s["bytes_forwarded"], s["requests"]


@pytest.mark.parametrize("parts", [4, 8])
def test_hosts_fetch_the_dataset_once_then_nothing(mounter, s3, proxy, hosts_ds, hosts_prefix, parts):
    """W = 4 hosts, partitions=P (4 or 8), each reading epoch-0/rank-R-of-4/ then
    epoch-1/rank-R-of-4/ through the proxy: (a) all 4 together fetch at most 1.2x what one mount
    fetches reading the whole epoch-0/; (b) the next epoch fetches no object bytes (each cache
    holds its share); (c) every file of every rank view is the bytes a local-source mount of
    the same content options serves."""
    W = 4
    content = ("shuffle=window", "seed=3", f"batch_size={HOSTS_BS}", f"partitions={parts}", "epochs=2")
    via = s3.opts(proxy.url)

    # One mount, a fresh cache, reading the whole epoch-0/ (every batch file, the leftover too).
    proxy.reset_stats()
    one = mounter(hosts_prefix, *content, *via)
    n_all = one.dataset()["batches_per_epoch"]
    assert len(batch_files(one, "epoch-0")) == n_all
    for n in batch_files(one, "epoch-0"):
        tfs.read_exact(one.p("epoch-0", n))
    one_stats = tfs.stats(one)
    one.unmount()
    whole, whole_requests = fetched(proxy)
    data = chunk_bytes(hosts_ds, range(32))
    assert one_stats["row_groups_decoded"] == 32, one_stats
    assert data <= whole <= data * 1.2, f"one mount fetched {whole} bytes; the column chunks are {data}"

    # W hosts, each its own cache_dir, each reading its rank view of epoch 0.
    proxy.reset_stats()
    hosts = [mounter(hosts_prefix, *content, f"world_size={W}", *via, name=f"host{r}") for r in range(W)]
    got, per_host = {}, []
    for r, h in enumerate(hosts):
        before = fetched(proxy)
        got[r] = read_view(h, f"epoch-0/rank-{r}-of-{W}")
        per_host.append(fetched(proxy)[0] - before[0])
    first, first_requests = fetched(proxy)
    s0 = [tfs.stats(h) for h in hosts]
    print(
        f"\nP={parts} W={W}: one mount {whole} B in {whole_requests} requests; hosts {first} B in "
        f"{first_requests} requests ({first / whole:.3f}x), per host {per_host}; "
        f"row groups decoded {[s['row_groups_decoded'] for s in s0]}"
    )
    # Each host decodes its partitions' row groups only: 32 / W of them, none split.
    assert [s["row_groups_decoded"] for s in s0] == [32 // W] * W, s0
    assert first <= 1.2 * whole, f"{W} hosts fetched {first} bytes for epoch 0, one mount {whole} ({first / whole:.2f}x)"

    # (b) The next epoch: every host's cache holds its share, so no object bytes move.
    proxy.reset_stats()
    for r, h in enumerate(hosts):
        got[r].update(read_view(h, f"epoch-1/rank-{r}-of-{W}"))
    second = proxy.stats()
    s1 = [tfs.stats(h) for h in hosts]
    print(f"epoch 1: {second['bytes_forwarded']} B, {second['requests']} requests, {second['object_gets']} object GETs")
    assert second["object_gets"] == 0 and second["bytes_forwarded"] <= 0.01 * first, (
        f"epoch 1 fetched {second['bytes_forwarded']} bytes in {second['object_gets']} object GETs (epoch 0: {first})"
    )
    assert [b["remote_bytes"] - a["remote_bytes"] for a, b in zip(s0, s1)] == [0] * W
    assert [b["row_groups_decoded"] for b in s1] == [32 // W] * W, s1

    # (c) The same bytes as the local source with the same content options.
    local = mounter(hosts_ds.path, *content, f"world_size={W}")
    for r in range(W):
        want = {}
        for e in (0, 1):
            want.update(read_view(local, f"epoch-{e}/rank-{r}-of-{W}"))
        assert sorted(got[r]) == sorted(want)
        bad = [rel for rel in want if got[r][rel] != want[rel]]
        assert not bad, f"host {r}: {len(bad)} of {len(want)} files differ from the local mount, e.g. {bad[:4]}"


def test_the_global_order_is_the_same_for_1_2_4_8_hosts(mounter, shuf_ds):
    """partitions=8, world_size 1, 2, 4, 8: rank R of W batch j is global batch R + jW, and the
    one rank of W = 1 holds the first n x P global batches (the single-partition ones)."""
    P = 8
    opts = ("shuffle=window", f"batch_size={BS}", f"partitions={P}", "seed=4")
    plain = mounter(shuf_ds.path, *opts)
    dj = plain.dataset()
    # 8 partitions of at least 320 rows: 5 full batches each, 40 rows left over.
    assert sum(dj["partition_rows"]) == ROWS and dj["batches_per_partition"] == 5
    single = dj["single_partition_batches"]
    assert single == 40 and dj["batches_per_epoch"] == 41
    glob = {i: tfs.sha256(plain.p("epoch-0", batch_name(i) + ".safetensors")) for i in range(41)}
    assert len(set(glob.values())) == 41
    for w in (1, 2, 4, 8):
        m = mounter(shuf_ds.path, *opts, f"world_size={w}")
        assert m.dataset()["rank_batches_per_epoch"] == single // w
        for r in range(w):
            rd = f"epoch-0/rank-{r}-of-{w}"
            assert batch_files(m, rd) == [batch_name(j) + ".safetensors" for j in range(single // w)]
            got = [tfs.sha256(m.p(rd, batch_name(j) + ".safetensors")) for j in range(single // w)]
            assert got == [glob[r + j * w] for j in range(single // w)], f"W={w} rank {r} is not global batches {r}, {r}+{w}, ..."
        if w == 1:
            all_rows = tfs.read_exact(m.p("epoch-0/rank-0-of-1", "all.safetensors"))
            whole = tfs.read_exact(plain.p("epoch-0", "all.safetensors"))
            assert all_rows != whole, "rank-0-of-1 should leave the leftover batch out"
            want = np.concatenate([ids(plain, "epoch-0", i) for i in range(single)])
            assert np.array_equal(tfs.load_safetensors(m.p("epoch-0/rank-0-of-1", "all.safetensors"))["id"], want)


def test_a_grown_job_fetches_only_the_partitions_it_lacks(mounter, s3, proxy, hosts_ds, hosts_prefix, tmp_path):
    """Elastic growth, partitions=4: a host that was rank 0 of 4 (its cache holds partition 0)
    becomes rank 0 of 2 (partitions 0 and 2) on the same cache_dir. It fetches and decodes only
    partition 2's row groups, and gathers partition 0's batches from the columns it cached,
    where a fresh host reading rank 0 of 2 fetches both."""
    content = ("shuffle=window", "seed=8", f"batch_size={HOSTS_BS}", "partitions=4")
    via = s3.opts(proxy.url)
    cache = tmp_path / "host-cache"

    was = mounter(hosts_prefix, *content, "world_size=4", *via, cache=cache)
    assert was.dataset()["rank_batches_per_epoch"] == 31
    before = read_view(was, "epoch-0/rank-0-of-4")
    s_was = tfs.stats(was)
    assert s_was["row_groups_decoded"] == 8, s_was
    was.unmount()

    proxy.reset_stats()
    grown = mounter(hosts_prefix, *content, "world_size=2", *via, cache=cache)
    view = read_view(grown, "epoch-0/rank-0-of-2")
    s_grown, p_grown = tfs.stats(grown), proxy.stats()

    proxy.reset_stats()
    fresh = mounter(hosts_prefix, *content, "world_size=2", *via)
    assert read_view(fresh, "epoch-0/rank-0-of-2") == view
    s_fresh, p_fresh = tfs.stats(fresh), proxy.stats()

    # Partition 2's row groups: with 2 objects for 4 partitions, row groups have homes, each
    # object's spread over the partitions in turn; all are alike in size.
    part2 = chunk_bytes(hosts_ds, range(16, 24))
    print(
        f"\ngrown: {p_grown['bytes_forwarded']} B, {p_grown['object_gets']} object GETs, "
        f"{s_grown['row_groups_decoded']} row groups, hits {s_grown['batch_file_hits']}, written {s_grown['batch_files_written']}; "
        f"fresh: {p_fresh['bytes_forwarded']} B, {p_fresh['object_gets']} object GETs, {s_fresh['row_groups_decoded']} row groups; "
        f"partition 2's chunks {part2} B"
    )
    assert s_fresh["row_groups_decoded"] == 16, s_fresh
    assert s_grown["row_groups_decoded"] == 8, f"the grown host decoded again what it had: {s_grown}"
    # Everything it fetched is partition 2's column chunks (and a listing): footers were kept.
    assert part2 <= p_grown["bytes_forwarded"] <= part2 + 64 * 1024, (p_grown, part2)
    assert p_grown["bytes_forwarded"] <= 0.55 * p_fresh["bytes_forwarded"], (p_grown, p_fresh)
    # Rank 0 of 2's even batches are rank 0 of 4's (global batches 0, 4, 8, ...), byte for byte.
    for j in range(31):
        a = f"epoch-0/rank-0-of-4/{batch_name(j)}.safetensors"
        b = f"epoch-0/rank-0-of-2/{batch_name(2 * j)}.safetensors"
        assert view[b] == before[a], f"rank 0 of 2 batch {2 * j} != rank 0 of 4 batch {j}"
    # A shuffled epoch's batch files are read once: gathered, never written.
    assert s_grown["batches_built"] == 62 and s_grown["batch_files_written"] == 0, s_grown
    assert s_fresh["batches_built"] == 62, s_fresh
    assert s_grown["column_hits"] >= 4, s_grown


def test_global_shuffle_needs_only_a_ranks_share_in_the_cache(mounter, hosts_ds):
    """shuffle=global with partitions=4, world_size=4: a cache_size that holds one rank's share
    of the decoded data (a quarter of its 8.6 MB) but not the whole mounts and serves that
    rank's view; the whole dataset is refused at that size; less than the share is refused
    with a line that speaks of the share."""
    content = ("shuffle=global", "seed=6", f"batch_size={HOSTS_BS}", "partitions=4", "prefetch=0")
    decoded = HOSTS_ROWS * (8 + 4 + 4 * EMB)
    fits, short = "4M", "1536K"  # a share is decoded / 4 = 2.1 MB
    assert decoded / 4 < 4 * 2**20 < decoded and 1536 * 1024 < decoded / 4

    def refused(*opts) -> str:
        return tfs.refused_mount(mounter, hosts_ds.path, *content, *opts)

    line = refused("world_size=4", f"cache_size={short}")
    assert "shuffle=global" in line and "one rank's share" in line and "partitions=" in line, line
    assert "cache_size is 1.5M" in line, line
    line = refused(f"cache_size={fits}")
    assert "the whole decoded dataset" in line and "cache_size is 4.0M" in line, line
    line = refused("world_size=2", f"cache_size={fits}")  # half the dataset is more than 4M
    assert "one rank's share" in line, line

    m = mounter(hosts_ds.path, *content, "world_size=4", f"cache_size={fits}")
    ref = mounter(hosts_ds.path, *content, "world_size=4", "cache_size=1G")
    for r in (1, 3):
        rd = f"epoch-0/rank-{r}-of-4"
        got = read_view(m, rd)
        assert got == read_view(ref, rd), f"rank {r} of 4 differs with cache_size={fits}"
        s = tfs.stats(m)
        assert s["cache_bytes"] <= 4 * 2**20, s
    got = tfs.load_safetensors(m.p("epoch-0/rank-1-of-4", "all.safetensors"))["id"]
    # Partition 1: 8 of the 32 row groups of 1000 rows, drawn from both files.
    assert len(np.unique(got // HOSTS_RG)) == 8 and len(np.unique(got)) == len(got) == 31 * HOSTS_BS


def test_warm_builds_what_the_python_package_reads_and_asks_before_every_host_s_share(mounter, shuf_ds):
    m = mounter(shuf_ds.path, f"batch_size={BS}", "partitions=4", "world_size=2", "prefetch=0")
    bad = tfs.run(["warm", m.path, "--epochs", "0"])
    line = tfs.error_line(bad)
    assert "4 partitions" in line and "--rank R-of-2" in line and "--all-ranks" in line, line
    assert tfs.stats(m)["row_groups_decoded"] == 0
    proc = tfs.run(["warm", m.path, "--epochs", "0", "--rank", "0-of-2"])
    assert proc.returncode == 0, proc.stderr
    s = tfs.stats(m)
    # By default the rank's all/NAME.npy, which tensorfs.torch and tensorfs.numpy read, built
    # whole on the cache; no batch file.
    assert s["ahead_files_built"] == len(m.dataset()["tensors"]) and s["batch_files_written"] == 0, s
    whole = mounter(shuf_ds.path, f"batch_size={BS}", "partitions=4", "prefetch=0")
    proc = tfs.run(["warm", whole.path, "--epochs", "0", "--all-ranks"])
    assert proc.returncode == 0, proc.stderr
