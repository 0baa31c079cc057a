//! The thin fuser adapter: each callback is translated into a call on [`Fs`]; reads are
//! answered from tokio tasks, so the FUSE threads never wait on a batch build.

use crate::fs::{Attr, Fs, Kind, Openable};
use crate::stats::Stats;
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};
use tokio::runtime::Handle as Handle_;
use tracing::Instrument;

/// Everything in a mount is immutable for the mount's life, so the kernel may cache it long.
const TTL: Duration = Duration::from_secs(3600);

/// An open file: the backing file it was served from, or the content it was opened with
/// (stats.json: one snapshot per open, so a read never mixes two), and its passthrough id.
#[derive(Default)]
struct Handle {
    file: Option<Arc<File>>,
    snapshot: Option<Arc<Vec<u8>>>,
    backing: Option<Arc<BackingId>>,
}

/// Open files and the passthrough ids of their inodes (the kernel wants one backing file per
/// inode at a time, so opens of one inode share it).
///
/// The kernel also refuses (EIO) to mix modes on one inode: while it is open by passthrough,
/// every open must be; while it is open through the page cache, none may be. So an open follows
/// the mode the inode is in, whatever its own materialisation gave.
#[derive(Default)]
struct Handles {
    open: HashMap<u64, Handle>,
    backing: HashMap<u64, Weak<BackingId>>,
    /// Opens served by the daemon, per inode.
    cached: HashMap<u64, u32>,
}

pub struct FuseAdapter {
    fs: Arc<Fs>,
    runtime: Handle_,
    mounted_at: SystemTime,
    uid: u32,
    gid: u32,
    /// Whether to try passthrough: asked for, accepted by the kernel at init, and not refused
    /// since.
    passthrough: Arc<AtomicBool>,
    handles: Arc<Mutex<Handles>>,
    next_fh: AtomicU64,
}

/// The errno of an error of the core, which is logged here, once, as it is replied.
fn errno(e: crate::error::Error, op: &str) -> Errno {
    e.log(op);
    Errno::from_i32(e.errno())
}

/// An xattr reply: the size when asked for it (`size == 0`), else the value if it fits.
fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32)
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(value)
    }
}

