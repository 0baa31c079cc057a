//! Building what batches are made of: row groups read, decoded and transformed (or loaded from
//! the local cache), and batches gathered from them, on the worker pool. One build per row
//! group and per batch however many readers wait for it; both are kept in memory within
//! `memory_limit`, and the memory they hold is accounted here.

use crate::cache::DiskCache;
use crate::model::item::{FileKind, Item};
use crate::model::plan::{BatchRef, Orders, Plan, Shuffle};
use crate::read::layout::Layout;
use crate::read::produce::budget::Budget;
use crate::read::produce::columns::{Columns, Placement, Rows};
use crate::read::produce::eviction::Eviction;
use crate::read::produce::memo::{Memo, Weighted};
use crate::read::produce::pool::{Background, Pool, ReaderWaits, cpu_counted};
use crate::read::produce::tensors;
use crate::source::Source;
use crate::source::view::View;
use crate::stats::Stats;
use anyhow::{Context, Result, bail};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tracing::Instrument;

/// A built batch: every tensor's rows.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) rows: u64,
    pub(crate) tensors: Vec<Vec<u8>>,
}

impl Batch {
    /// The header of its file `kind`.
    pub(crate) fn header(&self, layout: &Layout, kind: FileKind) -> Arc<[u8]> {
        layout.header(kind, self.rows)
    }

    /// `size` bytes at `offset` of this batch's file `kind`.
    pub(crate) fn file_bytes(
        &self,
        layout: &Layout,
        kind: FileKind,
        offset: u64,
        size: u32,
    ) -> Vec<u8> {
        let header = self.header(layout, kind);
        crate::read::layout::slice(&layout.parts(kind, &header, &self.tensors), offset, size)
    }
}

impl Weighted for Batch {
    fn weight(&self) -> usize {
        self.tensors.iter().map(Vec::len).sum::<usize>()
    }
}

/// Where each row of a batch is, worked out once for all its tensors.
pub(crate) struct Picks {
    /// The row groups the batch draws from, ascending.
    row_groups: Vec<usize>,
    /// Where the batch's rows are, in batch order.
    rows: Rows,
}

/// Row groups fetched (and decoded) at once, however few the cores: a fetch waits on the
/// network, and a remote store gives each connection about 100 MB/s. On two cores, two at once
/// held a cold S3 epoch to one connection's rate: through a proxy holding each request 20 ms and
/// each connection to 100 MB/s (`scripts/bench`'s S3-as-remote rows), 1.87x PyArrow's rate with
/// two, 2.37-2.41x with four or eight (the proxy's own CPU then bounds both).
const FETCHES_AT_LEAST: usize = 4;

impl Picks {
    /// From each row's (row group, row in it), in batch order, of a dataset of `groups` row
    /// groups.
    fn new(located: impl Iterator<Item = (usize, u64)>, groups: usize) -> Picks {
        let located: Vec<(usize, u64)> = located.collect();
        if groups > DENSE_GROUPS_PER_ROW * located.len() {
            return Picks::sorted(located);
        }
        // A slot per row group of the dataset, marked where the batch draws from it, then
        // numbered in order: two passes over the rows and one over the slots, where sorting
        // the rows' row groups was 2% of a build from cached columns (measured with `perf`).
        const ABSENT: usize = usize::MAX;
        let mut slot = vec![ABSENT; groups];
        for &(rg, _) in &located {
            slot[rg] = 0;
        }
        let mut row_groups = Vec::new();
        for (rg, s) in slot.iter_mut().enumerate() {
            if *s != ABSENT {
                *s = row_groups.len();
                row_groups.push(rg);
            }
        }
        let rows = (located.into_iter())
            .map(|(rg, row)| (slot[rg], row as usize))
            .collect();
        Picks::of(row_groups, rows)
    }

    fn of(row_groups: Vec<usize>, rows: Vec<(usize, usize)>) -> Picks {
        Picks {
            row_groups,
            rows: Rows::of(rows),
        }
    }

    /// As [`Picks::new`], for a dataset of many more row groups than the batch has rows.
    fn sorted(located: Vec<(usize, u64)>) -> Picks {
        let mut row_groups: Vec<usize> = located.iter().map(|&(rg, _)| rg).collect();
        row_groups.sort_unstable();
        row_groups.dedup();
        // A batch draws from a few row groups: a search of the sorted few per row costs less
        // than hashing each row's row group.
        let rows = located
            .into_iter()
            .map(|(rg, row)| {
                let k = row_groups
                    .binary_search(&rg)
                    .expect("a row group of the batch");
                (k, row as usize)
            })
            .collect();
        Picks::of(row_groups, rows)
    }
}

/// How many times a build gathers again where a mapped cache file changed under it (each time
/// the file is dropped and the row group decoded from the source): more is another fault.
const CHANGED_TRIES: usize = 3;

/// Up to how many row groups per row of a batch [`Picks::new`] keeps a slot for each row group
/// of the dataset rather than sorting the batch's.
const DENSE_GROUPS_PER_ROW: usize = 8;

