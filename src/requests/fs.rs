//! The filesystem core: the tree a mount shows, as plain functions over inode numbers that
//! return plain values or an [`Error`] carrying its errno. The FUSE adapter (`kernel/fuse.rs`) only
//! translates, and logs the errors it replies with.
//!
//! Inode numbers are computed, not stored, for everything below an epoch or rank directory:
//! `kind (4 bits) | directory id (16) | batch (32) | tensor (12)`, where the directory id
//! interns the (few) epoch and rank directories that have been looked up. A listing of an
//! epoch with a million batches therefore costs no memory.

use crate::error::{Error, Result, enoent};
use crate::model::item::{FileKind, Item};
use crate::model::plan::{BatchRef, Batches, Plan};
use crate::read::ahead::{Ahead, Opening, Progress, Warming};
use crate::read::builder::{Batch, Builder, TensorOf, TensorRows};
use crate::read::layout::{self, ALL, ALL_SAFETENSORS, Layout, Span};
use crate::read::materialize::Materializer;
use crate::read::page_cache::PageCache;
use crate::read::prefetch::Prefetcher;
use crate::read::readers::{Event, What};
use crate::stats::Stats;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
/// The extended attribute that names a batch file's backing file.
pub(crate) const PATH_XATTR: &str = "user.tensorfs.path";
/// The extended attribute `tensorfs warm` asks of a one-open file: its build started (or the
/// file an earlier mount kept checked) where nothing of it is known yet, and how far it is:
/// `ready`, `skipped` (no room, failed, or stopped by a reader), or the part done (0 to 1). Of a
/// batch file: materialised on the cache (`ready`) or not (`skipped`: no room), once asked.
/// Not listed: it is a request, not an attribute.
pub(crate) const WARM_XATTR: &str = "user.tensorfs.warm";
/// How long a backing file handed out by path stays pinned in the cache.
const PIN_GRACE: Duration = Duration::from_secs(300);

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
    Safetensors(u32, u64),
    BatchDir(u32, u64),
    Npy(u32, u64, usize),
    /// `all.safetensors`: every batch of the directory, back to back.
    AllSafetensors(u32),
    /// `all/`
    AllDir(u32),
    /// `all/NAME.npy`
    AllNpy(u32, usize),
}

impl Node {
    /// The batch file a node is: (directory, batch, which file).
    fn batch_file(self) -> Option<(u32, u64, FileKind)> {
        match self {
            Node::Safetensors(d, i) => Some((d, i, FileKind::Safetensors)),
            Node::Npy(d, i, t) => Some((d, i, FileKind::Npy(t))),
            _ => None,
        }
    }

    /// The one-open file a node is: (directory, which file).
    fn all_file(self) -> Option<(u32, FileKind)> {
        match self {
            Node::AllSafetensors(d) => Some((d, FileKind::Safetensors)),
            Node::AllNpy(d, t) => Some((d, FileKind::Npy(t))),
            _ => None,
        }
    }
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
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub name: String,
}

/// How an openable file is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Openable {
    /// A batch file: materialised and passed through, or served by the daemon.
    Batch,
    /// dataset.json: fixed for the mount's life.
    Fixed,
    /// `all.safetensors`, `all/NAME.npy`: from the file built ahead ([`crate::read::ahead`]) where
    /// there is one, else served by the daemon from the batches a read spans.
    Concatenated,
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

/// Epoch and rank directories by id, and whether each is under `gds/`.
#[derive(Default)]
struct Dirs {
    list: Vec<(Batches, bool)>,
    ids: HashMap<(Batches, bool), u32>,
}

/// What the tree is made from.
pub(crate) struct Tree {
    pub(crate) materializer: Arc<Materializer>,
    pub(crate) builder: Arc<Builder>,
    pub(crate) prefetcher: Prefetcher,
    pub(crate) ahead: Ahead,
    pub(crate) layout: Arc<Layout>,
    pub(crate) epochs: u64,
    pub(crate) world_size: Option<u64>,
    pub(crate) dataset_json: Vec<u8>,
}

