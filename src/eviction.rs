//! What the cache evicts first: the item the plan needs furthest ahead of the readers (Belady's
//! rule, which the plan makes possible: it knows which batches and row groups every coming
//! batch needs), not merely the one used longest ago.

use crate::cache::DiskCache;
use crate::layout::Item;
use crate::plan::{Orders, Stride};
use crate::readers::Readers;
use std::sync::Arc;

pub struct Eviction {
    orders: Arc<Orders>,
    readers: Arc<Readers>,
    cache: Arc<DiskCache>,
}

impl Eviction {
    pub fn new(orders: Arc<Orders>, readers: Arc<Readers>, cache: Arc<DiskCache>) -> Eviction {
        Eviction {
            orders,
            readers,
            cache,
        }
    }

    /// How far ahead of the readers an item is next needed, in rows (`u64::MAX`: never).
    pub fn distance_fn(&self) -> Box<dyn Fn(Item) -> u64 + Send + Sync> {
        let (epoch, batch) = self.readers.now();
        let orders = self.orders.clone();
        let plan = orders.plan();
        let per_epoch = plan.epoch_rows().max(1);
        let bs = plan.options().batch_size;
        // Saturating: an epoch number far past any job's (up to 2^63 - 1) still orders right.
        let rows_before = move |e: u64, i: u64| e.saturating_mul(per_epoch).saturating_add(i * bs);
        let now = rows_before(epoch, batch);
        let (this, next) = (self.orders.epoch(epoch), self.orders.epoch(epoch + 1));
        let cache = self.cache.clone();
        let repeat = plan.epochs_repeat();
        // A row group is needed again by the first batch that may draw from it, from here on,
        // that is not in the cache yet; after that, by the next epoch.
        let needed_in = move |strides: Vec<Stride>, from: u64| -> Option<u64> {
            strides
                .iter()
                .filter_map(|s| {
                    let mut members = s.from(from);
                    if s.count > 64 {
                        // A set that large (shuffle=global) is needed by every batch alike.
                        return members.next();
                    }
                    members.find(|&b| !cache.has_batch(epoch, b))
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
                let (e, i) = item.batch().expect("a batch item");
                if repeat {
                    // Every epoch reads it again: it is needed when the readers come round.
                    (i * bs + per_epoch - batch * bs % per_epoch) % per_epoch
                } else {
                    rows_before(e, i).checked_sub(now).unwrap_or(u64::MAX)
                }
            }
        })
    }
}
