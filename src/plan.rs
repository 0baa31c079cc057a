//! The epoch plan: which rows form batch `i` of epoch `e`.
//!
//! Everything here is a pure function of the row-group sizes and the content options, so any
//! batch is computed alone (mid-epoch resumption is opening batch `k`), on any host, with any
//! thread count. Randomness comes from ChaCha20 seeded with (seed, epoch); each window reads its
//! own ChaCha stream, so a window's order is computed without computing the windows before it.
//!
//! Rows are named by their canonical index: files in lexicographic order, row groups and rows
//! in file order.

use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// Canonical order.
    None,
    /// Row groups shuffled per epoch, then rows shuffled inside windows of row groups.
    Window,
    /// A full permutation of all rows per epoch.
    Global,
}

impl Shuffle {
    pub fn name(self) -> &'static str {
        match self {
            Shuffle::None => "none",
            Shuffle::Window => "window",
            Shuffle::Global => "global",
        }
    }
}

/// The content options that decide the order of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderOptions {
    pub batch_size: u64,
    pub drop_last: bool,
    pub shuffle: Shuffle,
    /// Row groups per shuffle window.
    pub window: u64,
    pub seed: u64,
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// Canonical index of each row group's first row; one more entry holding the row count.
    rg_start: Vec<u64>,
    opts: OrderOptions,
}

impl Plan {
    pub fn new(rg_rows: &[u64], opts: OrderOptions) -> Plan {
        assert!(opts.batch_size > 0 && opts.window > 0);
        let mut rg_start = Vec::with_capacity(rg_rows.len() + 1);
        let mut total = 0u64;
        rg_start.push(0);
        for rows in rg_rows {
            total += rows;
            rg_start.push(total);
        }
        Plan { rg_start, opts }
    }

    pub fn options(&self) -> &OrderOptions {
        &self.opts
    }

    /// Whether every epoch has epoch 0's order (`shuffle=none`): its batches are then the same
    /// files in every epoch, built and kept once.
    pub fn epochs_repeat(&self) -> bool {
        self.opts.shuffle == Shuffle::None
    }

    /// The epoch whose batches epoch `epoch`'s are, byte for byte: 0 where epochs repeat.
    pub fn same_as(&self, epoch: u64) -> u64 {
        if self.epochs_repeat() { 0 } else { epoch }
    }

    /// Rows in the dataset.
    pub fn rows(&self) -> u64 {
        *self.rg_start.last().expect("at least one entry")
    }

    pub fn row_groups(&self) -> usize {
        self.rg_start.len() - 1
    }

    /// Rows in the largest row group.
    pub fn max_row_group_rows(&self) -> u64 {
        self.rg_start
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }

    /// Rows served per epoch: all of them, less the final partial batch with `drop_last`.
    pub fn epoch_rows(&self) -> u64 {
        if self.opts.drop_last {
            self.rows() / self.opts.batch_size * self.opts.batch_size
        } else {
            self.rows()
        }
    }

    pub fn batches(&self) -> u64 {
        self.epoch_rows().div_ceil(self.opts.batch_size)
    }

