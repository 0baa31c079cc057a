//! The prefetcher: it follows each reader through the plan and keeps the next `prefetch`
//! batches ready ahead of it (a shuffled epoch's files stored in the kernel's page cache, files
//! the cache keeps materialised, or, for a reader of the one-open files, the tensor it reads of
//! them gathered in memory), across epoch boundaries, within the memory budget (the builder's
//! memos, [`crate::read::produce::budget`]).
//!
//! A reader is a directory read in order: an epoch directory, or a rank view (whose batches
//! are strided through the epoch). What it reads next is known from the plan, so the files it
//! will open are built before it asks. Builds share the engine's worker pool (whose semaphore is
//! fair, so several readers are served in turn) and its single-flight, so a batch is built once
//! however many readers and prefetches want it.
//!
//! Beyond those `prefetch` files, a reader of batch files in a shuffled epoch has the batch
//! files of the same directory's next epoch stored in idle time ([`NextEpoch`]), up to an
//! eighth of the host's memory, so that a reader
//! that comes to it faster than it can be built (a trainer's data loader at the start of an
//! epoch, or after a pause for a checkpoint) reads it as a warm epoch.

use crate::model::item::{FileKind, Item};
use crate::model::plan::{BatchRef, Batches, Chain, Plan, Shuffle};
use crate::read::follow::page_cache::{
    Filler, PageCache, RowStores, RowsToStore, TRIPWIRE_PAGE, ToStore,
};
use crate::read::layout::{ALL, ALL_SAFETENSORS, Layout, dir_name};
use crate::read::produce::budget::ROWS_AHEAD_BYTES;
use crate::read::produce::builder::{Builder, Here};
use crate::read::produce::materialize::Materializer;
use crate::read::produce::pool::Lane;
use crate::read::readers::{Event, Readers, What};
use crate::stats::Stats;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// The `depth` batches that follow batch `i` of directory `dir`, crossing into the next epoch
/// (the same rank's view of it, for a rank view). A pure function of the plan, so what is
/// prefetched is what will be read.
pub(crate) fn ahead(plan: &Plan, dir: Batches, i: u64, depth: u64) -> Vec<(Batches, u64)> {
    let mut out = Vec::new();
    let (mut d, mut j) = (dir, i);
    for _ in 0..depth {
        j += 1;
        if j >= plan.count(d) {
            d = d.next_epoch();
            j = 0;
            if plan.count(d) == 0 {
                break;
            }
        }
        out.push((d, j));
    }
    out
}

pub(crate) struct Prefetcher {
    materializer: Arc<Materializer>,
    builder: Arc<Builder>,
    stats: Arc<Stats>,
    readers: Arc<Readers>,
    runtime: Handle,
    depth: u64,
    /// How many batches ahead of a reader of one-open files their rows are gathered and stored
    /// ([`rows_depth`]).
    rows_depth: u64,
    /// Where what follows each reader of a tensor's rows was last scheduled, by chain of
    /// directories and tensor: (epoch, batch) ([`Prefetcher::rows_due`]).
    rows_scheduled: Mutex<HashMap<(Chain, usize), (u64, u64)>>,
    /// Epochs the mount lists.
    epochs: u64,
    /// Items being prefetched now.
    scheduled: Arc<Mutex<HashSet<Item>>>,
    next_epoch: Arc<NextEpoch>,
    /// Where epochs are shuffled: the files built for a reader go into the page cache.
    filler: Arc<Filler>,
    /// The rows gathered ahead of a reader of one-open files the daemon serves, stored in
    /// their page cache.
    row_stores: Arc<OnceLock<RowStores>>,
    /// The mount's page cache, where the names of files a reader opens next are made known.
    page_cache: OnceLock<PageCache>,
    /// Directories whose files' names a job is making known now.
    naming: Arc<Mutex<HashSet<Batches>>>,
    layout: Arc<Layout>,
}

impl Prefetcher {
    pub(crate) fn new(
        materializer: Arc<Materializer>,
        builder: Arc<Builder>,
        readers: Arc<Readers>,
        layout: Arc<Layout>,
        runtime: Handle,
        depth: u64,
        epochs: u64,
    ) -> Prefetcher {
        let filler = Arc::new(Filler::new(builder.clone(), layout.clone()));
        let stats = builder.stats().clone();
        let next_epoch = Arc::new(NextEpoch {
            materializer: materializer.clone(),
            builder: builder.clone(),
            stats: stats.clone(),
            readers: readers.clone(),
            layout: layout.clone(),
            depth,
            walks: Mutex::default(),
            filler: filler.clone(),
            stored_ahead: memory_total().map_or(1 << 30, |m| m / 8),
        });
        let rows_depth = rows_depth(depth, builder.batch_bytes());
        Prefetcher {
            materializer,
            builder,
            stats,
            readers,
            runtime,
            depth,
            rows_depth,
            rows_scheduled: Mutex::default(),
            epochs,
            scheduled: Arc::default(),
            next_epoch,
            filler,
            row_stores: Arc::default(),
            page_cache: OnceLock::new(),
            naming: Arc::default(),
            layout,
        }
    }

    /// From now on, the rows gathered ahead of a reader of a one-open file served by the daemon
    /// are stored in its page cache, and the names of the batch files a reader opens next made
    /// known to the kernel ahead of it.
    pub(crate) fn use_page_cache(&self, page_cache: PageCache) {
        let _ = self.page_cache.set(page_cache.clone());
        let (depth, tensors) = (self.rows_depth, self.layout.tensors());
        match RowStores::start(page_cache, self.stats.clone(), depth, tensors) {
            Ok(stores) => {
                let _ = self.row_stores.set(stores);
            }
            Err(e) => tracing::warn!("rows of one-open files are not stored ahead: {e}"),
        }
    }

    /// From now on, the files built for a reader are stored in the kernel's page cache of the
    /// files it opens, instead of written to the cache; with `tripwires` (`opens=kernel`) the
    /// prefetcher stores them itself, else their opens do.
    pub(crate) fn store_in(&self, page_cache: PageCache, tripwires: bool) {
        self.filler.set(page_cache, tripwires);
    }

