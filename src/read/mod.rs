//! The read path: from a batch's place in the plan (`model::plan`) to its bytes, and ahead of
//! the readers. Three parts, bottom up:
//!
//! - this folder's own modules, which both others use: `layout` names the files and says their
//!   sizes and where every byte lies (`format` encodes the headers); `readers` records where
//!   each reader is.
//! - `produce`: the bytes. `tensors` turns row groups into tensor columns;
//!   `builder` builds row groups and batches on the worker `pool`, within the memory `budget`;
//!   `materialize` writes batch files into the cache; `ahead` builds the next epoch's one-open
//!   files; `eviction` says how far ahead of the readers each cache item is needed.
//! - `follow`: the readers followed. `prefetch` builds what each reader reads next, and
//!   `page_cache` stores built files in the kernel's page cache, making them known to it,
//!   through the `Kernel` it owns (the FUSE session's, in `kernel/`).

pub mod follow;
pub mod format;
pub mod layout;
pub(crate) mod produce;
pub(crate) mod readers;
