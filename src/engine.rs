//! The async core that produces batches: the plan says which rows batch `i` of epoch `e`
//! needs, the row groups holding them are read and transformed on the worker pool, and the
//! rows are gathered into the batch. One build per row group and per batch however many
//! readers wait for it; both are kept in memory within `memory_limit`.

use crate::cache::{DiskCache, Item};
use crate::format::{self, TensorLayout};
use crate::plan::{EpochOrder, Plan, Shuffle, Stride};
use crate::pool::{Pool, ReaderWaits};
use crate::prefetch::FileKind;
use crate::source::Source;
use crate::stats::Stats;
use crate::transform::{self, Columns};
use crate::view::View;
use anyhow::{Context, Result};
use lru::LruCache;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;
use tokio::sync::{OnceCell, Semaphore};

/// A built batch: every tensor's rows, and the safetensors header that goes in front of them.
#[derive(Debug)]
pub struct Batch {
    pub rows: u64,
    pub tensors: Vec<Vec<u8>>,
    pub safetensors_header: Vec<u8>,
}

/// Something whose memory a cache counts.
pub trait Weighted {
    fn weight(&self) -> usize;
}

impl Weighted for Batch {
    fn weight(&self) -> usize {
        self.tensors.iter().map(Vec::len).sum::<usize>() + self.safetensors_header.len()
    }
}

impl Weighted for Columns {
    fn weight(&self) -> usize {
        self.bytes()
    }
}

struct MemoState<K, V> {
    cache: LruCache<K, Arc<V>>,
    bytes: usize,
    flights: HashMap<K, Arc<OnceCell<Arc<V>>>>,
}

/// A byte-bounded LRU cache in front of single-flight builds: concurrent callers for one key
/// share one build.
pub struct Memo<K, V> {
    capacity: usize,
    state: Mutex<MemoState<K, V>>,
}

impl<K: Hash + Eq + Clone, V: Weighted> Memo<K, V> {
    pub fn new(capacity: usize) -> Self {
        Memo {
            capacity,
            state: Mutex::new(MemoState {
                cache: LruCache::unbounded(),
                bytes: 0,
                flights: HashMap::new(),
            }),
        }
    }

    pub async fn get_or_build<F>(&self, key: K, build: F) -> Result<Arc<V>>
    where
        F: Future<Output = Result<Arc<V>>>,
    {
        let cell = {
            let mut s = self.state.lock().unwrap();
            if let Some(v) = s.cache.get(&key) {
                return Ok(v.clone());
            }
            s.flights.entry(key.clone()).or_default().clone()
        };
        let value = cell.get_or_try_init(|| build).await?.clone();
        let mut s = self.state.lock().unwrap();
        if s.flights.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            s.flights.remove(&key);
            let w = value.weight();
            if w <= self.capacity {
                s.bytes += w;
                if let Some(old) = s.cache.put(key, value.clone()) {
                    s.bytes -= old.weight();
                }
                while s.bytes > self.capacity {
                    let Some((_, old)) = s.cache.pop_lru() else {
                        break;
                    };
                    s.bytes -= old.weight();
                }
            }
        }
        Ok(value)
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.state.lock().unwrap().bytes
    }
}

/// What materialising a batch file gave: its path in the cache, or nothing when the cache
/// could not take it (the file is then served from memory).
pub struct Materialized(pub Option<PathBuf>);

impl Weighted for Materialized {
    fn weight(&self) -> usize {
        // Never kept by the memo: it only makes concurrent materialisations of a file one.
        usize::MAX
    }
}

/// What the engine may use: worker threads, and bytes of memory for its caches.
pub struct Limits {
    pub threads: usize,
    pub memory: u64,
}

pub struct Engine {
    pub source: Arc<Source>,
    pub view: Arc<View>,
    pub plan: Plan,
    pub stats: Arc<Stats>,
    pub cache: Option<Arc<DiskCache>>,
    runtime: Handle,
    /// `threads` permits: row-group decodes and gathers run under one.
    workers: Arc<Semaphore>,
    /// Batch builds under way at once.
    builds: Semaphore,
    /// Row groups being fetched and decoded at once (`threads`): their bytes are held from the
    /// fetch to the end of the decode, so this bounds that memory.
    fetches: Semaphore,
    /// Decodes of row groups asked for ahead of every batch that needs them: `threads - 1`
    /// (at least one) at once, so a worker is left for the batches readers come to first.
    decodes_ahead: Semaphore,
    /// The low-priority threads that decode, transform, gather and write.
    pool: Pool,
    /// Global row-group index → (file, row group in file).
    row_groups: Vec<(usize, usize)>,
    decoded: Memo<usize, Columns>,
    batches: Memo<(u64, u64), Batch>,
    materializing: Memo<Item, Materialized>,
    epochs: Mutex<LruCache<u64, Arc<EpochOrder>>>,
    /// The (epoch, batch) most recently asked for: where readers are, for eviction.
    now: Mutex<(u64, u64)>,
}

