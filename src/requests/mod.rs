//! The requests on open files, as the kernel makes them: `open` → a file handle and how its
//! reads are served (passthrough of a backing file, the daemon with the kernel's page cache
//! kept, or the daemon afresh), `read` of a handle, `release`. The open policy and the table of
//! open files live here, so the FUSE adapter only translates: each of its callbacks is one call
//! here and one reply (after mountpoint-s3's `fs.rs`).
//!
//! An answer is given at once where it is at hand (a materialised batch file, a read from
//! memory: on the calling FUSE thread), or once the work behind it ends (a build), with what to
//! do after the reply: letting the prefetcher follow the reader costs more than the reply, so it
//! comes after it.
//!
//! The request core, this folder: `fs` (the tree: lookups, attributes, listings; what an
//! inode is, and the narrow [`fs::Backing`] it asks of the serving side), `serve` (the serving
//! facade: the reads behind open files, keyed by the file, not the inode), `files` (`readlink`,
//! the extended attributes, reads by inode), `open_files` (the open-file table), and this module
//! (open, read, release). [`Requests`] holds the tree and the facade side by side.

pub(crate) mod files;
pub mod fs;
pub(crate) mod open_files;
pub mod serve;

use crate::error::{Error, Result};
use crate::read::produce::ahead::Opening;
use crate::requests::fs::{Fs, Openable};
use crate::requests::open_files::{Mode, OpenFiles, ReadFrom};
use crate::requests::serve::{AllFile, BatchFile, BatchOpening, Serve, Target};
use crate::stats::Pending;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::Instrument;

/// The facade is what the tree asks of the serving side: the two meet here, not in each other.
impl crate::requests::fs::Backing for Serve {
    fn plan(&self) -> &crate::model::plan::Plan {
        Serve::plan(self)
    }

    fn stats(&self) -> &crate::stats::Stats {
        Serve::stats(self)
    }

    fn memory(&self) -> usize {
        Serve::memory(self)
    }

    fn depths(&self) -> Vec<serde_json::Value> {
        Serve::depths(self)
    }

    fn backing_path(&self, f: BatchFile) -> std::path::PathBuf {
        Serve::backing_path(self, f)
    }
}

/// What answering an open needs of the kernel: a backing file registered for passthrough. The
/// adapter implements it over its reply; the in-process tests with a counter.
pub trait Registrar: Send + 'static {
    type Id: Send + Sync + 'static;
    fn register(&self, file: &File) -> std::io::Result<Self::Id>;
}

/// How the reads of an open file are served.
pub enum Served<Id> {
    /// By the kernel from the backing file registered as this id (shared by the inode's opens).
    Passthrough(Arc<Id>),
    /// By the daemon, the kernel keeping the file's pages across opens.
    Cached,
    /// By the daemon, every read afresh (a file whose bytes change: stats.json).
    Direct,
}

pub struct Opened<Id> {
    pub fh: u64,
    pub served: Served<Id>,
}

/// The open of a batch file being answered: its inode, its handle, the file's size.
#[derive(Clone, Copy)]
struct Open {
    ino: u64,
    fh: u64,
    size: u64,
}

/// What to do once the kernel has its answer.
#[must_use]
pub struct Then(Option<Box<dyn FnOnce() + Send>>);

impl Then {
    pub(crate) fn nothing() -> Then {
        Then(None)
    }

    /// `f`, counted as work pending from now until it has run (or is dropped unrun).
    fn after(pending: Pending, f: impl FnOnce() + Send + 'static) -> Then {
        Then(Some(Box::new(move || {
            f();
            drop(pending);
        })))
    }

    pub fn run(self) {
        if let Some(f) = self.0 {
            f()
        }
    }
}

/// An answer now, or once the work behind it ends.
pub enum Answer<T> {
    Now(T, Then),
    Later(BoxFuture<'static, (T, Then)>),
}

/// The filesystem core as the kernel's requests reach it.
pub struct Requests<Id> {
    fs: Arc<Fs>,
    serve: Arc<Serve>,
    open_files: OpenFiles<Id>,
    /// Whether to try passthrough: asked for, offered by the kernel, and not refused since.
    passthrough: AtomicBool,
    /// `opens=kernel`: the kernel answers opens alone ([`crate::read::follow::page_cache`]).
    kernel_opens: bool,
}

impl<Id: Send + Sync + 'static> Requests<Id> {
    pub fn new(
        fs: Arc<Fs>,
        serve: Arc<Serve>,
        passthrough: bool,
        kernel_opens: bool,
    ) -> Requests<Id> {
        Requests {
            fs,
            serve,
            open_files: OpenFiles::default(),
            passthrough: AtomicBool::new(passthrough && !kernel_opens),
            kernel_opens,
        }
    }

    /// The tree: lookups, attributes, listings, links and extended attributes.
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// The serving facade: what an open file's bytes come from.
    pub fn serve(&self) -> &Arc<Serve> {
        &self.serve
    }

    pub(crate) fn kernel_opens(&self) -> bool {
        self.kernel_opens
    }

