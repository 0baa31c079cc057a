//! Where readers are: one record, moved by one event per request that reads a batch
//! ([`Event`]), which the prefetcher asks what to build next and the eviction asks how far ahead
//! of the readers each cached item is needed.
//!
//! A reader is a directory read in order (an epoch directory, or a rank view); the record keeps,
//! for each, the batch it is at, the files of a batch it opens, and how far ahead its row groups
//! were asked for. The eviction measures from every reader that is still reading
//! ([`Readers::reading`]), so that with two readers its distances do not depend on which asked
//! last.

use crate::model::item::FileKind;
use crate::model::plan::{Batches, Chain};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a reader read of a directory's batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// One of a batch's files (an open, or a read of one).
    File(FileKind),
    /// Tensor `t`'s rows of the batches, through one-open file `file`; `past_half` once the
    /// read reaches the second half of the file.
    Rows {
        file: FileKind,
        t: usize,
        past_half: bool,
    },
    /// One-open file `kind` whole: opened built ahead, or its path asked for. The reader reads
    /// it from then on without the daemon, so it moves no position.
    Whole(FileKind),
}

/// A reader of `dir` read `what` of its batches `first..=last` (in reading order): the one
/// event every request that reads a batch emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) dir: Batches,
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) what: What,
}

impl Event {
    pub(crate) fn at(dir: Batches, batch: u64, what: What) -> Event {
        Event {
            dir,
            first: batch,
            last: batch,
            what,
        }
    }
}

/// How long a reader that has not moved still counts as reading for the eviction: a trainer's
/// pause for a checkpoint or an evaluation is shorter; a reader that stopped for good (a job's
/// rank that ended, a directory read once by a tool) stops holding the cache after it.
const IDLE: Duration = Duration::from_secs(120);

struct Reader {
    at: u64,
    /// Where each tensor's rows were last read through a one-open file: each is a stream of its
    /// own, which the kernel's readahead reads at its own distance ahead of the reader.
    streams: HashMap<usize, u64>,
    kinds: BTreeSet<FileKind>,
    /// The furthest batch (epoch, batch) whose row groups were asked for ahead of this reader.
    warmed: Option<(u64, u64)>,
    moved: Instant,
}

#[derive(Default)]
struct State {
    dirs: HashMap<Batches, Reader>,
}

/// What a reader's step tells the prefetcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// Whether it reads about in order, so that what it reads next is known.
    pub(crate) sequential: bool,
    /// The files of a batch it opens.
    pub(crate) kinds: Vec<FileKind>,
}

/// A reader's position, for `stats.json`.
pub(crate) struct Position {
    pub(crate) dir: Batches,
    pub(crate) at: u64,
    pub(crate) kinds: Vec<FileKind>,
}

#[derive(Default)]
pub(crate) struct Readers {
    state: Mutex<State>,
}

impl Readers {
    /// Moves the reader of `event.dir` to the last batch it read (`None` for a one-open file
    /// read whole, which moves nobody). It is followed once it reads about in order (its first
    /// batch within `slack` batches of where it last was: loader workers read neighbouring
    /// batches out of order), or from its first read if that is of the directory's first
    /// batch; random access is not followed.
    pub(crate) fn step(&self, event: Event, slack: u64) -> Option<Step> {
        let kind = match event.what {
            What::File(kind) => Some(kind),
            What::Rows { .. } => None,
            What::Whole(_) => return None,
        };
        let mut state = self.state.lock().unwrap();
        let now = Instant::now();
        let (sequential, r) = match state.dirs.entry(event.dir) {
            std::collections::hash_map::Entry::Occupied(r) => {
                let r = r.into_mut();
                let (from, slack) = match event.what {
                    What::Rows { t, .. } => (
                        r.streams.get(&t).copied().unwrap_or(r.at),
                        slack.max(4 * (event.last - event.first + 1)),
                    ),
                    _ => (r.at, slack),
                };
                (event.first.abs_diff(from) <= slack, r)
            }
            std::collections::hash_map::Entry::Vacant(v) => (
                event.first == 0,
                v.insert(Reader {
                    at: 0,
                    streams: HashMap::new(),
                    kinds: BTreeSet::new(),
                    warmed: None,
                    moved: now,
                }),
            ),
        };
        if !sequential {
            // Wherever it goes on from here, the row groups ahead of it are asked for anew.
            r.warmed = None;
        }
        r.at = event.last;
        if let What::Rows { t, .. } = event.what {
            r.streams.insert(t, event.last);
        }
        r.moved = now;
        r.kinds.extend(kind);
        Some(Step {
            sequential,
            kinds: r.kinds.iter().copied().collect(),
        })
    }

