//! The model every layer shares, importing none of them: the plan that orders rows into
//! batches (`plan`, over `partitions`, and `mix` for several sources), tensor element types (`dtype`), the items the local
//! cache holds and the files of a batch (`item`), and small checked files kept between mounts
//! (`kept`).

pub mod dtype;
pub(crate) mod item;
pub(crate) mod kept;
pub mod mix;
pub mod partitions;
pub mod plan;
