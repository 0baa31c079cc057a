//! The readers followed: `prefetch` builds what each reader reads next (and the next epoch),
//! and `page_cache` stores what is built in the kernel's page cache of the files readers open.

pub mod page_cache;
pub(crate) mod prefetch;
