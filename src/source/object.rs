//! Reads of one Parquet object: ranged GETs pinned to the version listed (the one
//! `AsyncFileReader` every table kind reads through), and its footer, fetched in one request
//! where it can be, kept between mounts, and decoded as pyarrow reads it.

use crate::model::kept;
use crate::source::{SourceFile, hex};
use crate::stats::Stats;
use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use std::ops::Range;
use std::sync::Arc;

/// How much of a file's end is fetched first: most footers fit, so one request does.
const FOOTER_GUESS: u64 = 64 << 10;

/// A file's Parquet metadata and its footer's length: from the footer kept in `kept` (a
/// directory) when there is one, else fetched (its suffix: `known_len` bytes where the length
/// is known, else in one request when the footer fits the guess) and kept for the next mount.
pub(crate) async fn load_metadata(
    reader: &ObjectReader,
    kept: Option<&std::path::Path>,
    id: &[u8; 32],
    known_len: u64,
) -> Result<(ArrowReaderMetadata, u64)> {
    let kept = kept.map(|dir| dir.join(format!("{}.footer", hex(&id[..16]))));
    let footer = match kept.as_deref().and_then(|p| kept::read_blob(p, id)) {
        Some(b) => Bytes::from(b),
        None => {
            let footer = fetch_footer(reader, known_len).await?;
            if let Some(p) = &kept
                && let Err(e) = kept::write_blob(p, id, &footer)
            {
                tracing::warn!("cannot keep the footer of '{}': {e:#}", reader.location);
            }
            footer
        }
    };
    Ok((decode_footer(&footer)?, footer.len() as u64))
}

/// Decodes a footer (metadata, length, magic) into the Arrow view of the file. Malformed input
/// is an error, never a panic, even where the Parquet decoder would panic.
pub(crate) fn decode_footer(footer: &[u8]) -> Result<ArrowReaderMetadata> {
    if footer.len() < 8 {
        bail!("a {}-byte footer is too short", footer.len());
    }
    let metadata = footer[..footer.len() - 8].to_vec();
    let decoded = crate::catch_panic(move || -> Result<ArrowReaderMetadata> {
        let metadata = crate::source::footer::decode(&metadata)?;
        arrow_metadata(Arc::new(metadata))
    });
    let decoded = decoded.unwrap_or_else(|panic| Err(anyhow!("the footer is malformed ({panic})")));
    // A refusal is one line: a mangled footer's names may hold line breaks the decoder quotes.
    decoded.map_err(|e| {
        let line = crate::describe(&e)
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        anyhow!("{line}")
    })
}

/// The Arrow view of a file, as pyarrow reads it. INT96 timestamps are nanoseconds with no
/// time zone, whatever unit a stored Arrow schema names: pyarrow ignores that schema for them
/// (values outside 1677-2262 wrap), where the parquet crate follows it.
pub(crate) fn arrow_metadata(md: Arc<ParquetMetaData>) -> Result<ArrowReaderMetadata> {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let plain = ArrowReaderMetadata::try_new(md.clone(), ArrowReaderOptions::new())?;
    let descr = md.file_metadata().schema_descr();
    let int96: Vec<usize> = (0..descr.num_columns())
        .map(|i| descr.column(i))
        .filter(|c| c.physical_type() == parquet::basic::Type::INT96 && c.path().parts().len() == 1)
        .filter_map(|c| plain.schema().index_of(c.name()).ok())
        .collect();
    let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
    let schema = plain.schema();
    let differs = |i: &usize| *schema.field(*i).data_type() != ns;
    if !int96.iter().any(differs) {
        return Ok(plain);
    }
    let fields: Vec<Field> = (schema.fields().iter().enumerate())
        .map(|(i, f)| match int96.contains(&i) {
            true => f.as_ref().clone().with_data_type(ns.clone()),
            false => f.as_ref().clone(),
        })
        .collect();
    let schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    let options = ArrowReaderOptions::new().with_schema(Arc::new(schema));
    Ok(ArrowReaderMetadata::try_new(md, options)?)
}

/// The footer of a Parquet file: its metadata, length and magic (the file's last bytes).
async fn fetch_footer(reader: &ObjectReader, known_len: u64) -> Result<Bytes> {
    let size = reader.size;
    if size < 12 {
        bail!("{size} bytes is too small for Parquet");
    }
    let guess = match known_len {
        0 => FOOTER_GUESS,
        len => len,
    }
    .min(size);
    let tail = reader.get(size - guess..size).await?;
    let end = &tail[tail.len() - 8..];
    match &end[4..] {
        b"PAR1" => {}
        b"PARE" => bail!("encrypted Parquet is not supported"),
        _ => bail!("no Parquet magic at the end of the file"),
    }
    let need = u32::from_le_bytes(end[..4].try_into().unwrap()) as u64 + 8;
    if need > size {
        bail!("the footer claims {need} bytes of a {size}-byte file");
    }
    if need <= guess {
        return Ok(tail.slice((guess - need) as usize..));
    }
    reader.get(size - need..size).await
}

