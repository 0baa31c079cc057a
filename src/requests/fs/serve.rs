//! The reads behind open files, where the tree ([`super`]) says what a name is: what an open
//! finds materialised, batch files stored in the page cache by their opens, the one-open files
//! (built ahead, or gathered a tensor's rows at a time), reads from memory or from the backing
//! file, and the prefetcher told where each reader is.

use super::*;

impl Fs {
    /// A batch file's backing file if it is materialised already (checked), without waiting;
    /// the caller follows the reader ([`Fs::follow_open`]) once it answered.
    pub(crate) fn materialized(&self, ino: u64) -> Option<Arc<File>> {
        let item = self.item(self.node(ino).ok()?).ok()?;
        self.materializer.ready(item)
    }

    /// Counts an answered open of batch file `ino`, which waited `waited`, by passthrough or not.
    pub(crate) fn opened(&self, ino: u64, waited: std::time::Duration, passthrough: bool) {
        let stats = self.stats();
        Stats::add(&stats.c.opens, 1);
        stats.stall(waited);
        Stats::add(&stats.c.batches_served, 1);
        Stats::add(
            &stats.c.bytes_served,
            self.getattr(ino).map_or(0, |a| a.size),
        );
        if passthrough {
            Stats::add(&stats.c.passthrough_opens, 1);
        }
    }

    /// Whether `ino` is a file whose bytes change while mounted (stats.json, and dataset.json
    /// where it counts the objects touched).
    pub(crate) fn is_live(&self, ino: u64) -> bool {
        ino == STATS_JSON_INO || (ino == DATASET_JSON_INO && self.touched_at.is_some())
    }

    /// From now on, the batch files of shuffled epochs (every file, with `opens=kernel`) are
    /// stored in the kernel's page cache of the files readers open, not written to the local
    /// cache: each is read once ([`crate::read::follow::page_cache`]). Where epochs share their files
    /// (`shuffle=none`) they are read every epoch, and written.
    pub fn store_in(&self, page_cache: PageCache, kernel_opens: bool) {
        self.prefetcher.use_page_cache(page_cache.clone());
        if kernel_opens || !self.plan().epochs_repeat() {
            self.prefetcher.store_in(page_cache, kernel_opens);
        }
    }

    /// Where batch file `ino` is stored in the page cache by its opens, not written: its
    /// directory, batch and file. Not a file the cache holds (one `tensorfs warm` or a GPUDirect
    /// reader asked for), which its open checks and reads by passthrough.
    pub(crate) fn stored_by_opens(&self, ino: u64) -> Option<(Batches, u64, FileKind)> {
        let filler = self.prefetcher.filler();
        if !filler.on() || filler.tripwires() {
            return None;
        }
        let node = self.node(ino).ok()?;
        if self.materializer.contains(self.item(node).ok()?) {
            return None;
        }
        let (d, i, kind) = node.batch_file()?;
        Some((self.dir(d).ok()?, i, kind))
    }

    /// For an open of batch file `ino` at `place` ([`Fs::stored_by_opens`]), answered at once:
    /// true where its file is stored in the page cache already (the prefetcher's), or its
    /// batch is in memory and nobody is storing it, the file then stored if `store`. False:
    /// its store is under way, or its batch must be built first ([`Fs::store_built`]). The
    /// caller follows the reader once it answered.
    pub(crate) fn store_at_hand(
        &self,
        ino: u64,
        place: (Batches, u64, FileKind),
        store: bool,
    ) -> bool {
        let (dir, i, kind) = place;
        let filler = self.prefetcher.filler();
        if filler.stored(dir, i, kind) {
            return true;
        }
        if filler.under_way(dir, i, kind) {
            return false;
        }
        let Some(batch) = self.builder.batch_at_hand(self.plan().batch_in(dir, i)) else {
            return false;
        };
        if store && filler.claim(dir, i, kind) {
            filler.store_opened(ino, dir, i, kind, &batch);
        }
        true
    }

    /// As [`Fs::store_at_hand`], for an open that waits: for the store under way to end, else
    /// for its batch to be built.
    pub(crate) async fn store_built(
        &self,
        ino: u64,
        place: (Batches, u64, FileKind),
        store: impl FnOnce() -> bool,
    ) -> Result<()> {
        let (dir, i, kind) = place;
        self.follow(Event::at(dir, i, What::File(kind)));
        let filler = self.prefetcher.filler();
        if filler.store_ended(dir, i, kind).await {
            return Ok(());
        }
        let batch = self.batch(self.plan().batch_in(dir, i)).await?;
        if store() && filler.claim(dir, i, kind) {
            filler.store_opened(ino, dir, i, kind, &batch);
        }
        Ok(())
    }