    /// The batch the reader of `dir` is at, if it has read any.
    pub(crate) fn position(&self, dir: Batches) -> Option<u64> {
        let state = self.state.lock().unwrap();
        state.dirs.get(&dir).map(|r| r.at)
    }

    /// Where the readers still reading are, as (epoch, global batch): those that moved in the
    /// last [`IDLE`], are not at their directory's last batch (of `count(dir)`), and whose
    /// chain of directories has nobody in a later epoch (a reader that went on to the next
    /// epoch left the one before behind, wherever it last read in it: loader workers finish an
    /// epoch out of order); where none is, the one that moved last; where nobody has read, the
    /// start.
    pub(crate) fn reading(&self, count: impl Fn(Batches) -> u64) -> Vec<(u64, u64)> {
        let state = self.state.lock().unwrap();
        let now = Instant::now();
        let mut latest: HashMap<Chain, u64> = HashMap::new();
        for dir in state.dirs.keys() {
            let e = latest.entry(dir.chain()).or_default();
            *e = (*e).max(dir.global(0).0);
        }
        let mut reading: Vec<(u64, u64)> = (state.dirs.iter())
            .filter(|(dir, r)| now - r.moved < IDLE && r.at + 1 < count(**dir))
            .filter(|(dir, _)| latest[&dir.chain()] == dir.global(0).0)
            .map(|(dir, r)| dir.global(r.at))
            .collect();
        if reading.is_empty() {
            let last = state.dirs.iter().max_by_key(|(_, r)| r.moved);
            reading.push(last.map_or((0, 0), |(dir, r)| dir.global(r.at)));
        }
        reading.sort_unstable();
        reading.dedup();
        reading
    }

    /// Of the batches `beyond` (in reading order) of `dir`'s reader, the (epoch, batch) of those
    /// whose row groups it has not asked for yet; its mark moves to the last of them.
    pub(crate) fn not_yet_warmed(
        &self,
        dir: Batches,
        beyond: &[(Batches, u64)],
    ) -> Vec<(u64, u64)> {
        let mut state = self.state.lock().unwrap();
        let Some(r) = state.dirs.get_mut(&dir) else {
            return Vec::new();
        };
        not_yet_warmed(beyond, &mut r.warmed)
    }

