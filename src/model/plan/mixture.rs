//! A plan of several sources: each ordered by a plan of its own, drawn in its share of every
//! partition ([`crate::model::mix`]), pass after pass, and merged into the mixture's batches.

use super::order::EpochOrder;
use super::{OrderOptions, PartitionRows, Plan, Shuffle, Stride, row_group_starts};
use crate::model::mix::Merge;
use crate::model::partitions::PlanFile;
use crate::model::permutation::mix;
use std::ops::Range;

/// The sources of a mixture and their draws.
#[derive(Clone, Debug)]
pub(super) struct SourcePlans {
    pub(super) members: Vec<SourcePlan>,
    /// Each partition's draws, merged.
    pub(super) merges: Vec<Merge>,
}

/// One source of a mixture.
#[derive(Clone, Debug)]
pub(super) struct SourcePlan {
    /// Its rows' order, as if it were mounted alone (its own seed).
    pub(super) plan: Plan,
    /// Its rows drawn an epoch from each partition.
    pub(super) drawn: Vec<u64>,
    /// Where its rows and row groups start in the mixture's canonical order.
    pub(super) row_offset: u64,
    pub(super) rg_offset: usize,
}

impl SourcePlans {
    /// The number that names partition `p` of source `s`'s order in pass `pass`: the orders
    /// counted source by source, pass by pass, partition by partition.
    pub(super) fn order_key(&self, s: usize, pass: u64, p: usize) -> usize {
        let parts = self.merges.len();
        let before: u64 = self.members[..s].iter().map(SourcePlan::passes).sum();
        (before + pass) as usize * parts + p
    }

    /// (source, pass, partition) of an [`SourcePlans::order_key`].
    pub(super) fn of_order_key(&self, key: usize) -> (usize, usize, usize) {
        let parts = self.merges.len();
        let (mut order, p) = (key / parts, key % parts);
        for (s, member) in self.members.iter().enumerate() {
            let passes = member.passes() as usize;
            if order < passes {
                return (s, order, p);
            }
            order -= passes;
        }
        unreachable!("an order key of this mixture")
    }

    /// The stretches of the sources' orders that positions `positions` of partition `p`'s
    /// draws are, as (source, pass, positions of that pass's order of partition `p`).
    pub(super) fn spans(
        &self,
        epoch: u64,
        p: usize,
        positions: Range<u64>,
    ) -> Vec<(usize, u64, Range<u64>)> {
        let merge = &self.merges[p];
        let (from, to) = (
            merge.counts_before(positions.start),
            merge.counts_before(positions.end),
        );
        let mut out = Vec::new();
        for (s, member) in self.members.iter().enumerate() {
            let rows = member.rows(p);
            let mut j = from[s];
            while j < to[s] {
                // Up to the end of this pass, or of the draw.
                let pass_end = ((j / rows + 1) * rows).min(to[s]);
                let (pass, x) = member.place(epoch, p, j);
                // A pass that starts elsewhere (`shuffle=none`, cut short) wraps at its end.
                let run = (pass_end - j).min(rows - x);
                out.push((s, pass, x..x + run));
                j += run;
            }
        }
        out
    }
}

impl SourcePlan {
    /// Rows of partition `p`.
    pub(super) fn rows(&self, p: usize) -> u64 {
        self.plan.partition_len(p as u64)
    }

    /// Whether some partition's draw is not a whole number of passes over it.
    pub(super) fn drawn_anew(&self) -> bool {
        (self.drawn.iter().enumerate()).any(|(p, &n)| n % self.rows(p).max(1) != 0)
    }

    /// Passes over a partition an epoch, at most: the last cut short where the draw is not a
    /// multiple of its rows.
    pub(super) fn passes(&self) -> u64 {
        (self.drawn.iter().enumerate())
            .map(|(p, &n)| n.div_ceil(self.rows(p).max(1)))
            .max()
            .unwrap_or(0)
    }

    /// Where item `j` of partition `p`'s draw is: (pass, position in that pass's order).
    /// Under `shuffle=none` the pass cut short starts where the last epoch's stopped, so a
    /// source drawn down shows other rows each epoch as under the shuffles.
    pub(super) fn place(&self, epoch: u64, p: usize, j: u64) -> (u64, u64) {
        let (rows, drawn) = (self.rows(p), self.drawn[p]);
        let (pass, x) = (j / rows, j % rows);
        let cut = drawn % rows;
        if self.plan.opts.shuffle == Shuffle::None && cut != 0 && pass == drawn / rows {
            let start = ((epoch as u128 * cut as u128) % rows as u128) as u64;
            return (pass, (start + x) % rows);
        }
        (pass, x)
    }