impl FuseAdapter {
    pub fn new(fs: Arc<Fs>, runtime: Handle_, passthrough: bool) -> Self {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        FuseAdapter {
            fs,
            runtime,
            mounted_at: SystemTime::now(),
            uid,
            gid,
            passthrough: Arc::new(AtomicBool::new(passthrough)),
            handles: Arc::default(),
            next_fh: AtomicU64::new(1),
        }
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        let (kind, perm, nlink) = match a.kind {
            Kind::Dir => (FileType::Directory, 0o555, 2),
            Kind::File => (FileType::RegularFile, 0o444, 1),
            Kind::Symlink => (FileType::Symlink, 0o777, 1),
        };
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

/// What finishing an open needs, shareable with the task that materialises the file.
struct Opener {
    fs: Arc<Fs>,
    handles: Arc<Mutex<Handles>>,
    passthrough: Arc<AtomicBool>,
}

impl Opener {
    /// Answers an open of a batch file, by passthrough where the inode's mode allows.
    fn finish(
        &self,
        ino: u64,
        fh: u64,
        file: Option<Arc<File>>,
        started: std::time::Instant,
        reply: ReplyOpen,
    ) {
        let stats = self.fs.stats();
        Stats::add(&stats.c.opens, 1);
        stats.stall(started.elapsed());
        Stats::add(&stats.c.batches_served, 1);
        Stats::add(
            &stats.c.bytes_served,
            self.fs.getattr(ino).map_or(0, |a| a.size),
        );
        let mut h = self.handles.lock().unwrap();
        let in_use = h.backing.get(&ino).and_then(Weak::upgrade);
        let cached = h.cached.get(&ino).copied().unwrap_or(0) > 0;
        let backing = match (&file, in_use) {
            (_, Some(id)) => Some(id),
            (Some(file), None) if !cached && self.passthrough.load(Ordering::Relaxed) => {
                match reply.open_backing(file.as_ref()) {
                    Ok(id) => {
                        let id = Arc::new(id);
                        h.backing.insert(ino, Arc::downgrade(&id));
                        Some(id)
                    }
                    Err(e) => {
                        tracing::warn!(
                            "FUSE passthrough refused ({e}): reads are served by the daemon"
                        );
                        self.passthrough.store(false, Ordering::Relaxed);
                        None
                    }
                }
            }
            _ => None,
        };
        if backing.is_none() {
            *h.cached.entry(ino).or_default() += 1;
        }
        let handle = Handle {
            file,
            snapshot: None,
            backing: backing.clone(),
        };
        h.open.insert(fh, handle);
        drop(h);
        match backing {
            Some(id) => {
                Stats::add(&stats.c.passthrough_opens, 1);
                // The kernel takes no caching flags with passthrough (EIO otherwise).
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id)
            }
            None => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
        }
    }
}

impl FuseAdapter {
    fn opener(&self) -> Opener {
        Opener {
            fs: self.fs.clone(),
            handles: self.handles.clone(),
            passthrough: self.passthrough.clone(),
        }
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large reads: fewer round trips through the daemon.
        let _ = config.set_max_readahead(1 << 20);
        if self.passthrough.load(Ordering::Relaxed) {
            // Backing files live on an ordinary filesystem: one level of stacking below us.
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(2).is_ok();
            if !ok {
                tracing::warn!(
                    "the kernel does not offer FUSE passthrough: reads are served by the daemon"
                );
            }
            self.passthrough.store(ok, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.fs.lookup(parent.0, name) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e, "lookup")),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(errno(e, "getattr")),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        let kind = match self.fs.openable(ino.0) {
            Ok(k) => k,
            Err(e) => return reply.error(errno(e, "open")),
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        match kind {
            Openable::Live(snapshot) => {
                let handle = Handle {
                    snapshot: Some(Arc::new(snapshot)),
                    ..Handle::default()
                };
                self.handles.lock().unwrap().open.insert(fh, handle);
                return reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            // Their bytes never change: the kernel keeps them cached across opens.
            Openable::Fixed | Openable::Concatenated => {
                return reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
            }
            Openable::Batch => {}
        }
        let started = std::time::Instant::now();
        let span = tracing::debug_span!("open", ino = ino.0);
        let _entered = span.enter();
        // Already materialised (the usual case, with the prefetcher ahead): answered here, on
        // the FUSE thread, not behind the building work queued on the worker pool.
        if let Some(file) = self.fs.materialized(ino.0) {
            self.opener()
                .finish(ino.0, fh, Some(Arc::new(file)), started, reply);
            self.fs.note_reader(ino.0);
            return;
        }
        let fs = self.fs.clone();
        let opener = self.opener();
        let task = async move {
            match fs.materialize(ino.0).await {
                Ok(f) => {
                    opener.finish(ino.0, fh, f.map(|(file, _)| Arc::new(file)), started, reply)
                }
                Err(e) => reply.error(errno(e, "open")),
            }
        };
        self.runtime.spawn(task.instrument(span.clone()));
    }

    /// Nothing is ever written, so a close has nothing to flush. ENOSYS (answered here, not by
    /// fuser's default, which logs a warning each time) makes the kernel stop sending FLUSH at
    /// all: answering ok instead cost a round trip on every close (measured: warm reads of
    /// batch files 25% slower).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut h = self.handles.lock().unwrap();
        if let Some(closed) = h.open.remove(&fh.0)
            && closed.backing.is_none()
            && closed.snapshot.is_none()
            && let Some(n) = h.cached.get_mut(&ino.0)
        {
            *n -= 1;
            if *n == 0 {
                h.cached.remove(&ino.0);
            }
        }
        if h.backing.get(&ino.0).is_some_and(|w| w.strong_count() == 0) {
            h.backing.remove(&ino.0);
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        let (file, snapshot) = match self.handles.lock().unwrap().open.get(&fh.0) {
            Some(h) => (h.file.clone(), h.snapshot.clone()),
            None => (None, None),
        };
        if let Some(snapshot) = snapshot {
            let start = (offset as usize).min(snapshot.len());
            let end = (start + size as usize).min(snapshot.len());
            return reply.data(&snapshot[start..end]);
        }
        let span = tracing::debug_span!("read", ino = ino.0, offset, size);
        let task = async move {
            match fs.read_open(ino.0, file, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(e, "read")),
            }
        };
        self.runtime.spawn(task.instrument(span));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.fs.clone();
        self.runtime.spawn(async move {
            match fs.readlink(ino.0).await {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(errno(e, "readlink")),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Entries are produced lazily, a reply buffer's worth at a time.
        const CHUNK: usize = 256;
        let mut next = offset;
        loop {
            let entries = match self.fs.readdir(ino.0, next, CHUNK) {
                Ok(e) => e,
                Err(e) => return reply.error(errno(e, "readdir")),
            };
            let done = entries.len() < CHUNK;
            for e in entries {
                let kind = if e.kind == Kind::Dir {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                next += 1;
                if reply.add(INodeNo(e.ino), next, kind, &e.name) {
                    return reply.ok();
                }
            }
            if done {
                return reply.ok();
            }
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        match self.fs.getattr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(e, "access")),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let fs = self.fs.clone();
        let name = name.to_string_lossy().into_owned();
        self.runtime.spawn(async move {
            match fs.getxattr(ino.0, &name).await {
                Ok(value) => xattr_reply(reply, &value, size),
                Err(e) => reply.error(errno(e, "getxattr")),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino.0) {
            Ok(names) => xattr_reply(reply, &names, size),
            Err(e) => reply.error(errno(e, "listxattr")),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    // Every call that would change the tree is refused: the mount is read-only.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _wf: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
}
