"""The results: collected, printed as a table, drawn as a PNG chart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import MB, log, pip_install


class Results:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, key, label, rows, nbytes, seconds, note=""):
        r = {"key": key, "method": label, "rows": rows, "bytes": nbytes, "seconds": seconds,
             "rows_s": rows / seconds, "mb_s": nbytes / MB / seconds, "note": note}
        self.rows.append(r)
        log(f"{label}: {rows} rows, {nbytes / MB:.1f} MB in {seconds:.2f} s = {r['mb_s']:.1f} MB/s")
        return r

    def unavailable(self, key, label, reason):
        self.rows.append({"key": key, "method": label, "unavailable": reason})
        log(f"{label}: unavailable: {reason}")

    ORDER = ["npy", "npy_disk", "st_local", "st_local_disk", "tfs_warm", "tfs_warm_npy", "tfs_warm_disk",
             "all_local_seq", "tfs_all_seq", "all_local_mmap", "tfs_all_mmap", "all_local_disk", "tfs_all_disk",
             "small_pyarrow", "small_tfs_cold", "small_tfs_cold_npy", "small_tfs_cold_all", "small_tfs_warm", "small_tfs_npy", "small_local_npy", "small_tfs_all",
             "tfs_cold", "tfs_cold_s3", "tfs_cold_s3_remote", "pyarrow", "pyarrow_s3", "pyarrow_s3_remote",
             "petastorm", "petastorm_s3", "petastorm_fill",
             "petastorm_cached"]

    def ordered(self) -> list[dict]:
        return sorted(self.rows, key=lambda r: self.ORDER.index(r["key"]) if r["key"] in self.ORDER else 99)

    def get(self, key):
        for r in self.rows:
            if r["key"] == key and "unavailable" not in r:
                return r
        return None


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def report(res: Results, stalls: list, meta: dict, a) -> None:
    warm, pa_ = res.get("tfs_warm"), res.get("pyarrow")
    lines = []
    head = (f"{'method':<50} {'rows/s':>9} {'MB/s':>9} {'x warm':>8} {'x pyarrow':>10}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in res.ordered():
        if "unavailable" in r:
            lines.append(f"{r['method']:<50} unavailable: {r['unavailable']}")
            continue
        rw = f"{r['mb_s'] / warm['mb_s']:.2f}" if warm else "-"
        rp = f"{r['mb_s'] / pa_['mb_s']:.2f}" if pa_ else "-"
        if warm and abs(r["rows_s"] / warm["rows_s"] - r["mb_s"] / warm["mb_s"]) > 0.005:
            rw += f" (rows {r['rows_s'] / warm['rows_s']:.2f})"
        lines.append(f"{r['method']:<50} {fmt_rate(r['rows_s']):>9} {r['mb_s']:>9.1f} {rw:>8} {rp:>10}")
    desc = (f"{meta['rows']} rows ({meta['tensor_mb']:.0f} MB of tensors, {meta['parquet_mb']:.0f} MB of Parquet in "
            f"{meta['files']} files, {meta['row_group_rows']}-row groups), batch_size {meta['batch_size']} "
            f"({meta['batches']} batches); {meta['cores']} cores, Linux {meta['kernel']}; "
            f"page cache dropped before cold runs: {'yes' if meta['page_cache_dropped'] else 'no'}")
    print()
    print(desc)
    print("MB/s: tensor bytes delivered as NumPy arrays. 'x warm', 'x pyarrow': ratio to 'tensorfs warm (page cache)'"
          " and to 'pyarrow iter_batches+to_numpy, local' (the same for rows/s: every method delivers 272 bytes a row,"
          " except the small-row dataset's, 80).")
    print()
    print("\n".join(lines))
    for s in stalls:
        d = s["daemon"]
        print()
        print(f"stall experiment ({s['name']}): a consumer needing {s['consumer_mb_s']:.1f} MB/s "
              f"(half of tensorfs cold {s['cold_mb_s']:.1f} MB/s), prefetch={s['prefetch']}, {s['batches']} batches")
        print(f"  epoch wall {s['wall_s']:.2f} s; blocked in open+read after the first batch {s['blocked_s'] * 1e3:.1f} ms"
              f" = {100 * s['blocked_share']:.2f}% of the epoch (open {s['open_s'] * 1e3:.1f} ms, read {s['read_s'] * 1e3:.1f} ms)")
        print(f"  the same open+reads at the same pace once materialised take {s['ready_read_s'] * 1e3:.1f} ms: waiting beyond the copy "
              f"{100 * s['excess_share']:.2f}% of the epoch; per-batch wait p99 {s['p99_wait_ms']:.2f} ms, max {s['max_wait_ms']:.2f} ms")
        print(f"  daemon: stall_count {d['stall_count']}, stall_ns {d['stall_ns']} ({(d['stall_ns'] or 0) / 1e6:.1f} ms), "
              f"stall_p99_us {d['stall_p99_us']}, prefetch_scheduled {d['prefetch_scheduled']}, "
              f"passthrough_opens {d['passthrough_opens']}, "
              f"ahead_files_built {d.get('ahead_files_built')}, ahead_opens {d.get('ahead_opens')}")
        print(f"  batches that waited > 2 ms: {s['slow_batches']} ({s['slow_s'] * 1e3:.0f} ms in all); of them "
              f"{s['slow_at_row_group_start']} ({s['slow_at_row_group_start_s'] * 1e3:.0f} ms) are the first batch of a row "
              f"group ({s['row_group_starts']} such batches); worst (batch, ms): {s['worst']}")
    if meta.get("open_us"):
        print(f"\nopen+close of a materialised batch file: {meta['open_us']['mount']:.0f} us through the mount, "
              f"{meta['open_us']['local']:.0f} us for the local copy")
    for mode, r in (meta.get("ahead_build_mb_s") or {}).items():
        print(f"\nshuffle={mode}: the next epoch's all.safetensors built ahead at {r['new']:.0f} MB/s as a new file, "
              f"{r['written_over']:.0f} MB/s over a file gone by ({r['files_written_over']} written over)")
    for key, label in (("tensorfs_cold_file_stats", "cold, file://"), ("tensorfs_cold_s3_stats", "cold, S3")):
        st = meta.get(key)
        if st:
            print(f"\ntensorfs {label} counters: row_groups_decoded {st.get('row_groups_decoded')}, decode "
                  f"{(st.get('decode_ns') or 0) / 1e9:.2f} s, remote_requests {st.get('remote_requests')}, remote "
                  f"{(st.get('remote_bytes') or 0) / MB:.0f} MB, batch_files_written {st.get('batch_files_written')}, "
                  f"stall_ns {(st.get('stall_ns') or 0) / 1e6:.0f} ms, stall_p99_us {st.get('stall_p99_us')}")
    # Each through the mount against the same bytes read the same way from a local file.
    vs_local = [(label, res.get(mine), res.get(local)) for label, mine, local in (
        ("warm batch files (.safetensors)", "tfs_warm", "st_local"),
        ("warm all.safetensors, 1 MiB reads", "tfs_all_seq", "all_local_seq"),
        ("warm all/*.npy, mmap batch slices", "tfs_all_mmap", "all_local_mmap"),
        ("warm batch files, remounted, page cache dropped", "tfs_warm_disk", "st_local_disk"),
        ("warm all.safetensors, remounted, page cache dropped", "tfs_all_disk", "all_local_disk"),
        ("shuffled epoch 1, shuffle=window (batch files, right after epoch 0)", "tfs_window_e1", "st_local"),
        ("shuffled epoch 2, shuffle=window (batch files built ahead)", "tfs_window_e2_ahead", "st_local"),
        ("opens=kernel: warm batch files, shuffle=window epoch 0 again", "tfs_window_kernel_warm", "st_local"),
        ("opens=kernel: shuffled epoch 1, shuffle=window (batch files, right after epoch 0)", "tfs_window_kernel_e1",
         "st_local"),
        ("opens=kernel: shuffled epoch 2, shuffle=window (batch files built ahead)", "tfs_window_kernel_e2_ahead",
         "st_local"),
        ("shuffled epoch 3, shuffle=window (all.safetensors, 1 MiB reads)", "tfs_window_e3_all", "all_local_seq"),
        ("shuffled epoch 4, shuffle=window (all.safetensors built ahead, 1 MiB reads)", "tfs_window_e4_ahead",
         "all_local_seq"),
        ("shuffled epoch 0, shuffle=window (all.safetensors after warm --format all, 1 MiB reads)",
         "tfs_window_e0_warmed", "all_local_seq"),
    )]
    if any(m and l for _, m, l in vs_local):
        print("\nthrough the mount / the same bytes from a local file (MB/s):")
        print("\n".join(f"  {label}: {m['mb_s'] / l['mb_s']:.2f}" for label, m, l in vs_local if m and l))
    small = [(label, res.get(key)) for label, key in (
        ("cold, batch files", "small_tfs_cold"), ("cold, .npy files", "small_tfs_cold_npy"),
        ("cold, all/*.npy slices", "small_tfs_cold_all"), ("warm, batch files", "small_tfs_warm"),
        ("warm, .npy files", "small_tfs_npy"), ("warm, all/*.npy slices", "small_tfs_all"),
        ("the same .npy files local, np.load's own ceiling", "small_local_npy"))]
    if res.get("small_pyarrow") and any(r for _, r in small):
        base = res.get("small_pyarrow")["mb_s"]
        print("\nsmall rows (80 bytes a row, 16 columns), tensorfs / pyarrow (MB/s): " + ", ".join(
            f"{label} {r['mb_s'] / base:.2f}" for label, r in small if r))
    # block is the default since issue 47, window the default before it: its cold and next
    # epochs against window's are the change's cost (PRODUCT.md §5: a cold epoch within 10%).
    for mode in ("block", "global"):
        pairs = [(what, res.get(f"tfs_{mode}_e{e}"), res.get(f"tfs_window_e{e}"))
                 for e, what in ((0, "epoch 0 (cold)"), (1, "epoch 1 (right after epoch 0)"))]
        if any(g and w for _, g, w in pairs):
            print(f"\nshuffle={mode} / shuffle=window (MB/s): " + ", ".join(
                f"{what} {g['mb_s'] / w['mb_s']:.2f}" for what, g, w in pairs if g and w))
    if meta.get("petastorm"):
        print(f"\npetastorm: {meta['petastorm']}; it skips FixedSizeList columns, so it read a twin dataset with emb as "
              f"list<float32> (same values); workers_count={a.petastorm_workers}, batches are row groups")
    # tensorfs against Petastorm on the same data: cold from S3 against Petastorm from the same
    # server when that row ran (else, said so, against Petastorm from file://), cold file://
    # against file://, warm against Petastorm's cached 2nd epoch.
    pet_s3, pet = res.get("petastorm_s3"), res.get("petastorm")
    pairs = [
        ("tfs_cold_s3", "tensorfs cold S3", pet_s3 or pet,
         "petastorm S3, no cache" if pet_s3 else "petastorm file://, no cache (its S3 row did not run)"),
        ("tfs_cold", "tensorfs cold file://", pet, "petastorm file://, no cache"),
        ("tfs_warm", "tensorfs warm", res.get("petastorm_cached"), "petastorm's cached 2nd epoch"),
    ]
    vs = [f"  {mine_label} / {theirs_label}: {res.get(mine)['mb_s'] / theirs['mb_s']:.2f}"
          for mine, mine_label, theirs, theirs_label in pairs if res.get(mine) and theirs]
    if vs:
        print("\ntensorfs / petastorm (MB/s):")
        print("\n".join(vs))
    # Issue 51's 2x PyArrow on S3: on loopback and through a proxy that makes the same server
    # look remote (a round trip per request, a cap per connection).
    ratios = [(where, res.get(mine), res.get(theirs)) for where, mine, theirs in (
        ("loopback", "tfs_cold_s3", "pyarrow_s3"), ("as a remote store", "tfs_cold_s3_remote", "pyarrow_s3_remote"))]
    if any(m and t for _, m, t in ratios):
        print("\ntensorfs cold / pyarrow on S3 (MB/s): " + ", ".join(
            f"{where} {m['mb_s'] / t['mb_s']:.2f}" for where, m, t in ratios if m and t)
            + (f" ({meta['s3_remote']})" if meta.get("s3_remote") else ""))
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "results": res.rows, "stall": stalls}, indent=1))
    if a.png:
        try:
            chart(res, stalls, desc, Path(a.png), meta.get("cpu"))
            print(f"\nchart: {a.png}")
        except Exception as e:
            print(f"\nchart: not written: {e}")


def chart(res: Results, stalls: list, desc: str, png: Path, cpu: dict | None = None) -> None:
    try:
        import matplotlib
    except ImportError:
        log("installing matplotlib into .venv")
        err = pip_install(Path(sys.executable), "matplotlib")
        if err:
            raise RuntimeError(f"matplotlib: {err}")
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.transforms

    warm, pa_ = res.get("tfs_warm"), res.get("pyarrow")
    rows = list(reversed(res.ordered()))
    labels = [r["method"] for r in rows]
    values = [r.get("mb_s", 0.0) for r in rows]
    colors = []
    for r in rows:
        if "unavailable" in r:
            colors.append("#cccccc")
        elif r["key"].startswith("tfs"):
            colors.append("#d95f02")
        elif r["key"] in ("npy", "npy_disk", "st_local", "st_local_disk") or r["key"].startswith("all_local"):
            colors.append("#7570b3")
        else:
            colors.append("#1b9e77")
    cpu_rows = cpu_bars(cpu)
    if cpu_rows:
        fig, (ax, cpu_ax) = plt.subplots(2, 1, figsize=(14, 0.5 * (len(rows) + len(cpu_rows)) + 3.4),
                                         gridspec_kw={"height_ratios": [len(rows), len(cpu_rows)], "hspace": 0.35})
    else:
        fig, ax = plt.subplots(figsize=(14, 0.5 * len(rows) + 2.6))
    ax.barh(range(len(rows)), values, color=colors)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("MB/s of tensor bytes delivered as NumPy arrays (log scale)")
    top = max(values) if any(values) else 1
    ax.set_xlim(min(v for v in values if v > 0) / 2 if any(values) else 1, top * 1.5)
    # The figures in a column right of the plot, so no label runs off the figure.
    right = matplotlib.transforms.blended_transform_factory(ax.transAxes, ax.transData)
    for y, r in enumerate(rows):
        if "unavailable" in r:
            ax.text(1.02, y, "unavailable: " + r["unavailable"][:60], transform=right, va="center", fontsize=8)
            continue
        parts = [f"{r['mb_s']:.0f} MB/s, {fmt_rate(r['rows_s'])} rows/s"]
        if warm:
            parts.append(f"{r['mb_s'] / warm['mb_s']:.2f}x warm")
        if pa_:
            parts.append(f"{r['mb_s'] / pa_['mb_s']:.2f}x pyarrow")
        ax.text(1.02, y, "  ".join(parts), transform=right, va="center", fontsize=8)
    if cpu_rows:
        cpu_chart(cpu_ax, cpu_rows, cpu, matplotlib)
    import textwrap

    fig.text(0.01, 0.99, "tensorfs benchmark\n" + textwrap.fill(desc, 150), fontsize=9, va="top")
    foot = []
    for s in stalls:
        foot.append(f"stall ({s['name']}): consumer at {s['consumer_mb_s']:.0f} MB/s (half of cold) blocked "
                    f"{100 * s['blocked_share']:.2f}% of the epoch in open+read after batch 0 "
                    f"({100 * s['excess_share']:.2f}% beyond the copy), prefetch={s['prefetch']}; daemon stall_p99 {s['daemon']['stall_p99_us']} us")
    if foot:
        fig.text(0.01, 0.01, "\n".join(foot), fontsize=8, va="bottom")
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.27, right=0.64, top=1 - 0.75 / h, bottom=(0.75 + 0.16 * len(foot)) / h)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def cpu_bars(cpu: dict | None) -> list:
    """The daemon-CPU rows of the chart (label, core-s/GB, x gather), np.take's first."""
    if not cpu or "gather" not in cpu:
        return []
    g = cpu["gather"]["core_s_gb"]
    bars = [("np.take gather from RAM, 1 thread", g, 1.0)]
    bars += [("tensorfs " + k["label"], k["core_s_gb"], k["core_s_gb"] / g) for k in cpu["kinds"].values()]
    return bars


