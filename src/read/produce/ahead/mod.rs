//! One-open files (`all.safetensors`, `all/NAME.npy`) of the epoch a reader comes to next,
//! built whole on the local cache while it reads the one before, so that their open is
//! answered by passthrough and every read of them is a read of a local file.
//!
//! Without this, a one-open file of a freshly shuffled epoch is gathered and copied by the
//! daemon on every read: measured here, 0.08× of the same bytes read from a local file, where a
//! file built ahead reads at 0.95×. The gathering is the same work either way; built ahead it is
//! done while the reader (and its GPU) is busy with the epoch before.
//!
//! A reader of directory D's one-open file (from its first read from epoch 1 on; past its
//! middle in epoch 0, which is decoded as it is read), or one that opens it built ahead or asks
//! for its path, has D's next epoch built, the same rank's for a rank view, while the listed
//! epochs last (with `shuffle=none`, whose epochs share their files, that is the one it
//! reads). The `.npy` files of every tensor the chain's readers read are built together, in
//! one pass over the batches, so that each row is located once for all of them (locating a
//! shuffled row costs more than copying it). The build runs on threads of its own in
//! `SCHED_IDLE`, up to four, each writing runs of 16 batches. An open that comes while the
//! build is under way waits for it if a sixteenth is written and the rest is due within
//! [`LONGEST_WAIT`], and else stops it and is served by the daemon. Each file takes its bytes
//! of `cache_size` (evicting only cache items that are never needed again); where they are not
//! to be had, nothing is built. A file is built in the cache's temp directory (a restart
//! removes what a crash left there), then indexed as a cache item ([`Item::All`]; its crc32c
//! added as the mount ends, [`DiskCache::seal_kept`]), kept while its epoch and the next are read and let go after. A later mount of the same cache
//! (a job restarted, the same epoch read again) finds the files its last one kept: the first
//! open of one checks it against its checksum, waiting up to [`LONGEST_WAIT`] (else the daemon
//! serves that open, and the check goes on for the next), and then answers it by passthrough
//! like a file built in this mount. A file gone by that nobody has open, and whose path was
//! never handed out, is written over by the next build rather than removed: its pages are in
//! the page cache and its blocks allocated, where a new file's are not (measured at
//! [`nobodys`]). It is used only while unchanged since written or checked (inode, size, mtime,
//! ctime), the rule of batch files.

use crate::cache::{DiskCache, Stamp};
use crate::model::item::{FileKind, Item};
use crate::model::plan::{Batches, Chain, Plan};
use crate::read::layout::Layout;
use crate::read::produce::builder::Builder;
use crate::read::produce::materialize::Materializer;
use crate::stats::Stats;
use anyhow::Result;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::watch;

mod write;

use write::{Job, MOST_BUILD_THREADS};

/// A one-open file of a directory: the directory with its epoch as the plan repeats it (with
/// `shuffle=none` every epoch's file is epoch 0's), and which file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    dir: Batches,
    kind: FileKind,
}

impl Key {
    /// The cache item it is kept as.
    fn item(&self) -> Item {
        Item::All {
            dir: self.dir,
            kind: self.kind,
        }
    }
}

/// Where a file built ahead holds its bytes of the cache: while it is built, bytes reserved and
/// its temp file, both given back when dropped (a build that fails or is stopped); once built,
/// the cache item it is kept as (`kept`), which stays at exit for a later mount and goes only
/// where [`Reserved::let_go`] says so (an epoch gone by, a file changed). A reader with the
/// file open reads on either way.
struct Reserved {
    bytes: u64,
    path: Option<PathBuf>,
    /// The item and the stamp it is indexed with.
    kept: Option<(Item, Stamp)>,
    cache: Arc<DiskCache>,
    stats: Arc<Stats>,
}

impl Reserved {
    /// Removes a kept file from the cache (where the index still holds it as it was kept).
    fn let_go(mut self) {
        if let Some((item, stamp)) = self.kept.take() {
            self.cache.let_go(item, stamp, &self.stats);
            (self.path, self.bytes) = (None, 0);
        }
    }

