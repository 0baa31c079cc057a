//! Mixtures: several sources drawn into one epoch (a `.toml` SOURCE).
//!
//! Each source gives the epoch `drawn` rows, sized as MosaicML Streaming sizes its streams
//! (`proportion`, `repeat` or `choose`): `k × rows + f` of them are every row `k` times and `f`
//! rows more, drawn anew each epoch (the source's own order, shuffled by the seed and the epoch,
//! taken `k + 1` times over and cut short). The sources' draws are then interleaved so that every
//! stretch of the epoch, a batch in particular, holds each source in its share: item `j` of a
//! source drawn `n` times sits at its ideal place `(j + ½) / n` of the epoch, and the epoch is
//! the items of every source merged by that place (ties by source). Any position is found
//! without the ones before it ([`Merge::counts_before`]), as a batch of one source is.

use anyhow::{Result, bail};
use std::cmp::Ordering;
use std::ops::Range;

/// How one source of a mixture is sized in an epoch: exactly one of Streaming's three ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Size {
    /// Its share of the epoch, relative to the other sources' proportions.
    Proportion(f64),
    /// Epochs of it per epoch (2.5: every row twice, half of them a third time).
    Repeat(f64),
    /// Rows of it per epoch.
    Choose(u64),
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Size::Proportion(p) => write!(f, "proportion {p}"),
            Size::Repeat(r) => write!(f, "repeat {r}"),
            Size::Choose(c) => write!(f, "choose {c}"),
        }
    }
}

/// The rows each source gives an epoch, from its kept rows and its size. With proportions (on
/// every source, or none, as Streaming has it), the epoch has `epoch_rows` rows (default: the
/// sources' rows added up) shared out by them; with `repeat` and `choose`, each source gives
/// what it says, and an `epoch_rows` scales them all to that many. Shares are whole rows by the
/// largest remainders, ties to the earlier source, so every host computes the same.
pub fn drawn(rows: &[u64], sizes: &[Size], epoch_rows: Option<u64>) -> Result<Vec<u64>> {
    debug_assert_eq!(rows.len(), sizes.len());
    let proportions = sizes
        .iter()
        .filter(|s| matches!(s, Size::Proportion(_)))
        .count();
    if proportions != 0 && proportions != sizes.len() {
        bail!(
            "a mixture gives `proportion` to every source or to none (here {proportions} of {}): size the others by proportion too, or use `repeat` and `choose`",
            sizes.len()
        );
    }
    let drawn = if proportions > 0 {
        let weights: Vec<f64> = (sizes.iter())
            .map(|s| match s {
                Size::Proportion(p) => *p,
                _ => unreachable!("every source has a proportion"),
            })
            .collect();
        if weights.iter().sum::<f64>() <= 0.0 {
            bail!("a mixture's proportions add up to 0: give some source a positive proportion");
        }
        apportion(epoch_rows.unwrap_or(rows.iter().sum()), &weights)
    } else {
        let own: Vec<u64> = (sizes.iter().zip(rows))
            .map(|(s, &r)| match s {
                Size::Repeat(k) => (k * r as f64).round() as u64,
                Size::Choose(c) => *c,
                Size::Proportion(_) => unreachable!("no source has a proportion"),
            })
            .collect();
        match epoch_rows {
            None => own,
            Some(n) => {
                if own.iter().sum::<u64>() == 0 {
                    bail!("epoch_rows={n}, but every source of the mixture is drawn 0 times");
                }
                apportion(n, &own.iter().map(|&x| x as f64).collect::<Vec<_>>())
            }
        }
    };
    for (s, (&n, &r)) in drawn.iter().zip(rows).enumerate() {
        if n > 0 && r == 0 {
            bail!(
                "source {} of the mixture keeps no rows, but its {} draws {n} of them an epoch",
                s + 1,
                sizes[s]
            );
        }
    }
    Ok(drawn)
}

/// `total` shared out in proportion to `weights` (non-negative, some positive): whole parts
/// adding up to `total`, by the largest remainders, ties to the earlier.
pub(crate) fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = (weights.iter()).map(|w| total as f64 * w / sum).collect();
    let mut out: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let given: u64 = out.iter().sum();
    let mut by_rest: Vec<usize> = (0..weights.len()).filter(|&s| weights[s] > 0.0).collect();
    by_rest.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.partial_cmp(&ra)
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b))
    });
    // Floating point may leave the floors short by more than one a source: go round again.
    let mut left = total.saturating_sub(given);
    while left > 0 && !by_rest.is_empty() {
        for &s in &by_rest {
            if left == 0 {
                break;
            }
            out[s] += 1;
            left -= 1;
        }
    }
    out
}

/// The epoch's positions shared out between the sources, each drawn `drawn[s]` times.
#[derive(Clone, Debug)]
pub struct Merge {
    drawn: Vec<u64>,
}

