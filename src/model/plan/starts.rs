//! Where consecutive pieces (row groups, segments of a partition) start, searched for the piece
//! holding a position through a bucket index.

/// The ascending starts of consecutive pieces, one more entry holding their end, and buckets to
/// search them from: positions in buckets of a power of two, about two buckets a piece, each
/// with the piece holding its first position (one more entry: the last piece). A piece is
/// found for every row of every batch built, twice (its segment in the shuffled order, then
/// its row group): binary searches over all of them were 3% of the daemon's CPU in a cold epoch
/// of 80-byte rows for the row groups alone, and the segments' 4% beside them.
#[derive(Clone, Debug)]
pub(super) struct Starts {
    starts: Vec<u64>,
    shift: u32,
    of_bucket: Vec<u32>,
}

impl Starts {
    /// From the starts of the pieces and one more entry, their end (ascending).
    pub(super) fn new(starts: Vec<u64>) -> Starts {
        let (end, pieces) = (*starts.last().expect("an end"), starts.len() - 1);
        let wanted = (end / (2 * pieces.max(1) as u64)).max(1);
        let shift = 63 - wanted.leading_zeros();
        let buckets = end.div_ceil(1 << shift) as usize;
        let mut of_bucket = Vec::with_capacity(buckets + 1);
        let mut p = 0;
        for b in 0..buckets as u64 {
            let first = b << shift;
            while p + 1 < pieces && starts[p + 1] <= first {
                p += 1;
            }
            of_bucket.push(p as u32);
        }
        of_bucket.push(pieces.saturating_sub(1) as u32);
        Starts {
            starts,
            shift,
            of_bucket,
        }
    }

    /// The piece holding position `x` (below the end): the last starting at or before it
    /// (pieces of no positions are passed over), searched for among the few its bucket meets.
    pub(super) fn piece(&self, x: u64) -> usize {
        debug_assert!(x < self.end());
        let b = (x >> self.shift) as usize;
        let (lo, hi) = (self.of_bucket[b] as usize, self.of_bucket[b + 1] as usize);
        lo + self.starts[lo + 1..=hi].partition_point(|&s| s <= x)
    }

    /// The end of the last piece.
    pub(super) fn end(&self) -> u64 {
        *self.starts.last().expect("an end")
    }
}

impl std::ops::Deref for Starts {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        &self.starts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_piece_is_the_last_starting_at_or_before_the_position(
            lens in prop::collection::vec(prop_oneof![Just(0u64), 1u64..5, 1u64..5000], 1..60),
        ) {
            let mut starts = vec![0];
            for len in &lens {
                starts.push(starts.last().unwrap() + len);
            }
            let s = Starts::new(starts.clone());
            // Every position next to a start, and a few between.
            let near = starts.iter().flat_map(|&st| [st.saturating_sub(1), st, st + 1, st + 37]);
            for x in near.filter(|&x| x < s.end()) {
                let want = starts.partition_point(|&st| st <= x) - 1;
                prop_assert_eq!(s.piece(x), want, "position {}", x);
            }
        }
    }
}
