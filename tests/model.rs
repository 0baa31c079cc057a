//! Model-based test of a real mount: random sequences of stat, readdir, read (at random offsets
//! and sizes), readlink and getxattr against the mounted filesystem and a reference model,
//! compared after every step, across option sets (shuffle modes, batch sizes, rank views,
//! casts, drop_last). The model computes every file from the row ids alone: the dataset's
//! values are functions of the row id, and the order comes from the epoch plan, which is
//! property-tested on its own.
//!
//! The mount's test needs root and /dev/fuse (as CI has); elsewhere it says so and passes
//! vacuously. The same model is checked against the filesystem core in process
//! (`the_core_matches_the_model`), which needs neither: a fake kernel keeps the pages the
//! daemon stores in its page cache (a shuffled epoch's batch files), and reads find them there
//! first, as they would in the kernel.

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use arrow::datatypes::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tensorfs::model::dtype::DType;
use tensorfs::model::partitions::PlanFile;
use tensorfs::model::plan::{OrderOptions, Plan, Shuffle};
use tensorfs::mount::Dataset;
use tensorfs::options::Options;
use tensorfs::read::follow::page_cache::{Kernel, PageCache};
use tensorfs::read::format::{self, TensorLayout};
use tensorfs::requests::fs::{EntryType, ROOT_INO};
use tensorfs::requests::{Answer, Registrar, Requests, Served};

/// (rows, row group size) of each file.
const FILES: [(i64, usize); 3] = [(37, 10), (50, 16), (23, 23)];
const EPOCHS: u64 = 2;

fn write_dataset(dir: &Path) -> Vec<(String, Vec<u64>)> {
    let mut files = Vec::new();
    let mut start = 0i64;
    for (f, (rows, rg)) in FILES.iter().enumerate() {
        let ids: Vec<i64> = (start..start + rows).collect();
        let emb_values = Float32Array::from_iter_values(
            ids.iter()
                .flat_map(|&i| [i as f32, i as f32 + 1.0, i as f32 + 2.0]),
        );
        let emb = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            3,
            Arc::new(emb_values),
            None,
        );
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
            (
                "x",
                Arc::new(Float32Array::from_iter_values(
                    ids.iter().map(|&i| i as f32 * 0.5),
                )) as ArrayRef,
            ),
            ("emb", Arc::new(emb) as ArrayRef),
            (
                "flag",
                Arc::new(BooleanArray::from_iter(
                    ids.iter().map(|&i| Some(i % 3 == 0)),
                )) as ArrayRef,
            ),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(*rg))
            .build();
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let mut rg_rows = Vec::new();
        let mut left = *rows as u64;
        while left > 0 {
            rg_rows.push(left.min(*rg as u64));
            left -= left.min(*rg as u64);
        }
        files.push((format!("part-{f}.parquet"), rg_rows));
        start += rows;
    }
    files
}

#[derive(Clone, Debug)]
struct Config {
    shuffle: Shuffle,
    batch_size: u64,
    world: Option<u64>,
    drop_last: bool,
    cast_x: bool,
    seed: u64,
    partitions: u64,
}

impl Config {
    fn options(&self, cache: &Path) -> String {
        let mut o = format!(
            "shuffle={},batch_size={},seed={},epochs={EPOCHS},cache_dir={}",
            self.shuffle.name(),
            self.batch_size,
            self.seed,
            cache.display()
        );
        if let Some(w) = self.world {
            o += &format!(",world_size={w}");
        }
        if self.drop_last {
            o += ",drop_last";
        }
        if self.cast_x {
            o += ",cast=x:float64";
        }
        if self.partitions > 1 {
            o += &format!(",partitions={}", self.partitions);
        }
        o
    }
}

/// The model: what every path of the mount should be.
struct Model {
    plan: Plan,
    cfg: Config,
    names: Vec<&'static str>,
}

#[derive(Debug, PartialEq)]
enum Want {
    Missing,
    Dir(BTreeSet<String>),
    File(Vec<u8>),
    Symlink,
}

impl Model {
    fn x_dtype(&self) -> DType {
        if self.cfg.cast_x {
            DType::F64
        } else {
            DType::F32
        }
    }

