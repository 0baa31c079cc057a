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

use crate::read::builder::Builder;
use crate::read::layout::{FileKind, Layout, dir_name};
use crate::read::plan::Batches;
use crate::stats::Stats;
use anyhow::Result;
use fuser::{INodeNo, Notifier};
use lru::LruCache;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The bytes a tripwire leaves out of the page cache: the first page.
pub const TRIPWIRE_PAGE: u64 = 4096;

#[derive(Clone)]
pub struct PageCache {
    notifier: Notifier,
    mountpoint: PathBuf,
}

impl PageCache {
    pub fn new(notifier: Notifier, mountpoint: &Path) -> PageCache {
        PageCache {
            notifier,
            mountpoint: mountpoint.to_path_buf(),
        }
    }

    /// Stores `bytes` at offset `from` of the mount's file `name` (relative to the mount point)
    /// in the kernel's page cache. Blocking: it looks `name` up through the mount, which the
    /// FUSE threads answer, so it must not run on one of them.
    pub fn store(&self, name: &str, from: u64, bytes: &[u8]) -> std::io::Result<()> {
        // The kernel stores pages only for an inode it knows; looking the name up makes it known
        // (and a reader's lookup of it then costs no round trip either).
        let ino = std::fs::metadata(self.mountpoint.join(name))?.ino();
        self.notifier.store(INodeNo(ino), from, bytes)
    }
}

/// Files in the page cache by the name a reader opens: a directory's batch `j`, file `kind`.
type Name = (Batches, u64, FileKind);

/// How many stored names are remembered, so that each is stored once: a few epochs of a
/// reader's prefetch depth, far more than are ever near a reader at once.
const REMEMBERED: usize = 1 << 16;

/// What the prefetcher stores in the page cache for readers: with `opens=kernel` (a
/// [`PageCache`] set), each file it builds for a reader is gathered in memory and stored there,
/// not written to the cache on disk (a shuffled epoch's file is read once: written and read back
/// it would cost two copies more). A read the page cache misses is answered by the daemon from
/// the same batch.
pub struct Filler {
    kernel: OnceLock<PageCache>,
    builder: Arc<Builder>,
    layout: Arc<Layout>,
    stored: Mutex<LruCache<Name, ()>>,
}

impl Filler {
    pub fn new(builder: Arc<Builder>, layout: Arc<Layout>) -> Filler {
        Filler {
            kernel: OnceLock::new(),
            builder,
            layout,
            stored: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(REMEMBERED).expect("not zero"),
            )),
        }
    }

    /// From now on, files are stored in `page_cache`.
    pub fn set(&self, page_cache: PageCache) {
        let _ = self.kernel.set(page_cache);
    }

    /// Whether files are stored in the page cache (`opens=kernel`) rather than written.
    pub fn on(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// Whether file `kind` of batch `j` of `dir` is stored (or being stored).
    pub fn has(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        self.stored.lock().unwrap().contains(&(dir, j, kind))
    }

    /// Takes file `kind` of batch `j` of `dir` to store: false if it is stored or being stored.
    pub fn claim(&self, dir: Batches, j: u64, kind: FileKind) -> bool {
        self.stored
            .lock()
            .unwrap()
            .put((dir, j, kind), ())
            .is_none()
    }

    /// Stores the file claimed, from byte `from` on (past a tripwire page, or 0): its batch
    /// built (or taken from memory), then its bytes handed to the kernel off the async workers.
    /// On a failure it is no longer claimed, and its reader reads it from the daemon.
    pub async fn fill(&self, dir: Batches, j: u64, kind: FileKind, from: u64) -> Result<()> {
        let done = self.store(dir, j, kind, from).await;
        match &done {
            Ok(()) => Stats::add(&self.builder.stats().c.page_cache_stores, 1),
            Err(_) => {
                self.stored.lock().unwrap().pop(&(dir, j, kind));
            }
        }
        done
    }

    async fn store(&self, dir: Batches, j: u64, kind: FileKind, from: u64) -> Result<()> {
        let Some(kernel) = self.kernel.get() else {
            return Ok(());
        };
        let (epoch, g) = dir.global(j);
        let batch = self.builder.batch(epoch, g).await?;
        let bytes = batch.file_from(&self.layout, kind, from);
        drop(batch);
        let name = format!("{}/{}", dir_name(dir), self.layout.file_name(j, kind));
        let kernel = kernel.clone();
        tokio::task::spawn_blocking(move || kernel.store(&name, from, &bytes))
            .await
            .map_err(|e| anyhow::anyhow!("storing in the page cache: {e}"))?
            .map_err(|e| anyhow::anyhow!("storing in the page cache: {e}"))
    }
}