    /// Rows in batch `i` (the last one may be short).
    pub fn batch_len(&self, i: u64) -> u64 {
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

    /// The row group holding a canonical row, and the row's index inside it.
    pub fn locate(&self, row: u64) -> (usize, u64) {
        debug_assert!(row < self.rows());
        let rg = self.rg_start.partition_point(|&s| s <= row) - 1;
        (rg, row - self.rg_start[rg])
    }

    /// The per-epoch state the order needs (the shuffled row groups), computed once per epoch.
    pub fn epoch(&self, epoch: u64) -> EpochOrder {
        let n = self.rows();
        let order = match self.opts.shuffle {
            Shuffle::None => Order::Canonical,
            Shuffle::Global => {
                Order::Global(Permutation::new(n, &mut rng(self.opts.seed, epoch, 0)))
            }
            Shuffle::Window => {
                let mut rgs: Vec<usize> = (0..self.row_groups()).collect();
                let mut r = rng(self.opts.seed, epoch, 0);
                for i in (1..rgs.len()).rev() {
                    let j = below(&mut r, i as u64 + 1) as usize;
                    rgs.swap(i, j);
                }
                let mut start = Vec::with_capacity(rgs.len() + 1);
                let mut pos = 0;
                start.push(0);
                for &rg in &rgs {
                    pos += self.rg_start[rg + 1] - self.rg_start[rg];
                    start.push(pos);
                }
                let k = self.opts.window as usize;
                let windows = (0..=rgs.len().div_ceil(k))
                    .map(|w| start[(w * k).min(rgs.len())])
                    .collect();
                let mut slot_of = vec![0; rgs.len()];
                for (slot, &rg) in rgs.iter().enumerate() {
                    slot_of[rg] = slot;
                }
                Order::Window {
                    rgs,
                    start,
                    windows,
                    slot_of,
                }
            }
        };
        EpochOrder { epoch, order }
    }

    /// The canonical rows of batch `i`, in batch order.
    pub fn batch_rows(&self, order: &EpochOrder, i: u64) -> Vec<u64> {
        let first = i * self.opts.batch_size;
        let positions = first..first + self.batch_len(i);
        match &order.order {
            Order::Canonical => positions.collect(),
            Order::Global(perm) => positions.map(|p| perm.apply(p)).collect(),
            Order::Window {
                rgs,
                start,
                windows,
                ..
            } => {
                let mut perms: HashMap<usize, Permutation> = HashMap::new();
                positions
                    .map(|p| {
                        // The last window starting at or before p holds it (empty ones start
                        // where their successor does).
                        let w = windows.partition_point(|&s| s <= p) - 1;
                        let base = windows[w];
                        let perm = perms.entry(w).or_insert_with(|| {
                            let len = windows[w + 1] - base;
                            Permutation::new(
                                len,
                                &mut rng(self.opts.seed, order.epoch, w as u64 + 1),
                            )
                        });
                        let shuffled = base + perm.apply(p - base);
                        let slot = start.partition_point(|&s| s <= shuffled) - 1;
                        self.rg_start[rgs[slot]] + (shuffled - start[slot])
                    })
                    .collect()
            }
        }
    }
}

impl Plan {
    /// The epoch positions whose rows may come from row group `rg`: the cache uses it to know
    /// when a row group is needed next.
    pub fn row_group_span(&self, order: &EpochOrder, rg: usize) -> std::ops::Range<u64> {
        match &order.order {
            Order::Canonical => self.rg_start[rg]..self.rg_start[rg + 1],
            Order::Global(_) => 0..self.rows(),
            Order::Window {
                windows, slot_of, ..
            } => {
                let w = slot_of[rg] / self.opts.window as usize;
                windows[w]..windows[w + 1]
            }
        }
    }
}

/// What an epoch's order needs beyond the plan.
#[derive(Clone, Debug)]
pub struct EpochOrder {
    epoch: u64,
    order: Order,
}

#[derive(Clone, Debug)]
enum Order {
    Canonical,
    Global(Permutation),
    /// Row groups in shuffled order, the epoch position where each starts, and where each
    /// window starts (each list with one more entry: the end).
    Window {
        rgs: Vec<usize>,
        start: Vec<u64>,
        windows: Vec<u64>,
        /// Each row group's place in `rgs`.
        slot_of: Vec<usize>,
    },
}

/// The ChaCha20 stream `stream` of (seed, epoch).
fn rng(seed: u64, epoch: u64, stream: u64) -> ChaCha20Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    let mut rng = ChaCha20Rng::from_seed(key);
    rng.set_stream(stream);
    rng
}

/// A uniform integer in `0..n`, by rejection (no modulo bias), stable across crate versions.
fn below(rng: &mut ChaCha20Rng, n: u64) -> u64 {
    debug_assert!(n > 0);
    let zone = u64::MAX - (u64::MAX - n + 1) % n;
    loop {
        let x = rng.next_u64();
        if x <= zone {
            return x % n;
        }
    }
}

const ROUNDS: usize = 6;

/// A keyed pseudo-random permutation of `0..n`: a balanced Feistel network over the smallest
/// even-bit domain covering `n`, with cycle walking back into range. Any position is mapped in
/// O(1), which is what lets a batch be computed without its predecessors.
#[derive(Clone, Debug)]
struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

