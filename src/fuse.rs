//! The thin fuser adapter: each callback is translated into a call on [`Fs`]; reads are
//! answered from tokio tasks, so the FUSE threads never wait on a batch build.

use crate::ahead::Opening;
use crate::fs::{Attr, Fs, Kind, Openable};
use crate::open_files::{Mode, OpenFiles, ReadFrom};
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};
use tokio::runtime::Handle as Handle_;
use tracing::Instrument;

/// Everything in a mount is immutable for the mount's life, so the kernel may cache it long.
const TTL: Duration = Duration::from_secs(3600);

pub struct FuseAdapter {
    fs: Arc<Fs>,
    runtime: Handle_,
    mounted_at: SystemTime,
    uid: u32,
    gid: u32,
    /// Whether to try passthrough: asked for, accepted by the kernel at init, and not refused
    /// since.
    passthrough: Arc<AtomicBool>,
    open_files: Arc<OpenFiles<BackingId>>,
    /// `opens=kernel`: the kernel answers opens alone ([`crate::page_cache`]).
    kernel_opens: bool,
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
    pub fn new(fs: Arc<Fs>, runtime: Handle_, passthrough: bool, kernel_opens: bool) -> Self {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        FuseAdapter {
            fs,
            runtime,
            mounted_at: SystemTime::now(),
            uid,
            gid,
            passthrough: Arc::new(AtomicBool::new(passthrough && !kernel_opens)),
            open_files: Arc::default(),
            kernel_opens,
        }
    }

    /// Whether `ino`'s bytes change while mounted and the kernel caches them across opens
    /// (`opens=kernel`): then its attributes are never cached, and its modification time is
    /// always new, so that each open looks it up and drops the pages it kept
    /// (`FUSE_AUTO_INVAL_DATA`).
    fn revalidated(&self, ino: u64) -> bool {
        self.kernel_opens && self.fs.is_live(ino)
    }

    /// How long the kernel may keep `ino`'s entry and attributes.
    fn ttl(&self, ino: u64) -> Duration {
        match self.revalidated(ino) {
            true => Duration::ZERO,
            false => TTL,
        }
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        let (kind, perm, nlink) = match a.kind {
            Kind::Dir => (FileType::Directory, 0o555, 2),
            Kind::File => (FileType::RegularFile, 0o444, 1),
            Kind::Symlink => (FileType::Symlink, 0o777, 1),
        };
        let mtime = match self.revalidated(a.ino) {
            true => SystemTime::now(),
            false => self.mounted_at,
        };
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: self.mounted_at,
            mtime,
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
    open_files: Arc<OpenFiles<BackingId>>,
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
        let passthrough = self.answer(ino, fh, file, reply);
        self.fs.opened(ino, started.elapsed(), passthrough);
    }

    /// Answers an open of a file served from `file` where there is one (by passthrough where
    /// the inode's mode allows), else by the daemon: whether it went by passthrough.
    fn answer(&self, ino: u64, fh: u64, file: Option<Arc<File>>, reply: ReplyOpen) -> bool {
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        let (mode, refused) = self
            .open_files
            .open_batch(ino, fh, file, passthrough, |f| reply.open_backing(f));
        if let Some(e) = refused {
            tracing::warn!("FUSE passthrough refused ({e}): reads are served by the daemon");
            self.passthrough.store(false, Ordering::Relaxed);
        }
        match mode {
            Mode::Passthrough(id) => {
                // The kernel takes no caching flags with passthrough (EIO otherwise).
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                true
            }
            Mode::Cached => {
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
                false
            }
        }
    }
}

impl FuseAdapter {
    /// Hands directory `ino`'s entries from index `offset` on to `add` (with the offset of the
    /// entry after each) until `add` says the reply is full. Entries are produced lazily, a
    /// reply buffer's worth at a time.
    fn list(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(&crate::fs::DirEntry, u64) -> crate::error::Result<bool>,
    ) -> crate::error::Result<()> {
        const CHUNK: usize = 256;
        let mut next = offset;
        loop {
            let entries = self.fs.readdir(ino.0, next, CHUNK)?;
            let done = entries.len() < CHUNK;
            for e in &entries {
                next += 1;
                if add(e, next)? {
                    return Ok(());
                }
            }
            if done {
                return Ok(());
            }
        }
    }

