//! The order of an epoch: each partition's rows as the shuffle mode orders them, and the
//! rows, row groups and windows of a batch under it.

use super::starts::Starts;
use super::{Plan, Shuffle, Stride};
use crate::model::permutation::{Permutation, below, rng};
use std::ops::Range;

impl Plan {
    /// The per-epoch state the order needs (each partition's shuffled row groups), computed
    /// once per epoch.
    pub fn epoch(&self, epoch: u64) -> EpochOrder {
        if let Some(m) = &self.mix {
            // Each pass over a source in an order of its own: pass k of epoch e is the
            // member's epoch e × passes + k.
            let passes = (m.members.iter())
                .map(|member| {
                    let n = member.passes();
                    (0..n).map(|k| member.plan.epoch(epoch * n + k)).collect()
                })
                .collect();
            return EpochOrder {
                epoch,
                parts: Vec::new(),
                passes,
            };
        }
        let parts = (0..self.opts.partitions)
            .map(|p| self.partition_order(epoch, p))
            .collect();
        EpochOrder {
            epoch,
            parts,
            passes: Vec::new(),
        }
    }

    pub(super) fn partition_order(&self, epoch: u64, p: u64) -> Order {
        let part = &self.parts[p as usize];
        match self.opts.shuffle {
            Shuffle::None => Order::Canonical,
            Shuffle::Global => Order::Global(Permutation::new(
                part.len(),
                &mut rng(self.opts.seed, epoch, p, 0),
            )),
            Shuffle::Window | Shuffle::Block => {
                let segs = &part.segments;
                let mut order: Vec<usize> = (0..segs.len()).collect();
                let mut r = rng(self.opts.seed, epoch, p, 0);
                for i in (1..order.len()).rev() {
                    let j = below(&mut r, i as u64 + 1) as usize;
                    order.swap(i, j);
                }
                let mut start = Vec::with_capacity(order.len() + 1);
                let mut pos = 0;
                start.push(0);
                for &s in &order {
                    let range = &segs[s].1;
                    pos += range.end - range.start;
                    start.push(pos);
                }
                let windows = match self.opts.shuffle {
                    Shuffle::Window => {
                        let k = self.opts.window as usize;
                        (0..=order.len().div_ceil(k))
                            .map(|w| start[(w * k).min(order.len())])
                            .collect()
                    }
                    _ => {
                        // Blocks of equal size, none over `block` rows.
                        let len = part.len();
                        let m = len.div_ceil(self.opts.block).max(1);
                        (0..=m)
                            .map(|w| (w as u128 * len as u128 / m as u128) as u64)
                            .collect()
                    }
                };
                let mut slot_of = vec![0; order.len()];
                for (slot, &s) in order.iter().enumerate() {
                    slot_of[s] = slot;
                }
                Order::Window {
                    segs: order,
                    start: Starts::new(start),
                    windows,
                    slot_of,
                }
            }
        }
    }

    /// Where epoch position `pos` lies: (partition, position in the partition's order).
    pub(super) fn partition_position(&self, pos: u64) -> (usize, u64) {
        let bs = self.opts.batch_size;
        let parts = self.opts.partitions;
        let (i, in_batch) = (pos / bs, pos % bs);
        if i < self.single_partition_batches() {
            ((i % parts) as usize, (i / parts) * bs + in_batch)
        } else {
            let left = pos - self.single_partition_batches() * bs;
            let p = self.leftover_start.partition_point(|&s| s <= left) - 1;
            (p, self.per_partition * bs + left - self.leftover_start[p])
        }
    }