    fn count(&self, world: Option<u64>) -> u64 {
        world.map_or(self.plan.batches(), |w| self.plan.rank_batches(w))
    }

    /// Every tensor's bytes for a batch, in view order.
    fn tensors(&self, epoch: u64, global: u64) -> Vec<(TensorLayout<'static>, Vec<u8>)> {
        let rows = self.plan.batch_rows(&self.plan.epoch(epoch), global);
        let b = rows.len();
        let mut id = Vec::new();
        let mut x = Vec::new();
        let mut emb = Vec::new();
        let mut flag = Vec::new();
        for &r in &rows {
            id.extend_from_slice(&(r as i64).to_le_bytes());
            let xv = r as f32 * 0.5;
            if self.cfg.cast_x {
                x.extend_from_slice(&(xv as f64).to_le_bytes());
            } else {
                x.extend_from_slice(&xv.to_le_bytes());
            }
            for k in 0..3 {
                emb.extend_from_slice(&(r as f32 + k as f32).to_le_bytes());
            }
            flag.push(u8::from(r % 3 == 0));
        }
        vec![
            (
                TensorLayout {
                    name: "id",
                    dtype: DType::I64,
                    shape: vec![b],
                },
                id,
            ),
            (
                TensorLayout {
                    name: "x",
                    dtype: self.x_dtype(),
                    shape: vec![b],
                },
                x,
            ),
            (
                TensorLayout {
                    name: "emb",
                    dtype: DType::F32,
                    shape: vec![b, 3],
                },
                emb,
            ),
            (
                TensorLayout {
                    name: "flag",
                    dtype: DType::Bool,
                    shape: vec![b],
                },
                flag,
            ),
        ]
    }

    fn safetensors(&self, epoch: u64, global: u64) -> Vec<u8> {
        let t = self.tensors(epoch, global);
        let layouts: Vec<TensorLayout<'_>> = t.iter().map(|(l, _)| l.clone()).collect();
        let mut out = format::safetensors_header(&layouts);
        for (_, data) in &t {
            out.extend_from_slice(data);
        }
        out
    }

    fn npy(&self, epoch: u64, global: u64, tensor: usize) -> Vec<u8> {
        let (l, data) = self.tensors(epoch, global).swap_remove(tensor);
        let mut out = format::npy_header(l.dtype, &l.shape);
        out.extend_from_slice(&data);
        out
    }

    fn batch_names(&self, count: u64) -> BTreeSet<String> {
        (0..count)
            .flat_map(|i| [format!("{i:06}"), format!("{i:06}.safetensors")])
            .chain(["all.safetensors".to_string(), "all".to_string()])
            .collect()
    }

