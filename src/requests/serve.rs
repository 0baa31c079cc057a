//! The serving facade: the reads behind open files, keyed by the file a reader reads (a batch
//! file, or a directory's one-open file), never by an inode: the tree ([`super::fs`]) says what
//! an inode is, and this module how its bytes come: found materialised, stored in the page
//! cache by their opens, built ahead (the one-open files) or gathered a tensor's rows at a time,
//! read from memory or from the backing file; and the prefetcher told where each reader is.
//!
//! The one inode it is given is the kernel's name for a file being opened, which a store into
//! that file's page cache needs ([`Serve::store_at_hand`]).

use crate::error::{Error, Result};
use crate::model::item::{FileKind, Item};
use crate::model::plan::{BatchRef, Batches, Plan};
use crate::read::follow::page_cache::PageCache;
use crate::read::follow::prefetch::Prefetcher;
use crate::read::layout::{Layout, Span};
use crate::read::produce::ahead::{Ahead, Opening, Progress, Warming};
use crate::read::produce::builder::{Batch, Builder, TensorOf, TensorRows};
use crate::read::produce::materialize::Materializer;
use crate::read::readers::{Event, What};
use crate::stats::Stats;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// File `kind` of batch `batch` of directory `dir`: `NNNNNN.safetensors` or `NNNNNN/NAME.npy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchFile {
    pub(crate) dir: Batches,
    pub(crate) batch: u64,
    pub(crate) kind: FileKind,
}

/// Directory `dir`'s one-open file `kind`: `all.safetensors` or `all/NAME.npy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AllFile {
    pub(crate) dir: Batches,
    pub(crate) kind: FileKind,
}

/// A file whose bytes the read path serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Batch(BatchFile),
    All(AllFile),
}

/// What serving needs of the read path.
/// What an open of a batch file finds ([`Serve::open_batch`]).
pub(crate) enum BatchOpening {
    /// Materialised on the local cache: its backing file.
    Ready(Arc<File>),
    /// A file read once (a shuffled epoch's): stored in the kernel's page cache by its open.
    StoredByOpen,
    /// To be materialised first.
    Build,
}

pub struct Serve {
    materializer: Arc<Materializer>,
    builder: Arc<Builder>,
    stats: Arc<Stats>,
    prefetcher: Prefetcher,
    ahead: Ahead,
    layout: Arc<Layout>,
}

impl Serve {
    pub(crate) fn new(
        materializer: Arc<Materializer>,
        builder: Arc<Builder>,
        prefetcher: Prefetcher,
        ahead: Ahead,
        layout: Arc<Layout>,
    ) -> Serve {
        Serve {
            stats: builder.stats().clone(),
            materializer,
            builder,
            prefetcher,
            ahead,
            layout,
        }
    }