/// An [`AsyncFileReader`] over one object of an object store, whose size is known so that the
/// footer is read without probing.
pub(crate) struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    location: Path,
    size: u64,
    /// The version every read is pinned to (`if-match`), when the store reports one.
    e_tag: Option<String>,
    /// The modification time listed, which pins reads where the store gives no ETag (none:
    /// a file a table's metadata names, whose version it does not give).
    modified: Option<String>,
    stats: Arc<Stats>,
    /// Since when the object must not have changed, for the error when it has.
    since: &'static str,
    /// The object's bytes where it is made in memory ([`crate::source::catalog::Object::memory`]).
    memory: Option<Bytes>,
}

/// Ranges closer than this are fetched as one request; farther apart, the bytes between them
/// (other columns) are not worth fetching.
pub(crate) const COALESCE: u64 = 4 << 10;

/// Bytes of one ranged GET at most: one connection to an object store serves far less than a
/// host's bandwidth (about 100 MB/s from S3), so a larger range (a row group of a gigabyte has
/// column chunks of hundreds of megabytes) is fetched as parts, several at once.
const PART: u64 = 16 << 20;

/// Parts of one range fetched at once.
const PARTS_AT_ONCE: usize = 8;

impl ObjectReader {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        file: &SourceFile,
        stats: Arc<Stats>,
        since: &'static str,
    ) -> Self {
        ObjectReader {
            store,
            location: file.location.clone(),
            size: file.size,
            e_tag: file.e_tag.clone(),
            modified: Some(file.modified.clone()),
            stats,
            since,
            memory: file.memory.clone(),
        }
    }

    /// A reader of an object whose size is known from elsewhere (a table's metadata) and whose
    /// version is not: only a change of size is caught.
    pub(crate) fn unpinned(
        store: Arc<dyn ObjectStore>,
        location: Path,
        size: u64,
        stats: Arc<Stats>,
    ) -> Self {
        ObjectReader {
            store,
            location,
            size,
            e_tag: None,
            modified: None,
            stats,
            since: "under the mount",
            memory: None,
        }
    }

    /// `range`: one GET, or parts of [`PART`] bytes fetched [`PARTS_AT_ONCE`] at a time.
    pub(crate) async fn get_in_parts(&self, range: Range<u64>) -> Result<Bytes> {
        let len = range.end - range.start;
        if len <= PART {
            return self.get(range).await;
        }
        let parts = (range.start..range.end)
            .step_by(PART as usize)
            .map(|at| at..(at + PART).min(range.end));
        let got: Vec<Bytes> = futures::stream::iter(parts)
            .map(|part| self.get(part))
            .buffered(PARTS_AT_ONCE)
            .try_collect()
            .await?;
        let mut whole = bytes::BytesMut::with_capacity(len as usize);
        for part in got {
            whole.extend_from_slice(&part);
        }
        Ok(whole.freeze())
    }

    /// One ranged GET, pinned to the object's version: an object replaced under a live mount
    /// fails the read rather than mixing two versions into a batch.
    pub(crate) async fn get(&self, range: Range<u64>) -> Result<Bytes> {
        if let Some(bytes) = &self.memory {
            let (start, end) = (range.start as usize, range.end as usize);
            if start > end || end > bytes.len() {
                bail!(
                    "object '{}': {start}..{end} of {} bytes",
                    self.location,
                    bytes.len()
                );
            }
            return Ok(bytes.slice(start..end));
        }
        Stats::add(&self.stats.c.remote_requests, 1);
        Stats::add(&self.stats.c.remote_bytes, range.end - range.start);
        let options = GetOptions {
            if_match: self.e_tag.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let result = async {
            let reply = self.store.get_opts(&self.location, options).await?;
            // Some servers ignore `if-match` (fake-gcs-server does): the reply's own version
            // and size are checked too, so a replaced object is never read at old offsets.
            // Where the store gives no ETag, the modification time is the version.
            let etag = |t: &str| t.trim_start_matches("W/").trim_matches('"').to_string();
            let replaced = match (&self.e_tag, &reply.meta.e_tag) {
                (Some(pinned), Some(now)) => etag(pinned) != etag(now),
                (None, _) => (self.modified.as_ref())
                    .is_some_and(|m| reply.meta.last_modified.to_string() != *m),
                _ => false,
            } || reply.meta.size != self.size;
            if replaced {
                return Err(object_store::Error::Precondition {
                    path: self.location.to_string(),
                    source: "the object's version or size changed".into(),
                });
            }
            reply.bytes().await
        }
        .await;
        let changed = |how: String| {
            anyhow::Error::new(crate::error::ObjectChanged {
                location: self.location.to_string(),
                since: self.since,
                how,
            })
        };
        let bytes = result.map_err(|e| match e {
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
                let version = self.e_tag.as_deref().unwrap_or("?");
                changed(format!("it is no longer version {version}"))
            }
            object_store::Error::NotFound { .. } => changed("it no longer exists".into()),
            e => anyhow!("object '{}': {e}", self.location),
        })?;
        if bytes.len() as u64 != range.end - range.start {
            bail!(
                "object '{}': {} bytes at {} instead of {}",
                self.location,
                bytes.len(),
                range.start,
                range.end - range.start
            );
        }
        Ok(bytes)
    }
}