    /// What `rel` (a path under the mount, or under its gds/) should be.
    fn want(&self, p: &Target) -> Want {
        let (count, global) = match p.rank {
            None => (self.count(None), p.batch),
            Some((r, w)) => (self.count(Some(w)), r + p.batch * w),
        };
        match p.file {
            FileSel::EpochDir => {
                let mut names = self.batch_names(count);
                if let (None, Some(w)) = (p.rank, self.cfg.world) {
                    names.extend((0..w).map(|r| format!("rank-{r}-of-{w}")));
                }
                Want::Dir(names)
            }
            _ if p.batch >= count => Want::Missing,
            FileSel::BatchDir => Want::Dir(self.names.iter().map(|n| format!("{n}.npy")).collect()),
            _ if p.gds => Want::Symlink,
            FileSel::Safetensors => Want::File(self.safetensors(p.epoch, global)),
            FileSel::Npy(t) => Want::File(self.npy(p.epoch, global, t)),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum FileSel {
    EpochDir,
    BatchDir,
    Safetensors,
    Npy(usize),
}

#[derive(Clone, Copy, Debug)]
struct Target {
    gds: bool,
    epoch: u64,
    rank: Option<(u64, u64)>,
    batch: u64,
    file: FileSel,
}

impl Target {
    fn rel(&self, names: &[&str]) -> PathBuf {
        let mut p = PathBuf::new();
        if self.gds {
            p.push("gds");
        }
        p.push(format!("epoch-{}", self.epoch));
        if let Some((r, w)) = self.rank {
            p.push(format!("rank-{r}-of-{w}"));
        }
        match self.file {
            FileSel::EpochDir => {}
            FileSel::BatchDir => p.push(format!("{:06}", self.batch)),
            FileSel::Safetensors => p.push(format!("{:06}.safetensors", self.batch)),
            FileSel::Npy(t) => {
                p.push(format!("{:06}", self.batch));
                p.push(format!("{}.npy", names[t]));
            }
        }
        p
    }
}

#[derive(Clone, Debug)]
enum Op {
    Stat(Target),
    ReadDir(Target),
    Read(Target, u64, usize),
    ReadAll(Target),
    Readlink(Target),
    Xattr(Target),
}

fn target() -> impl Strategy<Value = Target> {
    (
        any::<bool>(),
        0u64..EPOCHS + 1,
        prop_oneof![
            Just(None),
            (0u64..3).prop_map(|r| Some((r, 3))),
            Just(Some((1, 2)))
        ],
        0u64..30,
        prop_oneof![
            Just(FileSel::EpochDir),
            Just(FileSel::BatchDir),
            Just(FileSel::Safetensors),
            (0usize..4).prop_map(FileSel::Npy)
        ],
    )
        .prop_map(|(gds, epoch, rank, batch, file)| Target {
            gds,
            epoch,
            rank,
            batch,
            file,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        target().prop_map(Op::Stat),
        target().prop_map(Op::ReadDir),
        (target(), 0u64..9000, 1usize..9000).prop_map(|(t, o, n)| Op::Read(t, o, n)),
        target().prop_map(Op::ReadAll),
        target().prop_map(|t| Op::Readlink(Target { gds: true, ..t })),
        target().prop_map(|t| Op::Xattr(Target { gds: false, ..t })),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop_oneof![
            Just(Shuffle::None),
            Just(Shuffle::Window),
            Just(Shuffle::Block),
            Just(Shuffle::Global)
        ],
        3u64..40,
        prop_oneof![Just(None), Just(Some(2)), Just(Some(3))],
        any::<bool>(),
        any::<bool>(),
        0u64..4,
        prop_oneof![Just(1u64), Just(2), Just(6)],
    )
        .prop_map(
            |(shuffle, batch_size, world, drop_last, cast_x, seed, partitions)| Config {
                shuffle,
                batch_size,
                world,
                drop_last,
                cast_x,
                seed,
                partitions,
            },
        )
}

/// What a path is, as the model compares it.
#[derive(Debug)]
enum Stat {
    Dir,
    File(u64),
    Symlink,
}

/// The filesystem the model is checked against: a real mount, or the core in process (the same
/// requests the FUSE adapter makes, without a kernel).
trait Under {
    fn stat(&self, rel: &Path) -> std::io::Result<Stat>;
    fn read_dir(&self, rel: &Path) -> std::io::Result<BTreeSet<String>>;
    /// Opens `rel`, reads up to `len` bytes at `offset` (fewer only at its end), closes it.
    fn read(&self, rel: &Path, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
    fn readlink(&self, rel: &Path) -> std::io::Result<PathBuf>;
    /// `user.tensorfs.path`.
    fn path_xattr(&self, rel: &Path) -> std::io::Result<PathBuf>;
}

/// A live mount, unmounted when dropped.
struct Mounted {
    path: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
        if std::fs::read_to_string("/proc/self/mounts")
            .is_ok_and(|m| m.contains(self.path.to_str().unwrap()))
        {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

impl Under for Mounted {
    fn stat(&self, rel: &Path) -> std::io::Result<Stat> {
        let m = std::fs::symlink_metadata(self.path.join(rel))?;
        Ok(match m.file_type() {
            t if t.is_dir() => Stat::Dir,
            t if t.is_symlink() => Stat::Symlink,
            t if t.is_file() => Stat::File(m.len()),
            t => panic!("{rel:?}: a {t:?}"),
        })
    }

    fn read_dir(&self, rel: &Path) -> std::io::Result<BTreeSet<String>> {
        Ok(std::fs::read_dir(self.path.join(rel))?
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect())
    }

    fn read(&self, rel: &Path, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(self.path.join(rel))?;
        let size = f.metadata()?.len();
        let want = (size.saturating_sub(offset) as usize).min(len);
        let mut got = vec![0u8; want];
        let mut filled = 0;
        while filled < got.len() {
            let n = f.read_at(&mut got[filled..], offset + filled as u64)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        got.truncate(filled);
        Ok(got)
    }

    fn readlink(&self, rel: &Path) -> std::io::Result<PathBuf> {
        std::fs::read_link(self.path.join(rel))
    }

    fn path_xattr(&self, rel: &Path) -> std::io::Result<PathBuf> {
        xattr_path(&self.path.join(rel))
    }
}

/// The filesystem core in process: the requests of `tensorfs::requests` over the same
/// dataset and options, a passthrough read served from the backing file the kernel would have
/// been handed, and a read of a file whose pages the kernel keeps served from the pages the
/// daemon stored first.
struct Core {
    runtime: tokio::runtime::Runtime,
    requests: Arc<Requests<usize>>,
    backing: Arc<std::sync::Mutex<Vec<std::fs::File>>>,
    kernel: Arc<PageStore>,
}

const PAGE: u64 = 4096;

/// The kernel's page cache as far as the daemon's stores fill it: each inode's pages by offset.
/// There is no mount to call into: names are never known ahead (the daemon then stores a file
/// as it is opened, by the inode the open gave it).
#[derive(Default)]
struct PageStore {
    pages: std::sync::Mutex<HashMap<u64, BTreeMap<u64, Vec<u8>>>>,
}

impl Kernel for PageStore {
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        // The kernel fills pages: a store starts at one (only whole pages, and a file's last,
        // are marked filled).
        assert_eq!(offset % PAGE, 0, "a store at {offset} starts inside a page");
        let mut pages = self.pages.lock().unwrap();
        let file = pages.entry(ino).or_default();
        for (k, page) in bytes.chunks(PAGE as usize).enumerate() {
            file.insert(offset + k as u64 * PAGE, page.to_vec());
        }
        Ok(())
    }

    fn cached_ino(&self, _: &Path) -> Option<u64> {
        None
    }

    fn call_into_mount(&self, job: Box<dyn FnOnce() + Send>) -> std::io::Result<()> {
        job();
        Ok(())
    }
}

impl PageStore {
    /// The bytes from `at` on that inode `ino`'s stored page holding `at` has, if any.
    fn cached(&self, ino: u64, at: u64, len: usize) -> Option<Vec<u8>> {
        let pages = self.pages.lock().unwrap();
        let page = pages.get(&ino)?.get(&(at - at % PAGE))?;
        let from = (at % PAGE) as usize;
        (from < page.len()).then(|| page[from..page.len().min(from + len)].to_vec())
    }

    fn stored(&self, ino: u64) -> usize {
        self.pages
            .lock()
            .unwrap()
            .get(&ino)
            .map_or(0, BTreeMap::len)
    }
}

/// Registers backing files as the kernel would, keeping each to read it as the kernel does.
struct Keeping(Arc<std::sync::Mutex<Vec<std::fs::File>>>);

impl Registrar for Keeping {
    type Id = usize;

    fn register(&self, file: &std::fs::File) -> std::io::Result<usize> {
        let mut files = self.0.lock().unwrap();
        files.push(file.try_clone()?);
        Ok(files.len() - 1)
    }
}

fn errno(e: tensorfs::error::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.errno())
}

impl Core {
    fn new(data: &Path, options: &str) -> Result<Core, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let opts = Options::parse(&[options]).map_err(|e| e.to_string())?;
        let fs = runtime.block_on(async {
            let dataset = Dataset::open(data.to_str().unwrap(), &opts, None)
                .await
                .map_err(|e| e.to_string())?;
            dataset.check().map_err(|e| e.to_string())?;
            (dataset.filesystem(&opts, tokio::runtime::Handle::current()))
                .map_err(|e| e.to_string())
        })?;
        let (fs, serve) = fs;
        let kernel = Arc::new(PageStore::default());
        // No mount point: the daemon's calls into its mount (to make names known) fail, as
        // they may in a real mount, and opens store their files themselves.
        let mountpoint = Path::new("/nonexistent/tensorfs-in-process");
        serve.store_in(PageCache::new(kernel.clone(), mountpoint), false);
        let requests = Arc::new(Requests::new(Arc::new(fs), serve, true, false));
        Ok(Core {
            runtime,
            requests,
            backing: Arc::default(),
            kernel,
        })
    }

    fn ino(&self, rel: &Path) -> std::io::Result<u64> {
        let mut ino = ROOT_INO;
        for name in rel.iter() {
            ino = (self.requests.fs())
                .lookup(ino, name.to_str().unwrap())
                .map_err(errno)?
                .ino;
        }
        Ok(ino)
    }

    fn answered<T>(&self, answer: Answer<T>) -> T {
        let (value, then) = match answer {
            Answer::Now(value, then) => (value, then),
            Answer::Later(ready) => self.runtime.block_on(ready),
        };
        then.run();
        value
    }
}

impl Under for Core {
    fn stat(&self, rel: &Path) -> std::io::Result<Stat> {
        let attr = self.requests.fs().getattr(self.ino(rel)?).map_err(errno)?;
        Ok(match attr.kind {
            EntryType::Dir => Stat::Dir,
            EntryType::File => Stat::File(attr.size),
            EntryType::Symlink => Stat::Symlink,
        })
    }

    fn read_dir(&self, rel: &Path) -> std::io::Result<BTreeSet<String>> {
        let ino = self.ino(rel)?;
        let entries = self
            .requests
            .fs()
            .readdir(ino, 0, usize::MAX, false)
            .map_err(errno)?;
        Ok((entries.into_iter())
            .map(|e| e.name)
            .filter(|n| n != "." && n != "..")
            .collect())
    }

    fn read(&self, rel: &Path, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let ino = self.ino(rel)?;
        let size = self.requests.fs().getattr(ino).map_err(errno)?.size;
        let registrar = Keeping(self.backing.clone());
        let (_, opened) = self.answered(self.requests.open(ino, libc::O_RDONLY, registrar));
        let opened = opened.map_err(errno)?;
        let want = (size.saturating_sub(offset) as usize).min(len);
        let mut got = Vec::with_capacity(want);
        while got.len() < want {
            let at = offset + got.len() as u64;
            let chunk = match &opened.served {
                Served::Passthrough(id) => {
                    let file = &self.backing.lock().unwrap()[**id];
                    let mut buf = vec![0u8; (want - got.len()).min(1 << 20)];
                    let n = file.read_at(&mut buf, at)?;
                    buf.truncate(n);
                    buf
                }
                Served::Cached if self.kernel.stored(ino) > 0 => {
                    // A page the daemon stored, else a read of that page from the daemon.
                    let left = want - got.len();
                    match self.kernel.cached(ino, at, left) {
                        Some(bytes) => bytes,
                        None => {
                            let size = (PAGE - at % PAGE).min(left as u64) as u32;
                            let read = self.requests.read(ino, opened.fh, at, size);
                            self.answered(read).map_err(errno)?
                        }
                    }
                }
                _ => {
                    let size = (want - got.len()).min(1 << 17) as u32;
                    let read = self.requests.read(ino, opened.fh, at, size);
                    self.answered(read).map_err(errno)?
                }
            };
            if chunk.is_empty() {
                break;
            }
            got.extend(chunk);
        }
        self.requests.release(ino, opened.fh);
        Ok(got)
    }

    fn readlink(&self, rel: &Path) -> std::io::Result<PathBuf> {
        let ino = self.ino(rel)?;
        let target = (self.runtime)
            .block_on(self.requests.readlink(ino))
            .map_err(errno)?;
        Ok(PathBuf::from(std::ffi::OsString::from_vec(target)))
    }

    fn path_xattr(&self, rel: &Path) -> std::io::Result<PathBuf> {
        let ino = self.ino(rel)?;
        let path = (self.runtime)
            .block_on(self.requests.getxattr(ino, "user.tensorfs.path"))
            .map_err(errno)?;
        Ok(PathBuf::from(std::ffi::OsString::from_vec(path)))
    }
}

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/dev/fuse").exists()
}

/// Where the model's dataset and cache are, and the model of what every path should be.
struct Setup {
    tmp: tempfile::TempDir,
    model: Model,
}

impl Setup {
    fn new(cfg: &Config) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("data")).unwrap();
        let files = write_dataset(&tmp.path().join("data"));
        let order = OrderOptions {
            batch_size: cfg.batch_size,
            drop_last: cfg.drop_last,
            shuffle: cfg.shuffle,
            window: 4,
            block: tensorfs::model::plan::default_block(cfg.partitions),
            seed: cfg.seed,
            partitions: cfg.partitions,
        };
        let plan_files: Vec<PlanFile> = (files.iter())
            .map(|(key, rg_rows)| PlanFile { key, rg_rows })
            .collect();
        let model = Model {
            plan: Plan::new(&plan_files, order),
            cfg: cfg.clone(),
            names: vec!["id", "x", "emb", "flag"],
        };
        Setup { tmp, model }
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn cache(&self) -> PathBuf {
        self.tmp.path().join("cache")
    }
}

/// The model checked against a real mount.
fn check_mount(cfg: &Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let setup = Setup::new(cfg);
    let mnt = setup.tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args([
            "mount",
            setup.data().to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            &cfg.options(&setup.cache()),
        ])
        .output()
        .unwrap();
    prop_assert!(
        out.status.success(),
        "mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mounted = Mounted { path: mnt };
    check(&setup, &mounted, ops)
}

/// The model checked against the core in process.
fn check_core(cfg: &Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let setup = Setup::new(cfg);
    // As `tensorfs mount` makes it.
    std::fs::create_dir_all(setup.cache()).unwrap();
    let core = Core::new(&setup.data(), &cfg.options(&setup.cache()));
    prop_assert!(core.is_ok(), "the core refused: {:?}", core.err());
    check(&setup, &core.unwrap(), ops)
}

fn check(setup: &Setup, under: &dyn Under, ops: &[Op]) -> Result<(), TestCaseError> {
    let (model, cache) = (&setup.model, setup.cache());
    for (step, op) in ops.iter().enumerate() {
        let at = |t: &Target| t.rel(&model.names);
        let ctx = format!("step {step}: {op:?}");
        match op {
            Op::Stat(t) => match (model.want(t), under.stat(&at(t))) {
                (Want::Missing, Err(e)) => {
                    prop_assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{}", ctx)
                }
                (Want::Dir(_), Ok(Stat::Dir)) | (Want::Symlink, Ok(Stat::Symlink)) => {}
                (Want::File(bytes), Ok(Stat::File(len))) => {
                    prop_assert_eq!(len, bytes.len() as u64, "{}", ctx);
                }
                (want, got) => prop_assert!(false, "{}: want {:?}, got {:?}", ctx, want, got),
            },
            Op::ReadDir(t) => {
                let t = Target {
                    file: if matches!(t.file, FileSel::EpochDir) {
                        FileSel::EpochDir
                    } else {
                        FileSel::BatchDir
                    },
                    ..*t
                };
                match (model.want(&t), under.read_dir(&at(&t))) {
                    (Want::Dir(names), Ok(got)) => prop_assert_eq!(got, names, "{}", ctx),
                    (Want::Missing, Err(e)) => {
                        prop_assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{}", ctx)
                    }
                    (want, got) => {
                        prop_assert!(false, "{}: want {:?}, got {:?}", ctx, want, got.is_ok())
                    }
                }
            }
            Op::Read(t, ..) | Op::ReadAll(t)
                if !t.gds && matches!(t.file, FileSel::Safetensors | FileSel::Npy(_)) =>
            {
                let (offset, len) = match op {
                    Op::Read(_, o, n) => (*o, *n),
                    _ => (0, usize::MAX),
                };
                match (model.want(t), under.read(&at(t), offset, len)) {
                    (Want::File(bytes), Ok(got)) => {
                        let want_end = (offset as usize).saturating_add(len).min(bytes.len());
                        let want = bytes.get(offset as usize..want_end).unwrap_or(&[]);
                        prop_assert_eq!(got.len(), want.len(), "{}", ctx);
                        prop_assert!(got == want, "{}: bytes differ", ctx);
                    }
                    (Want::Missing, Err(e)) => {
                        prop_assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{}", ctx)
                    }
                    (want, got) => prop_assert!(
                        false,
                        "{}: want {:?}, got {:?}",
                        ctx,
                        matches!(want, Want::File(_)),
                        got.map(|g| g.len())
                    ),
                }
            }
            Op::Read(..) | Op::ReadAll(_) => {}
            Op::Readlink(t) | Op::Xattr(t)
                if matches!(t.file, FileSel::Safetensors | FileSel::Npy(_)) =>
            {
                let plain = Target { gds: false, ..*t };
                let got = match op {
                    Op::Readlink(_) => under.readlink(&at(t)),
                    _ => under.path_xattr(&at(t)),
                };
                match (model.want(&plain), got) {
                    (Want::File(bytes), Ok(target)) => {
                        prop_assert!(
                            target.starts_with(&cache),
                            "{}: {:?} is not in the cache",
                            ctx,
                            target
                        );
                        prop_assert!(
                            std::fs::read(&target).unwrap() == bytes,
                            "{}: the backing file differs",
                            ctx
                        );
                    }
                    (Want::Missing, Err(e)) => {
                        prop_assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{}", ctx)
                    }
                    (want, got) => prop_assert!(
                        false,
                        "{}: want {:?}, got {:?}",
                        ctx,
                        matches!(want, Want::File(_)),
                        got
                    ),
                }
            }
            Op::Readlink(_) | Op::Xattr(_) => {}
        }
    }
    Ok(())
}

fn xattr_path(path: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = c"user.tensorfs.path";
    let mut buf = vec![0u8; 4096];
    // SAFETY: c and name are valid C strings; buf is writable for its length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(std::ffi::OsString::from_vec(buf)))
}

use std::os::unix::ffi::OsStringExt;

/// The default shuffled epoch's open path, in process: a batch file's open is answered for the
/// kernel to keep its pages, its bytes are stored in the page cache (not written to the cache
/// directory), and what a reader then gets, stored pages first, is the model's file.
#[test]
fn a_shuffled_epoch_s_batch_files_are_stored_in_the_page_cache() {
    let cfg = Config {
        shuffle: Shuffle::Block,
        batch_size: 16,
        world: None,
        drop_last: false,
        cast_x: false,
        seed: 7,
        partitions: 1,
    };
    let setup = Setup::new(&cfg);
    std::fs::create_dir_all(setup.cache()).unwrap();
    let core = Core::new(&setup.data(), &cfg.options(&setup.cache())).unwrap();
    for i in 0..3u64 {
        let target = Target {
            gds: false,
            epoch: 1,
            rank: None,
            batch: i,
            file: FileSel::Safetensors,
        };
        let rel = target.rel(&setup.model.names);
        let ino = core.ino(&rel).unwrap();
        let registrar = Keeping(core.backing.clone());
        let (_, opened) = core.answered(core.requests.open(ino, libc::O_RDONLY, registrar));
        let opened = opened.unwrap();
        assert!(
            matches!(opened.served, Served::Cached),
            "batch {i}: not left to the kernel's pages"
        );
        core.requests.release(ino, opened.fh);
        // The open stores the file before it answers; a moment is allowed for a store that a
        // build ends just after.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while core.kernel.stored(ino) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            core.kernel.stored(ino) > 0,
            "batch {i}: nothing stored in the page cache"
        );
        let want = setup.model.want(&target);
        let got = core.read(&rel, 0, usize::MAX).unwrap();
        assert_eq!(Want::File(got), want, "batch {i}");
    }
    let written: Vec<_> = walk(&setup.cache())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert!(
        written.is_empty(),
        "batch files written to the cache: {written:?}"
    );
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match path.is_dir() {
            true => out.extend(walk(&path)),
            false => out.push(path),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn the_mount_matches_the_model(cfg in config(), ops in prop::collection::vec(op(), 1..40)) {
        // A test that cannot mount fails rather than passes: the suite runs as root, with
        // /dev/fuse (scripts/test), and `the_core_matches_the_model` covers the rest.
        assert!(can_mount(), "the_mount_matches_the_model needs root and /dev/fuse");
        check_mount(&cfg, &ops)?;
    }

}

proptest! {
    // In process it costs a few milliseconds a case: four times the mount's cases.
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The same model against the core in process: no root, no kernel.
    #[test]
    fn the_core_matches_the_model(cfg in config(), ops in prop::collection::vec(op(), 1..40)) {
        check_core(&cfg, &ops)?;
    }
}