impl Merge {
    pub fn new(drawn: Vec<u64>) -> Merge {
        Merge { drawn }
    }

    /// Positions in the epoch.
    pub fn len(&self) -> u64 {
        self.drawn.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `(s, j)` comes before `(t, k)`: item `j` of source `s` is at `(2j + 1) / 2n_s`.
    fn before(&self, (s, j): (usize, u64), (t, k): (usize, u64)) -> Ordering {
        let a = (2 * j as u128 + 1) * self.drawn[t] as u128;
        let b = (2 * k as u128 + 1) * self.drawn[s] as u128;
        a.cmp(&b).then(s.cmp(&t))
    }

    /// The position of item `j` of source `s` in the epoch.
    pub fn position(&self, s: usize, j: u64) -> u64 {
        debug_assert!(j < self.drawn[s]);
        let n = self.drawn[s] as u128;
        let at = 2 * j as u128 + 1;
        let mut pos = j;
        for (t, &m) in self.drawn.iter().enumerate() {
            if t == s || m == 0 {
                continue;
            }
            // Items k of source t before it: (2k + 1) n < (2j + 1) m, or equal with t < s.
            let bound = at * m as u128;
            let odd_up_to = |x: u128| x.div_ceil(2).min(m as u128);
            let k = match t < s {
                true => odd_up_to(bound / n),
                false => odd_up_to(bound.div_ceil(n) - 1),
            };
            pos += k as u64;
        }
        pos
    }

    /// Items of each source among the epoch's first `t` positions.
    pub fn counts_before(&self, t: u64) -> Vec<u64> {
        (self.drawn.iter().enumerate())
            .map(|(s, &n)| {
                // The first j whose position is t or more.
                let (mut lo, mut hi) = (0, n);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if self.position(s, mid) < t {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                lo
            })
            .collect()
    }

    /// The items at positions `range`, in order, as (source, item).
    pub fn items(&self, range: Range<u64>) -> Vec<(usize, u64)> {
        let (from, to) = (
            self.counts_before(range.start),
            self.counts_before(range.end),
        );
        let mut out: Vec<(usize, u64)> = (0..self.drawn.len())
            .flat_map(|s| (from[s]..to[s]).map(move |j| (s, j)))
            .collect();
        out.sort_by(|&a, &b| self.before(a, b));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn positions_are_the_epoch_once_each(drawn in proptest::collection::vec(0u64..40, 1..5)) {
            let m = Merge::new(drawn.clone());
            let mut seen = vec![false; m.len() as usize];
            for (s, &n) in drawn.iter().enumerate() {
                for j in 0..n {
                    let p = m.position(s, j) as usize;
                    prop_assert!(!seen[p], "position {p} twice");
                    seen[p] = true;
                }
            }
            // The items of any stretch, found without the positions before it.
            let all = m.items(0..m.len());
            for (p, &(s, j)) in all.iter().enumerate() {
                prop_assert_eq!(m.position(s, j), p as u64);
            }
            for a in 0..=m.len() {
                for b in a..=m.len() {
                    prop_assert_eq!(m.items(a..b), all[a as usize..b as usize].to_vec());
                }
            }
        }

        #[test]
        fn every_stretch_holds_each_source_in_its_share(drawn in proptest::collection::vec(1u64..200, 2..5), len in 1u64..64) {
            let m = Merge::new(drawn.clone());
            let total = m.len();
            let mut a = 0;
            while a < total {
                let b = (a + len).min(total);
                let (x, y) = (m.counts_before(a), m.counts_before(b));
                for s in 0..drawn.len() {
                    let share = (b - a) as f64 * drawn[s] as f64 / total as f64;
                    let got = (y[s] - x[s]) as f64;
                    prop_assert!((got - share).abs() <= drawn.len() as f64 + 1.0, "{got} for {share}");
                }
                a = b;
            }
        }
    }

    #[test]
    fn sizes_follow_streaming() {
        let p = |x| Size::Proportion(x);
        assert_eq!(
            drawn(&[100, 300], &[p(1.0), p(1.0)], None).unwrap(),
            [200, 200]
        );
        assert_eq!(
            drawn(&[100, 300], &[p(3.0), p(1.0)], Some(10)).unwrap(),
            [8, 2]
        );
        let r = |x| Size::Repeat(x);
        assert_eq!(
            drawn(&[100, 300], &[r(2.5), Size::Choose(7)], None).unwrap(),
            [250, 7]
        );
        assert_eq!(
            drawn(&[100, 300], &[r(1.0), r(1.0)], Some(8)).unwrap(),
            [2, 6]
        );
        assert_eq!(
            drawn(&[10, 10, 10], &[p(1.0); 3], Some(10)).unwrap(),
            [4, 3, 3]
        );
        assert!(drawn(&[1, 1], &[p(1.0), r(1.0)], None).is_err());
        assert!(drawn(&[0, 1], &[Size::Choose(3), r(1.0)], None).is_err());
    }
}