    /// The items of partition `p`'s draw (runs of them) that positions `span` of pass
    /// `pass`'s order are: the inverse of [`SourcePlan::place`].
    pub(super) fn items_at(
        &self,
        epoch: u64,
        p: usize,
        pass: u64,
        span: Range<u64>,
    ) -> Vec<Range<u64>> {
        let (rows, drawn) = (self.rows(p), self.drawn[p]);
        let base = pass * rows;
        if base >= drawn {
            return Vec::new();
        }
        let taken = (drawn - base).min(rows);
        let (_, start) = self.place(epoch, p, base);
        let mut out = Vec::new();
        // Positions start.. hold items base.., wrapping at the order's end.
        let pieces = [(start..rows, base), (0..start, base + (rows - start))];
        for (at, first) in pieces {
            let (a, b) = (span.start.max(at.start), span.end.min(at.end));
            if a >= b {
                continue;
            }
            let (j0, j1) = (first + (a - at.start), first + (b - at.start));
            let j1 = j1.min(base + taken);
            if j0 < j1 {
                out.push(j0..j1);
            }
        }
        out
    }
}

impl Plan {
    /// The plan of a mixture: `sources` (each one's files, and its rows drawn an epoch), each
    /// ordered by its own plan under these options and a seed of its own. Partition `p` of the
    /// mixture is partition `p` of every source, each drawn in proportion to its rows there, so
    /// a host reading its partitions fetches its share of every source.
    pub fn mixed(sources: &[(Vec<PlanFile>, u64)], opts: OrderOptions) -> Plan {
        let all: Vec<PlanFile> = sources.iter().flat_map(|(f, _)| f.clone()).collect();
        let rg_start = row_group_starts(&all);
        let parts_n = opts.partitions as usize;
        let (mut row_offset, mut rg_offset) = (0, 0);
        let mut segments: Vec<Vec<(usize, Range<u64>)>> = vec![Vec::new(); parts_n];
        let members: Vec<SourcePlan> =
            (sources.iter().enumerate())
                .map(|(s, (files, drawn))| {
                    let own = OrderOptions {
                        seed: mix(opts.seed ^ mix(s as u64 + 1)),
                        ..opts
                    };
                    let plan = Plan::new(files, own);
                    for (p, part) in plan.parts.iter().enumerate() {
                        segments[p].extend(part.segments.iter().map(|(g, r)| {
                            (g + rg_offset, r.start + row_offset..r.end + row_offset)
                        }));
                    }
                    let lens: Vec<f64> = (0..own.partitions)
                        .map(|p| plan.partition_len(p) as f64)
                        .collect();
                    let drawn = match lens.iter().sum::<f64>() > 0.0 {
                        true => crate::model::mix::apportion(*drawn, &lens),
                        false => vec![0; parts_n],
                    };
                    let member = SourcePlan {
                        drawn,
                        row_offset,
                        rg_offset,
                        plan,
                    };
                    row_offset += member.plan.rows();
                    rg_offset += member.plan.row_groups();
                    member
                })
                .collect();
        let merges: Vec<Merge> = (0..parts_n)
            .map(|p| Merge::new(members.iter().map(|m| m.drawn[p]).collect()))
            .collect();
        let lens: Vec<u64> = merges.iter().map(Merge::len).collect();
        let whole = members.iter().all(|m| m.plan.whole_objects);
        let parts = segments.into_iter().map(PartitionRows::new).collect();
        let mut plan = Plan::from_parts(rg_start, parts, &lens, whole, opts);
        plan.mix = Some(Box::new(SourcePlans { members, merges }));
        plan
    }

    /// A mixture's batch rows at positions `positions` of partition `p`'s draws, in order.
    pub(super) fn mixed_rows(
        &self,
        m: &SourcePlans,
        order: &EpochOrder,
        p: usize,
        positions: Range<u64>,
    ) -> Vec<u64> {
        // Each source's rows in draw order, then taken in the merged order.
        let mut rows: Vec<Vec<u64>> = vec![Vec::new(); m.members.len()];
        for (s, pass, span) in m.spans(order.epoch, p, positions.clone()) {
            let member = &m.members[s];
            let found = (member.plan).partition_rows(&order.passes[s][pass as usize], p, span);
            rows[s].extend(found.into_iter().map(|r| r + member.row_offset));
        }
        let mut drawn: Vec<std::vec::IntoIter<u64>> =
            rows.into_iter().map(Vec::into_iter).collect();
        (m.merges[p].items(positions).into_iter())
            .map(|(s, _)| drawn[s].next().expect("a row for each item"))
            .collect()
    }

    /// A mixture's batches that may need row group `rg`.
    pub(super) fn mixed_row_group_batches(
        &self,
        m: &SourcePlans,
        order: &EpochOrder,
        rg: usize,
    ) -> Vec<Stride> {
        let owns = |member: &SourcePlan| {
            (member.rg_offset..member.rg_offset + member.plan.row_groups()).contains(&rg)
        };
        let Some(s) = m.members.iter().position(owns) else {
            return Vec::new();
        };
        let member = &m.members[s];
        let mut out = Vec::new();
        for (pass, orders) in order.passes[s].iter().enumerate() {
            for (p, span) in member.plan.row_group_spans(orders, rg - member.rg_offset) {
                for items in member.items_at(order.epoch, p, pass as u64, span) {
                    let merge = &m.merges[p];
                    let (a, b) = (
                        merge.position(s, items.start),
                        merge.position(s, items.end - 1),
                    );
                    self.partition_span_batches(p, a..b + 1, &mut out);
                }
            }
        }
        out
    }
}
