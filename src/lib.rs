//! tensorfs: a Parquet dataset shown as per-epoch, deterministic tensor batch files.
//!
//! The layout follows the data: `source` reads Parquet through object_store, `view` maps its
//! schema to tensors, `plan` orders rows into batches, `transform` turns row groups into
//! tensor columns and gathers batches, `format` encodes `.npy` and safetensors, `engine` builds
//! batches on the worker pool, `fs` is the tree, `fuse` the adapter to the kernel, and `mount`
//! ties them together.

pub mod cache;
pub mod client;
pub mod dtype;
pub mod engine;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod mount;
pub mod options;
pub mod plan;
pub mod prefetch;
pub mod source;
pub mod stats;
pub mod transform;
pub mod view;

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
