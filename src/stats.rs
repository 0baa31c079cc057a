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
    remote_requests,
    remote_bytes,
    row_groups_decoded,
    rows_decoded,
    decode_ns,
    pad_truncated,
    // Batches.
    batches_built,
    batch_files_written,
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
    // Serving.
    opens,
    passthrough_opens,
    daemon_reads,
    daemon_read_bytes,
    memory_bytes,
);

#[derive(Debug)]
pub struct Stats {
    pub c: Counters,
    started: Instant,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            c: Counters::default(),
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

    pub fn to_json(&self) -> serde_json::Value {
        let mut m = self.c.to_json();
        m.insert(
            "uptime_s".into(),
            json!(self.started.elapsed().as_secs_f64()),
        );
        serde_json::Value::Object(m)
    }
}