pub struct Fs {
    materializer: Arc<Materializer>,
    builder: Arc<Builder>,
    stats: Arc<Stats>,
    prefetcher: Prefetcher,
    ahead: Ahead,
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
            materializer,
            builder,
            prefetcher,
            ahead,
            layout,
            epochs,
            world_size,
            dataset_json,
        } = tree;
        let plan = builder.plan();
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
            stats: builder.stats().clone(),
            builder,
            materializer,
            prefetcher,
            ahead,
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
        &self.stats
    }

    fn plan(&self) -> &Plan {
        self.builder.plan()
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

    /// The cache item a batch file node is (by global batch, so rank views share it, and by the
    /// epoch it repeats, so epochs with one order share it).
    fn item(&self, node: Node) -> Result<Item> {
        let (d, i, kind) = node.batch_file().ok_or(Error::answer(libc::EINVAL))?;
        Ok(Item::of(kind, self.plan().batch_in(self.dir(d)?, i)))
    }

    fn stats_json(&self) -> Vec<u8> {
        let mut v = self.stats().to_json();
        v["memory_bytes"] = serde_json::json!(self.builder.memory());
        v["readers"] = serde_json::json!(self.prefetcher.depths());
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
        let memory = self.builder.memory() as u64;
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

    fn file_kind(&self, d: u32) -> Result<Kind> {
        Ok(if self.in_gds(d)? {
            Kind::Symlink
        } else {
            Kind::File
        })
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        let (kind, size) = match node {
            Node::Root | Node::Meta | Node::Gds | Node::Dir(_) | Node::BatchDir(..) => {
                (Kind::Dir, 0)
            }
            Node::AllDir(_) => (Kind::Dir, 0),
            Node::DatasetJson => (Kind::File, self.dataset_json.len() as u64),
            // Its content changes all the time: each open reads a snapshot of it (direct-io),
            // padded to the size reported here.
            Node::StatsJson => (Kind::File, self.stats_json().len() as u64),
            Node::Safetensors(d, i) | Node::Npy(d, i, _) => {
                let (b, gds) = self.dir_entry(d)?;
                match gds {
                    true => (
                        Kind::Symlink,
                        self.backing_path(node)?.as_os_str().len() as u64,
                    ),
                    false => {
                        let (_, _, kind) = node.batch_file().expect("a batch file");
                        (Kind::File, self.batch_file_size(b, i, kind))
                    }
                }
            }
            Node::AllSafetensors(d) | Node::AllNpy(d, _) => {
                let (b, gds) = self.dir_entry(d)?;
                let (_, kind) = node.all_file().expect("a one-open file");
                match gds {
                    // No backing file holds them: under gds/ they link to the main tree.
                    true => (Kind::Symlink, self.all_link(node)?.len() as u64),
                    false => (Kind::File, self.layout.size(kind, self.plan().dir_rows(b))),
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
                Node::Npy(d, i, self.layout.parse_npy(name).ok_or_else(enoent)?)
            }
            Node::AllDir(d) => Node::AllNpy(d, self.layout.parse_npy(name).ok_or_else(enoent)?),
            _ => return Err(Error::answer(libc::ENOTDIR)),
        };
        self.getattr(encode(node))
    }

    /// A name in an epoch or rank directory: a batch file or directory, a one-open file, or
    /// (in an epoch) a rank view.
    fn lookup_in_dir(&self, d: u32, name: &str) -> Result<Node> {
        let (b, gds) = self.dir_entry(d)?;
        if name == ALL_SAFETENSORS {
            return Ok(Node::AllSafetensors(d));
        }
        if name == ALL {
            return Ok(Node::AllDir(d));
        }
        if let Some(stem) = name.strip_suffix(".safetensors") {
            let i = self.parse_batch(b, stem).ok_or_else(enoent)?;
            return Ok(Node::Safetensors(d, i));
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
            Kind::Dir,
            layout::epoch_name(k),
        )))
    }

    /// The `k`-th entry of the root.
    fn root_entry(&self, k: u64) -> Result<Option<DirEntry>> {
        let fixed = [
            (Node::DatasetJson, Kind::File, DATASET_JSON),
            (Node::Meta, Kind::Dir, META),
            (Node::Gds, Kind::Dir, GDS),
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
                entry(Node::Safetensors(d, i), file, layout::safetensors_name(i))
            } else {
                entry(Node::BatchDir(d, i), Kind::Dir, name)
            }));
        }
        match k - layout::batch_file_entry(n) {
            0 => {
                return Ok(Some(entry(
                    Node::AllSafetensors(d),
                    file,
                    ALL_SAFETENSORS.into(),
                )));
            }
            1 => return Ok(Some(entry(Node::AllDir(d), Kind::Dir, ALL.into()))),
            _ => {}
        }
        let rank = k - layout::batch_file_entry(n) - 2;
        match (b, self.world_size) {
            (Batches::Epoch(epoch), Some(world)) if rank < world => {
                let id = self.dir_id(Batches::Rank { epoch, rank, world }, gds)?;
                Ok(Some(entry(
                    Node::Dir(id),
                    Kind::Dir,
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
                Node::Meta => {
                    Ok((k == 0).then(|| entry(Node::StatsJson, Kind::File, STATS_JSON.into())))
                }
                Node::Dir(d) if batches_only && !self.is_batch_entry(d, k)? => Ok(None),
                Node::Dir(d) => self.dir_child(d, k),
                Node::BatchDir(d, i) => self.npy_child(d, k, |t| Node::Npy(d, i, t)),
                Node::AllDir(d) => self.npy_child(d, k, |t| Node::AllNpy(d, t)),
                _ => Err(Error::answer(libc::ENOTDIR)),
            }
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
        match self.getattr(ino)?.kind {
            Kind::Dir => Err(Error::answer(libc::EISDIR)),
            Kind::Symlink => Err(Error::answer(libc::ELOOP)),
            Kind::File => Ok(match node {
                Node::StatsJson => Openable::Live(self.stats_json()),
                Node::DatasetJson if self.touched_at.is_some() => {
                    Openable::Live(self.dataset_json())
                }
                Node::DatasetJson => Openable::Fixed,
                Node::AllSafetensors(_) | Node::AllNpy(..) => Openable::Concatenated,
                _ => Openable::Batch,
            }),
        }
    }

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
    /// cache: each is read once ([`crate::read::page_cache`]). Where epochs share their files
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
    fn follow(&self, event: Event) {
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
    fn all_file(&self, ino: u64) -> Option<(Batches, FileKind)> {
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

    /// Where a batch file's backing file is (or will be) in the local cache.
    fn backing_path(&self, node: Node) -> Result<PathBuf> {
        Ok(self.materializer.path(self.item(node)?))
    }

    /// The backing file's path, once materialised, pinned for GPUDirect readers.
    async fn handed_out_path(&self, node: Node) -> Result<Vec<u8>> {
        let (_, path) = self
            .materialize(encode(node))
            .await?
            .ok_or_else(|| Error::limit(libc::EIO, "the cache cannot hold the file now"))?;
        self.materializer.pin(self.item(node)?, PIN_GRACE);
        Ok(path.into_os_string().into_encoded_bytes())
    }

    /// `readlink` of a `gds/` symlink.
    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        if self.getattr(ino)?.kind != Kind::Symlink {
            return Err(Error::answer(libc::EINVAL));
        }
        match self.node(ino)? {
            node @ (Node::AllSafetensors(_) | Node::AllNpy(..)) => {
                match self.all_built(ino).await {
                    Some(path) => Ok(path.into_os_string().into_encoded_bytes()),
                    None => Ok(self.all_link(node)?.into_bytes()),
                }
            }
            node => self.handed_out_path(node).await,
        }
    }

    /// The path of one-open file `ino`'s file built ahead, if there is one now; a reader asking
    /// for it is a reader of the file, and has the next epoch's built.
    async fn all_built(&self, ino: u64) -> Option<PathBuf> {
        let (dir, kind) = self.all_file(ino)?;
        let path = self.ahead.built_path(dir, kind).await?;
        self.follow(Event::at(dir, 0, What::Whole(kind)));
        Some(path)
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

    /// Whether `ino` is a batch file (`.safetensors` or `.npy`) of the main tree.
    pub(crate) fn is_batch_file(&self, ino: u64) -> bool {
        self.getattr(ino).is_ok_and(|a| a.kind == Kind::File)
            && self.node(ino).is_ok_and(|n| n.batch_file().is_some())
    }

    /// The names of a node's extended attributes.
    pub(crate) fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let built = || {
            self.is_all_file(ino)
                && (self.all_file(ino)).is_some_and(|(dir, kind)| self.ahead.has_path(dir, kind))
        };
        Ok(if self.is_batch_file(ino) || built() {
            format!("{PATH_XATTR}\0").into_bytes()
        } else {
            Vec::new()
        })
    }

    /// `user.tensorfs.path`: the backing file's path, materialised and pinned; for a one-open
    /// file, its file built ahead while there is one.
    pub async fn getxattr(&self, ino: u64, name: &str) -> Result<Vec<u8>> {
        if name == WARM_XATTR && self.is_all_file(ino) {
            let (dir, kind) = self.all_file(ino).ok_or(Error::answer(libc::ENODATA))?;
            return Ok(match self.ahead.warm(dir, kind) {
                Warming::Ready => "ready".into(),
                Warming::Skipped => "skipped".into(),
                Warming::Under(done) => format!("{done:.4}").into_bytes(),
            });
        }
        if name == PATH_XATTR && self.is_all_file(ino) {
            return self
                .all_built(ino)
                .await
                .map(|path| path.into_os_string().into_encoded_bytes())
                .ok_or(Error::answer(libc::ENODATA));
        }
        if !self.is_batch_file(ino) {
            return Err(Error::answer(libc::ENODATA));
        }
        match name {
            // `tensorfs warm`: the file kept on the local cache, where its opens find it.
            WARM_XATTR => Ok(match self.materialize(ino).await? {
                Some(_) => "ready".into(),
                None => "skipped".into(),
            }),
            PATH_XATTR => self.handed_out_path(self.node(ino)?).await,
            _ => Err(Error::answer(libc::ENODATA)),
        }
    }

    /// Whether `ino` is a one-open file of the main tree.
    fn is_all_file(&self, ino: u64) -> bool {
        self.getattr(ino).is_ok_and(|a| a.kind == Kind::File)
            && self.node(ino).is_ok_and(|n| n.all_file().is_some())
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

fn entry(node: Node, kind: Kind, name: String) -> DirEntry {
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
            Node::Safetensors(3, 0),
            Node::Safetensors(65535, MAX_BATCHES - 1),
            Node::BatchDir(1, 12345),
            Node::Npy(2, 99, 4095),
            Node::AllSafetensors(7),
            Node::AllDir(65535),
            Node::AllNpy(3, 4095),
        ] {
            assert_eq!(decode(encode(node)), Some(node));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(15 << KIND_SHIFT), None);
    }
}