/// The footer (metadata, length, magic) of a whole Parquet file held in memory, such as a
/// metadata file (`_common_metadata`, `_metadata`).
pub(crate) fn whole_file_footer(bytes: &[u8]) -> Result<&[u8]> {
    let n = bytes.len();
    if n < 12 || &bytes[n - 4..] != b"PAR1" {
        bail!("not a Parquet metadata file");
    }
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    match n.checked_sub(8 + len) {
        Some(start) if start >= 4 => Ok(&bytes[start..]),
        _ => bail!("its footer is longer than the file"),
    }
}

pub(crate) fn row_group_rows(md: &ParquetMetaData) -> Vec<u64> {
    md.row_groups()
        .iter()
        .map(|rg| rg.num_rows() as u64)
        .collect()
}

/// An [`AsyncFileReader`] over fetched ranges of an object: what they hold is answered from
/// memory, anything else read from the object.
pub(crate) struct Prefetched {
    pub(crate) chunks: Vec<(Range<u64>, Bytes)>,
    pub(crate) inner: ObjectReader,
}

impl Prefetched {
    fn held(&self, r: &Range<u64>) -> Option<Bytes> {
        self.chunks
            .iter()
            .find(|(c, _)| c.start <= r.start && r.end <= c.end)
            .map(|(c, b)| b.slice((r.start - c.start) as usize..(r.end - c.start) as usize))
    }
}

impl AsyncFileReader for Prefetched {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        match self.held(&range) {
            Some(b) => futures::future::ready(Ok(b)).boxed(),
            None => self.inner.get_bytes(range),
        }
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        self.inner.get_metadata(options)
    }
}

fn parquet_err(e: anyhow::Error) -> ParquetError {
    ParquetError::External(e.into())
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.get(range).await.map_err(parquet_err) }.boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let this = &*self;
            object_store::coalesce_ranges(&ranges, |r| this.get(r), COALESCE)
                .await
                .map_err(parquet_err)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .with_page_index_policy(PageIndexPolicy::Skip)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The footer of a small real file, written by the parquet crate.
    fn real_footer() -> Vec<u8> {
        use arrow::array::{Float32Array, Int64Array, RecordBatch};
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(0..100)) as _),
            (
                "x",
                Arc::new(Float32Array::from_iter_values((0..100).map(|i| i as f32))) as _,
            ),
        ])
        .unwrap();
        let mut buf = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let len =
            u32::from_le_bytes(buf[buf.len() - 8..buf.len() - 4].try_into().unwrap()) as usize;
        buf[buf.len() - 8 - len..].to_vec()
    }

    #[test]
    fn a_real_footer_decodes() {
        let md = decode_footer(&real_footer()).unwrap();
        assert_eq!(md.schema().fields().len(), 2);
        assert_eq!(md.metadata().file_metadata().num_rows(), 100);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_footers_are_errors_not_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            // Random bytes never hold every field a Parquet footer requires.
            prop_assert!(decode_footer(&bytes).is_err());
        }

        #[test]
        fn mutated_footers_never_panic(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut footer = real_footer();
            for (at, byte) in flips {
                let i = at.index(footer.len() - 8);
                footer[i] = byte;
            }
            let len = cut.index(footer.len());
            for bytes in [&footer[..], &footer[len..]] {
                let started = std::time::Instant::now();
                // Decoded, or refused in one line: a panic of the Parquet decoder included.
                if let Err(e) = decode_footer(bytes) {
                    prop_assert!(!format!("{e:#}").contains('\n'), "{e:#}");
                }
                // Our own readers of footers never panic, whatever the bytes.
                let meta = &bytes[..bytes.len().saturating_sub(8)];
                let ours = std::panic::catch_unwind(|| {
                    let _ = crate::source::footer::key_value(meta, "k");
                });
                prop_assert!(ours.is_ok(), "reading a footer's key-value metadata panicked");
                prop_assert!(started.elapsed() < std::time::Duration::from_secs(5));
            }
        }
    }
}
