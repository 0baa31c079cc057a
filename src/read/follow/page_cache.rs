//! The batch files of a shuffled epoch are read once: they are stored in the kernel's page cache
//! of the files a reader opens (`FUSE_NOTIFY_STORE`), never written to the local SSD (which
//! keeps the decoded columns they are gathered from). A file read again comes from the page
//! cache, kept across opens; pages the kernel drops under memory pressure are read from the
//! daemon again, from the same bytes. The prefetcher stores the files a reader opens next, and
//! the walk through its next epoch those of that epoch (`read::follow::prefetch`); an open of
//! a file not stored yet waits for its store, or stores it itself (by inode, which the kernel
//! knows then) and answers after. Measured (issue 31): a
//! batch file written to the SSD cost about 1.1 ms of CPU, against the copy a store is.
//!
//! `opens=kernel`: the kernel answers every open of the mount alone, and reads come from the
//! mount's own page cache, which the prefetcher fills ahead of the reader.
//!
//! The daemon answers the first open with ENOSYS: from then on the kernel opens and closes
//! files without a round trip (FUSE's zero-message opens) and keeps each file's pages across
//! opens. An open through FUSE is a round trip to the daemon (90-150 µs here, against 7 µs for
//! a local open), paid once per batch file, which no read-side speed makes up for. Without
//! opens there is no passthrough, so what the prefetcher builds for a reader it also stores in
//! the kernel's page cache of the file the reader will open (`FUSE_NOTIFY_STORE`): the reader
//! then reads it as it would a local file in the page cache. Pages the kernel drops under memory
//! pressure are read from the daemon again, from the same bytes.
//!
//! A read served from the page cache is one the daemon never sees, yet the prefetcher must
//! follow the reader. So of every few files stored ahead (`prefetch::stored_from`), the first page
//! (the header's, the data starts at 4096) is left out: the reader's read of it is a round trip
//! that says where it is, paid once for those few files.

use crate::model::item::FileKind;
use crate::model::plan::Batches;
use crate::read::layout::{
    DOT_ENTRIES, Layout, batch_dir_entry, batch_file_entry, batch_name, dir_name,
};
use crate::read::produce::builder::{Batch, Builder};
use crate::read::produce::pool::Lane;
use crate::stats::Stats;
use anyhow::Result;
use lru::LruCache;
use std::borrow::Cow;
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::num::NonZeroUsize;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The bytes a tripwire leaves out of the page cache: the first page.
pub(crate) const TRIPWIRE_PAGE: u64 = 4096;

/// Directories whose last listings are remembered: batch directories a few batches ahead of
/// each reader, and the epoch and rank directories read.
const LISTED_DIRS: usize = 64;

/// Stores into a one-open file between two lookups of its inode ([`PageCache::ino_of`]).
const STORES_PER_LOOKUP: u32 = 64;

/// One-open files whose inodes are remembered: a reader's few, over its epochs.
const REMEMBERED_INOS: usize = 64;

/// The names one listing of a directory gave.
type Listing = Arc<HashSet<OsString>>;

/// What the page cache asks of the kernel. The FUSE session answers it (`kernel::Session`);
/// tests supply a fake that keeps the stored pages, so that the open path of a shuffled epoch
/// runs in-process.
pub trait Kernel: Send + Sync {
    /// Stores `bytes` at `offset` in the page cache of inode `ino` (`FUSE_NOTIFY_STORE`). The
    /// kernel drops a store to an inode it does not hold, without an error.
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// The inode of `path` (under the mount point) where the kernel knows it without asking
    /// the daemon; `None` where it would have to ask.
    fn cached_ino(&self, path: &Path) -> Option<u64>;
    /// Runs `job`, which calls into the mount (listings, looks at names), where such calls are
    /// made safely, without waiting for it: the daemon's own requests must never be waited on
    /// by a thread that holds its descriptors.
    fn call_into_mount(&self, job: Box<dyn FnOnce() + Send>) -> std::io::Result<()>;
}

/// Runs `f` through [`Kernel::call_into_mount`] and waits for its result. Blocking.
fn call_into_mount<T: Send + 'static>(
    kernel: &dyn Kernel,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let (done, result) = std::sync::mpsc::sync_channel(1);
    kernel.call_into_mount(Box::new(move || {
        let _ = done.send(f());
    }))?;
    result
        .recv()
        .map_err(|_| std::io::Error::other("a call into the mount ended without an answer"))
}

