//! The thin fuser adapter: each callback is one call into the core ([`Requests`] for open
//! files, [`Fs`] for the tree) and one reply; answers that wait on a build are replied from
//! tokio tasks, so the FUSE threads never wait on one.

use crate::requests::fs::{Attr, EntryType, Fs};
use crate::requests::{Answer, Opened, Registrar, Requests, Served};
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::runtime::Handle as Handle_;

/// Everything in a mount is immutable for the mount's life, so the kernel may cache it long.
const TTL: Duration = Duration::from_secs(3600);

pub(crate) struct FuseAdapter {
    requests: Arc<Requests<BackingId>>,
    fs: Arc<Fs>,
    runtime: Handle_,
    mounted_at: SystemTime,
    uid: u32,
    gid: u32,
    /// The kernel opens directories without asking (it offered `FUSE_NO_OPENDIR_SUPPORT`).
    no_opendir: bool,
}

/// An open's reply, which registers the backing file of a passthrough open.
struct OpenReply(ReplyOpen);

impl Registrar for OpenReply {
    type Id = BackingId;

    fn register(&self, file: &File) -> std::io::Result<BackingId> {
        self.0.open_backing(file)
    }
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
    pub(crate) fn new(requests: Arc<Requests<BackingId>>, runtime: Handle_) -> Self {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        FuseAdapter {
            fs: requests.fs().clone(),
            requests,
            runtime,
            mounted_at: SystemTime::now(),
            uid,
            gid,
            no_opendir: false,
        }
    }

    /// Replies `answer` with `reply`: at once, or from a task once it is ready; then does what
    /// the core asked to be done after the reply.
    fn answer<T: Send + 'static>(&self, answer: Answer<T>, reply: impl FnOnce(T) + Send + 'static) {
        match answer {
            Answer::Now(value, then) => {
                reply(value);
                then.run();
            }
            Answer::Later(ready) => {
                self.runtime.spawn(async move {
                    let (value, then) = ready.await;
                    reply(value);
                    then.run();
                });
            }
        }
    }

    /// Whether `ino`'s bytes change while mounted and the kernel caches them across opens
    /// (`opens=kernel`): then its attributes are never cached, and its modification time is
    /// always new, so that each open looks it up and drops the pages it kept
    /// (`FUSE_AUTO_INVAL_DATA`).
    fn revalidated(&self, ino: u64) -> bool {
        self.requests.kernel_opens() && self.fs.is_live(ino)
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
            EntryType::Dir => (FileType::Directory, 0o555, 2),
            EntryType::File => (FileType::RegularFile, 0o444, 1),
            EntryType::Symlink => (FileType::Symlink, 0o777, 1),
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

impl FuseAdapter {
    /// Hands directory `ino`'s entries from index `offset` on to `add` (with the offset of the
    /// entry after each) until `add` says the reply is full. Entries are produced lazily, a
    /// reply buffer's worth at a time.
    fn list(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(&crate::requests::fs::DirEntry, u64) -> crate::error::Result<bool>,
    ) -> crate::error::Result<()> {
        const CHUNK: usize = 256;
        let batches_only = from_daemon(req);
        let mut next = offset;
        loop {
            let entries = self.fs.readdir(ino.0, next, CHUNK, batches_only)?;
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
}

/// Whether a request comes from the daemon itself: its own listings of the mount, which make
/// the files it stores in the page cache known to the kernel ([`crate::read::follow::page_cache`]) and
/// need only a directory's batches. The kernel names the thread that asked.
fn from_daemon(req: &Request) -> bool {
    let pid = req.pid();
    pid == std::process::id() || std::path::Path::new(&format!("/proc/self/task/{pid}")).exists()
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel's readahead stays at its default (128 KiB): what a reader of a file the
        // daemon serves reads next is stored in the page cache ahead of it (the prefetcher's),
        // and a window of several MiB read a small tensor's rows of hundreds of batches ahead
        // of the reader, each read waiting for row groups far ahead to be decoded.
        // Listings carry their entries' attributes where the kernel sees them used: its first
        // buffer always, the next ones once names of the directory are looked up (`ls -l`,
        // scandir and stat), so those stats cost no round trip each. Not every buffer: a
        // plain `ls` of 2M entries then took 8.1 s instead of 0.8 s, and 2.3 GB of kernel
        // memory for their inodes.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Directories hold no state between opendir and releasedir here (a listing is by
        // offset), so where the kernel can do without them, opendir answers ENOSYS and the
        // kernel stops sending both: two round trips less per listing, which the page-cache
        // daemon's own listings, which make the files it stores known to the kernel, make one of
        // per batch (`PageCache::make_file_known`).
        self.no_opendir = config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        if self.requests.kernel_opens() {
            // See `revalidated`: how stats.json stays live without opens.
            let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        }
        if self.requests.passthrough() {
            // Backing files live on an ordinary filesystem: one level of stacking below us.
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(2).is_ok();
            if !ok {
                tracing::warn!(
                    "the kernel does not offer FUSE passthrough: reads are served by the daemon"
                );
                self.requests.without_passthrough();
            }
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
        let answer = self.requests.open(ino.0, flags.0, OpenReply(reply));
        self.answer(answer, |(OpenReply(reply), opened)| match opened {
            Ok(Opened { fh, served }) => match served {
                // The kernel takes no caching flags with passthrough (EIO otherwise).
                Served::Passthrough(id) => {
                    reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id)
                }
                Served::Cached => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
                Served::Direct => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            },
            Err(e) => reply.error(errno(e, "open")),
        });
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
        self.requests.release(ino.0, fh.0);
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
        let answer = self.requests.read(ino.0, fh.0, offset, size);
        self.answer(answer, |read| match read {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e, "read")),
        });
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.no_opendir {
            true => reply.error(Errno::ENOSYS),
            false => reply.opened(FileHandle(0), FopenFlags::empty()),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let requests = self.requests.clone();
        self.runtime.spawn(async move {
            match requests.readlink(ino.0).await {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(errno(e, "readlink")),
            }
        });
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.list(req, ino, offset, |e, next| {
            let kind = match e.kind {
                EntryType::Dir => FileType::Directory,
                EntryType::File => FileType::RegularFile,
                EntryType::Symlink => FileType::Symlink,
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
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listed = self.list(req, ino, offset, |e, next| {
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
        let requests = self.requests.clone();
        let name = name.to_string_lossy().into_owned();
        self.runtime.spawn(async move {
            match requests.getxattr(ino.0, &name).await {
                Ok(value) => xattr_reply(reply, &value, size),
                Err(e) => reply.error(errno(e, "getxattr")),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.requests.listxattr(ino.0) {
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
