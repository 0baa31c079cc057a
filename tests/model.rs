//! Model-based test of a real mount: random sequences of stat, readdir, read (at random offsets
//! and sizes), readlink and getxattr against the mounted filesystem and a reference model,
//! compared after every step, across option sets (shuffle modes, batch sizes, rank views,
//! casts, drop_last). The model computes every file from the row ids alone: the dataset's
//! values are functions of the row id, and the order comes from the epoch plan, which is
//! property-tested on its own.
//!
//! Needs root and /dev/fuse (as CI has); elsewhere it says so and passes vacuously.

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use arrow::datatypes::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tensorfs::read::dtype::DType;
use tensorfs::read::format::{self, TensorLayout};
use tensorfs::read::plan::{OrderOptions, Plan, Shuffle};

/// (rows, row group size) of each file.
const FILES: [(i64, usize); 3] = [(37, 10), (50, 16), (23, 23)];
const EPOCHS: u64 = 2;

fn write_dataset(dir: &Path) -> Vec<u64> {
    let mut rg_rows = Vec::new();
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
        let mut left = *rows as u64;
        while left > 0 {
            rg_rows.push(left.min(*rg as u64));
            left -= left.min(*rg as u64);
        }
        start += rows;
    }
    rg_rows
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

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/dev/fuse").exists()
}

fn check(cfg: &Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let (data, mnt, cache) = (
        tmp.path().join("data"),
        tmp.path().join("mnt"),
        tmp.path().join("cache"),
    );
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let rg_rows = write_dataset(&data);
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args([
            "mount",
            data.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            &cfg.options(&cache),
        ])
        .output()
        .unwrap();
    prop_assert!(
        out.status.success(),
        "mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _mounted = Mounted { path: mnt.clone() };
    let order = OrderOptions {
        batch_size: cfg.batch_size,
        drop_last: cfg.drop_last,
        shuffle: cfg.shuffle,
        window: 4,
        seed: cfg.seed,
        partitions: cfg.partitions,
    };
    let model = Model {
        plan: Plan::new(&rg_rows, order),
        cfg: cfg.clone(),
        names: vec!["id", "x", "emb", "flag"],
    };

    for (step, op) in ops.iter().enumerate() {
        let at = |t: &Target| mnt.join(t.rel(&model.names));
        let ctx = format!("step {step}: {op:?}");
        match op {
            Op::Stat(t) => {
                let got = std::fs::symlink_metadata(at(t));
                match (model.want(t), got) {
                    (Want::Missing, Err(e)) => {
                        prop_assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{}", ctx)
                    }
                    (Want::Dir(_), Ok(m)) => prop_assert!(m.is_dir(), "{}", ctx),
                    (Want::File(bytes), Ok(m)) => {
                        prop_assert!(m.is_file(), "{}", ctx);
                        prop_assert_eq!(m.len(), bytes.len() as u64, "{}", ctx);
                    }
                    (Want::Symlink, Ok(m)) => prop_assert!(m.file_type().is_symlink(), "{}", ctx),
                    (want, got) => prop_assert!(
                        false,
                        "{}: want {:?}, got {:?}",
                        ctx,
                        want,
                        got.map(|m| m.file_type().is_fifo())
                    ),
                }
            }
            Op::ReadDir(t) => {
                let t = Target {
                    file: if matches!(t.file, FileSel::EpochDir) {
                        FileSel::EpochDir
                    } else {
                        FileSel::BatchDir
                    },
                    ..*t
                };
                match (model.want(&t), std::fs::read_dir(at(&t))) {
                    (Want::Dir(names), Ok(rd)) => {
                        let got: BTreeSet<String> = rd
                            .map(|e| e.unwrap().file_name().into_string().unwrap())
                            .collect();
                        prop_assert_eq!(got, names, "{}", ctx);
                    }
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
                match (model.want(t), std::fs::File::open(at(t))) {
                    (Want::File(bytes), Ok(f)) => {
                        use std::os::unix::fs::FileExt;
                        let want_end = (offset as usize).saturating_add(len).min(bytes.len());
                        let want = bytes.get(offset as usize..want_end).unwrap_or(&[]);
                        let mut got = vec![0u8; want.len()];
                        let mut filled = 0;
                        while filled < got.len() {
                            let n = f
                                .read_at(&mut got[filled..], offset + filled as u64)
                                .unwrap();
                            if n == 0 {
                                break;
                            }
                            filled += n;
                        }
                        prop_assert_eq!(filled, want.len(), "{}", ctx);
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
                        got.is_ok()
                    ),
                }
            }
            Op::Read(..) | Op::ReadAll(_) => {}
            Op::Readlink(t) | Op::Xattr(t)
                if matches!(t.file, FileSel::Safetensors | FileSel::Npy(_)) =>
            {
                let plain = Target { gds: false, ..*t };
                let got: std::io::Result<PathBuf> = match op {
                    Op::Readlink(_) => std::fs::read_link(at(t)),
                    _ => xattr_path(&at(t)),
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn the_mount_matches_the_model(cfg in config(), ops in prop::collection::vec(op(), 1..40)) {
        if !can_mount() {
            eprintln!("the_mount_matches_the_model: needs root and /dev/fuse; skipped");
            return Ok(());
        }
        check(&cfg, &ops)?;
    }
}