#[derive(Clone)]
pub struct PageCache {
    kernel: Arc<dyn Kernel>,
    mountpoint: PathBuf,
    /// The last directories listed, each its last listing ([`PageCache::make_file_known`]).
    listed: Arc<Mutex<LruCache<String, Listing>>>,
    /// One-open files' inodes as last looked up, with the stores made since.
    inos: Arc<Mutex<LruCache<String, (u64, u32)>>>,
}

impl PageCache {
    pub fn new(kernel: Arc<dyn Kernel>, mountpoint: &Path) -> PageCache {
        PageCache {
            kernel,
            mountpoint: mountpoint.to_path_buf(),
            listed: Arc::new(Mutex::new(LruCache::new(
                NonZeroUsize::new(LISTED_DIRS).expect("nonzero"),
            ))),
            inos: Arc::new(Mutex::new(LruCache::new(
                NonZeroUsize::new(REMEMBERED_INOS).expect("nonzero"),
            ))),
        }
    }

    /// Makes file `kind` of batch `j` of `dir` known to the kernel (which stores pages only for
    /// an inode it knows, and then answers a reader's lookup of it without a round trip): its
    /// inode. Blocking: it may list directories and look names up through the mount.
    ///
    /// The files of a directory are made known by listings of it (a READDIRPLUS instantiates
    /// every entry it returns) rather than by a lookup each, a round trip through the daemon per
    /// file: a batch's per-tensor files by a listing of its directory (measured, 23 tensors: 53
    /// lookups for 828 files in 36 directories, against 888), batch files and batch directories
    /// by listings of their epoch or rank directory, each from a batch's entries on, as far as
    /// one `getdents64` call's answer reaches (about 97 batches on kernel 6.18).
    pub(crate) fn make_file_known(
        &self,
        layout: &Layout,
        dir: Batches,
        j: u64,
        kind: FileKind,
    ) -> std::io::Result<u64> {
        if let FileKind::Npy(_) = kind {
            // Where the batch's directory cannot be made known, the path below looks it up.
            let at = DOT_ENTRIES + batch_dir_entry(j);
            let _ = self.make_known(&dir_name(dir), at, &batch_name(j));
        }
        let (dir, at, name) = listed_in(layout, dir, j, kind);
        self.make_known(&dir, at, &name)
    }

    /// Whether file `kind` of batch `j` of `dir` was named by the last listing of its directory
    /// (and so, as a rule, is known to the kernel). Not blocking.
    pub(crate) fn file_known(&self, layout: &Layout, dir: Batches, j: u64, kind: FileKind) -> bool {
        let (dir, _, name) = listed_in(layout, dir, j, kind);
        self.was_listed(&dir, &name)
    }

    /// Whether the last listing of mount directory `dir` named `name`.
    fn was_listed(&self, dir: &str, name: &str) -> bool {
        (self.listed.lock().unwrap().get(dir)).is_some_and(|l| l.contains(OsStr::new(name)))
    }

    /// Makes `name` of mount directory `dir`, its `at`-th entry, known to the kernel: its inode.
    /// A look at the name is what makes sure (a lookup, a round trip, where the kernel does not
    /// know it; none where a listing made it known): a store to an inode the kernel does not
    /// hold is dropped without an error (fuser's `Notifier::store` answers Ok), so a listing is
    /// a way to make names known in bulk, never trusted to have (the kernel answers a listing
    /// from its own copy of an earlier one without making anything known, and lets inodes go
    /// under memory pressure). Where the last listing of `dir` did not name it, `dir` is listed:
    /// from its start first (always a READDIRPLUS), else from the name on after the look at it,
    /// whose lookup makes the kernel's listing from an offset a READDIRPLUS.
    ///
    /// A name a listing gave is looked at without asking the daemon where the kernel still
    /// holds it; everything else goes through the mount ([`Kernel::call_into_mount`]).
    fn make_known(&self, dir: &str, at: u64, name: &str) -> std::io::Result<u64> {
        if self.was_listed(dir, name)
            && let Some(ino) = (self.kernel).cached_ino(&self.mountpoint.join(dir).join(name))
        {
            return Ok(ino);
        }
        let (me, dir, name) = (self.clone(), dir.to_string(), name.to_string());
        call_into_mount(&*self.kernel, move || {
            me.make_known_through_mount(&dir, at, &name)
        })?
    }

