//! The requests that reach a file's bytes besides open and read: `readlink` of a `gds/` link
//! (the backing file's path, materialised and pinned), the extended attributes
//! (`user.tensorfs.path`, `user.tensorfs.warm`), and a file read or materialised by inode
//! without an open (`opens=kernel`, in-process tests).

use crate::error::{Error, Result};
use crate::read::produce::ahead::Warming;
use crate::requests::Requests;
use crate::requests::fs::Link;
use crate::requests::serve::{BatchFile, Target};
use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

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

impl<Id: Send + Sync + 'static> Requests<Id> {
    /// Reads `size` bytes at `offset` of file `ino` without an open, building what it spans
    /// first if it must.
    pub async fn read_ino(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        match self.fs.target(ino) {
            Some(t) => self.serve.read(t, offset, size).await,
            None => self.fs.read(ino, offset, size),
        }
    }

    /// Batch file `ino`'s backing file, materialised on the local cache first if it must be
    /// ([`crate::requests::serve::Serve::materialize`]).
    pub async fn materialize(&self, ino: u64) -> Result<Option<(File, PathBuf)>> {
        match self.fs.target(ino) {
            Some(Target::Batch(f)) => self.serve.materialize(f).await,
            _ => Err(Error::answer(libc::EINVAL)),
        }
    }

    /// `readlink` of a `gds/` symlink: a batch file's backing file, once materialised (pinned
    /// for GPUDirect readers); a one-open file's file built ahead, else the same file in the
    /// main tree.
    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        match self.fs.link(ino)? {
            Link::All(f, fallback) => Ok(match self.serve.all_built(f).await {
                Some(path) => path.into_os_string().into_encoded_bytes(),
                None => fallback.into_bytes(),
            }),
            Link::Batch(f) => self.handed_out_path(f).await,
        }
    }

    /// The backing file's path, once materialised, pinned for GPUDirect readers.
    async fn handed_out_path(&self, f: BatchFile) -> Result<Vec<u8>> {
        let (_, path) = (self.serve.materialize(f).await?)
            .ok_or_else(|| Error::limit(libc::EIO, "the cache cannot hold the file now"))?;
        self.serve.pin(f, PIN_GRACE);
        Ok(path.into_os_string().into_encoded_bytes())
    }

    /// The names of a file's extended attributes.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let named = match self.fs.target(ino) {
            Some(Target::Batch(_)) => true,
            Some(Target::All(f)) => self.serve.has_built(f),
            None => false,
        };
        Ok(match named {
            true => format!("{PATH_XATTR}\0").into_bytes(),
            false => Vec::new(),
        })
    }

    /// `user.tensorfs.path`: the backing file's path, materialised and pinned; for a one-open
    /// file, its file built ahead while there is one. `user.tensorfs.warm`: see
    /// [`WARM_XATTR`].
    pub async fn getxattr(&self, ino: u64, name: &str) -> Result<Vec<u8>> {
        match self.fs.target(ino) {
            Some(Target::All(f)) if name == WARM_XATTR => Ok(match self.serve.warm(f) {
                Warming::Ready => "ready".into(),
                Warming::Skipped => "skipped".into(),
                Warming::Under(done) => format!("{done:.4}").into_bytes(),
            }),
            Some(Target::All(f)) if name == PATH_XATTR => (self.serve.all_built(f).await)
                .map(|path| path.into_os_string().into_encoded_bytes())
                .ok_or(Error::answer(libc::ENODATA)),
            // `tensorfs warm`: the file kept on the local cache, where its opens find it.
            Some(Target::Batch(f)) if name == WARM_XATTR => {
                Ok(match self.serve.materialize(f).await? {
                    Some(_) => "ready".into(),
                    None => "skipped".into(),
                })
            }
            Some(Target::Batch(f)) if name == PATH_XATTR => self.handed_out_path(f).await,
            _ => Err(Error::answer(libc::ENODATA)),
        }
    }
}
