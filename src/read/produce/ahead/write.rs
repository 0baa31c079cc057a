//! The writing of files built ahead: a build's thread and its helpers gather the tensors'
//! rows of runs of batches and write them into the files, or check a file an earlier mount kept.

use super::{Built, Key, Progress, Reserved, Spare};
use crate::cache::DiskCache;
use crate::read::layout::Layout;
use crate::read::produce::builder::Builder;
use crate::read::produce::materialize::Materializer;
use crate::stats::Stats;
use anyhow::{Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;

/// The most threads one build gathers and writes on: every write to a file takes its inode's
/// lock (ext4's), which two threads here already met (3% of a build's CPU spent spinning on
/// it); more threads than this would mostly wait there. (Measured only up to two cores.)
pub(super) const MOST_BUILD_THREADS: usize = 4;

/// Batches a build thread takes at a time: consecutive batches, whose rows of a tensor are one
/// range of each file, written a few times a run.
const RUN: u64 = 16;

/// Bytes of a tensor's rows a build thread gathers before it writes them (fewer at a run's end;
/// a batch's, where one batch holds more): a few writes a run rather than one per batch and
/// tensor, each taking the file's inode lock; small enough that a tensor's buffer stays in the
/// CPU's caches for the copy into the file (measured: written once 1 MiB of all tensors' rows
/// were held, it saved nothing).
const WRITE_BYTES: usize = 256 << 10;

/// Threads taken from the share of helper threads all builds ahead draw from, given back as
/// it drops.
struct Helpers<'a> {
    free: &'a AtomicUsize,
    count: usize,
}

impl Helpers<'_> {
    /// Up to `wanted` helpers, as many as are free.
    fn take(free: &AtomicUsize, wanted: usize) -> Helpers<'_> {
        let mut count = 0;
        let _ = free.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            count = n.min(wanted);
            Some(n - count)
        });
        Helpers { free, count }
    }
}

impl Drop for Helpers<'_> {
    fn drop(&mut self) {
        self.free.fetch_add(self.count, Ordering::Relaxed);
    }
}

/// Building files of one directory (or checking one), on a blocking thread.
pub(super) struct Job {
    /// Helper threads free for builds ahead (beyond each build's own thread).
    pub(super) helpers: Arc<AtomicUsize>,
    pub(super) materializer: Arc<Materializer>,
    pub(super) builder: Arc<Builder>,
    pub(super) cache: Arc<DiskCache>,
    pub(super) stats: Arc<Stats>,
    pub(super) layout: Arc<Layout>,
    pub(super) runtime: Handle,
    pub(super) progress: Arc<Progress>,
}

/// A file being built: where its bytes go and what they are.
struct Building {
    key: Key,
    file: File,
    reserved: Reserved,
    header: Arc<[u8]>,
    /// Each of its tensors, with where its rows start in the file.
    tensors: Vec<(usize, u64)>,
    /// Its length: its header and its tensors' rows.
    len: u64,
    /// Written over a file gone by.
    over: bool,
    /// Held by the build thread writing into the file (see [`hold`]).
    writing: Mutex<()>,
}

impl Job {
    /// The file `key` kept by an earlier mount, checked; `None` where it fails its check
    /// (dropped) or was evicted.
    pub(super) fn check(self, key: Key) -> Option<Built> {
        let item = key.item();
        let cache = self.cache.clone();
        let stats = self.stats.clone();
        let written = |n| self.progress.written.store(n, Ordering::Relaxed);
        let (file, stamp) = cache.check_file(item, &written, &stats)?;
        Stats::add(&stats.c.ahead_kept_checked, 1);
        let reserved = Reserved {
            bytes: 0,
            path: Some(cache.path(item)),
            kept: Some((item, stamp)),
            cache,
            stats,
        };
        Some(Built {
            file: Arc::new(file),
            stamp,
            reserved,
            path_given: AtomicBool::new(false),
        })
    }

