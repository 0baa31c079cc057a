//! The daemon's own calls into its mount: the listings and looks at names that make files known
//! to the kernel before their pages are stored (`read::follow::page_cache`).
//!
//! Such a call is a FUSE request the daemon answers itself, and the kernel waits out a request
//! its daemon has read even for a thread being killed. A daemon killed (SIGKILL, the OOM killer)
//! while one of its threads waited on one kept that thread for good: the thread held the
//! process's descriptor table and with it `/dev/fuse`, so the kernel never aborted the
//! connection, the process never ended (a zombie with one thread left) and every reader of the
//! mount hung, auto-unmount or not (`test_crash_leftovers_are_cleaned`, about once in 50 runs
//! on a loaded machine). So these calls are made here: on the calling thread where the kernel
//! answers from its caches alone ([`cached_ino`]: no request), else on one thread whose
//! descriptor table is its own and holds none of the daemon's descriptors. When the daemon is
//! killed, its other threads end, the last descriptor of `/dev/fuse` closes, the kernel aborts
//! the connection, and that thread's request ends with an error.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc;

type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct OwnMount {
    /// The jobs of the thread that calls into the mount; `None` where that thread could not be
    /// given a descriptor table of its own (calls are then made on the calling thread).
    jobs: Option<mpsc::Sender<Job>>,
}

impl OwnMount {
    /// Starts the thread that calls into the mount.
    pub(crate) fn start() -> OwnMount {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (said, told) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tensorfs-own".into())
            .spawn(move || {
                let alone = own_descriptor_table();
                let ok = alone.is_ok();
                let _ = said.send(alone);
                if ok {
                    for job in queue {
                        job();
                    }
                }
            });
        let alone = match spawned {
            Ok(_) => told.recv().unwrap_or_else(|_| Err(gone())),
            Err(e) => Err(e),
        };
        match alone {
            Ok(()) => OwnMount { jobs: Some(jobs) },
            Err(e) => {
                tracing::warn!(
                    "calls into the mount are made by the daemon's own threads ({e}): \
                     a daemon killed during one may keep the mount hung"
                );
                OwnMount { jobs: None }
            }
        }
    }

    /// Runs `job`, which calls into the mount, on the thread that holds none of the daemon's
    /// descriptors (or here, where that thread could not be made); does not wait for it.
    pub(crate) fn run(&self, job: Job) -> std::io::Result<()> {
        let Some(jobs) = &self.jobs else {
            job();
            return Ok(());
        };
        jobs.send(job).map_err(|_| gone())
    }
}

fn gone() -> std::io::Error {
    std::io::Error::other("the thread that calls into the mount is gone")
}

/// Gives the calling thread a descriptor table of its own, with none of the process's
/// descriptors in it (0 to 2 aside).
fn own_descriptor_table() -> std::io::Result<()> {
    // SAFETY: unshare(CLONE_FILES) affects only the calling thread's descriptor table.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: closes descriptors of this thread's own table (a copy, after the unshare), which
    // nothing on this thread uses; the process's table is untouched.
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// openat2's `struct open_how` (libc's cannot be built outside the crate).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The inode number of `path` (not followed where it is a symlink) where the kernel knows it
/// without asking the daemon: every name on the way in its caches and still valid, and the
/// attributes as it holds them. `None` where it would have to ask.
pub(crate) fn cached_ino(path: &Path) -> Option<u64> {
    let name = CString::new(path.as_os_str().as_bytes()).ok()?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_CACHED,
    };
    // SAFETY: `name` is NUL-ended and `how` a valid open_how of the size given. An O_PATH
    // open sends no FUSE open, and its close no release.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: statx fills `stx`, a plain struct for which all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open, the path empty and NUL-ended, `stx` writable.
    let got = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut stx,
        )
    };
    (got == 0).then_some(stx.stx_ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_run_on_a_thread_that_holds_none_of_the_process_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("f")).unwrap();
        let fd = file.as_raw_fd();
        let own = OwnMount::start();
        let (done, result) = mpsc::sync_channel(1);
        own.run(Box::new(move || {
            let held = |fd: i32| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
            let _ = done.send((held(0), held(fd)));
        }))
        .unwrap();
        let (stdin_held, file_held) = result.recv().unwrap();
        assert!(stdin_held, "stdin is kept");
        assert!(
            !file_held,
            "the process's descriptor {fd} is held by the calling thread"
        );
        // The process's own table is untouched.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1);
    }

    #[test]
    fn a_cached_path_gives_its_inode_without_a_lookup() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let ino = std::fs::symlink_metadata(&path).unwrap().ino();
        assert_eq!(cached_ino(&path), Some(ino));
        assert_eq!(cached_ino(&dir.path().join("missing")), None);
    }
}
