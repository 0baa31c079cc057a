//! The read path: from a batch's place in the plan to its bytes, and ahead of the readers.
//!
//! `plan` orders rows into batches; `layout` names the files and says their sizes and where
//! every byte lies (`format` and `dtype` encode the headers); `transform` turns row groups into
//! tensor columns and gathers batches; `builder` builds row groups and batches on the worker
//! `pool`, within the memory `budget`; `materialize` writes batch files into the cache; `readers` records where readers
//! are; `prefetch` follows them, `ahead` builds the next epoch's one-open files, and
//! `page_cache` stores built files in the kernel's page cache, making them known to it, through
//! the `Kernel` it owns (the FUSE session's, in `kernel/`).

pub(crate) mod ahead;
pub(crate) mod budget;
pub(crate) mod builder;
pub(crate) mod eviction;
pub mod format;
pub mod layout;
pub(crate) mod materialize;
pub mod page_cache;
pub(crate) mod pool;
pub(crate) mod prefetch;
pub(crate) mod readers;
pub(crate) mod transform;