    /// What stores the files of shuffled epochs in the page cache.
    pub(crate) fn filler(&self) -> &Arc<Filler> {
        &self.filler
    }

    /// Starts `work` on the runtime, counted as work pending from now until it ends.
    fn spawn_counted(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        spawn_counted(&self.runtime, &self.stats, work)
    }

    fn plan(&self) -> &Plan {
        self.builder.plan()
    }

    /// A reader read what `event` says: move its position, and where it reads in order,
    /// schedule what follows.
    pub(crate) fn follow(&self, event: Event) {
        let depth = match event.what {
            What::Rows { .. } => self.rows_depth,
            _ => self.depth,
        };
        // A reader seen at each tripwire moves by half the depth between sightings.
        let Some(step) = self.readers.step(event, depth.max(2)) else {
            return;
        };
        if depth == 0 || !step.sequential {
            return;
        }
        let (dir, i) = (event.dir, event.last);
        if let What::Rows { t, .. } = event.what
            && !self.rows_due(dir, t, i, depth)
        {
            return;
        }
        // Past the listed epochs only if the reader is there already: at the end of a job
        // nothing reads the epoch after the last.
        let last = self.epochs.max(dir.global(i).0 + 1);
        // The batches whose files are built next, then those whose row groups are decoded
        // further ahead (the lead): one walk of the plan.
        let lead = self.builder.row_group_lead();
        let walk = ahead(self.plan(), dir, i, depth + lead);
        let (files, beyond) = walk.split_at(walk.len().min(depth as usize));
        self.build_files(files, &step.kinds, event.what, last);
        self.decode_row_groups(dir, beyond, &step.kinds, last);
        self.decode_blocks(files, &step.kinds, last);
        if !step.kinds.is_empty() {
            (self.next_epoch).reader_at(&self.runtime, dir, i, &step.kinds, self.epochs);
        }
    }

    /// Whether the reader of tensor `t`'s rows in `dir`, at batch `i`, is due what follows: not
    /// where what follows was scheduled less than half the depth ago. A reader faster than the
    /// gathers reads each batch from the daemon, and each read walked the whole depth again
    /// (with 8 MiB ahead of 80-byte rows: 400 batches looked up for each batch read).
    fn rows_due(&self, dir: Batches, t: usize, i: u64, depth: u64) -> bool {
        let epoch = dir.global(0).0;
        let mut scheduled = self.rows_scheduled.lock().unwrap();
        let at = scheduled
            .entry((dir.chain(), t))
            .or_insert((epoch, u64::MAX));
        let scheduled_lately = at.0 == epoch && at.1 <= i && i < at.1.saturating_add(depth / 2);
        if !scheduled_lately {
            *at = (epoch, i);
        }
        !scheduled_lately
    }

    /// Materialises the files `kinds` of the batches `files`, each once however many readers
    /// want it, or, for a reader of the one-open files, gathers the tensor it reads of each.
    fn build_files(&self, files: &[(Batches, u64)], kinds: &[FileKind], what: What, last: u64) {
        let to_disk = self.to_disk(kinds);
        if to_disk && self.filler.on() && !self.filler.tripwires() {
            return self.store_files(files, kinds, last);
        }
        if !to_disk {
            if let What::Rows { t, file, .. } = what {
                self.build_tensors(files, t, file, last);
            }
            return;
        }
        let mut next = Vec::new();
        for &(d, j) in files {
            if d.global(j).0 >= last {
                break;
            }
            let b = self.plan().batch_in(d, j);
            for &kind in kinds {
                if self.filler.tripwires() {
                    self.fill(d, j, kind, stored_from(j, self.depth / 2));
                    continue;
                }
                let item = Item::of(kind, b);
                if self.materializer.checked_already(item)
                    || !self.scheduled.lock().unwrap().insert(item)
                {
                    continue;
                }
                let materializer = self.materializer.clone();
                let scheduled = self.scheduled.clone();
                Stats::add(&self.stats.c.prefetch_scheduled, 1);
                self.spawn_counted(async move {
                    if let Err(e) = materializer.prefetch(item).await {
                        tracing::warn!("prefetch of {item:?}: {}", crate::describe(&e));
                    }
                    scheduled.lock().unwrap().remove(&item);
                });
            }
            next.push((d, j));
        }
        if !self.filler.tripwires() {
            self.make_known(next, kinds);
        }
    }

    /// Makes the names of the files `kinds` of the batches `files`, which the cache keeps and
    /// their opens serve by passthrough (no store makes them known), known to the kernel ahead
    /// of their reader, for whom a lookup of each would be a round trip: off the calling thread,
    /// one job a directory at a time.
    fn make_known(&self, files: Vec<(Batches, u64)>, kinds: &[FileKind]) {
        let (Some(page_cache), Some(&first)) = (self.page_cache.get(), kinds.first()) else {
            return;
        };
        // One listing names them all (a batch's directory, or the batch files of about 97).
        let unnamed: Vec<(Batches, u64)> = (files.into_iter())
            .filter(|&(d, j)| !page_cache.file_known(&self.layout, d, j, first))
            .collect();
        let Some(&(dir, _)) = unnamed.first() else {
            return;
        };
        if !self.naming.lock().unwrap().insert(dir) {
            return;
        }
        let (page_cache, layout) = (page_cache.clone(), self.layout.clone());
        let (kinds, naming) = (kinds.to_vec(), self.naming.clone());
        let pending = self.stats.pending();
        self.runtime.spawn_blocking(move || {
            let _pending = pending;
            // Done with `dir` however this ends.
            let _naming = Naming(naming, dir);
            for (d, j) in unnamed {
                for &kind in &kinds {
                    // Where it cannot be made known, its reader looks it up.
                    let _ = page_cache.make_file_known(&layout, d, j, kind);
                }
            }
        });
    }