    /// [`PageCache::make_known`] by calls into the mount. Only through
    /// [`Kernel::call_into_mount`].
    fn make_known_through_mount(&self, dir: &str, at: u64, name: &str) -> std::io::Result<u64> {
        let listed = self.was_listed(dir, name);
        if !listed && at == 0 {
            self.list(dir, 0, name);
        }
        let ino = std::fs::symlink_metadata(self.mountpoint.join(dir).join(name))?.ino();
        if !listed && at > 0 {
            self.list(dir, at, name);
        }
        Ok(ino)
    }

    /// Lists mount directory `dir` from its entry `at` on, its names remembered in place of its
    /// last listing's, and looks at each other name of `like`'s kind (its extension; `like`
    /// itself is looked at by the caller). Only through [`Kernel::call_into_mount`].
    ///
    /// The look is what lets [`Kernel::cached_ino`] find the name later on any thread: the kernel marks
    /// an inode a READDIRPLUS made for a first look outside its cached-only walk
    /// (`FUSE_I_INIT_RDPLUS`), which fails that walk until then; without it every store went
    /// through this thread (a hand-off of 45 µs of CPU and 80 µs here). A name the listing made
    /// known costs no round trip; one it did not is looked up, as its store would have.
    fn list(&self, dir: &str, at: u64, like: &str) {
        let path = self.mountpoint.join(dir);
        if let Ok(names) = list_once(&path, at) {
            let kind = Path::new(like).extension();
            let others = names.iter().filter(|n| n.as_os_str() != like);
            for name in others.filter(|n| Path::new(n).extension() == kind) {
                let _ = std::fs::symlink_metadata(path.join(name));
            }
            (self.listed.lock().unwrap()).put(dir.to_string(), Arc::new(names));
        }
    }

    /// Stores `job`'s rows: the whole pages they cover (and the file's last, partial page), less
    /// the bytes left out; whether there was any. A page they share with the rows of another
    /// batch is left to the daemon's reads: the kernel marks a page filled only where one store
    /// fills it.
    fn store_rows(&self, job: &RowsToStore) -> std::io::Result<bool> {
        const PAGE: u64 = 4096;
        let bytes = job.rows.bytes();
        let end = job.at + bytes.len() as u64;
        let from = (job.at + job.left_out).next_multiple_of(PAGE);
        let to = match end == job.file_size {
            true => end,
            false => end - end % PAGE,
        };
        if to <= from {
            return Ok(false);
        }
        let ino = self.ino_of(&job.file)?;
        let piece = &bytes[(from - job.at) as usize..(to - job.at) as usize];
        self.kernel.store(ino, from, piece)?;
        Ok(true)
    }

    /// The inode of one-open file `file` (under the mount point), known to the kernel. A file
    /// being read stays known (its reader holds it), so it is looked up again (an `openat2`
    /// and a `statx`, 2% of the daemon's CPU in a cold epoch when made for every store) only
    /// every [`STORES_PER_LOOKUP`] stores. An inode number names one file for the mount's life:
    /// a store to an inode the kernel let go meanwhile is dropped, never put in another file.
    fn ino_of(&self, file: &str) -> std::io::Result<u64> {
        if let Some((ino, stores)) = self.inos.lock().unwrap().get_mut(file)
            && *stores < STORES_PER_LOOKUP
        {
            *stores += 1;
            return Ok(*ino);
        }
        let path = self.mountpoint.join(file);
        let ino = match self.kernel.cached_ino(&path) {
            Some(ino) => ino,
            None => call_into_mount(&*self.kernel, move || {
                std::fs::symlink_metadata(&path).map(|m| m.ino())
            })??,
        };
        self.inos.lock().unwrap().put(file.to_string(), (ino, 0));
        Ok(ino)
    }

    /// Stores the file that is the concatenation of `parts`, from its byte `from` on, in the
    /// kernel's page cache of inode `ino`, which the kernel knows (one it is opening, or one
    /// [`PageCache::make_file_known`] made known): it ignores a store to an inode it does not
    /// hold.
    pub(crate) fn store_ino(&self, ino: u64, from: u64, parts: &[&[u8]]) -> std::io::Result<()> {
        for (at, bytes) in pieces(parts, from) {
            self.kernel.store(ino, at, &bytes)?;
        }
        Ok(())
    }
}

