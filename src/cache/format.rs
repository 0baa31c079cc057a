//! The cache's file formats: a columns file's header (magic, version, parts, rows, the dataset
//! identity, each part's length, checksums; data aligned past it), and a batch file's
//! meta (length, crc32c, identity), kept in an extended attribute or, where the filesystem has
//! none, a sidecar file. Pinned by the tests in the module above.

use anyhow::{Result, bail};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use xattr::FileExt;

pub(super) const VERSION: u32 = 1;
pub(super) const COLS_MAGIC: &[u8; 8] = b"TFSCOL01";
pub(super) const META_MAGIC: &[u8; 8] = b"TFSMETA1";
/// A columns file's data starts at the first multiple of this past its header: 4096 for up to
/// 504 parts, more for wider tables.
pub(super) const COLS_ALIGN: usize = 4096;
/// The header's fixed part: magic, version, parts, rows, identity, data checksum.
pub(super) const COLS_FIXED: usize = 8 + 4 + 4 + 8 + 32 + 4;

/// Where the data of a columns file of `parts` parts starts: past the fixed part, each part's
/// length and the header's checksum.
pub(super) fn cols_data_at(parts: usize) -> usize {
    (COLS_FIXED + 8 * parts + 4).next_multiple_of(COLS_ALIGN)
}

/// The extended attribute that holds a batch file's meta.
pub(super) const META_ATTR: &str = "user.tensorfs.meta";

/// Whether an errno says the filesystem keeps no such attributes (the meta is then a sidecar).
pub(super) fn no_attrs(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENOSYS))
}

/// Sets `meta` as `file`'s meta attribute: `false` where the filesystem has no user
/// attributes.
pub(super) fn set_meta_attr(file: &File, meta: &[u8]) -> std::io::Result<bool> {
    match file.set_xattr(META_ATTR, meta) {
        Ok(()) => Ok(true),
        Err(e) if no_attrs(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes `file`'s meta attribute where it has one: a file written over keeps the attributes
/// of the file it was.
pub(super) fn clear_meta_attr(file: &File) -> std::io::Result<()> {
    match file.remove_xattr(META_ATTR) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) || no_attrs(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `file`'s meta: its attribute, else its sidecar beside `path`.
pub(super) fn read_meta(file: &File, path: &Path) -> Result<Vec<u8>> {
    match file.get_xattr(META_ATTR) {
        Ok(Some(meta)) => return Ok(meta),
        Ok(None) => {}
        Err(e) if no_attrs(&e) => {}
        Err(e) => bail!("meta cannot be read: {e}"),
    }
    let mut meta = Vec::new();
    File::open(meta_path(path))
        .and_then(|mut f| f.read_to_end(&mut meta))
        .map_err(|e| anyhow::anyhow!("without its meta ({e})"))?;
    Ok(meta)
}

/// The length of the meta of the batch file at `path` (attribute or sidecar); `None` where it
/// has none.
pub(super) fn meta_len(path: &Path) -> Option<u64> {
    match xattr::get(path, META_ATTR) {
        Ok(Some(meta)) if !meta.is_empty() => Some(meta.len() as u64),
        _ => std::fs::metadata(meta_path(path)).ok().map(|m| m.len()),
    }
}

pub(super) fn meta_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.meta"))
}

pub(super) fn columns_header(rows: usize, parts: &[&[u8]], identity: &[u8; 32]) -> Vec<u8> {
    let data_at = cols_data_at(parts.len());
    let mut h = Vec::with_capacity(data_at);
    h.extend_from_slice(COLS_MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    h.extend_from_slice(&(rows as u64).to_le_bytes());
    h.extend_from_slice(identity);
    let mut crc = 0;
    for p in parts {
        crc = crc32c::crc32c_append(crc, p);
    }
    h.extend_from_slice(&crc.to_le_bytes());
    for p in parts {
        h.extend_from_slice(&(p.len() as u64).to_le_bytes());
    }
    let header_crc = crc32c::crc32c(&h);
    h.extend_from_slice(&header_crc.to_le_bytes());
    h.resize(data_at, 0);
    h
}

pub(super) type Parsed = (usize, Vec<std::ops::Range<usize>>);

/// A columns file's rows and parts' ranges, its header checked, and its data too where `data`
/// says so.
pub(super) fn parse_columns(
    b: &[u8],
    identity: &[u8; 32],
    parts: usize,
    data: bool,
) -> Result<Parsed> {
    let fixed = COLS_FIXED;
    if b.len() < COLS_ALIGN || &b[..8] != COLS_MAGIC {
        bail!("not a columns file");
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    if u32_at(8) != VERSION {
        bail!("of another version");
    }
    let n = u32_at(12) as usize;
    let data_at = cols_data_at(parts);
    if n != parts || b.len() < data_at {
        bail!("of another layout");
    }
    let header_end = fixed + 8 * n;
    if crc32c::crc32c(&b[..header_end]) != u32_at(header_end) {
        bail!("corrupt (header checksum mismatch)");
    }
    if &b[24..56] != identity {
        bail!("another item's file");
    }
    let rows = u64_at(16) as usize;
    let mut ranges = Vec::with_capacity(n);
    let mut at = data_at;
    for t in 0..n {
        let len = u64_at(fixed + 8 * t) as usize;
        ranges.push(at..at + len);
        at += len;
    }
    if b.len() != at {
        bail!("truncated ({} of {at} bytes)", b.len());
    }
    if data && crc32c::crc32c(&b[data_at..]) != u32_at(56) {
        bail!("corrupt (checksum mismatch)");
    }
    Ok((rows, ranges))
}

/// A meta's length: magic, version, length, crc32c, identity, its own crc32c.
pub(super) const META_LEN: u64 = 8 + 4 + 8 + 4 + 32 + 4;

pub(super) fn meta_bytes(len: u64, crc: u32, identity: &[u8; 32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    m.extend_from_slice(META_MAGIC);
    m.extend_from_slice(&VERSION.to_le_bytes());
    m.extend_from_slice(&len.to_le_bytes());
    m.extend_from_slice(&crc.to_le_bytes());
    m.extend_from_slice(identity);
    let own = crc32c::crc32c(&m);
    m.extend_from_slice(&own.to_le_bytes());
    m
}

pub(super) fn parse_meta(m: &[u8], identity: &[u8; 32]) -> Result<(u64, u32)> {
    if m.len() as u64 != META_LEN || &m[..8] != META_MAGIC {
        bail!("meta is not a tensorfs meta");
    }
    let body = m.len() - 4;
    if crc32c::crc32c(&m[..body]) != u32::from_le_bytes(m[body..].try_into().unwrap()) {
        bail!("meta is corrupt");
    }
    if u32::from_le_bytes(m[8..12].try_into().unwrap()) != VERSION {
        bail!("meta is of another version");
    }
    if &m[24..56] != identity {
        bail!("meta belongs to another item");
    }
    Ok((
        u64::from_le_bytes(m[12..20].try_into().unwrap()),
        u32::from_le_bytes(m[20..24].try_into().unwrap()),
    ))
}
