//! One-open files (`all.safetensors`, `all/NAME.npy`) built whole ahead of their readers and
//! kept in the cache ([`crate::read::build::ahead`]): room reserved for a build outside the index,
//! the built file indexed (its meta set, renamed into place), taken out again to be written
//! over or removed once behind its reader, and found again by a later mount.

use super::format::{meta_bytes, meta_len, meta_path};
use super::{DiskCache, Entry, Stamp};
use crate::model::item::Item;
use crate::stats::Stats;
use anyhow::Result;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

impl DiskCache {
    /// Indexes the one-open files kept from earlier mounts ([`crate::read::build::ahead`]): their bytes.
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
    /// built ahead, [`crate::read::build::ahead`]), evicting for it only items that `distance` says are never
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
    /// [`DiskCache::reserve_spare`], `reserved` of them) as `item`: its meta (length and
    /// crc32c of its bytes, `crc`) set on it, renamed into place. The stamp it is kept with. Not
    /// fsynced, as no cache file is: its checksum is checked on first use after a restart.
    pub(crate) fn keep(
        &self,
        item: Item,
        file: &File,
        tmp: &Path,
        crc: u32,
        reserved: u64,
        stats: &Stats,
    ) -> Result<Stamp> {
        let len = file.metadata()?.len();
        let meta = meta_bytes(len, crc, &self.identity(item));
        let dest = self.path(item);
        let sidecar = self.settle(file, tmp, Some(&meta), &dest)?;
        if sidecar && let Err(e) = self.place(&[meta.as_slice()], None, &meta_path(&dest)) {
            let _ = std::fs::remove_file(&dest);
            return Err(e);
        }
        let stamp = Stamp::of(&file.metadata()?);
        let bytes = len + meta.len() as u64;
        self.used.fetch_add(bytes, Ordering::Relaxed);
        self.used.fetch_sub(reserved, Ordering::Relaxed);
        self.index(item, bytes, Some(stamp));
        Stats::set(&stats.c.cache_bytes, self.used());
        Ok(stamp)
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