    /// A read of a file nobody opened through the daemon (`opens=kernel`: the kernel answers
    /// opens alone): from its backing file where it has one now, else as [`Fs::read`] builds it.
    pub(crate) async fn read_unopened(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        let backing = if node.batch_file().is_some() {
            let file = self.materialized(ino);
            if file.is_some() {
                // Fs::read follows the reader otherwise.
                self.follow_open(ino);
            }
            file
        } else if let Some((dir, kind)) = self.all_file(ino) {
            let file = match self.ahead.for_read(dir, kind) {
                Opening::Ready(file) => Some(file),
                Opening::Soon(progress) => self.all_when_built(ino, progress).await,
                Opening::Daemon => None,
            };
            if file.is_some() {
                self.follow_open(ino);
            }
            file
        } else {
            None
        };
        self.read_open(ino, backing, offset, size).await
    }

    /// Counts an open of a one-open file answered by passthrough.
    pub(crate) fn opened_by_passthrough(&self) {
        Stats::add(&self.stats().c.passthrough_opens, 1);
    }

    /// A reader opened file `ino` (followed after the open is answered): a batch file, or a
    /// one-open file opened built ahead, whose reader has the next epoch's built.
    pub(crate) fn follow_open(&self, ino: u64) {
        let Ok(node) = self.node(ino) else { return };
        let event = match (node.batch_file(), node.all_file()) {
            (Some((d, i, kind)), _) => self.dir(d).map(|dir| Event::at(dir, i, What::File(kind))),
            (_, Some((d, kind))) => self.dir(d).map(|dir| Event::at(dir, 0, What::Whole(kind))),
            _ => return,
        };
        if let Ok(event) = event {
            self.follow(event);
        }
    }

    /// A reader read what `event` says: the one place a request moves a reader. The prefetcher
    /// moves its position (which the eviction measures from) and builds what follows; a reader
    /// of a one-open file opened whole, past its middle, or in an epoch after the first (whose
    /// rows are gathered from cached columns), has the next epoch's file built ahead (in epoch
    /// 0, whose row groups are decoded as it is read, a build from its start would fetch and
    /// decode them beside the reader, in another order).
    pub(super) fn follow(&self, event: Event) {
        self.prefetcher.follow(event);
        match event.what {
            What::Whole(kind) => self.ahead.reader_at(event.dir, kind),
            What::Rows {
                file, past_half, ..
            } if past_half || event.dir.global(0).0 >= 1 => self.ahead.reader_at(event.dir, file),
            _ => {}
        }
    }

    /// How an open of one-open file `ino` is served ([`Ahead::for_open`]).
    pub(crate) fn open_all(&self, ino: u64) -> Opening {
        match self.all_file(ino) {
            Some((dir, kind)) => self.ahead.for_open(dir, kind),
            None => Opening::Daemon,
        }
    }

    /// One-open file `ino` once the build it waits for has ended, if it was built.
    pub(crate) async fn all_when_built(
        &self,
        ino: u64,
        progress: Arc<Progress>,
    ) -> Option<Arc<File>> {
        let (dir, kind) = self.all_file(ino)?;
        self.ahead.when_built(dir, kind, progress).await
    }

    /// The directory and file of one-open file `ino`.
    pub(super) fn all_file(&self, ino: u64) -> Option<(Batches, FileKind)> {
        let (d, kind) = self.node(ino).ok()?.all_file()?;
        Some((self.dir(d).ok()?, kind))
    }

    /// A batch file's backing file, materialised on the local cache first if it must be.
    /// `None`: the cache cannot take it, the daemon serves it from memory.
    pub async fn materialize(&self, ino: u64) -> Result<Option<(File, PathBuf)>> {
        let node = self.node(ino)?;
        let item = self.item(node)?;
        self.follow_open(ino);
        self.materializer.materialize(item).await.map_err(|e| {
            let path = self.materializer.path(item);
            Error::failed(format!("materialising {}", path.display()), e)
        })
    }

