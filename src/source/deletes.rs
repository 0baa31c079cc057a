//! Rows a table deletes from a data file without rewriting it (PRODUCT.md §8): Delta deletion
//! vectors, as the Delta protocol defines them (`PROTOCOL.md` of delta-io/delta, "Deletion
//! Vectors" and "Deletion Vector Format").
//!
//! A deletion vector is a set of row positions in its file, a 64-bit RoaringBitmap in the
//! "portable" serialisation behind a magic number, kept inline in the log (Z85 text) or in a
//! `deletion_vector_UUID.bin` file at an offset (4 bytes of length, big-endian, the bitmap,
//! then its CRC-32, big-endian). The plan counts each row group's rows left; the decode drops
//! the deleted ones.

use crate::source::child;
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use roaring::RoaringTreemap;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use url::Url;

/// `RoaringBitmapArray`'s magic numbers: little-endian before a portable 64-bit bitmap (the
/// format the protocol names); big-endian before Delta's older native format (an array of
/// 32-bit bitmaps, one for each high 32 bits), which the protocol's own inline example uses.
const PORTABLE: u32 = 1681511377;
const NATIVE: u32 = 1681511376;

/// A Delta deletion vector's descriptor, as the log's `add.deletionVector` gives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeletionVector {
    /// `u` (a file named from a UUID, relative to the table), `i` (inline) or `p` (a path).
    pub(crate) storage_type: String,
    pub(crate) path_or_inline_dv: String,
    #[serde(default)]
    pub(crate) offset: Option<u64>,
    pub(crate) size_in_bytes: u64,
    pub(crate) cardinality: u64,
}

impl DeletionVector {
    /// The id the protocol gives it: what tells two versions of one file's deletes apart.
    pub(crate) fn unique_id(&self) -> String {
        match self.offset {
            Some(o) => format!("{}{}@{o}", self.storage_type, self.path_or_inline_dv),
            None => format!("{}{}", self.storage_type, self.path_or_inline_dv),
        }
    }

    /// Where its bytes are: inline, or a file (relative to the table's root for `u`, as
    /// given for `p`) at an offset.
    pub(crate) fn location(&self) -> Result<Location> {
        match self.storage_type.as_str() {
            "i" => Ok(Location::Inline(z85_decode(&self.path_or_inline_dv)?)),
            "u" => {
                let s = &self.path_or_inline_dv;
                if s.len() < 20 || !s.is_char_boundary(s.len() - 20) {
                    bail!("deletion vector '{s}' names no UUID");
                }
                let (prefix, encoded) = s.split_at(s.len() - 20);
                let uuid = z85_decode(encoded)?;
                let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
                let name = format!(
                    "deletion_vector_{}-{}-{}-{}-{}.bin",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                );
                let path = match prefix.is_empty() {
                    true => name,
                    false => format!("{prefix}/{name}"),
                };
                Ok(Location::File {
                    path,
                    absolute: false,
                    offset: self.offset.unwrap_or(1),
                })
            }
            "p" => Ok(Location::File {
                path: self.path_or_inline_dv.clone(),
                absolute: true,
                offset: self.offset.unwrap_or(1),
            }),
            other => bail!(
                "deletion vector of storage type '{other}', which the Delta protocol does not define"
            ),
        }
    }
}

/// Where a deletion vector's bytes are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// The bitmap's bytes (magic and bitmap).
    Inline(Vec<u8>),
    /// In a file, at `offset`: the bitmap's length, the bitmap, its checksum.
    File {
        path: String,
        /// Whether `path` is a URL or absolute path (`p`), else relative to the table's root.
        absolute: bool,
        offset: u64,
    },
}