impl Picks {
    /// The batch's rows of tensors `wanted` (in that order) from its row groups `decoded` (in
    /// `row_groups` order).
    fn gather(
        &self,
        placement: &Placement,
        decoded: &[Arc<Columns>],
        wanted: &[usize],
        stats: &Stats,
    ) -> Vec<Vec<u8>> {
        let mut rows = vec![Vec::new(); wanted.len()];
        self.gather_onto(placement, decoded, wanted, &mut rows, stats);
        rows
    }

    /// As [`Picks::gather`], each tensor's rows onto the end of its buffer in `outs`; the CPU
    /// time counted.
    fn gather_onto(
        &self,
        placement: &Placement,
        decoded: &[Arc<Columns>],
        wanted: &[usize],
        outs: &mut [Vec<u8>],
        stats: &Stats,
    ) {
        let from: Vec<&Columns> = decoded.iter().map(Arc::as_ref).collect();
        cpu_counted(&stats.c.gather_cpu_ns, || {
            self.rows.gather(placement, &from, wanted, outs)
        });
    }
}

impl Weighted for Picks {
    fn weight(&self) -> usize {
        self.rows.weight() + self.row_groups.len() * std::mem::size_of::<usize>()
    }
}

/// What [`Builder::tensor_here`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Here {
    /// The tensor is held in memory now.
    Held,
    /// Another job is gathering it.
    UnderWay,
    /// A row group it draws from is not in memory (or changed under its mapping).
    NotInMemory,
}

/// One tensor of a batch, gathered alone (for a reader of the one-open files, which read one
/// tensor at a time).
pub(crate) struct TensorRows(pub Vec<u8>);

impl Weighted for TensorRows {
    fn weight(&self) -> usize {
        self.0.len()
    }
}

/// A tensor's rows of a batch: from the whole batch where it is built, else gathered alone.
pub(crate) enum TensorOf {
    Batch(Arc<Batch>, usize),
    Alone(Arc<TensorRows>),
}

impl TensorOf {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            TensorOf::Batch(b, t) => &b.tensors[*t],
            TensorOf::Alone(rows) => &rows.0,
        }
    }
}

impl Weighted for Columns {
    fn weight(&self) -> usize {
        self.bytes()
    }

    fn is_mapping(&self) -> bool {
        self.is_mapped()
    }
}

/// The smallest row group's columns mapped for being too large to hold (see
/// [`Builder::map_from`]).
const MAP_WHEN_TOO_LARGE_FROM: u64 = 16 << 20;

/// What the builder may use: worker threads, and bytes of memory for what it holds.
pub(crate) struct Limits {
    pub(crate) threads: usize,
    /// The buffers' bytes, split by [`Budget::split`].
    pub(crate) memory: u64,
    /// Batches built ahead of each reader.
    pub(crate) prefetch: u64,
}

pub(crate) struct Builder {
    /// The sources read, each with its view (one, or a mixture's: the same tensors).
    sources: Vec<(Arc<Source>, Arc<View>)>,
    /// The tensors built: every source's view serves them.
    view: Arc<View>,
    /// Where each of the view's tensors is among a row group's parts.
    placement: Arc<Placement>,
    /// The user's transform: row groups are read as its input and go through it first.
    udf: Option<Arc<crate::udf::Applied>>,
    orders: Arc<Orders>,
    stats: Arc<Stats>,
    cache: Arc<DiskCache>,
    eviction: Arc<Eviction>,
    runtime: Handle,
    /// `threads` permits: row-group decodes and gathers run under one.
    workers: Arc<Semaphore>,
    /// Batch builds under way at once.
    builds: Semaphore,
    /// Row groups being fetched and decoded at once (`threads`, at least [`FETCHES_AT_LEAST`]):
    /// their bytes are held from the fetch to the end of the decode, so this bounds that memory.
    fetches: Semaphore,
    /// Decodes of row groups asked for ahead of every batch that needs them: `threads - 1`
    /// (at least one) at once, so a worker is left for the batches readers come to first.
    decodes_ahead: Semaphore,
    /// The low-priority threads that decode, transform, gather and write.
    pool: Pool,
    /// How many (`threads`).
    threads: usize,
    /// Where row groups decoded ahead are fetched.
    background: Background,
    /// The transform's input columns in each source (its columns by name).
    udf_inputs: Vec<Vec<usize>>,
    /// Global row-group index → (source, file, row group in file).
    row_groups: Vec<(usize, usize, usize)>,
    decoded: Memo<usize, Columns>,
    batches: Memo<BatchRef, Batch>,
    tensors: Memo<(BatchRef, usize), TensorRows>,
    /// Each batch's rows, computed once for the gathers of its tensors one by one.
    picks: Memo<BatchRef, Picks>,
    /// Batches built only to be stored in the page cache (see [`Builder::batch_here`]): held
    /// apart from `batches`, a few times what a reader stores ahead ([`Budget`]).
    stored: Memo<BatchRef, Batch>,
    /// Single tensors gathered only to be stored in the page cache of one-open files (see
    /// [`Builder::tensor_to_store`]), held apart from `tensors` as `stored` is from `batches`.
    stored_tensors: Memo<(BatchRef, usize), TensorRows>,
    /// Whether decoded row groups are kept in the local cache where epochs repeat
    /// (`shuffle=none`), whose batch files are otherwise all that is kept: from the first gather
    /// for the one-open files on, for which no batch file is written, so that the columns are
    /// what the cache keeps of them (else every epoch, and every mount, fetched and decoded the
    /// dataset again).
    keep_repeated_columns: AtomicBool,
    /// The tensors read through `all/NAME.npy` files, and when last ([`Builder::tensor`]).
    npy_read: Mutex<HashMap<usize, Instant>>,
    /// The blocks of `shuffle=block` whose row groups were asked for ahead, as (epoch,
    /// partition, block): each is asked for once ([`Builder::blocks_to_warm`]).
    blocks_asked: Mutex<HashSet<(u64, usize, usize)>>,
}