/// The bytes of the concatenation of `parts` from byte `from` on, as the stores that put them
/// in the page cache: each part's whole pages straight from it, and a page that spans two
/// parts copied into one piece. The kernel marks a page filled only where one store fills it
/// from its start (or to the file's end): stored part by part, a page spanning two would be
/// read from the daemon. Copying the file into one buffer first cost a copy of every byte.
fn pieces<'a>(parts: &[&'a [u8]], from: u64) -> Vec<(u64, Cow<'a, [u8]>)> {
    const PAGE: u64 = 4096;
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    // Where each part starts in the file.
    let starts: Vec<u64> = (parts.iter())
        .scan(0, |at, p| {
            let start = *at;
            *at += p.len() as u64;
            Some(start)
        })
        .collect();
    let part_at = |at: u64| starts.partition_point(|&s| s <= at) - 1;
    let mut out = Vec::new();
    let mut at = from;
    while at < total {
        let k = part_at(at);
        let (start, part) = (starts[k], parts[k]);
        let part_end = start + part.len() as u64;
        // To the part's last page boundary, or its end where it ends the file.
        let end = match part_end == total {
            true => total,
            false => part_end - part_end % PAGE,
        };
        if end > at {
            out.push((
                at,
                Cow::Borrowed(&part[(at - start) as usize..(end - start) as usize]),
            ));
            at = end;
            continue;
        }
        // A page that spans parts: its bytes, up to the next page boundary or the file's end.
        let page_end = ((at / PAGE + 1) * PAGE).min(total);
        let page = crate::read::layout::slice(parts, at, (page_end - at) as u32);
        out.push((at, Cow::Owned(page)));
        at = page_end;
    }
    out
}

/// Where file `kind` of batch `j` of `dir` is listed: its directory (relative to the mount
/// point), the entry a listing of it starts at (a batch's directory of per-tensor files from
/// its start: all of them in one answer), and its name.
fn listed_in(layout: &Layout, dir: Batches, j: u64, kind: FileKind) -> (String, u64, String) {
    match kind {
        FileKind::Npy(t) => (
            format!("{}/{}", dir_name(dir), batch_name(j)),
            0,
            layout.npy_name(t),
        ),
        FileKind::Safetensors => (
            dir_name(dir),
            DOT_ENTRIES + batch_file_entry(j),
            layout.file_name(j, kind),
        ),
    }
}

/// The names of directory `path`'s entries from its entry `at` on (an offset its listing gives)
/// that one `getdents64` returns. One call, not a walk to the end (which costs one more round
/// trip to learn there is no more).
fn list_once(path: &Path, at: u64) -> std::io::Result<HashSet<OsString>> {
    use std::io::Seek;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;

    let mut dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(path)?;
    if at > 0 {
        dir.seek(std::io::SeekFrom::Start(at))?;
    }
    // Room for what the kernel's READDIRPLUS answers to one call can name (on kernel 6.18
    // about 190 entries: the batch files and directories of about 97 batches).
    let mut buf = vec![0u8; 32 << 10];
    // SAFETY: `buf` is writable for its length, and the descriptor is open for the call.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Each record: d_ino (u64), d_off (i64), d_reclen (u16), d_type (u8), the name, NUL-ended.
    let mut names = HashSet::new();
    let mut at = 0;
    while at + 19 <= n as usize {
        let reclen = u16::from_ne_bytes(buf[at + 16..at + 18].try_into().expect("2 bytes"));
        if reclen < 19 || at + reclen as usize > n as usize {
            break;
        }
        let name = &buf[at + 19..at + reclen as usize];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        names.insert(OsStr::from_bytes(name).to_os_string());
        at += reclen as usize;
    }
    Ok(names)
}

/// A file to store: its directory, batch and kind, and the byte it is stored from.
pub(crate) type ToStore = (Batches, u64, FileKind, u64);

