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
