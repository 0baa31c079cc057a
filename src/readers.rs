//! Where readers are: one record, which the prefetcher asks what to build next and the eviction
//! asks how far ahead of the readers each cached item is needed.
//!
//! A reader is a directory read in order (an epoch directory, or a rank view); the record keeps,
//! for each, the batch it is at, the files of a batch it opens, and how far ahead its row groups
//! were asked for. The batch last asked for by anyone is where the eviction measures from.

use crate::layout::FileKind;
use crate::plan::Batches;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

#[derive(Default)]
struct Reader {
    seen: bool,
    at: u64,
    kinds: BTreeSet<FileKind>,
    /// The furthest batch (epoch, batch) whose row groups were asked for ahead of this reader.
    warmed: Option<(u64, u64)>,
}

#[derive(Default)]
struct State {
    dirs: HashMap<Batches, Reader>,
    /// The (epoch, global batch) most recently asked for.
    last: (u64, u64),
}

/// What a reader's step tells the prefetcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Whether it reads about in order, so that what it reads next is known.
    pub sequential: bool,
    /// The files of a batch it opens.
    pub kinds: Vec<FileKind>,
}

/// A reader's position, for `stats.json`.
pub struct Position {
    pub dir: Batches,
    pub at: u64,
    pub kinds: Vec<FileKind>,
}

#[derive(Default)]
pub struct Readers {
    state: Mutex<State>,
}

impl Readers {
    /// The (epoch, global batch) last asked for: where readers are, for the eviction.
    pub fn now(&self) -> (u64, u64) {
        self.state.lock().unwrap().last
    }

    /// A reader asked for batch `batch` of `epoch` (an open or a read).
    pub fn at(&self, epoch: u64, batch: u64) {
        self.state.lock().unwrap().last = (epoch, batch);
    }

    /// A reader of `dir` opened (or read) file `kind` of its batch `i` (`None`: it read the
    /// batch through a one-open file). It is followed once it
    /// reads about in order (within `slack` batches of where it last was: loader workers read
    /// neighbouring batches out of order), or from its first open if that is of the directory's
    /// first batch; random access is not followed.
    pub fn step(&self, dir: Batches, i: u64, kind: Option<FileKind>, slack: u64) -> Step {
        let mut state = self.state.lock().unwrap();
        let r = state.dirs.entry(dir).or_default();
        let sequential = match r.seen {
            true => i.abs_diff(r.at) <= slack,
            false => i == 0,
        };
        if !sequential {
            // Wherever it goes on from here, the row groups ahead of it are asked for anew.
            r.warmed = None;
        }
        r.seen = true;
        r.at = i;
        r.kinds.extend(kind);
        Step {
            sequential,
            kinds: r.kinds.iter().copied().collect(),
        }
    }

    /// The batch the reader of `dir` is at, if it has read any.
    pub fn position(&self, dir: Batches) -> Option<u64> {
        let state = self.state.lock().unwrap();
        state.dirs.get(&dir).filter(|r| r.seen).map(|r| r.at)
    }

    /// Of the batches `beyond` (in reading order) of `dir`'s reader, the (epoch, batch) of those
    /// whose row groups it has not asked for yet; its mark moves to the last of them.
    pub fn not_yet_warmed(&self, dir: Batches, beyond: &[(Batches, u64)]) -> Vec<(u64, u64)> {
        let mut state = self.state.lock().unwrap();
        let warmed = &mut state.dirs.entry(dir).or_default().warmed;
        not_yet_warmed(beyond, warmed)
    }

    /// Every reader's position, in no order.
    pub fn positions(&self) -> Vec<Position> {
        self.state
            .lock()
            .unwrap()
            .dirs
            .iter()
            .map(|(dir, r)| Position {
                dir: *dir,
                at: r.at,
                kinds: r.kinds.iter().copied().collect(),
            })
            .collect()
    }
}

/// Of the batches `beyond`, those past `warmed`, which moves to the last.
fn not_yet_warmed(beyond: &[(Batches, u64)], warmed: &mut Option<(u64, u64)>) -> Vec<(u64, u64)> {
    let before = *warmed;
    *warmed = (*warmed).max(beyond.last().map(|&(d, j)| d.global(j)));
    beyond
        .iter()
        .map(|&(d, j)| d.global(j))
        .filter(|&g| before.is_none_or(|w| g > w))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_is_followed_when_it_reads_in_order() {
        let readers = Readers::default();
        let d = Batches::Epoch(0);
        assert!(
            !readers
                .step(d, 5, Some(FileKind::Safetensors), 2)
                .sequential
        );
        assert!(
            readers
                .step(d, 6, Some(FileKind::Safetensors), 2)
                .sequential
        );
        assert!(!readers.step(d, 20, Some(FileKind::Npy(1)), 2).sequential);
        let step = readers.step(d, 21, Some(FileKind::Safetensors), 2);
        assert_eq!(step.kinds, vec![FileKind::Safetensors, FileKind::Npy(1)]);
        let other = Batches::Epoch(1);
        assert!(
            readers
                .step(other, 0, Some(FileKind::Safetensors), 2)
                .sequential
        );
        readers.at(1, 0);
        assert_eq!(readers.now(), (1, 0));
    }

    #[test]
    fn row_groups_are_asked_for_once_per_batch() {
        let readers = Readers::default();
        let d = Batches::Epoch(0);
        let beyond: Vec<(Batches, u64)> = (3..6).map(|j| (d, j)).collect();
        assert_eq!(
            readers.not_yet_warmed(d, &beyond),
            vec![(0, 3), (0, 4), (0, 5)]
        );
        let further: Vec<(Batches, u64)> = (4..8).map(|j| (d, j)).collect();
        assert_eq!(readers.not_yet_warmed(d, &further), vec![(0, 6), (0, 7)]);
        // Random access starts the marks again.
        readers.step(d, 0, Some(FileKind::Safetensors), 2);
        readers.step(d, 50, Some(FileKind::Safetensors), 2);
        assert_eq!(readers.not_yet_warmed(d, &further).len(), 4);
    }
}