    pub(crate) fn plan(&self) -> &Plan {
        self.builder.plan()
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Work taken on for a reader now (see [`Stats::pending`]).
    pub(crate) fn pending(&self) -> crate::stats::Pending {
        self.stats.pending()
    }

    /// Bytes the read path holds in the daemon's memory.
    pub(crate) fn memory(&self) -> usize {
        self.builder.memory()
    }

    /// Each reader's depth ahead, as stats.json shows it.
    pub(crate) fn depths(&self) -> Vec<serde_json::Value> {
        self.prefetcher.depths()
    }

    /// The cache item a batch file is (by global batch, so rank views share it, and by the
    /// epoch it repeats, so epochs with one order share it).
    pub(crate) fn item(&self, f: BatchFile) -> Item {
        Item::of(f.kind, self.batch_ref(f))
    }

    fn batch_ref(&self, f: BatchFile) -> BatchRef {
        self.plan().batch_in(f.dir, f.batch)
    }

    /// Where a batch file's backing file is (or will be) in the local cache.
    pub(crate) fn backing_path(&self, f: BatchFile) -> PathBuf {
        self.materializer.path(self.item(f))
    }

    /// Keeps a batch file's backing file in the cache for `grace` (its path was handed out).
    pub(crate) fn pin(&self, f: BatchFile, grace: Duration) {
        self.materializer.pin(self.item(f), grace);
    }

    /// A batch file's backing file if it is materialised already (checked), without waiting;
    /// the caller follows the reader ([`Serve::follow_open`]) once it answered.
    /// What an open of batch file `f` finds: one question of the facade per open.
    pub(crate) fn open_batch(&self, f: BatchFile) -> BatchOpening {
        if let Some(file) = self.materialized(f) {
            return BatchOpening::Ready(file);
        }
        match self.stored_by_opens(f) {
            true => BatchOpening::StoredByOpen,
            false => BatchOpening::Build,
        }
    }

    fn materialized(&self, f: BatchFile) -> Option<Arc<File>> {
        self.materializer.ready(self.item(f))
    }

    /// Counts an answered open of a batch file of `size` bytes, which waited `waited`, by
    /// passthrough or not.
    pub(crate) fn opened(&self, size: u64, waited: Duration, passthrough: bool) {
        let stats = self.stats();
        Stats::add(&stats.c.opens, 1);
        stats.stall(waited);
        Stats::add(&stats.c.batches_served, 1);
        Stats::add(&stats.c.bytes_served, size);
        if passthrough {
            Stats::add(&stats.c.passthrough_opens, 1);
        }
    }

    /// From now on, the batch files of shuffled epochs (every file, with `opens=kernel`) are
    /// stored in the kernel's page cache of the files readers open, not written to the local
    /// cache: each is read once ([`crate::read::follow::page_cache`]). Where epochs share their
    /// files (`shuffle=none`) they are read every epoch, and written.
    pub fn store_in(&self, page_cache: PageCache, kernel_opens: bool) {
        self.prefetcher.use_page_cache(page_cache.clone());
        if kernel_opens || !self.plan().epochs_repeat() {
            self.prefetcher.store_in(page_cache, kernel_opens);
        }
    }

    /// Whether batch file `f` is stored in the page cache by its opens, not written. Not a file
    /// the cache holds (one `tensorfs warm` or a GPUDirect reader asked for), which its open
    /// checks and reads by passthrough.
    fn stored_by_opens(&self, f: BatchFile) -> bool {
        let filler = self.prefetcher.filler();
        filler.on() && !filler.tripwires() && !self.materializer.contains(self.item(f))
    }

    /// For an open of batch file `f` (inode `ino`: [`Serve::stored_by_opens`]), answered at
    /// once: true where its file is stored in the page cache already (the prefetcher's), or its
    /// batch is in memory and nobody is storing it, the file then stored if `store`. False:
    /// its store is under way, or its batch must be built first ([`Serve::store_built`]). The
    /// caller follows the reader once it answered.
    pub(crate) fn store_at_hand(&self, f: BatchFile, ino: u64, store: bool) -> bool {
        let BatchFile {
            dir,
            batch: i,
            kind,
        } = f;
        let filler = self.prefetcher.filler();
        if filler.stored(dir, i, kind) {
            return true;
        }
        if filler.under_way(dir, i, kind) {
            return false;
        }
        let Some(batch) = self.builder.batch_at_hand(self.batch_ref(f)) else {
            return false;
        };
        if store && filler.claim(dir, i, kind) {
            filler.store_opened(ino, dir, i, kind, &batch);
        }
        true
    }

    /// As [`Serve::store_at_hand`], for an open that waits: for the store under way to end,
    /// else for its batch to be built.
    pub(crate) async fn store_built(
        &self,
        f: BatchFile,
        ino: u64,
        store: impl FnOnce() -> bool,
    ) -> Result<()> {
        let BatchFile {
            dir,
            batch: i,
            kind,
        } = f;
        self.follow(Event::at(dir, i, What::File(kind)));
        let filler = self.prefetcher.filler();
        if filler.store_ended(dir, i, kind).await {
            return Ok(());
        }
        let batch = self.batch(self.batch_ref(f)).await?;
        if store() && filler.claim(dir, i, kind) {
            filler.store_opened(ino, dir, i, kind, &batch);
        }
        Ok(())
    }

    /// A read of a file nobody opened through the daemon (`opens=kernel`: the kernel answers
    /// opens alone): from its backing file where it has one now, else as [`Serve::read`]
    /// builds it.
    pub(crate) async fn read_unopened(&self, t: Target, offset: u64, size: u32) -> Result<Vec<u8>> {
        let backing = match t {
            Target::Batch(f) => self.materialized(f),
            Target::All(f) => match self.ahead.for_read(f.dir, f.kind) {
                Opening::Ready(file) => Some(file),
                Opening::Soon(progress) => self.all_when_built(f, progress).await,
                Opening::Daemon => None,
            },
        };
        if backing.is_some() {
            // Serve::read follows the reader otherwise.
            self.follow_open(t);
        }
        self.read_open(t, backing, offset, size).await
    }

    /// Counts an open of a one-open file answered by passthrough.
    pub(crate) fn opened_by_passthrough(&self) {
        Stats::add(&self.stats().c.passthrough_opens, 1);
    }

    /// A reader opened `t` (followed after the open is answered): a batch file, or a one-open
    /// file opened built ahead, whose reader has the next epoch's built.
    pub(crate) fn follow_open(&self, t: Target) {
        self.follow(match t {
            Target::Batch(f) => Event::at(f.dir, f.batch, What::File(f.kind)),
            Target::All(f) => Event::at(f.dir, 0, What::Whole(f.kind)),
        });
    }

    /// A reader read what `event` says: the one place a request moves a reader. The prefetcher
    /// moves its position (which the eviction measures from) and builds what follows; a reader
    /// of a one-open file opened whole, past its middle, or in an epoch after the first (whose
    /// rows are gathered from cached columns), has the next epoch's file built ahead (in epoch
    /// 0, whose row groups are decoded as it is read, a build from its start would fetch and
    /// decode them beside the reader, in another order).
    fn follow(&self, event: Event) {
        self.prefetcher.follow(event);
        match event.what {
            What::Whole(kind) => self.ahead.reader_at(event.dir, kind),
            What::Rows {
                file, past_half, ..
            } if past_half || event.dir.global(0).0 >= 1 => self.ahead.reader_at(event.dir, file),
            _ => {}
        }
    }

    /// How an open of one-open file `f` is served ([`Ahead::for_open`]).
    pub(crate) fn open_all(&self, f: AllFile) -> Opening {
        self.ahead.for_open(f.dir, f.kind)
    }

    /// One-open file `f` once the build it waits for has ended, if it was built.
    pub(crate) async fn all_when_built(
        &self,
        f: AllFile,
        progress: Arc<Progress>,
    ) -> Option<Arc<File>> {
        self.ahead.when_built(f.dir, f.kind, progress).await
    }

    /// The path of one-open file `f`'s file built ahead, if there is one now; a reader asking
    /// for it is a reader of the file, and has the next epoch's built.
    pub(crate) async fn all_built(&self, f: AllFile) -> Option<PathBuf> {
        let path = self.ahead.built_path(f.dir, f.kind).await?;
        self.follow(Event::at(f.dir, 0, What::Whole(f.kind)));
        Some(path)
    }

    /// As the mount ends: the one-open files built ahead and kept in the cache given their
    /// checksums, so that a later mount finds them ([`Ahead::seal_kept`]). How many.
    pub fn seal_kept(&self) -> usize {
        self.ahead.seal_kept()
    }

    /// Whether one-open file `f` has a file built ahead now.
    pub(crate) fn has_built(&self, f: AllFile) -> bool {
        self.ahead.has_path(f.dir, f.kind)
    }

    /// `tensorfs warm`'s question of one-open file `f` ([`Ahead::warm`]).
    pub(crate) fn warm(&self, f: AllFile) -> Warming {
        self.ahead.warm(f.dir, f.kind)
    }

    /// A batch file's backing file, materialised on the local cache first if it must be.
    /// `None`: the cache cannot take it, the daemon serves it from memory.
    pub(crate) async fn materialize(&self, f: BatchFile) -> Result<Option<(File, PathBuf)>> {
        let item = self.item(f);
        self.follow_open(Target::Batch(f));
        self.materializer.materialize(item).await.map_err(|e| {
            let path = self.materializer.path(item);
            Error::failed(format!("materialising {}", path.display()), e)
        })
    }

    /// A read of an open file: from its backing file where the open found it materialised
    /// (checked then), else from [`Serve::read`]. Reads of batch files count as served by the
    /// daemon, and their waits as stalls.
    pub(crate) async fn read_open(
        &self,
        t: Target,
        backing: Option<Arc<File>>,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>> {
        let started = std::time::Instant::now();
        let data = match backing {
            Some(file) => tokio::task::spawn_blocking(move || pread(&file, offset, size))
                .await
                .map_err(|e| Error::failed("reading a cached batch file", e.into()))?
                .map_err(|e| Error::failed("reading a cached batch file", e.into()))?,
            None => self.read(t, offset, size).await?,
        };
        if let Target::Batch(_) = t {
            self.served_by_daemon(started.elapsed(), data.len());
        }
        Ok(data)
    }

    /// Counts a read of a batch file served by the daemon, which waited `waited`.
    fn served_by_daemon(&self, waited: Duration, bytes: usize) {
        let stats = self.stats();
        stats.stall(waited);
        Stats::add(&stats.c.daemon_reads, 1);
        Stats::add(&stats.c.daemon_read_bytes, bytes as u64);
    }

    /// A read of batch file `f` nobody opened through the daemon (`opens=kernel`: a tripwire
    /// page, or pages the page cache did not hold), answered at once where its batch is in
    /// memory: on the FUSE thread, with no trip through the async workers, which cost a few
    /// times more than the copy. `None` where it must wait ([`Serve::read_unopened`]). The
    /// caller follows the reader once it has answered ([`Serve::follow_open`]).
    pub(crate) fn read_at_hand(&self, f: BatchFile, offset: u64, size: u32) -> Option<Vec<u8>> {
        let started = std::time::Instant::now();
        let batch = self.builder.batch_at_hand(self.batch_ref(f))?;
        let data = batch.file_bytes(&self.layout, f.kind, offset, size);
        self.served_by_daemon(started.elapsed(), data.len());
        Some(data)
    }

    /// Reads `size` bytes at `offset` of `t`, building what it spans first if it must.
    pub(crate) async fn read(&self, t: Target, offset: u64, size: u32) -> Result<Vec<u8>> {
        match t {
            Target::Batch(f) => {
                self.follow(Event::at(f.dir, f.batch, What::File(f.kind)));
                let batch = self.batch(self.batch_ref(f)).await?;
                Ok(batch.file_bytes(&self.layout, f.kind, offset, size))
            }
            Target::All(f) => self.read_all(f, offset, size).await,
        }
    }

    /// Batch `b`, which a reader waits for.
    async fn batch(&self, b: BatchRef) -> Result<Arc<Batch>> {
        let builder = &self.builder;
        let _waits = builder.reader_waits();
        (builder.batch(b).await).map_err(|e| Error::failed(b.to_string(), e))
    }

    /// Tensor `t` of batch `b`, which a reader waits for. Taken from memory, else from the
    /// batch's file where it is materialised (a warm remount decodes nothing for it), else
    /// gathered.
    async fn tensor(&self, b: BatchRef, t: usize) -> Result<TensorOf> {
        let builder = &self.builder;
        if !builder.has_tensor(b, t)
            && let Some(rows) = self.tensor_from_file(b, t).await
        {
            return Ok(TensorOf::Alone(Arc::new(TensorRows(rows))));
        }
        let _waits = builder.reader_waits();
        (builder.tensor(b, t).await).map_err(|e| Error::failed(b.to_string(), e))
    }

    /// Tensor `t`'s rows of batch `b` from a materialised file of the batch, off the async
    /// workers ([`Materializer::tensor_from_file`]).
    async fn tensor_from_file(&self, b: BatchRef, t: usize) -> Option<Vec<u8>> {
        // Most batches of a one-open file have no file of their own: asking a blocking thread
        // to find that out cost a hand-off per batch and tensor read.
        if !self.materializer.has_tensor_file(b, t) {
            return None;
        }
        let materializer = self.materializer.clone();
        tokio::task::spawn_blocking(move || {
            let mut rows = Vec::new();
            materializer
                .tensor_from_file(b, t, &mut rows)
                .then_some(rows)
        })
        .await
        .ok()
        .flatten()
    }

    /// Reads `size` bytes at `offset` of one-open file `f`: its header, then each of its
    /// tensors' rows of every batch in batch order, built (or taken from memory) only for the
    /// batches the read spans.
    async fn read_all(&self, f: AllFile, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (rows, spans, events) = self.all_read(f, offset, size);
        Stats::add(&self.stats().c.one_open_reads, 1);
        // The reader is followed before it waits: what comes after the read is built meanwhile.
        self.follow_all(events);
        let mut tensors = Vec::new();
        for span in &spans {
            if let Span::Rows { t, batch, .. } = *span {
                tensors.push(self.tensor(self.plan().batch_in(f.dir, batch), t).await?);
            }
        }
        self.assemble(f, rows, spans, tensors)
    }

    /// As [`Serve::read`] for a one-open file, answered at once where every batch the read
    /// spans is in memory (a tripwire page the prefetcher left out of the page cache, or a
    /// readahead of rows gathered ahead): on the FUSE thread, the reader followed after the
    /// reply ([`Serve::follow_all`]) with what this returns. `None` where it must wait.
    pub(crate) fn read_all_at_hand(
        &self,
        f: AllFile,
        offset: u64,
        size: u32,
    ) -> Option<(Vec<u8>, Vec<Event>)> {
        let (rows, spans, events) = self.all_read(f, offset, size);
        let mut tensors = Vec::new();
        for span in &spans {
            if let Span::Rows { t, batch, .. } = *span {
                let batch = self.plan().batch_in(f.dir, batch);
                tensors.push(self.builder.tensor_at_hand(batch, t)?);
            }
        }
        let data = self.assemble(f, rows, spans, tensors).ok()?;
        Stats::add(&self.stats().c.one_open_reads, 1);
        Some((data, events))
    }

    /// Follows the reader of a one-open file by the events of its read ([`Serve::all_read`]).
    pub(crate) fn follow_all(&self, events: Vec<Event>) {
        for event in events {
            self.follow(event);
        }
    }

    /// What a read of `size` bytes at `offset` of one-open file `f` spans: its rows, the
    /// spans, and the events that follow its reader (one per tensor it reads rows of).
    fn all_read(&self, f: AllFile, offset: u64, size: u32) -> (u64, Vec<Span>, Vec<Event>) {
        let AllFile { dir: b, kind } = f;
        let rows = self.plan().dir_rows(b);
        let bs = self.plan().options().batch_size;
        let spans = self.layout.spans(kind, rows, bs, offset, size);
        if let FileKind::Npy(t) = kind {
            self.builder.reading_npy(t);
        }
        let past_half = offset + size as u64 >= self.layout.size(kind, rows).div_ceil(2);
        let mut events = Vec::new();
        for t in self.layout.tensors_of(kind) {
            let mut batches = spans.iter().filter_map(|s| match s {
                Span::Rows { t: u, batch, .. } if *u == t => Some(*batch),
                _ => None,
            });
            if let Some(first) = batches.next() {
                let what = What::Rows {
                    file: kind,
                    t,
                    past_half,
                };
                let last = batches.next_back().unwrap_or(first);
                events.push(Event {
                    dir: b,
                    first,
                    last,
                    what,
                });
            }
        }
        (rows, spans, events)
    }

    /// The bytes of `spans` of one-open file `f` (of `rows` rows): its header's, and
    /// `tensors`, one per span of rows in order.
    fn assemble(
        &self,
        f: AllFile,
        rows: u64,
        spans: Vec<Span>,
        tensors: Vec<TensorOf>,
    ) -> Result<Vec<u8>> {
        // Sized for the whole read up front: grown piece by piece, a 1 MiB read was copied
        // over and again as the buffer doubled.
        let size = spans.iter().map(Span::bytes).sum::<u64>();
        let mut out = Vec::with_capacity(size as usize);
        let mut tensors = tensors.into_iter();
        for span in spans {
            match span {
                Span::Header(range) => {
                    let header = self.layout.header(f.kind, rows);
                    out.extend_from_slice(&header[range.start as usize..range.end as usize]);
                }
                Span::Rows { batch, within, .. } => {
                    let tensor = tensors.next().expect("a tensor per span of rows");
                    let data = tensor.bytes();
                    if (data.len() as u64) < within.end {
                        return Err(Error::failed(
                            self.plan().batch_in(f.dir, batch).to_string(),
                            anyhow::anyhow!("shorter than the plan says"),
                        ));
                    }
                    out.extend_from_slice(&data[within.start as usize..within.end as usize]);
                }
            }
        }
        Ok(out)
    }
}

/// Up to `size` bytes at `offset` of `file` (fewer only at its end).
fn pread(file: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0; size as usize];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}
