//! The kernel side: the fuser adapter (`fuse`), mounting and unmounting the session
//! (`mounting`), the daemon's own calls into its mount (`own_mount`), and [`Session`], the read
//! path's [`Kernel`] over a FUSE session's notifier.
//! Nothing below this folder knows fuser.

pub(crate) mod fuse;
pub(crate) mod mounting;
mod own_mount;

use crate::read::follow::page_cache::Kernel;
use own_mount::OwnMount;
use std::path::Path;

/// The page cache's kernel: stores through the session's notifier, looks at names from the
/// kernel's caches, and calls into the mount on a thread of its own ([`OwnMount`]).
pub(crate) struct Session {
    notifier: fuser::Notifier,
    own: OwnMount,
}

impl Session {
    pub(crate) fn new(notifier: fuser::Notifier) -> Session {
        Session {
            notifier,
            own: OwnMount::start(),
        }
    }
}

impl Kernel for Session {
    fn store(&self, ino: u64, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.notifier.store(fuser::INodeNo(ino), offset, bytes)
    }

    fn cached_ino(&self, path: &Path) -> Option<u64> {
        own_mount::cached_ino(path)
    }

    fn call_into_mount(&self, job: Box<dyn FnOnce() + Send>) -> std::io::Result<()> {
        self.own.run(job)
    }
}
