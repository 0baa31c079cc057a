//! The local SSD cache: transformed row-group columns (so a reshuffled epoch gathers without
//! decoding Parquet again) and the materialised batch files that readers open.
//!
//! Layout under `cache_dir`:
//!
//! ```text
//! v1/tmp/PID-N                          files being written (a dead PID's are removed at start)
//! v1/cols-CKEY/OBJECT-000003.cols       one row group's tensor columns: header + data
//! v1/batches-BKEY/epoch-E/000042.safetensors       a batch file, byte for byte what the mount
//! v1/batches-BKEY/epoch-E/000042/x.npy             shows, so the kernel can pass reads through
//! ```
//!
//! A batch file's length and crc32c (its meta) are its extended attribute `user.tensorfs.meta`,
//! set before the file is renamed into place, so one rename publishes a checked file. Where the
//! cache's filesystem has no user extended attributes, the meta is a sidecar file
//! `.000042.safetensors.meta` beside it, renamed after the data (a file without its meta is
//! removed at start). One file per batch instead of two: creating files (an inode, a rename
//! that locks two directories) cost a shuffled epoch more than gathering its rows.
//!
//! A row group's columns are named by the version of the object they come from (OBJECT: its
//! URL, key, size and ETag or version, hashed) and its row group in it, so a dataset that grows
//! keeps the columns of the objects it had: a job moved to a newer snapshot decodes only the
//! new objects. CKEY hashes what else decides the columns (the dataset's schema and the column
//! options); BKEY hashes the dataset's fingerprint, the column options and the order options,
//! so a changed option can never serve stale bytes. A columns file of an object the dataset no
//! longer holds is evicted before anything of the dataset's. Each mount holds a shared lock on
//! its two directories; directories of other keys that no mount holds are removed at start, so
//! the cache stays within `cache_size` as datasets and options come and go. Every item is checked against its crc32c
//! when it is served; a corrupt, truncated or missing item is dropped and counted as a miss.
//! Writes go to a temp file, then are renamed into place. They are not fsynced: this is a
//! cache, and what a crash may leave short or zeroed fails its crc32c, which is checked on the
//! first use of every item after each start. When the cache is over
//! `cache_size`, the items needed furthest in the future are evicted first.
//!
//! Lookups answer `Option`: a miss (a dropped corrupt item included) is not an error, the
//! caller builds the item. Stores answer `Result<_, NotStored>`: the reason the cache did not
//! take an item, which the caller then serves from memory.
//!
//! This folder: this module (the index, space, writing and checking items), `one_open` (the
//! one-open files built ahead and kept), `format` (the columns file's header and a batch file's
//! meta, and where the meta lives), `eviction` (what goes first), `kept` (small checked files
//! kept between mounts).

mod format;
mod guard;
mod one_open;

use crate::model::item::{Item, ItemNames};
use crate::model::kept::private_dir;
use crate::model::plan::BatchRef;
use crate::stats::Stats;
use anyhow::{Result, bail};
use format::{
    columns_header, meta_bytes, meta_len, meta_path, parse_columns, parse_meta, read_meta,
    set_meta_attr,
};
use guard::GuardedMap;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why the cache did not store an item. Never a failure of the read that wanted it: the caller
/// serves the item from memory instead, and the cache takes items again once it can.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotStored {
    /// Every item it could evict is needed sooner (or pinned) than this one.
    #[error("the cache is full of items needed sooner")]
    Full,
    /// Writing failed (a full disk, a permission); counted and warned of once.
    #[error("writing to the cache failed: {0:#}")]
    Write(anyhow::Error),
}

struct Entry {
    bytes: u64,
    pinned_until: Option<Instant>,
    /// The file as it was when written or last checked: while it is unchanged (same inode,
    /// size, mtime and ctime; any write changes them), its crc32c need not be read again.
    checked: Option<Stamp>,
}

impl Entry {
    /// An item found on disk at start: checked on first use.
    fn found(bytes: u64) -> Entry {
        Entry {
            bytes,
            pinned_until: None,
            checked: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    pub(crate) fn of(md: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            ino: md.ino(),
            size: md.size(),
            mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
            ctime_ns: md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128,
        }
    }
}

/// A row group's columns (the parts of `read::produce::columns::Placement`) from the cache, checked.
pub(crate) struct LoadedColumns {
    pub(crate) buf: ColumnBuf,
    pub(crate) ranges: Vec<std::ops::Range<usize>>,
}

/// Columns files smaller than this are read, never mapped: a mapping costs more than reading a
/// few pages, and the mappings a process may hold are limited.
const MAP_AT_LEAST: u64 = 64 << 10;

/// Whether a columns file of `len` bytes is mapped where files of `map_from` bytes or more
/// are to be.
pub(crate) fn mapped(len: u64, map_from: u64) -> bool {
    len >= map_from.max(MAP_AT_LEAST)
}

/// Whether an error opening or reading a cache file says the process is short of something
/// (file descriptors, memory) rather than anything about the file: the item is kept, the read
/// misses (and is served from memory), and the first such error is logged.
fn out_of_resources(e: &std::io::Error) -> bool {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    let short = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    );
    if short && !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!("cache files cannot be opened or read ({e}): served from memory meanwhile");
    }
    short
}

/// How many columns files may be mapped at once: half of what the kernel lets a process map
/// (`vm.max_map_count`, 65530 by default), leaving the rest to the allocator, thread stacks
/// and libraries.
pub(crate) fn mappings_allowed() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(65530)
        / 2
}

/// Read into memory, or mapped. Reading is the default: a mapping would show readers a change
/// made to the file in place after the check. `shuffle=global`, whose every batch gathers from
/// every row group, maps them instead, and so does any mount a row group too large to hold in
/// memory (`Builder::map_from` says which; tensorfs itself only ever replaces cache files by
/// rename, which leaves a mapping as it was). A mapped file truncated under the mapping reads
/// as zeros and says so ([`ColumnBuf::poisoned`]) rather than ending the daemon.
pub(crate) enum ColumnBuf {
    Read(Vec<u8>),
    Mapped(GuardedMap),
}

impl ColumnBuf {
    /// Whether the mapped file changed under the mapping: what was read of it since may be
    /// zeros, and must not be used.
    pub(crate) fn poisoned(&self) -> bool {
        match self {
            ColumnBuf::Read(_) => false,
            ColumnBuf::Mapped(m) => m.poisoned(),
        }
    }
}

impl std::ops::Deref for ColumnBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ColumnBuf::Read(v) => v,
            ColumnBuf::Mapped(m) => m,
        }
    }
}

pub(crate) struct DiskCache {
    root: PathBuf,
    cols: PathBuf,
    /// Each row group's columns file name (global row-group index), and back.
    columns: Vec<String>,
    columns_of: HashMap<String, usize>,
    /// Columns files in `cols` of objects this dataset does not hold (another snapshot's):
    /// evicted first.
    foreign: Mutex<Vec<(PathBuf, u64)>>,
    /// Shared locks on `cols` and `batches`, held while the cache is open: other mounts leave
    /// directories in use alone.
    _locks: Vec<File>,
    batches: PathBuf,
    tmp: PathBuf,
    ckey: String,
    bkey: String,
    /// Batch files are named as the mount shows them.
    layout: std::sync::Arc<dyn ItemNames>,
    capacity: u64,
    entries: Mutex<HashMap<Item, Entry>>,
    /// How many files of each (epoch, batch) the cache holds.
    built: Mutex<HashMap<BatchRef, u32>>,
    /// Bytes of the entries, plus space reserved by writes in progress.
    used: AtomicU64,
    reserving: Mutex<()>,
    /// One-open files kept in this mount without their meta, until the mount ends
    /// ([`DiskCache::seal_kept`]).
    unsealed: Mutex<std::collections::HashSet<Item>>,
    next_tmp: AtomicU64,
    /// `PID-`: temp file names start with it (a dead PID's are removed at start).
    tmp_prefix: String,
    /// Whether the cache's filesystem takes the meta as an extended attribute (else sidecars).
    meta_attrs: AtomicBool,
    full_warned: AtomicBool,
}

