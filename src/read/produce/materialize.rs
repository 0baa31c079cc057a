//! Materialising batch files into the local cache, where readers open them (by passthrough)
//! and GPUDirect readers find them by path: each file once however many readers and
//! prefetches want it.

use crate::cache::DiskCache;
use crate::model::item::{FileKind, Item};
use crate::model::plan::{BatchRef, Plan};
use crate::read::layout::Layout;
use crate::read::produce::builder::Builder;
use crate::read::produce::eviction::Eviction;
use crate::read::produce::memo::{Memo, Weighted};
use crate::read::produce::pool::cpu_counted;
use crate::stats::Stats;
use anyhow::Result;
use lru::LruCache;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What materialising a batch file gave: the file in the cache, open, and its path, or nothing
/// when the cache could not take it (the file is then served from memory).
pub(crate) struct Materialized(pub Option<(File, PathBuf)>);

impl Weighted for Materialized {
    fn weight(&self) -> usize {
        // Never kept by the memo: it only makes concurrent materialisations of a file one.
        usize::MAX
    }
}

/// Files the prefetcher materialised or checked, kept open for the opens that will want them: a
/// few times `prefetch` deep, so that every reader's next files fit.
const READY_FILES: usize = 64;

pub(crate) struct Materializer {
    builder: Arc<Builder>,
    layout: Arc<Layout>,
    cache: Arc<DiskCache>,
    eviction: Arc<Eviction>,
    materializing: Memo<Item, Materialized>,
    /// Files materialised or checked ahead, open, until their open takes them (or newer ones
    /// push them out). An open of a file found here skips the lookup by path (measured: the daemon's
    /// part of such an open went from 12.5 to 7.4 us).
    ready: Mutex<LruCache<Item, Arc<File>>>,
}