    /// Stores file `kind` of batch `j` of `dir` in the page cache from byte `from` on, once
    /// however many readers want it.
    fn fill(&self, dir: Batches, j: u64, kind: FileKind, from: u64) {
        if !self.filler.claim(dir, j, kind) {
            return;
        }
        let filler = self.filler.clone();
        Stats::add(&self.stats.c.prefetch_scheduled, 1);
        self.spawn_counted(async move {
            // Its reader reads it from the daemon instead (the same bytes), and meets any
            // error of the build there; a store fails as a mount goes away.
            if let Err(e) = filler.fill(dir, j, kind, from).await {
                tracing::debug!(
                    "prefetch of {} batch {j}: {}",
                    crate::read::layout::dir_name(dir),
                    crate::describe(&e)
                );
            }
        });
    }

    /// Whether a reader opening the batch files `kinds` is served from materialised files, or
    /// from memory (a reader of the one-open files only: they are gathered tensor by tensor,
    /// and batch files written for them would be read by nobody).
    fn to_disk(&self, kinds: &[FileKind]) -> bool {
        !kinds.is_empty()
    }

    /// Whether batch `b` has its `.safetensors` file materialised (where the one-open files
    /// read it from).
    fn on_disk(&self, b: BatchRef) -> bool {
        self.materializer
            .contains(Item::of(FileKind::Safetensors, b))
    }

    /// Stores in the page cache the files `kinds` of the batches `files` (up to the listed
    /// epoch `last`), each once however many readers want it, so that their opens find them
    /// stored: by one worker's job where the batches' row groups are in memory (a shuffled
    /// epoch from cached columns), and only once half the depth is missing or the nearest
    /// batch is, so that one hand-off to a worker serves several files (measured: each costs
    /// more CPU than a small batch's gather). Stored ahead, not by the open: a store on the
    /// open's path made a reader at half the cold rate wait 300-400 us an open.
    fn store_files(&self, files: &[(Batches, u64)], kinds: &[FileKind], last: u64) {
        let missing: Vec<(Batches, u64)> = (files.iter().copied())
            .take_while(|&(d, j)| d.global(j).0 < last)
            .filter(|&(d, j)| !kinds.iter().all(|&k| self.filler.has(d, j, k)))
            .collect();
        let wanted = (self.depth / 2).max(1) as usize;
        if missing.is_empty() || (missing.len() < wanted && missing.first() != files.first()) {
            return;
        }
        let todo: Vec<ToStore> = (missing.into_iter())
            .flat_map(|(d, j)| kinds.iter().map(move |&k| (d, j, k, 0)))
            .filter(|&(d, j, k, _)| self.filler.claim(d, j, k))
            .collect();
        if todo.is_empty() {
            return;
        }
        Stats::add(&self.stats.c.prefetch_scheduled, todo.len() as u64);
        let (filler, runtime) = (self.filler.clone(), self.runtime.clone());
        let pool = self.builder.clone();
        let pending = self.stats.pending();
        pool.pool().serve(move || {
            let (_, left) = filler.fill_here(todo);
            if left.is_empty() {
                return;
            }
            runtime.spawn(async move {
                let _pending = pending;
                if let Err(e) = filler.fill_left(left, Lane::Serving).await {
                    // Its reader builds it on its open, and meets the error there.
                    tracing::debug!("prefetch: {}", crate::describe(&e));
                }
            });
        });
    }

    /// For a reader of tensor `t` through one-open file `file`: gathers the tensor (and those
    /// read with it) of each batch of `files` into memory, once however many readers want it,
    /// and stores it in the page cache of the file, whence the reader reads it. A job on the
    /// workers for every [`TENSOR_JOB_BATCHES`] batches, each gathered there while its row
    /// groups are in memory (a block's, once decoded or mapped from the cache); the rest, from
    /// the first that is not, each a job of its own that waits for its decode. A job a batch,
    /// the hand-offs between threads (an async worker's, a worker's and back) took more CPU
    /// than the gathers of small rows: 7 a batch of 12 tensors of 4 to 8 bytes.
    fn build_tensors(&self, files: &[(Batches, u64)], t: usize, file: FileKind, last: u64) {
        let builder = &self.builder;
        // The tensors read together are gathered in one job ([`Builder::tensor`]): the lowest's
        // .npy item stands for them all in the set of what is scheduled, so that each batch is
        // one job, not one a tensor (each of which found the others' gather under way).
        let lowest = builder.read_with(t).into_iter().fold(t, usize::min);
        let store = self.rows_store(t, file);
        let mut todo = Vec::new();
        for &(d, j) in files {
            if d.global(j).0 >= last {
                break;
            }
            let b = self.plan().batch_in(d, j);
            // A batch whose file is materialised is read from it: nothing to gather.
            if self.on_disk(b) {
                continue;
            }
            if builder.has_tensor(b, t) {
                store(builder, d, j, b);
                continue;
            }
            let item = Item::of(FileKind::Npy(lowest), b);
            if self.scheduled.lock().unwrap().insert(item) {
                todo.push((d, j, b, item));
            }
        }
        if todo.is_empty() {
            return;
        }
        Stats::add(&self.stats.c.prefetch_scheduled, todo.len() as u64);
        for chunk in todo.chunks(TENSOR_JOB_BATCHES) {
            self.gather_here_or_later(chunk.to_vec(), t, store.clone());
        }
    }

    /// One job on the workers for the batches `todo` of [`Prefetcher::build_tensors`].
    fn gather_here_or_later(
        &self,
        todo: Vec<(Batches, u64, BatchRef, Item)>,
        t: usize,
        store: impl Fn(&Builder, Batches, u64, BatchRef) + Clone + Send + Sync + 'static,
    ) {
        let (builder, scheduled) = (self.builder.clone(), self.scheduled.clone());
        let (runtime, stats) = (self.runtime.clone(), self.stats.clone());
        let pending = self.stats.pending();
        self.builder.pool().ahead(Lane::Workers, move || {
            let _pending = pending;
            let mut left = Vec::new();
            for (k, &(d, j, b, item)) in todo.iter().enumerate() {
                match builder.tensor_here(b, t) {
                    Here::Held => {
                        store(&builder, d, j, b);
                        scheduled.lock().unwrap().remove(&item);
                    }
                    Here::UnderWay => left.push((d, j, b, item)),
                    Here::NotInMemory => {
                        left.extend_from_slice(&todo[k..]);
                        break;
                    }
                }
            }
            for (d, j, b, item) in left {
                let (builder, scheduled, store) =
                    (builder.clone(), scheduled.clone(), store.clone());
                spawn_counted(&runtime, &stats, async move {
                    match builder.tensor_to_store(b, t).await {
                        Ok(_) => store(&builder, d, j, b),
                        Err(e) => {
                            tracing::warn!("prefetch of {b} tensor {t}: {}", crate::describe(&e))
                        }
                    }
                    scheduled.lock().unwrap().remove(&item);
                });
            }
        });
    }

