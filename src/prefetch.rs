//! The prefetcher: it follows each reader through the plan and keeps the next `prefetch`
//! batch files materialised ahead of it, across epoch boundaries, within the memory budget.
//!
//! A reader is a directory read in order: an epoch directory, or a rank view (whose batches
//! are strided through the epoch). What it reads next is known from the plan, so the files it
//! will open are built before it asks. Builds share the engine's worker pool (whose semaphore is
//! fair, so several readers are served in turn) and its single-flight, so a batch is built once
//! however many readers and prefetches want it.

use crate::cache::Item;
use crate::engine::Engine;
use crate::fs::Batches;
use crate::stats::Stats;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;

/// Which file of a batch a reader opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileKind {
    Safetensors,
    Npy(usize),
}

impl FileKind {
    /// The item of this file of batch `batch` of `epoch`, as is: [`Engine::item`] is the one
    /// that maps an epoch to the one it repeats.
    pub fn item(self, epoch: u64, batch: u64) -> Item {
        match self {
            FileKind::Safetensors => Item::Safetensors { epoch, batch },
            FileKind::Npy(tensor) => Item::Npy {
                epoch,
                batch,
                tensor,
            },
        }
    }
}

/// The `depth` batches that follow batch `i` of directory `dir`, crossing into the next epoch
/// (the same rank's view of it, for a rank view). `count` is the number of batches of a
/// directory. A pure function of the plan, so what is prefetched is what will be read.
pub fn ahead(
    dir: Batches,
    i: u64,
    depth: u64,
    count: impl Fn(Batches) -> u64,
) -> Vec<(Batches, u64)> {
    let mut out = Vec::new();
    let (mut d, mut j) = (dir, i);
    for _ in 0..depth {
        j += 1;
        if j >= count(d) {
            d = match d {
                Batches::Epoch(e) => Batches::Epoch(e + 1),
                Batches::Rank { epoch, rank, world } => Batches::Rank {
                    epoch: epoch + 1,
                    rank,
                    world,
                },
            };
            j = 0;
            if count(d) == 0 {
                break;
            }
        }
        out.push((d, j));
    }
    out
}

/// Of the batches `beyond` (in reading order), the (epoch, batch) of those whose row groups
/// were not asked for yet by a reader that asked up to `warmed`, which moves to the last.
pub fn not_yet_warmed(
    beyond: &[(Batches, u64)],
    warmed: &mut Option<(u64, u64)>,
) -> Vec<(u64, u64)> {
    let before = *warmed;
    *warmed = (*warmed).max(beyond.last().map(|&(d, j)| d.global(j)));
    beyond
        .iter()
        .map(|&(d, j)| d.global(j))
        .filter(|&g| before.is_none_or(|w| g > w))
        .collect()
}

/// A reader: where it is and which files of a batch it opens.
#[derive(Default)]
struct Reader {
    seen: bool,
    at: u64,
    kinds: BTreeSet<FileKind>,
    /// The furthest batch (epoch, batch) whose row groups were asked for ahead of this reader.
    warmed: Option<(u64, u64)>,
}

pub struct Prefetcher {
    engine: Arc<Engine>,
    runtime: Handle,
    depth: u64,
    /// Epochs the mount lists.
    epochs: u64,
    memory_limit: u64,
    readers: Mutex<HashMap<Batches, Reader>>,
    /// Items being prefetched now.
    scheduled: Arc<Mutex<HashSet<Item>>>,
}

impl Prefetcher {
    pub fn new(
        engine: Arc<Engine>,
        runtime: Handle,
        depth: u64,
        epochs: u64,
        memory_limit: u64,
    ) -> Prefetcher {
        Prefetcher {
            engine,
            runtime,
            depth,
            epochs,
            memory_limit,
            readers: Mutex::default(),
            scheduled: Arc::default(),
        }
    }

