//! The bytes of the read path: row groups decoded and turned into tensor columns (`tensors`)
//! and held as `columns`, from which batches and one tensor of a batch are gathered (`builder`,
//! keeping them in single-flight `memo`s) on the worker `pool` within the memory `budget`, batch
//! files written into the cache (`materialize`), the next epoch's one-open files built whole (`ahead`), and how far ahead
//! each cache item is needed (`eviction`). Nothing here follows a reader: `read::follow` asks
//! for what they will read.

pub(crate) mod ahead;
pub(crate) mod budget;
pub(crate) mod builder;
pub(crate) mod columns;
pub(crate) mod eviction;
pub(crate) mod materialize;
pub(crate) mod memo;
pub(crate) mod pool;
pub(crate) mod tensors;
