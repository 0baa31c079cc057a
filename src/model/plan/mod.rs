//! The epoch plan: which rows form batch `i` of epoch `e`.
//!
//! Everything here is a pure function of the objects (their keys and row-group sizes) and the
//! content options, so any batch is computed alone (mid-epoch resumption is opening batch `k`),
//! on any host, with any thread count. Randomness comes from ChaCha20 seeded with (seed, epoch,
//! partition); each window reads its own ChaCha stream, so a window's order is computed without
//! computing the windows before it.
//!
//! Rows are named by their canonical index: files in lexicographic order, row groups and rows
//! in file order.
//!
//! **Partitions.** The rows are split into `partitions` fixed partitions, spread samples of the
//! whole dataset ([`crate::model::partitions`]): the same in every epoch, so a host's cache keeps
//! its share, and stable under appends. Each epoch orders every partition's rows by the shuffle
//! mode inside the partition. Each partition then serves the same number `n` of full batches:
//! batch `i < n × P` is local batch `i / P` of partition `i mod P`. The rows left over (each
//! partition's order past `n × B`, partitions in turn) form the epoch's last batches. With one
//! partition this is the plain epoch: positions map to the partition's order one to one.
//!
//! **Shuffle modes.** `block` (the default) shuffles each partition's row groups and then its
//! rows inside blocks of `block` rows of that sequence, blocks of equal size: MosaicML
//! Streaming's default shuffle (`py1e`) mixes over the same span, and a dataset smaller than a
//! block is shuffled whole. `window` shuffles rows inside windows of `window` row groups (cheap,
//! a few thousand rows: thin slices of the table); `global` permutes each partition whole.
//!
//! **Mixtures.** A plan of several sources ([`Plan::mixed`]) names rows by their canonical index
//! over the sources one after the other, and orders each source by a plan of its own: an epoch
//! draws each source's rows as [`crate::model::mix`] says, every pass over a source in an order
//! of its own, and merges the sources into batches in their shares.

use crate::model::partitions::{self, PlanFile};
use starts::Starts;
use std::ops::Range;

mod batches;
mod mixture;
mod order;
mod starts;
#[cfg(test)]
mod tests;

use crate::model::mix::Merge;
pub(crate) use batches::{BatchRef, Batches, Chain};
use mixture::{SourcePlan, SourcePlans};
pub use order::EpochOrder;
pub(crate) use order::Orders;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shuffle {
    /// Canonical order.
    None,
    /// Row groups shuffled per epoch, then rows shuffled inside windows of row groups.
    Window,
    /// Row groups shuffled per epoch, then rows shuffled inside blocks of rows.
    Block,
    /// A full permutation of all rows per epoch.
    Global,
}

impl Shuffle {
    pub fn name(self) -> &'static str {
        match self {
            Shuffle::None => "none",
            Shuffle::Window => "window",
            Shuffle::Block => "block",
            Shuffle::Global => "global",
        }
    }

    /// Whether each batch draws from many row groups at once (gathered from mapped columns).
    pub(crate) fn mixes_wide(self) -> bool {
        matches!(self, Shuffle::Block | Shuffle::Global)
    }
}

/// Rows in a block of `shuffle=block` with `partitions` partitions: MosaicML Streaming's default
/// shuffle block for as many canonical nodes, `max(4,000,000 / P, 262,144)`.
pub fn default_block(partitions: u64) -> u64 {
    (4_000_000 / partitions.max(1)).max(1 << 18)
}

/// The content options that decide the order of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderOptions {
    pub batch_size: u64,
    pub drop_last: bool,
    pub shuffle: Shuffle,
    /// Row groups per shuffle window (`shuffle=window`).
    pub window: u64,
    /// Rows per shuffle block (`shuffle=block`).
    pub block: u64,
    pub seed: u64,
    /// Fixed partitions of the rows (1: the whole dataset is one).
    pub partitions: u64,
}