impl Materializer {
    pub(crate) fn new(
        builder: Arc<Builder>,
        layout: Arc<Layout>,
        cache: Arc<DiskCache>,
        eviction: Arc<Eviction>,
    ) -> Materializer {
        Materializer {
            builder,
            layout,
            cache,
            eviction,
            materializing: Memo::new(0),
            ready: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(READY_FILES).expect("nonzero"),
            )),
        }
    }

    fn plan(&self) -> &Plan {
        self.builder.plan()
    }

    fn stats(&self) -> &Arc<Stats> {
        self.builder.stats()
    }

    /// How far ahead of the readers each cache item is needed ([`Eviction::distance_fn`]).
    pub(crate) fn distance_fn(&self) -> Box<dyn Fn(Item) -> u64 + Send + Sync> {
        self.eviction.distance_fn()
    }

    /// Whether the cache has room for `bytes` more beside everything the plan needs again
    /// ([`DiskCache::has_spare_room`]): a file built far ahead takes no room a nearer one needs.
    pub(crate) fn has_spare_room(&self, bytes: u64) -> bool {
        (self.cache).has_spare_room(bytes, &*self.distance_fn(), self.stats())
    }

    /// Where the batch file `item` is (or would be) in the cache.
    pub(crate) fn path(&self, item: Item) -> PathBuf {
        self.cache.path(item)
    }

    /// Keeps the batch file `item` from eviction for `grace` (a reader was given its path).
    pub(crate) fn pin(&self, item: Item, grace: std::time::Duration) {
        self.cache.pin(item, grace)
    }

    pub(crate) fn contains(&self, item: Item) -> bool {
        self.cache.contains(item)
    }

    /// Whether batch `b` has a file in the cache that [`Materializer::tensor_from_file`] would
    /// read tensor `t` from: an index lookup, for callers that hand the read to another thread
    /// only when there is one.
    pub(crate) fn has_tensor_file(&self, b: BatchRef, t: usize) -> bool {
        self.tensor_file(b, t).is_some()
    }

    /// The file of batch `b` in the cache to read tensor `t` from, and its kind: its `.npy`
    /// file of the tensor, else its `.safetensors` file.
    fn tensor_file(&self, b: BatchRef, t: usize) -> Option<(Item, FileKind)> {
        [FileKind::Npy(t), FileKind::Safetensors]
            .into_iter()
            .map(|kind| (Item::of(kind, b), kind))
            .find(|&(item, _)| self.cache.contains(item))
    }

    /// Tensor `t`'s rows of batch `b` read onto the end of `out` from a materialised file of
    /// the batch (its `.npy` file of the tensor, else its `.safetensors` file), checked: a warm
    /// remount, or a build of a one-open file, decodes nothing the batch files hold. `false`,
    /// `out` as it was, where neither is in the cache or the read fails (the caller then
    /// gathers the rows). Blocking; it moves no reader (a build ahead reads batches no reader
    /// is at).
    pub(crate) fn tensor_from_file(&self, b: BatchRef, t: usize, out: &mut Vec<u8>) -> bool {
        let rows = self.plan().batch_len(b.index());
        let Some((item, kind)) = self.tensor_file(b, t) else {
            return false;
        };
        let range = self.layout.tensor_range(kind, rows, t);
        let Some((file, _)) = self.cache.open_batch_file(item, self.stats()) else {
            return false;
        };
        Stats::add(&self.stats().c.batch_file_hits, 1);
        let at = out.len();
        out.resize(at + (range.end - range.start) as usize, 0);
        let read = std::os::unix::fs::FileExt::read_exact_at(&file, &mut out[at..], range.start);
        if read.is_err() {
            out.truncate(at);
        }
        read.is_ok()
    }

    /// Batch `b`'s rows of tensors `wanted` (in that order), each onto the end of its buffer in
    /// `outs`, for one-open files built on the calling thread: from memory, else from the
    /// batch's materialised files, else gathered (decoding what is not at hand).
    pub(crate) fn batch_tensors(
        &self,
        runtime: &tokio::runtime::Handle,
        b: BatchRef,
        wanted: &[usize],
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        if !self.builder.has_batch(b) {
            let lens: Vec<usize> = outs.iter().map(Vec::len).collect();
            let mut pairs = wanted.iter().zip(outs.iter_mut());
            if pairs.all(|(&t, out)| self.tensor_from_file(b, t, out)) {
                return Ok(());
            }
            for (out, len) in outs.iter_mut().zip(lens) {
                out.truncate(len);
            }
        }
        self.builder.gather_here(runtime, b, wanted, outs)
    }

    /// The fast path of an open, answered on the FUSE thread: the batch file `item` kept ready
    /// by the prefetcher (unchanged since it was written, and not evicted since), else found in
    /// the cache already checked. `None` if it is not materialised, or is but must be checked
    /// first: that reads the whole file, which the caller does off the FUSE thread
    /// ([`Materializer::materialize`]), so that no open waits behind another's disk reads.
    pub(crate) fn ready(&self, item: Item) -> Option<Arc<File>> {
        let kept = self.ready.lock().unwrap().pop(&item);
        let file = match kept {
            Some(file) if self.cache.unchanged(item, &file) => file,
            _ => Arc::new(self.cache.open_if_checked(item)?),
        };
        Stats::add(&self.stats().c.batch_file_hits, 1);
        Some(file)
    }

    /// The batch file `item` in the local cache, checked, materialising it first if needed.
    /// `None`: the cache cannot hold it; serve it from memory.
    pub(crate) async fn materialize(&self, item: Item) -> Result<Option<(std::fs::File, PathBuf)>> {
        if let Some(hit) = self.checked(item).await? {
            Stats::add(&self.stats().c.batch_file_hits, 1);
            return Ok(Some(hit));
        }
        let _waits = self.builder.reader_waits();
        self.build(item).await
    }

    /// Makes the batch file `item`, which a reader will want next, ready for that open: checked
    /// if it is in the cache (a warm remount's files are read whole once to check them, here
    /// rather than in the reader's open), else materialised. Readers' position stays as it is.
    pub(crate) async fn prefetch(&self, item: Item) -> Result<()> {
        let file = match self.checked(item).await? {
            Some(hit) => Some(hit),
            None => self.build(item).await?,
        };
        if let Some((file, _)) = file {
            self.ready.lock().unwrap().put(item, Arc::new(file));
        }
        Ok(())
    }

    /// Builds the batch file `item` far ahead of its reader (the next epoch's, in idle time,
    /// [`crate::read::follow::prefetch`]): as [`Materializer::prefetch`], but not kept open, since its open
    /// is far off. Whether the cache took it.
    pub(crate) async fn build_ahead(&self, item: Item) -> Result<bool> {
        Ok(self.build(item).await?.is_some())
    }

    /// Whether the batch file `item` is in the cache and checked since it was indexed: its
    /// open needs nothing from the prefetcher.
    pub(crate) fn checked_already(&self, item: Item) -> bool {
        self.cache.checked_already(item)
    }

    /// The batch file `item` from the cache, checked (on a blocking thread: a file not checked
    /// yet is read whole); `None` where the index lacks it (no lookup on disk then) or it fails
    /// its check.
    async fn checked(&self, item: Item) -> Result<Option<(std::fs::File, PathBuf)>> {
        if !self.cache.contains(item) {
            return Ok(None);
        }
        let (cache, stats) = (self.cache.clone(), self.stats().clone());
        Ok(tokio::task::spawn_blocking(move || cache.open_batch_file(item, &stats)).await?)
    }

    /// Builds the batch file `item` and writes it to the cache, once however many callers want
    /// it; each caller gets its own handle. `None`: the cache could not take it.
    #[tracing::instrument(name = "materialize", level = "debug", skip(self))]
    async fn build(&self, item: Item) -> Result<Option<(std::fs::File, PathBuf)>> {
        let cache = self.cache.clone();
        let b = item.batch().expect("a batch item");
        let made = self
            .materializing
            .get_or_build(item, async {
                Stats::add(&self.stats().c.batch_file_misses, 1);
                let batch = self.builder.batch(b).await?;
                let cache = cache.clone();
                let stats = self.stats().clone();
                let distance = self.eviction.distance_fn();
                let layout = self.layout.clone();
                let placed = self
                    .builder
                    .pool()
                    .run(move || {
                        cpu_counted(&stats.c.batch_write_cpu_ns, || {
                            let kind = item.kind().expect("a batch file");
                            let header = batch.header(&layout, kind);
                            let parts = layout.parts(kind, header.as_ref(), &batch.tensors);
                            match cache.store_batch_file(item, &parts, &*distance, &stats) {
                                Ok(placed) => Some(placed),
                                Err(e) => {
                                    tracing::debug!("{item:?} served from memory: {e}");
                                    None
                                }
                            }
                        })
                    })
                    .await?;
                Ok(Arc::new(Materialized(placed)))
            })
            .await?;
        // Each caller its own handle of the one file written (no second lookup by path).
        Ok(match &made.0 {
            Some((file, path)) => file.try_clone().ok().map(|f| (f, path.clone())),
            None => None,
        })
    }
}