/// A tensor's rows of one batch of a one-open file read by the daemon, to store in its page
/// cache: the file (relative to the mount point), its size, where the rows start in it, the
/// rows, and the bytes at their start left out (a tripwire: 0 or a page).
pub(crate) struct RowsToStore {
    pub(crate) file: String,
    pub(crate) file_size: u64,
    pub(crate) at: u64,
    pub(crate) rows: crate::read::produce::builder::TensorOf,
    pub(crate) left_out: u64,
}

/// The rows of one-open files that the prefetcher gathered ahead of their reader, stored in the
/// kernel's page cache of the file it reads (`all.safetensors`, `all/NAME.npy`) while the daemon
/// serves its reads: the reader's reads and the kernel's readahead then find them there instead
/// of waiting for a round trip each.
///
/// On a thread of their own: a store waits for the pages a read under way holds (a readahead
/// of the same file), whose answer may need the transform workers or the async workers. The
/// queue is short: the rows it holds are kept in memory outside the budget, so rows that find
/// it full are not stored (their reader reads them from the daemon).
pub(crate) struct RowStores {
    jobs: Mutex<std::sync::mpsc::SyncSender<(RowsToStore, crate::stats::Pending)>>,
    stored: Mutex<LruCache<(Batches, u64, FileKind, usize), ()>>,
    stats: Arc<Stats>,
}

impl RowStores {
    /// The store thread, for readers `depth` batches ahead of whom the rows of `tensors`
    /// tensors are stored.
    pub(crate) fn start(
        page_cache: PageCache,
        stats: Arc<Stats>,
        depth: u64,
        tensors: usize,
    ) -> std::io::Result<RowStores> {
        // Room for a few readers' sightings, each of which asks for half the depth of every
        // tensor at once (their bytes bounded by the depth, which is bounded in bytes).
        let queued = (4 * depth as usize * tensors).max(QUEUED_ROWS);
        let (tx, rx) = std::sync::mpsc::sync_channel(queued);
        let counted = stats.clone();
        std::thread::Builder::new()
            .name("tensorfs-store".into())
            .spawn(move || {
                for (job, _pending) in rx {
                    let job: RowsToStore = job;
                    let stats = &counted;
                    match page_cache.store_rows(&job) {
                        Ok(true) => Stats::add(&stats.c.rows_stored, 1),
                        Ok(false) => {}
                        // Its reader reads those rows from the daemon instead.
                        Err(e) => tracing::debug!("storing rows of {}: {e}", job.file),
                    }
                }
            })?;
        Ok(RowStores {
            jobs: Mutex::new(tx),
            stored: Mutex::new(LruCache::new(
                NonZeroUsize::new(REMEMBERED).expect("not zero"),
            )),
            stats,
        })
    }

    /// Whether tensor `t`'s rows of batch `j` of `dir` in file `kind` are to be stored now:
    /// true once per such rows.
    pub(crate) fn claim(&self, dir: Batches, j: u64, kind: FileKind, t: usize) -> bool {
        self.stored
            .lock()
            .unwrap()
            .put((dir, j, kind, t), ())
            .is_none()
    }

    pub(crate) fn store(&self, job: RowsToStore) {
        let _ = (self.jobs.lock().unwrap()).try_send((job, self.stats.pending()));
    }
}

/// Rows waiting to be stored, at most, however shallow the depth: a few readers' prefetch depth
/// of a few tensors.
const QUEUED_ROWS: usize = 256;

/// Where files are stored, and whether some first pages are left out.
struct Stores {
    page_cache: PageCache,
    tripwires: bool,
}

/// Files in the page cache by the name a reader opens: a directory's batch `j`, file `kind`.
type Name = (Batches, u64, FileKind);

/// How many stored names are remembered, so that each is stored once: a few epochs of a
/// reader's prefetch depth, far more than are ever near a reader at once.
const REMEMBERED: usize = 1 << 16;

/// The batch files stored in the page cache for readers (where a [`PageCache`] is set): each is
/// gathered in memory and stored there, not written to the cache on disk (a shuffled epoch's
/// file is read once: written and read back it would cost two copies more). A read the page
/// cache misses is answered by the daemon from the same batch.
pub(crate) struct Filler {
    kernel: OnceLock<Stores>,
    builder: Arc<Builder>,
    layout: Arc<Layout>,
    stored: Mutex<LruCache<Name, Stored>>,
    /// Woken whenever a claimed file's store ends, stored or not.
    ended: tokio::sync::Notify,
}