def cpu_chart(ax, bars: list, cpu: dict, matplotlib) -> None:
    """Daemon CPU per GB of shuffled epochs from cached columns, against the 2x-gather target."""
    bars = list(reversed(bars))
    ax.barh(range(len(bars)), [b[1] for b in bars],
            color=["#1b9e77" if b[0].startswith("np.take") else "#d95f02" for b in bars])
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars], fontsize=9)
    target = 2 * cpu["gather"]["core_s_gb"]
    ax.axvline(target, color="black", linestyle="--", linewidth=1)
    ax.text(target, len(bars) - 0.4, " target: 2x the gather", fontsize=8, va="bottom")
    ax.set_xlabel("core-seconds per GB delivered, shuffled epochs 1-2 from cached columns: the daemon's "
                  "(np.take: its own)")
    right = matplotlib.transforms.blended_transform_factory(ax.transAxes, ax.transData)
    next_rate = {"tensorfs " + k["label"]: k["next_mb_s"] for k in cpu["kinds"].values()}
    rate = cpu["gather"]["mb_s"]
    for y, (label, value, ratio) in enumerate(bars):
        text = f"{value:.2f} core-s/GB, {ratio:.2f}x gather"
        if label in next_rate:
            text += f"; epoch right after {next_rate[label] / rate:.2f}x its rate"
        ax.text(1.02, y, text, transform=right, va="center", fontsize=8)