    /// The files, written whole (each over its spare, a file gone by, if it has one) and kept
    /// in the cache; `None` for one the cache has no room for, or all where the build was
    /// stopped.
    pub(super) fn build(
        self,
        files: Vec<(Key, Option<Spare>)>,
    ) -> Vec<(Key, Result<Option<Built>>)> {
        let mut out = Vec::new();
        let mut building = Vec::new();
        for (key, spare) in files {
            match self.prepare(key, spare) {
                Ok(Some(b)) => building.push(b),
                other => out.push((key, other.map(|_| None))),
            }
        }
        if building.is_empty() {
            return out;
        }
        let written = match self.write(&mut building) {
            Ok(()) => Ok(()),
            Err(_) if self.progress.stop.load(Ordering::Relaxed) => Err(None),
            Err(e) => Err(Some(e)),
        };
        let stats = self.stats.clone();
        let cache = self.cache.clone();
        for b in building {
            let Building {
                key,
                file,
                mut reserved,
                ..
            } = b;
            let path = reserved
                .path
                .clone()
                .expect("a file built ahead has its path");
            match &written {
                Ok(()) => {}
                Err(None) => {
                    out.push((key, Ok(None)));
                    continue;
                }
                Err(Some(e)) => {
                    let e = anyhow::anyhow!("writing {}: {e:#}", path.display());
                    out.push((key, Err(e)));
                    continue;
                }
            };
            let item = key.item();
            let kept = (cache.keep(item, &file, &path, reserved.bytes, &stats))
                .with_context(|| format!("keeping {}", path.display()));
            let stamp = match kept {
                Ok(stamp) => stamp,
                Err(e) => {
                    out.push((key, Err(e)));
                    continue;
                }
            };
            reserved.kept = Some((item, stamp));
            reserved.path = Some(cache.path(item));
            Stats::add(&stats.c.ahead_files_built, 1);
            Stats::add(&stats.c.ahead_bytes_built, reserved.bytes);
            Stats::add(&stats.c.cache_written_bytes, reserved.bytes);
            Stats::add(&stats.c.ahead_written_over, u64::from(b.over));
            out.push((
                key,
                Ok(Some(Built {
                    file: Arc::new(file),
                    stamp,
                    reserved,
                    path_given: AtomicBool::new(false),
                })),
            ));
        }
        out
    }

    /// File `key`'s bytes of the cache reserved (beyond its spare's), and the file to write
    /// (its spare, else a new one): `None` where the cache has no room for it.
    fn prepare(&self, key: Key, spare: Option<Spare>) -> Result<Option<Building>> {
        let Key { dir, kind } = key;
        let stats = self.stats.clone();
        let cache = self.cache.clone();
        let rows = self.builder.plan().dir_rows(dir);
        let bytes = self.layout.size(kind, rows);
        let distance = self.materializer.distance_fn();
        // A spare's bytes of the cache are reserved already: only more than those are asked for.
        let had = spare.as_ref().map_or(0, |s| s.reserved.bytes);
        if bytes > had && !cache.reserve_spare(bytes - had, &*distance, &stats) {
            tracing::debug!(
                "no room in the cache to build {kind:?} of {} ahead ({bytes} bytes)",
                crate::read::layout::dir_name(dir)
            );
            Stats::add(&stats.c.ahead_skipped, 1);
            // The spare, if any, drops: removed, its bytes given back.
            return Ok(None);
        }
        let over = spare.is_some();
        let (file, reserved) = match spare {
            Some(Spare { file, mut reserved }) => {
                if bytes < had {
                    cache.unreserve(had - bytes, &stats);
                }
                reserved.bytes = bytes;
                (file, reserved)
            }
            None => {
                let mut reserved = Reserved {
                    bytes,
                    path: None,
                    kept: None,
                    cache: cache.clone(),
                    stats: stats.clone(),
                };
                let (file, path) = cache.scratch_file()?;
                reserved.path = Some(path);
                (file, reserved)
            }
        };
        let header = self.layout.header(kind, rows);
        let tensors = (self.layout.tensor_ranges(kind, rows))
            .map(|(t, range)| (t, range.start))
            .collect();
        Ok(Some(Building {
            key,
            file,
            reserved,
            header,
            tensors,
            len: self.layout.size(kind, rows),
            over,
            writing: Mutex::new(()),
        }))
    }