    /// A kept file taken out of the index to be written over, a temp file again; `None` where
    /// the cache let it go meanwhile (evicted).
    fn unkeep(mut self) -> Option<Reserved> {
        let Some((item, stamp)) = self.kept.take() else {
            return Some(self);
        };
        match self.cache.unkeep(item, stamp) {
            Some((tmp, bytes)) => {
                (self.path, self.bytes) = (Some(tmp), bytes);
                Some(self)
            }
            None => {
                (self.path, self.bytes) = (None, 0);
                None
            }
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.kept.is_some() {
            return;
        }
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
        self.cache.unreserve(self.bytes, &self.stats);
    }
}

/// A file built whole (its path is its reservation's).
struct Built {
    file: Arc<File>,
    stamp: Stamp,
    reserved: Reserved,
    /// Its path was handed out (`gds/`, `user.tensorfs.path`): a reader may open it behind
    /// our back, so it is never written over.
    path_given: AtomicBool,
}

impl Built {
    fn path(&self) -> &std::path::Path {
        self.reserved
            .path
            .as_deref()
            .expect("a built file has its path")
    }
}

/// A built file gone by, nobody's any more: the next build of its chain writes over it.
struct Spare {
    file: File,
    reserved: Reserved,
}

/// The longest an open waits for the build of its file: past a few seconds a reader's own
/// timeouts and the kernel's hung-task watchdog (an open waiting on FUSE is in D state) come
/// into play, and the daemon serves the file at about the rate the build writes it.
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// A build under way, or the check of a file kept by an earlier mount: how far it is, and the
/// means to stop it or to wait for its end.
pub(crate) struct Progress {
    /// A check, not a build: an open always waits for it (up to [`LONGEST_WAIT`]), since it
    /// reads a local file at the disk's rate, and nothing stops it.
    check: bool,
    stop: AtomicBool,
    /// Batches gathered, most of them written (bytes checked), of `total`: the build's rate.
    written: AtomicU64,
    total: u64,
    started: Instant,
    /// Turns true (or its sender is dropped) when the build has ended, however it ended.
    ended: watch::Receiver<bool>,
}

impl Progress {
    /// Whether an open now is better served by waiting for the build than by the daemon.
    fn worth_waiting(&self) -> bool {
        if self.check {
            return true;
        }
        let written = self.written.load(Ordering::Relaxed);
        worth_waiting(written, self.total, self.started.elapsed())
    }

    /// Waits for the end of the build or check, up to `limit`: whether it ended.
    async fn end_within(&self, limit: Duration) -> bool {
        let mut ended = self.ended.clone();
        // An error: the end dropped the sender; either way it has ended.
        tokio::time::timeout(limit, ended.wait_for(|&done| done))
            .await
            .is_ok()
    }

    /// Stops the build (its reader came first), counted once.
    fn stop(&self, stats: &Stats) {
        if !self.check && !self.stop.swap(true, Ordering::Relaxed) {
            Stats::add(&stats.c.ahead_late, 1);
        }
    }
}

/// Whether to wait for a build that has written `written` of `total` batches in `elapsed`: once a
/// sixteenth is written (enough to know its rate), where the rest, at the rate so far, is due
/// within half of [`LONGEST_WAIT`]. Served by the daemon instead, the file is gathered again
/// read by read: here ~10 core-seconds a GB at 0.4–0.7 GB/s, where a build writes 1–1.4 GB/s at
/// about 1 core-second a GB and the built file then reads at 4–8 GB/s.
fn worth_waiting(written: u64, total: u64, elapsed: Duration) -> bool {
    if written * 16 < total || written == 0 {
        return false;
    }
    let rest = elapsed.mul_f64((total - written) as f64 / written as f64);
    rest <= LONGEST_WAIT / 2
}

enum State {
    Building(Arc<Progress>),
    Ready(Built),
    /// Not built: no room in the cache, or the build failed (said in the log).
    Skipped,
}

pub(crate) struct Ahead {
    materializer: Arc<Materializer>,
    builder: Arc<Builder>,
    cache: Arc<DiskCache>,
    stats: Arc<Stats>,
    layout: Arc<Layout>,
    runtime: Handle,
    /// Epochs the mount lists: nothing is built past them.
    epochs: u64,
    /// Off with `prefetch=0`, which builds nothing a read does not span.
    enabled: bool,
    files: Arc<Mutex<HashMap<Key, State>>>,
    /// The tensors whose `all/NAME.npy` readers have read, per chain of directories (an
    /// epoch's, or one rank's): the next epoch's files of them are built together, each row
    /// located once for all of them.
    npy_read: Mutex<HashMap<Chain, BTreeSet<usize>>>,
    /// Helper threads free for builds (see [`Job::write`]): [`MOST_BUILD_THREADS`] (or the
    /// workers, if fewer) less one, together, however many chains build at once.
    helpers: Arc<AtomicUsize>,
}

impl Ahead {
    pub(crate) fn new(
        materializer: Arc<Materializer>,
        builder: Arc<Builder>,
        cache: Arc<DiskCache>,
        layout: Arc<Layout>,
        runtime: Handle,
        epochs: u64,
        enabled: bool,
    ) -> Ahead {
        let helpers = Arc::new(AtomicUsize::new(
            builder.threads().min(MOST_BUILD_THREADS) - 1,
        ));
        Ahead {
            materializer,
            stats: builder.stats().clone(),
            builder,
            cache,
            layout,
            runtime,
            epochs,
            enabled,
            files: Arc::default(),
            npy_read: Mutex::default(),
            helpers,
        }
    }

