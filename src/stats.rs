//! Live counters, served as `.tensorfs/stats.json`.

use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a counter measures, for the Prometheus exposition: a count that only grows, a level
/// (a gauge), or nanoseconds (exposed in seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MetricKind {
    Count,
    Level,
    Nanos,
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])+ $name:ident: $kind:ident,)*) => {
        #[derive(Debug, Default)]
        pub(crate) struct Counters { $(pub $name: AtomicU64,)* }

        impl Counters {
            fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
                let mut m = serde_json::Map::new();
                $(m.insert(stringify!($name).into(), json!(self.$name.load(Ordering::Relaxed)));)*
                m
            }

            /// Every counter: its name (as in stats.json), kind, what it counts, and its value.
            pub(crate) fn described(&self) -> Vec<(&'static str, MetricKind, &'static str, u64)> {
                vec![$((
                    stringify!($name),
                    MetricKind::$kind,
                    concat!($($doc),+),
                    self.$name.load(Ordering::Relaxed),
                ),)*]
            }
        }
    };
}

counters!(
    /// Objects whose footer this mount has loaded (a listing: all at start; a snapshot: those
    /// its reads drew from).
    objects_touched: Count,
    /// Requests sent to the object store.
    remote_requests: Count,
    /// Bytes asked of the object store.
    remote_bytes: Count,
    /// Row groups fetched, decoded and transformed into tensor columns.
    row_groups_decoded: Count,
    /// Rows of those row groups.
    rows_decoded: Count,
    /// Wall time from a row group's fetch to its decoded columns, waits included.
    decode_ns: Nanos,
    /// CPU time the workers spent decoding and transforming row groups.
    decode_cpu_ns: Nanos,
    /// Variable-length lists cut to their pad= length.
    pad_truncated: Count,
    /// Gathers of batch rows: whole batches, and single tensors of them.
    batches_built: Count,
    /// Tensors of a batch gathered alone, for a reader of the one-open files.
    tensors_gathered: Count,
    /// CPU time the workers spent gathering batch rows from decoded columns.
    gather_cpu_ns: Nanos,
    /// Batch files written to the local cache.
    batch_files_written: Count,
    /// CPU time the workers spent writing batch files to the cache (checksums included).
    batch_write_cpu_ns: Nanos,
    /// Decoded row groups found in the local cache.
    column_hits: Count,
    /// Decoded row groups the local cache did not hold.
    column_misses: Count,
    /// Batch files found in the local cache.
    batch_file_hits: Count,
    /// Batch files the local cache did not hold.
    batch_file_misses: Count,
    /// Cache entries that failed their checksum or format check, dropped and rebuilt.
    cache_corrupt_dropped: Count,
    /// Cache entries evicted to make room.
    cache_evictions: Count,
    /// Bytes of the entries evicted.
    cache_evicted_bytes: Count,
    /// Writes to the cache that failed (a full disk: served from memory instead).
    cache_write_failures: Count,
    /// Bytes written to the local cache: decoded columns, batch files, one-open files built
    /// ahead (what the SSD is asked to write, per byte served: `bytes_served` and the reads).
    cache_written_bytes: Count,
    /// Bytes the local cache holds.
    cache_bytes: Level,
    /// Bytes the local cache may hold (cache_size).
    cache_capacity: Level,
    /// Batch files scheduled ahead of a reader.
    prefetch_scheduled: Count,
    /// Batch files of a reader's next epoch built in idle time, well ahead of it.
    next_epoch_files_built: Count,
    /// Names the kernel looked up one at a time (a listing carries its entries' attributes).
    lookups: Count,
    /// Opens of batch files answered by the daemon.
    opens: Count,
    /// Batch files served (opens of them).
    batches_served: Count,
    /// Bytes of the batch files served.
    bytes_served: Count,
    /// Waits of a reader for data (an open that built its batch, a read from the daemon).
    stall_count: Count,
    /// Time readers waited for data.
    stall_ns: Nanos,
    /// Opens answered by FUSE passthrough of a file on the local cache.
    passthrough_opens: Count,
    /// Batch files stored in the kernel's page cache ahead of their reader (a shuffled epoch's,
    /// and every one with opens=kernel).
    page_cache_stores: Count,
    /// One-open files of a reader's next epoch built whole ahead of it.
    ahead_files_built: Count,
    /// Bytes of those files.
    ahead_bytes_built: Count,
    /// Of those, built over a file gone by (its pages and blocks reused).
    ahead_written_over: Count,
    /// One-open files not built ahead for lack of cache room.
    ahead_skipped: Count,
    /// Opens of one-open files answered from a file built ahead.
    ahead_opens: Count,
    /// Opens of a file being built ahead that waited for its end.
    ahead_waits: Count,
    /// Opens of a file being built ahead that did not wait (the build then stopped).
    ahead_late: Count,
    /// Files built ahead in an earlier mount, kept in the cache, checked and used in this one
    /// (a mount gives the files it keeps their checksums as it is unmounted).
    ahead_kept_checked: Count,
    /// Reads of batch files served by the daemon rather than by passthrough or the page cache.
    daemon_reads: Count,
    /// Bytes of those reads.
    daemon_read_bytes: Count,
    /// Reads of one-open files served by the daemon (not by passthrough of a file built ahead,
    /// nor by the page cache).
    one_open_reads: Count,
    /// Batches' rows of a tensor stored in the kernel's page cache of a one-open file ahead of
    /// its reader, while the daemon serves that file.
    rows_stored: Count,
    /// Work the daemon has taken on and not finished: the follow-up of an answered open or
    /// read, and what it started ahead (files built or stored, row groups decoded, a walk
    /// through the next epoch). 0: nothing more is done until the next open or read.
    work_pending: Level,
);