/// The row positions a deletion vector's bytes (magic and portable bitmap) hold.
pub(crate) fn bitmap(bytes: &[u8]) -> Result<RoaringTreemap> {
    if bytes.len() < 4 {
        bail!("a deletion vector of {} bytes", bytes.len());
    }
    let head: [u8; 4] = bytes[..4].try_into().expect("4 bytes");
    if u32::from_le_bytes(head) == PORTABLE {
        return RoaringTreemap::deserialize_from(&bytes[4..]).context("its bitmap cannot be read");
    }
    if u32::from_be_bytes(head) != NATIVE {
        bail!(
            "a deletion vector with magic number {}, not {PORTABLE}",
            u32::from_le_bytes(head)
        );
    }
    // Native: the number of 32-bit bitmaps, then each one's size and bytes (big-endian).
    let mut rest = &bytes[4..];
    let mut take = |n: usize| -> Result<&[u8]> {
        if rest.len() < n {
            bail!("its bitmap is cut short");
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let count = u32::from_be_bytes(take(4)?.try_into().expect("4 bytes"));
    let mut out = RoaringTreemap::new();
    for high in 0..count as u64 {
        let size = u32::from_be_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        let low = roaring::RoaringBitmap::deserialize_from(take(size)?)
            .context("its bitmap cannot be read")?;
        out.extend(low.iter().map(|v| (high << 32) | v as u64));
    }
    Ok(out)
}

/// The bitmap stored at the start of `stored` (a deletion vector file's bytes from the
/// descriptor's offset on: length, bitmap, CRC-32), checked against its checksum and the
/// descriptor's size.
pub(crate) fn stored_bitmap(stored: &[u8], dv: &DeletionVector) -> Result<RoaringTreemap> {
    if stored.len() < 8 {
        bail!("its deletion vector file is cut short");
    }
    let len = u32::from_be_bytes(stored[..4].try_into().expect("4 bytes")) as u64;
    if len != dv.size_in_bytes {
        bail!(
            "its deletion vector holds {len} bytes where the log says {}",
            dv.size_in_bytes
        );
    }
    let end = 4 + len as usize;
    if stored.len() < end + 4 {
        bail!("its deletion vector file is cut short");
    }
    let data = &stored[4..end];
    let crc = u32::from_be_bytes(stored[end..end + 4].try_into().expect("4 bytes"));
    if crc32(data) != crc {
        bail!("its deletion vector fails its checksum");
    }
    bitmap(data)
}

/// The bytes a deletion vector stored in a file takes from its offset: length, data, checksum.
pub(crate) fn stored_len(dv: &DeletionVector) -> u64 {
    4 + dv.size_in_bytes + 4
}

/// CRC-32 (IEEE), as java.util.zip.CRC32 computes it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

const ALPHABET: &[u8; 85] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/// Z85 of `bytes` (a multiple of 4 of them): 4 bytes, big-endian, to 5 characters.
pub(crate) fn z85_encode(bytes: &[u8]) -> String {
    debug_assert!(bytes.len().is_multiple_of(4));
    let mut out = String::with_capacity(bytes.len() / 4 * 5);
    for chunk in bytes.chunks(4) {
        let v = u32::from_be_bytes(chunk.try_into().expect("4 bytes")) as u64;
        for k in (0..5).rev() {
            out.push(ALPHABET[(v / 85u64.pow(k) % 85) as usize] as char);
        }
    }
    out
}

/// Z85 (ZeroMQ's base85, RFC 32/Z85): 5 characters to 4 bytes, big-endian.
fn z85_decode(text: &str) -> Result<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(5) {
        bail!(
            "Z85 text of {} characters, not a multiple of 5",
            bytes.len()
        );
    }
    let mut value_of = [255u8; 256];
    for (i, &c) in ALPHABET.iter().enumerate() {
        value_of[c as usize] = i as u8;
    }
    let mut out = Vec::with_capacity(bytes.len() / 5 * 4);
    for chunk in bytes.chunks(5) {
        let mut v: u64 = 0;
        for &c in chunk {
            let d = value_of[c as usize];
            if d == 255 {
                return Err(anyhow!("'{}' is not a Z85 character", c as char));
            }
            v = v * 85 + d as u64;
        }
        let v = u32::try_from(v).map_err(|_| anyhow!("Z85 group out of range"))?;
        out.extend_from_slice(&v.to_be_bytes());
    }
    Ok(out)
}

/// Deleted positions as an inline deletion vector: the form a snapshot pins and a read applies
/// (Iceberg's deletes, and the rows a `where=` does not keep).
pub(crate) fn inline_vector(rows: &RoaringTreemap) -> Result<DeletionVector> {
    let mut bytes = PORTABLE.to_le_bytes().to_vec();
    rows.serialize_into(&mut bytes)?;
    let size = bytes.len() as u64;
    // Z85 takes whole groups of 4 bytes; the bitmap's reader stops at its end.
    bytes.resize(bytes.len().div_ceil(4) * 4, 0);
    Ok(DeletionVector {
        storage_type: "i".into(),
        path_or_inline_dv: z85_encode(&bytes),
        offset: None,
        size_in_bytes: size,
        cardinality: rows.len(),
    })
}

/// `rows` with runs kept as runs where they are smaller: a row group ruled out whole then
/// costs a few bytes, not a bit a row.
pub(crate) fn with_runs(rows: &RoaringTreemap) -> RoaringTreemap {
    RoaringTreemap::from_bitmaps(rows.bitmaps().map(|(high, b)| {
        let mut b = b.clone();
        b.optimize();
        (high, b)
    }))
}

/// How many of `bitmap`'s positions fall in `range`.
pub(crate) fn count_in(bitmap: &RoaringTreemap, range: std::ops::Range<u64>) -> u64 {
    if range.is_empty() {
        return 0;
    }
    let below = |v: u64| if v == 0 { 0 } else { bitmap.rank(v - 1) };
    below(range.end) - below(range.start)
}

/// How many of `bitmap`'s positions fall in each of the row groups of `rg_rows` rows.
pub(crate) fn per_row_group(bitmap: &RoaringTreemap, rg_rows: &[u64]) -> Vec<u64> {
    let mut start = 0u64;
    rg_rows
        .iter()
        .map(|&n| {
            let count = count_in(bitmap, start..start + n);
            start += n;
            count
        })
        .collect()
}

/// The row positions deletion vector `dv` of a table at `root` (`url`) deletes.
pub(crate) async fn load(
    store: &Arc<dyn ObjectStore>,
    url: &Url,
    root: &Path,
    dv: &DeletionVector,
    stats: &Stats,
) -> Result<roaring::RoaringTreemap> {
    let (path, absolute, offset) = match dv.location()? {
        Location::Inline(bytes) => return bitmap(&bytes),
        Location::File {
            path,
            absolute,
            offset,
        } => (path, absolute, offset),
    };
    let location = match absolute {
        false => child(root, &path)?,
        // An absolute path names the file by URL: one under the table's own.
        true => {
            let base = url.as_str().trim_end_matches('/');
            let rest = (path.strip_prefix(base))
                .and_then(|r| r.strip_prefix('/'))
                .ok_or_else(|| anyhow!("its deletion vector '{path}' is outside the table"))?;
            let rest = percent_encoding::percent_decode_str(rest).decode_utf8_lossy();
            child(root, &rest)?
        }
    };
    let range = offset..offset + stored_len(dv);
    let bytes = store
        .get_range(&location, range)
        .await
        .with_context(|| format!("its deletion vector '{location}' cannot be read"))?;
    Stats::add(&stats.c.remote_requests, 1);
    Stats::add(&stats.c.remote_bytes, bytes.len() as u64);
    stored_bitmap(&bytes, dv).with_context(|| format!("deletion vector '{location}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_s_inline_example_is_rows_3_4_7_11_18_29() {
        let dv = DeletionVector {
            storage_type: "i".into(),
            path_or_inline_dv: "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L".into(),
            offset: None,
            size_in_bytes: 40,
            cardinality: 6,
        };
        let Location::Inline(bytes) = dv.location().unwrap() else {
            panic!("inline")
        };
        assert_eq!(bytes.len(), 40);
        let rows: Vec<u64> = bitmap(&bytes).unwrap().iter().collect();
        assert_eq!(rows, [3, 4, 7, 11, 18, 29]);
        assert_eq!(
            per_row_group(&bitmap(&bytes).unwrap(), &[5, 10, 20]),
            [2, 2, 2]
        );
    }

    #[test]
    fn the_protocol_s_relative_example_names_its_file() {
        let dv = DeletionVector {
            storage_type: "u".into(),
            path_or_inline_dv: "ab^-aqEH.-t@S}K{vb[*k^".into(),
            offset: Some(4),
            size_in_bytes: 40,
            cardinality: 6,
        };
        assert_eq!(
            dv.location().unwrap(),
            Location::File {
                path: "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin".into(),
                absolute: false,
                offset: 4
            }
        );
        assert_eq!(dv.unique_id(), "uab^-aqEH.-t@S}K{vb[*k^@4");
    }

    #[test]
    fn a_stored_vector_is_checked() {
        // A portable one: the protocol's example rows, serialised as the reference writes them.
        let mut rows = RoaringTreemap::new();
        rows.extend([3u64, 4, 7, 11, 18, 29, 5 << 32]);
        let mut inline = PORTABLE.to_le_bytes().to_vec();
        rows.serialize_into(&mut inline).unwrap();
        assert_eq!(bitmap(&inline).unwrap(), rows);
        let mut stored = (inline.len() as u32).to_be_bytes().to_vec();
        stored.extend(&inline);
        stored.extend(crc32(&inline).to_be_bytes());
        let dv = DeletionVector {
            storage_type: "u".into(),
            path_or_inline_dv: String::new(),
            offset: Some(1),
            size_in_bytes: inline.len() as u64,
            cardinality: 7,
        };
        assert_eq!(stored_bitmap(&stored, &dv).unwrap().len(), 7);
        let mut bad = stored.clone();
        bad[10] ^= 1;
        assert!(
            stored_bitmap(&bad, &dv)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        assert!(stored_bitmap(&stored[..20], &dv).is_err());
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
