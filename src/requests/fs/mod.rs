//! The filesystem core: the tree a mount shows, as plain functions over inode numbers that
//! return plain values or an [`Error`] carrying its errno. The FUSE adapter (`kernel/fuse.rs`) only
//! translates, and logs the errors it replies with.
//!
//! Inode numbers are computed, not stored, for everything below an epoch or rank directory:
//! `kind (4 bits) | directory id (16) | batch (32) | tensor (12)`, where the directory id
//! interns the (few) epoch and rank directories that have been looked up. A listing of an
//! epoch with a million batches therefore costs no memory.

use crate::error::{Error, Result, enoent};
use crate::model::item::FileKind;
use crate::model::plan::{Batches, Plan};
use crate::read::layout::{self, ALL, ALL_SAFETENSORS, Layout};
use crate::requests::serve::{AllFile, BatchFile, Target};
use crate::stats::Stats;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub const ROOT_INO: u64 = 1;
const DATASET_JSON_INO: u64 = 2;
const GDS_INO: u64 = 3;
const META_INO: u64 = 4;
const STATS_JSON_INO: u64 = 5;
pub(crate) const DATASET_JSON: &str = "dataset.json";
const GDS: &str = "gds";
const META: &str = ".tensorfs";
const STATS_JSON: &str = "stats.json";
/// stats.json's size is a multiple of this.
const STATS_JSON_STEP: u64 = 4096;
const KIND_SHIFT: u32 = 60;
const DIR_SHIFT: u32 = 44;
const BATCH_SHIFT: u32 = 12;
const MAX_DIRS: usize = 1 << 16;
const MAX_BATCHES: u64 = 1 << 32;
const MAX_TENSORS: usize = 1 << 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    Root,
    DatasetJson,
    /// `gds/`: the epoch tree again, files as symlinks to their backing files.
    Gds,
    /// `.tensorfs/`
    Meta,
    StatsJson,
    /// An epoch or rank directory, in the main tree or under `gds/`.
    Dir(u32),
    /// File `kind` of batch `i`: `NNNNNN.safetensors`, or `NNNNNN/NAME.npy`.
    Batch(u32, u64, FileKind),
    BatchDir(u32, u64),
    /// A one-open file: `all.safetensors` (every batch of the directory, back to back), or
    /// `all/NAME.npy`.
    All(u32, FileKind),
    /// `all/`
    AllDir(u32),
}

impl Node {
    /// The batch file a node is: (directory, batch, which file).
    fn batch_file(self) -> Option<(u32, u64, FileKind)> {
        match self {
            Node::Batch(d, i, kind) => Some((d, i, kind)),
            _ => None,
        }
    }

    /// The one-open file a node is: (directory, which file).
    fn all_file(self) -> Option<(u32, FileKind)> {
        match self {
            Node::All(d, kind) => Some((d, kind)),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryType {
    Dir,
    File,
    Symlink,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: EntryType,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub(crate) ino: u64,
    pub(crate) kind: EntryType,
    pub name: String,
}

/// What an open of a regular file opens, found with one decode of its inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Openable {
    /// A batch file (of this size): materialised and passed through, or served by the daemon.
    Batch(BatchFile, u64),
    /// dataset.json: fixed for the mount's life.
    Fixed,
    /// A one-open file (`all.safetensors`, `all/NAME.npy`): from the file built ahead
    /// ([`crate::read::produce::ahead`]) where there is one, else served by the daemon from
    /// the batches a read spans.
    All(AllFile),
    /// stats.json: new content on every open.
    Live(Vec<u8>),
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
        Node::Batch(d, i, FileKind::Safetensors) => pack(2, d, i, 0),
        Node::BatchDir(d, i) => pack(3, d, i, 0),
        Node::Batch(d, i, FileKind::Npy(t)) => pack(4, d, i, t),
        Node::All(d, FileKind::Safetensors) => pack(5, d, 0, 0),
        Node::AllDir(d) => pack(6, d, 0, 0),
        Node::All(d, FileKind::Npy(t)) => pack(7, d, 0, t),
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
        (2, _) => Node::Batch(d, i, FileKind::Safetensors),
        (3, _) => Node::BatchDir(d, i),
        (4, _) => Node::Batch(d, i, FileKind::Npy(t)),
        (5, _) => Node::All(d, FileKind::Safetensors),
        (6, _) => Node::AllDir(d),
        (7, _) => Node::All(d, FileKind::Npy(t)),
        _ => return None,
    })
}

