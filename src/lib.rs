//! tensorfs: a Parquet dataset shown as per-epoch, deterministic tensor batch files.
//!
//! The modules follow the data: `source` reads Parquet through object_store (its objects and
//! footer facts in a `catalog`, which a `snapshot` pins for every host), `view` maps its
//! schema to tensors, `plan` orders rows into batches, `layout` names the files and says their
//! sizes and bytes, `transform` turns row groups into tensor columns and gathers batches,
//! `format` encodes `.npy` and safetensors, `builder` builds row groups and batches on the
//! worker pool, `cache` keeps them on local SSD, `eviction` says what goes first, `materialize`
//! writes batch files into the cache, `readers` records where readers are, `prefetch` follows
//! them, `fs` is the tree, `fuse` the adapter to the kernel, and `mount` ties them together.
//! docs/architecture.md draws it.

pub mod ahead;
pub mod builder;
pub mod cache;
pub mod catalog;
pub mod client;
pub mod delta;
pub mod dtype;
pub mod error;
pub mod eviction;
pub mod footer;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod kept;
pub mod layout;
pub mod materialize;
pub mod metrics;
pub mod mount;
pub mod open_files;
pub mod options;
pub mod page_cache;
pub mod partition;
pub mod petastorm;
pub mod plan;
pub mod pool;
pub mod prefetch;
pub mod readers;
pub mod requests;
pub mod snapshot;
pub mod source;
pub mod stats;
pub mod transform;
pub mod view;

thread_local! {
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into an error carrying the panic's message: for third-party
/// decoders that may panic on malformed input. The panic is logged at debug level only; the
/// caller reports the error.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CATCHING.with(|c| c.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(outer));
    result.map_err(panic_text)
}

/// A caught panic's message, on one line.
pub fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    text.replace('\n', " ")
}

/// Installs the panic hook: a panic inside [`catch_panic`] is the caller's to report; any other
/// (a worker thread's, which becomes EIO) is logged as one line, and printed as one line where
/// no log is set up yet.
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        if CATCHING.with(|c| c.get()) {
            tracing::debug!("caught: {info}");
        } else if tracing::dispatcher::has_been_set() {
            tracing::error!("internal error: {}", info.to_string().replace('\n', " "));
        } else {
            eprintln!(
                "tensorfs: error: internal error: {}",
                info.to_string().replace('\n', " ")
            );
        }
    }));
}

/// An error and its causes on one line, each cause once: wrapped errors (Parquet's `External`)
/// repeat their source's message, which is left out the second time.
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn causes_are_described_once() {
        let inner = anyhow::anyhow!("object 'a' changed");
        let e = inner
            .context("External: object 'a' changed")
            .context("file 'a' row group 2");
        assert_eq!(
            super::describe(&e),
            "file 'a' row group 2: External: object 'a' changed"
        );
    }
}