    fn plan(&self) -> &Plan {
        self.builder.plan()
    }

    fn key(&self, dir: Batches, kind: FileKind) -> Key {
        let dir = self.plan().shared_dir(dir);
        Key { dir, kind }
    }

    /// How an open of file `kind` of `dir` is served: from the file built ahead; after waiting
    /// for a build near its end ([`worth_waiting`]); else by the daemon, stopping the build (the
    /// reader is faster than it, and a build beside the daemon's reads would gather every batch
    /// twice).
    pub(crate) fn for_open(&self, dir: Batches, kind: FileKind) -> Opening {
        self.opening(dir, kind, true)
    }

    /// As [`Ahead::for_open`], for a read that came without an open (`opens=kernel`), which
    /// never waits for a build under way: each read of the file asks, not one open, and the
    /// rows it needs are served by the daemon meanwhile (a read waiting for the whole file's
    /// build stalled its reader for hundreds of milliseconds). A build far from its end is
    /// stopped, as for an open.
    pub(crate) fn for_read(&self, dir: Batches, kind: FileKind) -> Opening {
        self.opening(dir, kind, false)
    }

    fn opening(&self, dir: Batches, kind: FileKind, wait_for_build: bool) -> Opening {
        let key = self.key(dir, kind);
        let stats = &self.stats;
        let files = self.files.lock().unwrap();
        match files.get(&key) {
            Some(State::Building(p)) if p.worth_waiting() && !wait_for_build && !p.check => {
                Opening::Daemon
            }
            Some(State::Building(p)) if p.worth_waiting() => {
                Stats::add(&stats.c.ahead_waits, 1);
                Opening::Soon(p.clone())
            }
            Some(State::Building(p)) => {
                p.stop(stats);
                Opening::Daemon
            }
            Some(_) => {
                drop(files);
                match self.built(key, false) {
                    Some((file, _)) => {
                        Stats::add(&stats.c.ahead_opens, 1);
                        Opening::Ready(file)
                    }
                    None => Opening::Daemon,
                }
            }
            // Kept by an earlier mount: checked first.
            None if self.kept(&key) => {
                drop(files);
                match self.start(Work::Check(key)) {
                    Some(p) => {
                        Stats::add(&stats.c.ahead_waits, 1);
                        Opening::Soon(p)
                    }
                    None => self.opening(dir, kind, wait_for_build),
                }
            }
            None => Opening::Daemon,
        }
    }

    /// Whether an earlier mount kept `key`'s file, for this one to check and use.
    fn kept(&self, key: &Key) -> bool {
        self.enabled && self.cache.contains(key.item())
    }

    /// After [`Opening::Soon`]: the file once its build has ended, if it was built. A build
    /// that has not ended within [`LONGEST_WAIT`] is stopped, and the daemon serves the file.
    pub(crate) async fn when_built(
        &self,
        dir: Batches,
        kind: FileKind,
        progress: Arc<Progress>,
    ) -> Option<Arc<File>> {
        if !progress.end_within(LONGEST_WAIT).await {
            progress.stop(&self.stats);
            return None;
        }
        let (file, _) = self.built(self.key(dir, kind), false)?;
        Stats::add(&self.stats.c.ahead_opens, 1);
        Some(file)
    }

    /// The path of file `kind` of `dir` (for `gds/` and `user.tensorfs.path`) where it is built
    /// ahead now, or kept by an earlier mount: checked first, waited for as an open waits.
    /// Nothing is built, and no build is waited for or stopped.
    pub(crate) async fn built_path(&self, dir: Batches, kind: FileKind) -> Option<PathBuf> {
        let key = self.key(dir, kind);
        // Some(a check under way, if one is); None: nothing known of the file in this mount.
        let known = (self.files.lock().unwrap().get(&key)).map(|state| match state {
            State::Building(p) => Some(p.clone()).filter(|p| p.check),
            _ => None,
        });
        let checking = match known {
            Some(checking) => checking,
            None if self.kept(&key) => self.start(Work::Check(key)),
            None => None,
        };
        if let Some(p) = checking {
            p.end_within(LONGEST_WAIT).await;
        }
        self.built(key, true).map(|(_, path)| path)
    }

