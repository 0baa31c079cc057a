//! In-process tests of the filesystem core over object_store's in-memory store: lookup,
//! readdir, open (materialise), read, the one-open files, eviction and remote faults, with no
//! FUSE, no root and no Python (after mountpoint-s3's `tests/fs.rs`). The dataset's `id`
//! column is each row's canonical index, so every batch is checked against the plan alone.

use arrow::array::{Float32Array, Int64Array, RecordBatch};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tensorfs::mount::Dataset;
use tensorfs::options::Options;
use tensorfs::read::layout;
use tensorfs::requests::fs::{EntryType, ROOT_INO};
use tensorfs::requests::{Answer, Registrar, Requests, Served};
use tensorfs::source::catalog::Pinned;
use tensorfs::source::{Listing, Source};
use tensorfs::stats::Stats;

/// An in-memory store whose reads fail while `failing` is set, as a server that went away,
/// and which counts the objects read and the listings made.
#[derive(Debug, Default)]
struct Flaky {
    inner: InMemory,
    failing: AtomicBool,
    gets: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    lists: std::sync::atomic::AtomicUsize,
    /// Bytes the reads asked for.
    bytes: std::sync::atomic::AtomicU64,
}

impl Flaky {
    fn reset_counts(&self) {
        self.gets.lock().unwrap().clear();
        self.lists.store(0, Ordering::SeqCst);
        self.bytes.store(0, Ordering::SeqCst);
    }

    /// The objects read since the counts were reset.
    fn objects_read(&self) -> Vec<String> {
        self.gets.lock().unwrap().keys().cloned().collect()
    }
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "Flaky",
                source: "connection reset by peer".into(),
            });
        }
        *self
            .gets
            .lock()
            .unwrap()
            .entry(location.to_string())
            .or_default() += 1;
        let got = self.inner.get_opts(location, options).await?;
        let len = got.range.end - got.range.start;
        self.bytes.fetch_add(len, Ordering::SeqCst);
        Ok(got)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A Parquet file of rows `start..start + rows`: `id` (the canonical row) and `x = id / 2`.
fn parquet(start: i64, rows: i64, rg_size: usize) -> Bytes {
    let ids: Vec<i64> = (start..start + rows).collect();
    let xs: Vec<f32> = ids.iter().map(|&i| i as f32 / 2.0).collect();
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids)) as _),
        ("x", Arc::new(Float32Array::from(xs)) as _),
    ])
    .unwrap();
    let mut out = Vec::new();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rg_size))
        .build();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    Bytes::from(out)
}

/// Two files, 300 + 220 rows, row groups of 64.
async fn store() -> Arc<Flaky> {
    let store = Arc::new(Flaky::default());
    store
        .put(&Path::from("data/a.parquet"), parquet(0, 300, 64).into())
        .await
        .unwrap();
    store
        .put(&Path::from("data/b.parquet"), parquet(300, 220, 64).into())
        .await
        .unwrap();
    store
}

/// The request core of a mount (passthrough offered, as the kernel offers it).
type Core = Requests<usize>;

struct Mounted {
    fs: Arc<Core>,
    dataset: Dataset,
    _cache: tempfile::TempDir,
}

async fn mount(store: Arc<Flaky>, options: &str) -> Mounted {
    let cache = tempfile::tempdir().unwrap();
    let (fs, dataset) = mount_on(store, options, cache.path()).await;
    Mounted {
        fs,
        dataset,
        _cache: cache,
    }
}

/// The core over `store` with its cache in `cache` (a remount finds what an earlier mount left).
async fn mount_on(
    store: Arc<Flaky>,
    options: &str,
    cache: &std::path::Path,
) -> (Arc<Core>, Dataset) {
    let opts = Options::parse(&[
        options.to_string(),
        format!("cache_dir={}", cache.display()),
    ])
    .unwrap();
    let stats = Arc::new(Stats::default());
    let url = url::Url::parse("memory:///data").unwrap();
    let source = Source::over(
        store,
        &url,
        Path::from("data"),
        "memory:///data",
        stats.clone(),
        Listing::default(),
    )
    .await
    .unwrap();
    let dataset = Dataset::over(Arc::new(source), &opts, stats).await.unwrap();
    dataset.check().unwrap();
    let (fs, serve) = dataset
        .filesystem(&opts, tokio::runtime::Handle::current())
        .unwrap();
    (
        Arc::new(Requests::new(Arc::new(fs), serve, true, false)),
        dataset,
    )
}

fn ino(fs: &tensorfs::requests::fs::Fs, path: &str) -> u64 {
    path.split('/').fold(ROOT_INO, |parent, name| {
        fs.lookup(parent, name)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .ino
    })
}