    /// A reader opened (or read) file `kind` of batch `i` of `dir`: schedule what follows.
    pub fn accessed(&self, dir: Batches, i: u64, kind: FileKind, count: impl Fn(Batches) -> u64) {
        if self.depth == 0 || self.engine.cache.is_none() {
            return;
        }
        let (kinds, sequential) = {
            let mut readers = self.readers.lock().unwrap();
            let r = readers.entry(dir).or_default();
            // A reader is followed once it reads about in order (near where it last was: loader
            // workers read neighbouring batches out of order), or from its first open if that is
            // of the directory's first batch; random access is not prefetched.
            let sequential = match r.seen {
                true => i.abs_diff(r.at) <= self.depth.max(2),
                false => i == 0,
            };
            if !sequential {
                // Wherever it goes on from here, the row groups ahead of it are asked for anew.
                r.warmed = None;
            }
            r.seen = true;
            r.at = i;
            r.kinds.insert(kind);
            (
                r.kinds.iter().copied().collect::<Vec<FileKind>>(),
                sequential,
            )
        };
        if !sequential {
            return;
        }
        // Past the listed epochs only if the reader is there already: at the end of a job
        // nothing reads the epoch after the last.
        let last = self.epochs.max(dir.global(i).0 + 1);
        let cache = self.engine.cache.as_ref().expect("checked above");
        // The batches whose files are built next, then those whose row groups are decoded
        // further ahead (the lead): one walk of the plan.
        let walk = ahead(dir, i, self.depth + self.engine.row_group_lead(), &count);
        let (files, beyond) = walk.split_at(walk.len().min(self.depth as usize));
        for &(d, j) in files {
            if d.global(j).0 >= last {
                break;
            }
            // Backpressure: past the memory budget, readers are served first.
            if self.engine.memory() as u64 > self.memory_limit {
                Stats::add(&self.engine.stats.c.prefetch_deferred, 1);
                break;
            }
            let (epoch, batch) = d.global(j);
            for kind in &kinds {
                let item = self.engine.item(*kind, epoch, batch);
                if cache.contains(item) || !self.scheduled.lock().unwrap().insert(item) {
                    continue;
                }
                let engine = self.engine.clone();
                let scheduled = self.scheduled.clone();
                Stats::add(&engine.stats.c.prefetch_scheduled, 1);
                self.runtime.spawn(async move {
                    if let Err(e) = engine.prefetch(item).await {
                        tracing::warn!("prefetch of {item:?}: {}", crate::describe(&e));
                    }
                    scheduled.lock().unwrap().remove(&item);
                });
            }
        }
        // Each batch between the files above and the horizon has its row groups asked for once,
        // nearest first, from the reader's first steps on, so every batch's row groups are
        // decoded well before its file is built. Queued after the files, which come first.
        if self.engine.memory() as u64 <= self.memory_limit {
            let fresh = {
                let mut readers = self.readers.lock().unwrap();
                let r = readers.get_mut(&dir).expect("noted above");
                not_yet_warmed(beyond, &mut r.warmed)
            };
            // Batches whose files are there already (a warm epoch) need nothing decoded.
            let fresh: Vec<(u64, u64)> = fresh
                .into_iter()
                .filter(|&g| g.0 < last && !self.ready(&kinds, g))
                .collect();
            if !fresh.is_empty() {
                let engine = self.engine.clone();
                self.runtime.spawn(async move {
                    if let Err(e) = engine.warm_row_groups(&fresh).await {
                        tracing::warn!(
                            "prefetch of the row groups of (epoch, batch) {:?}: {}",
                            fresh.first(),
                            crate::describe(&e)
                        );
                    }
                });
            }
        }
    }