    /// What stores tensor `t` (and those read with it) of batch `b`, batch `j` of `dir`, held
    /// in memory, in the page cache of one-open file `file` ([`store_rows`]).
    fn rows_store(
        &self,
        t: usize,
        file: FileKind,
    ) -> impl Fn(&Builder, Batches, u64, BatchRef) + Clone + Send + Sync + 'static {
        let (stores, layout) = (self.row_stores.clone(), self.layout.clone());
        let every = (self.rows_depth / 2).max(1);
        move |builder: &Builder, dir: Batches, j: u64, b: BatchRef| {
            if let Some(stores) = stores.get() {
                store_rows(builder, &layout, stores, (dir, j, file), t, b, every);
            }
        }
    }

    /// Each batch between the files being built and the horizon has its row groups asked for
    /// once, nearest first, from the reader's first steps on, so every batch's row groups are
    /// decoded well before its file is built. Queued after the files, which come first.
    fn decode_row_groups(
        &self,
        dir: Batches,
        beyond: &[(Batches, u64)],
        kinds: &[FileKind],
        last: u64,
    ) {
        // Batches whose files are there already (a warm epoch) need nothing decoded.
        let not_warmed: HashSet<(u64, u64)> = self
            .readers
            .not_yet_warmed(dir, beyond)
            .into_iter()
            .collect();
        let fresh: Vec<(u64, u64)> = (beyond.iter())
            .filter(|&&(d, j)| not_warmed.contains(&d.global(j)) && !self.built(kinds, d, j))
            .map(|&(d, j)| d.global(j))
            .filter(|g| g.0 < last)
            .collect();
        if fresh.is_empty() {
            return;
        }
        // Chosen in the task, unlike the blocks below: the batches past the files being built
        // may be hundreds, each its row groups looked up, too many for the thread that serves
        // the reader's requests.
        let builder = self.builder.clone();
        self.spawn_counted(async move {
            let needed = builder.row_groups_to_warm(&fresh);
            if let Err(e) = builder.warm(needed).await {
                tracing::warn!(
                    "prefetch of the row groups of (epoch, batch) {:?}: {}",
                    fresh.first(),
                    crate::describe(&e)
                );
            }
        });
    }

    /// Under `shuffle=block`, the blocks the next batches draw from, and the blocks after them,
    /// have their row groups asked for once each ([`Builder::blocks_to_warm`]).
    fn decode_blocks(&self, files: &[(Batches, u64)], kinds: &[FileKind], last: u64) {
        if self.plan().options().shuffle != Shuffle::Block {
            return;
        }
        let wanted: Vec<(u64, u64)> = (files.iter())
            .filter(|&&(d, j)| !self.built(kinds, d, j))
            .map(|&(d, j)| d.global(j))
            .filter(|g| g.0 < last)
            .collect();
        let needed = self.builder.blocks_to_warm(&wanted);
        if needed.is_empty() {
            return;
        }
        let builder = self.builder.clone();
        self.spawn_counted(async move {
            if let Err(e) = builder.warm(needed).await {
                tracing::warn!(
                    "prefetch of the blocks of (epoch, batch) {:?}: {}",
                    wanted.first(),
                    crate::describe(&e)
                );
            }
        });
    }

    /// Whether batch `j` of `dir` needs no row group decoded for the files `kinds` (a warm
    /// epoch's): each stored whole or in the cache, or the batch in memory. Unlike
    /// [`Prefetcher::ready`], a file only claimed for a store is not: its batch is still to be
    /// built. (Counted, it left the next block undecoded under `opens=kernel`, whose prefetcher
    /// claims every file it will store as it schedules them, and the reader waited a block's
    /// decode at its first batch: 0.58 s at 80-byte rows.)
    fn built(&self, kinds: &[FileKind], dir: Batches, j: u64) -> bool {
        if !self.to_disk(kinds) {
            return self.ready(kinds, dir, j);
        }
        self.builder.has_batch(self.plan().batch_in(dir, j))
            || kinds.iter().all(|&k| self.next_epoch.built(dir, j, k))
    }

    /// Whether the files `kinds` of batch `j` of `dir` are all ready for its reader: in the
    /// cache, or stored in the page cache with `opens=kernel` (or, for a reader of the one-open
    /// files, some of the batch is in memory or its file is materialised).
    fn ready(&self, kinds: &[FileKind], dir: Batches, j: u64) -> bool {
        if !self.to_disk(kinds) {
            let b = self.plan().batch_in(dir, j);
            return self.builder.holds_any_of(b) || self.on_disk(b);
        }
        kinds.iter().all(|&k| self.next_epoch.ready(dir, j, k))
    }

    /// Each reader's position and how many of the batches it reads next are materialised.
    pub(crate) fn depths(&self) -> Vec<serde_json::Value> {
        let mut out: Vec<(String, serde_json::Value)> = self
            .readers
            .positions()
            .into_iter()
            .map(|p| {
                let ready = ahead(self.plan(), p.dir, p.at, self.depth)
                    .into_iter()
                    .take_while(|&(d, j)| self.ready(&p.kinds, d, j))
                    .count();
                let name = crate::read::layout::dir_name(p.dir);
                let v = serde_json::json!({"dir": name, "batch": p.at, "ahead": ready});
                (name, v)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.into_iter().map(|(_, v)| v).collect()
    }
}

/// Stores in the page cache of one-open file `file` of `dir` the rows of batch `j` (`b`) of
/// tensor `t` and of the tensors gathered with it, those in memory, each once. Of the lowest of
/// them, the first page of every `every`-th batch is left out: its reader reads it from the
/// daemon, which then sees where it is (as a batch file's tripwire does).
fn store_rows(
    builder: &Builder,
    layout: &Layout,
    stores: &RowStores,
    (dir, j, file): (Batches, u64, FileKind),
    t: usize,
    b: BatchRef,
    every: u64,
) {
    let mut tensors = vec![t];
    if let FileKind::Npy(_) = file {
        tensors.extend(builder.read_with(t));
    }
    let lowest = tensors.iter().copied().min().unwrap_or(t);
    let rows = builder.plan().dir_rows(dir);
    let batch_size = builder.plan().options().batch_size;
    for u in tensors {
        let kind = match file {
            FileKind::Npy(_) => FileKind::Npy(u),
            FileKind::Safetensors => FileKind::Safetensors,
        };
        let Some(tensor) = builder.tensor_at_hand(b, u) else {
            continue;
        };
        if !stores.claim(dir, j, kind, u) {
            continue;
        }
        // Its reader reads these rows from the page cache, never from the daemon, which would
        // forget after a while that it reads them with `t` and gather `t` alone (every reader of
        // several tensors missed them all 5 s into an epoch).
        if let FileKind::Npy(_) = kind {
            builder.reading_npy(u);
        }
        let name = match kind {
            FileKind::Npy(u) => format!("{}/{ALL}/{}", dir_name(dir), layout.npy_name(u)),
            FileKind::Safetensors => format!("{}/{ALL_SAFETENSORS}", dir_name(dir)),
        };
        stores.store(RowsToStore {
            file: name,
            file_size: layout.size(kind, rows),
            at: layout.tensor_range(kind, rows, u).start + j * batch_size * layout.row_bytes(u),
            rows: tensor,
            left_out: match u == lowest && j.is_multiple_of(every) {
                true => TRIPWIRE_PAGE,
                false => 0,
            },
        });
    }
}

/// Starts `work` on `runtime`, counted in `stats` as work pending from now until it ends.
fn spawn_counted(
    runtime: &Handle,
    stats: &Arc<Stats>,
    work: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let pending = stats.pending();
    runtime.spawn(async move {
        work.await;
        drop(pending);
    });
}

/// The most batches of one job gathering a tensor ahead of its reader
/// ([`Prefetcher::build_tensors`]): enough that its hand-offs are few, few enough that the
/// workers share the batches a reader needs next.
const TENSOR_JOB_BATCHES: usize = 16;

/// The batches ahead of a reader of one-open files gathered and stored: `depth`
/// (`prefetch=`), or more where that holds less than [`ROWS_AHEAD_BYTES`] of batches of
/// `batch_bytes` (every tensor's rows), up to [`MOST_ROWS_DEPTH`]; none with `prefetch=0`.
fn rows_depth(depth: u64, batch_bytes: u64) -> u64 {
    match depth {
        0 => 0,
        _ => depth.max(
            ROWS_AHEAD_BYTES
                .div_ceil(batch_bytes.max(1))
                .min(MOST_ROWS_DEPTH),
        ),
    }
}

/// The most batches [`rows_depth`] raises the depth to: each sighting walks the plan that far
/// ahead (tiny batches of tiny rows would have it walk millions).
const MOST_ROWS_DEPTH: u64 = 1024;

/// Where the bytes of batch `j`'s file stored in the page cache start: past the first page
/// every `every` batches (a tripwire), else at 0. The page left out is read from the daemon,
/// so the prefetcher sees where the reader is ([`crate::read::follow::page_cache`]). The prefetcher's files
/// have one every half its depth: each sighting schedules the files from half the depth ahead
/// on, while the reader still has the other half stored before it (with one every `prefetch`
/// files, a reader at half the cold rate came to the file after each sighting before it was
/// stored). A reader that comes faster than the files are stored is also seen at each file it
/// misses.
fn stored_from(j: u64, every: u64) -> u64 {
    match j.is_multiple_of(every.max(1)) {
        true => TRIPWIRE_PAGE,
        false => 0,
    }
}

/// A directory whose files' names a job makes known ([`Prefetcher::make_known`]), until the
/// job ends.
struct Naming(Arc<Mutex<HashSet<Batches>>>, Batches);

impl Drop for Naming {
    fn drop(&mut self) {
        self.0.lock().unwrap().remove(&self.1);
    }
}

/// How far apart the tripwires of files a walk stores are: a reader of an epoch stored whole
/// ahead of it needs seeing only where it starts the epoch (which starts the walk through the
/// next) and now and then (a walk ends where its reader comes near).
const WALK_TRIPWIRES: u64 = 64;

/// How many batches a walk stores in one job of a worker.
const WALK_CHUNK: u64 = 8;

/// How long a walk through a next epoch waits before it looks again where its reader's next
/// files are not all ready, where it cannot go on for another reason, and how long it keeps
/// looking before it ends (its reader's next step starts it again).
const PAUSE_BUSY: Duration = Duration::from_millis(10);
const PAUSE: Duration = Duration::from_millis(250);
const GIVE_UP: Duration = Duration::from_secs(30);

/// The batch files of the epoch a reader comes to next, built while the reader is idle in the
/// epoch before (a pause for an evaluation or a checkpoint, the time a slow training step
/// leaves between reads): a shuffled epoch's files are built when they are first needed either
/// way (its rows gathered from the cached columns, the files stored in the page cache), and built
/// ahead they are there when the reader comes, however fast it then comes.
///
/// A walk builds, in reading order, the files the reader opens of each batch of the next
/// epoch (the same rank's view, for a rank view), a few batches at a time on the workers, only
/// while the reader is idle ([`Pace`]) and its next `prefetch` files are all ready, and stores
/// them in the page cache ([`crate::read::follow::page_cache`]; files the cache keeps are written to
/// it). It starts from the reader's first step in an epoch from epoch 1 on, from the middle of
/// epoch 0 (whose row groups are decoded as it is read); and never with `shuffle=none`, whose
/// epochs share their files, past the listed epochs, or with `prefetch=0`. It builds only a
/// batch whose row groups are decoded (in memory or cached), stores at most
/// [`NextEpoch::stored_ahead`] bytes ahead of its reader, and writes only into room in the cache
/// beside everything the plan needs again (it evicts only what is never needed); else it
/// waits, and ends after [`GIVE_UP`]. It ends where its reader comes within `prefetch` of it:
/// the prefetcher has the batches from there.
struct NextEpoch {
    materializer: Arc<Materializer>,
    builder: Arc<Builder>,
    stats: Arc<Stats>,
    readers: Arc<Readers>,
    layout: Arc<Layout>,
    depth: u64,
    /// Each chain's walk: the latest, one at a time.
    walks: Mutex<HashMap<Chain, Walk>>,
    filler: Arc<Filler>,
    /// The most bytes of a next epoch's files a walk stores in the page cache: an eighth of the
    /// host's memory. A larger epoch stored whole would have its first files reclaimed before
    /// its reader came to them, each then gathered twice.
    stored_ahead: u64,
}

/// The host's memory, from `/proc/meminfo`.
fn memory_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

struct Walk {
    /// The directory it builds.
    dir: Batches,
    state: WalkState,
}

enum WalkState {
    /// Under way.
    Going(Arc<Pace>),
    /// Ended at batch `at`, where it could not go on for [`GIVE_UP`].
    Stalled { at: u64 },
    /// At the end of its directory, where its reader came, or on an error its reader will meet.
    Done,
}

/// How long a reader takes no step before a walk counts it idle.
const IDLE: Duration = Duration::from_millis(50);

/// The pace of a walk: it builds while its reader is idle (a pause between epochs, for an
/// evaluation or a checkpoint; the time a slow training step leaves between reads), never
/// while it reads. A reader that comes to its batches every few milliseconds has them built
/// just in time by the prefetcher, and reads them from the CPU's caches: measured with a reader
/// paced at half the cold rate, walks between its reads (back to back, or one batch a step)
/// made it wait 10-40% longer in its opens and reads (5.5-6.9% of each epoch against 4.6-5.1%).
struct Pace {
    stop: AtomicBool,
    /// The batch the walk is at.
    at: AtomicU64,
    /// When its reader last took a step, in nanoseconds from `started`.
    last_step_ns: AtomicU64,
    /// Tokio's clock, which tests pause.
    started: tokio::time::Instant,
    /// Work pending handed over by its reader's last step, for a walk that set its own aside.
    handed: std::sync::Mutex<Option<crate::stats::Pending>>,
}

impl Pace {
    fn new() -> Pace {
        Pace {
            stop: AtomicBool::new(false),
            at: AtomicU64::new(0),
            last_step_ns: AtomicU64::new(0),
            started: tokio::time::Instant::now(),
            handed: std::sync::Mutex::new(None),
        }
    }

    /// Its reader took a step.
    fn step(&self) {
        let now = self.started.elapsed().as_nanos() as u64;
        self.last_step_ns.store(now, Ordering::Relaxed);
    }

    /// Work pending from its reader's step, held until the walk takes it: the step's own ends
    /// with its follow-up, before the walk wakes to see where the reader is.
    fn hand(&self, pending: crate::stats::Pending) {
        *self.handed.lock().unwrap() = Some(pending);
    }

    fn take_handed(&self) -> Option<crate::stats::Pending> {
        self.handed.lock().unwrap().take()
    }

    /// Waits until its reader has taken no step for [`IDLE`].
    async fn turn(&self) {
        loop {
            let last = Duration::from_nanos(self.last_step_ns.load(Ordering::Relaxed));
            let quiet = self.started.elapsed().saturating_sub(last);
            if quiet >= IDLE {
                return;
            }
            tokio::time::sleep(IDLE - quiet).await;
        }
    }
}

impl NextEpoch {
    /// Whether file `kind` of batch `j` of `dir` is ready for its reader's open: [`Self::has`],
    /// or, where opens store the files, its batch in memory.
    fn ready(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        if self.has(dir, j, kind) {
            return true;
        }
        self.filler.on()
            && !self.filler.tripwires()
            && self.builder.has_batch(self.plan().batch_in(dir, j))
    }

    /// Whether file `kind` of batch `j` of `dir` is stored in the page cache (but for a
    /// tripwire page at most), or in the cache: not only claimed.
    fn built(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        (self.filler.on() && self.filler.stored_at_least_in_part(dir, j, kind))
            || (self.materializer).contains(Item::of(kind, self.plan().batch_in(dir, j)))
    }

    /// Whether file `kind` of batch `j` of `dir` is built for its reader: in the cache, or
    /// stored in the page cache (or claimed to be).
    fn has(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        if self.filler.on() {
            return self.filler.has(dir, j, kind);
        }
        self.materializer
            .contains(Item::of(kind, self.plan().batch_in(dir, j)))
    }

    fn plan(&self) -> &Plan {
        self.builder.plan()
    }

    /// The reader of `dir`, which opens the files `kinds` of each batch, is at batch `i`:
    /// start the walk through its next epoch (or go on with a stalled one), unless one is
    /// under way or done. The mount lists `listed` epochs.
    fn reader_at(
        self: &Arc<Self>,
        runtime: &Handle,
        dir: Batches,
        i: u64,
        kinds: &[FileKind],
        listed: u64,
    ) {
        let mut walks = self.walks.lock().unwrap();
        if let Some(Walk {
            state: WalkState::Going(pace),
            ..
        }) = walks.get(&dir.chain())
        {
            pace.step();
            // A walk set aside waiting on its reader takes up its work from this step on.
            pace.hand(self.stats.pending());
        }
        let plan = self.plan();
        let next = dir.next_epoch();
        if plan.epochs_repeat() || next.global(0).0 >= listed || plan.count(next) == 0 {
            return;
        }
        if dir.global(0).0 == 0 && i * 2 < plan.count(dir) {
            return;
        }
        let from = match walks.get(&dir.chain()) {
            Some(w) if w.dir == next => match w.state {
                WalkState::Stalled { at } => at,
                WalkState::Going(_) | WalkState::Done => return,
            },
            // This epoch's walk, still ahead of its reader: the next one starts after it.
            Some(Walk {
                dir: d,
                state: WalkState::Going(pace),
            }) if *d == dir && pace.at.load(Ordering::Relaxed) > i + self.depth => return,
            // An earlier epoch's, gone by, or this epoch's, which its reader has come to.
            Some(Walk {
                state: WalkState::Going(pace),
                ..
            }) => {
                pace.stop.store(true, Ordering::Relaxed);
                0
            }
            _ => 0,
        };
        let pace = Arc::new(Pace::new());
        let state = WalkState::Going(pace.clone());
        walks.insert(dir.chain(), Walk { dir: next, state });
        drop(walks);
        let (me, kinds) = (self.clone(), kinds.to_vec());
        let pending = self.stats.pending();
        runtime.spawn(async move {
            let end = me.walk(dir, next, &kinds, from, &pace, pending).await;
            let mut walks = me.walks.lock().unwrap();
            if let Some(w) = walks.get_mut(&next.chain())
                && w.dir == next
            {
                w.state = end;
            }
        });
    }

    /// Builds the files `kinds` of `dir`'s batches from batch `from` on, in reading order,
    /// for the reader of `behind` (the epoch before).
    async fn walk(
        &self,
        behind: Batches,
        dir: Batches,
        kinds: &[FileKind],
        from: u64,
        pace: &Pace,
        pending: crate::stats::Pending,
    ) -> WalkState {
        let plan = self.plan();
        let stats = &self.stats;
        // Counted as work pending while it works or waits on work in flight; set aside while
        // it waits on what only its reader's next step changes (nothing else pending), so that
        // a mount whose reader is idle reads as idle. Its reader's step hands it back.
        let mut held = Some(pending);
        let mut waiting_since: Option<Instant> = None;
        let mut j = from;
        while j < plan.count(dir) {
            pace.at.store(j, Ordering::Relaxed);
            pace.turn().await;
            let reader = self.readers.position(dir);
            if pace.stop.load(Ordering::Relaxed) || reader.is_some_and(|at| at + self.depth >= j) {
                return WalkState::Done;
            }
            let b = plan.batch_in(dir, j);
            let missing: Vec<FileKind> = (kinds.iter().copied())
                .filter(|&k| !self.has(dir, j, k))
                .collect();
            let items: Vec<Item> = missing.iter().map(|&k| Item::of(k, b)).collect();
            if items.is_empty() {
                j += 1;
                continue;
            }
            let reading = if reader.is_some() { dir } else { behind };
            let wait = match self.served(reading, kinds) {
                true => (self.blocked(b, &items))
                    .or_else(|| self.enough_stored(j, kinds, reader))
                    .map(|why| (PAUSE, why)),
                false => Some((PAUSE_BUSY, "its reader's next files are not all ready")),
            };
            if let Some(handed) = pace.take_handed() {
                held = Some(handed);
            }
            if let Some((pause, why)) = wait {
                if held.is_some() && stats.c.work_pending.load(Ordering::Relaxed) == 1 {
                    held = None;
                }
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= GIVE_UP {
                    tracing::debug!(
                        "{} built ahead up to batch {j}: {why}",
                        crate::read::layout::dir_name(dir)
                    );
                    return WalkState::Stalled { at: j };
                }
                tokio::time::sleep(pause).await;
                continue;
            }
            waiting_since = None;
            if held.is_none() {
                held = Some(self.stats.pending());
            }
            if self.filler.on() {
                // This batch and the next few whose row groups are at hand, stored by one
                // worker's job: a trip to a worker and back costs more than a small batch.
                let mut files = Vec::new();
                let mut k = j;
                while k < plan.count(dir) && k < j + WALK_CHUNK {
                    let near = reader.is_some_and(|at| at + self.depth >= k);
                    if k > j && (near || !self.builder.row_groups_at_hand(plan.batch_in(dir, k))) {
                        break;
                    }
                    let from = match self.filler.tripwires() {
                        true => stored_from(k, WALK_TRIPWIRES),
                        false => 0,
                    };
                    files.extend(
                        (kinds.iter().copied())
                            .filter(|&kind| self.filler.claim(dir, k, kind))
                            .map(|kind| (dir, k, kind, from)),
                    );
                    k += 1;
                }
                match self.filler.fill_all(files).await {
                    Ok(n) => Stats::add(&stats.c.next_epoch_files_built, n),
                    Err(e) => {
                        tracing::debug!("storing {dir:?} from batch {j} ahead: {e:#}");
                        return WalkState::Done;
                    }
                }
                j = k;
                continue;
            }
            for item in items {
                match self.materializer.build_ahead(item).await {
                    Ok(true) => Stats::add(&stats.c.next_epoch_files_built, 1),
                    // The cache cannot take files (a full disk): readers are served from memory.
                    Ok(false) => return WalkState::Done,
                    Err(e) => {
                        // Its reader meets the same error, and says it in the log then.
                        tracing::debug!("building {item:?} ahead: {}", crate::describe(&e));
                        return WalkState::Done;
                    }
                }
            }
            j += 1;
        }
        WalkState::Done
    }

    /// Why a walk storing files `kinds` in the page cache stops before batch `j` of its
    /// directory, if it does: the files from its reader's place there (`reader`, else the
    /// directory's start) to `j` take as much as a walk may store ahead
    /// ([`NextEpoch::stored_ahead`]).
    fn enough_stored(
        &self,
        j: u64,
        kinds: &[FileKind],
        reader: Option<u64>,
    ) -> Option<&'static str> {
        if !self.filler.on() {
            return None;
        }
        let rows = self.plan().options().batch_size;
        let per_batch: u64 = kinds.iter().map(|&k| self.layout.size(k, rows)).sum();
        let ahead = j.saturating_sub(reader.unwrap_or(0)) * per_batch;
        (ahead > self.stored_ahead)
            .then_some("as much of it as the page cache should hold is stored")
    }

    /// Whether the reader of `dir` has the files `kinds` of its next `prefetch` batches in
    /// the cache.
    fn served(&self, dir: Batches, kinds: &[FileKind]) -> bool {
        let Some(at) = self.readers.position(dir) else {
            return true;
        };
        (ahead(self.plan(), dir, at, self.depth).into_iter())
            .all(|(d, j)| kinds.iter().all(|&k| self.ready(d, j, k)))
    }

    /// Why batch `b`, whose files `items` are missing, is not built now, if it is not.
    fn blocked(&self, b: BatchRef, items: &[Item]) -> Option<&'static str> {
        if !self.builder.row_groups_at_hand(b) {
            return Some("its row groups are not decoded yet");
        }
        // Stored in the page cache, nothing takes room in the cache.
        if self.filler.on() {
            return None;
        }
        let rows = self.plan().batch_len(b.index());
        let bytes: u64 = (items.iter())
            .filter_map(|item| item.kind())
            .map(|kind| self.layout.size(kind, rows))
            .sum();
        if !self.materializer.has_spare_room(bytes) {
            return Some("no room in the cache beside what the plan needs again");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::plan::OrderOptions;

    /// 10 batches of one row.
    fn plan(rows: u64) -> Plan {
        Plan::of_row_groups(
            &[rows],
            OrderOptions {
                batch_size: 1,
                drop_last: false,
                shuffle: Shuffle::None,
                window: 1,
                block: 1,
                seed: 0,
                partitions: 1,
            },
        )
    }

    #[test]
    fn sequential_readers_get_the_next_batches_across_epochs() {
        let p = plan(10);
        assert_eq!(
            ahead(&p, Batches::Epoch(0), 3, 3),
            vec![
                (Batches::Epoch(0), 4),
                (Batches::Epoch(0), 5),
                (Batches::Epoch(0), 6)
            ]
        );
        assert_eq!(
            ahead(&p, Batches::Epoch(2), 8, 3),
            vec![
                (Batches::Epoch(2), 9),
                (Batches::Epoch(3), 0),
                (Batches::Epoch(3), 1)
            ]
        );
        assert!(ahead(&p, Batches::Epoch(0), 0, 0).is_empty());
    }

    #[test]
    fn rank_readers_are_strided_and_stay_in_their_rank() {
        let p = plan(10);
        let r = |epoch| Batches::Rank {
            epoch,
            rank: 1,
            world: 3,
        };
        // 10 batches, world 3: each rank has 3; rank 1 reads global 1, 4, 7.
        let next = ahead(&p, r(0), 1, 3);
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
        let p = plan(10);
        let (depth, horizon) = (3u64, 7u64);
        for dir in [
            Batches::Epoch(0),
            Batches::Rank {
                epoch: 0,
                rank: 2,
                world: 3,
            },
        ] {
            let n = p.count(dir);
            let readers = Readers::default();
            let mut asked: Vec<(u64, u64)> = Vec::new();
            for i in 0..n {
                let read = Event::at(dir, i, What::File(FileKind::Safetensors));
                readers.step(read, depth);
                let walk = ahead(&p, dir, i, horizon);
                let beyond = &walk[walk.len().min(depth as usize)..];
                let fresh = readers.not_yet_warmed(dir, beyond);
                // The batch that comes within `depth` of the reader now (its file is built
                // next) had its row groups asked for at an earlier step.
                if let Some(&(d, j)) = ahead(&p, dir, i, depth).last()
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
            let mut expected: Vec<(u64, u64)> = ahead(&p, dir, 0, horizon + n - 1)
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

    #[tokio::test(start_paused = true)]
    async fn a_walk_builds_only_while_its_reader_is_idle() {
        let pace = Pace::new();
        let turn = pace.turn();
        tokio::pin!(turn);
        // A reader that takes a step every 10 ms for a second: no turn comes.
        for _ in 0..100 {
            tokio::select! {
                _ = &mut turn => panic!("a turn while the reader takes steps"),
                _ = tokio::time::sleep(Duration::from_millis(10)) => pace.step(),
            }
        }
        // Idle for IDLE after its last step: the turn comes; and every turn at once after it,
        // while the reader stays idle.
        let since = tokio::time::Instant::now();
        turn.await;
        assert_eq!(since.elapsed(), IDLE);
        pace.turn().await;
        assert_eq!(since.elapsed(), IDLE);
        // A step: the next turn waits for IDLE again.
        pace.step();
        pace.turn().await;
        assert_eq!(since.elapsed(), 2 * IDLE);
    }

    #[test]
    fn an_empty_epoch_stops_the_walk() {
        assert_eq!(
            ahead(&plan(1), Batches::Epoch(0), 0, 2),
            vec![(Batches::Epoch(1), 0), (Batches::Epoch(2), 0)]
        );
        assert_eq!(
            ahead(
                &plan(10),
                Batches::Rank {
                    epoch: 0,
                    rank: 0,
                    world: 20
                },
                0,
                4
            ),
            vec![]
        );
    }

    #[test]
    fn readers_of_one_open_files_have_megabytes_stored_ahead_however_small_their_batches() {
        // 80-byte rows in batches of 1,024: 8 MiB is 103 batches, not `prefetch=8`'s 640 KB.
        assert_eq!(rows_depth(8, 80 * 1024), 103);
        // Batches larger than 1 MiB: `prefetch=` batches hold more already.
        assert_eq!(rows_depth(8, 4 << 20), 8);
        assert_eq!(rows_depth(0, 80 * 1024), 0);
        assert_eq!(rows_depth(8, 1), MOST_ROWS_DEPTH);
        assert_eq!(rows_depth(2000, 1), 2000);
    }

    /// A reader of files the prefetcher stored in the page cache is seen every half prefetch
    /// depth: at its first batch, and again while half the files the sighting before had
    /// built are still ahead of it.
    #[test]
    fn tripwires_come_every_half_prefetch_depth() {
        let tripwire = |j, every| stored_from(j, every) == TRIPWIRE_PAGE;
        let at = |every| -> Vec<u64> { (0..10).filter(|&j| tripwire(j, every)).collect() };
        assert_eq!(at(4), vec![0, 4, 8]);
        assert_eq!(at(0), (0..10).collect::<Vec<_>>());
        for depth in 2..20 {
            let seen: Vec<u64> = (0..100).filter(|&j| tripwire(j, depth / 2)).collect();
            assert_eq!(seen[0], 0);
            assert!(
                seen.windows(2).all(|w| w[1] - w[0] <= depth / 2),
                "{depth}: {seen:?}"
            );
        }
    }
}
