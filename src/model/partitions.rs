//! Which rows each partition holds (PRODUCT.md §5, `partitions=P`): a spread sample of the
//! whole dataset, the same in every epoch, and stable under appends.
//!
//! **Homes.** Every object has a home partition drawn from its key and the seed alone, so an
//! object keeps its home whatever objects are added or where their keys sort, and added objects
//! spread over the partitions as the others did. Homes hold whole objects where the dataset has
//! at least `OBJECTS_PER_PARTITION` objects a partition, so that a host reads the footers of its
//! own objects only. With fewer objects than that, whole objects would fill the partitions too
//! unevenly: each row group then has a home, its object's and the partitions after it in turn.
//!
//! **Lending.** Every partition serves the same number of full batches, but homes drawn from
//! keys hold unequal rows. Each partition keeps its home rows up to `n × batch_size` (its units
//! in an order also drawn from their keys), and a partition short of that borrows the rest from
//! the tails of the partitions over it: first those a host reading it also holds under more
//! world sizes (partitions P/2 apart, then P/4, …: whatever W divides their distance), then the
//! nearest after it. The rows that fill no partition stay home, as the epoch's last batches.
//! Lent rows are the part an append may move to another partition: about the partitions'
//! imbalance, which shrinks as objects per partition grow (docs/dev/scale.md gives numbers).

use sha2::{Digest, Sha256};
use std::ops::Range;

/// With fewer objects than this many a partition, row groups have homes rather than objects.
pub(crate) const OBJECTS_PER_PARTITION: usize = 4;

/// One object of the dataset, as the plan sees it: its key (relative to the dataset's root),
/// which draws its home, and the rows of its row groups.
#[derive(Clone, Copy, Debug)]
pub struct PlanFile<'a> {
    pub key: &'a str,
    pub rg_rows: &'a [u64],
}

/// A piece of a row group: (global row group, canonical rows).
pub(crate) type Piece = (usize, Range<u64>);

/// A unit placed whole in its home: an object, or one row group of it.
struct Unit {
    home: usize,
    order: u64,
    /// Its row groups (global indices).
    rgs: Range<usize>,
}

/// Two draws for an object: its home and its place in its home's order.
fn draws(seed: u64, key: &str) -> (u64, u64) {
    let mut h = Sha256::new();
    h.update(b"tensorfs partition home\0");
    h.update(seed.to_le_bytes());
    h.update(key.as_bytes());
    let d: [u8; 32] = h.finalize().into();
    let word = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().expect("8 bytes"));
    (word(0), word(8))
}

/// The pieces of rows each of `partitions` partitions holds, each partition's in canonical order
/// (adjacent pieces of one row group merged). `rg_start`: each global row group's first
/// canonical row, and one more entry, the row count. Each partition holds at least
/// `n × batch_size` rows, `n = rows / (partitions × batch_size)`; every row is in one partition.
pub(crate) fn assign(
    files: &[PlanFile],
    rg_start: &[u64],
    partitions: u64,
    batch_size: u64,
    seed: u64,
) -> Vec<Vec<Piece>> {
    let rows = *rg_start.last().expect("at least one entry");
    let groups = rg_start.len() - 1;
    if partitions == 1 {
        // Every row group, empty ones too: an empty row group takes its place in the window
        // shuffle, as it always has.
        return vec![
            (0..groups)
                .map(|g| (g, rg_start[g]..rg_start[g + 1]))
                .collect(),
        ];
    }
    let parts = partitions as usize;
    let units = units(files, rg_start, parts, seed);
    let mut homes: Vec<Vec<&Unit>> = vec![Vec::new(); parts];
    for u in &units {
        homes[u.home].push(u);
    }
    let full = rows / (partitions * batch_size) * batch_size;
    let mut kept: Vec<Vec<Piece>> = vec![Vec::new(); parts];
    let mut surplus: Vec<Vec<Piece>> = vec![Vec::new(); parts];
    let mut short = vec![0u64; parts];
    for (p, home) in homes.iter_mut().enumerate() {
        home.sort_by_key(|u| (u.order, u.rgs.start));
        let mut room = full;
        for g in home.iter().flat_map(|u| u.rgs.clone()) {
            let (a, b) = (rg_start[g], rg_start[g + 1]);
            let take = room.min(b - a);
            if take > 0 {
                kept[p].push((g, a..a + take));
            }
            if a + take < b {
                surplus[p].push((g, a + take..b));
            }
            room -= take;
        }
        short[p] = room;
    }
    for q in 0..parts {
        for s in lenders(q, parts) {
            while short[q] > 0 {
                let Some((g, r)) = surplus[s].pop() else {
                    break;
                };
                let take = short[q].min(r.end - r.start);
                kept[q].push((g, r.end - take..r.end));
                if take < r.end - r.start {
                    surplus[s].push((g, r.start..r.end - take));
                }
                short[q] -= take;
            }
            if short[q] == 0 {
                break;
            }
        }
        debug_assert_eq!(short[q], 0, "the partitions together hold every full batch");
    }
    // What no partition borrowed stays home, as that partition's leftover rows.
    for (p, rest) in surplus.into_iter().enumerate() {
        kept[p].extend(rest);
    }
    kept.into_iter().map(canonical).collect()
}

