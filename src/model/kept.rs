//! Small checked files kept between mounts (Parquet footers, facts found by reading a file),
//! the identities they are checked against, and the private directories they live in.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

const VERSION: u32 = 1;

/// Creates `dir` (and its parents) private to its owner, 0700: the cache holds the dataset's
/// data, which other users may not be allowed to read.
pub(crate) fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("'{}' cannot be created", dir.display()))?;
    // An existing directory (one the user made for cache_dir=) is made private too.
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("'{}' cannot be made private", dir.display()))?;
    }
    Ok(())
}

pub(crate) fn hash32(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// A short hex name for a key.
pub(crate) fn key_name(parts: &[&[u8]]) -> String {
    hash32(parts)[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const BLOB_MAGIC: &[u8; 8] = b"TFSBLOB1";

/// Writes a small checked item (a Parquet footer) crash-safely: `payload` behind a header with
/// its identity and crc32c, to a temp file beside `path`, then renamed into place. Not fsynced:
/// a blob a crash tore fails [`read_blob`]'s checks and is fetched again, and a mount keeps
/// thousands of footers, where one fsync each made start-up wait on the disk.
pub(crate) fn write_blob(path: &Path, identity: &[u8; 32], payload: &[u8]) -> Result<()> {
    let mut b = Vec::with_capacity(64 + payload.len());
    b.extend_from_slice(BLOB_MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(identity);
    b.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    b.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let own = crc32c::crc32c(&b);
    b.extend_from_slice(&own.to_le_bytes());
    b.extend_from_slice(payload);
    let dir = path.parent().context("a blob path has a parent")?;
    private_dir(dir)?;
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        crc32c::crc32c(identity)
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&b)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Reads what [`write_blob`] wrote; `None` when it is missing, of another identity or corrupt.
pub(crate) fn read_blob(path: &Path, identity: &[u8; 32]) -> Option<Vec<u8>> {
    let b = std::fs::read(path).ok()?;
    let head = 8 + 4 + 32 + 8 + 4;
    if b.len() < head + 4 || &b[..8] != BLOB_MAGIC || &b[12..44] != identity {
        return None;
    }
    let own = u32::from_le_bytes(b[head..head + 4].try_into().ok()?);
    if crc32c::crc32c(&b[..head]) != own || u32::from_le_bytes(b[8..12].try_into().ok()?) != VERSION
    {
        return None;
    }
    let len = u64::from_le_bytes(b[44..52].try_into().ok()?) as usize;
    let payload = &b[head + 4..];
    let crc = u32::from_le_bytes(b[52..56].try_into().ok()?);
    (payload.len() == len && crc32c::crc32c(payload) == crc).then(|| payload.to_vec())
}

/// The identity of an item from its parts.
pub(crate) fn identity(parts: &[&[u8]]) -> [u8; 32] {
    hash32(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_reject_what_is_not_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f/x.footer");
        write_blob(&path, &[3; 32], b"footer bytes").unwrap();
        assert_eq!(read_blob(&path, &[3; 32]).unwrap(), b"footer bytes");
        assert!(read_blob(&path, &[4; 32]).is_none());
        let mut b = std::fs::read(&path).unwrap();
        *b.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(read_blob(&path, &[3; 32]).is_none());
        b.truncate(10);
        std::fs::write(&path, &b).unwrap();
        assert!(read_blob(&path, &[3; 32]).is_none());
    }
}
