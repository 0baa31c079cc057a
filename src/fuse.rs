//! The thin fuser adapter: each callback is translated into a call on [`Fs`]; reads are
//! answered from tokio tasks, so the FUSE threads never wait on a batch build.

use crate::fs::{Attr, Fs, Kind};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::runtime::Handle;

/// Everything in a mount is immutable for the mount's life, so the kernel may cache it long.
const TTL: Duration = Duration::from_secs(3600);

pub struct FuseAdapter {
    fs: Arc<Fs>,
    runtime: Handle,
    mounted_at: SystemTime,
    uid: u32,
    gid: u32,
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl FuseAdapter {
    pub fn new(fs: Arc<Fs>, runtime: Handle) -> Self {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        FuseAdapter {
            fs,
            runtime,
            mounted_at: SystemTime::now(),
            uid,
            gid,
        }
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        let (kind, perm, nlink) = match a.kind {
            Kind::Dir => (FileType::Directory, 0o555, 2),
            Kind::File => (FileType::RegularFile, 0o444, 1),
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

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large reads: fewer round trips through the daemon.
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.fs.lookup(parent.0, name) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        match self.fs.is_file(ino.0) {
            Ok(true) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Ok(false) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        self.runtime.spawn(async move {
            match fs.read(ino.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(e)),
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
                Err(e) => return reply.error(errno(e)),
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
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
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