fn names(core: &Core, path: &str) -> Vec<String> {
    let fs = core.fs();
    let dir = if path.is_empty() {
        ROOT_INO
    } else {
        ino(fs, path)
    };
    fs.readdir(dir, 0, 10_000, false)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != "." && n != "..")
        .collect()
}

async fn read_all(core: &Core, path: &str) -> Vec<u8> {
    let ino = ino(core.fs(), path);
    let size = core.fs().getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = core.read_ino(ino, out.len() as u64, 100_000).await.unwrap();
        assert!(!chunk.is_empty(), "{path}: short at {}", out.len());
        out.extend(chunk);
    }
    assert_eq!(
        core.read_ino(ino, size, 10).await.unwrap(),
        b"",
        "{path}: data past its size"
    );
    out
}

/// The tensor `name` of a safetensors file, as raw bytes.
fn tensor<'a>(file: &'a [u8], name: &str) -> &'a [u8] {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (a, b) = (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap());
    &file[8 + n + a as usize..8 + n + b as usize]
}

fn ids(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Batch `i` of `epoch`'s ids, as the plan says.
fn planned(d: &Dataset, epoch: u64, i: u64) -> Vec<i64> {
    let plan = &d.plan;
    plan.batch_rows(&plan.epoch(epoch), i)
        .into_iter()
        .map(|r| r as i64)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_lists_epochs_batches_and_one_open_files() {
    let m = mount(store().await, "batch_size=100,epochs=2,world_size=2").await;
    let root = names(&m.fs, "");
    for want in ["dataset.json", ".tensorfs", "gds", "epoch-0", "epoch-1"] {
        assert!(root.contains(&want.to_string()), "{root:?}");
    }
    let epoch = names(&m.fs, "epoch-0");
    // 520 rows: 6 batches (the last of 20 rows), each a file and a directory, the one-open
    // files, and the rank views.
    assert_eq!(epoch.len(), 6 * 2 + 2 + 2, "{epoch:?}");
    assert!(epoch.contains(&"000005.safetensors".to_string()));
    assert!(epoch.contains(&"all.safetensors".to_string()));
    assert_eq!(names(&m.fs, "epoch-0/000003"), ["id.npy", "x.npy"]);
    assert_eq!(names(&m.fs, "epoch-0/all"), ["id.npy", "x.npy"]);
    assert_eq!(names(&m.fs, "epoch-1/rank-1-of-2").len(), 3 * 2 + 2);
    // The daemon's own listings (of the files it stores) get a directory's batches alone, from
    // any batch's entries on: the rank views after them are not made for them.
    let e1 = ino(m.fs.fs(), "epoch-1");
    let own = |from: u64| -> Vec<String> {
        let at = layout::DOT_ENTRIES + layout::batch_file_entry(from);
        let entries = m.fs.fs().readdir(e1, at, 10_000, true).unwrap();
        entries.into_iter().map(|e| e.name).collect()
    };
    assert_eq!(own(0).len(), 6 * 2, "{:?}", own(0));
    assert_eq!(
        own(4),
        [
            "000004.safetensors",
            "000004",
            "000005.safetensors",
            "000005"
        ]
    );
    // Any epoch resolves by name; a batch past the end does not.
    assert!(m.fs.fs().lookup(ROOT_INO, "epoch-99").is_ok());
    let e0 = ino(m.fs.fs(), "epoch-0");
    assert_eq!(
        m.fs.fs()
            .lookup(e0, "000006.safetensors")
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
    assert_eq!(
        m.fs.fs().lookup(e0, "06.safetensors").unwrap_err().errno(),
        libc::ENOENT
    );
    let gds = ino(m.fs.fs(), "gds/epoch-0/000001.safetensors");
    assert_eq!(m.fs.fs().getattr(gds).unwrap().kind, EntryType::Symlink);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_read_and_opened_are_the_plans_rows() {
    let m = mount(
        store().await,
        "batch_size=100,epochs=2,shuffle=window,shuffle_window=2",
    )
    .await;
    for epoch in 0..2 {
        let mut seen = Vec::new();
        for i in 0..6 {
            let path = format!("epoch-{epoch}/{i:06}.safetensors");
            let bytes = read_all(&m.fs, &path).await;
            let got = ids(tensor(&bytes, "id"));
            assert_eq!(got, planned(&m.dataset, epoch, i), "{path}");
            // Opened: materialised on the cache, byte for byte what reads give.
            let (file, _) =
                m.fs.materialize(ino(m.fs.fs(), &path))
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(std::fs::read(file_path(&file)).unwrap(), bytes, "{path}");
            let npy = read_all(&m.fs, &format!("epoch-{epoch}/{i:06}/id.npy")).await;
            assert_eq!(&npy[4096..], tensor(&bytes, "id"));
            seen.extend(got);
        }
        seen.sort();
        assert_eq!(seen, (0..520).collect::<Vec<_>>(), "epoch {epoch}");
    }
    // The one-open files are the batches back to back.
    let all = read_all(&m.fs, "epoch-1/all/id.npy").await;
    let want: Vec<i64> = (0..6).flat_map(|i| planned(&m.dataset, 1, i)).collect();
    assert_eq!(ids(&all[4096..]), want);
    let all = read_all(&m.fs, "epoch-1/all.safetensors").await;
    assert_eq!(ids(tensor(&all, "id")), want);
}

fn file_path(f: &std::fs::File) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_smaller_than_the_epoch_stays_within_its_size_and_serves_the_right_bytes() {
    let m = mount(
        store().await,
        "batch_size=50,epochs=3,cache_size=24K,prefetch=2",
    )
    .await;
    let cache = m.dataset.stats.clone();
    for epoch in 0..3 {
        for i in 0..11 {
            let path = format!("epoch-{epoch}/{i:06}.safetensors");
            m.fs.materialize(ino(m.fs.fs(), &path)).await.unwrap();
            let bytes = read_all(&m.fs, &path).await;
            assert_eq!(
                ids(tensor(&bytes, "id")),
                planned(&m.dataset, epoch, i),
                "{path}"
            );
            let json = cache.to_json();
            let (used, cap) = (
                json["cache_bytes"].as_u64(),
                json["cache_capacity"].as_u64(),
            );
            assert!(used <= cap, "{path}: cache at {used:?} of {cap:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_fault_is_eio_for_that_read_and_the_mount_goes_on() {
    let store = store().await;
    let m = mount(store.clone(), "batch_size=100,shuffle=none,prefetch=0").await;
    store.failing.store(true, Ordering::SeqCst);
    let i = ino(m.fs.fs(), "epoch-0/000002.safetensors");
    let e = m.fs.read_ino(i, 0, 4096).await.unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("connection reset"), "{e}");
    assert_eq!(m.fs.materialize(i).await.unwrap_err().errno(), libc::EIO);
    store.failing.store(false, Ordering::SeqCst);
    let bytes = read_all(&m.fs, "epoch-0/000002.safetensors").await;
    assert_eq!(ids(tensor(&bytes, "id")), (200..300).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_under_the_mount_is_never_served() {
    let store = store().await;
    let m = mount(store.clone(), "batch_size=100,shuffle=none,prefetch=0").await;
    store
        .put(
            &Path::from("data/b.parquet"),
            parquet(10_000, 220, 64).into(),
        )
        .await
        .unwrap();
    // Batch 4 is rows 400..500, all from b.
    let e =
        m.fs.read_ino(ino(m.fs.fs(), "epoch-0/000004.safetensors"), 0, 4096)
            .await
            .unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("changed under the mount"), "{e}");
    // What a is still serves.
    let bytes = read_all(&m.fs, "epoch-0/000001.safetensors").await;
    assert_eq!(ids(tensor(&bytes, "id")), (100..200).collect::<Vec<_>>());
}

/// A one-open file is read tensor by tensor: each read gathers only the tensor it spans (no
/// whole batch is built for it), and a middle range builds only its batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_open_files_gather_only_the_tensors_and_batches_they_span() {
    let m = mount(
        store().await,
        "batch_size=100,epochs=2,shuffle=window,prefetch=0",
    )
    .await;
    let stat = |k: &str| m.dataset.stats.to_json()[k].as_u64().unwrap();
    let all = read_all(&m.fs, "epoch-1/all.safetensors").await;
    let want: Vec<i64> = (0..6).flat_map(|i| planned(&m.dataset, 1, i)).collect();
    assert_eq!(ids(tensor(&all, "id")), want);
    let xs: Vec<f32> = tensor(&all, "x")
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(xs, want.iter().map(|&i| i as f32 / 2.0).collect::<Vec<_>>());
    // Each tensor of each batch once (6 batches, 2 tensors), and no whole batch.
    assert_eq!(stat("tensors_gathered"), 12);
    assert_eq!(
        stat("batches_built"),
        12,
        "no whole batch for a one-open file"
    );

    // Rows 250..260 of epoch 0's all/id.npy lie in batch 2 alone.
    let ino = ino(m.fs.fs(), "epoch-0/all/id.npy");
    let got = m.fs.read_ino(ino, 4096 + 250 * 8, 80).await.unwrap();
    assert_eq!(ids(&got), planned(&m.dataset, 0, 2)[50..60]);
    assert_eq!(stat("tensors_gathered"), 13, "tensor id of batch 2 alone");
    let file = read_all(&m.fs, "epoch-0/000002.safetensors").await;
    assert_eq!(ids(tensor(&file, "id")), planned(&m.dataset, 0, 2));
    assert_eq!(
        stat("batches_built"),
        14,
        "the batch file's own build, none other"
    );
}

/// A reader of several `all/NAME.npy` files reads each batch's tensors one file after another:
/// the tensors the reader reads are gathered together, one job a batch, not one a tensor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tensors_read_through_all_npy_files_are_gathered_together() {
    let m = mount(store().await, "batch_size=100,shuffle=global,prefetch=0").await;
    let stat = |k: &str| m.dataset.stats.to_json()[k].as_u64().unwrap();
    let (id, x) = (
        ino(m.fs.fs(), "epoch-0/all/id.npy"),
        ino(m.fs.fs(), "epoch-0/all/x.npy"),
    );
    for i in 0..6u64 {
        let want = planned(&m.dataset, 0, i);
        let got = m.fs.read_ino(id, 4096 + i * 800, 800).await.unwrap();
        assert_eq!(ids(&got), want, "id of batch {i}");
        let got = m.fs.read_ino(x, 4096 + i * 400, 400).await.unwrap();
        let xs: Vec<f32> = got
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(xs, want.iter().map(|&r| r as f32 / 2.0).collect::<Vec<_>>());
    }
    // Batch 0: id alone (x not read yet), then x alone; every later batch: both in one job.
    assert_eq!(stat("tensors_gathered"), 12);
    assert_eq!(stat("batches_built"), 7);
}

/// Epoch 0's batch files materialised on `cache` by a mount that then ends: the ids they hold,
/// in batch order.
async fn materialize_epoch_0(options: &str, cache: &std::path::Path) -> Vec<i64> {
    let (fs, dataset) = mount_on(store().await, options, cache).await;
    let mut want = Vec::new();
    for i in 0..6 {
        let path = format!("epoch-0/{i:06}.safetensors");
        fs.materialize(ino(fs.fs(), &path))
            .await
            .unwrap()
            .expect("materialised");
        want.extend(planned(&dataset, 0, i));
    }
    want
}

/// After a remount, a one-open file reads the batches' materialised files: nothing is decoded
/// or fetched again (with `shuffle=none` no columns are cached beside the batch files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_remount_reads_one_open_files_from_the_batch_files() {
    let cache = tempfile::tempdir().unwrap();
    // The prefetcher follows the one-open reader too: it must not gather what is on disk.
    let options = "batch_size=100,shuffle=none";
    let want = materialize_epoch_0(options, cache.path()).await;
    let (fs, dataset) = mount_on(store().await, options, cache.path()).await;
    let stat = |k: &str| dataset.stats.to_json()[k].as_u64().unwrap();
    let decoded = stat("row_groups_decoded");
    let all = read_all(&fs, "epoch-0/all.safetensors").await;
    assert_eq!(ids(tensor(&all, "id")), want);
    let npy = read_all(&fs, "epoch-0/all/x.npy").await;
    assert_eq!(&npy[4096..], tensor(&all, "x"));
    // Let anything the prefetcher started finish before counting.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(stat("row_groups_decoded"), decoded, "nothing decoded again");
    assert_eq!(stat("batches_built"), 0, "nothing gathered again");
}

/// A one-open file built ahead on a remount whose cache holds the batch files (and, with
/// `shuffle=none`, no columns) copies their tensors: nothing is fetched, decoded or gathered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_open_file_built_on_a_warm_remount_is_taken_from_the_batch_files() {
    let cache = tempfile::tempdir().unwrap();
    // With `epochs=2` and `shuffle=none` the file read is built ahead (epoch 1 is epoch 0's).
    let options = "batch_size=100,shuffle=none,epochs=2";
    let want = materialize_epoch_0(options, cache.path()).await;
    let (fs, dataset) = mount_on(store().await, options, cache.path()).await;
    let stat = |k: &str| dataset.stats.to_json()[k].as_u64().unwrap();
    let decoded = stat("row_groups_decoded");
    let all = read_all(&fs, "epoch-0/all.safetensors").await;
    assert_eq!(ids(tensor(&all, "id")), want);
    let started = std::time::Instant::now();
    while stat("ahead_files_built") == 0 && started.elapsed().as_secs() < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(stat("ahead_files_built"), 1, "the file read is built");
    assert_eq!(
        stat("row_groups_decoded"),
        decoded,
        "its build decoded nothing"
    );
    assert_eq!(stat("batches_built"), 0, "nothing gathered");
    let kept = walk(cache.path())
        .into_iter()
        .find(|p| p.ends_with("all/epoch-0.safetensors"))
        .expect("the built file is kept in the cache");
    assert_eq!(
        std::fs::read(kept).unwrap(),
        all,
        "its bytes are the file read"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        match path.is_dir() {
            true => found.extend(walk(&path)),
            false => found.push(path),
        }
    }
    found
}

/// `n` files of 100 rows (row groups of 50): rows 100·k.. of file k.
async fn store_of(n: usize) -> Arc<Flaky> {
    let store = Arc::new(Flaky::default());
    for k in 0..n as i64 {
        let path = Path::from(format!("data/part-{k:02}.parquet"));
        store
            .put(&path, parquet(100 * k, 100, 50).into())
            .await
            .unwrap();
    }
    store
}

/// The core over what `pinned` (a snapshot's bytes) pins of `store`'s dataset.
async fn mount_pinned(
    store: Arc<Flaky>,
    pinned: &[u8],
    options: &str,
    cache: &std::path::Path,
) -> (Arc<Core>, Dataset) {
    let opts = Options::parse(&[
        options.to_string(),
        format!("cache_dir={}", cache.display()),
    ])
    .unwrap();
    let stats = Arc::new(Stats::default());
    let url = url::Url::parse("memory:///data").unwrap();
    let pinned = tensorfs::source::snapshot::decode(pinned, "train.snapshot").unwrap();
    let source =
        Source::pinned_over(store, &url, "memory:///data", pinned, None, stats.clone()).unwrap();
    let dataset = Dataset::over(Arc::new(source), &opts, stats).await.unwrap();
    dataset.check().unwrap();
    let (fs, serve) = dataset
        .filesystem(&opts, tokio::runtime::Handle::current())
        .unwrap();
    (
        Arc::new(Requests::new(Arc::new(fs), serve, true, false)),
        dataset,
    )
}

async fn dataset_json(fs: &Core) -> serde_json::Value {
    serde_json::from_slice(&read_all(fs, "dataset.json").await).unwrap()
}

/// A host mounting a snapshot lists nothing and reads no footer at mount; reading its rank's
/// view it touches only its partitions' objects; every byte is the listing mount's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_mount_lists_nothing_and_touches_only_its_share() {
    let options = "batch_size=50,partitions=4,world_size=4,prefetch=0";
    // 32 objects: 8 a partition, so that each partition's home holds whole objects.
    let store = store_of(32).await;
    let listed = mount(store.clone(), options).await;
    let snapshot =
        tensorfs::source::snapshot::encode(&listed.dataset.source, &listed.dataset.view).unwrap();
    let batches = listed.dataset.plan.batches();
    let mut want = Vec::new();
    for i in 0..batches {
        want.push(read_all(&listed.fs, &format!("epoch-0/{i:06}.safetensors")).await);
    }
    store.reset_counts();
    let cache = tempfile::tempdir().unwrap();
    let (fs, dataset) = mount_pinned(store.clone(), &snapshot, options, cache.path()).await;
    assert_eq!(
        store.lists.load(Ordering::SeqCst),
        0,
        "a snapshot mount lists"
    );
    assert_eq!(store.objects_read(), Vec::<String>::new(), "read at mount");
    assert_eq!(
        dataset.source.fingerprint(),
        listed.dataset.source.fingerprint()
    );
    let json = dataset_json(&fs).await;
    assert_eq!(json["origin"]["from"], "snapshot");
    assert_eq!(json["origin"]["objects_touched"], 0);
    // Rank 1 of 4 reads partition 1: the objects the plan gives it (whole objects drawn from
    // the seed, and the row groups it borrows to fill its batches), and no other.
    let rank = dataset.plan.rank_batches(4);
    for i in 0..rank {
        let bytes = read_all(&fs, &format!("epoch-0/rank-1-of-4/{i:06}.safetensors")).await;
        let global = i * 4 + 1;
        assert_eq!(bytes, want[global as usize], "rank batch {i}");
    }
    assert!(dataset.plan.whole_objects());
    let mut own: Vec<String> = (dataset.plan.partition_row_groups(1))
        .map(|g| format!("data/part-{:02}.parquet", g / 2))
        .collect();
    own.dedup();
    assert_eq!(store.objects_read(), own);
    assert!(own.len() < 16, "partition 1 draws from {own:?}");
    for (i, want) in want.iter().enumerate() {
        let bytes = read_all(&fs, &format!("epoch-0/{i:06}.safetensors")).await;
        assert_eq!(&bytes, want, "batch {i}");
    }
    assert_eq!(dataset_json(&fs).await["origin"]["objects_touched"], 32);
}

/// A table that grows keeps its caches (PRODUCT.md §8): four hosts read their rank views of
/// snapshot 1, objects are added (keys sorting before, between and after the old ones), and the
/// same hosts remount snapshot 2 on the same caches: together they fetch the new objects and
/// little else, at most a quarter of the first day's bytes, and serve the listing's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_table_on_the_same_caches_fetches_what_is_new() {
    let options = "batch_size=50,partitions=4,world_size=4,prefetch=0";
    let store = Arc::new(Flaky::default());
    let put = |name: String, start: i64| {
        let store = store.clone();
        async move {
            let path = Path::from(format!("data/{name}"));
            store
                .put(&path, parquet(start, 100, 50).into())
                .await
                .unwrap();
        }
    };
    for k in 0..32 {
        put(format!("b-{k:02}.parquet"), 100 * k).await;
    }
    let caches: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut fetched = Vec::new();
    for day in 0..2 {
        if day == 1 {
            for (i, name) in [
                "a-00.parquet",
                "b-05x.parquet",
                "b-20x.parquet",
                "c-00.parquet",
            ]
            .into_iter()
            .enumerate()
            {
                put(name.to_string(), 10_000 + 100 * i as i64).await;
            }
        }
        let listed = mount(store.clone(), options).await;
        let snapshot =
            tensorfs::source::snapshot::encode(&listed.dataset.source, &listed.dataset.view)
                .unwrap();
        let want: Vec<Vec<u8>> = {
            let mut want = Vec::new();
            for i in 0..listed.dataset.plan.batches() {
                want.push(read_all(&listed.fs, &format!("epoch-0/{i:06}.safetensors")).await);
            }
            want
        };
        store.reset_counts();
        let mut read = std::collections::BTreeSet::new();
        for (rank, cache) in caches.iter().enumerate() {
            let (fs, dataset) = mount_pinned(store.clone(), &snapshot, options, cache.path()).await;
            for j in 0..dataset.plan.rank_batches(4) {
                let path = format!("epoch-0/rank-{rank}-of-4/{j:06}.safetensors");
                let global = j * 4 + rank as u64;
                assert_eq!(
                    read_all(&fs, &path).await,
                    want[global as usize],
                    "day {day} {path}"
                );
            }
            read.extend(store.objects_read());
        }
        fetched.push(store.bytes.load(Ordering::SeqCst));
        if day == 1 {
            for new in ["a-00", "b-05x", "b-20x", "c-00"] {
                assert!(
                    read.contains(&format!("data/{new}.parquet")),
                    "{new} was not read: {read:?}"
                );
            }
        }
    }
    let (first, second) = (fetched[0], fetched[1]);
    assert!(
        second * 4 <= first,
        "day 2 fetched {second} bytes, day 1 {first}: more than a quarter"
    );
}

/// The listing of `store`'s dataset, taking what `from` pinned where it can.
async fn listed(store: Arc<Flaky>, from: Option<&Pinned>) -> Source {
    let url = url::Url::parse("memory:///data").unwrap();
    let listing = Listing {
        from,
        ..Listing::default()
    };
    let stats = Arc::new(Stats::default());
    Source::over(
        store,
        &url,
        Path::from("data"),
        "memory:///data",
        stats,
        listing,
    )
    .await
    .unwrap()
}

/// What a snapshot of `source` (with the default options) pins.
async fn pinned_by(source: &Source) -> Pinned {
    let opts = Options::parse::<&str>(&[]).unwrap();
    let view = tensorfs::source::view::build(source, &opts).await.unwrap();
    let bytes = tensorfs::source::snapshot::encode(source, &view).unwrap();
    tensorfs::source::snapshot::decode(&bytes, "test.snapshot").unwrap()
}

/// `tensorfs snapshot --from OLD` of a grown table reads the footers of the new objects only
/// (and of one replaced), and pins what a snapshot reading every footer pins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_from_an_earlier_one_reads_only_the_new_footers() {
    let store = store_of(12).await;
    let old = pinned_by(&listed(store.clone(), None).await).await;
    for (name, start) in [
        ("part-00a.parquet", 5000),
        ("part-05a.parquet", 6000),
        ("part-99.parquet", 7000),
    ] {
        let path = Path::from(format!("data/{name}"));
        store
            .put(&path, parquet(start, 100, 50).into())
            .await
            .unwrap();
    }
    let replaced = Path::from("data/part-03.parquet");
    store
        .put(&replaced, parquet(300, 150, 50).into())
        .await
        .unwrap();
    store.reset_counts();
    let grown = listed(store.clone(), Some(&old)).await;
    let read: Vec<String> = (store.objects_read().into_iter())
        .filter(|o| o.ends_with(".parquet"))
        .collect();
    assert_eq!(
        read,
        [
            "data/part-00a.parquet",
            "data/part-03.parquet",
            "data/part-05a.parquet",
            "data/part-99.parquet"
        ]
    );
    let fresh = listed(store.clone(), None).await;
    assert_eq!(grown.fingerprint(), fresh.fingerprint());
    let (mut a, b) = (
        pinned_by(&grown).await.catalog,
        pinned_by(&fresh).await.catalog,
    );
    assert_eq!(a.objects, b.objects);
    // The memory footers take is the earlier snapshot's share for the objects taken from it.
    let ratio = a.facts.footer_memory as f64 / b.facts.footer_memory as f64;
    assert!((0.8..1.25).contains(&ratio), "footer memory {ratio}");
    a.facts.footer_memory = b.facts.footer_memory;
    assert_eq!(a.facts, b.facts);
    assert_eq!(a.schema, b.schema);
}