    /// The canonical rows of batch `i`, in batch order.
    pub fn batch_rows(&self, order: &EpochOrder, i: u64) -> Vec<u64> {
        let first = i * self.opts.batch_size;
        // A batch's positions are a run of one partition's order (a leftover batch's, a run of
        // each partition it meets), found once for the run rather than by four divisions a
        // row. Under the shuffles every row is a position permuted, many at once (see
        // `Permutation::apply_all`): this and the gather are most of the CPU of an epoch built
        // from cached columns.
        let runs = self.partition_runs(first..first + self.batch_len(i));
        let mut rows = (runs.into_iter()).map(|(p, xs)| match &self.mix {
            Some(m) => self.mixed_rows(m, order, p, xs),
            None => self.partition_rows(order, p, xs),
        });
        // A batch is one run but for leftovers: its rows as computed, not collected again
        // into a vector grown as it fills.
        let mut all = rows.next().unwrap_or_default();
        for more in rows {
            all.extend(more);
        }
        all
    }

    /// The canonical rows at `positions` of partition `p`'s order.
    pub(super) fn partition_rows(
        &self,
        order: &EpochOrder,
        p: usize,
        positions: Range<u64>,
    ) -> Vec<u64> {
        let len = positions.end - positions.start;
        let part = &self.parts[p];
        match &order.parts[p] {
            Order::Global(perm) => {
                let mut rows: Vec<u64> = positions.collect();
                perm.apply_all(&mut rows);
                rows.iter_mut().for_each(|r| *r = part.row(*r));
                rows
            }
            Order::Window {
                segs,
                start,
                windows,
                ..
            } => {
                // A window at a time: its positions permuted many at once, as under `global`
                // (the rows of a window-shuffled batch were a tenth of its build, one position
                // and two searches at a time), then each found in its segment.
                let mut rows: Vec<u64> = Vec::with_capacity(len as usize);
                let mut x = positions.start;
                while x < positions.end {
                    let w = window_of(windows, x);
                    let (base, stop) = (windows[w], windows[w + 1].min(positions.end));
                    let perm = self.window_permutation(order.epoch, p, windows, w);
                    let first = rows.len();
                    rows.extend(x - base..stop - base);
                    perm.apply_all(&mut rows[first..]);
                    for r in &mut rows[first..] {
                        *r = self.segment_row(p, segs, start, base + *r);
                    }
                    x = stop;
                }
                rows
            }
            Order::Canonical => positions.map(|x| part.row(x)).collect(),
        }
    }

    /// The row groups batch `i` may draw from, sorted: each shuffle window the batch meets
    /// counts whole (a superset, computed per window rather than per row, which is what the
    /// prefetcher needs to decode ahead: the window's other rows are read by the next batches).
    /// Under `shuffle=global`, a partition of more row groups than the batch has rows gives
    /// its rows' own row groups, one lookup a row, rather than all of them.
    pub(crate) fn batch_row_groups(&self, order: &EpochOrder, i: u64) -> Vec<usize> {
        let first = i * self.opts.batch_size;
        let end = first + self.batch_len(i);
        let mut out = std::collections::BTreeSet::new();
        for (p, xs) in self.partition_runs(first..end) {
            let Some(m) = &self.mix else {
                self.partition_row_groups_at(order, p, xs, &mut out);
                continue;
            };
            for (s, pass, span) in m.spans(order.epoch, p, xs) {
                let member = &m.members[s];
                let mut groups = std::collections::BTreeSet::new();
                let orders = &order.passes[s][pass as usize];
                member
                    .plan
                    .partition_row_groups_at(orders, p, span, &mut groups);
                out.extend(groups.into_iter().map(|g| g + member.rg_offset));
            }
        }
        out.into_iter().collect()
    }

    /// Epoch positions as runs of consecutive positions of one partition's order: (partition,
    /// positions in its order).
    pub(super) fn partition_runs(&self, positions: Range<u64>) -> Vec<(usize, Range<u64>)> {
        let bs = self.opts.batch_size;
        let leftovers = self.single_partition_batches() * bs;
        let mut out = Vec::new();
        let mut pos = positions.start;
        while pos < positions.end {
            let (p, x) = self.partition_position(pos);
            // A single-partition batch is consecutive positions of its partition; the leftover
            // rows are each partition's in turn.
            let stop = match pos < leftovers {
                true => ((pos / bs + 1) * bs).min(leftovers),
                false => leftovers + self.leftover_start[p + 1],
            };
            let stop = stop.min(positions.end);
            out.push((p, x..x + (stop - pos)));
            pos = stop;
        }
        out
    }

