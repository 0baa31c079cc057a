//! Live counters, served as `.tensorfs/stats.json`.

use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        #[derive(Debug, Default)]
        pub struct Counters { $(pub $name: AtomicU64,)* }

        impl Counters {
            fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
                let mut m = serde_json::Map::new();
                $(m.insert(stringify!($name).into(), json!(self.$name.load(Ordering::Relaxed)));)*
                m
            }
        }
    };
}

counters!(
    // Source side.
    // Objects whose footer this mount has loaded (a listing: all of them at start; a snapshot:
    // those its reads drew from).
    objects_touched,
    remote_requests,
    remote_bytes,
    row_groups_decoded,
    rows_decoded,
    // Wall time from a row group's fetch to its decoded columns, waits included.
    decode_ns,
    // CPU time the workers spent decoding and transforming row groups.
    decode_cpu_ns,
    pad_truncated,
    // Batches.
    // Gathers of batch rows: whole batches, and single tensors of them (also counted below).
    batches_built,
    // A tensor of a batch gathered alone, for a reader of the one-open files.
    tensors_gathered,
    // CPU time the workers spent gathering batch rows from decoded columns.
    gather_cpu_ns,
    batch_files_written,
    // CPU time the workers spent writing batch files to the cache (checksums included).
    batch_write_cpu_ns,
    // The local cache.
    column_hits,
    column_misses,
    batch_file_hits,
    batch_file_misses,
    cache_corrupt_dropped,
    cache_evictions,
    cache_evicted_bytes,
    cache_write_failures,
    cache_bytes,
    cache_capacity,
    // Prefetch.
    prefetch_scheduled,
    prefetch_deferred,
    // Batch files of a reader's next epoch built in idle time, well ahead of it.
    next_epoch_files_built,
    // Serving.
    // Names the kernel looked up one at a time (a listing carries its entries' attributes, so
    // a reader that lists a directory first looks none of them up).
    lookups,
    opens,
    batches_served,
    bytes_served,
    stall_count,
    stall_ns,
    passthrough_opens,
    // With opens=kernel: batch files stored in the kernel's page cache ahead of their reader.
    page_cache_stores,
    // One-open files of a reader's next epoch built whole ahead of it, their bytes, those the
    // cache had no room for, and opens answered from them.
    ahead_files_built,
    ahead_bytes_built,
    // Of those, built over a file gone by (its pages and blocks reused).
    ahead_written_over,
    ahead_skipped,
    ahead_opens,
    // Opens of a file being built ahead: waiting for it (near its end), or not (the build is
    // then stopped; also a wait that outlasted its limit).
    ahead_waits,
    ahead_late,
    // Files built ahead in an earlier mount, kept in the cache, checked and used in this one.
    ahead_kept_checked,
    daemon_reads,
    daemon_read_bytes,
);

/// Stall times by power-of-two microseconds: bucket `b` counts stalls below 2^b µs.
const BUCKETS: usize = 40;

#[derive(Debug)]
pub struct Stats {
    pub c: Counters,
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

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }

    /// A reader waited `d` for data (an `open` that built its batch, a read from the daemon).
    pub fn stall(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        let bucket = (64 - us.leading_zeros() as usize).min(BUCKETS - 1);
        self.stalls[bucket].fetch_add(1, Ordering::Relaxed);
        Stats::add(&self.c.stall_count, 1);
        Stats::add(&self.c.stall_ns, d.as_nanos() as u64);
    }

    /// The 99th percentile of stall times, in µs (the upper bound of its bucket).
    pub fn stall_p99_us(&self) -> u64 {
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