    fn opener(&self) -> Opener {
        Opener {
            fs: self.fs.clone(),
            open_files: self.open_files.clone(),
            passthrough: self.passthrough.clone(),
        }
    }
}

/// Bytes the kernel reads ahead of a sequential reader (see `mount::raise_readahead`).
pub const READAHEAD: u32 = 4 << 20;

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large reads: fewer round trips through the daemon.
        let _ = config.set_max_readahead(READAHEAD);
        // Listings carry their entries' attributes where the kernel sees them used: its first
        // buffer always, the next ones once names of the directory are looked up (`ls -l`,
        // scandir and stat), so those stats cost no round trip each. Not every buffer: a
        // plain `ls` of 2M entries then took 8.1 s instead of 0.8 s, and 2.3 GB of kernel
        // memory for their inodes.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        if self.kernel_opens {
            // See `revalidated`: how stats.json stays live without opens.
            let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        }
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
            Ok(a) => reply.entry(&self.ttl(a.ino), &self.attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e, "lookup")),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl(a.ino), &self.attr(&a)),
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
        if self.kernel_opens {
            // The kernel answers this open and every later one itself.
            return reply.error(Errno::ENOSYS);
        }
        let fh = self.open_files.next_fh();
        match kind {
            Openable::Live(snapshot) => {
                self.open_files.open_snapshot(fh, snapshot);
                return reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            // Its bytes never change: the kernel keeps them cached across opens.
            Openable::Fixed => {
                return reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
            }
            // From the file built ahead where there is one, else by the daemon; a reader that
            // has the next epoch's built meanwhile.
            Openable::Concatenated => {
                let (fs, opener) = (self.fs.clone(), self.opener());
                let finish = move |file: Option<Arc<File>>, reply| {
                    let from_file = file.is_some();
                    if opener.answer(ino.0, fh, file, reply) {
                        fs.opened_by_passthrough();
                    }
                    if from_file {
                        fs.note_reader(ino.0);
                    }
                };
                match self.fs.open_all(ino.0) {
                    Opening::Ready(file) => finish(Some(file), reply),
                    Opening::Daemon => finish(None, reply),
                    Opening::Soon(progress) => {
                        let fs = self.fs.clone();
                        self.runtime.spawn(async move {
                            let file = fs.all_when_built(ino.0, progress).await;
                            finish(file, reply)
                        });
                    }
                }
                return;
            }
            Openable::Batch => {}
        }
        let started = std::time::Instant::now();
        let span = tracing::debug_span!("open", ino = ino.0);
        let _entered = span.enter();
        // Already materialised (the usual case, with the prefetcher ahead): answered here, on
        // the FUSE thread, not behind the building work queued on the worker pool.
        if let Some(file) = self.fs.materialized(ino.0) {
            self.opener().finish(ino.0, fh, Some(file), started, reply);
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
        self.open_files.release(ino.0, fh.0);
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
        if self.kernel_opens {
            if let Some(data) = self.fs.read_at_hand(ino.0, offset, size) {
                reply.data(&data);
                // After the reply: what it schedules wakes workers, which costs more than the
                // read (measured: a tripwire read took 330 µs with it before, 60 after).
                self.fs.note_reader(ino.0);
                return;
            }
            let span = tracing::debug_span!("read", ino = ino.0, offset, size);
            let task = async move {
                match fs.read_unopened(ino.0, offset, size).await {
                    Ok(data) => reply.data(&data),
                    Err(e) => reply.error(errno(e, "read")),
                }
            };
            self.runtime.spawn(task.instrument(span));
            return;
        }
        let ReadFrom { file, snapshot } = self.open_files.read_from(fh.0);
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
        let listed = self.list(ino, offset, |e, next| {
            let kind = match e.kind {
                Kind::Dir => FileType::Directory,
                Kind::File => FileType::RegularFile,
                Kind::Symlink => FileType::Symlink,
            };
            Ok(reply.add(INodeNo(e.ino), next, kind, &e.name))
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e, "readdir")),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listed = self.list(ino, offset, |e, next| {
            let a = self.fs.getattr(e.ino)?;
            let attr = self.attr(&a);
            let ttl = self.ttl(e.ino);
            Ok(reply.add(INodeNo(e.ino), next, &e.name, &ttl, &attr, Generation(0)))
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e, "readdirplus")),
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