/// Stall times by power-of-two microseconds: bucket `b` counts stalls below 2^b µs.
const BUCKETS: usize = 40;
/// Buckets of the stall histogram Prometheus gets, up to 2^30 µs (18 minutes); longer stalls
/// are counted in its +Inf bucket only.
const STALL_BUCKETS_SHOWN: usize = 31;

#[derive(Debug)]
pub struct Stats {
    pub(crate) c: Counters,
    stalls: [AtomicU64; BUCKETS],
    started: Instant,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            c: Counters::default(),
            stalls: std::array::from_fn(|_| AtomicU64::new(0)),
            started: Instant::now(),
        }
    }
}

/// One unit of [`Counters::work_pending`], held by the work it stands for until that ends.
pub(crate) struct Pending(std::sync::Arc<Stats>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.c.work_pending.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Stats {
    /// Work taken on now, pending until the guard is dropped: taken before the work that
    /// starts it ends, so the count never reads 0 while some of it is still to come.
    pub(crate) fn pending(self: &std::sync::Arc<Self>) -> Pending {
        Stats::add(&self.c.work_pending, 1);
        Pending(self.clone())
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }

    /// A reader waited `d` for data (an `open` that built its batch, a read from the daemon).
    pub(crate) fn stall(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        let bucket = (64 - us.leading_zeros() as usize).min(BUCKETS - 1);
        self.stalls[bucket].fetch_add(1, Ordering::Relaxed);
        Stats::add(&self.c.stall_count, 1);
        Stats::add(&self.c.stall_ns, d.as_nanos() as u64);
    }

    /// The 99th percentile of stall times, in µs (the upper bound of its bucket).
    pub(crate) fn stall_p99_us(&self) -> u64 {
        let counts: Vec<u64> = self
            .stalls
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let mut seen = 0;
        for (b, n) in counts.iter().enumerate() {
            seen += n;
            if seen * 100 >= total * 99 {
                return 1 << b;
            }
        }
        1 << (BUCKETS - 1)
    }

    /// The counters in Prometheus's text exposition format (0.0.4): `tensorfs_NAME_total` for
    /// counts, `_seconds_total` for times, gauges for levels, and reader stalls as a histogram;
    /// `memory_bytes`: the daemon's buffers now.
    pub(crate) fn prometheus(&self, memory_bytes: u64) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let mut metric = |name: &str, ty: &str, help: &str, values: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {}", help.trim());
            let _ = writeln!(out, "# TYPE {name} {ty}");
            for (suffix, v) in values {
                let _ = writeln!(out, "{name}{suffix} {v}");
            }
        };
        for (name, kind, help, value) in self.c.described() {
            // The stall histogram below says them.
            if name == "stall_count" || name == "stall_ns" {
                continue;
            }
            let (full, ty, v) = match kind {
                MetricKind::Count => (format!("tensorfs_{name}_total"), "counter", value as f64),
                MetricKind::Nanos => {
                    let base = name.trim_end_matches("_ns");
                    let v = value as f64 / 1e9;
                    (format!("tensorfs_{base}_seconds_total"), "counter", v)
                }
                MetricKind::Level => (format!("tensorfs_{name}"), "gauge", value as f64),
            };
            metric(&full, ty, help, &[(String::new(), v)]);
        }
        let mut buckets = Vec::new();
        let mut seen = 0;
        for (b, n) in self.stalls.iter().enumerate().take(STALL_BUCKETS_SHOWN) {
            seen += n.load(Ordering::Relaxed);
            let le = (1u64 << b) as f64 / 1e6;
            buckets.push((format!("_bucket{{le=\"{le}\"}}"), seen as f64));
        }
        let count = self.c.stall_count.load(Ordering::Relaxed);
        buckets.push(("_bucket{le=\"+Inf\"}".to_string(), count as f64));
        let sum = self.c.stall_ns.load(Ordering::Relaxed) as f64 / 1e9;
        buckets.push(("_sum".to_string(), sum));
        buckets.push(("_count".to_string(), count as f64));
        let help = "How long readers waited for data (an open that built its batch, a read from the daemon).";
        metric("tensorfs_stall_seconds", "histogram", help, &buckets);
        let help = "Bytes of the daemon's buffers: decoded row groups and built batches.";
        metric(
            "tensorfs_memory_bytes",
            "gauge",
            help,
            &[(String::new(), memory_bytes as f64)],
        );
        let uptime = self.started.elapsed().as_secs_f64();
        metric(
            "tensorfs_uptime_seconds",
            "gauge",
            "Seconds since the mount started.",
            &[(String::new(), uptime)],
        );
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut m = self.c.to_json();
        m.insert("stall_p99_us".into(), json!(self.stall_p99_us()));
        m.insert(
            "uptime_s".into(),
            json!(self.started.elapsed().as_secs_f64()),
        );
        serde_json::Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// docs/stats.md describes every counter, so users can read what each one says.
    #[test]
    fn every_counter_is_documented_for_users() {
        let doc = include_str!("../docs/stats.md");
        for (name, _, help, _) in Stats::default().c.described() {
            assert!(!help.trim().is_empty(), "{name} has no help text");
            assert!(
                doc.contains(&format!("`{name}`")),
                "docs/stats.md lacks {name}"
            );
        }
    }

    #[test]
    fn the_exposition_has_a_help_and_type_line_for_each_metric() {
        let s = Stats::default();
        s.stall(Duration::from_micros(300));
        Stats::add(&s.c.remote_bytes, 5);
        Stats::add(&s.c.decode_ns, 1_500_000_000);
        let text = s.prometheus(42);
        assert!(text.contains(
            "# TYPE tensorfs_remote_bytes_total counter\ntensorfs_remote_bytes_total 5\n"
        ));
        assert!(text.contains("tensorfs_decode_seconds_total 1.5\n"));
        assert!(text.contains("# TYPE tensorfs_cache_bytes gauge"));
        assert!(text.contains("tensorfs_stall_seconds_bucket{le=\"0.000256\"} 0\n"));
        assert!(text.contains("tensorfs_stall_seconds_bucket{le=\"0.000512\"} 1\n"));
        assert!(text.contains("tensorfs_stall_seconds_count 1\n"));
        assert!(text.contains("tensorfs_memory_bytes 42\n"));
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert_eq!(helps, types);
        assert!(!text.contains("tensorfs_stall_ns"));
    }

    #[test]
    fn the_p99_stall_is_the_slow_tail() {
        let s = Stats::default();
        assert_eq!(s.stall_p99_us(), 0);
        for _ in 0..98 {
            s.stall(Duration::from_micros(3));
        }
        s.stall(Duration::from_millis(50));
        s.stall(Duration::from_millis(50));
        // 2% of stalls took 50 ms: the 99th percentile is in their bucket.
        assert!(s.stall_p99_us() >= 50_000 && s.stall_p99_us() < 100_000);
        assert_eq!(s.c.stall_count.load(Ordering::Relaxed), 100);
    }
}
