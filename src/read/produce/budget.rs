//! The memory budget, set, split and bounded here. `memory_limit`, less what a mount holds for
//! good (its footers and dataset.json, refused past half of it), is the buffers' budget. Half of
//! it holds decoded row groups; built batches and single tensors (for one-open readers) each
//! take an eighth of the other half, or up to three eighths where their largest value needs it
//! (that value and those built ahead of it), batches (and single tensors) built only to be
//! stored in the page cache taking their part of the batches' (and tensors') share; gather picks
//! a sixty-fourth of it.
//!
//! Each memo evicts past its share, so together they never hold more than 0.89 of the budget;
//! the rest is room for values still in use after a memo let them go (a batch being written, a
//! tensor being copied to a reader). Work ahead of a reader goes only into these memos, so it
//! needs no check of its own: the shares are the bound.

/// What `memory_limit` leaves for the buffers once `held` bytes (footers, dataset.json) are
/// held for good; `None` where those take more than half of it.
pub(crate) fn buffers(memory_limit: u64, held: u64) -> Option<u64> {
    (held <= memory_limit / 2).then(|| memory_limit - held)
}

/// The buffers' budget split among what holds memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Decoded row groups (mapped ones weigh nothing: their pages are the page cache's).
    pub(crate) decoded: usize,
    /// Built batches, for reads.
    pub(crate) batches: usize,
    /// Batches built only to be stored in the page cache, held while their reader may yet want
    /// another of their files: part of the batches' share.
    pub(crate) stored: usize,
    /// Single tensors of batches.
    pub(crate) tensors: usize,
    /// Single tensors gathered only to be stored in the page cache of the one-open files, held
    /// while their reader may yet read a page of them from the daemon: part of the tensors'
    /// share.
    pub(crate) stored_tensors: usize,
    /// Gather picks (which rows of which row groups a batch takes).
    pub(crate) picks: usize,
}

impl Budget {
    /// The split of `buffers` bytes, for batches of at most `largest_batch` bytes and tensors
    /// of at most `largest_tensor`, `prefetch` of them built ahead of each reader.
    pub(crate) fn split(
        buffers: u64,
        largest_batch: u64,
        largest_tensor: u64,
        prefetch: u64,
    ) -> Budget {
        let half = buffers / 2;
        let batches = memo_bytes(half, largest_batch, prefetch);
        let stored = stored_bytes(largest_batch, prefetch).min(batches as u64 / 2) as usize;
        let tensors = memo_bytes(half, largest_tensor, prefetch);
        let stored_tensors =
            stored_rows_bytes(largest_batch, prefetch).min(tensors as u64 / 2) as usize;
        Budget {
            decoded: half as usize,
            batches: batches - stored,
            stored,
            tensors: tensors - stored_tensors,
            stored_tensors,
            picks: (half / 64) as usize,
        }
    }

    /// The most the memos hold together.
    #[cfg(test)]
    fn total(&self) -> u64 {
        (self.decoded
            + self.batches
            + self.stored
            + self.tensors
            + self.stored_tensors
            + self.picks) as u64
    }
}

/// The bytes of batches built only to be stored in the page cache held: those a reader stores
/// ahead (`prefetch`, and the two about it) of batches of at most `largest_batch` bytes, for
/// four readers, at least [`STORED_AT_LEAST`] ([`Budget::split`] gives them at most half the
/// batches' share). A reader of several files of a batch (its safetensors and `.npy` files,
/// say) may store the first ahead before it is seen reading the others: those are stored from
/// the batch held.
fn stored_bytes(largest_batch: u64, prefetch: u64) -> u64 {
    (prefetch.saturating_add(2))
        .saturating_mul(4)
        .saturating_mul(largest_batch)
        .max(STORED_AT_LEAST)
}

/// See [`stored_bytes`].
const STORED_AT_LEAST: u64 = 8 << 20;

/// The bytes of every tensor's rows a reader of one-open files has gathered and stored ahead of
/// it, at least: each of its tripwires (one every half the depth) costs it a round trip to the
/// daemon, about 125 us on the VM measured, and at `prefetch=8` batches of 80-byte rows that
/// was one every 330 KB read, 1-2% of a cold epoch at half the cold rate.
pub(crate) const ROWS_AHEAD_BYTES: u64 = 8 << 20;

