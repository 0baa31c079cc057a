"""Mixtures (PRODUCT.md §11): a SOURCE ending in `.toml` lists `[[source]]` tables, each a
SOURCE of its own (`url`, optionally `where`, `version`, `snapshot`) sized by one of
`proportion`, `repeat` or `choose` (none: `repeat = 1`); `epoch_rows=N` sets the rows of an epoch.

Covered here:
- the draws: a source drawn `n = k × rows + f` times an epoch gives every row k times and f
  distinct rows once more, the f rows drawn anew each epoch, under every shuffle mode;
- batches mix the sources in their shares;
- dataset.json's `rows`, `epoch_rows`, batches and `mixture` list;
- a `where` in the toml and `-o where=` both hold;
- relative urls resolve against the toml's directory; a source pinned by a snapshot;
- determinism (two mounts, other caches: the same bytes) and rank views (§5);
- refusals in one line: sources serving other tensors, `proportion` on some sources only,
  and what is not implemented with a mixture (partitions=, transform=, `tensorfs snapshot`).

Every row's `id` is unique across the sources (A: 0..999, B: 10000..10299, C: 20000..20201),
so the ids a batch holds say which source, and which row of it, each row came from; `x` is a
function of `id`, so a row's tensors are checked to come from the same row.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs
from tfs import batch_name

A_IDS = np.arange(0, 1000, dtype=np.int64)  # two files of 500 rows, row groups of 100
B_IDS = np.arange(10_000, 10_300, dtype=np.int64)  # one file, row groups of 100
C_IDS = np.arange(20_000, 20_202, dtype=np.int64)  # one file, row groups of 50
SHUFFLES = ["none", "window", "block", "global"]


def x_of(ids: np.ndarray) -> np.ndarray:
    """The `x` every row holds: 0.0, 0.1, ... 0.9 by the last digit of its id."""
    return ((ids % 10) / 10).astype(np.float32)


def write_source(path: Path, ids: np.ndarray, files: int = 1, rg: int = 100, x_dtype=np.float32, with_x=True) -> Path:
    """IDS as a Parquet prefix of FILES files (row groups of RG rows): `id` int64 and `x`."""
    path.mkdir(parents=True)
    for k, part in enumerate(np.array_split(ids, files)):
        cols = {"id": pa.array(part, pa.int64())}
        if with_x:
            cols["x"] = pa.array(x_of(part).astype(x_dtype))
        pq.write_table(pa.table(cols), path / f"part-{k}.parquet", row_group_size=rg)
    return path


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a TOML basic string


def write_mix(path: Path, *sources: dict) -> Path:
    """A mixture file at PATH: one [[source]] table per dict of SOURCES."""
    lines = []
    for s in sources:
        lines.append("[[source]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in s.items()]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def srcs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("mix")
    return {
        "A": write_source(base / "a", A_IDS, files=2),
        "B": write_source(base / "b", B_IDS),
        "C": write_source(base / "c", C_IDS, rg=50),
        # B's rows with `x` as float64, and without `x`: other tensors than A's.
        "B64": write_source(base / "b64", B_IDS, x_dtype=np.float64),
        "Bnox": write_source(base / "bnox", B_IDS, with_x=False),
    }


def batches_of(info: dict) -> int:
    """The batches of an epoch dataset.json gives (`batches`, `batches_per_epoch`: equal where
    both are given)."""
    got = {k: info[k] for k in ("batches", "batches_per_epoch") if k in info}
    assert got, f"dataset.json gives no batch count: {sorted(info)}"
    assert len(set(got.values())) == 1, got
    return next(iter(got.values()))


def read_batches(m: tfs.Mount, epoch: int, n: int) -> list[np.ndarray]:
    """The ids of the N batches of EPOCH, each batch's x checked against its ids."""
    out = []
    for i in range(n):
        d = m.p(f"epoch-{epoch}", batch_name(i))
        ids, x = np.load(d / "id.npy"), np.load(d / "x.npy")
        assert ids.dtype == np.int64 and x.dtype == np.float32, (ids.dtype, x.dtype)
        assert len(ids) == len(x), f"epoch {epoch} batch {i}: {len(ids)} ids, {len(x)} x"
        tfs.assert_array(x, x_of(ids), f"epoch {epoch} batch {i} x")
        out.append(ids)
    return out


