//! Footers of files from the wild, read as pyarrow reads them.
//!
//! The parquet crate decodes a footer strictly and trusts every size in it; some writers left
//! footers that pyarrow reads by working around them. Each workaround here names the writer bug
//! and the upstream change that would make it unnecessary:
//!
//! - A pre-release parquet-mr wrote `ColumnMetaData` fields under ids the format later gave other
//!   types (field 15, now `bloom_filter_length: i32`, as a list). The crate's decoder refuses
//!   the whole footer ("Expected list element type …"); C++ skips such fields. Here a footer the
//!   crate refuses is re-encoded without the mistyped optional fields and decoded again.
//!   Upstream: the decoder could skip an optional field whose wire type differs from the
//!   schema's, as the Thrift spec allows for unknown fields.
//! - The same writer stored `dictionary_page_offset = 0` (PARQUET-1402): the crate then reads the
//!   column chunk from byte 0 of the file. The offset is dropped, so the chunk starts at its
//!   first page (where the dictionary page is). Upstream: `ColumnChunkMetaData::byte_range`
//!   could ignore a dictionary offset of 0 as C++ does.
//! - A footer whose row count disagrees with its row groups' (0 rows where its one row group
//!   has 6): `ArrowReaderBuilder::with_batch_size` clamps the batch size to the footer's count,
//!   so every read is empty. The count is set to the row groups' sum. Upstream: clamp to the
//!   selected row groups' rows, or to at least 1.
//! - parquet-mr 1.2.8 and older left the dictionary page header out of a column chunk's
//!   `total_compressed_size` (PARQUET-816): the last bytes of the chunk are never fetched and
//!   decoding fails ("EOF"). [`padded`] extends every chunk up to the start of the next one
//!   (at most 100 bytes, as C++ pads), used where a row group fails to decode as the footer
//!   says. Upstream: the crate's own `TODO: fix PARQUET-816`.
//! - parquet-cpp before Arrow 3.0 (ARROW-10353) wrote `is_compressed = false` in every data
//!   page v2 header, compressed or not (ARROW-17100): the crate then takes compressed bytes as
//!   values ("EOF"). For a file such a writer made ([`pages_v2_flag_unreliable`]) and a
//!   compressed column, [`pages_v2_compressed`] sets the flag in the chunk's page headers (one
//!   nibble each: the flag is the field header's own type) before decoding, as C++ does.
//!   Upstream: the crate could check `created_by` as C++ does.

use anyhow::{Result, bail};
use parquet::file::metadata::{
    ColumnChunkMetaData, FileMetaData, ParquetMetaData, ParquetMetaDataBuilder,
    ParquetMetaDataReader, RowGroupMetaData,
};

/// Decodes a footer's metadata (without its length and magic), working around the writer bugs
/// above.
pub(crate) fn decode(metadata: &[u8]) -> Result<ParquetMetaData> {
    let md = match ParquetMetaDataReader::decode_metadata(metadata) {
        Ok(md) => md,
        Err(strict) => {
            let cleaned = match without_mistyped_fields(metadata) {
                Ok(c) => c,
                Err(_) => return Err(strict.into()),
            };
            ParquetMetaDataReader::decode_metadata(&cleaned).map_err(|_| strict)?
        }
    };
    normalise(md)
}

/// The fixes that need the decoded metadata: the row count, and dictionary offsets of 0.
fn normalise(md: ParquetMetaData) -> Result<ParquetMetaData> {
    let counted: i64 = md.row_groups().iter().map(|rg| rg.num_rows()).sum();
    let zero_dict = md.row_groups().iter().any(|rg| {
        rg.columns()
            .iter()
            .any(|c| c.dictionary_page_offset() == Some(0))
    });
    if counted == md.file_metadata().num_rows() && !zero_dict {
        return Ok(md);
    }
    let f = md.file_metadata();
    let file = FileMetaData::new(
        f.version(),
        counted,
        f.created_by().map(str::to_string),
        f.key_value_metadata().cloned(),
        f.schema_descr_ptr(),
        f.column_orders().cloned(),
    );
    let row_groups = map_columns(&md, |c| match c.dictionary_page_offset() {
        Some(0) => Some(
            c.clone()
                .into_builder()
                .set_dictionary_page_offset(None)
                .build(),
        ),
        _ => None,
    })?;
    Ok(ParquetMetaDataBuilder::new(file)
        .set_row_groups(row_groups)
        .build())
}