/// Objects added, replaced or removed after the snapshot change nothing a mount of it shows:
/// the reads that need a changed object fail with EIO, saying so; the others are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_pins_the_dataset_whatever_changes_after() {
    let options = "batch_size=100,shuffle=none,prefetch=0";
    let store = store().await;
    let listed = mount(store.clone(), options).await;
    let snapshot =
        tensorfs::source::snapshot::encode(&listed.dataset.source, &listed.dataset.view).unwrap();
    let first = read_all(&listed.fs, "epoch-0/000001.safetensors").await;
    store
        .put(&Path::from("data/c.parquet"), parquet(520, 80, 64).into())
        .await
        .unwrap();
    store
        .put(&Path::from("data/b.parquet"), parquet(300, 220, 64).into())
        .await
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (fs, dataset) = mount_pinned(store.clone(), &snapshot, options, cache.path()).await;
    assert_eq!(dataset.plan.rows(), 520);
    assert_eq!(names(&fs, "epoch-0").len(), 6 * 2 + 2);
    assert_eq!(read_all(&fs, "epoch-0/000001.safetensors").await, first);
    // Batch 4 is rows 400..500, all from b, written again (same rows, another version).
    let e = fs
        .read_ino(ino(fs.fs(), "epoch-0/000004.safetensors"), 0, 4096)
        .await
        .unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    let said = e.to_string();
    assert!(
        said.contains("data/b.parquet") && said.contains("changed since the snapshot"),
        "{said}"
    );
    store
        .inner
        .delete(&Path::from("data/a.parquet"))
        .await
        .unwrap();
    let e = fs
        .read_ino(ino(fs.fs(), "epoch-0/000002.safetensors"), 0, 4096)
        .await
        .unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("changed since the snapshot"), "{e}");
}