def epoch_ids(m: tfs.Mount, epoch: int) -> np.ndarray:
    return np.concatenate(read_batches(m, epoch, batches_of(m.dataset())))


def of(ids: np.ndarray, src: np.ndarray) -> np.ndarray:
    """The ids among IDS that are rows of the source SRC."""
    return ids[np.isin(ids, src)]


def assert_drawn(ids: np.ndarray, src: np.ndarray, n: int, what: str) -> np.ndarray:
    """IDS drew N rows of SRC: n = k × rows + f gives every row k times and f distinct rows
    once more. Returns the f rows drawn k + 1 times."""
    k, f = divmod(n, len(src))
    assert len(ids) == n, f"{what}: {len(ids)} rows drawn, expected {n}"
    uniq, c = np.unique(ids, return_counts=True)
    assert np.isin(uniq, src).all(), f"{what}: ids not of the source"
    counts = np.zeros(len(src), dtype=np.int64)  # SRC ascends
    counts[np.searchsorted(src, uniq)] = c
    assert ((counts == k) | (counts == k + 1)).all(), (
        f"{what}: rows drawn {sorted(set(counts.tolist()))} times, expected {k} or {k + 1}"
    )
    assert np.count_nonzero(counts == k + 1) == f, (
        f"{what}: {np.count_nonzero(counts == k + 1)} rows drawn {k + 1} times, expected {f}"
    )
    return src[counts == k + 1]


def refused_names(line: str, *words: str) -> None:
    for w in words:
        assert re.search(rf"(?<![\w]){re.escape(w)}(?![\w])", line), f"{w!r} not named in: {line}"


# --------------------------------------------------------------------------------------------
# Draws and shares
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_proportions_draw_each_source_s_share_of_the_epoch_in_every_batch(mounter, srcs, tmp_path, shuffle):
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "proportion": 3.0},
        {"url": str(srcs["B"]), "proportion": 1.0},
    )
    m = mounter(mix, "batch_size=100", "epoch_rows=800", "epochs=3", f"shuffle={shuffle}")
    info = m.dataset()
    assert info["rows"] == 1300, info["rows"]
    assert info["epoch_rows"] == 800
    assert batches_of(info) == 8
    assert [{k: s.get(k) for k in ("url", "rows", "drawn", "size")} for s in info["mixture"]] == [
        {"url": str(srcs["A"]), "rows": 1000, "drawn": 600, "size": "proportion 3"},
        {"url": str(srcs["B"]), "rows": 300, "drawn": 200, "size": "proportion 1"},
    ], info["mixture"]

    a_sets, b_sets = [], []
    for e in range(3):
        batches = read_batches(m, e, 8)
        for i, ids in enumerate(batches):
            assert len(ids) == 100, f"epoch {e} batch {i}: {len(ids)} rows"
            a = len(of(ids, A_IDS))
            assert a + len(of(ids, B_IDS)) == 100, f"epoch {e} batch {i}: ids of neither source"
            assert 70 <= a <= 80, f"epoch {e} batch {i}: {a} rows of A, its share is 75"
        ids = np.concatenate(batches)
        # 600 < 1000 and 200 < 300: each source drawn down, no row twice.
        a_sets.append(set(assert_drawn(of(ids, A_IDS), A_IDS, 600, f"epoch {e} A").tolist()))
        b_sets.append(set(assert_drawn(of(ids, B_IDS), B_IDS, 200, f"epoch {e} B").tolist()))
    assert a_sets[0] != a_sets[1] and a_sets[1] != a_sets[2], "A's drawn rows did not change with the epoch"
    assert b_sets[0] != b_sets[1], "B's drawn rows did not change with the epoch"