/// The metadata with every column chunk extended up to the start of the next chunk of the file
/// (or of the footer, `footer_start`), by at most 100 bytes: what a PARQUET-816 file needs.
/// `None` when no chunk would change.
pub(crate) fn padded(md: &ParquetMetaData, footer_start: u64) -> Option<ParquetMetaData> {
    const MAX_DICT_HEADER: u64 = 100;
    let mut starts: Vec<u64> = md
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns().iter().map(|c| c.byte_range().0))
        .collect();
    starts.push(footer_start);
    starts.sort_unstable();
    let mut changed = false;
    let row_groups = map_columns(md, |c| {
        let (start, len) = c.byte_range();
        let next = starts[starts.partition_point(|&s| s <= start)..]
            .first()
            .copied()
            .unwrap_or(footer_start);
        let end = next.min(start + len + MAX_DICT_HEADER);
        if end <= start + len {
            return None;
        }
        changed = true;
        let extra = (end - start - len) as i64;
        Some(
            c.clone()
                .into_builder()
                .set_total_compressed_size(c.compressed_size() + extra)
                .build(),
        )
    })
    .ok()?;
    changed.then(|| md.clone().into_builder().set_row_groups(row_groups).build())
}

/// The value of `key` in a footer's key-value metadata, as bytes: the parquet crate wants them
/// UTF-8, and Petastorm stores a pickle there. `metadata`: the footer without length and magic.
pub(crate) fn key_value(metadata: &[u8], key: &str) -> Result<Option<Vec<u8>>> {
    let mut r = Reader {
        b: metadata,
        pos: 0,
    };
    let mut last = 0;
    while let Some((id, t)) = r.field_header(&mut last)? {
        if id != 5 || t != LIST {
            r.skip(t, 0)?;
            continue;
        }
        let (n, et) = r.list_header()?;
        for _ in 0..n {
            if et != STRUCT {
                r.skip_element(et, 0)?;
                continue;
            }
            let (mut k, mut v, mut last_kv) = (None, None, 0);
            while let Some((fid, ft)) = r.field_header(&mut last_kv)? {
                if ft == BINARY && (fid == 1 || fid == 2) {
                    let len = r.varint()?;
                    let bytes = r.take(len)?;
                    if fid == 1 {
                        k = Some(bytes);
                    } else {
                        v = Some(bytes);
                    }
                } else {
                    r.skip(ft, 0)?;
                }
            }
            if k == Some(key.as_bytes()) {
                return Ok(v.map(<[u8]>::to_vec));
            }
        }
        return Ok(None);
    }
    Ok(None)
}

/// The row groups with each column chunk that `fix` changes (`Some`) replaced.
fn map_columns(
    md: &ParquetMetaData,
    mut fix: impl FnMut(&ColumnChunkMetaData) -> Option<parquet::errors::Result<ColumnChunkMetaData>>,
) -> parquet::errors::Result<Vec<RowGroupMetaData>> {
    md.row_groups()
        .iter()
        .map(|rg| {
            let columns = rg
                .columns()
                .iter()
                .map(|c| fix(c).unwrap_or_else(|| Ok(c.clone())))
                .collect::<parquet::errors::Result<Vec<_>>>()?;
            rg.clone()
                .into_builder()
                .set_column_metadata(columns)
                .build()
        })
        .collect()
}

// Thrift compact protocol, as much as re-encoding a footer without some fields needs.

const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const I32: u8 = 5;
const I64: u8 = 6;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;

