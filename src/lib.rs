//! tensorfs: a Parquet dataset shown as per-epoch, deterministic tensor batch files.
//!
//! The folders follow the layers, bottom up: `source` reads Parquet through object_store (its
//! objects and footer facts in a catalog, which a snapshot pins for every host) and maps its
//! schema to tensors; `read` orders rows into batches, lays out the files and builds them ahead
//! of the readers; `cache` keeps columns and files on the local SSD; `requests` is the
//! filesystem core the kernel's requests reach (the tree, open files); `fuse` is the adapter to
//! the kernel, and `mount` ties them together. docs/dev/architecture.md draws it.

mod cache;
pub mod client;
pub mod error;
mod fuse;
mod metrics;
pub mod mount;
pub mod options;
pub mod read;
pub mod requests;
pub mod source;
pub mod stats;
mod udf;

thread_local! {
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into an error carrying the panic's message: for third-party
/// decoders that may panic on malformed input. The panic is logged at debug level only; the
/// caller reports the error.
pub(crate) fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CATCHING.with(|c| c.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(outer));
    result.map_err(panic_text)
}

/// A caught panic's message, on one line.
pub(crate) fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
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
pub(crate) fn describe(e: &anyhow::Error) -> String {
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
