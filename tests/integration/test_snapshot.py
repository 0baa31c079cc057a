"""One dataset for every host (PRODUCT.md §8): `tensorfs snapshot`, `-o snapshot=`,
`-o fingerprint=`, and Parquet summary files (`_metadata`).

A snapshot mount serves the bytes a listing mount of the source served when it was pinned,
whatever was added, removed or replaced since; the reads that need a changed object fail with
EIO and a log line saying so. Against S3 (moto behind the counting proxy), hosts mounting a
snapshot list nothing and each reads about its share of the objects.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import tfs
from conftest import BUCKET, s3_opts

ROWS = 300  # rows of each part
RG = 100  # rows of each row group


def write_parts(path: Path, n: int, first: int = 0, start_id: int = 0) -> None:
    """Parts first.. first+n-1 of ROWS rows each: `id` (canonical row) and `x = id / 2`."""
    path.mkdir(parents=True, exist_ok=True)
    for k in range(first, first + n):
        ids = np.arange(start_id + k * ROWS, start_id + (k + 1) * ROWS, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids / 2).astype(np.float32)})
        pq.write_table(table, path / f"part-{k:03d}.parquet", row_group_size=RG)


def snapshot(source, dest, *options, timeout=120):
    args = ["snapshot", source, dest]
    if options:
        args += ["-o", ",".join(options)]
    return tfs.run(args, timeout=timeout)


def hashes(m: tfs.Mount, dirs=("epoch-0",)) -> dict[str, str]:
    n = m.dataset()["batches_per_epoch"]
    return tfs.batch_hashes(m, dirs, n)


def log_text(m: tfs.Mount) -> str:
    p = m.cache / "tensorfs.log"
    return p.read_text(errors="replace") if p.exists() else ""


def test_a_snapshot_mount_serves_what_the_listing_served(mounter, tmp_path):
    data = tmp_path / "data"
    write_parts(data, 3)
    opts = ("batch_size=128", "partitions=4", "world_size=4", "epochs=2", "seed=5")
    listed = mounter(data, *opts)
    want = listed.dataset()
    dirs = ["epoch-0", "epoch-1", "epoch-1/rank-2-of-4"]
    n = want["batches_per_epoch"]
    want_hashes = {rel: tfs.sha256(listed.p(rel)) for d in dirs[:2] for rel in tfs.all_files(listed, d, n)}
    rank = want["rank_batches_per_epoch"]
    want_rank = {rel: tfs.sha256(listed.p(rel)) for rel in tfs.all_files(listed, dirs[2], rank)}

    pin = tmp_path / "pins" / "train.snapshot"
    pin.parent.mkdir()
    proc = snapshot(data, pin, *opts)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == want["fingerprint"], proc.stdout
    assert re.fullmatch(r"[0-9a-f]{64}", proc.stdout.strip())
    assert not list(pin.parent.glob(".*")), "a temp file was left beside the snapshot"

    m = mounter(data, *opts, f"snapshot={pin}")
    got = m.dataset()
    assert got["fingerprint"] == want["fingerprint"]
    for k in ("rows", "batches_per_epoch", "partition_rows", "tensors", "files"):
        assert got[k] == want[k], k
    assert got["origin"]["from"] == "snapshot"
    assert got["origin"]["snapshot"] == str(pin)
    assert want["origin"]["from"] == "listing"
    got_hashes = {rel: tfs.sha256(m.p(rel)) for d in dirs[:2] for rel in tfs.all_files(m, d, n)}
    assert got_hashes == want_hashes
    assert {rel: tfs.sha256(m.p(rel)) for rel in tfs.all_files(m, dirs[2], rank)} == want_rank
    assert m.dataset()["origin"]["objects_touched"] == 3
    assert tfs.stats(m)["objects_touched"] == 3


def test_a_snapshot_mount_is_unmoved_by_objects_added_removed_or_replaced(mounter, tmp_path):
    data = tmp_path / "data"
    write_parts(data, 3)
    opts = ("batch_size=100", "shuffle=none", "prefetch=0")
    listed = mounter(data, *opts)
    want = listed.dataset()
    n = want["batches_per_epoch"]
    assert n == 9
    want_files = {i: tfs.read_exact(listed.p("epoch-0", f"{tfs.batch_name(i)}.safetensors")) for i in range(n)}
    listed.unmount()
    pin = tmp_path / "train.snapshot"
    assert snapshot(data, pin, *opts).returncode == 0

    write_parts(data, 1, first=3)  # added
    write_parts(data, 1, first=1, start_id=10_000)  # replaced: other rows
    (data / "part-002.parquet").unlink()  # removed
    relisted = mounter(data, *opts)
    assert relisted.dataset()["fingerprint"] != want["fingerprint"]

    m = mounter(data, *opts, f"snapshot={pin}")
    got = m.dataset()
    assert got["fingerprint"] == want["fingerprint"]
    assert got["rows"] == 900 and got["files"] == want["files"]
    for i in range(n):
        path = m.p("epoch-0", f"{tfs.batch_name(i)}.safetensors")
        if i < 3:
            assert tfs.read_exact(path) == want_files[i], f"batch {i}"
            continue
        with pytest.raises(OSError) as e:
            tfs.read_exact(path)
        assert e.value.errno == errno.EIO, f"batch {i}: {e.value}"
    log = log_text(m)
    for name in ("part-001.parquet", "part-002.parquet"):
        lines = [line for line in log.splitlines() if name in line and "changed since the snapshot" in line]
        assert lines, f"no log line names {name} as changed since the snapshot:\n{log[-3000:]}"
    assert "part-003" not in log
    # The mount goes on: what is unchanged is still served.
    assert tfs.read_exact(m.p("epoch-0", "000000.safetensors")) == want_files[0]


def test_fingerprint_refuses_another_dataset_naming_what_changed(mounter, tmp_path):
    data = tmp_path / "data"
    write_parts(data, 3)
    first = mounter(data, "batch_size=100")
    fp = first.dataset()["fingerprint"]
    first.unmount()
    same = mounter(data, "batch_size=100", f"fingerprint={fp}", cache=first.cache)
    assert same.dataset()["fingerprint"] == fp
    same.unmount()

    write_parts(data, 1, first=3)
    write_parts(data, 1, first=0, start_id=50_000)
    mnt = mounter.mountpoint()
    proc = tfs.run(["mount", data, mnt, "-o", f"batch_size=100,fingerprint={fp},cache_dir={first.cache}"])
    line = tfs.error_line(proc)
    assert not tfs.is_mounted(mnt)
    now = re.search(r"is dataset ([0-9a-f]{64}), not ([0-9a-f]{64})", line)
    assert now and now.group(2) == fp and now.group(1) != fp, line
    assert "fingerprint=" in line, line
    assert "1 added ('part-003.parquet')" in line, line
    assert "1 changed ('part-000.parquet')" in line, line
    assert "removed" not in line, line

    # The snapshot command refuses it with the same line.
    proc = snapshot(data, tmp_path / "x.snapshot", "batch_size=100", f"fingerprint={fp}", f"cache_dir={first.cache}")
    assert tfs.error_line(proc) == line
    assert not (tmp_path / "x.snapshot").exists()

    # Where this host never saw the dataset, it says so rather than guess.
    line = tfs.refused_mount(mounter, data, f"fingerprint={fp}")
    assert fp in line and "no record" in line, line
    line = tfs.refused_mount(mounter, data, "fingerprint=abc")
    assert "fingerprint=abc" in line and "64 hex digits" in line, line


def test_damaged_snapshots_are_refused_in_one_line(mounter, tmp_path):
    data = tmp_path / "data"
    write_parts(data, 2)
    pin = tmp_path / "good.snapshot"
    assert snapshot(data, pin).returncode == 0
    good = pin.read_bytes()
    cases = {
        "truncated": (good[: len(good) // 2], "is truncated"),
        "damaged": (good[:-20] + bytes(b ^ 0x5A for b in good[-20:]), "is damaged"),
        "foreign": ((data / "part-000.parquet").read_bytes(), "is not a tensorfs snapshot"),
        "empty": (b"", "is not a tensorfs snapshot"),
    }
    for name, (content, said) in cases.items():
        bad = tmp_path / f"{name}.snapshot"
        bad.write_bytes(content)
        line = tfs.refused_mount(mounter, data, f"snapshot={bad}")
        assert f"snapshot '{bad}' {said}" in line, line
    line = tfs.refused_mount(mounter, data, f"snapshot={tmp_path / 'missing.snapshot'}")
    assert "cannot be read" in line and "no such file" in line, line
    # A snapshot of another source is not mounted on this one.
    other = tmp_path / "other"
    write_parts(other, 2)
    line = tfs.refused_mount(mounter, other, f"snapshot={pin}")
    assert "pins the dataset at" in line, line


def test_the_snapshot_command_refuses_what_mount_refuses(mounter, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": np.arange(10), "name": [f"n{i}" for i in range(10)]}), data / "a.parquet")
    mount_line = tfs.refused_mount(mounter, data)
    pin = tmp_path / "x.snapshot"
    proc = snapshot(data, pin)
    assert tfs.error_line(proc) == mount_line
    assert not pin.exists()
    assert snapshot(data, pin, "columns=id").returncode == 0


def test_a_snapshot_keeps_the_nulls_it_had_to_read(mounter, tmp_path):
    """A list column's statistics count empty lists with nulls: the snapshot reads the column
    once and records it, so a mount of it reads no footer to decide."""
    data = tmp_path / "data"
    data.mkdir()
    tokens = [[1, 2], [], [3], None] * 50
    pq.write_table(pa.table({"id": np.arange(200), "tokens": tokens}), data / "a.parquet", row_group_size=50)
    opts = ("batch_size=64", "pad=tokens:4", "shuffle=none")
    pin = tmp_path / "t.snapshot"
    assert snapshot(data, pin, *opts).returncode == 0, "snapshot"
    listed = mounter(data, *opts)
    m = mounter(data, *opts, f"snapshot={pin}")
    assert m.dataset()["origin"]["objects_touched"] == 0
    assert hashes(m) == hashes(listed)


# --------------------------------------------------------------------------------------------
# Parquet summary files
# --------------------------------------------------------------------------------------------


def write_summarised(path: Path, order: list[str]) -> None:
    """Parts a, b, c (ids by name) with a `_metadata` listing them in ORDER, as pyarrow's
    write_metadata writes it for a dataset."""
    path.mkdir(parents=True, exist_ok=True)
    starts = {"a": 0, "b": 1000, "c": 2000}
    collected = {}
    for name, start in starts.items():
        ids = np.arange(start, start + 250, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids / 2).astype(np.float32)})
        pq.write_table(table, path / f"{name}.parquet", row_group_size=100)
        md = pq.ParquetFile(path / f"{name}.parquet").metadata
        md.set_file_path(f"{name}.parquet")
        collected[name] = md
    pq.write_metadata(table.schema, path / "_metadata", metadata_collector=[collected[n] for n in order])


def test_a_summary_file_is_the_dataset_it_lists(mounter, tmp_path):
    data = tmp_path / "data"
    write_summarised(data, ["c", "a", "b"])
    want = pads.parquet_dataset(str(data / "_metadata")).to_table().column("id").to_numpy()
    m = mounter(data / "_metadata", "batch_size=100", "shuffle=none")
    dj = m.dataset()
    assert dj["origin"]["from"] == "summary file"
    assert [tfs.file_name(f) for f in dj["files"]] == ["c.parquet", "a.parquet", "b.parquet"]
    assert tfs.stats(m)["objects_touched"] == 0, "a data file's footer was read at mount"
    got = np.concatenate(
        [tfs.load_safetensors(m.p("epoch-0", f"{tfs.batch_name(i)}.safetensors"))["id"] for i in range(dj["batches_per_epoch"])]
    )
    np.testing.assert_array_equal(got, want)
    # A snapshot of it pins it, summary file and all.
    pin = tmp_path / "s.snapshot"
    proc = snapshot(data / "_metadata", pin, "batch_size=100", "shuffle=none")
    assert proc.returncode == 0 and proc.stdout.strip() == dj["fingerprint"], proc.stderr
    p = mounter(data / "_metadata", "batch_size=100", "shuffle=none", f"snapshot={pin}")
    assert hashes(p) == hashes(m)


def test_a_summary_file_that_disagrees_with_its_files_never_serves_wrong_bytes(mounter, tmp_path):
    data = tmp_path / "data"
    write_summarised(data, ["a", "b", "c"])
    ids = np.arange(5000, 5150, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": (ids / 2).astype(np.float32)}), data / "b.parquet", row_group_size=100)
    m = mounter(data / "_metadata", "batch_size=50", "shuffle=none", "prefetch=0")
    n = m.dataset()["batches_per_epoch"]
    assert n == 15
    for i in range(n):
        path = m.p("epoch-0", f"{tfs.batch_name(i)}.safetensors")
        if 5 <= i < 10:  # b's rows
            with pytest.raises(OSError) as e:
                tfs.read_exact(path)
            assert e.value.errno == errno.EIO
        else:
            first = tfs.load_safetensors(path)["id"][0]
            assert first == (0 if i < 5 else 2000) + (i % 5) * 50
    assert "b.parquet" in log_text(m) and "since the summary file listed it" in log_text(m)
    (data / "c.parquet").unlink()
    line = tfs.refused_mount(mounter, data / "_metadata")
    assert "lists 'c.parquet', which does not exist" in line, line


# --------------------------------------------------------------------------------------------
# Many hosts against S3: the counting proxy in front of moto
# --------------------------------------------------------------------------------------------

OBJECTS = 64


@pytest.fixture(scope="module")
def s3_parts(s3, tmp_path_factory):
    d = tmp_path_factory.mktemp("parts")
    for k in range(OBJECTS):
        ids = np.arange(k * 200, (k + 1) * 200, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": (ids / 2).astype(np.float32)}), d / f"part-{k:03d}.parquet", row_group_size=100)
    s3.upload_dir(d, "snapshot-hosts")
    return d


@pytest.mark.usefixtures("hermetic_env")
@pytest.mark.parametrize("world", [4, 8])
def test_hosts_mounting_a_snapshot_list_nothing_and_each_reads_its_share(mounter, s3, proxy, s3_parts, world):
    src = f"s3://{BUCKET}/snapshot-hosts/"
    pin_key = f"/{BUCKET}/pins/hosts-{world}.snapshot"
    pin = f"s3:/{pin_key}"
    opts = ("batch_size=100", f"partitions={world}", f"world_size={world}", *s3_opts(proxy.url))
    proc = snapshot(src, pin, *opts)
    assert proc.returncode == 0, proc.stderr
    # One full mount reading its whole epoch directory: what all hosts together may fetch.
    proxy.reset_stats()
    full = mounter(src, *opts)
    n = full.dataset()["batches_per_epoch"]
    want = {i: tfs.sha256(full.p("epoch-0", f"{tfs.batch_name(i)}.safetensors")) for i in range(n)}
    one_mount = sum(v for k, v in proxy.stats()["key_bytes"].items() if k.endswith(".parquet"))
    full.unmount()

    total = 0
    for rank in range(world):
        proxy.reset_stats()
        m = mounter(src, *opts, f"snapshot={pin}")
        at_mount = proxy.stats()
        assert at_mount["listings"] == 0, at_mount
        assert set(at_mount["keys"]) == {pin_key}, at_mount["keys"]
        rb = m.dataset()["rank_batches_per_epoch"]
        assert rb * world == n
        for i in range(rb):
            got = tfs.sha256(m.p(f"epoch-0/rank-{rank}-of-{world}", f"{tfs.batch_name(i)}.safetensors"))
            assert got == want[i * world + rank], f"rank {rank} batch {i}"
        st = proxy.stats()
        data_keys = {k for k in st["keys"] if k.endswith(".parquet")}
        assert st["listings"] == 0, st
        share = OBJECTS // world
        assert share <= len(data_keys) <= share + 2, f"rank {rank} of {world} touched {sorted(data_keys)}"
        print(f"\n[hosts] W={world} rank {rank}: {len(data_keys)} of {OBJECTS} objects, {st['requests']} requests")
        assert m.dataset()["origin"]["objects_touched"] == len(data_keys)
        total += sum(v for k, v in st["key_bytes"].items() if k.endswith(".parquet"))
        m.unmount()
    print(f"\n[hosts] W={world}: {world} hosts fetched {total} bytes of objects, one full mount {one_mount} ({total / one_mount:.2f}x)")
    assert total <= 1.2 * one_mount, f"{world} hosts fetched {total} bytes of objects, one full mount {one_mount}"


@pytest.mark.usefixtures("hermetic_env")
def test_a_long_listing_mount_says_how_far_it_is(mounter, s3, proxy, s3_parts):
    """Footers read over a slow store: the daemon's log says, every few seconds, how many."""
    proxy.set(latency=1.5)
    try:
        m = mounter(f"s3://{BUCKET}/snapshot-hosts/", *s3_opts(proxy.url))
    finally:
        proxy.set(latency=0)
    said = [line for line in log_text(m).splitlines() if re.search(rf"read \d+ of {OBJECTS} footers", line)]
    assert said, log_text(m)[-2000:]