    /// As the mount ends: the files kept in it given their checksums, for a later mount to
    /// check them by ([`DiskCache::seal_kept`]). How many.
    pub(crate) fn seal_kept(&self) -> usize {
        self.cache.seal_kept()
    }

    /// For `tensorfs warm`: file `kind` of `dir` built, whatever epoch it is of and whatever
    /// `prefetch` says, since it is asked for; checked instead where an earlier mount kept it.
    /// Starts that where nothing of the file is known yet in this mount, and says how far it
    /// is. A file whose build was skipped in this mount (no room, failed, or stopped by a
    /// reader that came first) stays skipped.
    pub(crate) fn warm(&self, dir: Batches, kind: FileKind) -> Warming {
        let key = self.key(dir, kind);
        if !self.files.lock().unwrap().contains_key(&key) {
            self.start(match self.cache.contains(key.item()) {
                true => Work::Check(key),
                false => Work::Build(vec![(key, None)]),
            });
        }
        let files = self.files.lock().unwrap();
        match files.get(&key) {
            Some(State::Building(p)) => {
                let written = p.written.load(Ordering::Relaxed) as f64;
                Warming::Under((written / p.total.max(1) as f64).min(1.0))
            }
            Some(State::Ready(_)) => {
                drop(files);
                match self.built(key, false) {
                    Some(_) => Warming::Ready,
                    None => Warming::Skipped,
                }
            }
            Some(State::Skipped) | None => Warming::Skipped,
        }
    }

    /// Whether file `kind` of `dir` has a path to give ([`Ahead::built_path`]): built ahead, or
    /// kept by an earlier mount and not yet found changed.
    pub(crate) fn has_path(&self, dir: Batches, kind: FileKind) -> bool {
        let key = self.key(dir, kind);
        match self.files.lock().unwrap().get(&key) {
            Some(State::Ready(_)) => true,
            Some(State::Building(p)) => p.check,
            Some(State::Skipped) => false,
            None => self.kept(&key),
        }
    }

    /// The file built ahead as `key`, if it is and is unchanged since it was written; marked as
    /// one whose path is handed out where `give_path` (under the lock that retires files gone
    /// by, so none is written over once its path is out).
    fn built(&self, key: Key, give_path: bool) -> Option<(Arc<File>, PathBuf)> {
        let mut files = self.files.lock().unwrap();
        let State::Ready(built) = files.get(&key)? else {
            return None;
        };
        let now = built.file.metadata().ok().map(|md| Stamp::of(&md));
        if now != Some(built.stamp) {
            if self.cache.contains(key.item()) {
                tracing::warn!(
                    "{} changed since it was built: removed, its reads are served by the daemon",
                    built.path().display()
                );
            }
            if let Some(State::Ready(built)) = files.insert(key, State::Skipped) {
                built.reserved.let_go();
            }
            return None;
        }
        if give_path {
            built.path_given.store(true, Ordering::Relaxed);
        }
        Some((built.file.clone(), built.path().to_path_buf()))
    }