def test_repeat_and_choose_draw_what_they_say(mounter, srcs, tmp_path):
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["C"]), "repeat": 2.5},
        {"url": str(srcs["A"]), "choose": 100},
    )
    m = mounter(mix, "batch_size=64", "epochs=2")
    info = m.dataset()
    # 2.5 × 202 = 505 = 2 × 202 + 101: every row of C twice, 101 of them three times.
    assert info["rows"] == 1202
    assert info["epoch_rows"] == 605
    assert batches_of(info) == math.ceil(605 / 64)
    assert [(s["rows"], s["drawn"], s["size"]) for s in info["mixture"]] == [
        (202, 505, "repeat 2.5"),
        (1000, 100, "choose 100"),
    ], info["mixture"]
    thirds = []
    for e in range(2):
        ids = epoch_ids(m, e)
        assert len(ids) == 605
        thirds.append(set(assert_drawn(of(ids, C_IDS), C_IDS, 505, f"epoch {e} C").tolist()))
        assert_drawn(of(ids, A_IDS), A_IDS, 100, f"epoch {e} A")
    assert thirds[0] != thirds[1], "the rows of C drawn a third time did not change with the epoch"

    # epoch_rows= scales the draws to add up to it: 302 × (505, 100) / 605 = (252.08, 49.92),
    # by the largest remainder (252, 50); 252 = 202 + 50.
    scaled = mounter(mix, "batch_size=64", "epoch_rows=302")
    info = scaled.dataset()
    assert info["epoch_rows"] == 302 and batches_of(info) == math.ceil(302 / 64)
    assert [s["drawn"] for s in info["mixture"]] == [252, 50], info["mixture"]
    ids = epoch_ids(scaled, 0)
    assert len(ids) == 302
    assert_drawn(of(ids, C_IDS), C_IDS, 252, "scaled C")
    assert_drawn(of(ids, A_IDS), A_IDS, 50, "scaled A")


def test_shuffle_none_shows_a_drawn_down_source_s_other_rows_each_epoch(mounter, srcs, tmp_path):
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "choose": 300},
        {"url": str(srcs["B"])},  # repeat = 1
    )
    m = mounter(mix, "shuffle=none", "batch_size=100", "epochs=2")
    info = m.dataset()
    assert [s["size"] for s in info["mixture"]] == ["choose 300", "repeat 1"]
    e0, e1 = epoch_ids(m, 0), epoch_ids(m, 1)
    a0 = assert_drawn(of(e0, A_IDS), A_IDS, 300, "epoch 0 A")
    a1 = assert_drawn(of(e1, A_IDS), A_IDS, 300, "epoch 1 A")
    assert len(a0) == len(a1) == 300
    assert set(a0.tolist()) != set(a1.tolist()), "shuffle=none showed the same rows of A in epochs 0 and 1"
    for e, ids in enumerate((e0, e1)):
        assert np.array_equal(np.sort(of(ids, B_IDS)), B_IDS), f"epoch {e}: B is not every row once"

    # Where no source is drawn down, shuffle=none's epochs are the same.
    whole = write_mix(tmp_path / "whole.toml", {"url": str(srcs["A"])}, {"url": str(srcs["B"])})
    w = mounter(whole, "shuffle=none", "batch_size=100", "epochs=2")
    assert np.array_equal(epoch_ids(w, 0), epoch_ids(w, 1))


# --------------------------------------------------------------------------------------------
# Sources: where, relative urls, snapshots
# --------------------------------------------------------------------------------------------


def test_a_where_in_the_toml_and_the_mount_s_where_both_hold(mounter, srcs, tmp_path):
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "where": "id < 500"},
        {"url": str(srcs["B"])},
    )
    m = mounter(mix, "where=x < 0.35", "shuffle=none", "batch_size=50")
    want_a = A_IDS[(A_IDS < 500) & (A_IDS % 10 <= 3)]
    want_b = B_IDS[B_IDS % 10 <= 3]
    info = m.dataset()
    assert info["rows"] == info["epoch_rows"] == len(want_a) + len(want_b) == 320
    assert [(s["rows"], s["drawn"], s["size"]) for s in info["mixture"]] == [
        (200, 200, "repeat 1"),
        (120, 120, "repeat 1"),
    ], info["mixture"]
    ids = epoch_ids(m, 0)
    assert len(ids) == 320
    assert np.isin(ids, np.concatenate([want_a, want_b])).all(), sorted(set(ids.tolist()) - set(want_a) - set(want_b))[:10]
    assert np.array_equal(np.sort(of(ids, A_IDS)), want_a)
    assert np.array_equal(np.sort(of(ids, B_IDS)), want_b)