/// The structs on the way from `FileMetaData` to `ColumnMetaData`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    FileMetaData,
    RowGroup,
    ColumnChunk,
    ColumnMetaData,
    /// Any other struct: copied as it is.
    Opaque,
}

/// The wire type the format gives each `ColumnMetaData` field (`None`: unknown, kept).
fn column_meta_data_type(id: i16) -> Option<u8> {
    Some(match id {
        1 | 4 | 15 => I32,
        5 | 6 | 7 | 9 | 10 | 11 | 14 => I64,
        2 | 3 | 8 | 13 => LIST,
        12 | 16 | 17 => STRUCT,
        _ => return None,
    })
}

/// Which struct a field of a struct of shape `shape` descends into.
fn child(shape: Shape, id: i16) -> Shape {
    match (shape, id) {
        (Shape::FileMetaData, 4) => Shape::RowGroup,
        (Shape::RowGroup, 1) => Shape::ColumnChunk,
        (Shape::ColumnChunk, 3) => Shape::ColumnMetaData,
        _ => Shape::Opaque,
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8> {
        let Some(&b) = self.b.get(self.pos) else {
            bail!("the footer ends inside a value");
        };
        self.pos += 1;
        Ok(b)
    }

    /// The next `n` bytes; a length past the footer's end (however large the varint that
    /// gave it) is an error, never a wrapped position.
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.b.len());
        let Some(end) = end else {
            bail!("the footer ends inside a value");
        };
        let bytes = &self.b[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        bail!("a varint longer than 10 bytes")
    }

    fn skip(&mut self, t: u8, depth: usize) -> Result<()> {
        if depth > 64 {
            bail!("the footer nests too deep");
        }
        match t {
            BOOL_TRUE | BOOL_FALSE => {}
            3 => {
                self.take(1)?;
            }
            4 | I32 | I64 => {
                self.varint()?;
            }
            7 => {
                self.take(8)?;
            }
            BINARY => {
                let n = self.varint()?;
                self.take(n)?;
            }
            LIST | SET => {
                let (n, et) = self.list_header()?;
                for _ in 0..n {
                    self.skip_element(et, depth + 1)?;
                }
            }
            MAP => {
                let n = self.varint()?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.skip_element(kv >> 4, depth + 1)?;
                        self.skip_element(kv & 15, depth + 1)?;
                    }
                }
            }
            STRUCT => {
                let mut last = 0;
                while let Some((_, ft)) = self.field_header(&mut last)? {
                    self.skip(ft, depth + 1)?;
                }
            }
            _ => bail!("unknown compact type {t}"),
        }
        if self.pos > self.b.len() {
            bail!("the footer ends inside a value");
        }
        Ok(())
    }

    /// A list element: booleans are one byte each inside lists.
    fn skip_element(&mut self, t: u8, depth: usize) -> Result<()> {
        match t {
            BOOL_TRUE | BOOL_FALSE => {
                self.byte()?;
                Ok(())
            }
            _ => self.skip(t, depth),
        }
    }

    fn list_header(&mut self) -> Result<(u64, u8)> {
        let h = self.byte()?;
        let n = match h >> 4 {
            15 => self.varint()?,
            n => n as u64,
        };
        Ok((n, h & 15))
    }

    /// The next field's (id, type), or `None` at the struct's end.
    fn field_header(&mut self, last: &mut i16) -> Result<Option<(i16, u8)>> {
        let h = self.byte()?;
        if h == 0 {
            return Ok(None);
        }
        let id = match h >> 4 {
            0 => {
                let z = self.varint()?;
                ((z >> 1) as i64 ^ -((z & 1) as i64)) as i16
            }
            delta => last.wrapping_add(delta as i16),
        };
        *last = id;
        Ok(Some((id, h & 15)))
    }
}