impl Engine {
    pub fn new(
        source: Arc<Source>,
        view: Arc<View>,
        plan: Plan,
        stats: Arc<Stats>,
        cache: Option<Arc<DiskCache>>,
        runtime: Handle,
        limits: Limits,
    ) -> Engine {
        let row_groups = source
            .files
            .iter()
            .enumerate()
            .flat_map(|(f, file)| (0..file.row_groups()).map(move |rg| (f, rg)))
            .collect();
        let half = (limits.memory / 2) as usize;
        Engine {
            source,
            view,
            plan,
            stats,
            cache,
            runtime,
            workers: Arc::new(Semaphore::new(limits.threads)),
            builds: Semaphore::new(2 * limits.threads),
            fetches: Semaphore::new(limits.threads),
            decodes_ahead: Semaphore::new(limits.threads.saturating_sub(1).max(1)),
            pool: Pool::new(limits.threads).expect("the transform workers start"),
            row_groups,
            decoded: Memo::new(half),
            batches: Memo::new(half),
            materializing: Memo::new(0),
            epochs: Mutex::new(LruCache::new(8.try_into().unwrap())),
            now: Mutex::new((0, 0)),
        }
    }

    fn epoch_order(&self, epoch: u64) -> Arc<EpochOrder> {
        let mut epochs = self.epochs.lock().unwrap();
        epochs
            .get_or_insert(epoch, || Arc::new(self.plan.epoch(epoch)))
            .clone()
    }