    /// Every reader's position, in no order.
    pub(crate) fn positions(&self) -> Vec<Position> {
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

    fn file(dir: Batches, i: u64, kind: FileKind) -> Event {
        Event::at(dir, i, What::File(kind))
    }

    fn step(readers: &Readers, event: Event) -> Step {
        readers.step(event, 2).expect("a position")
    }

    #[test]
    fn a_reader_is_followed_when_it_reads_in_order() {
        let readers = Readers::default();
        let d = Batches::Epoch(0);
        let st = FileKind::Safetensors;
        assert!(!step(&readers, file(d, 5, st)).sequential);
        assert!(step(&readers, file(d, 6, st)).sequential);
        assert!(!step(&readers, file(d, 20, FileKind::Npy(1))).sequential);
        let s = step(&readers, file(d, 21, st));
        assert_eq!(s.kinds, vec![st, FileKind::Npy(1)]);
        let other = Batches::Epoch(1);
        assert!(step(&readers, file(other, 0, st)).sequential);
        // A read of a one-open file spanning many batches is one step, in order.
        let rows = What::Rows {
            file: st,
            t: 0,
            past_half: false,
        };
        let span = |first, last| Event {
            dir: other,
            first,
            last,
            what: rows,
        };
        assert!(step(&readers, span(1, 40)).sequential);
        assert!(step(&readers, span(41, 90)).sequential);
        assert_eq!(readers.position(other), Some(90));
        // A one-open file opened whole moves nobody.
        assert_eq!(readers.step(Event::at(other, 0, What::Whole(st)), 2), None);
        assert_eq!(readers.position(other), Some(90));
    }

    #[test]
    fn each_tensor_of_a_one_open_reader_is_followed_on_its_own() {
        let readers = Readers::default();
        let d = Batches::Epoch(0);
        let rows = |t, first, last| Event {
            dir: d,
            first,
            last,
            what: What::Rows {
                file: FileKind::Npy(t),
                t,
                past_half: false,
            },
        };
        assert!(step(&readers, rows(0, 0, 0)).sequential);
        // The kernel reads a small tensor's rows further ahead of the reader than a large
        // one's, the gap growing: each is in order on its own.
        for i in 1..40 {
            assert!(
                step(&readers, rows(0, 2 * i, 2 * i)).sequential,
                "tensor 0 at {i}"
            );
            assert!(step(&readers, rows(1, i, i)).sequential, "tensor 1 at {i}");
        }
        // A readahead window's requests, four spans of four batches, answered in any order.
        for first in [84, 80, 88, 92] {
            assert!(
                step(&readers, rows(0, first, first + 3)).sequential,
                "span at {first}"
            );
        }
        assert!(!step(&readers, rows(1, 400, 400)).sequential);
    }

    #[test]
    fn the_eviction_measures_from_every_reader_still_reading() {
        let readers = Readers::default();
        let count = |_: Batches| 100;
        assert_eq!(readers.reading(count), vec![(0, 0)]);
        let st = FileKind::Safetensors;
        // Two readers: of epoch 0's directory, and of rank 1 of 4's view of epoch 1.
        let e0 = Batches::Epoch(0);
        let rank = |epoch| Batches::Rank {
            epoch,
            rank: 1,
            world: 4,
        };
        step(&readers, file(e0, 10, st));
        step(&readers, file(rank(1), 3, st));
        assert_eq!(readers.reading(count), vec![(0, 10), rank(1).global(3)]);
        // Whichever asked last, the same readers.
        step(&readers, file(e0, 10, st));
        assert_eq!(readers.reading(count), vec![(0, 10), rank(1).global(3)]);
        // A reader at its directory's last batch has read it.
        step(&readers, file(rank(1), 99, st));
        assert_eq!(readers.reading(count), vec![(0, 10)]);
        // A reader that goes on to its next epoch leaves the one before behind, wherever it
        // last read there.
        step(&readers, file(Batches::Epoch(1), 0, st));
        assert_eq!(readers.reading(count), vec![(1, 0)]);
        step(&readers, file(rank(2), 0, st));
        assert_eq!(readers.reading(count), vec![(1, 0), rank(2).global(0)]);
    }

    #[test]
    fn row_groups_are_asked_for_once_per_batch() {
        let readers = Readers::default();
        let d = Batches::Epoch(0);
        step(&readers, file(d, 2, FileKind::Safetensors));
        let beyond: Vec<(Batches, u64)> = (3..6).map(|j| (d, j)).collect();
        assert_eq!(
            readers.not_yet_warmed(d, &beyond),
            vec![(0, 3), (0, 4), (0, 5)]
        );
        let further: Vec<(Batches, u64)> = (4..8).map(|j| (d, j)).collect();
        assert_eq!(readers.not_yet_warmed(d, &further), vec![(0, 6), (0, 7)]);
        // Random access starts the marks again.
        step(&readers, file(d, 0, FileKind::Safetensors));
        step(&readers, file(d, 50, FileKind::Safetensors));
        assert_eq!(readers.not_yet_warmed(d, &further).len(), 4);
    }
}