    /// Adds the row groups that positions `xs` of partition `p`'s order may draw from.
    pub(super) fn partition_row_groups_at(
        &self,
        order: &EpochOrder,
        p: usize,
        xs: Range<u64>,
        out: &mut std::collections::BTreeSet<usize>,
    ) {
        let part = &self.parts[p];
        let mut x = xs.start;
        while x < xs.end {
            // Positions x.. of partition p that one look covers.
            let run = match &order.parts[p] {
                Order::Canonical => {
                    let s = part.segment_at(x);
                    out.insert(part.segments[s].0);
                    part.seg_pos[s + 1] - x
                }
                Order::Global(perm) if part.segments.len() as u64 > xs.end - x => {
                    out.insert(self.locate(part.row(perm.apply(x))).0);
                    1
                }
                Order::Global(_) => {
                    out.extend(part.segments.iter().map(|(g, _)| *g));
                    u64::MAX
                }
                Order::Window {
                    segs,
                    start,
                    windows,
                    ..
                } => {
                    let w = window_of(windows, x);
                    let slots = window_slots(start, windows, w);
                    out.extend(segs[slots].iter().map(|&s| part.segments[s].0));
                    windows[w + 1] - x
                }
            };
            x = x.saturating_add(run).min(xs.end);
        }
    }

    /// The windows (partition, window) that batch `i`'s rows lie in under `shuffle=block`, for
    /// the prefetcher to decode a block's row groups once rather than per batch.
    pub(crate) fn batch_blocks(&self, order: &EpochOrder, i: u64) -> Vec<(usize, usize)> {
        let first = i * self.opts.batch_size;
        let mut out: Vec<(usize, usize)> = Vec::new();
        for (p, xs) in self.partition_runs(first..first + self.batch_len(i)) {
            let Some(m) = &self.mix else {
                push_windows(&order.parts[p], p, xs, &mut out);
                continue;
            };
            // A mixture's windows are those of each source's order in each pass, numbered
            // as `SourcePlans::order_key` says.
            for (s, pass, span) in m.spans(order.epoch, p, xs) {
                let orders = &order.passes[s][pass as usize];
                push_windows(&orders.parts[p], m.order_key(s, pass, p), span, &mut out);
            }
        }
        out
    }

    /// How many windows partition `p`'s order has (a mixture's: the order `p` names, see
    /// [`Plan::batch_blocks`]).
    pub(crate) fn windows_in(&self, order: &EpochOrder, p: usize) -> usize {
        if let Some(m) = &self.mix {
            let (s, pass, p) = m.of_order_key(p);
            return m.members[s].plan.windows_in(&order.passes[s][pass], p);
        }
        match &order.parts[p] {
            Order::Window { windows, .. } => windows.len() - 1,
            _ => 1,
        }
    }

    /// The row groups of window `w` of partition `p`'s order (a mixture's: of the order `p`
    /// names).
    pub(crate) fn window_row_groups(&self, order: &EpochOrder, p: usize, w: usize) -> Vec<usize> {
        if let Some(m) = &self.mix {
            let (s, pass, p) = m.of_order_key(p);
            let member = &m.members[s];
            let groups = member.plan.window_row_groups(&order.passes[s][pass], p, w);
            return groups.into_iter().map(|g| g + member.rg_offset).collect();
        }
        let part = &self.parts[p];
        match &order.parts[p] {
            Order::Window {
                segs,
                start,
                windows,
                ..
            } => segs[window_slots(start, windows, w)]
                .iter()
                .map(|&s| part.segments[s].0)
                .collect(),
            _ => part.segments.iter().map(|(g, _)| *g).collect(),
        }
    }

