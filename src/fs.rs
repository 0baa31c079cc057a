//! The filesystem core: the tree a mount shows, as plain functions over inode numbers that
//! return plain values or an errno. The FUSE adapter (`fuse.rs`) only translates.
//!
//! Inode numbers are computed, not stored, for everything below an epoch or rank directory:
//! `kind (4 bits) | directory id (16) | batch (32) | tensor (12)`, where the directory id
//! interns the (few) epoch and rank directories that have been looked up. A listing of an
//! epoch with a million batches therefore costs no memory.

use crate::cache::Item;
use crate::engine::Engine;
use crate::format;
use crate::plan::rank_to_global;
use crate::prefetch::{FileKind, Prefetcher};
use crate::stats::Stats;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub type Errno = i32;

pub const ROOT_INO: u64 = 1;
const DATASET_JSON_INO: u64 = 2;
const GDS_INO: u64 = 3;
const META_INO: u64 = 4;
const STATS_JSON_INO: u64 = 5;
pub const DATASET_JSON: &str = "dataset.json";
const GDS: &str = "gds";
const META: &str = ".tensorfs";
const STATS_JSON: &str = "stats.json";
const ALL: &str = "all";
const ALL_SAFETENSORS: &str = "all.safetensors";
/// The extended attribute that names a batch file's backing file.
pub const PATH_XATTR: &str = "user.tensorfs.path";
/// How long a backing file handed out by path stays pinned in the cache.
const PIN_GRACE: Duration = Duration::from_secs(300);

const KIND_SHIFT: u32 = 60;
const DIR_SHIFT: u32 = 44;
const BATCH_SHIFT: u32 = 12;
const MAX_DIRS: usize = 1 << 16;
const MAX_BATCHES: u64 = 1 << 32;
const MAX_TENSORS: usize = 1 << 12;

/// A directory of batches: an epoch, or a rank's view of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Batches {
    Epoch(u64),
    Rank { epoch: u64, rank: u64, world: u64 },
}

impl Batches {
    /// The (epoch, global batch) that batch `j` of this directory is.
    pub fn global(&self, j: u64) -> (u64, u64) {
        match *self {
            Batches::Epoch(e) => (e, j),
            Batches::Rank { epoch, rank, world } => (epoch, rank_to_global(rank, world, j)),
        }
    }