def test_a_relative_url_is_relative_to_the_toml_s_directory(mounter, tmp_path):
    home = tmp_path / "mixes" / "here"
    write_source(home / "a", A_IDS, files=2)
    write_source(tmp_path / "mixes" / "b", B_IDS)
    mix = write_mix(home / "mix.toml", {"url": "a", "proportion": 1.0}, {"url": "../b", "proportion": 1.0})
    m = mounter(mix, "batch_size=100", "shuffle=global")
    info = m.dataset()
    assert [(s["url"], s["rows"], s["drawn"]) for s in info["mixture"]] == [("a", 1000, 650), ("../b", 300, 650)]
    ids = epoch_ids(m, 0)
    assert_drawn(of(ids, A_IDS), A_IDS, 650, "A")
    assert_drawn(of(ids, B_IDS), B_IDS, 650, "B")  # 650 = 2 × 300 + 50


def test_a_source_pinned_by_a_snapshot_keeps_its_rows(mounter, srcs, tmp_path):
    a = write_source(tmp_path / "a", A_IDS, files=2)
    pin = tmp_path / "a.snapshot"
    proc = tfs.run(["snapshot", a, pin, "-o", "batch_size=100"])
    assert proc.returncode == 0, proc.stderr
    more = np.arange(5000, 5100, dtype=np.int64)
    pq.write_table(pa.table({"id": more, "x": x_of(more)}), a / "part-9.parquet", row_group_size=100)
    mix = write_mix(tmp_path / "mix.toml", {"url": str(a), "snapshot": str(pin)}, {"url": str(srcs["B"])})
    m = mounter(mix, "batch_size=100")
    assert [s["rows"] for s in m.dataset()["mixture"]] == [1000, 300]
    ids = epoch_ids(m, 0)
    assert np.array_equal(np.sort(ids), np.concatenate([A_IDS, B_IDS]))
    # Unpinned, the same prefix lists the new file's rows.
    loose = write_mix(tmp_path / "loose.toml", {"url": str(a)}, {"url": str(srcs["B"])})
    assert [s["rows"] for s in mounter(loose, "batch_size=100").dataset()["mixture"]] == [1100, 300]


# --------------------------------------------------------------------------------------------
# Determinism and rank views
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_a_mixture_s_batches_are_deterministic_and_rank_views_split_them(mounter, srcs, tmp_path, shuffle):
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "proportion": 3.0},
        {"url": str(srcs["B"]), "proportion": 1.0},
    )
    opts = ["batch_size=64", "epoch_rows=700", "seed=11", "epochs=2", f"shuffle={shuffle}"]
    a = mounter(mix, *opts, "world_size=2")
    b = mounter(mix, *opts, "world_size=2")
    plain = mounter(mix, *opts)
    assert a.cache != b.cache
    n = batches_of(a.dataset())
    assert n == math.ceil(700 / 64) == 11
    want = tfs.batch_hashes(a, ["epoch-1"], n)
    for other in (b, plain):
        got = tfs.batch_hashes(other, ["epoch-1"], n)
        assert sorted(got) == sorted(want)
        bad = [rel for rel in want if got[rel] != want[rel]]
        assert not bad, f"{len(bad)} of {len(want)} batch files differ between mounts, e.g. {bad[:5]}"
    assert len(np.load(a.p("epoch-1", batch_name(n - 1), "id.npy"))) == 700 - 64 * 10

    # Rank R of 2 reads global batches R, R + 2, ...: floor(11 / 2) = 5 each.
    for r in range(2):
        rel = f"epoch-1/rank-{r}-of-2"
        for j in range(n // 2):
            g = r + 2 * j
            for tail in (".safetensors", "/id.npy", "/x.npy"):
                assert tfs.sha256(a.p(rel + "/" + batch_name(j) + tail)) == want[f"epoch-1/{batch_name(g)}{tail}"], (
                    f"{rel} batch {j}{tail} is not epoch-1 batch {g}"
                )
        assert not a.p(rel, batch_name(n // 2) + ".safetensors").exists()


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("other", ["B64", "Bnox"], ids=["x-float64", "x-missing"])
def test_sources_serving_other_tensors_are_refused_naming_the_source_and_tensor(mounter, srcs, tmp_path, other):
    mix = write_mix(tmp_path / "mix.toml", {"url": str(srcs["A"])}, {"url": str(srcs[other])})
    line = tfs.refused_mount(mounter, mix, "batch_size=100")
    assert "source 2" in line, line
    refused_names(line, "x")


def test_proportion_on_some_sources_only_is_refused(mounter, srcs, tmp_path):
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "proportion": 1.0},
        {"url": str(srcs["B"]), "repeat": 2.0},
    )
    line = tfs.refused_mount(mounter, mix, "batch_size=100")
    assert "proportion" in line, line


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_partitions_give_each_rank_its_share_of_every_source(mounter, srcs, tmp_path, shuffle):
    """partitions=2, world_size=2: each rank reads only its partition of every source, the same
    rows in every epoch, and the epoch still draws each source as sized."""
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "proportion": 1.0},
        {"url": str(srcs["B"]), "proportion": 1.0},
    )
    m = mounter(mix, "batch_size=50", "epoch_rows=600", "partitions=2", "world_size=2", "epochs=2", f"shuffle={shuffle}")
    info = m.dataset()
    assert info["partitions"] == 2 and sum(info["partition_rows"]) == 600, info["partition_rows"]
    per_rank = info["rank_batches_per_epoch"]
    assert per_rank > 0
    homes = []
    for r in range(2):
        seen = set()
        for e in range(2):
            for j in range(per_rank):
                ids = np.load(m.p(f"epoch-{e}", f"rank-{r}-of-2", batch_name(j)) / "id.npy")
                assert len(ids) == 50
                seen |= set(ids.tolist())
        homes.append(seen)
    assert not homes[0] & homes[1], "a row read by both ranks"
    for e in range(2):
        ids = epoch_ids(m, e)
        assert_drawn(of(ids, A_IDS), A_IDS, 300, f"epoch {e} A")
        assert_drawn(of(ids, B_IDS), B_IDS, 300, f"epoch {e} B")