/// Epoch and rank directories by id, and whether each is under `gds/`.
#[derive(Default)]
struct Dirs {
    list: Vec<(Batches, bool)>,
    ids: HashMap<(Batches, bool), u32>,
}

/// What a `gds/` symlink links to ([`Fs::link`]).
pub(crate) enum Link {
    Batch(BatchFile),
    /// A one-open file, and the path to it in the main tree.
    All(AllFile, String),
}

/// What the tree asks of the serving side: the plan its names come from, the counters and
/// gauges stats.json shows, and where a batch file's backing file lies (a `gds/` link's
/// target). The bytes behind its files are the request core's ([`crate::requests`]).
pub(crate) trait Backing: Send + Sync {
    fn plan(&self) -> &Plan;
    fn stats(&self) -> &Stats;
    /// Bytes the read path holds in the daemon's memory.
    fn memory(&self) -> usize;
    /// Each reader's depth ahead.
    fn depths(&self) -> Vec<serde_json::Value>;
    /// Where batch file `f`'s backing file is (or will be) in the local cache.
    fn backing_path(&self, f: BatchFile) -> PathBuf;
}

/// What the tree is made from.
pub(crate) struct Tree {
    pub(crate) backing: Arc<dyn Backing>,
    pub(crate) layout: Arc<Layout>,
    pub(crate) epochs: u64,
    pub(crate) world_size: Option<u64>,
    pub(crate) dataset_json: Vec<u8>,
}

pub struct Fs {
    backing: Arc<dyn Backing>,
    layout: Arc<Layout>,
    epochs: u64,
    world_size: Option<u64>,
    dataset_json: Vec<u8>,
    /// Where dataset.json's count of objects touched is written as it is served (a mount of a
    /// snapshot), if it has one.
    touched_at: Option<usize>,
    /// Exact sizes of each batch file kind at the two batch lengths an epoch has.
    sizes: HashMap<(u64, FileKind), u64>,
    /// Interned epoch and rank directories, and whether each is under `gds/`.
    dirs: Mutex<Dirs>,
    /// stats.json's size (see `stats_json`): it only grows.
    stats_size: AtomicU64,
}