/// How long a tensor read through an `all/NAME.npy` file counts as one its readers read now:
/// the tensors a job reads are read batch after batch, far more often than this.
const READ_TOGETHER_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// What a builder works from.
pub(crate) struct Parts {
    pub(crate) sources: Vec<(Arc<Source>, Arc<View>)>,
    pub(crate) view: Arc<View>,
    pub(crate) placement: Arc<Placement>,
    pub(crate) orders: Arc<Orders>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) cache: Arc<DiskCache>,
    pub(crate) eviction: Arc<Eviction>,
    pub(crate) udf: Option<Arc<crate::udf::Applied>>,
}

impl Builder {
    pub(crate) fn new(parts: Parts, runtime: Handle, limits: Limits) -> Result<Builder> {
        let Parts {
            sources,
            view,
            placement,
            orders,
            stats,
            cache,
            eviction,
            udf,
        } = parts;
        let row_groups = (sources.iter().enumerate())
            .flat_map(|(s, (source, _))| {
                (source.files.iter().enumerate())
                    .flat_map(move |(f, file)| (0..file.rg_rows.len()).map(move |rg| (s, f, rg)))
            })
            .collect();
        let udf_inputs = match &udf {
            Some(a) => (sources.iter())
                .map(|(s, _)| crate::udf::Applied::input_columns(&a.udf, &s.schema))
                .collect::<Result<_>>()?,
            None => Vec::new(),
        };
        let batch_size = orders.plan().options().batch_size;
        let largest_tensor = (view.tensors.iter())
            .map(|t| t.row_bytes() as u64)
            .max()
            .unwrap_or(0)
            * batch_size;
        let largest_batch = view.row_bytes() * batch_size;
        let budget = Budget::split(
            limits.memory,
            largest_batch,
            largest_tensor,
            limits.prefetch,
        );
        Ok(Builder {
            sources,
            view,
            placement,
            udf,
            orders,
            stats,
            cache,
            eviction,
            runtime,
            workers: Arc::new(Semaphore::new(limits.threads)),
            builds: Semaphore::new(2 * limits.threads),
            fetches: Semaphore::new(limits.threads.max(FETCHES_AT_LEAST)),
            decodes_ahead: Semaphore::new(limits.threads.saturating_sub(1).max(1)),
            pool: Pool::new(limits.threads).context("the transform workers cannot start")?,
            threads: limits.threads.max(1),
            background: Background::new(limits.threads)
                .context("the threads for fetches ahead cannot start")?,
            row_groups,
            udf_inputs,
            // Mapped columns (see `map_from`) weigh nothing here, as their pages are the page
            // cache's, but each is a mapping: a process past `vm.max_map_count` has its next
            // allocation fail, which aborts it.
            decoded: Memo::with_max_mappings(budget.decoded, crate::cache::mappings_allowed()),
            // Built batches are held only until their files are written and opened (a few
            // times the prefetch depth): holding more kept the allocator on fresh pages,
            // measured slower than rebuilding from the decoded columns.
            batches: Memo::new(budget.batches),
            tensors: Memo::new(budget.tensors),
            picks: Memo::new(budget.picks),
            stored: Memo::new(budget.stored),
            stored_tensors: Memo::new(budget.stored_tensors),
            keep_repeated_columns: AtomicBool::new(false),
            blocks_asked: Mutex::default(),
            npy_read: Mutex::default(),
        })
    }

    pub(crate) fn plan(&self) -> &Plan {
        self.orders.plan()
    }