/// A snapshot file that is not one, is cut short or damaged is refused, saying which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_snapshots_are_refused() {
    let listed = mount(store().await, "batch_size=100").await;
    let good =
        tensorfs::source::snapshot::encode(&listed.dataset.source, &listed.dataset.view).unwrap();
    let refusal = |bytes: &[u8]| match tensorfs::source::snapshot::decode(bytes, "s") {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    assert!(tensorfs::source::snapshot::decode(&good, "s").is_ok());
    assert_eq!(
        refusal(b"PAR1...."),
        "snapshot 's' is not a tensorfs snapshot"
    );
    assert!(refusal(&good[..good.len() - 10]).contains("is truncated"));
    assert!(refusal(&good[..30]).contains("is truncated"));
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    assert!(refusal(&flipped).contains("is damaged"));
    let mut newer = good.clone();
    newer[18] = 9;
    assert!(refusal(&newer).contains("format 9"));
}

/// Hands out passthrough ids 0, 1, … as the kernel registers backing files.
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl Registrar for Counting {
    type Id = usize;

    fn register(&self, _file: &std::fs::File) -> std::io::Result<usize> {
        Ok(self.0.fetch_add(1, Ordering::SeqCst))
    }
}

async fn answered<T>(answer: Answer<T>) -> T {
    let (value, then) = match answer {
        Answer::Now(value, then) => (value, then),
        Answer::Later(ready) => ready.await,
    };
    then.run();
    value
}