impl Permutation {
    fn new(n: u64, rng: &mut ChaCha20Rng) -> Permutation {
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let keys = std::array::from_fn(|_| rng.next_u64());
        Permutation {
            n,
            half_bits: bits.div_ceil(2),
            keys,
        }
    }

    fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    fn encrypt(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let t = l ^ (mix(r ^ k) & mask);
            l = r;
            r = t;
        }
        (l << self.half_bits) | r
    }
}

/// The splitmix64 finaliser: a fast, well-distributed round function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Rank `rank` of `world` reads global batches rank, rank + world, …; every rank gets the same
/// count, so the epoch's last `batches mod world` batches are left out of rank views.
pub fn rank_batches(batches: u64, world: u64) -> u64 {
    batches / world
}

pub fn rank_to_global(rank: u64, world: u64, j: u64) -> u64 {
    rank + j * world
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn shuffle_strategy() -> impl Strategy<Value = Shuffle> {
        prop_oneof![
            Just(Shuffle::None),
            Just(Shuffle::Window),
            Just(Shuffle::Global)
        ]
    }

    fn epoch_rows(plan: &Plan, epoch: u64) -> Vec<u64> {
        let order = plan.epoch(epoch);
        (0..plan.batches())
            .flat_map(|i| plan.batch_rows(&order, i))
            .collect()
    }

    proptest! {
        #[test]
        fn every_epoch_is_a_permutation(
            rg_rows in prop::collection::vec(0u64..40, 1..12),
            batch_size in 1u64..33,
            window in 1u64..5,
            seed in any::<u64>(),
            epoch in 0u64..1000,
            drop_last in any::<bool>(),
            shuffle in shuffle_strategy(),
        ) {
            let plan = Plan::new(&rg_rows, OrderOptions { batch_size, drop_last, shuffle, window, seed });
            let rows = epoch_rows(&plan, epoch);
            prop_assert_eq!(rows.len() as u64, plan.epoch_rows());
            let distinct: HashSet<u64> = rows.iter().copied().collect();
            prop_assert_eq!(distinct.len(), rows.len());
            prop_assert!(rows.iter().all(|&r| r < plan.rows()));
            if !drop_last {
                prop_assert_eq!(distinct.len() as u64, plan.rows());
            }
            if shuffle == Shuffle::None {
                prop_assert_eq!(rows, (0..plan.epoch_rows()).collect::<Vec<_>>());
            }
        }

        #[test]
        fn a_batch_computed_alone_equals_the_same_batch_in_sequence(
            rg_rows in prop::collection::vec(1u64..40, 1..12),
            batch_size in 1u64..33,
            seed in any::<u64>(),
            shuffle in shuffle_strategy(),
            pick in any::<prop::sample::Index>(),
        ) {
            let opts = OrderOptions { batch_size, drop_last: false, shuffle, window: 3, seed };
            let plan = Plan::new(&rg_rows, opts);
            let in_sequence = epoch_rows(&plan, 7);
            let i = pick.index(plan.batches() as usize) as u64;
            // A fresh plan and epoch state, as a second host or a resumed job would have.
            let fresh = Plan::new(&rg_rows, opts);
            let alone = fresh.batch_rows(&fresh.epoch(7), i);
            let start = (i * batch_size) as usize;
            prop_assert_eq!(&alone[..], &in_sequence[start..start + alone.len()]);
        }

        #[test]
        fn window_rows_stay_inside_their_window(
            rg_rows in prop::collection::vec(1u64..30, 1..15),
            window in 1u64..5,
            seed in any::<u64>(),
        ) {
            let plan = Plan::new(&rg_rows, OrderOptions { batch_size: 1, drop_last: false, shuffle: Shuffle::Window, window, seed });
            let rows = epoch_rows(&plan, 0);
            // Consecutive runs of window-size-many row groups: the row groups seen in each run
            // of positions must be exactly `window` row groups (fewer for the last).
            let mut seen = Vec::new();
            let mut pos = 0usize;
            let order = plan.epoch(0);
            if let Order::Window { rgs, .. } = &order.order {
                for chunk in rgs.chunks(window as usize) {
                    let len: u64 = chunk.iter().map(|&rg| rg_rows[rg]).sum();
                    let want: HashSet<usize> = chunk.iter().copied().collect();
                    let got: HashSet<usize> = rows[pos..pos + len as usize].iter().map(|&r| plan.locate(r).0).collect();
                    prop_assert_eq!(&got, &want);
                    seen.extend(got);
                    pos += len as usize;
                }
            }
            prop_assert_eq!(seen.len(), rg_rows.len());
        }

        #[test]
        fn permutations_are_bijections(n in 0u64..600, seed in any::<u64>()) {
            let perm = Permutation::new(n, &mut rng(seed, 0, 0));
            let image: HashSet<u64> = (0..n).map(|x| perm.apply(x)).collect();
            prop_assert_eq!(image.len() as u64, n);
            prop_assert!(image.iter().all(|&y| y < n));
        }
    }

    #[test]
    fn orders_depend_on_epoch_and_seed_only() {
        let rg_rows = vec![100; 12];
        let opts = OrderOptions {
            batch_size: 64,
            drop_last: false,
            shuffle: Shuffle::Window,
            window: 4,
            seed: 1,
        };
        let plan = Plan::new(&rg_rows, opts);
        let e0 = epoch_rows(&plan, 0);
        assert_eq!(e0, epoch_rows(&Plan::new(&rg_rows, opts), 0));
        assert_ne!(e0, epoch_rows(&plan, 1));
        assert_ne!(
            e0,
            epoch_rows(&Plan::new(&rg_rows, OrderOptions { seed: 2, ..opts }), 0)
        );
        assert_ne!(e0, (0..1200).collect::<Vec<_>>());
        let global = Plan::new(
            &rg_rows,
            OrderOptions {
                shuffle: Shuffle::Global,
                ..opts
            },
        );
        let g0 = epoch_rows(&global, 0);
        assert_ne!(g0, epoch_rows(&global, 1));
        // A global batch draws from all over the dataset, not from one window.
        let groups: HashSet<usize> = g0[..64].iter().map(|&r| global.locate(r).0).collect();
        assert!(groups.len() > 4);
    }

    #[test]
    fn row_group_spans_hold_their_rows() {
        let rg_rows = vec![10, 0, 7, 13, 5, 9];
        for shuffle in [Shuffle::None, Shuffle::Window, Shuffle::Global] {
            let plan = Plan::new(
                &rg_rows,
                OrderOptions {
                    batch_size: 1,
                    drop_last: false,
                    shuffle,
                    window: 2,
                    seed: 3,
                },
            );
            let order = plan.epoch(2);
            for pos in 0..plan.rows() {
                let (rg, _) = plan.locate(plan.batch_rows(&order, pos)[0]);
                assert!(
                    plan.row_group_span(&order, rg).contains(&pos),
                    "{shuffle:?} {pos} {rg}"
                );
            }
        }
    }

    #[test]
    fn batch_counts_and_rank_views() {
        let plan = Plan::new(
            &[1000, 500],
            OrderOptions {
                batch_size: 256,
                drop_last: false,
                shuffle: Shuffle::None,
                window: 4,
                seed: 0,
            },
        );
        assert_eq!(plan.batches(), 6);
        assert_eq!(plan.last_batch_len(), 1500 - 5 * 256);
        let dropped = Plan::new(
            &[1000, 500],
            OrderOptions {
                drop_last: true,
                ..*plan.options()
            },
        );
        assert_eq!(dropped.batches(), 5);
        assert_eq!(dropped.last_batch_len(), 256);
        assert_eq!(rank_batches(6, 4), 1);
        assert_eq!(rank_to_global(2, 4, 1), 6);
        assert_eq!(plan.locate(1000), (1, 0));
        assert_eq!(plan.locate(999), (0, 999));
    }

    #[test]
    fn the_window_order_is_pinned() {
        // The order is part of the determinism contract: a change here changes every batch.
        let plan = Plan::new(
            &[3, 3, 3],
            OrderOptions {
                batch_size: 9,
                drop_last: false,
                shuffle: Shuffle::Window,
                window: 2,
                seed: 0,
            },
        );
        let rows = plan.batch_rows(&plan.epoch(0), 0);
        assert_eq!(rows.len(), 9);
        assert_eq!(rows, vec![4, 7, 5, 3, 6, 8, 1, 0, 2]);
    }
}