/// The longest an open waits for a store under way: one a failed job left claimed is then
/// served by the daemon instead, from the same bytes.
const STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How far the store of a file is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// Claimed, its store not ended.
    Under,
    /// Stored but for a tripwire page (`opens=kernel`): never stored again, its first page read
    /// from the daemon.
    Tripwired,
    /// Stored whole.
    Done,
}

impl Filler {
    pub(crate) fn new(builder: Arc<Builder>, layout: Arc<Layout>) -> Filler {
        Filler {
            kernel: OnceLock::new(),
            builder,
            layout,
            stored: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(REMEMBERED).expect("not zero"),
            )),
            ended: tokio::sync::Notify::new(),
        }
    }

    /// From now on, files are stored in `page_cache`; with `tripwires` (`opens=kernel`, where
    /// no open tells where a reader is) the prefetcher leaves some first pages out.
    pub(crate) fn set(&self, page_cache: PageCache, tripwires: bool) {
        let _ = self.kernel.set(Stores {
            page_cache,
            tripwires,
        });
    }

    /// Whether files are stored in the page cache rather than written.
    pub(crate) fn on(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// Whether the prefetcher stores the files it builds for a reader, some with a tripwire
    /// page left out (`opens=kernel`); else it builds them in memory, for their opens to store.
    pub(crate) fn tripwires(&self) -> bool {
        self.kernel.get().is_some_and(|k| k.tripwires)
    }

    /// Stores file `kind` of `batch` (batch `j` of `dir`), claimed, whole in the page cache of
    /// inode `ino`, which a reader is opening, on the calling thread, the reply to the open
    /// after it. The caller makes sure no read of `ino` is under way: the kernel's store waits
    /// for the pages such a read holds, whose answer a thread storing here may be needed for.
    pub(crate) fn store_opened(
        &self,
        ino: u64,
        dir: Batches,
        j: u64,
        kind: FileKind,
        batch: &Batch,
    ) {
        let Some(kernel) = self.kernel.get() else {
            return;
        };
        let header = batch.header(&self.layout, kind);
        let parts = self.layout.parts(kind, &header, &batch.tensors);
        match kernel.page_cache.store_ino(ino, 0, &parts) {
            Ok(()) => self.stored_one(dir, j, kind, 0),
            Err(e) => {
                // Its reads are served by the daemon instead.
                tracing::debug!("storing {} batch {j}: {e}", dir_name(dir));
                self.unclaim(dir, j, kind);
            }
        }
    }

    /// Waits until file `kind` of batch `j` of `dir` is no longer being stored (its store
    /// claimed by the prefetcher or a walk, a worker's job away), for at most
    /// [`STORE_WAIT`]: whether it is stored.
    pub(crate) async fn store_ended(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        let deadline = tokio::time::Instant::now() + STORE_WAIT;
        loop {
            // Registered before looking, so that the end is not missed.
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            match self.stored.lock().unwrap().peek(&(dir, j, kind)) {
                Some(Stored::Done) => return true,
                None | Some(Stored::Tripwired) => return false,
                Some(Stored::Under) => {}
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    /// Whether file `kind` of batch `j` of `dir` is claimed and its store not ended.
    pub(crate) fn under_way(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        self.stored.lock().unwrap().peek(&(dir, j, kind)) == Some(&Stored::Under)
    }

    /// A claimed file that was not stored: no longer claimed.
    fn unclaim(&self, dir: Batches, j: u64, kind: FileKind) {
        self.stored.lock().unwrap().pop(&(dir, j, kind));
        self.ended.notify_waiters();
    }

    /// Whether file `kind` of batch `j` of `dir` is stored (or being stored).
    pub(crate) fn has(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        self.stored.lock().unwrap().contains(&(dir, j, kind))
    }

    /// Whether file `kind` of batch `j` of `dir` is stored, the store ended.
    pub(crate) fn stored(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        self.stored.lock().unwrap().peek(&(dir, j, kind)) == Some(&Stored::Done)
    }

    /// Whether file `kind` of batch `j` of `dir` is stored, whole or but for a tripwire page.
    pub(crate) fn stored_at_least_in_part(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        matches!(
            self.stored.lock().unwrap().peek(&(dir, j, kind)),
            Some(Stored::Done | Stored::Tripwired)
        )
    }

    /// Takes file `kind` of batch `j` of `dir` to store: false if it is stored or being stored.
    pub(crate) fn claim(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        let mut stored = self.stored.lock().unwrap();
        if stored.contains(&(dir, j, kind)) {
            return false;
        }
        stored.put((dir, j, kind), Stored::Under);
        true
    }

    fn ended_as(&self, dir: Batches, j: u64, kind: FileKind, how: Stored) {
        self.stored.lock().unwrap().put((dir, j, kind), how);
        self.ended.notify_waiters();
    }

    /// Stores the file claimed, from byte `from` on (past a tripwire page, or 0): its batch
    /// built (or taken from memory), then its bytes handed to the kernel off the async workers.
    /// On a failure it is no longer claimed, and its reader reads it from the daemon.
    pub(crate) async fn fill(
        self: &Arc<Self>,
        dir: Batches,
        j: u64,
        kind: FileKind,
        from: u64,
    ) -> Result<()> {
        self.fill_by((dir, j, kind, from), Some(Lane::Serving))
            .await
    }

    /// [`Filler::fill`] of `file`, first by one job in `lane` where there is one
    /// ([`Filler::store`]).
    async fn fill_by(self: &Arc<Self>, file: ToStore, lane: Option<Lane>) -> Result<()> {
        let (dir, j, kind, from) = file;
        let done = self.store(file, lane).await;
        match &done {
            Ok(()) => self.stored_one(dir, j, kind, from),
            Err(_) => self.unclaim(dir, j, kind),
        }
        done
    }

    /// Stores the files claimed `files` (directory, batch, file, from byte) as [`Filler::fill`]
    /// does: those whose batches' row groups are in memory in one job of a worker, the rest as
    /// `fill` does; how many. After a failure the files left are no longer claimed.
    pub(crate) async fn fill_all(self: &Arc<Self>, files: Vec<ToStore>) -> Result<u64> {
        if files.is_empty() {
            return Ok(0);
        }
        let me = self.clone();
        let pool = self.builder.clone();
        let (done, left) = pool.pool().run(move || me.fill_here(files)).await?;
        Ok(done + self.fill_left(left, Lane::Workers).await?)
    }

    /// Stores `files`, claimed, one by one as [`Filler::fill`] does, the first (the one
    /// [`Filler::fill_here`] stopped at: its batch cannot be built on a worker) without trying
    /// a worker again; how many. After a failure the files left are no longer claimed.
    pub(crate) async fn fill_left(
        self: &Arc<Self>,
        files: Vec<ToStore>,
        lane: Lane,
    ) -> Result<u64> {
        let mut done = 0;
        let mut left = files.into_iter();
        while let Some(file) = left.next() {
            if let Err(e) = self.fill_by(file, (done > 0).then_some(lane)).await {
                for (dir, j, kind, _) in left {
                    self.unclaim(dir, j, kind);
                }
                return Err(e);
            }
            done += 1;
        }
        Ok(done)
    }

    /// Stores `files`, claimed, in order on the calling thread (a worker's) while their batches
    /// can be built there: how many, and the files left from the first that could not. The
    /// files of one batch next to each other (its kinds) are stored from one build of it.
    pub(crate) fn fill_here(&self, files: Vec<ToStore>) -> (u64, Vec<ToStore>) {
        let mut done = 0;
        let mut n = 0;
        while n < files.len() {
            let (dir, j, ..) = files[n];
            let same = files[n..].iter().take_while(|f| (f.0, f.1) == (dir, j));
            let of_batch = same.count();
            let Some(batch) = self.built_here(dir, j) else {
                return (done, files[n..].to_vec());
            };
            for &(dir, j, kind, from) in &files[n..n + of_batch] {
                if self.store_batch(&batch, dir, j, kind, from).is_err() {
                    return (done, files[n..].to_vec());
                }
                self.stored_one(dir, j, kind, from);
                done += 1;
                n += 1;
            }
        }
        (done, Vec::new())
    }

    /// Batch `j` of `dir`, built on the calling thread to store files of it
    /// ([`Builder::batch_here`]).
    fn built_here(&self, dir: Batches, j: u64) -> Option<Arc<Batch>> {
        (self.builder).batch_here(self.builder.plan().batch_in(dir, j))
    }

    /// A file stored from byte `from` on: counted, and whole unless a tripwire is left out.
    fn stored_one(&self, dir: Batches, j: u64, kind: FileKind, from: u64) {
        let how = match from {
            0 => Stored::Done,
            _ => Stored::Tripwired,
        };
        self.ended_as(dir, j, kind, how);
        Stats::add(&self.builder.stats().c.page_cache_stores, 1);
    }

    /// Stores `file`; where a `lane` is given, first by one job there ([`Filler::store_here`]).
    async fn store(self: &Arc<Self>, file: ToStore, lane: Option<Lane>) -> Result<()> {
        let (dir, j, kind, from) = file;
        if self.kernel.get().is_none() {
            return Ok(());
        }
        // Built and stored by one worker where the batch's row groups are in memory (a
        // shuffled epoch from cached columns): measured, the trips through the async workers
        // and the blocking pool cost more CPU than the gather.
        if let Some(lane) = lane {
            let me = self.clone();
            let pool = self.builder.clone();
            let here = (pool.pool()).run_in(lane, move || me.store_here(dir, j, kind, from));
            if let Some(stored) = here.await? {
                return stored;
            }
        }
        let batch = self
            .builder
            .batch(self.builder.plan().batch_in(dir, j))
            .await?;
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.store_batch(&batch, dir, j, kind, from))
            .await
            .map_err(|e| anyhow::anyhow!("storing in the page cache: {e}"))?
    }

    /// [`Filler::store`] on the calling thread, its batch built there; `None` where a row group
    /// of the batch is not in memory.
    fn store_here(&self, dir: Batches, j: u64, kind: FileKind, from: u64) -> Option<Result<()>> {
        let batch = self.built_here(dir, j)?;
        Some(self.store_batch(&batch, dir, j, kind, from))
    }

    /// Stores file `kind` of `batch` (batch `j` of `dir`) from byte `from` on. Blocking: it
    /// makes the file known to the kernel through the mount.
    fn store_batch(
        &self,
        batch: &Batch,
        dir: Batches,
        j: u64,
        kind: FileKind,
        from: u64,
    ) -> Result<()> {
        let kernel = &self.kernel.get().expect("stores set").page_cache;
        let header = batch.header(&self.layout, kind);
        let parts = self.layout.parts(kind, &header, &batch.tensors);
        let stored = (kernel.make_file_known(&self.layout, dir, j, kind))
            .and_then(|ino| kernel.store_ino(ino, from, &parts));
        stored.map_err(|e| anyhow::anyhow!("storing in the page cache: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_the_file_in_pages_each_filled_by_one_store() {
        // A 4096-byte header, then parts that end on and off page boundaries.
        let part = |len: usize, salt: u8| -> Vec<u8> {
            (0..len).map(|i| (i as u8).wrapping_mul(7) ^ salt).collect()
        };
        for lens in [
            vec![4096, 8192, 4096],
            vec![4096, 4000, 10, 9000, 3],
            vec![4096, 100, 200],
            vec![4096, 0, 5000],
        ] {
            let parts: Vec<Vec<u8>> = (lens.iter().enumerate())
                .map(|(k, &len)| part(len, k as u8))
                .collect();
            let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let file = parts.concat();
            for from in [0, 4096] {
                let pieces = pieces(&parts, from);
                let mut at = from;
                for (k, (start, bytes)) in pieces.iter().enumerate() {
                    assert_eq!(*start, at, "{lens:?} from {from}: contiguous");
                    assert!(
                        start.is_multiple_of(4096),
                        "{lens:?}: each piece starts a page"
                    );
                    let end = start + bytes.len() as u64;
                    let last = k + 1 == pieces.len();
                    assert!(
                        end.is_multiple_of(4096) || end == file.len() as u64,
                        "{lens:?}: pages whole"
                    );
                    assert!(!last || end == file.len() as u64, "{lens:?}: to the end");
                    assert_eq!(bytes[..], file[*start as usize..end as usize]);
                    at = end;
                }
                // Only pages that span parts are copied.
                let copied = pieces
                    .iter()
                    .filter(|(_, b)| matches!(b, Cow::Owned(_)))
                    .count();
                assert!(copied < lens.len(), "{lens:?}: {copied} pages copied");
            }
        }
    }
}