    /// Writes each file's header, then each batch's rows of each of its tensors where they go
    /// (taken from memory or the batch's files, else gathered, each row located once for every
    /// file), the layout the daemon serves the files in. The batches are gathered and written
    /// on this thread and the helpers free (up to [`MOST_BUILD_THREADS`] in all), each taking
    /// the next run of batches not taken (the file fills about in order), so that a reader that
    /// comes to the file while it is built waits for all the cores' work, not one's.
    fn write(&self, files: &mut [Building]) -> Result<()> {
        let dir = files[0].key.dir;
        let plan = self.builder.plan();
        let count = plan.count(dir);
        // The tensors gathered for every file, and where each file's tensor is among them.
        let mut wanted: Vec<usize> = Vec::new();
        let mut slots: Vec<Vec<usize>> = Vec::new();
        for b in files.iter_mut() {
            b.file.write_all_at(&b.header, 0)?;
            b.file.set_len(b.len)?;
            let slot = |t: usize, wanted: &mut Vec<usize>| match wanted.iter().position(|&w| w == t)
            {
                Some(k) => k,
                None => {
                    wanted.push(t);
                    wanted.len() - 1
                }
            };
            slots.push(
                b.tensors
                    .iter()
                    .map(|&(t, _)| slot(t, &mut wanted))
                    .collect(),
            );
        }
        let next = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        // This thread, and helpers from the share every build ahead draws from (so that builds
        // of several chains at once hold no more of the workers' build permits than one).
        let wanted_helpers = (self.builder.threads())
            .min(MOST_BUILD_THREADS)
            .min(count.div_ceil(RUN).max(1) as usize)
            - 1;
        let helpers = Helpers::take(&self.helpers, wanted_helpers);
        let (files_now, wanted, slots) = (&*files, &wanted, &slots);
        let (next, failed) = (&next, &failed);
        let share = move || {
            let done = crate::catch_panic(|| {
                self.write_batches(files_now, wanted, slots, next, failed, count)
            })
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("a build thread panicked: {panic}")));
            if done.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            done
        };
        let written: Vec<Result<()>> = std::thread::scope(|scope| {
            // A helper that cannot start leaves its share to the others.
            let started: Vec<_> = (0..helpers.count)
                .filter_map(|_| {
                    std::thread::Builder::new()
                        .name("tensorfs-ahead".into())
                        .spawn_scoped(scope, move || {
                            // As the thread that started it: only CPU time nothing else wants.
                            crate::read::produce::pool::idle_class();
                            share()
                        })
                        .ok()
                })
                .collect();
            let mut written = vec![share()];
            written.extend(started.into_iter().map(|h| {
                (h.join()).unwrap_or_else(|_| Err(anyhow::anyhow!("a build thread panicked")))
            }));
            written
        });
        written.into_iter().collect()
    }

    /// One build thread's share of [`Job::write`]: run after run of [`RUN`] batches, the next
    /// run not taken (`next`), gathered and written into every file, until all `count` batches
    /// are taken, the build is stopped, or another thread failed.
    fn write_batches(
        &self,
        files: &[Building],
        wanted: &[usize],
        slots: &[Vec<usize>],
        next: &AtomicU64,
        failed: &AtomicBool,
        count: u64,
    ) -> Result<()> {
        let dir = files[0].key.dir;
        let plan = self.builder.plan();
        // Each wanted tensor's rows of the batches gathered and not yet written, and the first
        // of those batches: a run's batches are consecutive, so their rows of a tensor are one
        // range of each file, written at once (and the buffers kept from run to run).
        let mut pending: Vec<Vec<u8>> = vec![Vec::new(); wanted.len()];
        let mut unwritten = vec![0u64; wanted.len()];
        loop {
            let first = next.fetch_add(RUN, Ordering::Relaxed);
            // Past the end, or another thread failed (its error is the build's).
            if first >= count || failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            let end = (first + RUN).min(count);
            unwritten.fill(first);
            for j in first..end {
                if self.progress.stop.load(Ordering::Relaxed) {
                    anyhow::bail!("stopped: its reader came first");
                }
                let b = plan.batch_in(dir, j);
                (self.materializer).batch_tensors(&self.runtime, b, wanted, &mut pending)?;
                self.progress.written.fetch_add(1, Ordering::Relaxed);
                for k in 0..wanted.len() {
                    let rows = &mut pending[k];
                    let last = j + 1 == end;
                    if rows.len() < WRITE_BYTES && !last {
                        continue;
                    }
                    // Rows wait for a busy file up to a few buffers' worth (a batch's, where
                    // one holds more), and at a run's end.
                    let wait = last || rows.len() >= 4 * WRITE_BYTES;
                    let Some(_writing) = hold(files, slots, k, wait) else {
                        continue;
                    };
                    self.write_tensor(files, slots, k, rows, unwritten[k])?;
                    rows.clear();
                    unwritten[k] = j + 1;
                }
            }
        }
    }

    /// Writes `rows`, wanted tensor `k`'s rows of the batches from `first` on, into every file
    /// that holds the tensor.
    fn write_tensor(
        &self,
        files: &[Building],
        slots: &[Vec<usize>],
        k: usize,
        rows: &[u8],
        first: u64,
    ) -> Result<()> {
        let bs = self.builder.plan().options().batch_size;
        for (f, slots) in files.iter().zip(slots) {
            for (&(t, base), _) in (f.tensors.iter().zip(slots)).filter(|(_, s)| **s == k) {
                f.file
                    .write_all_at(rows, base + first * bs * self.layout.row_bytes(t))?;
            }
        }
        Ok(())
    }
}

/// The files that hold wanted tensor `k`, held for writing, in file order; `None`, unless
/// `wait`, where another build thread is writing one. A write takes the file's inode lock,
/// on which a second thread spins while the first copies (measured: 3-6% of a build's CPU):
/// rows that find their file busy wait for the next batch's turn instead.
fn hold<'a>(
    files: &'a [Building],
    slots: &[Vec<usize>],
    k: usize,
    wait: bool,
) -> Option<Vec<std::sync::MutexGuard<'a, ()>>> {
    let holding = files.iter().zip(slots).filter(|(_, s)| s.contains(&k));
    let held = holding.map(|(f, _)| match wait {
        true => Some(f.writing.lock().unwrap_or_else(|e| e.into_inner())),
        false => f.writing.try_lock().ok(),
    });
    held.collect()
}