/// One partition's rows.
#[derive(Clone, Debug)]
struct PartitionRows {
    /// Pieces of row groups (all of a row group, or part of one split between partitions), in
    /// canonical order, as (row group, canonical rows).
    segments: Vec<(usize, Range<u64>)>,
    /// The position in the partition's canonical order where each segment starts; one more
    /// entry holding the partition's row count.
    seg_pos: Starts,
}

impl PartitionRows {
    fn new(segments: Vec<(usize, Range<u64>)>) -> PartitionRows {
        let mut seg_pos = Vec::with_capacity(segments.len() + 1);
        let mut pos = 0;
        seg_pos.push(0);
        for (_, r) in &segments {
            pos += r.end - r.start;
            seg_pos.push(pos);
        }
        PartitionRows {
            segments,
            seg_pos: Starts::new(seg_pos),
        }
    }

    fn len(&self) -> u64 {
        self.seg_pos.end()
    }

    /// The segment holding position `x` of the canonical order.
    fn segment_at(&self, x: u64) -> usize {
        self.seg_pos.piece(x)
    }

    /// The canonical row at position `x` of the partition's canonical order.
    fn row(&self, x: u64) -> u64 {
        let s = self.segment_at(x);
        self.segments[s].1.start + (x - self.seg_pos[s])
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// Canonical index of each row group's first row; one more entry holding the row count.
    rg_start: Starts,
    parts: Vec<PartitionRows>,
    /// Where each row group's pieces are: `rg_pieces[rg_piece_start[g]..rg_piece_start[g + 1]]`,
    /// as (partition, segment).
    rg_piece_start: Vec<usize>,
    rg_pieces: Vec<(usize, usize)>,
    /// Full batches each partition serves per epoch.
    per_partition: u64,
    /// Whether partitions hold whole objects (else row groups of them).
    whole_objects: bool,
    /// Where each partition's leftover rows start among the epoch's leftover rows; one more
    /// entry holding their count.
    leftover_start: Vec<u64>,
    opts: OrderOptions,
    /// The sources of a mixture, each with its own plan.
    mix: Option<Box<SourcePlans>>,
}

/// A set of batch indices `first, first + step, …` (`count` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stride {
    pub(crate) first: u64,
    pub(crate) step: u64,
    pub(crate) count: u64,
}

impl Stride {
    /// The first batch of the set at or after `from`, and the members from there on.
    pub(crate) fn from(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        let skip = if from <= self.first {
            0
        } else {
            (from - self.first).div_ceil(self.step)
        };
        (skip..self.count).map(move |k| self.first + k * self.step)
    }
}

/// The canonical index of each row group's first row; one more entry holding the row count.
fn row_group_starts(files: &[PlanFile]) -> Vec<u64> {
    let mut rg_start = vec![0];
    let mut total = 0u64;
    for rows in files.iter().flat_map(|f| f.rg_rows) {
        total += rows;
        rg_start.push(total);
    }
    rg_start
}

impl Plan {
    pub fn new(files: &[PlanFile], opts: OrderOptions) -> Plan {
        assert!(opts.batch_size > 0 && opts.window > 0 && opts.block > 0 && opts.partitions > 0);
        let rg_start = row_group_starts(files);
        let assigned = partitions::assign(
            files,
            &rg_start,
            opts.partitions,
            opts.batch_size,
            opts.seed,
        );
        let parts: Vec<PartitionRows> = assigned.into_iter().map(PartitionRows::new).collect();
        let whole_objects = partitions::whole_objects(files, opts.partitions);
        let lens: Vec<u64> = parts.iter().map(PartitionRows::len).collect();
        Plan::from_parts(rg_start, parts, &lens, whole_objects, opts)
    }

