//! One-open files (`all.safetensors`, `all/NAME.npy`) built whole ahead of their readers and
//! kept in the cache ([`crate::read::produce::ahead`]): room reserved for a build outside the index,
//! the built file indexed (its meta set, renamed into place), taken out again to be written
//! over or removed once behind its reader, and found again by a later mount.

use super::format::{META_LEN, clear_meta_attr, meta_bytes, meta_len, meta_path};
use super::{DiskCache, Entry, Stamp};
use crate::model::item::Item;
use crate::stats::Stats;
use anyhow::Result;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

impl DiskCache {
    /// Indexes the one-open files kept from earlier mounts ([`crate::read::produce::ahead`]): their bytes.
    /// Those without their meta are removed; the others are checked on first use.
    pub(super) fn scan_kept(&self, entries: &mut HashMap<Item, Entry>) -> u64 {
        let mut used = 0;
        let dir = self.batches.join(self.layout.kept_all());
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let path = e.path();
            match (
                self.layout.parse_all_name(&name),
                e.metadata(),
                meta_len(&path),
            ) {
                (Some(item), Ok(md), Some(m)) if md.is_file() => {
                    let bytes = md.len() + m;
                    used += bytes;
                    entries.insert(item, Entry::found(bytes));
                }
                _ => {
                    let _ = std::fs::remove_file(&path);
                    let _ = std::fs::remove_file(meta_path(&path));
                }
            }
        }
        used
    }

    /// Reserves `bytes` of the capacity for a file kept outside the index (a one-open file
    /// built ahead, [`crate::read::produce::ahead`]), evicting for it only items that `distance` says are never
    /// needed again: `false` where that leaves too little room. Given back with
    /// [`DiskCache::unreserve`].
    pub(crate) fn reserve_spare(
        &self,
        bytes: u64,
        distance: &dyn Fn(Item) -> u64,
        stats: &Stats,
    ) -> bool {
        let _one_at_a_time = self.reserving.lock().unwrap();
        if !self.spare_room(bytes, distance, stats) {
            return false;
        }
        self.used.fetch_add(bytes, Ordering::Relaxed);
        Stats::set(&stats.c.cache_bytes, self.used());
        true
    }

    /// Gives back what [`DiskCache::reserve_spare`] reserved.
    pub(crate) fn unreserve(&self, bytes: u64, stats: &Stats) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        Stats::set(&stats.c.cache_bytes, self.used());
    }

    /// Indexes a one-open file built whole at `tmp` (its bytes of the capacity reserved by
    /// [`DiskCache::reserve_spare`], `reserved` of them) as `item`, renamed into place, without
    /// its meta: this mount has it as written, and only a later mount needs its checksum, which
    /// [`DiskCache::seal_kept`] adds as the mount ends. Most are written over or removed once
    /// behind their reader, long before: the crc32c of each as it was built was 8% of the
    /// daemon's CPU in an epoch of `all/` (measured with the process's CPU clock). A mount that
    /// ends without sealing leaves files without their meta, which the next one removes. The
    /// stamp it is kept with. Not fsynced, as no cache file is.
    pub(crate) fn keep(
        &self,
        item: Item,
        file: &File,
        tmp: &Path,
        reserved: u64,
        stats: &Stats,
    ) -> Result<Stamp> {
        let len = file.metadata()?.len();
        // Written over a file gone by, it has that file's meta, which would pass for its own.
        clear_meta_attr(file)?;
        self.settle(file, tmp, None, &self.path(item))?;
        let stamp = Stamp::of(&file.metadata()?);
        // Counted with the meta it gets when sealed.
        let bytes = len + META_LEN;
        self.used.fetch_add(bytes, Ordering::Relaxed);
        self.used.fetch_sub(reserved, Ordering::Relaxed);
        self.index(item, bytes, Some(stamp));
        self.unsealed.lock().unwrap().insert(item);
        Stats::set(&stats.c.cache_bytes, self.used());
        Ok(stamp)
    }

    /// Gives each one-open file kept unsealed in this mount ([`DiskCache::keep`]), and still as
    /// kept, its meta: its length and the crc32c of its bytes, read back (from the page cache,
    /// mostly), so that a later mount checks it before use. As the mount ends. A file that
    /// cannot be sealed is removed (a later mount would remove it unread). How many were sealed.
    pub(crate) fn seal_kept(&self) -> usize {
        let items: Vec<Item> = self.unsealed.lock().unwrap().drain().collect();
        let mut sealed = 0;
        for item in items {
            let Some(stamp) = (self.entries.lock().unwrap().get(&item)).and_then(|e| e.checked)
            else {
                continue;
            };
            let path = self.path(item);
            match self.seal(item, &path, stamp) {
                Ok(true) => sealed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!("not keeping {} for a later mount: {e:#}", path.display());
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        sealed
    }

    /// Seals kept file `item` at `path` if it is still as kept (`stamp`): false where not.
    fn seal(&self, item: Item, path: &Path, stamp: Stamp) -> Result<bool> {
        let file = File::open(path)?;
        if Stamp::of(&file.metadata()?) != stamp {
            return Ok(false);
        }
        let crc = super::crc_of(&file, stamp.size, &|_| {})?;
        let meta = meta_bytes(stamp.size, crc, &self.identity(item));
        if !self.meta_as_attr(&file, &meta)? {
            self.place(&[meta.as_slice()], None, &meta_path(path))?;
        }
        Ok(true)
    }

    /// Takes kept one-open file `item`, as kept with `stamp`, out of the index to be written
    /// over: moved to a new temp path, its bytes of the capacity held as a reservation
    /// ([`DiskCache::unreserve`]). That path and those bytes; `None` where it is not indexed
    /// as kept with that stamp any more (evicted, or replaced).
    pub(crate) fn unkeep(&self, item: Item, stamp: Stamp) -> Option<(PathBuf, u64)> {
        let mut entries = self.entries.lock().unwrap();
        if entries.get(&item)?.checked != Some(stamp) {
            return None;
        }
        let path = self.path(item);
        let tmp = self.tmp_path();
        std::fs::rename(&path, &tmp).ok()?;
        let bytes = entries.remove(&item)?.bytes;
        drop(entries);
        let _ = std::fs::remove_file(meta_path(&path));
        self.remove_empty_dirs(&path);
        Some((tmp, bytes))
    }

    /// Removes kept one-open file `item`, if it is still indexed as kept with `stamp`.
    pub(crate) fn let_go(&self, item: Item, stamp: Stamp, stats: &Stats) {
        let same = self.entries.lock().unwrap().get(&item).map(|e| e.checked) == Some(Some(stamp));
        if same {
            self.remove(item, stats);
        }
    }

    /// A new file in the cache's temp directory, for reading and writing, that the caller
    /// removes (or a later start does, once this process is gone).
    pub(crate) fn scratch_file(&self) -> Result<(File, PathBuf)> {
        self.tmp_file()
    }
}
