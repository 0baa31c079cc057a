//! What the cache evicts first: the item the plan needs furthest ahead of the readers (Belady's
//! rule, which the plan makes possible: it knows which batches and row groups every coming
//! batch needs), not merely the one used longest ago.

use crate::cache::DiskCache;
use crate::model::item::Item;
use crate::model::plan::{BatchRef, Orders, Stride};
use crate::read::readers::Readers;
use std::sync::Arc;

pub(crate) struct Eviction {
    orders: Arc<Orders>,
    readers: Arc<Readers>,
    cache: Arc<DiskCache>,
}

impl Eviction {
    pub(crate) fn new(
        orders: Arc<Orders>,
        readers: Arc<Readers>,
        cache: Arc<DiskCache>,
    ) -> Eviction {
        Eviction {
            orders,
            readers,
            cache,
        }
    }

    /// How far ahead of the readers an item is next needed, in rows (`u64::MAX`: never): of
    /// every reader still reading ([`Readers::reading`]), the nearest.
    pub(crate) fn distance_fn(&self) -> Box<dyn Fn(Item) -> u64 + Send + Sync> {
        let plan = self.orders.plan();
        let reading = self.readers.reading(|dir| plan.count(dir));
        let cache = self.cache.clone();
        distance(&self.orders, &reading, move |b| cache.has_batch(b))
    }
}

/// How far ahead of the nearest of the readers at `reading` (epoch, global batch) an item is
/// next needed, in rows; `has_batch` says which batches the cache holds.
fn distance(
    orders: &Arc<Orders>,
    reading: &[(u64, u64)],
    has_batch: impl Fn(BatchRef) -> bool + Clone + Send + Sync + 'static,
) -> Box<dyn Fn(Item) -> u64 + Send + Sync> {
    let from: Vec<_> = (reading.iter())
        .map(|&(epoch, batch)| from_reader(orders.clone(), epoch, batch, has_batch.clone()))
        .collect();
    Box::new(move |item| from.iter().map(|f| f(item)).min().unwrap_or(u64::MAX))
}