    /// A reader is at file `kind` of `dir` (past its middle, or opened built ahead): build the
    /// same file of the directory's next epoch (check it, where an earlier mount kept it), with
    /// the `.npy` files of the other tensors read in this chain, or read together with it now,
    /// that are not built yet, and drop those of epochs before `dir`'s.
    pub(crate) fn reader_at(&self, dir: Batches, kind: FileKind) {
        if !self.enabled {
            return;
        }
        let next = dir.next_epoch();
        let plan = self.builder.plan();
        if next.global(0).0 >= self.epochs || plan.count(next) == 0 {
            return;
        }
        let kinds: Vec<FileKind> = match kind {
            FileKind::Safetensors => vec![kind],
            FileKind::Npy(t) => {
                let mut read = self.npy_read.lock().unwrap();
                let tensors = read.entry(dir.chain()).or_default();
                tensors.insert(t);
                // With the rows of the tensors read together stored in the page cache, only the
                // tensor the prefetcher leaves tripwires in is read from the daemon past the
                // middle: the others come from the reads the daemon saw before the stores did.
                tensors.extend(self.builder.read_with(t));
                tensors.iter().map(|&t| FileKind::Npy(t)).collect()
            }
        };
        let (mut builds, mut checks) = (Vec::new(), Vec::new());
        {
            let mut files = self.files.lock().unwrap();
            // Every read of a one-open file comes here: most find its next file known already.
            if files.contains_key(&self.key(next, kind)) {
                return;
            }
            for kind in kinds {
                let (here, key) = (self.key(dir, kind), self.key(next, kind));
                if files.contains_key(&key) {
                    continue;
                }
                let kept = self.kept(&key);
                let gone_by: Vec<Key> = files
                    .keys()
                    .filter(|k| **k != here && **k != key && same_chain(k, &key) && older(k, &key))
                    .copied()
                    .collect();
                let mut spare = None;
                for k in gone_by {
                    if let Some(State::Ready(built)) = files.remove(&k) {
                        // One is written over by a build; the others are let go.
                        match spare.is_none() && !kept {
                            true => spare = nobodys(built),
                            false => built.reserved.let_go(),
                        }
                    }
                }
                match kept {
                    true => checks.push(key),
                    false => builds.push((key, spare)),
                }
            }
        }
        for key in checks {
            self.start(Work::Check(key));
        }
        if !builds.is_empty() {
            self.start(Work::Build(builds));
        }
    }