impl Fs {
    pub(crate) fn new(tree: Tree) -> Fs {
        let Tree {
            backing,
            layout,
            epochs,
            world_size,
            dataset_json,
        } = tree;
        let plan = backing.plan();
        let mut sizes = HashMap::new();
        for rows in [plan.options().batch_size, plan.last_batch_len()] {
            let kinds = std::iter::once(FileKind::Safetensors)
                .chain((0..layout.tensors()).map(FileKind::Npy));
            for kind in kinds {
                sizes.insert((rows, kind), layout.size(kind, rows));
            }
        }
        // The key with its value: a `"` inside a JSON string is escaped, so only the key matches.
        let key = "\"objects_touched\": ";
        let placeholder = format!("{key}\"{}\"", crate::source::view::TOUCHED_PLACEHOLDER);
        let touched_at = (dataset_json.windows(placeholder.len()))
            .position(|w| w == placeholder.as_bytes())
            .map(|at| at + key.len());
        Fs {
            backing,
            layout,
            epochs,
            world_size,
            dataset_json,
            touched_at,
            sizes,
            dirs: Mutex::default(),
            stats_size: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> &Stats {
        self.backing.stats()
    }

    fn plan(&self) -> &Plan {
        self.backing.plan()
    }

    /// The file of the main tree whose bytes the read path serves that `ino` is: a batch file
    /// or a one-open file (not one under `gds/`, which are links).
    pub(crate) fn target(&self, ino: u64) -> Option<Target> {
        let node = self.node(ino).ok()?;
        if let Some((d, batch, kind)) = node.batch_file() {
            let (dir, gds) = self.dir_entry(d).ok()?;
            return (!gds).then_some(Target::Batch(BatchFile { dir, batch, kind }));
        }
        let (d, kind) = node.all_file()?;
        let (dir, gds) = self.dir_entry(d).ok()?;
        (!gds).then_some(Target::All(AllFile { dir, kind }))
    }

    /// As [`Fs::target`], of a batch file or a link to one under `gds/`.
    fn batch_file_of(&self, node: Node) -> Result<BatchFile> {
        let (d, batch, kind) = node.batch_file().ok_or(Error::answer(libc::EINVAL))?;
        Ok(BatchFile {
            dir: self.dir(d)?,
            batch,
            kind,
        })
    }

    /// As [`Fs::target`], of a one-open file or a link to one under `gds/`.
    fn all_file_of(&self, node: Node) -> Option<AllFile> {
        let (d, kind) = node.all_file()?;
        Some(AllFile {
            dir: self.dir(d).ok()?,
            kind,
        })
    }

    fn node(&self, ino: u64) -> Result<Node> {
        decode(ino).ok_or_else(enoent)
    }

    fn dir_id(&self, b: Batches, gds: bool) -> Result<u32> {
        let mut dirs = self.dirs.lock().unwrap();
        if let Some(&id) = dirs.ids.get(&(b, gds)) {
            return Ok(id);
        }
        if dirs.list.len() >= MAX_DIRS {
            return Err(Error::limit(
                libc::ENFILE,
                format!(
                    "more than {MAX_DIRS} epoch and rank directories looked up; refusing {b:?}"
                ),
            ));
        }
        let id = dirs.list.len() as u32;
        dirs.list.push((b, gds));
        dirs.ids.insert((b, gds), id);
        Ok(id)
    }

    /// An interned directory, and whether it is under `gds/`.
    fn dir_entry(&self, id: u32) -> Result<(Batches, bool)> {
        self.dirs
            .lock()
            .unwrap()
            .list
            .get(id as usize)
            .copied()
            .ok_or_else(enoent)
    }

    fn dir(&self, id: u32) -> Result<Batches> {
        Ok(self.dir_entry(id)?.0)
    }

    fn in_gds(&self, id: u32) -> Result<bool> {
        Ok(self.dir_entry(id)?.1)
    }

    fn stats_json(&self) -> Vec<u8> {
        let mut v = self.stats().to_json();
        v["memory_bytes"] = serde_json::json!(self.backing.memory());
        v["readers"] = serde_json::json!(self.backing.depths());
        let mut out = serde_json::to_vec_pretty(&v).expect("stats serialise");
        // Padded with spaces (whitespace a JSON document may end with) to a size that only
        // grows, in steps of 4 KiB: the size a stat reports is then the size the next open
        // reads, though the counters change between the two.
        let want = (out.len() as u64 + 1).next_multiple_of(STATS_JSON_STEP);
        let size = self.stats_size.fetch_max(want, Ordering::Relaxed).max(want);
        out.resize(size as usize - 1, b' ');
        out.push(b'\n');
        out
    }

    /// The counters in Prometheus's text exposition format (`metrics=`).
    pub(crate) fn metrics_text(&self) -> String {
        let memory = self.backing.memory() as u64;
        self.stats().prometheus(memory)
    }

    /// dataset.json as it is now: with the count of objects this host has touched where it has
    /// one, written over its placeholder (a number padded with spaces, so the size stays).
    fn dataset_json(&self) -> Vec<u8> {
        self.dataset_json_at(0, self.dataset_json.len() as u32)
    }

    /// `size` bytes of dataset.json at `offset`, the count of objects touched written in.
    fn dataset_json_at(&self, offset: u64, size: u32) -> Vec<u8> {
        let mut out = layout::slice(&[&self.dataset_json], offset, size);
        if let Some(at) = self.touched_at {
            let width = crate::source::view::TOUCHED_PLACEHOLDER.len() + 2;
            let touched = self.stats().c.objects_touched.load(Ordering::Relaxed);
            let text = format!("{touched:<width$}");
            for (i, b) in text.bytes().enumerate() {
                if let Some(pos) = ((at + i) as u64).checked_sub(offset)
                    && let Some(slot) = out.get_mut(pos as usize)
                {
                    *slot = b;
                }
            }
        }
        out
    }

    /// The batch a name in directory `b` is.
    fn parse_batch(&self, b: Batches, s: &str) -> Option<u64> {
        layout::parse_batch(s).filter(|&i| i < self.plan().count(b) && i < MAX_BATCHES)
    }

    fn batch_file_size(&self, b: Batches, i: u64, kind: FileKind) -> u64 {
        let rows = self.plan().batch_len(b.global(i).1);
        self.sizes[&(rows, kind)]
    }

    fn file_kind(&self, d: u32) -> Result<EntryType> {
        Ok(if self.in_gds(d)? {
            EntryType::Symlink
        } else {
            EntryType::File
        })
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.attr(ino, self.node(ino)?)
    }

    fn attr(&self, ino: u64, node: Node) -> Result<Attr> {
        let (kind, size) = match node {
            Node::Root | Node::Meta | Node::Gds | Node::Dir(_) | Node::BatchDir(..) => {
                (EntryType::Dir, 0)
            }
            Node::AllDir(_) => (EntryType::Dir, 0),
            Node::DatasetJson => (EntryType::File, self.dataset_json.len() as u64),
            // Its content changes all the time: each open reads a snapshot of it (direct-io),
            // padded to the size reported here.
            Node::StatsJson => (EntryType::File, self.stats_json().len() as u64),
            Node::Batch(d, i, kind) => {
                let (b, gds) = self.dir_entry(d)?;
                match gds {
                    true => (
                        EntryType::Symlink,
                        self.backing_path(node)?.as_os_str().len() as u64,
                    ),
                    false => (EntryType::File, self.batch_file_size(b, i, kind)),
                }
            }
            Node::All(d, kind) => {
                let (b, gds) = self.dir_entry(d)?;
                match gds {
                    // No backing file holds them: under gds/ they link to the main tree.
                    true => (EntryType::Symlink, self.all_link(node)?.len() as u64),
                    false => (
                        EntryType::File,
                        self.layout.size(kind, self.plan().dir_rows(b)),
                    ),
                }
            }
        };
        Ok(Attr { ino, kind, size })
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        Stats::add(&self.stats().c.lookups, 1);
        let node = match self.node(parent)? {
            Node::Root if name == DATASET_JSON => Node::DatasetJson,
            Node::Root if name == GDS => Node::Gds,
            Node::Root if name == META => Node::Meta,
            Node::Meta if name == STATS_JSON => Node::StatsJson,
            Node::Meta => return Err(enoent()),
            parent @ (Node::Root | Node::Gds) => {
                let e = layout::parse_epoch(name).ok_or_else(enoent)?;
                Node::Dir(self.dir_id(Batches::Epoch(e), parent == Node::Gds)?)
            }
            Node::Dir(d) => self.lookup_in_dir(d, name)?,
            Node::BatchDir(d, i) => {
                let t = self.layout.parse_npy(name).ok_or_else(enoent)?;
                Node::Batch(d, i, FileKind::Npy(t))
            }
            Node::AllDir(d) => Node::All(
                d,
                FileKind::Npy(self.layout.parse_npy(name).ok_or_else(enoent)?),
            ),
            _ => return Err(Error::answer(libc::ENOTDIR)),
        };
        self.getattr(encode(node))
    }

    /// A name in an epoch or rank directory: a batch file or directory, a one-open file, or
    /// (in an epoch) a rank view.
    fn lookup_in_dir(&self, d: u32, name: &str) -> Result<Node> {
        let (b, gds) = self.dir_entry(d)?;
        if name == ALL_SAFETENSORS {
            return Ok(Node::All(d, FileKind::Safetensors));
        }
        if name == ALL {
            return Ok(Node::AllDir(d));
        }
        if let Some(stem) = name.strip_suffix(".safetensors") {
            let i = self.parse_batch(b, stem).ok_or_else(enoent)?;
            return Ok(Node::Batch(d, i, FileKind::Safetensors));
        }
        if let Some(i) = self.parse_batch(b, name) {
            return Ok(Node::BatchDir(d, i));
        }
        let Batches::Epoch(epoch) = b else {
            return Err(enoent());
        };
        let (rank, world) = layout::parse_rank(name).ok_or_else(enoent)?;
        Ok(Node::Dir(
            self.dir_id(Batches::Rank { epoch, rank, world }, gds)?,
        ))
    }

    /// The `k`-th listed epoch directory, in the main tree or under `gds/`.
    fn epoch_entry(&self, k: u64, gds: bool) -> Result<Option<DirEntry>> {
        if k >= self.epochs {
            return Ok(None);
        }
        Ok(Some(entry(
            Node::Dir(self.dir_id(Batches::Epoch(k), gds)?),
            EntryType::Dir,
            layout::epoch_name(k),
        )))
    }

    /// The `k`-th entry of the root.
    fn root_entry(&self, k: u64) -> Result<Option<DirEntry>> {
        let fixed = [
            (Node::DatasetJson, EntryType::File, DATASET_JSON),
            (Node::Meta, EntryType::Dir, META),
            (Node::Gds, EntryType::Dir, GDS),
        ];
        match fixed.get(k as usize) {
            Some(&(node, kind, name)) => Ok(Some(entry(node, kind, name.into()))),
            None => self.epoch_entry(k - fixed.len() as u64, false),
        }
    }

    /// The `k`-th entry of an epoch or rank directory: each batch's file and directory, then
    /// the one-open files, then (in an epoch, with `world_size`) the rank views.
    /// Whether entry `k` of epoch or rank directory `d` is a batch's file or directory.
    fn is_batch_entry(&self, d: u32, k: u64) -> Result<bool> {
        let (b, _) = self.dir_entry(d)?;
        Ok(k < layout::batch_file_entry(self.plan().count(b)))
    }

    fn dir_child(&self, d: u32, k: u64) -> Result<Option<DirEntry>> {
        let (b, gds) = self.dir_entry(d)?;
        let file = self.file_kind(d)?;
        let n = self.plan().count(b);
        if k < layout::batch_file_entry(n) {
            let (i, file_entry) = layout::entry_batch(k);
            let name = layout::batch_name(i);
            return Ok(Some(if file_entry {
                let node = Node::Batch(d, i, FileKind::Safetensors);
                entry(node, file, layout::safetensors_name(i))
            } else {
                entry(Node::BatchDir(d, i), EntryType::Dir, name)
            }));
        }
        match k - layout::batch_file_entry(n) {
            0 => {
                return Ok(Some(entry(
                    Node::All(d, FileKind::Safetensors),
                    file,
                    ALL_SAFETENSORS.into(),
                )));
            }
            1 => return Ok(Some(entry(Node::AllDir(d), EntryType::Dir, ALL.into()))),
            _ => {}
        }
        let rank = k - layout::batch_file_entry(n) - 2;
        match (b, self.world_size) {
            (Batches::Epoch(epoch), Some(world)) if rank < world => {
                let id = self.dir_id(Batches::Rank { epoch, rank, world }, gds)?;
                Ok(Some(entry(
                    Node::Dir(id),
                    EntryType::Dir,
                    layout::rank_name(rank, world),
                )))
            }
            _ => Ok(None),
        }
    }

    /// The `k`-th entry of a directory of `.npy` files (a batch's, or `all/`).
    fn npy_child(&self, d: u32, k: u64, node: impl Fn(usize) -> Node) -> Result<Option<DirEntry>> {
        let t = k as usize;
        if t >= self.layout.tensors() {
            return Ok(None);
        }
        Ok(Some(entry(
            node(t),
            self.file_kind(d)?,
            self.layout.npy_name(t),
        )))
    }

    /// Entries of a directory from index `offset` on (`.` and `..` first), at most `limit`;
    /// where `batches_only` (a listing by the daemon itself, of the files it stores), an epoch
    /// or rank directory's batches alone: the rank views after them would each take a
    /// directory id of the 65,536 a mount has, for a listing nobody reads. A listing cut short
    /// so is no end of the directory to the kernel, whose copy of a listing goes on from where
    /// it stopped (and ends only at an empty answer): a reader's listing still gets every entry.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        limit: usize,
        batches_only: bool,
    ) -> Result<Vec<DirEntry>> {
        let node = self.node(ino)?;
        let child = |k: u64| -> Result<Option<DirEntry>> {
            match node {
                Node::Root => self.root_entry(k),
                Node::Gds => self.epoch_entry(k, true),
                Node::Meta => Ok(
                    (k == 0).then(|| entry(Node::StatsJson, EntryType::File, STATS_JSON.into()))
                ),
                Node::Dir(d) if batches_only && !self.is_batch_entry(d, k)? => Ok(None),
                Node::Dir(d) => self.dir_child(d, k),
                Node::BatchDir(d, i) => {
                    self.npy_child(d, k, |t| Node::Batch(d, i, FileKind::Npy(t)))
                }
                Node::AllDir(d) => self.npy_child(d, k, |t| Node::All(d, FileKind::Npy(t))),
                _ => Err(Error::answer(libc::ENOTDIR)),
            }
        };
        let mut out = Vec::new();
        let mut k = offset;
        while out.len() < limit {
            let e = match k {
                0 => Some(DirEntry {
                    ino,
                    kind: EntryType::Dir,
                    name: ".".into(),
                }),
                1 => Some(DirEntry {
                    ino: ROOT_INO,
                    kind: EntryType::Dir,
                    name: "..".into(),
                }),
                _ => child(k - layout::DOT_ENTRIES)?,
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
    pub(crate) fn openable(&self, ino: u64) -> Result<Openable> {
        let node = self.node(ino)?;
        let attr = self.attr(ino, node)?;
        match attr.kind {
            EntryType::Dir => Err(Error::answer(libc::EISDIR)),
            EntryType::Symlink => Err(Error::answer(libc::ELOOP)),
            EntryType::File => match node {
                Node::StatsJson => Ok(Openable::Live(self.stats_json())),
                Node::DatasetJson if self.touched_at.is_some() => {
                    Ok(Openable::Live(self.dataset_json()))
                }
                Node::DatasetJson => Ok(Openable::Fixed),
                Node::All(..) => self.all_file_of(node).map(Openable::All).ok_or_else(enoent),
                _ => Ok(Openable::Batch(self.batch_file_of(node)?, attr.size)),
            },
        }
    }

    /// Where a batch file's backing file is (or will be) in the local cache.
    fn backing_path(&self, node: Node) -> Result<PathBuf> {
        Ok(self.backing.backing_path(self.batch_file_of(node)?))
    }

    /// The bytes at `offset` of dataset.json or stats.json; `EISDIR` for anything else (the
    /// batch files' bytes are the request core's).
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        match self.node(ino)? {
            Node::DatasetJson => Ok(self.dataset_json_at(offset, size)),
            Node::StatsJson => Ok(layout::slice(&[&self.stats_json()], offset, size)),
            _ => Err(Error::answer(libc::EISDIR)),
        }
    }

    /// What a `gds/` symlink `ino` links to: a batch file (whose backing file it names once
    /// materialised), or a one-open file (its file built ahead, else `fallback`, the same file
    /// in the main tree by a relative path).
    pub(crate) fn link(&self, ino: u64) -> Result<Link> {
        if self.getattr(ino)?.kind != EntryType::Symlink {
            return Err(Error::answer(libc::EINVAL));
        }
        let node = self.node(ino)?;
        match node {
            Node::All(..) => Ok(Link::All(
                self.all_file_of(node).ok_or_else(enoent)?,
                self.all_link(node)?,
            )),
            node => Ok(Link::Batch(self.batch_file_of(node)?)),
        }
    }

    /// Where a `gds/` link to a one-open file points while no file built ahead holds it: the
    /// same file in the main tree, by a relative path (a cuFile reader reads it in
    /// compatibility mode).
    fn all_link(&self, node: Node) -> Result<String> {
        let (d, kind) = node.all_file().ok_or(Error::answer(libc::EINVAL))?;
        let file = match kind {
            FileKind::Safetensors => ALL_SAFETENSORS.to_string(),
            FileKind::Npy(t) => format!("{ALL}/{}", self.layout.npy_name(t)),
        };
        let dir = layout::dir_name(self.dir(d)?);
        // Up from the link's directory (gds/, the directory, and all/ for a .npy) to the root.
        let depth = 1 + dir.matches('/').count() + 1 + file.matches('/').count();
        Ok(format!("{}{dir}/{file}", "../".repeat(depth)))
    }

    /// Whether `ino` is a file whose bytes change while mounted (stats.json, and dataset.json
    /// where it counts the objects touched).
    pub(crate) fn is_live(&self, ino: u64) -> bool {
        ino == STATS_JSON_INO || (ino == DATASET_JSON_INO && self.touched_at.is_some())
    }
}

fn entry(node: Node, kind: EntryType, name: String) -> DirEntry {
    DirEntry {
        ino: encode(node),
        kind,
        name,
    }
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
            Node::Batch(3, 0, FileKind::Safetensors),
            Node::Batch(65535, MAX_BATCHES - 1, FileKind::Safetensors),
            Node::BatchDir(1, 12345),
            Node::Batch(2, 99, FileKind::Npy(4095)),
            Node::All(7, FileKind::Safetensors),
            Node::AllDir(65535),
            Node::All(3, FileKind::Npy(4095)),
        ] {
            assert_eq!(decode(encode(node)), Some(node));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(15 << KIND_SHIFT), None);
    }
}