@pytest.mark.usefixtures("hermetic_env")
def test_a_snapshot_from_an_earlier_one_reads_only_the_new_footers(mounter, s3, proxy, tmp_path):
    """A table that grows every day (PRODUCT.md §8): `tensorfs snapshot --from OLD` lists the
    source and reads the footers of the objects OLD does not hold (or holds in another version),
    and pins what a snapshot reading every footer pins."""
    d = tmp_path / "daily"
    write_parts(d, 12)
    s3.upload_dir(d, "daily")
    src = f"s3://{BUCKET}/daily/"
    opts = ("batch_size=100", "partitions=4", *s3_opts(proxy.url))
    day1 = f"s3://{BUCKET}/pins/daily-1.snapshot"
    assert snapshot(src, day1, *opts).returncode == 0

    d2 = tmp_path / "added"
    write_parts(d2, 2, first=12)  # keys after the old ones
    write_parts(d2, 1, first=5, start_id=50_000)  # part-005 replaced: another version
    s3.upload_dir(d2, "daily")
    proxy.reset_stats()
    day2 = f"s3://{BUCKET}/pins/daily-2.snapshot"
    proc = tfs.run(["snapshot", src, day2, "-o", ",".join(opts), "--from", day1])
    assert proc.returncode == 0, proc.stderr
    read = sorted(k.rsplit("/", 1)[-1] for k in proxy.stats()["keys"] if k.endswith(".parquet"))
    assert read == ["part-005.parquet", "part-012.parquet", "part-013.parquet"], read

    fresh = snapshot(src, f"s3://{BUCKET}/pins/daily-fresh.snapshot", *opts)
    assert proc.stdout.strip() == fresh.stdout.strip(), "--from pinned another dataset"
    a = mounter(src, *opts, f"snapshot={day2}")
    b = mounter(src, *opts, f"snapshot=s3://{BUCKET}/pins/daily-fresh.snapshot")
    assert a.dataset()["fingerprint"] == b.dataset()["fingerprint"]
    assert hashes(a) == hashes(b)

    # An earlier snapshot of another source is refused, in one line.
    elsewhere = f"s3://{BUCKET}/elsewhere/"
    other = tfs.run(["snapshot", elsewhere, tmp_path / "x.snapshot", "--from", day1, "-o", ",".join(opts)])
    line = tfs.error_line(other)
    assert other.returncode != 0 and "pins the dataset at" in line and "not source" in line, line