    /// Starts `work` unless it is under way or done (for each of a build's files): its
    /// progress. The files of one build are of one directory.
    fn start(&self, work: Work) -> Option<Arc<Progress>> {
        let plan = self.builder.plan();
        let (check, total) = match &work {
            Work::Check(key) => (true, self.layout.size(key.kind, plan.dir_rows(key.dir))),
            Work::Build(files) => (false, plan.count(files.first()?.0.dir)),
        };
        let (ended_tx, ended) = watch::channel(false);
        let progress = Arc::new(Progress {
            check,
            stop: AtomicBool::new(false),
            written: AtomicU64::new(0),
            total,
            started: Instant::now(),
            ended,
        });
        let work = {
            let mut files = self.files.lock().unwrap();
            let work = match work {
                Work::Check(key) if files.contains_key(&key) => return None,
                Work::Check(key) => Work::Check(key),
                // A file that came to be known since it was asked for is left out (its spare
                // dropped: removed, its bytes given back).
                Work::Build(build) => Work::Build(
                    (build.into_iter())
                        .filter(|(key, _)| !files.contains_key(key))
                        .collect(),
                ),
            };
            let keys = work.keys();
            if keys.is_empty() {
                return None;
            }
            for key in keys {
                files.insert(key, State::Building(progress.clone()));
            }
            work
        };
        let keys = work.keys();
        let job = Job {
            helpers: self.helpers.clone(),
            materializer: self.materializer.clone(),
            builder: self.builder.clone(),
            cache: self.cache.clone(),
            stats: self.stats.clone(),
            layout: self.layout.clone(),
            runtime: self.runtime.clone(),
            progress: progress.clone(),
        };
        let files = self.files.clone();
        let pending = self.stats.pending();
        let spawned = std::thread::Builder::new()
            .name("tensorfs-ahead".into())
            .spawn(move || {
                let _pending = pending;
                let built: Vec<(Key, Result<Option<Built>>)> = match work {
                    // A thread of its own in SCHED_IDLE: the build takes only CPU time nothing
                    // else wants (its gathers run on the workers, which are idle-class too while
                    // no reader waits).
                    Work::Build(build) => {
                        crate::read::produce::pool::idle_class();
                        job.build(build)
                    }
                    // An open waits for it: at the normal class.
                    Work::Check(key) => vec![(key, Ok(job.check(key)))],
                };
                let mut files = files.lock().unwrap();
                for (key, built) in built {
                    let state = match built {
                        Ok(Some(built)) => State::Ready(built),
                        Ok(None) => State::Skipped,
                        Err(e) => {
                            tracing::warn!(
                                "building {:?} of {} ahead: {} (its reads are served by the daemon)",
                                key.kind,
                                crate::read::layout::dir_name(key.dir),
                                crate::describe(&e)
                            );
                            State::Skipped
                        }
                    };
                    match files.get_mut(&key) {
                        Some(slot) => *slot = state,
                        // Dropped meanwhile as an epoch gone by.
                        None => {
                            if let State::Ready(built) = state {
                                built.reserved.let_go();
                            }
                        }
                    }
                }
                drop(files);
                let _ = ended_tx.send(true);
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to build ahead: {e}");
            let mut files = self.files.lock().unwrap();
            for key in keys {
                files.insert(key, State::Skipped);
            }
        }
        Some(progress)
    }
}

/// What a thread of [`Ahead::start`] does.
enum Work {
    /// The file an earlier mount kept.
    Check(Key),
    /// Files of one directory, each with a file gone by to write over if there is one.
    Build(Vec<(Key, Option<Spare>)>),
}

impl Work {
    fn keys(&self) -> Vec<Key> {
        match self {
            Work::Check(key) => vec![*key],
            Work::Build(files) => files.iter().map(|(key, _)| *key).collect(),
        }
    }
}

/// A built file of an epoch gone by, just taken out of `files` (under its lock, so no open can
/// be handed it any more), to be written over by the next build of its chain: where nobody
/// holds it (every open of it holds a clone of `file` until its release, and a memory map keeps
/// the open) and its path was never handed out. Else `None`: removed as it drops, and a reader
/// with it open reads on.
///
/// Written over, a file's pages are in the page cache and its blocks allocated. A new one
/// took pages never touched since boot or freed by the file removed before it, and blocks
/// freed (and discarded) by that removal: 1M rows, batch_size 1024, each next epoch's
/// `all.safetensors` (272 MB) was built at 1.16–1.21 GB/s in new files and 1.40–1.46 GB/s
/// written over (two and three runs), where gathering its rows alone takes 0.14 s.
fn nobodys(built: Built) -> Option<Spare> {
    let Built {
        file,
        reserved,
        path_given,
        ..
    } = built;
    if path_given.into_inner() {
        reserved.let_go();
        return None;
    }
    match Arc::try_unwrap(file) {
        Ok(file) => Some(Spare {
            file,
            reserved: reserved.unkeep()?,
        }),
        Err(_) => {
            tracing::debug!("{:?} is open: removed, not written over", reserved.path);
            reserved.let_go();
            None
        }
    }
}

/// How far a file asked for by `tensorfs warm` is ([`Ahead::warm`]).
#[derive(Debug, PartialEq)]
pub(crate) enum Warming {
    /// Built or checked this far (0 to 1).
    Under(f64),
    Ready,
    /// Not built: no room in the cache, the build failed (said in the log), or a reader
    /// stopped it.
    Skipped,
}

/// How an open of a one-open file is served ([`Ahead::for_open`]).
pub(crate) enum Opening {
    Ready(Arc<File>),
    /// Once the build has ended ([`Ahead::when_built`]).
    Soon(Arc<Progress>),
    Daemon,
}

/// Whether two keys are the same directory's file in different epochs.
fn same_chain(a: &Key, b: &Key) -> bool {
    a.kind == b.kind && a.dir.chain() == b.dir.chain()
}

/// Whether `a`'s epoch is before `b`'s.
fn older(a: &Key, b: &Key) -> bool {
    a.dir.global(0).0 < b.dir.global(0).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_gone_by_are_dropped_per_directory_and_file() {
        let key = |dir, kind| Key { dir, kind };
        let rank = |epoch| Batches::Rank {
            epoch,
            rank: 1,
            world: 2,
        };
        let st = FileKind::Safetensors;
        let next = key(Batches::Epoch(3), st);
        assert!(same_chain(&key(Batches::Epoch(1), st), &next));
        assert!(older(&key(Batches::Epoch(1), st), &next));
        assert!(!same_chain(&key(rank(1), st), &next));
        assert!(!same_chain(
            &key(Batches::Epoch(1), FileKind::Npy(0)),
            &next
        ));
        assert!(same_chain(&key(rank(1), st), &key(rank(4), st)));
        assert!(!older(&key(Batches::Epoch(4), st), &next));
    }

    #[test]
    fn an_open_waits_only_for_a_build_near_its_end() {
        let s = Duration::from_secs;
        // Less than a sixteenth written: never, however fast.
        assert!(!worth_waiting(0, 100, s(0)));
        assert!(!worth_waiting(6, 100, Duration::from_millis(1)));
        // A sixteenth in 100 ms: the rest is due in 1.5 s.
        assert!(worth_waiting(7, 112, Duration::from_millis(100)));
        // A quarter in 0.5 s: the rest is due in 1.5 s.
        assert!(worth_waiting(25, 100, Duration::from_millis(500)));
        // A quarter of a large file in 10 s: the rest would take 30 s.
        assert!(!worth_waiting(25, 100, s(10)));
        // Nearly done after a long build: the last batch is due at once.
        assert!(worth_waiting(99, 100, s(60)));
        assert!(worth_waiting(100, 100, s(600)));
    }
}