/// Whether the homes of `partitions` partitions hold whole objects (else row groups).
pub(crate) fn whole_objects(files: &[PlanFile], partitions: u64) -> bool {
    let with_rows = files.iter().filter(|f| f.rg_rows.iter().any(|&r| r > 0));
    partitions == 1 || with_rows.count() >= OBJECTS_PER_PARTITION * partitions as usize
}

/// The dataset's units with their homes and orders.
fn units(files: &[PlanFile], rg_start: &[u64], parts: usize, seed: u64) -> Vec<Unit> {
    let whole = whole_objects(files, parts as u64);
    let mut out = Vec::new();
    let mut first = 0;
    for f in files {
        let rgs = first..first + f.rg_rows.len();
        first = rgs.end;
        if rg_start[rgs.end] == rg_start[rgs.start] {
            continue;
        }
        let (home, order) = draws(seed, f.key);
        let home = (home % parts as u64) as usize;
        if whole {
            out.push(Unit { home, order, rgs });
            continue;
        }
        for (local, g) in rgs.enumerate() {
            if rg_start[g + 1] == rg_start[g] {
                continue;
            }
            out.push(Unit {
                home: (home + local) % parts,
                order: draws(seed, &format!("{}\0{local}", f.key)).1,
                rgs: g..g + 1,
            });
        }
    }
    out
}