    /// The plan of these partitions, partition `p` serving `lens[p]` rows an epoch.
    fn from_parts(
        rg_start: Vec<u64>,
        parts: Vec<PartitionRows>,
        lens: &[u64],
        whole_objects: bool,
        opts: OrderOptions,
    ) -> Plan {
        let groups = rg_start.len() - 1;
        let mut count = vec![0usize; groups + 1];
        for part in &parts {
            for (g, _) in &part.segments {
                count[*g + 1] += 1;
            }
        }
        for g in 0..groups {
            count[g + 1] += count[g];
        }
        let rg_piece_start = count.clone();
        let mut rg_pieces = vec![(0, 0); *count.last().expect("one entry")];
        for (p, part) in parts.iter().enumerate() {
            for (s, (g, _)) in part.segments.iter().enumerate() {
                rg_pieces[count[*g]] = (p, s);
                count[*g] += 1;
            }
        }
        // Full batches each partition serves: as many as the shortest holds. For one source
        // that is total / (P × batch_size), since `partitions::assign` fills every partition
        // to that many; a mixture's partitions are its sources' draws from them.
        let per_partition = lens.iter().min().copied().unwrap_or(0) / opts.batch_size;
        let mut leftover_start = Vec::with_capacity(parts.len() + 1);
        let mut left = 0;
        leftover_start.push(0);
        for len in lens {
            left += len - per_partition * opts.batch_size;
            leftover_start.push(left);
        }
        Plan {
            rg_start: Starts::new(rg_start),
            parts,
            rg_piece_start,
            rg_pieces,
            per_partition,
            whole_objects,
            leftover_start,
            opts,
            mix: None,
        }
    }

    /// A plan of one object with these row groups (in-process tests).
    #[cfg(test)]
    pub(crate) fn of_row_groups(rg_rows: &[u64], opts: OrderOptions) -> Plan {
        Plan::new(&[PlanFile { key: "", rg_rows }], opts)
    }

    pub(crate) fn options(&self) -> &OrderOptions {
        &self.opts
    }

    /// Whether every epoch has epoch 0's order (`shuffle=none`): its batches are then the same
    /// files in every epoch, built and kept once.
    pub(crate) fn epochs_repeat(&self) -> bool {
        // A mixture's source drawn down shows other rows each epoch, whatever the order.
        let drawn_anew = (self.mix.iter().flat_map(|m| &m.members)).any(SourcePlan::drawn_anew);
        self.opts.shuffle == Shuffle::None && !drawn_anew
    }

    /// The epoch whose batches epoch `epoch`'s are, byte for byte: 0 where epochs repeat.
    fn same_as(&self, epoch: u64) -> u64 {
        if self.epochs_repeat() { 0 } else { epoch }
    }

    /// Batch `g` (global) of `epoch` as the engine builds, keeps and names it.
    pub(crate) fn batch(&self, epoch: u64, g: u64) -> BatchRef {
        BatchRef {
            epoch: self.same_as(epoch),
            index: g,
        }
    }

    /// The directory whose files `dir`'s are, byte for byte: the same directory of the epoch it
    /// shares ([`Plan::same_as`]).
    pub(crate) fn shared_dir(&self, dir: Batches) -> Batches {
        match dir {
            Batches::Epoch(e) => Batches::Epoch(self.same_as(e)),
            Batches::Rank { epoch, rank, world } => Batches::Rank {
                epoch: self.same_as(epoch),
                rank,
                world,
            },
        }
    }

    /// Batch `j` of directory `dir` ([`Batches::global`]) as the engine builds, keeps and names
    /// it.
    pub(crate) fn batch_in(&self, dir: Batches, j: u64) -> BatchRef {
        let (epoch, g) = dir.global(j);
        self.batch(epoch, g)
    }

    /// Rows in the dataset.
    pub fn rows(&self) -> u64 {
        *self.rg_start.last().expect("at least one entry")
    }

    pub fn row_groups(&self) -> usize {
        self.rg_start.len() - 1
    }

    /// Rows in the largest row group.
    pub(crate) fn max_row_group_rows(&self) -> u64 {
        self.rg_start
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }

    pub fn partitions(&self) -> u64 {
        self.opts.partitions
    }

    /// Whether each partition's home holds whole objects (else row groups of them).
    pub fn whole_objects(&self) -> bool {
        self.whole_objects
    }