def test_a_transform_turns_every_source_s_rows(mounter, srcs, tmp_path):
    """transform= runs on every source's row groups (tried on the first source's): each served
    row is the function of its own source row."""
    mix = write_mix(tmp_path / "mix.toml", {"url": str(srcs["A"])}, {"url": str(srcs["C"])})
    fn = tmp_path / "double.py"
    fn.write_text(
        "def transform(batch):\n"
        "    return {'id': batch.column('id').to_numpy(), 'x2': batch.column('x').to_numpy() * 2}\n"
    )
    m = mounter(mix, "batch_size=100", f"transform={fn}:transform", f"python={sys.executable}")
    info = m.dataset()
    assert [t["name"] for t in info["tensors"]] == ["id", "x2"], info["tensors"]
    ids = []
    for i in range(batches_of(info)):
        d = m.p("epoch-0", batch_name(i))
        got, x2 = np.load(d / "id.npy"), np.load(d / "x2.npy")
        tfs.assert_array(x2, 2 * x_of(got), f"batch {i} x2")
        ids.append(got)
    ids = np.concatenate(ids)
    assert_drawn(of(ids, A_IDS), A_IDS, len(A_IDS), "A")
    assert_drawn(of(ids, C_IDS), C_IDS, len(C_IDS), "C")
def test_a_snapshot_of_the_whole_mixture_pins_every_source(mounter, srcs, tmp_path):
    """`tensorfs snapshot mix.toml PIN` pins every source: after a source grows, a mount with
    snapshot=PIN serves the very bytes of before; the .toml alone serves the grown source."""
    import shutil

    a = tmp_path / "a"
    shutil.copytree(srcs["A"], a)
    mix = write_mix(tmp_path / "mix.toml", {"url": "a", "where": "id >= 100"}, {"url": str(srcs["B"]), "repeat": 2.0})
    opts = ["batch_size=100", "seed=3"]
    before = mounter(mix, *opts)
    files = {i: (before.p("epoch-0", batch_name(i)) / "id.npy").read_bytes() for i in range(batches_of(before.dataset()))}
    fingerprint = before.dataset()["fingerprint"]
    pin = tmp_path / "mix.snapshot"
    proc = tfs.run(["snapshot", mix, pin, "-o", ",".join(opts)])
    assert proc.returncode == 0, proc.stderr
    assert fingerprint in proc.stdout + proc.stderr
    write_source(tmp_path / "grown", np.arange(50_000, 50_100, dtype=np.int64))
    shutil.copy(tmp_path / "grown" / "part-0.parquet", a / "part-9.parquet")
    pinned = mounter(mix, *opts, f"snapshot={pin}")
    assert pinned.dataset()["fingerprint"] == fingerprint
    for i, b in files.items():
        assert (pinned.p("epoch-0", batch_name(i)) / "id.npy").read_bytes() == b, f"batch {i}"
    grown = mounter(mix, *opts)
    assert grown.dataset()["mixture"][0]["rows"] == 1000
    assert pinned.dataset()["mixture"][0]["rows"] == 900
    # A snapshot mounts only with the .toml it was taken of.
    other = write_mix(tmp_path / "other.toml", {"url": str(srcs["B"])}, {"url": "a"})
    line = tfs.refused_mount(mounter, other, *opts, f"snapshot={pin}")
    assert str(pin) in line and "mixture" in line, line
    # A single source's mount is no mixture's snapshot.
    line = tfs.refused_mount(mounter, srcs["B"], *opts, f"snapshot={pin}")
    assert str(pin) in line, line
