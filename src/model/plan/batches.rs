//! Batches as the engine names them: one batch of the plan, and the directories of batches a
//! mount shows (an epoch, a rank's view of one).

use super::Plan;

/// The directories that are one another's next epochs, as one reader goes from epoch to
/// epoch: the epochs' (`None`), or one rank's views (its rank and world size).
pub(crate) type Chain = Option<(u64, u64)>;

/// One batch of the plan as the engine builds, keeps and names it: global batch `index` of the
/// epoch whose batches it shares ([`Plan::same_as`]: epoch 0's where epochs repeat). Made from
/// a request's epoch by [`Plan::batch`] or [`Plan::batch_in`], once, so that every memo, cache
/// item and file of an epoch that repeats another is the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BatchRef {
    pub(super) epoch: u64,
    pub(super) index: u64,
}

impl BatchRef {
    /// The batch named by a cache item, whose epoch is already the one it shares (items are
    /// made from a `BatchRef`).
    pub(crate) fn of_item(epoch: u64, index: u64) -> BatchRef {
        BatchRef { epoch, index }
    }

    /// The epoch whose batch this is (the one it shares).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The batch's global index in its epoch.
    pub(crate) fn index(&self) -> u64 {
        self.index
    }
}

impl std::fmt::Display for BatchRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} batch {}", self.epoch, self.index)
    }
}

/// A directory of batches: an epoch, or a rank's view of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Batches {
    Epoch(u64),
    Rank { epoch: u64, rank: u64, world: u64 },
}

impl Batches {
    /// The (epoch, global batch) that batch `j` of this directory is: rank `rank` of `world`
    /// reads global batches rank, rank + world, … ([`Plan::rank_batches`] of them).
    pub(crate) fn global(&self, j: u64) -> (u64, u64) {
        match *self {
            Batches::Epoch(e) => (e, j),
            Batches::Rank { epoch, rank, world } => (epoch, rank + j * world),
        }
    }

    /// The directories this one is an epoch of.
    pub(crate) fn chain(&self) -> Chain {
        match *self {
            Batches::Epoch(_) => None,
            Batches::Rank { rank, world, .. } => Some((rank, world)),
        }
    }

    /// The same directory in the next epoch.
    pub(crate) fn next_epoch(&self) -> Batches {
        match *self {
            Batches::Epoch(e) => Batches::Epoch(e + 1),
            Batches::Rank { epoch, rank, world } => Batches::Rank {
                epoch: epoch + 1,
                rank,
                world,
            },
        }
    }
}

impl Plan {
    /// Batches in a directory.
    pub(crate) fn count(&self, b: Batches) -> u64 {
        match b {
            Batches::Epoch(_) => self.batches(),
            Batches::Rank { world, .. } => self.rank_batches(world),
        }
    }

    /// Rows of a directory's batches back to back: all full but the epoch's last batch, which
    /// a directory holds, if at all, as its own last.
    pub(crate) fn dir_rows(&self, b: Batches) -> u64 {
        match self.count(b) {
            0 => 0,
            n => (n - 1) * self.opts.batch_size + self.batch_len(b.global(n - 1).1),
        }
    }
}