    /// The canonical row at position `x` of partition `p`'s order, one position alone: the
    /// reference [`Plan::partition_rows`] is checked against. `last` keeps the window
    /// permutation met last.
    #[cfg(test)]
    pub(super) fn partition_row(
        &self,
        order: &EpochOrder,
        p: usize,
        x: u64,
        last: &mut Option<((usize, usize), Permutation)>,
    ) -> u64 {
        let part = &self.parts[p];
        match &order.parts[p] {
            Order::Canonical => part.row(x),
            Order::Global(perm) => part.row(perm.apply(x)),
            Order::Window {
                segs,
                start,
                windows,
                ..
            } => {
                let w = window_of(windows, x);
                let base = windows[w];
                if last.as_ref().is_none_or(|(key, _)| *key != (p, w)) {
                    *last = Some(((p, w), self.window_permutation(order.epoch, p, windows, w)));
                }
                let (_, perm) = last.as_ref().expect("set above");
                self.segment_row(p, segs, start, base + perm.apply(x - base))
            }
        }
    }

    /// The permutation of window `w` (of `windows`, partition `p`'s) in epoch `epoch`.
    pub(super) fn window_permutation(
        &self,
        epoch: u64,
        p: usize,
        windows: &[u64],
        w: usize,
    ) -> Permutation {
        let rng = &mut rng(self.opts.seed, epoch, p as u64, w as u64 + 1);
        Permutation::new(windows[w + 1] - windows[w], rng)
    }

    /// The canonical row at `shuffled`, a position of partition `p`'s segments in their
    /// shuffled order `segs` (starting at positions `start`).
    pub(super) fn segment_row(
        &self,
        p: usize,
        segs: &[usize],
        start: &Starts,
        shuffled: u64,
    ) -> u64 {
        let slot = start.piece(shuffled);
        self.parts[p].segments[segs[slot]].1.start + (shuffled - start[slot])
    }

    /// The batches of the epoch that may need rows of row group `rg`: the cache uses it to know
    /// when a row group is needed next.
    pub(crate) fn row_group_batches(&self, order: &EpochOrder, rg: usize) -> Vec<Stride> {
        if let Some(m) = &self.mix {
            return self.mixed_row_group_batches(m, order, rg);
        }
        let mut out = Vec::new();
        for (p, span) in self.row_group_spans(order, rg) {
            self.partition_span_batches(p, span, &mut out);
        }
        out
    }

    /// Adds the batches that positions `span` of partition `p`'s order are in.
    pub(super) fn partition_span_batches(&self, p: usize, span: Range<u64>, out: &mut Vec<Stride>) {
        let bs = self.opts.batch_size;
        let parts = self.opts.partitions;
        let single_rows = self.per_partition * bs;
        let batches = self.batches();
        if span.start < single_rows {
            let (k0, k1) = (span.start / bs, (span.end.min(single_rows) - 1) / bs);
            out.push(Stride {
                first: k0 * parts + p as u64,
                step: parts,
                count: k1 - k0 + 1,
            });
        }
        if span.end > single_rows {
            let at = self.single_partition_batches() * bs + self.leftover_start[p];
            let (a, b) = (
                at + span.start.max(single_rows) - single_rows,
                at + span.end - single_rows,
            );
            let (first, last) = (a / bs, ((b - 1) / bs).min(batches.saturating_sub(1)));
            if first <= last && first < batches {
                out.push(Stride {
                    first,
                    step: 1,
                    count: last - first + 1,
                });
            }
        }
    }