    /// The tensor layouts of a batch of `rows` rows, in file order.
    pub fn layouts(&self, rows: u64) -> Vec<TensorLayout<'_>> {
        self.view
            .tensors
            .iter()
            .map(|t| TensorLayout {
                name: &t.name,
                dtype: t.dtype,
                shape: t.shape(rows),
            })
            .collect()
    }

    /// The cache item of file `kind` of batch `batch` of `epoch`. Where epochs repeat
    /// (`shuffle=none`), every epoch's is epoch 0's: one file, built once, for all of them.
    pub fn item(&self, kind: FileKind, epoch: u64, batch: u64) -> Item {
        kind.item(self.plan.same_as(epoch), batch)
    }

    /// Batch `i` of `epoch`, built on first use.
    pub async fn batch(&self, epoch: u64, i: u64) -> Result<Arc<Batch>> {
        let epoch = self.plan.same_as(epoch);
        self.batches
            .get_or_build((epoch, i), self.build_batch(epoch, i))
            .await
    }

    #[tracing::instrument(name = "build", level = "debug", skip(self))]
    async fn build_batch(&self, epoch: u64, i: u64) -> Result<Arc<Batch>> {
        // A build holds its row groups from the moment they are decoded until its rows are
        // gathered: bounding the builds at once bounds that memory, beyond the caches.
        let _build = self.builds.acquire().await?;
        let order = self.epoch_order(epoch);
        let rows: Vec<(usize, usize)> = self
            .plan
            .batch_rows(&order, i)
            .into_iter()
            .map(|r| {
                let (rg, row) = self.plan.locate(r);
                (rg, row as usize)
            })
            .collect();
        let needed: BTreeSet<usize> = rows.iter().map(|&(rg, _)| rg).collect();
        let decoded =
            futures::future::try_join_all(needed.iter().map(|&g| self.row_group(g, false))).await?;
        let by_rg: HashMap<usize, Arc<Columns>> = needed.into_iter().zip(decoded).collect();

        let _permit = self.workers.acquire().await?;
        let view = self.view.clone();
        let n = rows.len() as u64;
        let header = format::safetensors_header(&self.layouts(n));
        let tensors = self
            .pool
            .run(move || {
                let picks: Vec<(&Columns, usize)> = rows
                    .iter()
                    .map(|&(rg, r)| (by_rg[&rg].as_ref(), r))
                    .collect();
                transform::gather(&view, &picks)
            })
            .await?;
        Stats::add(&self.stats.c.batches_built, 1);
        Ok(Arc::new(Batch {
            rows: n,
            tensors,
            safetensors_header: header,
        }))
    }

    /// Decodes (or loads) the row groups the batches `batches` (epoch, batch) need, ahead of
    /// building them, in that order: the prefetcher starts a row group's decode well before the
    /// first batch that needs it.
    pub async fn warm_row_groups(&self, batches: &[(u64, u64)]) -> Result<()> {
        let mut seen = BTreeSet::new();
        let mut needed = Vec::new();
        for &(epoch, i) in batches {
            let order = self.epoch_order(epoch);
            for r in self.plan.batch_rows(&order, i) {
                let g = self.plan.locate(r).0;
                if seen.insert(g) {
                    needed.push(g);
                }
            }
        }
        // Each row group is let go as soon as it is decoded: the memo keeps what fits.
        let decodes = needed
            .into_iter()
            .map(|g| async move { self.row_group(g, true).await.map(drop) });
        futures::future::try_join_all(decodes).await?;
        Ok(())
    }

    /// Batches a row group (or a shuffle window of them) spans: how far ahead the prefetcher
    /// starts decoding so that a reader never waits for a whole row group at its boundary.
    pub fn row_group_lookahead(&self) -> u64 {
        let o = self.plan.options();
        let per_window = match o.shuffle {
            Shuffle::None => 1,
            Shuffle::Window => o.window,
            // Every batch needs every row group: nothing to look ahead to.
            Shuffle::Global => return 0,
        };
        // With P partitions, batches draw from them in turn: a row group's rows are spread over
        // P times as many batches of the epoch.
        (self.plan.max_row_group_rows() * per_window * o.partitions).div_ceil(o.batch_size)
    }

    /// How many batches ahead of a reader the prefetcher starts decoding the row groups (the
    /// window) it will need. Two windows where four windows' columns fit the memory for decoded
    /// columns: two fetch and decode while the reader goes through a third, so a slow source
    /// (a fetch as long as the reading of a window) never makes the reader wait at a boundary.
    /// One window where three fit; else half a window, so that no window is decoded twice.
    pub fn row_group_lead(&self) -> u64 {
        let ahead = self.row_group_lookahead();
        let row: usize = self.view.tensors.iter().map(|t| t.row_bytes()).sum();
        let window = ahead * self.plan.options().batch_size * row as u64;
        let room = self.decoded.capacity as u64;
        if 4 * window <= room {
            2 * ahead
        } else if 3 * window <= room {
            ahead
        } else {
            ahead.div_ceil(2)
        }
    }

    /// Row group `g` (global index): from memory, from the local cache, or read, decoded and
    /// transformed (and then cached). `ahead`: asked for ahead of the batches that need it (see
    /// `decodes_ahead`); the decode started by the first caller keeps that caller's rank.
    #[tracing::instrument(name = "decode", level = "debug", skip(self))]
    async fn row_group(&self, g: usize, ahead: bool) -> Result<Arc<Columns>> {
        self.decoded
            .get_or_build(g, async {
                let (file, rg) = self.row_groups[g];
                let source = self.source.clone();
                let view = self.view.clone();
                let runtime = self.runtime.clone();
                let cache = self.cache.clone();
                let stats = self.stats.clone();
                let distance = self.distance_fn();
                // Every global batch gathers from every row group: map them, not copy them.
                let map = self.plan.options().shuffle == Shuffle::Global;
                let repeat = self.plan.epochs_repeat();
                // From the local cache where it is there: a file read, on a worker.
                let tensors = view.tensors.len();
                let load =
                    move |c: &DiskCache, stats: &Stats| c.load_columns(g, tensors, map, stats);
                let permit = self.workers.acquire().await?;
                let (c, st) = (cache.clone(), stats.clone());
                if let Some(l) = self
                    .pool
                    .run(move || c.as_deref().and_then(|c| load(c, &st)))
                    .await?
                {
                    Stats::add(&stats.c.column_hits, 1);
                    return Ok(Arc::new(Columns::loaded(l)));
                }
                Stats::add(&stats.c.column_misses, 1);
                // Else fetched without holding a worker (waiting on the network is no work),
                // then decoded and transformed on one: CPU work on a blocking thread, never on
                // the async workers.
                drop(permit);
                let _fetching = self.fetches.acquire().await?;
                let started = std::time::Instant::now();
                let fetched = source.fetch_row_group(file, rg, &view.roots).await?;
                let _ahead = match ahead {
                    true => Some(self.decodes_ahead.acquire().await?),
                    false => None,
                };
                let _permit = self.workers.acquire().await?;
                let columns = self
                    .pool
                    .run(move || -> Result<Columns> {
                        tracing::debug!("decoding row group {g}");
                        let batch = runtime.block_on(source.decode_row_group(fetched))?;
                        let t = transform::transform(&view, &batch).with_context(|| {
                            format!("file '{}' row group {rg}", source.files[file].name)
                        })?;
                        Stats::add(&stats.c.row_groups_decoded, 1);
                        Stats::add(&stats.c.rows_decoded, t.rows as u64);
                        Stats::add(&stats.c.pad_truncated, t.truncated);
                        Stats::add(&stats.c.decode_ns, started.elapsed().as_nanos() as u64);
                        // Where epochs repeat, the batch files are all that is needed again:
                        // keeping the columns too would write every byte twice.
                        if let Some(c) = cache.as_ref().filter(|_| !repeat) {
                            let parts: Vec<&[u8]> = t.tensors.iter().map(Vec::as_slice).collect();
                            let stored = c.store_columns(g, t.rows, &parts, &*distance, &stats);
                            if stored
                                && map
                                && let Some(l) = load(c, &stats)
                            {
                                return Ok(Columns::loaded(l));
                            }
                        }
                        Ok(Columns::owned(t.rows, t.tensors))
                    })
                    .await??;
                Ok(Arc::new(columns))
            })
            .await
    }

    /// How far ahead of the readers an item is next needed, in rows (`u64::MAX`: never).
    fn distance_fn(&self) -> Box<dyn Fn(Item) -> u64 + Send + Sync> {
        let (epoch, batch) = *self.now.lock().unwrap();
        let per_epoch = self.plan.epoch_rows().max(1);
        let bs = self.plan.options().batch_size;
        let now = epoch * per_epoch + batch * bs;
        let (this, next) = (self.epoch_order(epoch), self.epoch_order(epoch + 1));
        let plan = self.plan.clone();
        let cache = self.cache.clone();
        let repeat = plan.epochs_repeat();
        // A row group is needed again by the first batch that may draw from it, from here on,
        // that is not in the cache yet; after that, by the next epoch.
        let needed_in = move |strides: Vec<Stride>, from: u64| -> Option<u64> {
            strides
                .iter()
                .filter_map(|s| {
                    let mut members = s.from(from);
                    if s.count > 64 {
                        // A set that large (shuffle=global) is needed by every batch alike.
                        return members.next();
                    }
                    members.find(|&b| !cache.as_ref().is_some_and(|c| c.has_batch(epoch, b)))
                })
                .min()
                .map(|b| (b - from) * bs)
        };
        Box::new(move |item| match item {
            Item::Columns { rg } => {
                let at = batch * bs;
                needed_in(plan.row_group_batches(&this, rg), batch).unwrap_or_else(|| {
                    let first = plan
                        .row_group_batches(&next, rg)
                        .iter()
                        .map(|s| s.first)
                        .min();
                    first.map_or(u64::MAX, |b| per_epoch - at + b * bs)
                })
            }
            _ => {
                let (e, i) = item.batch().expect("a batch item");
                if repeat {
                    // Every epoch reads it again: it is needed when the readers come round.
                    (i * bs + per_epoch - batch * bs % per_epoch) % per_epoch
                } else {
                    (e * per_epoch + i * bs)
                        .checked_sub(now)
                        .unwrap_or(u64::MAX)
                }
            }
        })
    }

    /// The batch file `item` in the local cache, checked, materialising it first if needed.
    /// `None`: the cache cannot hold it; serve it from memory.
    pub async fn materialize(&self, item: Item) -> Result<Option<(std::fs::File, PathBuf)>> {
        let (epoch, batch) = item.batch().expect("a batch item");
        self.reader_at(epoch, batch);
        let _waits = self.pool.reader_waits();
        self.materialize_ahead(item).await
    }

    /// A reader waits for something the workers build until the guard is dropped (see
    /// [`Pool::reader_waits`]).
    pub fn reader_waits(&self) -> ReaderWaits<'_> {
        self.pool.reader_waits()
    }

    /// Where readers are (the batch last asked for), for eviction.
    pub fn reader_at(&self, epoch: u64, batch: u64) {
        *self.now.lock().unwrap() = (epoch, batch);
    }

    /// Materialises a batch file a reader will want next; readers' position stays as it is.
    pub async fn prefetch(&self, item: Item) -> Result<()> {
        if self.cache.as_ref().is_some_and(|c| !c.contains(item)) {
            self.materialize_ahead(item).await?;
        }
        Ok(())
    }

    #[tracing::instrument(name = "materialize", level = "debug", skip(self))]
    async fn materialize_ahead(&self, item: Item) -> Result<Option<(std::fs::File, PathBuf)>> {
        let Some(cache) = self.cache.clone() else {
            return Ok(None);
        };
        let (epoch, batch) = item.batch().expect("a batch item");
        let stats = self.stats.clone();
        let lookup = cache.clone();
        let hit = tokio::task::spawn_blocking(move || lookup.open_batch_file(item, &stats)).await?;
        if let Some(hit) = hit {
            Stats::add(&self.stats.c.batch_file_hits, 1);
            return Ok(Some(hit));
        }
        let made = self
            .materializing
            .get_or_build(item, async {
                Stats::add(&self.stats.c.batch_file_misses, 1);
                let b = self.batch(epoch, batch).await?;
                let cache = cache.clone();
                let stats = self.stats.clone();
                let distance = self.distance_fn();
                let view = self.view.clone();
                let path = self
                    .pool
                    .run(move || {
                        let npy_header;
                        let parts: Vec<&[u8]> = match item {
                            Item::Npy { tensor, .. } => {
                                let t = &view.tensors[tensor];
                                npy_header = format::npy_header(t.dtype, &t.shape(b.rows));
                                vec![&npy_header, &b.tensors[tensor]]
                            }
                            _ => std::iter::once(b.safetensors_header.as_slice())
                                .chain(b.tensors.iter().map(Vec::as_slice))
                                .collect(),
                        };
                        let stored = cache.store_batch_file(item, &parts, &*distance, &stats);
                        if stored.is_some() {
                            Stats::add(&stats.c.batch_files_written, 1);
                        }
                        stored.map(|(_, p)| p)
                    })
                    .await?;
                Ok(Arc::new(Materialized(path)))
            })
            .await?;
        Ok(match &made.0 {
            Some(path) => std::fs::File::open(path).ok().map(|f| (f, path.clone())),
            None => None,
        })
    }

    /// Bytes of row groups and built batches held in the daemon's memory.
    pub fn memory(&self) -> usize {
        self.decoded.bytes() + self.batches.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Blob(usize);
    impl Weighted for Blob {
        fn weight(&self) -> usize {
            self.0
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_callers_share_one_build() {
        let memo: Arc<Memo<u32, Blob>> = Arc::new(Memo::new(1000));
        let builds = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let memo = memo.clone();
                let builds = builds.clone();
                tokio::spawn(async move {
                    memo.get_or_build(7, async {
                        builds.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok(Arc::new(Blob(10)))
                    })
                    .await
                    .unwrap()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().0, 10);
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_cache_stays_within_its_capacity() {
        let memo: Memo<u32, Blob> = Memo::new(100);
        for k in 0..50 {
            memo.get_or_build(k, async { Ok(Arc::new(Blob(30))) })
                .await
                .unwrap();
            assert!(memo.bytes() <= 100);
        }
        assert_eq!(memo.bytes(), 90);
        // Too large to keep: served, not cached.
        memo.get_or_build(99, async { Ok(Arc::new(Blob(500))) })
            .await
            .unwrap();
        assert!(memo.bytes() <= 100);
    }

    #[tokio::test]
    async fn a_failed_build_is_retried_by_the_next_caller() {
        let memo: Memo<u32, Blob> = Memo::new(100);
        assert!(
            memo.get_or_build(1, async { anyhow::bail!("boom") })
                .await
                .is_err()
        );
        assert_eq!(
            memo.get_or_build(1, async { Ok(Arc::new(Blob(1))) })
                .await
                .unwrap()
                .0,
            1
        );
    }
}