/// Opens `path` through `requests`: its handle and how it is served (the passthrough id).
async fn open(
    requests: &Arc<Requests<usize>>,
    registered: &Arc<std::sync::atomic::AtomicUsize>,
    path: &str,
    flags: i32,
) -> tensorfs::error::Result<(u64, Option<usize>, bool)> {
    let ino = ino(requests.fs(), path);
    let (_, opened) = answered(requests.open(ino, flags, Counting(registered.clone()))).await;
    let opened = opened?;
    let (id, direct) = match opened.served {
        Served::Passthrough(id) => (Some(*id), false),
        Served::Cached => (None, false),
        Served::Direct => (None, true),
    };
    Ok((opened.fh, id, direct))
}

async fn read_fh(requests: &Arc<Requests<usize>>, path: &str, fh: u64) -> Vec<u8> {
    let ino = ino(requests.fs(), path);
    let size = requests.fs().getattr(ino).unwrap().size;
    answered(requests.read(ino, fh, 0, size as u32 + 10))
        .await
        .unwrap()
}

/// The open protocol without a kernel: how each file kind is opened and served, passthrough
/// ids shared by an inode's opens, refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_are_answered_by_the_core_for_every_file_kind() {
    let Mounted {
        fs: requests,
        _cache,
        ..
    } = mount(store().await, "batch_size=100,prefetch=0").await;
    let (fs, serve) = (requests.fs().clone(), requests.serve().clone());
    let registered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let batch = "epoch-0/000001.safetensors";
    let want = read_all(&requests, batch).await;

    // A batch file: materialised, then handed to the kernel by passthrough; a second open of
    // the inode shares its id; once both are closed a new open registers anew.
    let (a, id_a, _) = open(&requests, &registered, batch, libc::O_RDONLY)
        .await
        .unwrap();
    let (b, id_b, _) = open(&requests, &registered, batch, libc::O_RDONLY)
        .await
        .unwrap();
    assert_eq!((id_a, id_b), (Some(0), Some(0)));
    let batch_ino = ino(&fs, batch);
    requests.release(batch_ino, a);
    requests.release(batch_ino, b);
    let (_, id_c, _) = open(&requests, &registered, batch, libc::O_RDONLY)
        .await
        .unwrap();
    assert_eq!(id_c, Some(1));

    // stats.json: read afresh per open, from the snapshot its open took.
    let (fh, id, direct) = open(
        &requests,
        &registered,
        ".tensorfs/stats.json",
        libc::O_RDONLY,
    )
    .await
    .unwrap();
    assert!(id.is_none() && direct);
    let stats: serde_json::Value =
        serde_json::from_slice(&read_fh(&requests, ".tensorfs/stats.json", fh).await).unwrap();
    assert!(stats["opens"].as_u64().unwrap() >= 3, "{stats}");

    // dataset.json and the one-open files: served by the daemon, the kernel keeping the pages.
    let (fh, id, direct) = open(&requests, &registered, "dataset.json", libc::O_RDONLY)
        .await
        .unwrap();
    assert!(id.is_none() && !direct);
    assert_eq!(
        read_fh(&requests, "dataset.json", fh).await,
        read_all(&requests, "dataset.json").await
    );
    let all = "epoch-0/all/id.npy";
    let (fh, id, _) = open(&requests, &registered, all, libc::O_RDONLY)
        .await
        .unwrap();
    assert!(id.is_none());
    assert_eq!(
        read_fh(&requests, all, fh).await,
        read_all(&requests, all).await
    );

    // Without passthrough, a batch file is read through its handle from the daemon.
    let daemon = Arc::new(Requests::<usize>::new(
        fs.clone(),
        serve.clone(),
        false,
        false,
    ));
    let (fh, id, _) = open(&daemon, &registered, batch, libc::O_RDONLY)
        .await
        .unwrap();
    assert!(id.is_none());
    assert_eq!(read_fh(&daemon, batch, fh).await, want);
    assert_eq!(registered.load(Ordering::SeqCst), 2);

    // Refusals: writing, a directory; with opens=kernel every open is the kernel's, and reads
    // come by inode.
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        let e = open(&requests, &registered, batch, flags)
            .await
            .unwrap_err();
        assert_eq!(e.errno(), libc::EROFS);
    }
    let e = open(&requests, &registered, "epoch-0", libc::O_RDONLY)
        .await
        .unwrap_err();
    assert_eq!(e.errno(), libc::EISDIR);
    let kernel = Arc::new(Requests::<usize>::new(
        fs.clone(),
        serve.clone(),
        true,
        true,
    ));
    let e = open(&kernel, &registered, batch, libc::O_RDONLY)
        .await
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOSYS);
    assert_eq!(read_fh(&kernel, batch, 0).await, want);
}