    /// Its path under the mount point.
    pub fn name(&self) -> String {
        match self {
            Batches::Epoch(e) => format!("epoch-{e}"),
            Batches::Rank { epoch, rank, world } => format!("epoch-{epoch}/rank-{rank}-of-{world}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Root,
    DatasetJson,
    /// `gds/`: the epoch tree again, batch files as symlinks to their backing files.
    Gds,
    /// `.tensorfs/`
    Meta,
    StatsJson,
    /// An epoch or rank directory, in the main tree or under `gds/`.
    Dir(u32),
    Safetensors(u32, u64),
    BatchDir(u32, u64),
    Npy(u32, u64, usize),
    /// `all.safetensors`: every batch of the directory, concatenated.
    AllSafetensors(u32),
    /// `all/`
    AllDir(u32),
    /// `all/NAME.npy`
    AllNpy(u32, usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: String,
}

fn encode(node: Node) -> u64 {
    let pack = |kind: u64, d: u32, i: u64, t: usize| {
        (kind << KIND_SHIFT) | ((d as u64) << DIR_SHIFT) | (i << BATCH_SHIFT) | t as u64
    };
    match node {
        Node::Root => ROOT_INO,
        Node::DatasetJson => DATASET_JSON_INO,
        Node::Gds => GDS_INO,
        Node::Meta => META_INO,
        Node::StatsJson => STATS_JSON_INO,
        Node::Dir(d) => pack(1, d, 0, 0),
        Node::Safetensors(d, i) => pack(2, d, i, 0),
        Node::BatchDir(d, i) => pack(3, d, i, 0),
        Node::Npy(d, i, t) => pack(4, d, i, t),
        Node::AllSafetensors(d) => pack(5, d, 0, 0),
        Node::AllDir(d) => pack(6, d, 0, 0),
        Node::AllNpy(d, t) => pack(7, d, 0, t),
    }
}

fn decode(ino: u64) -> Option<Node> {
    let d = ((ino >> DIR_SHIFT) & (MAX_DIRS as u64 - 1)) as u32;
    let i = (ino >> BATCH_SHIFT) & (MAX_BATCHES - 1);
    let t = (ino & (MAX_TENSORS as u64 - 1)) as usize;
    Some(match (ino >> KIND_SHIFT, ino) {
        (0, ROOT_INO) => Node::Root,
        (0, DATASET_JSON_INO) => Node::DatasetJson,
        (0, GDS_INO) => Node::Gds,
        (0, META_INO) => Node::Meta,
        (0, STATS_JSON_INO) => Node::StatsJson,
        (1, _) => Node::Dir(d),
        (2, _) => Node::Safetensors(d, i),
        (3, _) => Node::BatchDir(d, i),
        (4, _) => Node::Npy(d, i, t),
        (5, _) => Node::AllSafetensors(d),
        (6, _) => Node::AllDir(d),
        (7, _) => Node::AllNpy(d, t),
        _ => return None,
    })
}

/// A decimal number as names write it: digits, no leading zero.
fn number(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// Digits in batch file names: six, or more for an epoch of a million batches or more.
pub fn name_width(batches: u64) -> usize {
    batches.saturating_sub(1).to_string().len().max(6)
}

/// Exact file sizes of a batch of a given row count.
struct Sizes {
    safetensors: u64,
    npy: Vec<u64>,
}

/// Epoch and rank directories by id, and whether each is under `gds/`.
#[derive(Default)]
struct Dirs {
    list: Vec<(Batches, bool)>,
    ids: HashMap<(Batches, bool), u32>,
}

pub struct Fs {
    engine: Arc<Engine>,
    prefetcher: Prefetcher,
    epochs: u64,
    world_size: Option<u64>,
    dataset_json: Vec<u8>,
    /// Digits in a batch file name.
    width: usize,
    tensor_index: HashMap<String, usize>,
    sizes: HashMap<u64, Sizes>,
    /// Interned epoch and rank directories, and whether each is under `gds/`.
    dirs: Mutex<Dirs>,
}

impl Fs {
    pub fn new(
        engine: Arc<Engine>,
        prefetcher: Prefetcher,
        epochs: u64,
        world_size: Option<u64>,
        dataset_json: Vec<u8>,
    ) -> Fs {
        let plan = &engine.plan;
        let width = name_width(plan.batches());
        let tensor_index = engine
            .view
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let mut sizes = HashMap::new();
        for rows in [plan.options().batch_size, plan.last_batch_len()] {
            let layouts = engine.layouts(rows);
            let data: u64 = layouts.iter().map(|l| l.data_len() as u64).sum();
            let npy = layouts
                .iter()
                .map(|l| (format::npy_header_len(l.dtype, &l.shape) + l.data_len()) as u64)
                .collect();
            let safetensors = format::safetensors_header(&layouts).len() as u64 + data;
            sizes.insert(rows, Sizes { safetensors, npy });
        }
        Fs {
            engine,
            prefetcher,
            epochs,
            world_size,
            dataset_json,
            width,
            tensor_index,
            sizes,
            dirs: Mutex::default(),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.engine.stats
    }

    fn dir_id(&self, b: Batches, gds: bool) -> Result<u32, Errno> {
        let mut dirs = self.dirs.lock().unwrap();
        if let Some(&id) = dirs.ids.get(&(b, gds)) {
            return Ok(id);
        }
        if dirs.list.len() >= MAX_DIRS {
            tracing::warn!(
                "more than {MAX_DIRS} epoch and rank directories looked up; refusing {b:?}"
            );
            return Err(libc::ENFILE);
        }
        let id = dirs.list.len() as u32;
        dirs.list.push((b, gds));
        dirs.ids.insert((b, gds), id);
        Ok(id)
    }

    fn dir_entry(&self, id: u32) -> Result<(Batches, bool), Errno> {
        self.dirs
            .lock()
            .unwrap()
            .list
            .get(id as usize)
            .copied()
            .ok_or(libc::ENOENT)
    }

    fn dir(&self, id: u32) -> Result<Batches, Errno> {
        Ok(self.dir_entry(id)?.0)
    }

    /// The cache item a batch file node is (by global batch, so rank views share it, and by the
    /// epoch it repeats, so epochs with one order share it).
    fn item(&self, node: Node) -> Result<Item, Errno> {
        let (d, i, tensor) = match node {
            Node::Safetensors(d, i) => (d, i, None),
            Node::Npy(d, i, t) => (d, i, Some(t)),
            _ => return Err(libc::EINVAL),
        };
        let (epoch, batch) = self.dir(d)?.global(i);
        let kind = tensor.map_or(FileKind::Safetensors, FileKind::Npy);
        Ok(self.engine.item(kind, epoch, batch))
    }

    /// Where a batch file's backing file is (or will be) in the local cache.
    fn backing_path(&self, node: Node) -> Result<PathBuf, Errno> {
        let cache = self.engine.cache.as_ref().ok_or(libc::ENOENT)?;
        Ok(cache.path(self.item(node)?))
    }

    fn stats_json(&self) -> Vec<u8> {
        let mut v = self.engine.stats.to_json();
        v["memory_bytes"] = serde_json::json!(self.engine.memory());
        v["readers"] = serde_json::json!(self.prefetcher.depths(|b| self.count(b)));
        let mut out = serde_json::to_vec_pretty(&v).expect("stats serialise");
        out.push(b'\n');
        out
    }

    fn node(&self, ino: u64) -> Result<Node, Errno> {
        decode(ino).ok_or(libc::ENOENT)
    }

    fn count(&self, b: Batches) -> u64 {
        match b {
            Batches::Epoch(_) => self.engine.plan.batches(),
            Batches::Rank { world, .. } => self.engine.plan.rank_batches(world),
        }
    }

    fn batch_name(&self, i: u64) -> String {
        format!("{i:0width$}", width = self.width)
    }

    fn parse_batch(&self, b: Batches, s: &str) -> Option<u64> {
        let ok = s.len() == self.width && s.bytes().all(|c| c.is_ascii_digit());
        ok.then(|| s.parse().ok())
            .flatten()
            .filter(|&i| i < self.count(b) && i < MAX_BATCHES)
    }

    fn sizes(&self, b: Batches, i: u64) -> &Sizes {
        let (_, g) = b.global(i);
        &self.sizes[&self.engine.plan.batch_len(g)]
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        let node = self.node(ino)?;
        let (kind, size) = match node {
            Node::Root | Node::Meta | Node::Dir(_) | Node::BatchDir(..) => (Kind::Dir, 0),
            // The one-open files are served by the daemon from built batches, with no backing
            // file: under gds/ they link to themselves in the main tree.
            Node::AllSafetensors(d) | Node::AllNpy(d, _) if self.dir_entry(d)?.1 => {
                (Kind::Symlink, self.all_link(node)?.len() as u64)
            }
            Node::AllDir(_) => (Kind::Dir, 0),
            Node::AllSafetensors(d) => {
                let rows = self.dir_rows(self.dir(d)?);
                let header = format::safetensors_header(&self.engine.layouts(rows));
                (Kind::File, header.len() as u64 + rows * self.row_bytes())
            }
            Node::AllNpy(d, t) => {
                let rows = self.dir_rows(self.dir(d)?);
                let tensor = &self.engine.view.tensors[t];
                let header = format::npy_header_len(tensor.dtype, &tensor.shape(rows));
                (Kind::File, header as u64 + rows * tensor.row_bytes() as u64)
            }
            Node::Gds if self.engine.cache.is_some() => (Kind::Dir, 0),
            Node::Gds => return Err(libc::ENOENT),
            Node::DatasetJson => (Kind::File, self.dataset_json.len() as u64),
            // Its content changes all the time: like a /proc file, it has no size to promise;
            // it is opened direct-io and read to its end.
            Node::StatsJson => (Kind::File, 0),
            Node::Safetensors(d, _) | Node::Npy(d, ..) if self.dir_entry(d)?.1 => (
                Kind::Symlink,
                self.backing_path(node)?.as_os_str().len() as u64,
            ),
            Node::Safetensors(d, i) => (Kind::File, self.sizes(self.dir(d)?, i).safetensors),
            Node::Npy(d, i, t) => (Kind::File, self.sizes(self.dir(d)?, i).npy[t]),
        };
        Ok(Attr { ino, kind, size })
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr, Errno> {
        let parent = self.node(parent)?;
        if parent == Node::Gds && self.engine.cache.is_none() {
            return Err(libc::ENOENT);
        }
        let node = match parent {
            Node::Root if name == DATASET_JSON => Node::DatasetJson,
            Node::Root if name == GDS => Node::Gds,
            Node::Root if name == META => Node::Meta,
            Node::Meta if name == STATS_JSON => Node::StatsJson,
            Node::Meta => return Err(libc::ENOENT),
            Node::Root | Node::Gds => {
                let e = name
                    .strip_prefix("epoch-")
                    .and_then(number)
                    .ok_or(libc::ENOENT)?;
                Node::Dir(self.dir_id(Batches::Epoch(e), parent == Node::Gds)?)
            }
            Node::Dir(d) => {
                let (b, gds) = self.dir_entry(d)?;
                if name == ALL_SAFETENSORS {
                    Node::AllSafetensors(d)
                } else if name == ALL {
                    Node::AllDir(d)
                } else if let Some(stem) = name.strip_suffix(".safetensors") {
                    Node::Safetensors(d, self.parse_batch(b, stem).ok_or(libc::ENOENT)?)
                } else if let Some(i) = self.parse_batch(b, name) {
                    Node::BatchDir(d, i)
                } else {
                    let Batches::Epoch(epoch) = b else {
                        return Err(libc::ENOENT);
                    };
                    let (rank, world) = name
                        .strip_prefix("rank-")
                        .and_then(|s| s.split_once("-of-"))
                        .and_then(|(r, w)| Some((number(r)?, number(w)?)))
                        .filter(|&(r, w)| r < w)
                        .ok_or(libc::ENOENT)?;
                    Node::Dir(self.dir_id(Batches::Rank { epoch, rank, world }, gds)?)
                }
            }
            Node::BatchDir(d, i) => {
                let t = name
                    .strip_suffix(".npy")
                    .and_then(|n| self.tensor_index.get(n))
                    .ok_or(libc::ENOENT)?;
                Node::Npy(d, i, *t)
            }
            Node::AllDir(d) => {
                let t = name
                    .strip_suffix(".npy")
                    .and_then(|n| self.tensor_index.get(n))
                    .ok_or(libc::ENOENT)?;
                Node::AllNpy(d, *t)
            }
            _ => return Err(libc::ENOTDIR),
        };
        self.getattr(encode(node))
    }

    /// The `k`-th listed epoch directory, in the main tree or under `gds/`.
    fn epoch_entry(&self, k: u64, gds: bool) -> Result<Option<DirEntry>, Errno> {
        if k >= self.epochs {
            return Ok(None);
        }
        Ok(Some(DirEntry {
            ino: encode(Node::Dir(self.dir_id(Batches::Epoch(k), gds)?)),
            kind: Kind::Dir,
            name: format!("epoch-{k}"),
        }))
    }

    /// Entries of a directory from index `offset` on (`.` and `..` first), at most `limit`.
    pub fn readdir(&self, ino: u64, offset: u64, limit: usize) -> Result<Vec<DirEntry>, Errno> {
        let node = self.node(ino)?;
        let entry = |node: Node, kind: Kind, name: String| DirEntry {
            ino: encode(node),
            kind,
            name,
        };
        let child = |k: u64| -> Result<Option<DirEntry>, Errno> {
            Ok(match node {
                Node::Root => {
                    let extra: &[(Node, &str)] = if self.engine.cache.is_some() {
                        &[
                            (Node::DatasetJson, DATASET_JSON),
                            (Node::Meta, META),
                            (Node::Gds, GDS),
                        ]
                    } else {
                        &[(Node::DatasetJson, DATASET_JSON), (Node::Meta, META)]
                    };
                    match extra.get(k as usize) {
                        Some((n, name)) => {
                            let kind = if *n == Node::DatasetJson {
                                Kind::File
                            } else {
                                Kind::Dir
                            };
                            Some(entry(*n, kind, name.to_string()))
                        }
                        None => self.epoch_entry(k - extra.len() as u64, false)?,
                    }
                }
                Node::Gds => self.epoch_entry(k, true)?,
                Node::Meta => {
                    (k == 0).then(|| entry(Node::StatsJson, Kind::File, STATS_JSON.into()))
                }
                Node::Dir(d) => {
                    let (b, gds) = self.dir_entry(d)?;
                    let file = if gds { Kind::Symlink } else { Kind::File };
                    let n = self.count(b);
                    if k < 2 * n {
                        let i = k / 2;
                        Some(if k.is_multiple_of(2) {
                            entry(
                                Node::Safetensors(d, i),
                                file,
                                format!("{}.safetensors", self.batch_name(i)),
                            )
                        } else {
                            entry(Node::BatchDir(d, i), Kind::Dir, self.batch_name(i))
                        })
                    } else if k == 2 * n {
                        Some(entry(Node::AllSafetensors(d), file, ALL_SAFETENSORS.into()))
                    } else if k == 2 * n + 1 {
                        Some(entry(Node::AllDir(d), Kind::Dir, ALL.into()))
                    } else {
                        let after = 2 * n + 2;
                        match (b, self.world_size) {
                            (Batches::Epoch(epoch), Some(world)) if k - after < world => {
                                let rank = k - after;
                                let id = self.dir_id(Batches::Rank { epoch, rank, world }, gds)?;
                                Some(entry(
                                    Node::Dir(id),
                                    Kind::Dir,
                                    format!("rank-{rank}-of-{world}"),
                                ))
                            }
                            _ => None,
                        }
                    }
                }
                Node::AllDir(d) => {
                    let file = if self.dir_entry(d)?.1 {
                        Kind::Symlink
                    } else {
                        Kind::File
                    };
                    self.engine.view.tensors.get(k as usize).map(|t| {
                        entry(Node::AllNpy(d, k as usize), file, format!("{}.npy", t.name))
                    })
                }
                Node::BatchDir(d, i) => {
                    let file = if self.dir_entry(d)?.1 {
                        Kind::Symlink
                    } else {
                        Kind::File
                    };
                    self.engine.view.tensors.get(k as usize).map(|t| {
                        entry(Node::Npy(d, i, k as usize), file, format!("{}.npy", t.name))
                    })
                }
                _ => return Err(libc::ENOTDIR),
            })
        };
        let mut out = Vec::new();
        let mut k = offset;
        while out.len() < limit {
            let e = match k {
                0 => Some(DirEntry {
                    ino,
                    kind: Kind::Dir,
                    name: ".".into(),
                }),
                1 => Some(DirEntry {
                    ino: ROOT_INO,
                    kind: Kind::Dir,
                    name: "..".into(),
                }),
                _ => child(k - 2)?,
            };
            match e {
                Some(e) => out.push(e),
                None => break,
            }
            k += 1;
        }
        Ok(out)
    }

    /// What `open` may open: a regular file, or `EISDIR`/`ELOOP`.
    pub fn openable(&self, ino: u64) -> Result<Openable, Errno> {
        let node = self.node(ino)?;
        match self.getattr(ino)?.kind {
            Kind::Dir => Err(libc::EISDIR),
            Kind::Symlink => Err(libc::ELOOP),
            Kind::File => Ok(match node {
                Node::StatsJson => Openable::Live(self.stats_json()),
                Node::DatasetJson => Openable::Fixed,
                Node::AllSafetensors(_) | Node::AllNpy(..) => Openable::Concatenated,
                _ => Openable::Batch,
            }),
        }
    }

    /// A batch file's backing file if it is materialised already (checked), without waiting;
    /// the caller notes the reader for the prefetcher ([`Fs::note_reader`]) once it answered.
    pub fn materialized(&self, ino: u64) -> Option<File> {
        let node = self.node(ino).ok()?;
        let item = self.item(node).ok()?;
        let cache = self.engine.cache.as_ref()?;
        let (file, _) = cache.open_batch_file(item, &self.engine.stats)?;
        Stats::add(&self.engine.stats.c.batch_file_hits, 1);
        let (epoch, batch) = item.batch()?;
        self.engine.reader_at(epoch, batch);
        Some(file)
    }

    /// Lets the prefetcher follow a reader that opened `ino` (after the open is answered).
    pub fn note_reader(&self, ino: u64) {
        if let Ok(node) = self.node(ino) {
            self.accessed(node);
        }
    }

    /// A batch file's backing file, materialised on the local cache first if it must be.
    /// `None`: the cache cannot take it, the daemon serves it from memory.
    pub async fn materialize(&self, ino: u64) -> Result<Option<(File, PathBuf)>, Errno> {
        let node = self.node(ino)?;
        let item = self.item(node)?;
        self.accessed(node);
        self.engine.materialize(item).await.map_err(|e| {
            tracing::error!(
                "materialising {}: {}",
                self.engine
                    .cache
                    .as_ref()
                    .map(|c| c.path(item).display().to_string())
                    .unwrap_or_default(),
                crate::describe(&e)
            );
            libc::EIO
        })
    }

    /// A reader is at `node`: let the prefetcher follow it.
    fn accessed(&self, node: Node) {
        let (d, i, kind) = match node {
            Node::Safetensors(d, i) => (d, i, FileKind::Safetensors),
            Node::Npy(d, i, t) => (d, i, FileKind::Npy(t)),
            _ => return,
        };
        if let Ok(dir) = self.dir(d) {
            self.prefetcher.accessed(dir, i, kind, |b| self.count(b));
        }
    }

    /// The backing file's path, once materialised, pinned for GPUDirect readers.
    async fn handed_out_path(&self, node: Node) -> Result<Vec<u8>, Errno> {
        let (_, path) = self.materialize(encode(node)).await?.ok_or(libc::EIO)?;
        if let Some(cache) = &self.engine.cache {
            cache.pin(self.item(node)?, PIN_GRACE);
        }
        Ok(path.into_os_string().into_encoded_bytes())
    }

    /// `readlink` of a `gds/` symlink.
    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        if self.getattr(ino)?.kind != Kind::Symlink {
            return Err(libc::EINVAL);
        }
        match self.node(ino)? {
            node @ (Node::AllSafetensors(_) | Node::AllNpy(..)) => {
                Ok(self.all_link(node)?.into_bytes())
            }
            node => self.handed_out_path(node).await,
        }
    }

    /// Where a `gds/` link to a one-open file points: the same file in the main tree, by a
    /// relative path (no backing file holds its bytes; a cuFile reader reads it in
    /// compatibility mode).
    fn all_link(&self, node: Node) -> Result<String, Errno> {
        let (d, file) = match node {
            Node::AllSafetensors(d) => (d, ALL_SAFETENSORS.to_string()),
            Node::AllNpy(d, t) => (d, format!("{ALL}/{}.npy", self.engine.view.tensors[t].name)),
            _ => return Err(libc::EINVAL),
        };
        let dir = self.dir(d)?.name();
        // Up from the link's directory (gds/, the directory, and all/ for a .npy) to the root.
        let depth = 1 + dir.matches('/').count() + 1 + file.matches('/').count();
        Ok(format!("{}{dir}/{file}", "../".repeat(depth)))
    }

    /// Whether `ino` is a batch file (`.safetensors` or `.npy`) of the main tree.
    pub fn is_batch_file(&self, ino: u64) -> bool {
        self.getattr(ino).is_ok_and(|a| a.kind == Kind::File)
            && matches!(self.node(ino), Ok(Node::Safetensors(..) | Node::Npy(..)))
    }

    /// The names of a node's extended attributes.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        Ok(if self.is_batch_file(ino) && self.engine.cache.is_some() {
            format!("{PATH_XATTR}\0").into_bytes()
        } else {
            Vec::new()
        })
    }

    /// `user.tensorfs.path`: the backing file's path, materialised and pinned.
    pub async fn getxattr(&self, ino: u64, name: &str) -> Result<Vec<u8>, Errno> {
        if name != PATH_XATTR || !self.is_batch_file(ino) || self.engine.cache.is_none() {
            return Err(libc::ENODATA);
        }
        self.handed_out_path(self.node(ino)?).await
    }

    /// Reads `size` bytes at `offset`, building the batch first if it must.
    pub async fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let node = self.node(ino)?;
        let (b, i) = match node {
            Node::DatasetJson => return Ok(slice(&[&self.dataset_json], offset, size)),
            Node::StatsJson => return Ok(slice(&[&self.stats_json()], offset, size)),
            Node::Safetensors(d, i) | Node::Npy(d, i, _) => (self.dir(d)?, i),
            Node::AllSafetensors(d) => {
                return self.read_all(self.dir(d)?, None, offset, size).await;
            }
            Node::AllNpy(d, t) => return self.read_all(self.dir(d)?, Some(t), offset, size).await,
            _ => return Err(libc::EISDIR),
        };
        let (epoch, g) = b.global(i);
        self.engine.reader_at(epoch, g);
        self.accessed(node);
        let _waits = self.engine.reader_waits();
        let batch = self.engine.batch(epoch, g).await.map_err(|e| {
            tracing::error!("epoch {epoch} batch {g}: {}", crate::describe(&e));
            libc::EIO
        })?;
        Ok(match node {
            Node::Npy(_, _, t) => {
                let tensor = &self.engine.view.tensors[t];
                let header = format::npy_header(tensor.dtype, &tensor.shape(batch.rows));
                slice(&[&header, &batch.tensors[t]], offset, size)
            }
            _ => {
                let mut parts: Vec<&[u8]> = vec![&batch.safetensors_header];
                parts.extend(batch.tensors.iter().map(Vec::as_slice));
                slice(&parts, offset, size)
            }
        })
    }
}

impl Fs {
    /// Bytes of one row of every tensor.
    fn row_bytes(&self) -> u64 {
        self.engine
            .view
            .tensors
            .iter()
            .map(|t| t.row_bytes() as u64)
            .sum()
    }

    /// Rows of a directory's batches, back to back: all full but the epoch's last batch, which
    /// a directory holds, if at all, as its own last.
    fn dir_rows(&self, b: Batches) -> u64 {
        let n = self.count(b);
        if n == 0 {
            return 0;
        }
        let bs = self.engine.plan.options().batch_size;
        let (_, last) = b.global(n - 1);
        (n - 1) * bs + self.engine.plan.batch_len(last)
    }

    /// Reads `size` bytes at `offset` of a directory's `all.safetensors` (`tensor` None) or
    /// `all/NAME.npy`: the header, then each tensor's rows of every batch in batch order, built
    /// (or taken from memory) only for the batches the read spans.
    async fn read_all(
        &self,
        b: Batches,
        tensor: Option<usize>,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let rows = self.dir_rows(b);
        let tensors = &self.engine.view.tensors;
        let (header, parts): (Vec<u8>, Vec<usize>) = match tensor {
            Some(t) => (
                format::npy_header(tensors[t].dtype, &tensors[t].shape(rows)),
                vec![t],
            ),
            None => (
                format::safetensors_header(&self.engine.layouts(rows)),
                (0..tensors.len()).collect(),
            ),
        };
        let bs = self.engine.plan.options().batch_size;
        let end = offset + size as u64;
        let mut out = slice(&[&header], offset, size);
        let mut base = header.len() as u64;
        for t in parts {
            let row = tensors[t].row_bytes() as u64;
            let len = rows * row;
            let (from, to) = (offset.max(base), end.min(base + len));
            let per_batch = bs * row;
            let mut at = from;
            while at < to {
                let j = (at - base) / per_batch;
                let within = at - base - j * per_batch;
                let (epoch, g) = b.global(j);
                self.engine.reader_at(epoch, g);
                if let Ok(dir) = self.dir_id(b, false) {
                    self.accessed(Node::Safetensors(dir, j));
                }
                let _waits = self.engine.reader_waits();
                let batch = self.engine.batch(epoch, g).await.map_err(|e| {
                    tracing::error!("epoch {epoch} batch {g}: {}", crate::describe(&e));
                    libc::EIO
                })?;
                let data = &batch.tensors[t];
                let take = (to - at).min((data.len() as u64).saturating_sub(within));
                if take == 0 {
                    tracing::error!("epoch {epoch} batch {g}: shorter than the plan says");
                    return Err(libc::EIO);
                }
                out.extend_from_slice(&data[within as usize..(within + take) as usize]);
                at += take;
            }
            base += len;
        }
        Ok(out)
    }
}

/// How an openable file is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Openable {
    /// A batch file: materialised and passed through, or served by the daemon.
    Batch,
    /// dataset.json: fixed for the mount's life.
    Fixed,
    /// `all.safetensors`, `all/NAME.npy`: served by the daemon from the batches a read spans.
    Concatenated,
    /// stats.json: new content on every open.
    Live(Vec<u8>),
}

/// `size` bytes at `offset` of the concatenation of `parts`.
fn slice(parts: &[&[u8]], offset: u64, size: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(size as usize);
    let (mut start, end) = (offset as usize, offset as usize + size as usize);
    let mut base = 0usize;
    for p in parts {
        let p_end = base + p.len();
        if start < p_end && start < end {
            let to = end.min(p_end);
            out.extend_from_slice(&p[start - base..to - base]);
            start = to;
        }
        base = p_end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_round_trip() {
        for node in [
            Node::Root,
            Node::DatasetJson,
            Node::Dir(0),
            Node::Dir(65535),
            Node::Safetensors(3, 0),
            Node::Safetensors(65535, MAX_BATCHES - 1),
            Node::BatchDir(1, 12345),
            Node::Npy(2, 99, 4095),
        ] {
            assert_eq!(decode(encode(node)), Some(node));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(15 << KIND_SHIFT), None);
    }

    #[test]
    fn names_are_canonical_numbers() {
        assert_eq!(number("0"), Some(0));
        assert_eq!(number("17"), Some(17));
        assert_eq!(number("017"), None);
        assert_eq!(number(""), None);
        assert_eq!(number("1x"), None);
    }

    #[test]
    fn slices_cross_parts() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"defg"];
        assert_eq!(slice(&parts, 0, 100), b"abcdefg");
        assert_eq!(slice(&parts, 2, 3), b"cde");
        assert_eq!(slice(&parts, 6, 10), b"g");
        assert_eq!(slice(&parts, 7, 10), b"");
        assert_eq!(slice(&parts, 50, 10), b"");
    }
}