/// Whether a file `created_by` this writer marked compressed data pages v2 uncompressed:
/// parquet-cpp before Arrow 3.0.0 (`parquet-cpp version 1.x`, `parquet-cpp-arrow version 2.x`
/// and older), as C++'s `PARQUET_CPP_10353_FIXED_VERSION` check says.
pub(crate) fn pages_v2_flag_unreliable(created_by: Option<&str>) -> bool {
    let Some(by) = created_by else { return false };
    let Some(version) = (by.strip_prefix("parquet-cpp-arrow version "))
        .or_else(|| by.strip_prefix("parquet-cpp version "))
    else {
        return false;
    };
    let major: u32 = (version.split(['.', '-', ' ']).next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(u32::MAX);
    by.starts_with("parquet-cpp version ") || major < 3
}

/// A column chunk's bytes (its pages, each a Thrift `PageHeader` then the page) with every data
/// page v2 header's `is_compressed` set to true; `None` where none said false (or the chunk
/// does not walk as pages).
pub(crate) fn pages_v2_compressed(chunk: &[u8]) -> Option<Vec<u8>> {
    let mut flags = Vec::new();
    let mut r = Reader { b: chunk, pos: 0 };
    while r.pos < chunk.len() {
        let mut last = 0;
        let mut page_size = None;
        while let Some((id, t)) = r.field_header(&mut last).ok()? {
            match (id, t) {
                (3, I32) => {
                    let z = r.varint().ok()?;
                    page_size = Some(((z >> 1) as i64 ^ -((z & 1) as i64)) as u64);
                }
                // data_page_header_v2: is_compressed is its field 7, a bool whose value is the
                // field header's type.
                (8, STRUCT) => {
                    let mut inner = 0;
                    while let Some((id, t)) = r.field_header(&mut inner).ok()? {
                        if id == 7 && t == BOOL_FALSE {
                            flags.push(r.pos - 1);
                        } else {
                            r.skip(t, 1).ok()?;
                        }
                    }
                }
                (_, t) => r.skip(t, 1).ok()?,
            }
        }
        r.take(page_size?).ok()?;
    }
    if flags.is_empty() {
        return None;
    }
    let mut patched = chunk.to_vec();
    for at in flags {
        patched[at] = (patched[at] & 0xf0) | BOOL_TRUE;
    }
    Some(patched)
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn write_field_header(out: &mut Vec<u8>, last: &mut i16, id: i16, t: u8) {
    let delta = id.wrapping_sub(*last);
    if (1..=15).contains(&delta) {
        out.push(((delta as u8) << 4) | t);
    } else {
        out.push(t);
        write_varint(out, ((id << 1) ^ (id >> 15)) as u16 as u64);
    }
    *last = id;
}

/// Re-encodes a struct of shape `shape`, dropping the `ColumnMetaData` fields whose wire type
/// is not the one the format gives their id.
fn rewrite_struct(r: &mut Reader, out: &mut Vec<u8>, shape: Shape) -> Result<()> {
    let (mut last_in, mut last_out) = (0i16, 0i16);
    while let Some((id, t)) = r.field_header(&mut last_in)? {
        let start = r.pos;
        let expected = match shape {
            Shape::ColumnMetaData => column_meta_data_type(id),
            _ => None,
        };
        let wire = if t == BOOL_FALSE { BOOL_TRUE } else { t };
        if expected.is_some_and(|e| e != wire) {
            r.skip(t, 0)?;
            continue;
        }
        write_field_header(out, &mut last_out, id, t);
        match (child(shape, id), t) {
            (Shape::Opaque, _) | (_, BOOL_TRUE | BOOL_FALSE) => {
                r.skip(t, 0)?;
                out.extend_from_slice(&r.b[start..r.pos]);
            }
            (inner, STRUCT) => rewrite_struct(r, out, inner)?,
            (inner, LIST) => {
                let (n, et) = r.list_header()?;
                out.extend_from_slice(&r.b[start..r.pos]);
                for _ in 0..n {
                    if et == STRUCT {
                        rewrite_struct(r, out, inner)?;
                    } else {
                        let s = r.pos;
                        r.skip_element(et, 0)?;
                        out.extend_from_slice(&r.b[s..r.pos]);
                    }
                }
            }
            _ => {
                r.skip(t, 0)?;
                out.extend_from_slice(&r.b[start..r.pos]);
            }
        }
    }
    out.push(0);
    Ok(())
}

/// The footer's `FileMetaData` re-encoded without mistyped `ColumnMetaData` fields.
fn without_mistyped_fields(metadata: &[u8]) -> Result<Vec<u8>> {
    let mut r = Reader {
        b: metadata,
        pos: 0,
    };
    let mut out = Vec::with_capacity(metadata.len());
    rewrite_struct(&mut r, &mut out, Shape::FileMetaData)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_before_arrow_3_are_known_by_their_created_by() {
        for (by, old) in [
            ("parquet-cpp version 1.5.1-SNAPSHOT", true),
            ("parquet-cpp-arrow version 2.0.0", true),
            ("parquet-cpp-arrow version 3.0.0", false),
            ("parquet-cpp-arrow version 14.0.2", false),
            ("parquet-mr version 1.12.3 (build abc)", false),
        ] {
            assert_eq!(pages_v2_flag_unreliable(Some(by)), old, "{by}");
        }
        assert!(!pages_v2_flag_unreliable(None));
    }
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_are_read_or_refused_in_bounded_time(
            bytes in prop::collection::vec(any::<u8>(), 0..2048),
            // A binary length field claiming up to 2^64 bytes.
            huge in any::<u64>(),
        ) {
            let started = std::time::Instant::now();
            let _ = without_mistyped_fields(&bytes);
            let _ = key_value(&bytes, "k");
            // FileMetaData { 5: [KeyValue { 1: binary of `huge` bytes }] }.
            let mut kv = vec![0x59, 0x1c, 0x18];
            write_varint(&mut kv, huge);
            kv.extend_from_slice(b"abc");
            prop_assert!(key_value(&kv, "k").is_err());
            prop_assert!(without_mistyped_fields(&kv).is_err());
            prop_assert!(started.elapsed() < std::time::Duration::from_secs(2));
        }
    }

    #[test]
    fn a_well_formed_footer_is_re_encoded_byte_for_byte() {
        // Field ids 1, 3 (delta), 20 (long form), a bool, a list of structs, a nested struct.
        let mut b = vec![0x15, 0x04]; // 1: i32 2
        b.extend([0x28, 0x03, b'a', b'b', b'c']); // 3: binary "abc"
        b.extend([0x06, 0x28, 0x02]); // 20: i64 1 (long form: type 6, zigzag id 40)
        b.extend([0x11]); // 21: true
        b.extend([0x19, 0x2c, 0x15, 0x02, 0x00, 0x15, 0x04, 0x00]); // 22: list of 2 structs
        b.push(0x00);
        assert_eq!(without_mistyped_fields(&b).unwrap(), b);
    }

    #[test]
    fn a_mistyped_column_meta_data_field_is_dropped() {
        // FileMetaData { 4: [RowGroup { 1: [ColumnChunk { 3: ColumnMetaData {
        //   1: i32 1, 15: list<i16> [1], 16: struct {} } }] }] }
        let cmd = [0x15, 0x02, 0xe9, 0x14, 0x02, 0x1c, 0x00, 0x00];
        let mut b = vec![0x49, 0x1c, 0x19, 0x1c, 0x3c];
        b.extend(cmd);
        b.extend([0x00, 0x00, 0x00]);
        let out = without_mistyped_fields(&b).unwrap();
        let mut want = vec![0x49, 0x1c, 0x19, 0x1c, 0x3c];
        // 1: i32 1, then 16 as a long-form header (the delta from 1 is 15: short form).
        want.extend([0x15, 0x02, 0xfc, 0x00, 0x00]);
        want.extend([0x00, 0x00, 0x00]);
        assert_eq!(out, want);
    }

    #[test]
    fn truncated_footers_are_errors_not_panics() {
        let b = [0x49, 0x1c, 0x19, 0x1c, 0x3c, 0x15];
        for n in 0..b.len() {
            assert!(without_mistyped_fields(&b[..n]).is_err());
        }
    }
}