    pub(crate) fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The worker pool, for other work on the batches it builds (writing them to the cache).
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// How many worker threads there are (`threads`): a build ahead gathers on at most as many.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// A reader waits for something the workers build until the guard is dropped (see
    /// [`Pool::reader_waits`]).
    pub(crate) fn reader_waits(&self) -> ReaderWaits<'_> {
        self.pool.reader_waits()
    }

    /// Batch `b`, built on first use.
    pub(crate) async fn batch(&self, b: BatchRef) -> Result<Arc<Batch>> {
        if let Some(batch) = self.stored.get(&b) {
            return Ok(batch);
        }
        self.batches.get_or_build(b, self.build_batch(b)).await
    }
    /// Tensor `t` of batch `b`: from the batch where it is in memory, else its rows alone,
    /// gathered on first use.
    pub(crate) async fn tensor(&self, b: BatchRef, t: usize) -> Result<TensorOf> {
        self.tensor_into(&self.tensors, b, t).await
    }

    /// As [`Builder::tensor`], for rows gathered only to be stored in the page cache of the
    /// one-open file their reader reads, whence it reads them: held apart from those gathered
    /// for reads, while the reader may yet read a page of them from the daemon (a tripwire, or
    /// one the kernel dropped). Held with the rest, every tensor stored stayed in memory until
    /// that memo's share was full, each in memory fresh from the kernel, a second copy of what
    /// the page cache holds.
    pub(crate) async fn tensor_to_store(&self, b: BatchRef, t: usize) -> Result<TensorOf> {
        self.tensor_into(&self.stored_tensors, b, t).await
    }

    /// As [`Builder::tensor_to_store`], on the calling thread (a worker's, which does not wait
    /// for a decode), where every row group batch `b` draws from is in memory.
    pub(crate) fn tensor_here(&self, b: BatchRef, t: usize) -> Here {
        self.keep_repeated_columns.store(true, Ordering::Relaxed);
        if self.has_tensor(b, t) {
            return Here::Held;
        }
        let together = std::iter::once(t).chain(self.read_with(t));
        let claimed = (self.stored_tensors).claim(together.map(|u| (b, u)));
        if claimed.keys().first() != Some(&(b, t)) {
            return Here::UnderWay;
        }
        let wanted: Vec<usize> = claimed.keys().iter().map(|&(_, u)| u).collect();
        let Some(tensors) = self.gather_in_memory(b, &wanted) else {
            return Here::NotInMemory;
        };
        Stats::add(&self.stats.c.tensors_gathered, wanted.len() as u64);
        Stats::add(&self.stats.c.batches_built, 1);
        claimed.end(
            tensors
                .into_iter()
                .map(|rows| Some(Arc::new(TensorRows(rows)))),
        );
        Here::Held
    }

    /// [`Builder::tensor`], the rows gathered into `memo` where none holds them.
    async fn tensor_into(
        &self,
        memo: &Memo<(BatchRef, usize), TensorRows>,
        b: BatchRef,
        t: usize,
    ) -> Result<TensorOf> {
        self.keep_repeated_columns.store(true, Ordering::Relaxed);
        if let Some(tensor) = self.tensor_at_hand(b, t) {
            return Ok(tensor);
        }
        let rows = memo
            .get_or_build((b, t), async {
                // The other tensors readers of `all/NAME.npy` files read now are read of this
                // batch next: gathered in the same job, each row located once for all of them.
                // Apart, each was a job of its own (16 tensors of 80-byte rows: 16 hand-offs a
                // batch, most of a cold epoch's time).
                let others = memo.claim(self.read_with(t).into_iter().map(|u| (b, u)));
                let wanted: Vec<usize> = std::iter::once(t)
                    .chain(others.keys().iter().map(|&(_, u)| u))
                    .collect();
                let tensors = self.gather(b, wanted.clone()).await?;
                Stats::add(&self.stats.c.tensors_gathered, wanted.len() as u64);
                Stats::add(&self.stats.c.batches_built, 1);
                let mut tensors = tensors.into_iter().map(|rows| Arc::new(TensorRows(rows)));
                let first = (tensors.next()).unwrap_or_else(|| Arc::new(TensorRows(Vec::new())));
                others.end(tensors.map(Some));
                Ok(first)
            })
            .await?;
        Ok(TensorOf::Alone(rows))
    }

    /// The bytes of every tensor's rows of a full batch.
    pub(crate) fn batch_bytes(&self) -> u64 {
        self.view.row_bytes() * self.plan().options().batch_size
    }

    /// A reader read tensor `t` through an `all/NAME.npy` file (see [`Builder::tensor`]).
    pub(crate) fn reading_npy(&self, t: usize) {
        self.npy_read.lock().unwrap().insert(t, Instant::now());
    }

    /// The tensors other than `t` read through `all/NAME.npy` files in the last
    /// [`READ_TOGETHER_FOR`], where `t` is one of them: none for a reader of one tensor.
    pub(crate) fn read_with(&self, t: usize) -> Vec<usize> {
        let mut read = self.npy_read.lock().unwrap();
        let now = Instant::now();
        read.retain(|_, at| now.duration_since(*at) < READ_TOGETHER_FOR);
        if !read.contains_key(&t) {
            return Vec::new();
        }
        read.keys().copied().filter(|&u| u != t).collect()
    }

    /// Batch `b` if it is in memory now.
    pub(crate) fn batch_at_hand(&self, b: BatchRef) -> Option<Arc<Batch>> {
        self.batches.get(&b).or_else(|| self.stored.get(&b))
    }

    /// Whether batch `b` is in memory whole ([`Builder::gather_here`] takes it).
    pub(crate) fn has_batch(&self, b: BatchRef) -> bool {
        self.batches.contains(&b) || self.stored.contains(&b)
    }

    /// Tensor `t` of batch `b` if it is in memory now.
    pub(crate) fn tensor_at_hand(&self, b: BatchRef, t: usize) -> Option<TensorOf> {
        if let Some(batch) = self.batch_at_hand(b) {
            return Some(TensorOf::Batch(batch, t));
        }
        let alone = self.tensors.get(&(b, t));
        alone
            .or_else(|| self.stored_tensors.get(&(b, t)))
            .map(TensorOf::Alone)
    }

    /// Whether tensor `t` of batch `b` is in memory, alone or in its batch.
    pub(crate) fn has_tensor(&self, b: BatchRef, t: usize) -> bool {
        self.has_batch(b) || self.holds_alone(b, t)
    }

    /// Whether tensor `t` of batch `b` is in memory alone.
    fn holds_alone(&self, b: BatchRef, t: usize) -> bool {
        self.tensors.contains(&(b, t)) || self.stored_tensors.contains(&(b, t))
    }

    /// Whether every row group batch `b` draws from is decoded in memory or in the local cache:
    /// the batch is then gathered without fetching or decoding anything.
    pub(crate) fn row_groups_at_hand(&self, b: BatchRef) -> bool {
        let order = self.orders.epoch(b.epoch());
        (self.plan().batch_row_groups(&order, b.index()).into_iter())
            .all(|g| self.decoded.contains(&g) || self.cache.contains(Item::Columns { rg: g }))
    }

    /// Whether batch `b`, or any of its tensors alone, is held in memory.
    pub(crate) fn holds_any_of(&self, b: BatchRef) -> bool {
        self.has_batch(b) || (0..self.view.tensors.len()).any(|t| self.holds_alone(b, t))
    }

    /// Batch `b` built on the calling thread (a worker's), where every row group it draws from
    /// is decoded in memory: no hand-off between threads, each of which costs more than
    /// gathering a small batch. `None` where a row group is not in memory, or the batch is
    /// being built elsewhere (the caller builds it through [`Builder::batch`]).
    ///
    /// Built to be stored in the page cache, whence its files are read, the batch is held
    /// apart from those built for reads, only while its reader may yet want another of its
    /// files, or reads a tripwire page of one from the daemon ([`Budget`]'s `stored`). Held with the
    /// rest, every batch stored stayed in memory until the memo's eighth of `memory_limit` was
    /// full, each in memory fresh from the kernel (a page fault and a page zeroed per 4 KiB: a
    /// tenth of the serving thread's CPU in a cold epoch of a transform), a second copy of what
    /// the page cache holds.
    pub(crate) fn batch_here(&self, b: BatchRef) -> Option<Arc<Batch>> {
        if let Some(batch) = self.batch_at_hand(b) {
            return Some(batch);
        }
        let all: Vec<usize> = (0..self.view.tensors.len()).collect();
        (self.stored).build_here(b, || {
            let tensors = self.gather_in_memory(b, &all)?;
            Some(Arc::new(self.batch_of(b, tensors)))
        })
    }

    /// Batch `b`'s rows of tensors `wanted` (in that order) gathered on the calling thread from
    /// its row groups in memory; `None` where one is not, or was a mapped file that changed
    /// (built again through [`Builder::batch`], from the source). Its rows' places are computed
    /// here where not held, and not kept: they are wanted once, as the rows are.
    fn gather_in_memory(&self, b: BatchRef, wanted: &[usize]) -> Option<Vec<Vec<u8>>> {
        let picks = (self.picks.get(&b)).unwrap_or_else(|| Arc::new(self.picks_of(b)));
        let decoded = (picks.row_groups.iter())
            .map(|g| self.decoded.get(g))
            .collect::<Option<Vec<_>>>()?;
        let tensors = picks.gather(&self.placement, &decoded, wanted, &self.stats);
        if self.forget_changed(&picks, &decoded) {
            return None;
        }
        Some(tensors)
    }

    /// A batch of `b`'s rows of every tensor, counted.
    fn batch_of(&self, b: BatchRef, tensors: Vec<Vec<u8>>) -> Batch {
        let n = self.plan().batch_len(b.index());
        Stats::add(&self.stats.c.batches_built, 1);
        Batch { rows: n, tensors }
    }

    #[tracing::instrument(name = "build", level = "debug", skip(self))]
    async fn build_batch(&self, b: BatchRef) -> Result<Arc<Batch>> {
        let tensors = self
            .gather(b, (0..self.view.tensors.len()).collect())
            .await?;
        Ok(Arc::new(self.batch_of(b, tensors)))
    }

    /// The rows of batch `b` of tensors `wanted` (in that order), gathered from their row
    /// groups.
    async fn gather(&self, b: BatchRef, wanted: Vec<usize>) -> Result<Vec<Vec<u8>>> {
        // A build holds its row groups from the moment they are decoded until its rows are
        // gathered: bounding the builds at once bounds that memory, beyond the caches.
        let _build = self.builds.acquire().await?;
        for _ in 0..CHANGED_TRIES {
            let (picks, decoded) = self.located(b).await?;
            let _permit = self.workers.acquire().await?;
            let (placement, stats) = (self.placement.clone(), self.stats.clone());
            let (p, d, w) = (picks.clone(), decoded.clone(), wanted.clone());
            let rows = self
                .pool
                .run(move || p.gather(&placement, &d, &w, &stats))
                .await
                .with_context(|| format!("gathering the rows of {b}"))?;
            if !self.forget_changed(&picks, &decoded) {
                return Ok(rows);
            }
        }
        bail!("the cache's columns of {b} changed while they were read, {CHANGED_TRIES} times")
    }

    /// Whether any of `decoded` (the row groups of `picks`) is a mapped cache file that changed
    /// under its mapping (truncated by another process, a disk error): those are forgotten in
    /// memory and in the cache, so that the next build decodes them again from the source, and
    /// what was gathered from them must not be used.
    fn forget_changed(&self, picks: &Picks, decoded: &[Arc<Columns>]) -> bool {
        let mut changed = false;
        for (&g, columns) in picks.row_groups.iter().zip(decoded) {
            if columns.poisoned() {
                changed = true;
                self.decoded.remove(&g);
                self.cache.drop_changed_columns(g, &self.stats);
            }
        }
        changed
    }

    /// Batch `b`'s rows of tensors `wanted` (in that order), each onto the end of its buffer
    /// in `outs`, gathered on the calling thread (a thread that builds ahead in `SCHED_IDLE`,
    /// whose gathers must not take the workers from readers), where each row is located once
    /// for all of them. Its row groups are loaded as for any build; the rows are not kept.
    pub(crate) fn gather_here(
        &self,
        runtime: &Handle,
        b: BatchRef,
        wanted: &[usize],
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        self.keep_repeated_columns.store(true, Ordering::Relaxed);
        if let Some(batch) = self.batch_at_hand(b) {
            for (&t, out) in wanted.iter().zip(outs) {
                out.extend_from_slice(&batch.tensors[t]);
            }
            return Ok(());
        }
        let _build = runtime.block_on(self.builds.acquire())?;
        let lens: Vec<usize> = outs.iter().map(Vec::len).collect();
        for _ in 0..CHANGED_TRIES {
            let (picks, decoded) = runtime.block_on(self.located(b))?;
            picks.gather_onto(&self.placement, &decoded, wanted, outs, &self.stats);
            if !self.forget_changed(&picks, &decoded) {
                Stats::add(&self.stats.c.batches_built, 1);
                return Ok(());
            }
            for (out, &len) in outs.iter_mut().zip(&lens) {
                out.truncate(len);
            }
        }
        bail!("the cache's columns of {b} changed while they were read, {CHANGED_TRIES} times")
    }

    /// Where the rows of batch `b` are, and their row groups, decoded or loaded.
    async fn located(&self, b: BatchRef) -> Result<(Arc<Picks>, Vec<Arc<Columns>>)> {
        let picks = (self.picks)
            .get_or_build(b, async { Ok(Arc::new(self.picks_of(b))) })
            .await?;
        let decoded = futures::future::try_join_all(
            picks.row_groups.iter().map(|&g| self.row_group(g, false)),
        )
        .await?;
        Ok((picks, decoded))
    }

    /// Where the rows of batch `b` are.
    fn picks_of(&self, b: BatchRef) -> Picks {
        let order = self.orders.epoch(b.epoch());
        let plan = self.plan();
        let rows = plan.batch_rows(&order, b.index()).into_iter();
        Picks::new(rows.map(|r| plan.locate(r)), plan.row_groups())
    }

    /// The row groups the batches `batches` (epoch, batch) need, for [`Builder::warm`] ahead
    /// of building them, in that order (the prefetcher starts a row group's decode well before
    /// the first batch that needs it); those held (which count as used) or being decoded left
    /// out, so that no future is made for them.
    pub(crate) fn row_groups_to_warm(&self, batches: &[(u64, u64)]) -> Vec<usize> {
        let mut seen = BTreeSet::new();
        let mut needed = Vec::new();
        for &(epoch, i) in batches {
            let order = self.orders.epoch(epoch);
            for g in self.plan().batch_row_groups(&order, i) {
                if seen.insert(g) && !self.decoded.held_or_under_way(&g) {
                    needed.push(g);
                }
            }
        }
        needed
    }

    /// Under `shuffle=block`, the row groups of the block after each block the batches
    /// `batches` (epoch, batch) draw from, for [`Builder::warm`], where that block was not asked
    /// for before: a block is thousands of batches, so the next one is decoded while the reader
    /// goes through this one, and each block is asked for once, not once a batch. The blocks
    /// the batches draw from themselves are left to their builds, which decode at full width
    /// (a decode asked for ahead keeps the rank of a decode ahead, one worker short of them
    /// all). Chosen on the caller's thread: most calls find nothing new, and a task spawned
    /// for each (a hand-off to an async worker that woke another) was 3,000 wake-ups of the
    /// async workers in a cold epoch of 5,900 batch files.
    pub(crate) fn blocks_to_warm(&self, batches: &[(u64, u64)]) -> Vec<usize> {
        let mut needed = Vec::new();
        for &(epoch, i) in batches {
            let order = self.orders.epoch(epoch);
            for (p, w) in self.plan().batch_blocks(&order, i) {
                let next = w + 1;
                if next >= self.plan().windows_in(&order, p) {
                    continue;
                }
                let new = {
                    let mut asked = self.blocks_asked.lock().unwrap();
                    // What was asked for long ago is decoded, evicted or read by now.
                    if asked.len() > 1 << 16 {
                        asked.clear();
                    }
                    asked.insert((epoch, p, next))
                };
                if new {
                    needed.extend(self.plan().window_row_groups(&order, p, next));
                }
            }
        }
        needed
    }

    /// Decodes (or loads) the row groups `needed`, each let go as soon as it is decoded: the
    /// memo keeps what fits.
    pub(crate) async fn warm(&self, needed: Vec<usize>) -> Result<()> {
        let decodes = needed
            .into_iter()
            .map(|g| async move { self.row_group(g, true).await.map(drop) });
        futures::future::try_join_all(decodes).await?;
        Ok(())
    }

    /// Batches a row group (or a shuffle window of them) spans: how far ahead the prefetcher
    /// starts decoding so that a reader never waits for a whole row group at its boundary.
    pub(crate) fn row_group_lookahead(&self) -> u64 {
        let o = self.plan().options();
        let per_window = match o.shuffle {
            Shuffle::None => 1,
            Shuffle::Window => o.window,
            // Every batch needs every row group of its partition (or of its block, which
            // `blocks_to_warm` names ahead): nothing to look ahead to batch by batch.
            Shuffle::Global | Shuffle::Block => return 0,
        };
        // With P partitions, batches draw from them in turn: a row group's rows are spread over
        // P times as many batches of the epoch.
        (self.plan().max_row_group_rows() * per_window * o.partitions).div_ceil(o.batch_size)
    }

    /// How many batches ahead of a reader the prefetcher starts decoding the row groups (the
    /// window) it will need. Two windows where four windows' columns fit the memory for decoded
    /// columns: two fetch and decode while the reader goes through a third, so a slow source
    /// (a fetch as long as the reading of a window) never makes the reader wait at a boundary.
    /// One window where three fit; else half a window, so that no window is decoded twice.
    pub(crate) fn row_group_lead(&self) -> u64 {
        let ahead = self.row_group_lookahead();
        let row: usize = self.view.tensors.iter().map(|t| t.row_bytes()).sum();
        let window = ahead * self.plan().options().batch_size * row as u64;
        let room = self.decoded.capacity() as u64;
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
        // The load and the decode are boxed where they start: this future is made for every
        // row group of every batch, decoded or not, and moved into the sets that await them, so
        // it must stay small (with the decode's state inline, moving it was a tenth of the
        // daemon's CPU in a cold epoch).
        self.decoded
            .get_or_build(g, async {
                if let Some(loaded) = Box::pin(self.cached_row_group(g)).await? {
                    Stats::add(&self.stats.c.column_hits, 1);
                    return Ok(Arc::new(loaded));
                }
                Stats::add(&self.stats.c.column_misses, 1);
                Ok(Arc::new(Box::pin(self.decode_row_group(g, ahead)).await?))
            })
            .await
    }

    /// Cached columns files of this many bytes or more are mapped rather than read into memory
    /// (their pages are then the page cache's). Under `shuffle=global` and `shuffle=block`,
    /// where every batch gathers from every row group of its partition or block, all but the
    /// smallest. Else only those too large for the
    /// memory of decoded row groups to hold several of: a row group of a gigabyte (a million
    /// rows of a kilobyte, which writers' default row group sizes make) would otherwise be read
    /// whole, or decoded again, for each few of its batches. A row group read is checked once
    /// and held, whereas a mapping shows a change made to its file after the check: so never
    /// below [`MAP_WHEN_TOO_LARGE_FROM`].
    fn map_from(&self) -> u64 {
        match self.plan().options().shuffle.mixes_wide() {
            true => 0,
            false => (self.decoded.capacity() as u64 / 8).max(MAP_WHEN_TOO_LARGE_FROM),
        }
    }

    /// Row group `g`'s columns from the local cache, if they are there: a file read, on a worker.
    async fn cached_row_group(&self, g: usize) -> Result<Option<Columns>> {
        let _permit = self.workers.acquire().await?;
        let (cache, stats) = (self.cache.clone(), self.stats.clone());
        let (parts, map_from) = (self.placement.parts(), self.map_from());
        let loaded = self
            .pool
            .run(move || cache.load_columns(g, parts, map_from, &stats))
            .await?;
        Ok(loaded.map(Columns::loaded))
    }

    /// Row group `g` fetched without holding a worker (waiting on the network is no work), then
    /// decoded and transformed on one (CPU work on a blocking thread, never on the async
    /// workers), and kept in the local cache.
    async fn decode_row_group(&self, g: usize, ahead: bool) -> Result<Columns> {
        let (s, file, rg) = self.row_groups[g];
        // Each source's rows are read through its own view (its columns in its own places),
        // into the tensors every source serves.
        let (source, view) = self.sources[s].clone();
        let (runtime, cache, stats) =
            (self.runtime.clone(), self.cache.clone(), self.stats.clone());
        let distance = self.eviction.distance_fn();
        let map_from = self.map_from();
        let placement = self.placement.clone();
        // Where epochs repeat, the batch files are all that is needed again for their readers:
        // keeping the columns too would write every byte twice. A transform's output is kept
        // whatever the mode: it is run once per row group, whatever the batch size (§10).
        let keep = !self.plan().epochs_repeat()
            || self.keep_repeated_columns.load(Ordering::Relaxed)
            || self.udf.is_some();
        let udf = self.udf.clone();
        // A transform reads its input columns; the view's are its output's.
        let roots = match &udf {
            Some(_) => self.udf_inputs[s].clone(),
            None => view.roots.clone(),
        };
        // A row group in a transform's hands is held from its decode to the end of the call:
        // two at once for each worker (one called, the next decoded), so the queue holds no
        // more than that.
        let _calling = match &udf {
            Some(a) => Some(a.calls.clone().acquire_owned().await?),
            None => None,
        };
        let fetching = self.fetches.acquire().await?;
        let started = std::time::Instant::now();
        let fetched = match ahead {
            true => {
                let source = source.clone();
                self.background
                    .run(
                        async move { source.fetch_row_group(file, rg, &roots).await }
                            .in_current_span(),
                    )
                    .await??
            }
            false => source.fetch_row_group(file, rg, &roots).await?,
        };
        let mut ahead_turn = match ahead {
            true => Some(self.decodes_ahead.acquire().await?),
            false => None,
        };
        let name = source.files[file].name.clone();
        // A transform's call waits on a Python worker: it holds no worker of the daemon's, so
        // that `transform_workers` calls run at once beside the daemon's own work.
        let (fetched, transformed) = match udf {
            None => (Some(fetched), None),
            Some(a) => {
                // The daemon's CPU in the Parquet decode and in the exchange with the worker
                // (encoding, the pipes, decoding the answer) counts as decoding, as the
                // transform of the output does below.
                let pieces = {
                    let _permit = self.workers.acquire().await?;
                    let (source, stats) = (source.clone(), stats.clone());
                    (self.pool)
                        .run(move || {
                            cpu_counted(&stats.c.decode_cpu_ns, || {
                                runtime.block_on(source.decode_row_group(fetched.in_one_piece()))
                            })
                        })
                        .await??
                };
                // Fetched and decoded: the next row group's fetch may start.
                drop(fetching);
                // The call waits on a Python worker, not on the daemon's CPU: a decode ahead
                // lets go of its turn meanwhile, so that a call per worker runs at once (with
                // one decode ahead at a time, two workers ran no faster than one).
                let was_ahead = ahead_turn.take().is_some();
                let roots = view.roots.clone();
                let at = format!("file '{name}' row group {rg}");
                let calling = stats.clone();
                let out = (self.runtime)
                    .spawn_blocking(move || {
                        cpu_counted(&calling.c.decode_cpu_ns, || a.apply(pieces, &roots))
                    })
                    .await?
                    .context(at)?;
                if was_ahead {
                    ahead_turn = Some(self.decodes_ahead.acquire().await?);
                }
                (None, Some(out))
            }
        };
        let runtime = self.runtime.clone();
        let _permit = self.workers.acquire().await?;
        let columns = self
            .pool
            .run(move || -> Result<Columns> {
                tracing::debug!("decoding row group {g}");
                let t = cpu_counted(&stats.c.decode_cpu_ns, || {
                    let pieces = match (fetched, transformed) {
                        (_, Some(out)) => vec![out],
                        (Some(fetched), None) => {
                            runtime.block_on(source.decode_row_group(fetched))?
                        }
                        (None, None) => unreachable!("fetched or transformed"),
                    };
                    tensors::of_row_group(&view, pieces).with_context(|| {
                        format!("file '{}' row group {rg}", source.files[file].name)
                    })
                })?;
                Stats::add(&stats.c.row_groups_decoded, 1);
                Stats::add(&stats.c.rows_decoded, t.rows as u64);
                Stats::add(&stats.c.pad_truncated, t.truncated);
                Stats::add(&stats.c.decode_ns, started.elapsed().as_nanos() as u64);
                let parts = placement.parts_of(t.tensors, t.rows);
                let bytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
                let map = crate::cache::mapped(bytes, map_from);
                // Columns to be mapped are kept even where epochs repeat: too large to hold,
                // they would otherwise be decoded again for each few batches.
                if keep || map {
                    let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    let stored = cache.store_columns(g, t.rows, &slices, &*distance, &stats);
                    if stored.is_ok()
                        && map
                        && let Some(l) = cache.stored_columns(g, parts.len(), map_from, &stats)
                    {
                        return Ok(Columns::loaded(l));
                    }
                }
                Ok(Columns::owned(parts))
            })
            .await
            .with_context(|| format!("file '{name}' row group {rg}"));
        // A decode ahead holds its turn to its end.
        drop(ahead_turn);
        columns?
    }

    /// Bytes the memos hold in the daemon's memory: decoded row groups, built batches, single
    /// tensors and gather picks (within their shares of the [`Budget`]).
    pub(crate) fn memory(&self) -> usize {
        self.decoded.bytes()
            + self.batches.bytes()
            + self.stored.bytes()
            + self.tensors.bytes()
            + self.stored_tensors.bytes()
            + self.picks.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_number_row_groups_alike_by_slots_and_by_sorting() {
        // Row groups 9, 2, 9, 5, 2: numbered 0 (2), 1 (5), 2 (9) either way.
        let located = [(9, 10), (2, 0), (9, 3), (5, 7), (2, 1)];
        let want = [(2, 10), (0, 0), (2, 3), (1, 7), (0, 1)];
        for groups in [10, 1000] {
            let p = Picks::new(located.into_iter(), groups);
            assert_eq!(p.row_groups, [2, 5, 9], "{groups} row groups");
            // Shuffled rows: kept row by row.
            assert!(
                matches!(&p.rows, Rows::Each(rows) if rows == &want),
                "{groups} row groups"
            );
        }
        assert!(
            1000 > DENSE_GROUPS_PER_ROW * located.len(),
            "the sorting path is taken"
        );
    }
}