/// The partitions partition `q` borrows from, in turn: those whose distance from it more world
/// sizes divide first (a host reading `q` under world size W also reads every partition a
/// multiple of W away), then the nearest after it.
fn lenders(q: usize, parts: usize) -> Vec<usize> {
    let mut others: Vec<usize> = (1..parts).collect();
    others.sort_by_key(|&d| (std::cmp::Reverse(gcd(d, parts)), d));
    others.into_iter().map(|d| (q + d) % parts).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Pieces sorted by their rows, those of one row group that meet merged.
fn canonical(mut pieces: Vec<Piece>) -> Vec<Piece> {
    pieces.sort_by_key(|(_, r)| (r.start, r.end));
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for (g, r) in pieces {
        match out.last_mut() {
            Some((last, prev)) if *last == g && prev.end == r.start => prev.end = r.end,
            _ => out.push((g, r)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashMap};

    struct Table {
        keys: Vec<String>,
        rg_rows: Vec<Vec<u64>>,
    }

    impl Table {
        fn new(mut objects: Vec<(String, Vec<u64>)>) -> Table {
            objects.sort();
            let (keys, rg_rows) = objects.into_iter().unzip();
            Table { keys, rg_rows }
        }

        fn files(&self) -> Vec<PlanFile<'_>> {
            (self.keys.iter().zip(&self.rg_rows))
                .map(|(k, r)| PlanFile { key: k, rg_rows: r })
                .collect()
        }

        fn rg_start(&self) -> Vec<u64> {
            let mut s = vec![0];
            for r in self.rg_rows.iter().flatten() {
                s.push(s.last().unwrap() + r);
            }
            s
        }

        /// Each partition's rows, as (object key, row group in it, row in it).
        fn assigned(&self, p: u64, b: u64, seed: u64) -> Vec<BTreeSet<(String, usize, u64)>> {
            let start = self.rg_start();
            let mut of_rg = Vec::new();
            for (k, rgs) in self.keys.iter().zip(&self.rg_rows) {
                for local in 0..rgs.len() {
                    of_rg.push((k.clone(), local));
                }
            }
            (assign(&self.files(), &start, p, b, seed).into_iter())
                .map(|pieces| {
                    (pieces.into_iter())
                        .flat_map(|(g, r)| {
                            let (k, local) = of_rg[g].clone();
                            let base = start[g];
                            r.map(move |row| (k.clone(), local, row - base))
                        })
                        .collect()
                })
                .collect()
        }
    }

    fn days(range: Range<usize>, rgs: usize, rows: u64) -> Vec<(String, Vec<u64>)> {
        range
            .map(|d| (format!("day={d:04}/part.parquet"), vec![rows; rgs]))
            .collect()
    }

    proptest! {
        #[test]
        fn every_row_is_in_one_partition_and_each_holds_its_full_batches(
            objects in prop::collection::vec(prop::collection::vec(0u64..60, 0..5), 1..40),
            partitions in 1u64..10,
            batch_size in 1u64..20,
            seed in any::<u64>(),
        ) {
            let t = Table::new(objects.into_iter().enumerate().map(|(i, r)| (format!("f{i:03}"), r)).collect());
            let start = t.rg_start();
            let rows = *start.last().unwrap();
            let parts = assign(&t.files(), &start, partitions, batch_size, seed);
            let full = rows / (partitions * batch_size) * batch_size;
            let mut seen = vec![false; rows as usize];
            for pieces in &parts {
                let held: u64 = pieces.iter().map(|(_, r)| r.end - r.start).sum();
                prop_assert!(held >= full);
                for (g, r) in pieces {
                    prop_assert!(start[*g] <= r.start && r.end <= start[g + 1]);
                    for row in r.clone() {
                        prop_assert!(!seen[row as usize], "row {} twice", row);
                        seen[row as usize] = true;
                    }
                }
                prop_assert!(pieces.windows(2).all(|w| w[0].1.end <= w[1].1.start));
            }
            prop_assert!(seen.iter().all(|&s| s));
            let leftover: u64 = parts.iter().map(|p| p.iter().map(|(_, r)| r.end - r.start).sum::<u64>() - full).sum();
            prop_assert!(leftover < partitions * batch_size);
        }

        #[test]
        fn objects_keep_their_homes_when_objects_are_added_wherever_they_sort(
            old in 40usize..80,
            added in prop::collection::vec(any::<u16>(), 1..12),
            partitions in prop::sample::select(vec![2u64, 4, 8]),
            seed in any::<u64>(),
        ) {
            // Whole objects: each object's home is drawn from its key alone.
            let mut objects: Vec<(String, Vec<u64>)> = (0..old).map(|i| (format!("k{:05}", i * 1000), vec![100, 50])).collect();
            let before = Table::new(objects.clone());
            objects.extend(added.iter().map(|&a| (format!("k{:05}x", a), vec![100, 50])));
            let after = Table::new(objects);
            let home = |t: &Table| -> HashMap<String, usize> {
                let files = t.files();
                let start = t.rg_start();
                units(&files, &start, partitions as usize, seed).into_iter()
                    .map(|u| (t.keys[files_index(&t.rg_rows, u.rgs.start)].clone(), u.home)).collect()
            };
            let (h0, h1) = (home(&before), home(&after));
            for (k, p) in &h0 {
                prop_assert_eq!(h1[k], *p, "{} moved", k);
            }
        }
    }

    /// The object whose row groups include global row group `g`.
    fn files_index(rg_rows: &[Vec<u64>], g: usize) -> usize {
        let mut first = 0;
        for (i, r) in rg_rows.iter().enumerate() {
            if g < first + r.len() {
                return i;
            }
            first += r.len();
        }
        unreachable!()
    }

    #[test]
    fn partitions_are_spread_over_the_whole_key_order() {
        // 64 days in key order, 8 partitions: every partition holds days from each quarter.
        let t = Table::new(days(0..64, 2, 500));
        for (p, rows) in t.assigned(8, 100, 7).iter().enumerate() {
            let quarters: BTreeSet<usize> = (rows.iter())
                .map(|(k, _, _)| k[4..8].parse::<usize>().unwrap() / 16)
                .collect();
            assert!(
                quarters.len() >= 3,
                "partition {p} holds days of quarters {quarters:?}"
            );
        }
    }

    #[test]
    fn an_append_moves_only_lent_rows() {
        // 36 daily objects, then 4 more: every old row a partition kept at home stays in it.
        let (p, b) = (8, 100);
        let day1 = Table::new(days(0..36, 5, 2000));
        let day2 = Table::new(days(0..40, 5, 2000));
        let (a, c) = (day1.assigned(p, b, 0), day2.assigned(p, b, 0));
        let rows =
            |parts: &[BTreeSet<(String, usize, u64)>]| parts.iter().map(|s| s.len()).sum::<usize>();
        let moved: usize = (0..p as usize)
            .map(|q| a[q].difference(&c[q]).count())
            .sum();
        let total = rows(&a);
        // The imbalance of homes drawn at random for 4.5 objects a partition is what lending
        // evens out, and what an append may move: a small part of the table, never most of it.
        assert!(moved * 5 < total, "{moved} of {total} rows moved");
    }

    #[test]
    fn few_objects_give_row_groups_homes() {
        // One object of 40 row groups over 8 partitions: 5 row groups each, no lending needed.
        let t = Table::new(vec![("one.parquet".into(), vec![1000; 40])]);
        let parts = t.assigned(8, 1000, 3);
        for rows in &parts {
            let rgs: BTreeSet<usize> = rows.iter().map(|(_, g, _)| *g).collect();
            assert_eq!(rgs.len(), 5);
            assert_eq!(rows.len(), 5000);
        }
    }

    #[test]
    fn lenders_share_hosts_first() {
        assert_eq!(lenders(1, 8), vec![5, 3, 7, 2, 4, 6, 0]);
        assert_eq!(lenders(0, 3), vec![1, 2]);
    }
}