/// Whether process `pid` runs: not a zombie nobody reaped (it writes nothing more), and not a
/// thread of another process that happens to have that id (`/proc/ID` exists for threads).
fn pid_alive(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    let process = field("Tgid:").is_none_or(|t| t == pid.to_string());
    !zombie && process
}

impl DiskCache {
    /// Opens the cache for one dataset and option set: creates its directories, removes what a
    /// crashed daemon left and the directories of other keys no mount uses, and indexes what is
    /// there (checksums are checked on use, not here). `columns`: each row group's columns file
    /// name ([`columns_name`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        cache_dir: &Path,
        ckey: String,
        bkey: String,
        capacity: u64,
        layout: std::sync::Arc<dyn ItemNames>,
        columns: Vec<String>,
        stats: &Stats,
    ) -> Result<DiskCache> {
        let root = cache_dir.join("v1");
        let columns_of = (columns.iter().enumerate())
            .map(|(g, n)| (n.clone(), g))
            .collect();
        let (cols, batches) = (
            root.join(format!("cols-{ckey}")),
            root.join(format!("batches-{bkey}")),
        );
        for d in [&root, &cols, &batches] {
            private_dir(d)?;
        }
        let locks = vec![
            lock_dir(&cols, libc::LOCK_SH)?,
            lock_dir(&batches, libc::LOCK_SH)?,
        ];
        remove_unused_keys(&root, &cols, &batches);
        let cache = DiskCache {
            columns,
            columns_of,
            foreign: Mutex::default(),
            _locks: locks,
            cols,
            batches,
            tmp: root.join("tmp"),
            root,
            ckey,
            bkey,
            layout,
            capacity,
            entries: Mutex::new(HashMap::new()),
            built: Mutex::default(),
            used: AtomicU64::new(0),
            reserving: Mutex::new(()),
            unsealed: Mutex::default(),
            next_tmp: AtomicU64::new(0),
            tmp_prefix: format!("{}-", std::process::id()),
            meta_attrs: AtomicBool::new(true),
            full_warned: AtomicBool::new(false),
        };
        for d in [&cache.root, &cache.cols, &cache.batches, &cache.tmp] {
            private_dir(d)?;
        }
        cache.clean_tmp();
        cache.scan();
        Stats::set(&stats.c.cache_capacity, capacity);
        Stats::set(&stats.c.cache_bytes, cache.used());
        tracing::info!(
            "cache {}: {} items, {} bytes of {}",
            cache.root.display(),
            cache.entries.lock().unwrap().len(),
            cache.used(),
            capacity
        );
        Ok(cache)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn clean_tmp(&self) {
        let Ok(dir) = std::fs::read_dir(&self.tmp) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_none_or(|p| !pid_alive(p) || p == std::process::id()) {
                tracing::info!("removing '{name}', left by a daemon that is gone");
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Indexes the items on disk; batch files without their meta (a crash between the data's
    /// rename and its sidecar's) are removed.
    fn scan(&self) {
        let mut entries = self.entries.lock().unwrap();
        let mut used = 0;
        if let Ok(dir) = std::fs::read_dir(&self.cols) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(md) = e.metadata() else {
                    continue;
                };
                match self.columns_of.get(&name) {
                    Some(&rg) => {
                        used += md.len();
                        entries.insert(Item::Columns { rg }, Entry::found(md.len()));
                    }
                    None if name.ends_with(".cols") && md.is_file() => {
                        used += md.len();
                        self.foreign.lock().unwrap().push((e.path(), md.len()));
                    }
                    None => {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        used += self.scan_kept(&mut entries);
        let Ok(epochs) = std::fs::read_dir(&self.batches) else {
            self.used.store(used, Ordering::Relaxed);
            return;
        };
        for ep in epochs.flatten() {
            let Some(epoch) = ep
                .file_name()
                .to_str()
                .and_then(|name| self.layout.parse_epoch(name))
            else {
                continue;
            };
            let mut found: Vec<(Item, PathBuf)> = Vec::new();
            let walk = |dir: &Path, found: &mut Vec<(Item, PathBuf)>| -> Vec<PathBuf> {
                let mut subdirs = Vec::new();
                for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    let path = e.path();
                    if path.is_dir() {
                        subdirs.push(path);
                    } else if let Some(item) = self.item_of(epoch, &path) {
                        found.push((item, path));
                    }
                }
                subdirs
            };
            let subdirs = walk(&ep.path(), &mut found);
            for sub in &subdirs {
                walk(sub, &mut found);
            }
            for (item, path) in found {
                match (std::fs::metadata(&path), meta_len(&path)) {
                    (Ok(d), Some(m)) => {
                        let bytes = d.len() + m;
                        used += bytes;
                        entries.insert(item, Entry::found(bytes));
                        self.count_batch(item, 1);
                    }
                    _ => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            // Directories an earlier run's evictions left empty (only empty ones go).
            for sub in &subdirs {
                let _ = std::fs::remove_dir(sub);
            }
            let _ = std::fs::remove_dir(ep.path());
        }
        self.used.store(used, Ordering::Relaxed);
    }

    /// The item a batch file path names, if any (meta sidecars name none).
    fn item_of(&self, epoch: u64, path: &Path) -> Option<Item> {
        let name = path.file_name()?.to_str()?;
        if name.starts_with('.') {
            return None;
        }
        let dir = path.parent()?.file_name()?.to_str()?;
        let in_batch_dir = !dir.starts_with("epoch-");
        self.layout
            .parse_batch_file(epoch, in_batch_dir.then_some(dir), name)
    }

    /// Where an item lives.
    pub(crate) fn path(&self, item: Item) -> PathBuf {
        match item {
            Item::Columns { rg } => self.cols.join(&self.columns[rg]),
            _ => self.batches.join(self.layout.item_path(item)),
        }
    }

    fn identity(&self, item: Item) -> [u8; 32] {
        let key = match item {
            Item::Columns { .. } => &self.ckey,
            _ => &self.bkey,
        };
        crate::model::kept::hash32(&[
            key.as_bytes(),
            self.path(item).as_os_str().as_encoded_bytes(),
        ])
    }

    /// Whether a file of batch `b` is in the cache: its row groups are then not needed to serve
    /// it.
    pub(crate) fn has_batch(&self, b: BatchRef) -> bool {
        self.built.lock().unwrap().contains_key(&b)
    }

    fn count_batch(&self, item: Item, delta: i32) {
        if let Some(key) = item.batch() {
            let mut built = self.built.lock().unwrap();
            let n = built.entry(key).or_default();
            *n = n.saturating_add_signed(delta);
            if *n == 0 {
                built.remove(&key);
            }
        }
    }

    pub(crate) fn contains(&self, item: Item) -> bool {
        self.entries.lock().unwrap().contains_key(&item)
    }

    /// Drops a row group's columns file that changed under the mapping a read used: it is
    /// built again from the source.
    pub(crate) fn drop_changed_columns(&self, rg: usize, stats: &Stats) {
        let item = Item::Columns { rg };
        // Builds that read it at once each find it changed: one drop, one log line.
        if self.contains(item) {
            self.drop_corrupt(item, "changed while mapped", stats);
        }
    }

    /// Drops an item that failed its check: a counted miss, never an error.
    fn drop_corrupt(&self, item: Item, why: &str, stats: &Stats) {
        tracing::warn!(
            "cache item {} is {why}: dropped, it will be rebuilt",
            self.path(item).display()
        );
        Stats::add(&stats.c.cache_corrupt_dropped, 1);
        self.remove(item, stats);
    }

    fn remove(&self, item: Item, stats: &Stats) {
        // Out of the index first: a reader that finds the file gone then knows it was evicted.
        if let Some(e) = self.entries.lock().unwrap().remove(&item) {
            self.used.fetch_sub(e.bytes, Ordering::Relaxed);
            self.count_batch(item, -1);
        }
        let path = self.path(item);
        let _ = std::fs::remove_file(&path);
        if !matches!(item, Item::Columns { .. }) {
            let _ = std::fs::remove_file(meta_path(&path));
            self.remove_empty_dirs(&path);
        }
        Stats::set(&stats.c.cache_bytes, self.used());
    }

    /// Removes the directories a removed batch file leaves empty, its batch's and then its
    /// epoch's, so that epochs gone by leave no trace. A writer that finds its directory gone
    /// makes it again (`rename_into`).
    fn remove_empty_dirs(&self, path: &Path) {
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != self.batches) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }

    /// Keeps an item from eviction for `grace` (a path handed out to GPUDirect readers).
    pub(crate) fn pin(&self, item: Item, grace: Duration) {
        if let Some(e) = self.entries.lock().unwrap().get_mut(&item) {
            e.pinned_until = Some(Instant::now() + grace);
        }
    }

    /// A row group's columns from the cache, checked; `None` on a miss. Mapped where [`mapped`]
    /// says so, else read.
    pub(crate) fn load_columns(
        &self,
        rg: usize,
        parts: usize,
        map_from: u64,
        stats: &Stats,
    ) -> Option<LoadedColumns> {
        self.columns_file(rg, parts, map_from, stats, true)
    }

    /// As [`DiskCache::load_columns`], for the columns file this process has just written
    /// ([`DiskCache::store_columns`]): its header checked, not its data, whose checksum was
    /// computed from the same bytes a moment ago (checking it again read every byte back,
    /// 2% of a cold epoch's CPU at 272-byte rows). A change to the file later shows as any
    /// mapped file's does ([`ColumnBuf::poisoned`]).
    pub(crate) fn stored_columns(
        &self,
        rg: usize,
        parts: usize,
        map_from: u64,
        stats: &Stats,
    ) -> Option<LoadedColumns> {
        self.columns_file(rg, parts, map_from, stats, false)
    }

    fn columns_file(
        &self,
        rg: usize,
        parts: usize,
        map_from: u64,
        stats: &Stats,
        check_data: bool,
    ) -> Option<LoadedColumns> {
        let item = Item::Columns { rg };
        if !self.contains(item) {
            return None;
        }
        let mut file = match File::open(self.path(item)) {
            Ok(f) => f,
            Err(e) if out_of_resources(&e) => return None,
            Err(_) => {
                self.drop_corrupt(item, "missing", stats);
                return None;
            }
        };
        let len = file.metadata().map_or(0, |m| m.len());
        // SAFETY: the file is checked below before any byte is used, and tensorfs replaces
        // cache files only by rename, which leaves this mapping's pages as they were.
        let map = mapped(len, map_from)
            .then(|| unsafe { Mmap::map(&file) }.ok())
            .flatten()
            .and_then(|m| GuardedMap::new(m, file.try_clone().ok()?));
        let buf = match map {
            Some(m) => ColumnBuf::Mapped(m),
            // A mapping refused (the process at its limit of mappings) is read instead.
            None => {
                let mut v = Vec::with_capacity(len as usize);
                match file.read_to_end(&mut v) {
                    Ok(_) => {}
                    Err(e) if out_of_resources(&e) => return None,
                    Err(e) => {
                        self.drop_corrupt(item, &format!("unreadable ({e})"), stats);
                        return None;
                    }
                }
                ColumnBuf::Read(v)
            }
        };
        let parsed = parse_columns(&buf, &self.identity(item), parts, check_data);
        if buf.poisoned() {
            self.drop_corrupt(item, "changed while mapped", stats);
            return None;
        }
        match parsed {
            Ok((_, ranges)) => Some(LoadedColumns { buf, ranges }),
            Err(e) => {
                self.drop_corrupt(item, &e.to_string(), stats);
                None
            }
        }
    }

    /// Writes a row group's columns.
    pub(crate) fn store_columns(
        &self,
        rg: usize,
        rows: usize,
        parts: &[&[u8]],
        distance: &dyn Fn(Item) -> u64,
        stats: &Stats,
    ) -> Result<(), NotStored> {
        let item = Item::Columns { rg };
        let header = columns_header(rows, parts, &self.identity(item));
        let mut file: Vec<&[u8]> = vec![&header];
        file.extend_from_slice(parts);
        self.write(item, &file, None, distance, stats).map(drop)
    }

    /// Whether `file`, opened (and checked) as `item` earlier, is still the item's file as it
    /// was checked: the item is in the index and the file unchanged since.
    pub(crate) fn unchanged(&self, item: Item, file: &File) -> bool {
        let Some(known) = self.entries.lock().unwrap().get(&item).map(|e| e.checked) else {
            return false;
        };
        known.is_some() && file.metadata().ok().map(|md| Stamp::of(&md)) == known
    }

    /// Whether `item` is in the index and was checked since it was indexed.
    pub(crate) fn checked_already(&self, item: Item) -> bool {
        let entries = self.entries.lock().unwrap();
        entries.get(&item).is_some_and(|e| e.checked.is_some())
    }

    /// A batch file from the cache if it was checked already and is unchanged since: an open
    /// and an `fstat`, never a read. `None` where it is not in the index or still to be
    /// checked ([`DiskCache::open_batch_file`] does that).
    pub(crate) fn open_if_checked(&self, item: Item) -> Option<File> {
        if !self.checked_already(item) {
            return None;
        }
        let file = File::open(self.path(item)).ok()?;
        self.unchanged(item, &file).then_some(file)
    }

    /// A batch file from the cache, checked against its crc32c; `None` on a miss.
    pub(crate) fn open_batch_file(&self, item: Item, stats: &Stats) -> Option<(File, PathBuf)> {
        let (file, _) = self.check_file(item, &|_| {}, stats)?;
        Some((file, self.path(item)))
    }

    /// Writes a batch file (the concatenation of `parts`) and its meta; the file, opened, and
    /// its path.
    pub(crate) fn store_batch_file(
        &self,
        item: Item,
        parts: &[&[u8]],
        distance: &dyn Fn(Item) -> u64,
        stats: &Stats,
    ) -> Result<(File, PathBuf), NotStored> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut crc = 0;
        for p in parts {
            crc = crc32c::crc32c_append(crc, p);
        }
        let meta = meta_bytes(len, crc, &self.identity(item));
        let file = self.write(item, parts, Some(&meta), distance, stats)?;
        Ok((file, self.path(item)))
    }

    /// Whether `bytes` more fit once the items that `distance` says are never needed again are
    /// evicted (they are): room for work done well ahead of its readers, which must not push
    /// out anything they need ([`crate::read::follow::prefetch`]'s next epoch).
    pub(crate) fn has_spare_room(
        &self,
        bytes: u64,
        distance: &dyn Fn(Item) -> u64,
        stats: &Stats,
    ) -> bool {
        let _one_at_a_time = self.reserving.lock().unwrap();
        self.spare_room(bytes, distance, stats)
    }

    fn spare_room(&self, bytes: u64, distance: &dyn Fn(Item) -> u64, stats: &Stats) -> bool {
        self.make_room_from(bytes, distance, u64::MAX, stats);
        self.used() + bytes <= self.capacity
    }

    /// A batch file or kept one-open file, checked against its meta's length and crc32c unless
    /// it was checked in this mount and is unchanged since (read in pieces, `checked` told the
    /// bytes read so far), with the stamp it is indexed with; `None` on a miss (one that fails
    /// its check is dropped).
    pub(crate) fn check_file(
        &self,
        item: Item,
        checked: &dyn Fn(u64),
        stats: &Stats,
    ) -> Option<(File, Stamp)> {
        let known = self.entries.lock().unwrap().get(&item).map(|e| e.checked)?;
        let path = self.path(item);
        let result = (|| -> Result<(File, Stamp)> {
            let file = File::open(&path)?;
            let stamp = Stamp::of(&file.metadata()?);
            if known == Some(stamp) {
                return Ok((file, stamp));
            }
            let meta = read_meta(&file, &path)?;
            let (len, crc) = parse_meta(&meta, &self.identity(item))?;
            if stamp.size < len {
                bail!("truncated ({} of {len} bytes)", stamp.size);
            }
            if stamp.size > len {
                bail!("{} bytes, longer than its meta's {len}", stamp.size);
            }
            if crc_of(&file, len, checked)? != crc {
                bail!("corrupt (checksum mismatch)");
            }
            if let Some(e) = self.entries.lock().unwrap().get_mut(&item) {
                e.checked = Some(stamp);
            }
            Ok((file, stamp))
        })();
        match result {
            Ok(checked) => Some(checked),
            // Evicted meanwhile: a plain miss.
            Err(_) if !self.contains(item) => None,
            Err(e) if e.downcast_ref().is_some_and(out_of_resources) => None,
            Err(e) => {
                self.drop_corrupt(item, &e.to_string(), stats);
                None
            }
        }
    }

    /// A new temp file, open for reading too: once renamed into place it is the handle a
    /// batch file is served by.
    fn tmp_file(&self) -> Result<(File, PathBuf)> {
        let path = self.tmp_path();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok((file, path))
    }

    /// A new name in the temp directory, this process's (a later start removes what is left).
    fn tmp_path(&self) -> PathBuf {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        self.tmp.join(format!("{}{n}", self.tmp_prefix))
    }

    /// Writes `parts` to a new temp file, sets `meta` as its attribute where one is given and
    /// the filesystem takes it, and renames it to `dest`. The file, open, and whether the meta
    /// still needs its sidecar.
    fn place(&self, parts: &[&[u8]], meta: Option<&[u8]>, dest: &Path) -> Result<(File, bool)> {
        let (mut file, path) = self.tmp_file()?;
        let placed = (|| -> Result<bool> {
            write_parts(&mut file, parts)?;
            self.settle(&file, &path, meta, dest)
        })();
        match placed {
            Ok(sidecar) => Ok((file, sidecar)),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Sets `meta` as the attribute of `file`, written whole at temp path `tmp`, where one is
    /// given and the filesystem takes it, and renames it to `dest`: whether the meta still
    /// needs its sidecar.
    fn settle(&self, file: &File, tmp: &Path, meta: Option<&[u8]>, dest: &Path) -> Result<bool> {
        let sidecar = match meta {
            Some(m) => !self.meta_as_attr(file, m)?,
            None => false,
        };
        rename_into(tmp, dest)?;
        Ok(sidecar)
    }

    /// Sets `meta` as `file`'s attribute where the cache's filesystem takes attributes: whether
    /// it did (else the meta needs its sidecar). The first refusal switches the cache to
    /// sidecars.
    fn meta_as_attr(&self, file: &File, meta: &[u8]) -> Result<bool> {
        if !self.meta_attrs.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let set = set_meta_attr(file, meta)?;
        if !set {
            self.meta_attrs.store(false, Ordering::Relaxed);
            tracing::info!(
                "the cache's filesystem keeps no user extended attributes: \
                 batch files get their meta as sidecar files"
            );
        }
        Ok(set)
    }

    /// Puts `item` in the index, `bytes` of the capacity (counted in `used` already), checked
    /// as `checked`.
    fn index(&self, item: Item, bytes: u64, checked: Option<Stamp>) {
        let entry = Entry {
            bytes,
            pinned_until: None,
            checked,
        };
        match self.entries.lock().unwrap().insert(item, entry) {
            Some(old) => {
                self.used.fetch_sub(old.bytes, Ordering::Relaxed);
            }
            None => self.count_batch(item, 1),
        }
    }

    /// Crash-safe write of an item: temp file, then rename (with its meta set on it first, or,
    /// where the filesystem has no extended attributes, its sidecar renamed after it: the meta
    /// is what makes a batch file valid). The file, open. Not fsynced: a crash can leave a
    /// renamed file short or zeroed, which its checksum catches on first use after the restart
    /// (a miss, rebuilt, never wrong bytes). An fsync per file cost more CPU and disk time than
    /// building it.
    fn write(
        &self,
        item: Item,
        parts: &[&[u8]],
        meta: Option<&[u8]>,
        distance: &dyn Fn(Item) -> u64,
        stats: &Stats,
    ) -> Result<File, NotStored> {
        let bytes =
            parts.iter().map(|p| p.len() as u64).sum::<u64>() + meta.map_or(0, |m| m.len() as u64);
        // Reserve the space first, so that concurrent writers never overshoot the capacity
        // together; the reservation becomes the entry, or is given back.
        {
            let _one_at_a_time = self.reserving.lock().unwrap();
            self.make_room(bytes, distance, stats);
            if self.used() + bytes > self.capacity {
                return Err(NotStored::Full);
            }
            self.used.fetch_add(bytes, Ordering::Relaxed);
        }
        let dest = self.path(item);
        let result = (|| -> Result<File> {
            let (file, sidecar) = self.place(parts, meta, &dest)?;
            if let (true, Some(meta)) = (sidecar, meta) {
                self.place(&[meta], None, &meta_path(&dest))?;
            }
            Ok(file)
        })();
        match result {
            Ok(file) => {
                // After the rename, which changes the file's ctime.
                let checked = file.metadata().ok().map(|md| Stamp::of(&md));
                // Counted before the index shows it: a reader may open it from then on.
                if meta.is_some() {
                    Stats::add(&stats.c.batch_files_written, 1);
                }
                Stats::add(&stats.c.cache_written_bytes, bytes);
                self.index(item, bytes, checked);
                Stats::set(&stats.c.cache_bytes, self.used());
                Ok(file)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&dest);
                self.used.fetch_sub(bytes, Ordering::Relaxed);
                Stats::add(&stats.c.cache_write_failures, 1);
                let full = e.downcast_ref::<std::io::Error>().is_some_and(|e| {
                    e.kind() == ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC)
                });
                if !self.full_warned.swap(true, Ordering::Relaxed) {
                    let why = if full {
                        "the disk is full".to_string()
                    } else {
                        format!("{e:#}")
                    };
                    tracing::warn!(
                        "cache write failed ({why}): serving from memory until it can write again"
                    );
                }
                if full {
                    // Make room for the next writes: the filesystem is smaller than cache_size.
                    self.make_room(self.used() / 2 + bytes, distance, stats);
                }
                Err(NotStored::Write(e))
            }
        }
    }

    /// Evicts, furthest next use first, until `bytes` more fit under the capacity (and, in a
    /// cache of many items, some more).
    fn make_room(&self, bytes: u64, distance: &dyn Fn(Item) -> u64, stats: &Stats) {
        self.make_room_from(bytes, distance, 0, stats)
    }

    /// [`DiskCache::make_room`], evicting only items at least `nearest` ahead.
    fn make_room_from(
        &self,
        bytes: u64,
        distance: &dyn Fn(Item) -> u64,
        nearest: u64,
        stats: &Stats,
    ) {
        if self.used() + bytes <= self.capacity {
            return;
        }
        // Columns of objects the dataset no longer holds go first: nothing here needs them.
        let mut foreign = self.foreign.lock().unwrap();
        while self.used() + bytes > self.capacity
            && let Some((path, size)) = foreign.pop()
        {
            let _ = std::fs::remove_file(&path);
            self.used.fetch_sub(size, Ordering::Relaxed);
            Stats::add(&stats.c.cache_evictions, 1);
            Stats::add(&stats.c.cache_evicted_bytes, size);
        }
        drop(foreign);
        if self.used() + bytes <= self.capacity {
            return;
        }
        let now = Instant::now();
        let unpinned: Vec<(Item, u64)> = self
            .entries
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| e.pinned_until.is_none_or(|t| t < now))
            .map(|(item, e)| (*item, e.bytes))
            .collect();
        // Distances are computed without the lock: they may ask the cache what it holds.
        let mut candidates: Vec<(u64, Item, u64)> = unpinned
            .into_iter()
            .map(|(item, bytes)| (distance(item), item, bytes))
            .filter(|&(d, _, _)| d >= nearest)
            .collect();
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        // A cache of many items frees a sixty-fourth of itself beyond what this write needs, so
        // that the scan and sort above run once per that many bytes written, not on every write
        // (with hundreds of thousands of items, they take tens of milliseconds).
        let slack = match candidates.len() >= EVICTION_BATCH_FROM {
            true => self.capacity / 64,
            false => 0,
        };
        let target = self.capacity.saturating_sub(bytes + slack);
        for (_, item, size) in candidates {
            if self.used() <= target {
                break;
            }
            self.remove(item, stats);
            Stats::add(&stats.c.cache_evictions, 1);
            Stats::add(&stats.c.cache_evicted_bytes, size);
        }
    }
}

/// The name of a row group's columns file: the object version's identity (`object`, hashed
/// from its URL, key, size and version) and the row group's index in the object.
pub(crate) fn columns_name(object: &[u8; 32], rg: usize) -> String {
    let id: String = object[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{id}-{rg:06}.cols")
}

/// `dir` opened and locked with `flock(how)`; the lock lasts as long as the file.
fn lock_dir(dir: &Path, how: libc::c_int) -> Result<File> {
    let f = File::open(dir)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), how) } != 0 {
        bail!(
            "'{}' cannot be locked: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(f)
}

/// Removes the `cols-*` and `batches-*` directories under `root` other than `cols` and
/// `batches` that no mount holds (an exclusive lock is had at once): those of earlier
/// snapshots, or of other options, whose bytes the cache would otherwise never count again.
fn remove_unused_keys(root: &Path, cols: &Path, batches: &Path) {
    let Ok(dir) = std::fs::read_dir(root) else {
        return;
    };
    for e in dir.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let keyed = name.starts_with("cols-") || name.starts_with("batches-");
        if !keyed || path == cols || path == batches || !path.is_dir() {
            continue;
        }
        if lock_dir(&path, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            tracing::info!("removing '{name}' from the cache: no mount uses it");
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// How much of a cache file is read at a time to check it.
const CHECK_PIECE: usize = 4 << 20;

/// The crc32c of the first `len` bytes of `file`, read [`CHECK_PIECE`] at a time, `read` told
/// the bytes read so far.
fn crc_of(file: &File, len: u64, read: &dyn Fn(u64)) -> Result<u32> {
    let mut buf = vec![0; CHECK_PIECE.min(len as usize)];
    let (mut at, mut crc) = (0, 0);
    while at < len {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            bail!("truncated ({at} of {len} bytes)");
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
        read(at);
    }
    Ok(crc)
}

/// Items from which an eviction frees more than the write in hand needs.
const EVICTION_BATCH_FROM: usize = 1024;

/// Renames `from` to `to`, making `to`'s directory (private) where the rename finds it
/// missing: made only then, not checked before every write. (Made whether or not it exists by
/// then: another writer may be making it at the same moment, and an eviction that empties it
/// may remove it again before the rename, hence a few tries.)
fn rename_into(from: &Path, to: &Path) -> Result<()> {
    let mut tries = 0;
    loop {
        match (std::fs::rename(from, to), to.parent()) {
            (Err(e), Some(dir)) if e.kind() == ErrorKind::NotFound && tries < 3 => {
                tries += 1;
                private_dir(dir)?;
            }
            (r, _) => return Ok(r?),
        }
    }
}

/// Writes `parts` back to back with as few `writev` calls as the kernel allows: one for a batch
/// file's header and tensors, rather than a write each, so that its page cache is filled in one
/// pass (the filesystem sizes the pages it allocates by the write).
fn write_parts(file: &mut File, parts: &[&[u8]]) -> std::io::Result<()> {
    // A call takes at most IOV_MAX (1024) slices; a table of many columns has more parts.
    const MOST_SLICES: usize = 1024;
    let mut slices: Vec<IoSlice> = parts.iter().map(|p| IoSlice::new(p)).collect();
    let mut left = &mut slices[..];
    while !left.is_empty() {
        let ask = left.len().min(MOST_SLICES);
        match file.write_vectored(&left[..ask]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::item::FileKind;

    #[test]
    fn parts_beyond_one_writev_are_written_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut file = File::create(&path).unwrap();
        // More parts than one call takes (a table of thousands of columns), of uneven sizes.
        let parts: Vec<Vec<u8>> = (0..2500u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize])
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        write_parts(&mut file, &slices).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), parts.concat());
    }

    #[test]
    fn only_running_processes_own_temp_files() {
        assert!(pid_alive(std::process::id()));
        // A thread's id names a /proc entry too, but no process that writes temp files.
        let tid = std::thread::spawn(|| unsafe { libc::gettid() } as u32)
            .join()
            .unwrap();
        assert!(!pid_alive(tid));
        // A dead child nobody reaped yet (a zombie) writes nothing more.
        // SAFETY: the child only calls _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe { libc::_exit(0) };
        }
        // Waited for until it has exited, but left unreaped (WNOWAIT): a zombie.
        // SAFETY: siginfo is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let waited = unsafe {
            libc::waitid(
                libc::P_PID,
                child as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        assert_eq!(waited, 0, "{}", std::io::Error::last_os_error());
        assert!(!pid_alive(child as u32));
        unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
        assert!(!pid_alive(child as u32));
    }

    fn cache(dir: &Path, capacity: u64) -> DiskCache {
        DiskCache::open(
            dir,
            "c".into(),
            "b".into(),
            capacity,
            std::sync::Arc::new(crate::read::layout::Layout::new(
                ["x", "y.len"]
                    .map(|name| crate::source::view::Tensor {
                        name: name.into(),
                        dtype: crate::model::dtype::DType::I32,
                        inner: vec![],
                        feature: 0,
                        part: crate::source::view::Part::Data,
                        unit: None,
                    })
                    .to_vec(),
            )),
            (0..16384).map(|g| format!("rg-{g:06}.cols")).collect(),
            &Stats::default(),
        )
        .unwrap()
    }

    fn near(_: Item) -> u64 {
        0
    }

    #[test]
    fn the_columns_format_is_pinned() {
        // A change of the byte layout must come with a version bump: this pins it.
        let h = columns_header(3, &[b"abc", b"de"], &[7; 32]);
        assert_eq!(h.len(), 4096);
        assert_eq!(&h[..8], b"TFSCOL01");
        assert_eq!(&h[8..24], &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&h[56..60], &crc32c::crc32c(b"abcde").to_le_bytes());
        assert_eq!(
            &h[60..76],
            &[3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&h[76..80], &crc32c::crc32c(&h[..76]).to_le_bytes());
        // Past 504 tensors the header takes more than 4096 bytes: the data starts at the
        // next multiple of 4096.
        let wide: Vec<&[u8]> = vec![b"ab"; 1000];
        let h = columns_header(1, &wide, &[7; 32]);
        assert_eq!(h.len(), 8192);
        let mut file = h.clone();
        wide.iter().for_each(|t| file.extend_from_slice(t));
        let (rows, ranges) = parse_columns(&file, &[7; 32], 1000, true).unwrap();
        assert_eq!((rows, ranges[999].clone()), (1, 8192 + 1998..8192 + 2000));
        let m = meta_bytes(10, 0xdead_beef, &[1; 32]);
        assert_eq!(m.len(), 60);
        assert_eq!(&m[..12], b"TFSMETA1\x01\0\0\0");
        assert_eq!(parse_meta(&m, &[1; 32]).unwrap(), (10, 0xdead_beef));
        assert!(parse_meta(&m, &[2; 32]).is_err());
    }

    #[test]
    fn a_kept_one_open_file_is_sealed_as_the_mount_ends_found_by_a_later_one_and_checked() {
        use crate::model::plan::Batches;
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 20);
        let rank = Batches::Rank {
            epoch: 3,
            rank: 1,
            world: 4,
        };
        let items = [
            Item::All {
                dir: rank,
                kind: FileKind::Npy(1),
            },
            Item::All {
                dir: Batches::Epoch(12),
                kind: FileKind::Safetensors,
            },
        ];
        let data = [7u8; 10_000];
        for item in items {
            assert!(c.reserve_spare(10_000, &near, &stats));
            let (mut f, tmp) = c.scratch_file().unwrap();
            f.write_all(&data).unwrap();
            let stamp = c.keep(item, &f, &tmp, 10_000, &stats).unwrap();
            assert!(!tmp.exists() && c.contains(item));
            // Checked in this mount: no read.
            let read = AtomicU64::new(0);
            let kept = c.check_file(item, &|n| read.store(n, Ordering::Relaxed), &stats);
            assert_eq!(kept.unwrap().1, stamp);
            assert_eq!(read.load(Ordering::Relaxed), 0);
        }
        let used = c.used();
        assert!(used > 20_000 && used < 20_200, "{used}");
        // Kept without their meta until the mount ends.
        assert!(items.iter().all(|&i| meta_len(&c.path(i)).is_none()));
        assert_eq!(c.seal_kept(), 2);
        assert_eq!(c.used(), used, "counted with their metas from the start");
        drop(c);

        // A later mount indexes them by their names, and reads each whole once to check it.
        let c = cache(dir.path(), 1 << 20);
        assert_eq!(c.used(), used);
        let [a, b] = items;
        let read = AtomicU64::new(0);
        let (_, stamp) = c
            .check_file(a, &|n| read.store(n, Ordering::Relaxed), &stats)
            .unwrap();
        assert_eq!(read.load(Ordering::Relaxed), 10_000);
        // Taken out to be written over: a temp file, its bytes still counted until given back.
        let (tmp, bytes) = c.unkeep(a, stamp).unwrap();
        assert!(tmp.exists() && !c.contains(a) && c.used() == used);
        // Kept again, written over: without the meta it had (which would pass for its own).
        let f = std::fs::OpenOptions::new().write(true).open(&tmp).unwrap();
        c.keep(a, &f, &tmp, bytes, &stats).unwrap();
        assert!(meta_len(&c.path(a)).is_none());
        let stamp = c.entries.lock().unwrap()[&a].checked.unwrap();
        let (tmp, bytes) = c.unkeep(a, stamp).unwrap();
        c.unreserve(bytes, &stats);
        let _ = std::fs::remove_file(tmp);
        // One changed while nothing was mounted: dropped on its check.
        let path = c.path(b);
        let mut changed = std::fs::read(&path).unwrap();
        changed[5000] ^= 1;
        std::fs::write(&path, &changed).unwrap();
        assert!(c.check_file(b, &|_| {}, &stats).is_none());
        assert!(!path.exists() && !c.contains(b) && c.used() == 0);
        assert_eq!(stats.c.cache_corrupt_dropped.load(Ordering::Relaxed), 1);

        // A mount that ended without sealing (killed): its file is removed by the next, unread.
        assert!(c.reserve_spare(10_000, &near, &stats));
        let (mut f, tmp) = c.scratch_file().unwrap();
        f.write_all(&[1u8; 10_000]).unwrap();
        c.keep(a, &f, &tmp, 10_000, &stats).unwrap();
        assert!(c.path(a).exists());
        drop(c);
        let c = cache(dir.path(), 1 << 20);
        assert!(!c.contains(a) && !c.path(a).exists() && c.used() == 0);
        assert_eq!(stats.c.cache_corrupt_dropped.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn only_large_columns_files_are_mapped() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 22);
        let large = vec![7u8; MAP_AT_LEAST as usize];
        c.store_columns(1, 1, &[b"xxxxxxxx"], &near, &stats)
            .unwrap();
        c.store_columns(2, 1, &[&large], &near, &stats).unwrap();
        let small = c.load_columns(1, 1, 0, &stats).unwrap();
        assert!(matches!(small.buf, ColumnBuf::Read(_)));
        assert_eq!(&small.buf[small.ranges[0].clone()], b"xxxxxxxx");
        let mapped = c.load_columns(2, 1, 0, &stats).unwrap();
        assert!(matches!(mapped.buf, ColumnBuf::Mapped(_)));
        assert_eq!(&mapped.buf[mapped.ranges[0].clone()], &large[..]);
        assert!(matches!(
            c.load_columns(2, 1, u64::MAX, &stats).unwrap().buf,
            ColumnBuf::Read(_)
        ));
        assert!(mappings_allowed() >= 1000);
    }

    #[test]
    fn columns_round_trip_and_corruption_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 20);
        c.store_columns(4, 2, &[b"xxxxxxxx", b"yy"], &near, &stats)
            .unwrap();
        let cols = c.load_columns(4, 2, u64::MAX, &stats).unwrap();
        assert_eq!(
            &c.load_columns(4, 2, 0, &stats).unwrap().buf[4096..4104],
            b"xxxxxxxx"
        );
        assert_eq!(cols.ranges.len(), 2);
        assert_eq!(&cols.buf[cols.ranges[1].clone()], b"yy");
        // Flip a data byte: the next load drops it.
        let path = c.path(Item::Columns { rg: 4 });
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[4096] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(c.load_columns(4, 2, u64::MAX, &stats).is_none());
        assert!(!path.exists());
        assert_eq!(stats.c.cache_corrupt_dropped.load(Ordering::Relaxed), 1);
        assert_eq!(c.used(), 0);
    }

    #[test]
    fn columns_just_stored_have_their_header_checked_not_their_data() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 20);
        c.store_columns(4, 2, &[b"xxxxxxxx", b"yy"], &near, &stats)
            .unwrap();
        let path = c.path(Item::Columns { rg: 4 });
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[4096] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        // The data as it is now (a load later checks it: see above).
        let cols = c.stored_columns(4, 2, u64::MAX, &stats).unwrap();
        assert_eq!(&cols.buf[cols.ranges[0].clone()], b"yxxxxxxx");
        // Another layout, or a truncated file, is refused all the same.
        assert!(c.stored_columns(4, 3, u64::MAX, &stats).is_none());
        c.store_columns(5, 2, &[b"xxxxxxxx", b"yy"], &near, &stats)
            .unwrap();
        let path = c.path(Item::Columns { rg: 5 });
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        assert!(c.stored_columns(5, 2, u64::MAX, &stats).is_none());
    }

    #[test]
    fn batch_files_are_checked_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let item = Item::Batch {
            epoch: 1,
            batch: 2,
            kind: FileKind::Npy(1),
        };
        {
            let c = cache(dir.path(), 1 << 20);
            let (_, path) = c
                .store_batch_file(item, &[b"head", b"data"], &near, &stats)
                .unwrap();
            assert!(path.ends_with("batches-b/epoch-1/000002/y.len.npy"));
            assert_eq!(std::fs::read(&path).unwrap(), b"headdata");
        }
        let c = cache(dir.path(), 1 << 20);
        assert!(c.open_batch_file(item, &stats).is_some());
        std::fs::write(c.path(item), b"headdatX").unwrap();
        assert!(c.open_batch_file(item, &stats).is_none());
        assert!(c.open_batch_file(item, &stats).is_none());
    }

    /// A change in place, as a stray writer would make it.
    fn append_a_byte(path: &Path) {
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(b"X").unwrap();
    }

    #[test]
    fn a_file_kept_open_is_trusted_only_while_unchanged_and_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 20);
        let item = Item::Batch {
            epoch: 0,
            batch: 3,
            kind: FileKind::Safetensors,
        };
        let (file, path) = c.store_batch_file(item, &[b"abc"], &near, &stats).unwrap();
        assert!(c.unchanged(item, &file));
        append_a_byte(&path);
        assert!(!c.unchanged(item, &file), "a change in place went unseen");
        let (file, _) = c.store_batch_file(item, &[b"abc"], &near, &stats).unwrap();
        assert!(c.unchanged(item, &file));
        c.remove(item, &stats);
        assert!(!c.unchanged(item, &file), "an evicted file was trusted");
    }

    /// The open that the FUSE thread answers itself takes a file only once it was checked in
    /// this mount (written by it, or read whole against its crc32c), and only while unchanged.
    #[test]
    fn only_a_checked_file_opens_without_a_check() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let item = Item::Batch {
            epoch: 0,
            batch: 3,
            kind: FileKind::Safetensors,
        };
        let c = cache(dir.path(), 1 << 20);
        let (_, path) = c.store_batch_file(item, &[b"abc"], &near, &stats).unwrap();
        assert!(c.checked_already(item));
        assert!(c.open_if_checked(item).is_some());
        // A new mount indexes what is on disk without reading it.
        let c = cache(dir.path(), 1 << 20);
        assert!(c.contains(item));
        assert!(!c.checked_already(item));
        assert!(c.open_if_checked(item).is_none());
        assert!(c.open_batch_file(item, &stats).is_some());
        assert!(c.checked_already(item));
        assert!(c.open_if_checked(item).is_some());
        append_a_byte(&path);
        assert!(
            c.open_if_checked(item).is_none(),
            "a change in place went unseen"
        );
        assert!(
            c.open_batch_file(item, &stats).is_none(),
            "a corrupt file passed"
        );
        assert!(!c.contains(item));
        assert!(c.open_if_checked(item).is_none());
    }

    #[test]
    fn writers_racing_into_a_new_directory_all_store() {
        for round in 0..50 {
            let dir = tempfile::tempdir().unwrap();
            let c = cache(dir.path(), 1 << 20);
            let barrier = std::sync::Barrier::new(32);
            std::thread::scope(|s| {
                for batch in 0..32 {
                    let (c, barrier) = (&c, &barrier);
                    s.spawn(move || {
                        let stats = Stats::default();
                        // Every writer's rename is the first into the epoch's directory.
                        let item = Item::Batch {
                            epoch: 9,
                            batch,
                            kind: FileKind::Safetensors,
                        };
                        barrier.wait();
                        let stored = c.store_batch_file(item, &[b"abc"], &near, &stats);
                        assert!(stored.is_ok(), "round {round}, batch {batch}: {stored:?}");
                    });
                }
            });
        }
    }

    fn drop_meta_attr(path: &Path) {
        xattr::remove(path, format::META_ATTR).unwrap();
    }

    #[test]
    fn the_meta_is_an_attribute_else_a_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let (by_attr, by_sidecar) = (
            Item::Batch {
                epoch: 0,
                batch: 0,
                kind: FileKind::Safetensors,
            },
            Item::Batch {
                epoch: 0,
                batch: 1,
                kind: FileKind::Safetensors,
            },
        );
        {
            let c = cache(dir.path(), 1 << 20);
            let (_, path) = c
                .store_batch_file(by_attr, &[b"one"], &near, &stats)
                .unwrap();
            assert!(meta_len(&path).is_some());
            assert!(!meta_path(&path).exists(), "a sidecar beside an attribute");
            // A filesystem without user attributes (and a cache written before they were used).
            c.meta_attrs.store(false, Ordering::Relaxed);
            let (_, path) = c
                .store_batch_file(by_sidecar, &[b"two"], &near, &stats)
                .unwrap();
            assert!(meta_path(&path).exists());
            assert!(c.open_batch_file(by_sidecar, &stats).is_some());
        }
        // Both survive a reopen, each checked against its own meta.
        let c = cache(dir.path(), 1 << 20);
        for item in [by_attr, by_sidecar] {
            assert!(c.contains(item), "{item:?} not indexed");
            assert!(c.open_batch_file(item, &stats).is_some(), "{item:?}");
        }
        // A file without its meta is removed at start, whichever kind it had.
        let (attr_path, sidecar_path) = (c.path(by_attr), c.path(by_sidecar));
        drop(c);
        std::fs::remove_file(meta_path(&sidecar_path)).unwrap();
        drop_meta_attr(&attr_path);
        let c = cache(dir.path(), 1 << 20);
        for (item, path) in [(by_attr, attr_path), (by_sidecar, sidecar_path)] {
            assert!(
                !c.contains(item) && !path.exists(),
                "{item:?} kept without its meta"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_cache_bytes_are_refused_not_trusted(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..5000),
        ) {
            proptest::prop_assert!(parse_columns(&bytes, &[0; 32], 2, true).is_err());
            proptest::prop_assert!(parse_meta(&bytes, &[0; 32]).is_err());
        }

        #[test]
        fn any_changed_byte_of_a_columns_file_is_caught(
            // The header's fields and the data (the padding between them carries nothing).
            at in proptest::prop_oneof![0usize..80, 4096usize..4106],
            bit in 0u8..8,
        ) {
            let header = columns_header(2, &[b"abcdefgh", b"xy"], &[9; 32]);
            let mut file = [header.as_slice(), b"abcdefgh", b"xy"].concat();
            file[at] ^= 1 << bit;
            proptest::prop_assert!(parse_columns(&file, &[9; 32], 2, true).is_err());
        }

        #[test]
        fn any_changed_byte_of_a_meta_is_caught(at in 0usize..60, bit in 0u8..8) {
            let mut m = meta_bytes(123, 0xabcd, &[5; 32]);
            m[at] ^= 1 << bit;
            proptest::prop_assert!(parse_meta(&m, &[5; 32]).is_err());
        }
    }

    #[test]
    fn leftovers_are_cleaned_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 20);
        let item = Item::Batch {
            epoch: 0,
            batch: 0,
            kind: FileKind::Safetensors,
        };
        c.store_batch_file(item, &[b"abc"], &near, &stats).unwrap();
        // A file without its meta (a crash between the data's rename and its sidecar's); a crash
        // mid-write leaves a temp file of a dead process.
        drop_meta_attr(&c.path(item));
        std::fs::write(c.tmp.join("999999999-0"), b"partial").unwrap();
        let c = cache(dir.path(), 1 << 20);
        assert!(!c.path(item).exists());
        assert!(
            !c.path(item).parent().unwrap().exists(),
            "its empty epoch directory too"
        );
        assert!(!c.tmp.join("999999999-0").exists());
        assert_eq!(c.used(), 0);
    }

    #[test]
    fn a_removed_batch_file_leaves_no_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 1 << 20);
        let npy = |tensor| Item::Batch {
            epoch: 3,
            batch: 7,
            kind: FileKind::Npy(tensor),
        };
        let st = Item::Batch {
            epoch: 3,
            batch: 8,
            kind: FileKind::Safetensors,
        };
        for item in [npy(0), npy(1), st] {
            c.store_batch_file(item, &[b"abc"], &near, &stats).unwrap();
        }
        let batch_dir = c.path(npy(0)).parent().unwrap().to_path_buf();
        let epoch_dir = c.path(st).parent().unwrap().to_path_buf();
        c.remove(npy(0), &stats);
        assert!(batch_dir.is_dir(), "it still holds a file");
        c.remove(npy(1), &stats);
        assert!(!batch_dir.exists());
        assert!(epoch_dir.is_dir());
        c.remove(st, &stats);
        assert!(!epoch_dir.exists());
        assert!(c.batches.is_dir());
        // A later write makes its directories again.
        c.store_batch_file(npy(1), &[b"abc"], &near, &stats)
            .unwrap();
        assert!(c.open_batch_file(npy(1), &stats).is_some());
    }

    #[test]
    fn a_full_cache_of_many_items_is_not_scanned_on_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let data = vec![0u8; 10];
        let n = EVICTION_BATCH_FROM as u64 * 2;
        let item_bytes = {
            let probe = cache(&dir.path().join("probe"), u64::MAX);
            probe
                .store_columns(0, 1, &[&data], &|_| 0, &Stats::default())
                .unwrap();
            probe.used()
        };
        let c = cache(&dir.path().join("c"), n * item_bytes);
        let distance = |i: Item| match i {
            Item::Columns { rg } => rg as u64,
            _ => u64::MAX,
        };
        for rg in 0..n as usize {
            c.store_columns(rg, 1, &[&data], &distance, &stats).unwrap();
        }
        let evictions = || stats.c.cache_evictions.load(Ordering::Relaxed);
        assert_eq!(evictions(), 0, "it fits exactly");
        // One more: the furthest items go, a sixty-fourth of the cache beyond the one needed.
        c.store_columns(n as usize, 1, &[&data], &distance, &stats)
            .unwrap();
        let freed = evictions();
        assert_eq!(freed, 1 + n / 64);
        assert!(!c.contains(Item::Columns { rg: n as usize - 1 }));
        assert!(c.contains(Item::Columns { rg: 0 }));
        // The next writes fit in the room that left: no eviction, so no scan.
        for rg in 0..n / 64 {
            c.store_columns(rg as usize + 10_000, 1, &[&data], &distance, &stats)
                .unwrap();
        }
        assert_eq!(evictions(), freed);
        assert!(c.used() <= n * item_bytes);
    }

    #[test]
    fn eviction_keeps_what_is_needed_soonest() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 4096 * 3 + 200);
        let data = vec![0u8; 10];
        // Distance: row group r is needed r steps ahead.
        let distance = |i: Item| match i {
            Item::Columns { rg } => rg as u64,
            _ => u64::MAX,
        };
        for rg in [5, 1, 9] {
            c.store_columns(rg, 1, &[&data], &distance, &stats).unwrap();
        }
        c.store_columns(3, 1, &[&data], &distance, &stats).unwrap();
        assert!(c.used() <= 4096 * 3 + 200);
        assert!(
            !c.contains(Item::Columns { rg: 9 }),
            "the furthest one goes first"
        );
        assert!(c.contains(Item::Columns { rg: 1 }) && c.contains(Item::Columns { rg: 3 }));
        // Pinned items stay, however far ahead they are needed.
        c.store_columns(5, 1, &[&data], &distance, &stats).unwrap();
        c.pin(Item::Columns { rg: 5 }, Duration::from_secs(60));
        c.store_columns(0, 1, &[&data], &distance, &stats).unwrap();
        c.store_columns(2, 1, &[&data], &distance, &stats).unwrap();
        assert!(c.used() <= 4096 * 3 + 200);
        assert!(c.contains(Item::Columns { rg: 5 }));
    }

    #[test]
    fn spare_room_is_made_only_of_what_is_never_needed_again() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::default();
        let c = cache(dir.path(), 4096 * 3 + 200);
        let data = vec![0u8; 10];
        // Row groups 0 and 1 are needed again; 7 never is.
        let distance = |i: Item| match i {
            Item::Columns { rg: 7 } => u64::MAX,
            Item::Columns { rg } => rg as u64,
            _ => u64::MAX,
        };
        for rg in [0, 1, 7] {
            c.store_columns(rg, 1, &[&data], &distance, &stats).unwrap();
        }
        let one = c.used() / 3;
        assert!(c.has_spare_room(one, &distance, &stats));
        assert!(
            !c.contains(Item::Columns { rg: 7 }),
            "what is never needed goes"
        );
        assert!(!c.has_spare_room(2 * one, &distance, &stats));
        assert!(c.contains(Item::Columns { rg: 0 }) && c.contains(Item::Columns { rg: 1 }));
    }
}