    /// Whether passthrough is still to be tried.
    pub(crate) fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// The kernel does not offer passthrough (or refused it): the daemon serves every read.
    pub(crate) fn without_passthrough(&self) {
        self.passthrough.store(false, Ordering::Relaxed);
    }

    /// Opens `ino` with `flags` (`open(2)`'s), answering through `registrar`, which comes back
    /// with the answer.
    pub fn open<R: Registrar<Id = Id>>(
        self: &Arc<Self>,
        ino: u64,
        flags: i32,
        registrar: R,
    ) -> Answer<(R, Result<Opened<Id>>)> {
        let now = |r: R, opened| Answer::Now((r, opened), Then::nothing());
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return now(registrar, Err(Error::answer(libc::EROFS)));
        }
        let kind = match self.fs.openable(ino) {
            Ok(k) => k,
            Err(e) => return now(registrar, Err(e)),
        };
        if self.kernel_opens {
            // The kernel answers this open and every later one itself.
            return now(registrar, Err(Error::answer(libc::ENOSYS)));
        }
        let fh = self.open_files.next_fh();
        let opened = |served| Ok(Opened { fh, served });
        match kind {
            Openable::Live(snapshot) => {
                self.open_files.open_snapshot(fh, snapshot);
                now(registrar, opened(Served::Direct))
            }
            // Its bytes never change: the kernel keeps them cached across opens.
            Openable::Fixed => now(registrar, opened(Served::Cached)),
            Openable::All(f) => self.open_all_file(f, ino, fh, registrar),
            Openable::Batch(f, size) => self.open_batch(f, Open { ino, fh, size }, registrar),
        }
    }

    /// Batch file `f` (`at`): already materialised (the usual case, with the prefetcher
    /// ahead) answered at once, not behind the building work queued on the worker pool; else
    /// once built.
    fn open_batch<R: Registrar<Id = Id>>(
        self: &Arc<Self>,
        f: BatchFile,
        at: Open,
        registrar: R,
    ) -> Answer<(R, Result<Opened<Id>>)> {
        let started = std::time::Instant::now();
        let span = tracing::debug_span!("open", ino = at.ino);
        match span.in_scope(|| self.serve().open_batch(f)) {
            BatchOpening::Ready(file) => {
                let opened = self.answer_batch(at, Some(file), &registrar, started);
                Answer::Now((registrar, Ok(opened)), self.follow_open(Target::Batch(f)))
            }
            BatchOpening::StoredByOpen => self.open_stored(f, at, registrar, started, span),
            BatchOpening::Build => {
                let this = self.clone();
                let built = async move {
                    let opened = match this.serve().materialize(f).await {
                        Ok(file) => {
                            let file = file.map(|(file, _)| Arc::new(file));
                            Ok(this.answer_batch(at, file, &registrar, started))
                        }
                        Err(e) => Err(e),
                    };
                    ((registrar, opened), Then::nothing())
                };
                Answer::Later(built.instrument(span).boxed())
            }
        }
    }

    /// What follows an answered open of `t`: its reader followed ([`Serve::follow_open`]).
    fn follow_open(&self, t: Target) -> Then {
        let serve = self.serve().clone();
        Then::after(serve.pending(), move || serve.follow_open(t))
    }

    /// A batch file of a shuffled epoch, read once: stored in the kernel's page cache (its
    /// batch from memory, else built first) and answered with the pages kept, so its reads never
    /// reach the daemon. Stored only while nobody else has the inode open: the store waits
    /// for the pages a read under way holds, and that read's answer needs the thread storing.
    fn open_stored<R: Registrar<Id = Id>>(
        self: &Arc<Self>,
        f: BatchFile,
        at: Open,
        registrar: R,
        started: std::time::Instant,
        span: tracing::Span,
    ) -> Answer<(R, Result<Opened<Id>>)> {
        let ino = at.ino;
        let unopened = self.open_files.unopened(ino);
        if span.in_scope(|| self.serve().store_at_hand(f, ino, unopened)) {
            let opened = self.answer_batch(at, None, &registrar, started);
            return Answer::Now((registrar, Ok(opened)), self.follow_open(Target::Batch(f)));
        }
        let this = self.clone();
        let built = async move {
            let unopened = || this.open_files.unopened(ino);
            let opened = match this.serve().store_built(f, ino, unopened).await {
                Ok(()) => Ok(this.answer_batch(at, None, &registrar, started)),
                Err(e) => Err(e),
            };
            ((registrar, opened), Then::nothing())
        };
        Answer::Later(built.instrument(span).boxed())
    }

    fn answer_batch<R: Registrar<Id = Id>>(
        &self,
        at: Open,
        file: Option<Arc<File>>,
        registrar: &R,
        started: std::time::Instant,
    ) -> Opened<Id> {
        let served = self.served(at.ino, at.fh, file, registrar);
        let by_passthrough = matches!(served, Served::Passthrough(_));
        (self.serve()).opened(at.size, started.elapsed(), by_passthrough);
        Opened { fh: at.fh, served }
    }

    /// `all.safetensors`, `all/NAME.npy` (`f`, inode `ino`): from the file built ahead where
    /// there is one (waiting for a build near its end), else by the daemon; a reader that has
    /// the file built has the next epoch's built meanwhile.
    fn open_all_file<R: Registrar<Id = Id>>(
        self: &Arc<Self>,
        f: AllFile,
        ino: u64,
        fh: u64,
        registrar: R,
    ) -> Answer<(R, Result<Opened<Id>>)> {
        let answer = move |this: &Self, file: Option<Arc<File>>, registrar: R| {
            let from_file = file.is_some();
            let served = this.served(ino, fh, file, &registrar);
            if matches!(served, Served::Passthrough(_)) {
                this.serve().opened_by_passthrough();
            }
            let then = match from_file {
                true => this.follow_open(Target::All(f)),
                false => Then::nothing(),
            };
            ((registrar, Ok(Opened { fh, served })), then)
        };
        match self.serve().open_all(f) {
            Opening::Ready(file) => {
                let (answer, then) = answer(self, Some(file), registrar);
                Answer::Now(answer, then)
            }
            Opening::Daemon => {
                let (answer, then) = answer(self, None, registrar);
                Answer::Now(answer, then)
            }
            Opening::Soon(progress) => {
                let this = self.clone();
                Answer::Later(
                    async move {
                        let file = this.serve().all_when_built(f, progress).await;
                        answer(&this, file, registrar)
                    }
                    .boxed(),
                )
            }
        }
    }

    /// How an open of `ino` (handle `fh`) served from `file` where there is one is read: by
    /// passthrough where the inode's mode allows, else by the daemon.
    fn served<R: Registrar<Id = Id>>(
        &self,
        ino: u64,
        fh: u64,
        file: Option<Arc<File>>,
        registrar: &R,
    ) -> Served<Id> {
        let passthrough = self.passthrough();
        let (mode, refused) = self
            .open_files
            .open_batch(ino, fh, file, passthrough, |f| registrar.register(f));
        if let Some(e) = refused {
            tracing::warn!("FUSE passthrough refused ({e}): reads are served by the daemon");
            self.without_passthrough();
        }
        match mode {
            Mode::Passthrough(id) => Served::Passthrough(id),
            Mode::Cached => Served::Cached,
        }
    }

    /// Reads `size` bytes at `offset` of open file `fh` (inode `ino`): from what its open
    /// found (a snapshot, a backing file), else built. With `opens=kernel` nothing was opened:
    /// answered at once where the batch is in memory.
    pub fn read(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Answer<Result<Vec<u8>>> {
        let span = tracing::debug_span!("read", ino, offset, size);
        let target = self.fs.target(ino);
        let serve = self.serve().clone();
        if self.kernel_opens {
            match target {
                Some(Target::Batch(f)) => {
                    if let Some(data) = serve.read_at_hand(f, offset, size) {
                        // After the reply: what it schedules wakes workers, which costs more
                        // than the read (measured: a tripwire read took 330 µs with it before,
                        // 60 after).
                        return Answer::Now(Ok(data), self.follow_open(Target::Batch(f)));
                    }
                }
                // A one-open file's rows in memory: the same bytes as its file built ahead, if
                // any (whose open may wait for the build to end).
                Some(Target::All(f)) => {
                    if let Some((data, events)) = serve.read_all_at_hand(f, offset, size) {
                        return Answer::Now(
                            Ok(data),
                            Then::after(serve.pending(), move || serve.follow_all(events)),
                        );
                    }
                }
                None => {}
            }
            let fs = self.fs.clone();
            let read = async move {
                let data = match target {
                    Some(t) => serve.read_unopened(t, offset, size).await,
                    None => fs.read(ino, offset, size),
                };
                (data, Then::nothing())
            };
            return Answer::Later(read.instrument(span).boxed());
        }
        let ReadFrom { file, snapshot } = self.open_files.read_from(fh);
        if let Some(snapshot) = snapshot {
            let start = (offset as usize).min(snapshot.len());
            let end = (start + size as usize).min(snapshot.len());
            return Answer::Now(Ok(snapshot[start..end].to_vec()), Then::nothing());
        }
        if file.is_none()
            && let Some(Target::All(f)) = target
            && let Some((data, events)) = serve.read_all_at_hand(f, offset, size)
        {
            // As a batch file's read at hand above: the reader followed after the reply.
            return Answer::Now(
                Ok(data),
                Then::after(serve.pending(), move || serve.follow_all(events)),
            );
        }
        let fs = self.fs.clone();
        let read = async move {
            let data = match target {
                Some(t) => serve.read_open(t, file, offset, size).await,
                None => fs.read(ino, offset, size),
            };
            (data, Then::nothing())
        };
        Answer::Later(read.instrument(span).boxed())
    }

    /// Open file `fh` of inode `ino` is closed.
    pub fn release(&self, ino: u64, fh: u64) {
        self.open_files.release(ino, fh);
    }
}