def test_a_mixture_s_fingerprint_is_what_fingerprint_takes(mounter, srcs, tmp_path):
    """The fingerprint names every source and its size: fingerprint= takes it, and refuses
    another mixture's."""
    mix = write_mix(tmp_path / "mix.toml", {"url": str(srcs["A"])}, {"url": str(srcs["B"])})
    fp = mounter(mix, "batch_size=100").dataset()["fingerprint"]
    assert re.fullmatch(r"[0-9a-f]{64}", fp), fp
    m = mounter(mix, "batch_size=100", f"fingerprint={fp}")
    assert m.dataset()["fingerprint"] == fp
    other = write_mix(tmp_path / "other.toml", {"url": str(srcs["A"])}, {"url": str(srcs["B"]), "repeat": 2.0})
    line = tfs.refused_mount(mounter, other, "batch_size=100", f"fingerprint={fp}")
    assert fp in line and "fingerprint=" in line, line


def test_the_python_package_reads_and_resumes_a_mixture(mounter, srcs, tmp_path):
    """BatchDataset over a mixture: its batches are the mount's, and a state saved mid-epoch
    resumes at the next batch."""
    sys.path.insert(0, str(tfs.REPO / "python"))
    from tensorfs.torch import BatchDataset

    mix = write_mix(tmp_path / "mix.toml", {"url": str(srcs["A"]), "proportion": 1.0}, {"url": str(srcs["C"]), "proportion": 1.0})
    m = mounter(mix, "batch_size=100", "epochs=2")
    ds = BatchDataset(str(m.path))
    assert len(ds) == batches_of(m.dataset())
    ds.set_epoch(1)
    for i in (0, len(ds) - 1):
        np.testing.assert_array_equal(ds[i]["id"].numpy(), np.load(m.p("epoch-1", batch_name(i)) / "id.npy"))
    state = ds.state_dict(batches_done=3)
    again = BatchDataset(str(m.path))
    again.load_state_dict(state)
    assert again.epoch == 1
    np.testing.assert_array_equal(next(iter(again))["id"].numpy(), ds[3]["id"].numpy())


def test_each_host_decodes_only_its_partition_of_every_source(mounter, srcs, tmp_path):
    """Two hosts (fresh caches) each read their rank view of a mixture with partitions=2: each
    decodes only row groups its partition draws from, of both sources (dataset.json counts
    them; a source drawn down, or rows only in the leftover batches, may leave some unread)."""
    mix = write_mix(
        tmp_path / "mix.toml",
        {"url": str(srcs["A"]), "proportion": 1.0},
        {"url": str(srcs["C"]), "proportion": 1.0},
    )
    opts = ("batch_size=50", "partitions=2", "world_size=2", "shuffle=window")
    decoded, held = [], []
    for r in range(2):
        m = mounter(mix, *opts)
        info = m.dataset()
        n = info["rank_batches_per_epoch"]
        assert n > 0
        ids = [np.load(m.p("epoch-0", f"rank-{r}-of-2", batch_name(j)) / "id.npy") for j in range(n)]
        held.append(set(np.concatenate(ids).tolist()))
        decoded.append(tfs.stats(m)["row_groups_decoded"])
    assert not held[0] & held[1], "the two ranks' batches share rows"
    row_groups = info["partition_row_groups"]
    # A's 10 row groups and C's 5, a few split between the partitions.
    assert 15 <= sum(row_groups) <= 15 + 4, row_groups
    for r in range(2):
        assert 0 < decoded[r] <= row_groups[r] < 15, (decoded, row_groups)