/// The bytes of single tensors gathered only to be stored in the page cache of one-open files
/// held: what four readers of every tensor store ahead ([`ROWS_AHEAD_BYTES`], or `prefetch`
/// batches of at most `largest_batch` bytes where more, and the two about them). Held with the
/// tensors built for reads, every tensor stored stayed in memory until that memo's share was
/// full, each in memory fresh from the kernel: a cold epoch of 80-byte rows took a third more
/// page faults.
fn stored_rows_bytes(largest_batch: u64, prefetch: u64) -> u64 {
    (ROWS_AHEAD_BYTES.max(prefetch.saturating_mul(largest_batch)))
        .saturating_add(largest_batch.saturating_mul(2))
        .saturating_mul(4)
}

/// The bytes a memo of built batches (or of single tensors) may hold, of `half` the buffers:
/// an eighth, or more where its largest value is large (up to three eighths), so that it holds
/// the value being read and those built ahead of it. A batch file or one-open file read
/// through the daemon is read in pieces, each served from the value held: one too large to
/// hold (a batch of 1,024 images of 150 KB, against the eighth of 1 GB) was built again for
/// every piece.
fn memo_bytes(half: u64, largest: u64, prefetch: u64) -> usize {
    let wanted = largest.saturating_mul(prefetch + 2).min(3 * half / 8);
    (half / 8).max(wanted) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_stay_within_the_budget_whatever_the_values() {
        for buffers in [0, 1, 4096, 1 << 30, 48 << 30, u64::MAX / 4] {
            for largest in [0, 1, 278 << 10, 150 << 20, 1 << 40, u64::MAX] {
                for prefetch in [0, 1, 8, 1 << 20] {
                    let b = Budget::split(buffers, largest, largest / 4, prefetch);
                    assert!(
                        b.total() as f64 <= buffers as f64 * 0.89,
                        "{b:?} of {buffers}"
                    );
                    assert!((b.batches + b.stored) as u64 >= buffers / 16);
                    assert!((b.tensors + b.stored_tensors) as u64 >= buffers / 16);
                    assert!(b.batches as u64 >= buffers / 32 && b.decoded as u64 == buffers / 2);
                }
            }
        }
        // Room for the batch being read and those built ahead, where the budget allows.
        let b = Budget::split(1 << 30, 10 << 20, 1 << 20, 8);
        assert_eq!(b.batches + b.stored, 100 << 20);
        assert_eq!(b.stored, 50 << 20);
        // Tensors stored ahead of readers of one-open files: at most half the tensors' share.
        assert_eq!((b.tensors, b.stored_tensors), (32 << 20, 32 << 20));
        // Small batches: what four readers store ahead, at least 8 MiB (batches) and 8 MiB of
        // every tensor's rows and two batches more (tensors).
        let b = Budget::split(2 << 30, 56 << 10, 8 << 10, 8);
        assert_eq!((b.batches, b.stored), (120 << 20, 8 << 20));
        let stored_tensors = 4 * ((8 << 20) + 2 * (56 << 10));
        assert_eq!(
            (b.tensors, b.stored_tensors),
            ((128 << 20) - stored_tensors, stored_tensors)
        );
    }

    #[test]
    fn memos_of_large_batches_hold_those_read_and_built_ahead() {
        const MIB: u64 = 1 << 20;
        // Small batches: an eighth of the half.
        assert_eq!(memo_bytes(1024 * MIB, 278 << 10, 8), 128 << 20);
        // 154 MB batches at prefetch=8: as many as three eighths hold (two).
        assert_eq!(memo_bytes(1024 * MIB, 154_000_000, 8), 384 << 20);
        // 16 MiB batches at prefetch=1: the one read and two ahead.
        assert_eq!(memo_bytes(128 * MIB, 16 * MIB, 1), 48 << 20);
    }

    #[test]
    fn footers_and_dataset_json_may_take_half_the_limit() {
        assert_eq!(buffers(1000, 400), Some(600));
        assert_eq!(buffers(1000, 500), Some(500));
        assert_eq!(buffers(1000, 501), None);
    }
}