    /// Whether the files `kinds` of batch (epoch, batch) are all in the cache.
    fn ready<'a>(
        &self,
        kinds: impl IntoIterator<Item = &'a FileKind>,
        (epoch, batch): (u64, u64),
    ) -> bool {
        let cache = self.engine.cache.as_ref();
        kinds
            .into_iter()
            .all(|&k| cache.is_some_and(|c| c.contains(self.engine.item(k, epoch, batch))))
    }

    /// Each reader's position and how many of the batches it reads next are materialised.
    pub fn depths(&self, count: impl Fn(Batches) -> u64) -> Vec<serde_json::Value> {
        if self.engine.cache.is_none() {
            return Vec::new();
        }
        let readers = self.readers.lock().unwrap();
        let mut out: Vec<(String, serde_json::Value)> = readers
            .iter()
            .map(|(dir, r)| {
                let ready = ahead(*dir, r.at, self.depth, &count)
                    .into_iter()
                    .take_while(|&(d, j)| self.ready(&r.kinds, d.global(j)))
                    .count();
                let name = dir.name();
                let v = serde_json::json!({"dir": name, "batch": r.at, "ahead": ready});
                (name, v)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.into_iter().map(|(_, v)| v).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(d: Batches) -> u64 {
        match d {
            Batches::Epoch(_) => 10,
            Batches::Rank { world, .. } => 10 / world,
        }
    }

    #[test]
    fn sequential_readers_get_the_next_batches_across_epochs() {
        assert_eq!(
            ahead(Batches::Epoch(0), 3, 3, count),
            vec![
                (Batches::Epoch(0), 4),
                (Batches::Epoch(0), 5),
                (Batches::Epoch(0), 6)
            ]
        );
        assert_eq!(
            ahead(Batches::Epoch(2), 8, 3, count),
            vec![
                (Batches::Epoch(2), 9),
                (Batches::Epoch(3), 0),
                (Batches::Epoch(3), 1)
            ]
        );
        assert!(ahead(Batches::Epoch(0), 0, 0, count).is_empty());
    }

    #[test]
    fn rank_readers_are_strided_and_stay_in_their_rank() {
        let r = |epoch| Batches::Rank {
            epoch,
            rank: 1,
            world: 3,
        };
        // 10 batches, world 3: each rank has 3; rank 1 reads global 1, 4, 7.
        let next = ahead(r(0), 1, 3, count);
        assert_eq!(next, vec![(r(0), 2), (r(1), 0), (r(1), 1)]);
        let globals: Vec<(u64, u64)> = next.iter().map(|&(d, j)| d.global(j)).collect();
        assert_eq!(globals, vec![(0, 7), (1, 1), (1, 4)]);
    }

    /// A reader going through an epoch one batch at a time, with the files `depth` ahead built
    /// and the row groups of the batches up to `horizon` ahead asked for: every batch past the
    /// first `depth` has its row groups asked for exactly once, in reading order, before the
    /// reader comes within `depth` of it; from the first step on, not only once the horizon
    /// has moved past the start.
    #[test]
    fn row_groups_are_asked_for_once_per_batch_up_to_the_horizon() {
        let (depth, horizon) = (3u64, 7u64);
        for dir in [
            Batches::Epoch(0),
            Batches::Rank {
                epoch: 0,
                rank: 2,
                world: 3,
            },
        ] {
            let n = count(dir);
            let mut warmed = None;
            let mut asked: Vec<(u64, u64)> = Vec::new();
            for i in 0..n {
                let walk = ahead(dir, i, horizon, count);
                let beyond = &walk[walk.len().min(depth as usize)..];
                let fresh = not_yet_warmed(beyond, &mut warmed);
                // The batch that comes within `depth` of the reader now (its file is built
                // next) had its row groups asked for at an earlier step.
                if let Some(&(d, j)) = ahead(dir, i, depth, count).last()
                    && i > 0
                {
                    assert!(
                        asked.contains(&d.global(j)),
                        "{dir:?} at {i}: batch {:?} has no row groups asked for",
                        d.global(j)
                    );
                }
                asked.extend(fresh);
            }
            let mut expected: Vec<(u64, u64)> = ahead(dir, 0, horizon + n - 1, count)
                .into_iter()
                .skip(depth as usize)
                .map(|(d, j)| d.global(j))
                .collect();
            expected.sort();
            let mut sorted = asked.clone();
            sorted.sort();
            assert_eq!(sorted, expected, "{dir:?}: each batch once, none skipped");
            assert_eq!(asked, sorted, "{dir:?}: asked for in reading order");
        }
    }

    #[test]
    fn an_empty_epoch_stops_the_walk() {
        let one = |_| 1;
        assert_eq!(
            ahead(Batches::Epoch(0), 0, 2, one),
            vec![(Batches::Epoch(1), 0), (Batches::Epoch(2), 0)]
        );
        assert_eq!(
            ahead(
                Batches::Rank {
                    epoch: 0,
                    rank: 0,
                    world: 20
                },
                0,
                4,
                count
            ),
            vec![]
        );
    }
}