    /// The positions of each partition's order where row group `rg`'s rows may be, as
    /// (partition, positions), none empty.
    pub(super) fn row_group_spans(
        &self,
        order: &EpochOrder,
        rg: usize,
    ) -> Vec<(usize, Range<u64>)> {
        let mut out = Vec::new();
        // Only the pieces of the row group: the eviction asks this for every cached row group,
        // and a scan of every segment made that quadratic in the row groups.
        let pieces = &self.rg_pieces[self.rg_piece_start[rg]..self.rg_piece_start[rg + 1]];
        for &(p, s) in pieces {
            let part = &self.parts[p];
            let rows = &part.segments[s].1;
            if rows.is_empty() {
                continue;
            }
            // Positions of the partition's order where the segment's rows may be.
            let span = match &order.parts[p] {
                Order::Canonical => part.seg_pos[s]..part.seg_pos[s + 1],
                Order::Global(_) => 0..part.len(),
                Order::Window {
                    start,
                    windows,
                    slot_of,
                    ..
                } => {
                    let slot = slot_of[s];
                    let w0 = window_of(windows, start[slot]);
                    let w1 = window_of(windows, start[slot + 1] - 1);
                    windows[w0]..windows[w1 + 1]
                }
            };
            if !span.is_empty() {
                out.push((p, span));
            }
        }
        out
    }
}

/// Adds to `out` the windows (keyed `key`) of `order` that positions `xs` lie in, each once.
pub(super) fn push_windows(
    order: &Order,
    key: usize,
    xs: Range<u64>,
    out: &mut Vec<(usize, usize)>,
) {
    if let Order::Window { windows, .. } = order
        && !xs.is_empty()
    {
        let (w0, w1) = (window_of(windows, xs.start), window_of(windows, xs.end - 1));
        for w in w0..=w1 {
            if !out.contains(&(key, w)) {
                out.push((key, w));
            }
        }
    }
}

/// The slots (of a shuffled order's segments, starting at positions `start`) that hold rows of
/// window `w` of `windows`.
pub(super) fn window_slots(start: &[u64], windows: &[u64], w: usize) -> Range<usize> {
    let slots = start.len() - 1;
    let (a, b) = (windows[w], windows[w + 1]);
    let first = (start.partition_point(|&s| s <= a).max(1) - 1).min(slots);
    let end = start.partition_point(|&s| s < b).min(slots);
    first..end.max(first)
}

/// The plan with the orders of the epochs in use, each computed once (an epoch's order holds a
/// shuffle of its row groups).
pub(crate) struct Orders {
    plan: Plan,
    epochs: std::sync::Mutex<lru::LruCache<u64, std::sync::Arc<EpochOrder>>>,
}

impl Orders {
    pub(crate) fn new(plan: Plan) -> Orders {
        Orders {
            plan,
            epochs: std::sync::Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(8).expect("nonzero"),
            )),
        }
    }

    pub(crate) fn plan(&self) -> &Plan {
        &self.plan
    }

    pub(crate) fn epoch(&self, epoch: u64) -> std::sync::Arc<EpochOrder> {
        let mut epochs = self.epochs.lock().unwrap();
        epochs
            .get_or_insert(epoch, || std::sync::Arc::new(self.plan.epoch(epoch)))
            .clone()
    }
}

/// What an epoch's order needs beyond the plan: each partition's order.
#[derive(Clone, Debug)]
pub struct EpochOrder {
    pub(super) epoch: u64,
    pub(super) parts: Vec<Order>,
    /// A mixture's: each source's order in each of its passes.
    pub(super) passes: Vec<Vec<EpochOrder>>,
}

#[derive(Clone, Debug)]
pub(super) enum Order {
    Canonical,
    Global(Permutation),
    /// The partition's segments in shuffled order, the position where each starts, and where
    /// each window starts (each list with one more entry: the end).
    Window {
        segs: Vec<usize>,
        start: Starts,
        windows: Vec<u64>,
        /// Each segment's place in `segs`.
        slot_of: Vec<usize>,
    },
}

/// The window holding position `x`: the last starting at or before it (empty windows start
/// where their successor does).
pub(super) fn window_of(windows: &[u64], x: u64) -> usize {
    windows.partition_point(|&s| s <= x) - 1
}
