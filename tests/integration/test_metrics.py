"""`-o metrics=ADDR:PORT` (PRODUCT.md §3): the counters of stats.json for Prometheus, scraped
over HTTP and read with Prometheus's own text-format parser (prometheus_client)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

import tfs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", e.read().decode()


def test_metrics_are_scraped_in_prometheus_format(mounter, shuf_ds):
    parser = tfs.require("prometheus_client.parser", "prometheus-client is not installed (scripts/setup installs it)")
    port = free_port()
    m = mounter(shuf_ds.path, "batch_size=100", f"metrics=127.0.0.1:{port}")
    for i in range(5):
        tfs.read_exact(m.p("epoch-0", f"{tfs.batch_name(i)}.safetensors"))
    # Read-ahead goes on decoding while the test looks: stats.json, read between two scrapes,
    # lies between them, counter by counter.
    status, ctype, text = scrape(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    stats = tfs.stats(m)
    after = {f.name: f for f in parser.text_string_to_metric_families(scrape(f"http://127.0.0.1:{port}/metrics")[2])}
    counters = {
        "tensorfs_row_groups_decoded": stats["row_groups_decoded"],
        "tensorfs_batches_served": stats["batches_served"],
        "tensorfs_remote_bytes": stats["remote_bytes"],
    }
    for name, want in counters.items():
        f = families[name]
        assert f.type == "counter" and f.documentation, name
        (sample,) = f.samples
        (later,) = after[name].samples
        assert sample.name == f"{name}_total" and sample.value <= want <= later.value, (sample, want, later)
    assert stats["batches_served"] >= 5
    assert families["tensorfs_cache_bytes"].type == "gauge"
    assert families["tensorfs_decode_seconds"].type == "counter"
    stall = families["tensorfs_stall_seconds"]
    assert stall.type == "histogram"
    count = [s.value for s in stall.samples if s.name == "tensorfs_stall_seconds_count"]
    inf = [s.value for s in stall.samples if s.labels.get("le") == "+Inf"]
    later = [s.value for s in after["tensorfs_stall_seconds"].samples if s.name == "tensorfs_stall_seconds_count"]
    assert count == inf and count[0] <= stats["stall_count"] <= later[0], (count, inf, stats["stall_count"], later)
    assert families["tensorfs_memory_bytes"].type == "gauge"
    # Every counter of stats.json is there, under its Prometheus name.
    names = set(families)
    for key in stats:
        if key in ("readers", "stall_p99_us", "uptime_s", "memory_bytes", "stall_count", "stall_ns"):
            continue
        base = key[:-3] + "_seconds" if key.endswith("_ns") else key
        assert f"tensorfs_{base}" in names, key
    assert scrape(f"http://127.0.0.1:{port}/elsewhere")[0] == 404


def test_a_metrics_address_that_cannot_be_used_refuses_the_mount(mounter, shuf_ds):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        mnt = mounter.mountpoint()
        proc = tfs.run(["mount", shuf_ds.path, mnt, "-o", f"metrics=127.0.0.1:{port},cache_dir={mnt}-cache"])
        line = tfs.error_line(proc)
        assert f"metrics=127.0.0.1:{port}" in line and "cannot listen" in line, line
        assert not tfs.is_mounted(mnt)
    mnt = mounter.mountpoint()
    proc = tfs.run(["mount", shuf_ds.path, mnt, "-o", f"metrics=9100,cache_dir={mnt}-cache"])
    assert "ADDR:PORT" in tfs.error_line(proc)