/// How far ahead of one reader at batch `batch` of `epoch` an item is next needed.
fn from_reader(
    orders: Arc<Orders>,
    epoch: u64,
    batch: u64,
    has_batch: impl Fn(BatchRef) -> bool + Send + Sync + 'static,
) -> Box<dyn Fn(Item) -> u64 + Send + Sync> {
    let plan = orders.plan();
    let per_epoch = plan.epoch_rows().max(1);
    let bs = plan.options().batch_size;
    // Saturating: an epoch number far past any job's (up to 2^63 - 1) still orders right.
    let rows_before = move |e: u64, i: u64| e.saturating_mul(per_epoch).saturating_add(i * bs);
    let now = rows_before(epoch, batch);
    let (this, next) = (orders.epoch(epoch), orders.epoch(epoch + 1));
    let repeat = plan.epochs_repeat();
    // A row group is needed again by the first batch that may draw from it, from here on,
    // that is not in the cache yet; after that, by the next epoch.
    let of_epoch = {
        let orders = orders.clone();
        move |b| orders.plan().batch(epoch, b)
    };
    let needed_in = move |strides: Vec<Stride>, from: u64| -> Option<u64> {
        strides
            .iter()
            .filter_map(|s| {
                let mut members = s.from(from);
                if s.count > 64 {
                    // A set that large (shuffle=global) is needed by every batch alike.
                    return members.next();
                }
                members.find(|&b| !has_batch(of_epoch(b)))
            })
            .min()
            .map(|b| (b - from) * bs)
    };
    Box::new(move |item| match item {
        Item::Columns { rg } => {
            let plan = orders.plan();
            let at = batch * bs;
            needed_in(plan.row_group_batches(&this, rg), batch).unwrap_or_else(|| {
                let first = plan
                    .row_group_batches(&next, rg)
                    .iter()
                    .map(|s| s.first)
                    .min();
                first.map_or(u64::MAX, |b| per_epoch - at + b * bs)
            })
        }
        // A one-open file kept: needed from its epoch's start, and through it.
        Item::All { dir, .. } => {
            let e = dir.global(0).0;
            match repeat || e == epoch {
                true => 0,
                false => rows_before(e, 0).checked_sub(now).unwrap_or(u64::MAX),
            }
        }
        _ => {
            let b = item.batch().expect("a batch item");
            let (e, i) = (b.epoch(), b.index());
            if repeat {
                // Every epoch reads it again: it is needed when the readers come round.
                (i * bs + per_epoch - batch * bs % per_epoch) % per_epoch
            } else {
                rows_before(e, i).checked_sub(now).unwrap_or(u64::MAX)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::item::FileKind;
    use crate::model::plan::{OrderOptions, Plan, Shuffle};

    #[test]
    fn with_two_readers_each_item_is_as_near_as_the_nearer_reader_needs_it() {
        // 40 rows in batches of 5: 8 batches an epoch, shuffled per epoch.
        let plan = Plan::of_row_groups(
            &[10, 10, 10, 10],
            OrderOptions {
                batch_size: 5,
                drop_last: false,
                shuffle: Shuffle::Global,
                window: 1,
                block: 1,
                seed: 0,
                partitions: 1,
            },
        );
        let orders = Arc::new(Orders::new(plan));
        let batch = |e, i| Item::of(FileKind::Safetensors, orders.plan().batch(e, i));
        let nothing_cached = |_: BatchRef| false;
        // One reader in epoch 0 at batch 2, another in epoch 1 at batch 5.
        let two = distance(&orders, &[(0, 2), (1, 5)], nothing_cached);
        // Batch 6 of epoch 0: 4 batches ahead of the first (behind the second).
        assert_eq!(two(batch(0, 6)), 20);
        // Batch 7 of epoch 1: 2 batches ahead of the second.
        assert_eq!(two(batch(1, 7)), 10);
        // Batch 3 of epoch 1, which the second has read: the first reads it next epoch.
        assert_eq!(two(batch(1, 3)), 40 - 10 + 15);
        // Behind both readers for good.
        assert_eq!(two(batch(0, 1)), u64::MAX);
        // The order of the readers does not matter.
        let swapped = distance(&orders, &[(1, 5), (0, 2)], nothing_cached);
        for (e, i) in [(0, 1), (0, 6), (1, 3), (1, 7), (2, 0)] {
            assert_eq!(two(batch(e, i)), swapped(batch(e, i)));
        }
        // With the second reader alone (as the one that asked last once was), epoch 0's
        // batches would all go first.
        let one = distance(&orders, &[(1, 5)], nothing_cached);
        assert_eq!(one(batch(0, 6)), u64::MAX);
    }

    #[test]
    fn a_repeated_epoch_finds_the_batch_files_of_the_epoch_it_repeats() {
        // shuffle=none: 40 rows in 4 row groups of 10, batches of 5; row group 0 feeds batches
        // 0 and 1 of every epoch, whose files are epoch 0's.
        let plan = Plan::of_row_groups(
            &[10, 10, 10, 10],
            OrderOptions {
                batch_size: 5,
                drop_last: false,
                shuffle: Shuffle::None,
                window: 1,
                block: 1,
                seed: 0,
                partitions: 1,
            },
        );
        let orders = Arc::new(Orders::new(plan));
        let cached = [orders.plan().batch(0, 0), orders.plan().batch(0, 1)];
        // A reader at the start of epoch 2: batches 0 and 1 are served from their files, so
        // row group 0 is next needed by the next epoch, an epoch (40 rows) away.
        let d = distance(&orders, &[(2, 0)], move |b| cached.contains(&b));
        assert_eq!(d(Item::Columns { rg: 0 }), 40);
        // Row group 1 feeds batches 2 and 3, not cached: needed 2 batches ahead.
        assert_eq!(d(Item::Columns { rg: 1 }), 10);
    }
}