    /// Rows partition `p` holds (its full batches' and its leftover rows).
    pub fn partition_len(&self, p: u64) -> u64 {
        self.parts[p as usize].len()
    }

    /// Rows partition `p` serves an epoch: its rows, or a mixture's draws from it.
    pub fn partition_drawn(&self, p: u64) -> u64 {
        match &self.mix {
            Some(m) => m.merges[p as usize].len(),
            None => self.partition_len(p),
        }
    }

    /// The row groups partition `p` holds rows of, in canonical order (one split between
    /// partitions counts in each).
    pub fn partition_row_groups(&self, p: u64) -> impl Iterator<Item = usize> + '_ {
        self.parts[p as usize].segments.iter().map(|(g, _)| *g)
    }

    /// Rows in blocks of `shuffle=block` in partition `p`: the block size, or the whole
    /// partition where it is smaller, blocks being of equal size.
    pub(crate) fn block_rows(&self, p: u64) -> u64 {
        let len = self.partition_len(p);
        len.div_ceil(len.div_ceil(self.opts.block).max(1))
    }

    /// Full batches each partition serves per epoch (`n`).
    pub fn batches_per_partition(&self) -> u64 {
        self.per_partition
    }

    /// Batches drawn from a single partition: the epoch's first `n × P`.
    pub fn single_partition_batches(&self) -> u64 {
        self.per_partition * self.opts.partitions
    }

    /// Rows not in a single-partition batch: they form the epoch's last batches.
    pub fn leftover_rows(&self) -> u64 {
        *self.leftover_start.last().expect("at least one entry")
    }

    /// The partition batch `i` is drawn from, if it is drawn from one.
    #[cfg(test)]
    pub(crate) fn partition_of_batch(&self, i: u64) -> Option<u64> {
        (i < self.single_partition_batches()).then(|| i % self.opts.partitions)
    }

    /// Rows an epoch draws: every row once, or a mixture's draws.
    pub fn drawn_rows(&self) -> u64 {
        match &self.mix {
            Some(m) => m.merges.iter().map(Merge::len).sum(),
            None => self.rows(),
        }
    }

    /// Rows served per epoch: those drawn, less the final partial batch with `drop_last`.
    pub(crate) fn epoch_rows(&self) -> u64 {
        if self.opts.drop_last {
            self.drawn_rows() / self.opts.batch_size * self.opts.batch_size
        } else {
            self.drawn_rows()
        }
    }

    pub fn batches(&self) -> u64 {
        self.epoch_rows().div_ceil(self.opts.batch_size)
    }

    /// Rows in batch `i` (the last one may be short).
    pub(crate) fn batch_len(&self, i: u64) -> u64 {
        let start = i * self.opts.batch_size;
        self.epoch_rows()
            .saturating_sub(start)
            .min(self.opts.batch_size)
    }

    /// Rows of the final batch of an epoch (0 for an empty dataset).
    pub fn last_batch_len(&self) -> u64 {
        match self.batches() {
            0 => 0,
            n => self.batch_len(n - 1),
        }
    }

    /// The batches rank views share out: all of them with one partition; with several, only
    /// those drawn from a single partition, so that no host fetches other partitions.
    fn ranked_batches(&self) -> u64 {
        if self.opts.partitions == 1 {
            self.batches()
        } else {
            self.single_partition_batches().min(self.batches())
        }
    }

    /// Batches in each rank's view of an epoch: every rank gets the same count.
    pub fn rank_batches(&self, world: u64) -> u64 {
        self.ranked_batches() / world
    }

    /// Batches of the epoch left out of every rank view of `world` ranks.
    pub fn rank_left_out(&self, world: u64) -> u64 {
        self.batches() - self.rank_batches(world) * world
    }

    /// The canonical row group holding a canonical row, and the row's index inside it (row
    /// groups of no rows are passed over).
    pub(crate) fn locate(&self, row: u64) -> (usize, u64) {
        let rg = self.rg_start.piece(row);
        (rg, row - self.rg_start[rg])
    }
}
