//! What the read path and the cache both name: which file of a batch ([`FileKind`]), and the
//! items the local cache may hold ([`Item`]). Their names on disk are the read path's layout
//! (`read::layout`), which the cache reaches through [`ItemNames`].

use crate::model::plan::{BatchRef, Batches};
use std::path::PathBuf;

/// Which file of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum FileKind {
    /// `NNNNNN.safetensors`: every tensor.
    Safetensors,
    /// `NNNNNN/NAME.npy`: tensor `t`.
    Npy(usize),
}

/// A file the local cache may hold: a row group's decoded columns, a batch file, or a
/// directory's one-open file built ahead (`read::produce::ahead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Item {
    Columns {
        rg: usize,
    },
    /// File `kind` of batch `batch` of epoch `epoch` (as the plan repeats it).
    Batch {
        epoch: u64,
        batch: u64,
        kind: FileKind,
    },
    /// `all.safetensors` or `all/NAME.npy` of a directory (with its epoch as the plan repeats
    /// it).
    All {
        dir: Batches,
        kind: FileKind,
    },
}

impl Item {
    /// The item of file `kind` of batch `b`.
    pub(crate) fn of(kind: FileKind, b: BatchRef) -> Item {
        Item::Batch {
            epoch: b.epoch(),
            batch: b.index(),
            kind,
        }
    }

    /// The batch of a batch file.
    pub(crate) fn batch(&self) -> Option<BatchRef> {
        match *self {
            Item::Columns { .. } | Item::All { .. } => None,
            Item::Batch { epoch, batch, .. } => Some(BatchRef::of_item(epoch, batch)),
        }
    }

    /// The file of its batch it is.
    pub(crate) fn kind(&self) -> Option<FileKind> {
        match *self {
            Item::Columns { .. } | Item::All { .. } => None,
            Item::Batch { kind, .. } => Some(kind),
        }
    }
}

/// Names of items under the cache's directory of batch files: the same names a mount shows its
/// files by, so that the kernel can pass reads through to them. The read path's layout
/// implements it; the cache asks it.
pub(crate) trait ItemNames: Send + Sync {
    /// Where `item` (a batch file, or a kept one-open file) lies under the batch directory.
    fn item_path(&self, item: Item) -> PathBuf;
    /// The batch file `name` of epoch `epoch` is, in the epoch's directory (`batch_dir` None)
    /// or in a batch's directory of per-tensor files.
    fn parse_batch_file(&self, epoch: u64, batch_dir: Option<&str>, name: &str) -> Option<Item>;
    /// The kept one-open file a name in the [`ItemNames::kept_all`] directory is.
    fn parse_all_name(&self, name: &str) -> Option<Item>;
    /// The epoch an epoch directory's name is.
    fn parse_epoch(&self, name: &str) -> Option<u64>;
    /// The directory of one-open files kept between mounts.
    fn kept_all(&self) -> &'static str;
}