    /// A read of an open file: from its backing file where the open found it materialised
    /// (checked then), else from [`Fs::read`]. Reads of batch files count as served by the
    /// daemon, and their waits as stalls.
    pub(crate) async fn read_open(
        &self,
        ino: u64,
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
            None => self.read(ino, offset, size).await?,
        };
        if self.is_batch_file(ino) {
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

    /// A read of batch file `ino` nobody opened through the daemon (`opens=kernel`: a tripwire
    /// page, or pages the page cache did not hold), answered at once where its batch is in
    /// memory: on the FUSE thread, with no trip through the async workers, which cost a few
    /// times more than the copy. `None` where it must wait ([`Fs::read_unopened`]). The caller
    /// follows the reader once it has answered ([`Fs::follow_open`]).
    pub(crate) fn read_at_hand(&self, ino: u64, offset: u64, size: u32) -> Option<Vec<u8>> {
        let started = std::time::Instant::now();
        let node = self.node(ino).ok()?;
        let (d, i, kind) = node.batch_file()?;
        let b = self.plan().batch_in(self.dir(d).ok()?, i);
        let batch = self.builder.batch_at_hand(b)?;
        let data = batch.file_bytes(&self.layout, kind, offset, size);
        self.served_by_daemon(started.elapsed(), data.len());
        Some(data)
    }

    /// Reads `size` bytes at `offset`, building what it spans first if it must.
    pub async fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        match node {
            Node::DatasetJson => Ok(self.dataset_json_at(offset, size)),
            Node::StatsJson => Ok(layout::slice(&[&self.stats_json()], offset, size)),
            Node::Safetensors(d, i) | Node::Npy(d, i, _) => {
                let (_, _, kind) = node.batch_file().expect("a batch file");
                let dir = self.dir(d)?;
                self.follow(Event::at(dir, i, What::File(kind)));
                let batch = self.batch(self.plan().batch_in(dir, i)).await?;
                Ok(batch.file_bytes(&self.layout, kind, offset, size))
            }
            Node::AllSafetensors(d) | Node::AllNpy(d, _) => {
                let (_, kind) = node.all_file().expect("a one-open file");
                self.read_all(d, kind, offset, size).await
            }
            _ => Err(Error::answer(libc::EISDIR)),
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

    /// Reads `size` bytes at `offset` of directory `d`'s one-open file `kind`: its header,
    /// then each of its tensors' rows of every batch in batch order, built (or taken from
    /// memory) only for the batches the read spans.
    async fn read_all(&self, d: u32, kind: FileKind, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (b, rows, spans, events) = self.all_read(d, kind, offset, size)?;
        Stats::add(&self.stats().c.one_open_reads, 1);
        // The reader is followed before it waits: what comes after the read is built meanwhile.
        self.follow_all(events);
        let mut tensors = Vec::new();
        for span in &spans {
            if let Span::Rows { t, batch, .. } = *span {
                tensors.push(self.tensor(self.plan().batch_in(b, batch), t).await?);
            }
        }
        self.assemble(kind, rows, b, spans, tensors)
    }

    /// As [`Fs::read`] for a one-open file, answered at once where every batch the read spans
    /// is in memory (a tripwire page the prefetcher left out of the page cache, or a readahead
    /// of rows gathered ahead): on the FUSE thread, the reader followed after the reply
    /// ([`Fs::follow_all`]) with what this returns. `None` where it must wait.
    pub(crate) fn read_all_at_hand(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
    ) -> Option<(Vec<u8>, Vec<Event>)> {
        let node = self.node(ino).ok()?;
        let (d, kind) = node.all_file()?;
        let (b, rows, spans, events) = self.all_read(d, kind, offset, size).ok()?;
        let mut tensors = Vec::new();
        for span in &spans {
            if let Span::Rows { t, batch, .. } = *span {
                let batch = self.plan().batch_in(b, batch);
                tensors.push(self.builder.tensor_at_hand(batch, t)?);
            }
        }
        let data = self.assemble(kind, rows, b, spans, tensors).ok()?;
        Stats::add(&self.stats().c.one_open_reads, 1);
        Some((data, events))
    }

    /// Follows the reader of a one-open file by the events of its read ([`Fs::all_read`]).
    pub(crate) fn follow_all(&self, events: Vec<Event>) {
        for event in events {
            self.follow(event);
        }
    }

    /// What a read of `size` bytes at `offset` of directory `d`'s one-open file `kind` spans:
    /// the directory, its rows, the spans, and the events that follow its reader (one per
    /// tensor it reads rows of).
    fn all_read(
        &self,
        d: u32,
        kind: FileKind,
        offset: u64,
        size: u32,
    ) -> Result<(Batches, u64, Vec<Span>, Vec<Event>)> {
        let b = self.dir(d)?;
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
        Ok((b, rows, spans, events))
    }

    /// The bytes of `spans` of one-open file `kind` of `b` (of `rows` rows): its header's, and
    /// `tensors`, one per span of rows in order.
    fn assemble(
        &self,
        kind: FileKind,
        rows: u64,
        b: Batches,
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
                    let header = self.layout.header(kind, rows);
                    out.extend_from_slice(&header[range.start as usize..range.end as usize]);
                }
                Span::Rows { batch, within, .. } => {
                    let tensor = tensors.next().expect("a tensor per span of rows");
                    let data = tensor.bytes();
                    if (data.len() as u64) < within.end {
                        return Err(Error::failed(
                            self.plan().batch_in(b, batch).to_string(),
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
