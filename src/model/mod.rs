//! The model every layer shares, importing none of them: the plan that orders rows into
//! batches (`plan`, over `partitions`, `mix` for several sources, and `permutation`, the
//! randomness of an order), tensor element types (`dtype`), the items the local cache holds and
//! the files of a batch (`item`), and small checked files kept between mounts (`kept`).

pub mod dtype;
pub(crate) mod item;
pub(crate) mod kept;
pub mod mix;
pub mod partitions;
pub(crate) mod permutation;
pub mod plan;
