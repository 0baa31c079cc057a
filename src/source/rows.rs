//! Reading a source's rows: a row group's column chunks fetched (I/O only), then decoded (CPU
//! only) as the dataset's columns: a table's files by name as the table's types, the rows it
//! deletes dropped, partition columns added, a file from the wild decoded as pyarrow would.

use crate::source::object::{COALESCE, Prefetched};
use crate::source::{ObjectReader, Source, arrow_metadata, deletes, footer};
use anyhow::{Context, Result, anyhow, bail};
use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use bytes::Bytes;
use futures::{FutureExt, TryStreamExt};
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection};
use std::ops::Range;
use std::sync::Arc;

impl Source {
    /// Reads one row group of one file, only the given root columns (Arrow field indices), as
    /// one record batch.
    pub(crate) async fn read_row_group(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
    ) -> Result<RecordBatch> {
        self.read_rows(file, rg, roots, true, None).await
    }

    /// [`Source::read_row_group`], with the rows the table deletes dropped (`live`) or kept;
    /// only the rows a selection picks, where one is given (see [`Source::fetch_rows`]).
    async fn read_rows(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        live: bool,
        selection: Option<(RowSelection, ArrowReaderMetadata)>,
    ) -> Result<RecordBatch> {
        let fetched = self.fetch_rows(file, rg, roots, selection).await?;
        let pieces = self.decode_stored_or_live(fetched, live).await?;
        let schema = match pieces.first() {
            Some(p) => p.schema(),
            None => Arc::new(self.schema.project(roots)?),
        };
        Ok(arrow::compute::concat_batches(&schema, &pieces)?)
    }

    pub(super) fn reader(&self, file: usize) -> ObjectReader {
        let (store, stats) = (self.store.clone(), self.stats.clone());
        ObjectReader::new(store, &self.files[file], stats, self.origin.since())
    }

    /// Fetches the column chunks of one row group that the given root columns need: I/O only,
    /// so that decoding ([`Source::decode_row_group`]) holds a worker without waiting on the
    /// network.
    #[tracing::instrument(name = "fetch", level = "debug", skip(self, roots))]
    pub(crate) async fn fetch_row_group(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
    ) -> Result<Fetched> {
        self.fetch_rows(file, rg, roots, None).await
    }

    /// [`Source::fetch_row_group`], or with a selection, nothing fetched: the decode fetches the
    /// pages that hold the rows selected.
    async fn fetch_rows(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        selection: Option<(RowSelection, ArrowReaderMetadata)>,
    ) -> Result<Fetched> {
        let f = &self.files[file];
        // The partition columns are no columns of the file: they are added as it is decoded.
        let (wanted, partition_roots): (Vec<usize>, Vec<usize>) =
            roots.iter().partition(|&&r| r < self.file_columns());
        let nothing = |wanted, selection| Fetched {
            file,
            rg,
            wanted,
            roots: Vec::new(),
            partition_roots: partition_roots.clone(),
            mask: None,
            chunks: Vec::new(),
            selection,
            piece_rows: PIECE_ROWS,
        };
        if wanted.is_empty() {
            return Ok(nothing(wanted, selection));
        }
        let footer = self.footer(file).await?;
        let mut roots: Vec<usize> = wanted.iter().filter_map(|&r| footer.root(r)).collect();
        roots.sort_unstable();
        roots.dedup();
        if roots.is_empty() {
            return Ok(nothing(wanted, selection));
        }
        let meta = footer.metadata.metadata();
        let mask =
            ProjectionMask::roots(meta.file_metadata().schema_descr(), roots.iter().copied());
        let ranges: Vec<Range<u64>> = meta
            .row_group(rg)
            .columns()
            .iter()
            .enumerate()
            .filter(|&(leaf, _)| mask.leaf_included(leaf))
            .map(|(_, c)| {
                let (start, len) = c.byte_range();
                start..start + len
            })
            .collect();
        // A selection's pages are fetched by its decode.
        let chunks = match selection.is_some() {
            true => Vec::new(),
            false => {
                let reader = self.reader(file);
                let fetched =
                    object_store::coalesce_ranges(&ranges, |r| reader.get_in_parts(r), COALESCE)
                        .await
                        .with_context(|| {
                            format!("file '{}' row group {rg} cannot be read", f.name)
                        })?;
                ranges.into_iter().zip(fetched).collect()
            }
        };
        Ok(Fetched {
            file,
            rg,
            wanted,
            roots,
            partition_roots,
            mask: Some(mask),
            chunks,
            selection,
            piece_rows: PIECE_ROWS,
        })
    }

    /// Decodes a fetched row group (CPU only, unless the decoder asks for bytes that were not
    /// fetched, which are then read), as record batches of up to 8,192 rows, in order, with
    /// the partition columns asked for after the file's own.
    pub(crate) async fn decode_row_group(&self, fetched: Fetched) -> Result<Vec<RecordBatch>> {
        self.decode_stored_or_live(fetched, true).await
    }

    /// Reads the given root columns of one row group as the file stores its rows, those the
    /// table deletes included: what a `where=` tests, by position in the file. With a
    /// selection, only the rows it picks, read through `indexed` (the file's footer with its
    /// page index): only the pages that hold them are fetched.
    pub(crate) async fn read_stored_rows(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        selection: Option<(RowSelection, &ArrowReaderMetadata)>,
    ) -> Result<RecordBatch> {
        let selection = selection.map(|(s, indexed)| (s, indexed.clone()));
        let batch = self.read_rows(file, rg, roots, false, selection).await?;
        // Decoded in the order fetch_row_group asks (the file's columns, then partition
        // columns): put back in the order asked.
        let order: Vec<usize> = (roots.iter())
            .map(|&r| {
                let name = self.schema.field(r).name();
                batch.schema().index_of(name).map_err(anyhow::Error::from)
            })
            .collect::<Result<_>>()?;
        Ok(batch.project(&order)?)
    }

    /// The footer of `file` with its page index, where the file has one: loaded with one read
    /// of the index's bytes.
    pub(crate) async fn page_indexed(&self, file: usize) -> Result<Option<ArrowReaderMetadata>> {
        let footer = self.footer(file).await?;
        let md = footer.metadata.metadata();
        let has_index = (md.row_groups().iter())
            .any(|g| g.columns().iter().any(|c| c.offset_index_range().is_some()));
        if !has_index {
            return Ok(None);
        }
        let mut reader = self.reader(file);
        let mut loader =
            parquet::file::metadata::ParquetMetaDataReader::new_with_metadata(md.as_ref().clone())
                .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
        loader.load_page_index(&mut reader).await.with_context(|| {
            format!(
                "file '{}': its page index cannot be read",
                self.files[file].name
            )
        })?;
        let md = loader.finish()?;
        Ok(Some(arrow_metadata(Arc::new(md))?))
    }

    /// [`Source::decode_row_group`], with the rows the table deletes dropped (`live`) or kept.
    async fn decode_stored_or_live(
        &self,
        fetched: Fetched,
        live: bool,
    ) -> Result<Vec<RecordBatch>> {
        let (file, rg) = (fetched.file, fetched.rg);
        let partition_roots = fetched.partition_roots.clone();
        let (wanted, roots) = (fetched.wanted.clone(), fetched.roots.clone());
        let pieces = match fetched.mask.is_some() {
            true => {
                let pieces = self.decode_columns(fetched).await?;
                match live {
                    true => self.without_deleted(file, rg, pieces).await?,
                    false => pieces,
                }
            }
            // Only partition columns: as many rows as the table keeps.
            false => {
                let rows = match live {
                    true => self.files[file].live_rg_rows()[rg] as usize,
                    false => self.files[file].rg_rows[rg] as usize,
                };
                let no_columns = Arc::new(arrow::datatypes::Schema::empty());
                let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
                vec![RecordBatch::try_new_with_options(
                    no_columns,
                    vec![],
                    &options,
                )?]
            }
        };
        let pieces = match self.table {
            Some(_) => self.as_the_table(file, pieces, &wanted, &roots).await?,
            None => pieces,
        };
        if partition_roots.is_empty() {
            return Ok(pieces);
        }
        let first = self.file_columns();
        (pieces.into_iter())
            .map(|piece| {
                let mut fields: Vec<_> = piece.schema().fields().iter().cloned().collect();
                let mut columns = piece.columns().to_vec();
                for &r in &partition_roots {
                    fields.push(self.partitions.fields[r - first].clone());
                    columns.push(self.partitions.column(file, r - first, piece.num_rows())?);
                }
                let schema = Arc::new(arrow::datatypes::Schema::new(fields));
                Ok(RecordBatch::try_new(schema, columns)?)
            })
            .collect()
    }

    /// Row group `rg` of `file` (`pieces`, its rows in order) without the rows the table
    /// deletes from it.
    async fn without_deleted(
        &self,
        file: usize,
        rg: usize,
        pieces: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        let f = &self.files[file];
        if f.deletes.is_none() {
            return Ok(pieces);
        }
        let deleted = self.deleted_rows(file).await?;
        let start: u64 = f.rg_rows[..rg].iter().sum();
        let end = start + f.rg_rows[rg];
        if deletes::count_in(deleted, start..end) == 0 {
            return Ok(pieces);
        }
        let mut at = start;
        (pieces.into_iter())
            .map(|piece| {
                let n = piece.num_rows() as u64;
                let keep: arrow::array::BooleanArray = (at..at + n)
                    .map(|row| Some(!deleted.contains(row)))
                    .collect();
                at += n;
                Ok(arrow::compute::filter_record_batch(&piece, &keep)?)
            })
            .collect()
    }

    /// The rows the table deletes from `file` (none where it has no deletion vector), loaded
    /// when first needed.
    pub(crate) async fn deleted_rows(&self, file: usize) -> Result<&Arc<roaring::RoaringTreemap>> {
        let f = &self.files[file];
        (f.deleted)
            .get_or_try_init(|| async {
                let rows = match &f.deletes {
                    None => roaring::RoaringTreemap::new(),
                    Some(dv) => {
                        let (url, root) = (&self.url, &self.root);
                        deletes::load(&self.store, url, root, dv, &self.stats).await?
                    }
                };
                Ok::<_, anyhow::Error>(Arc::new(rows))
            })
            .await
            .with_context(|| format!("file '{}'", f.name))
    }

    /// A table's file decoded, as the table's columns `wanted`: each found by name among the
    /// file's (decoded as `roots`, ascending), cast to the table's type where the file stores
    /// it otherwise, and null where the file lacks it.
    async fn as_the_table(
        &self,
        file: usize,
        pieces: Vec<RecordBatch>,
        wanted: &[usize],
        roots: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        let footer = self.footer(file).await?;
        let fields: Vec<arrow::datatypes::FieldRef> = (wanted.iter())
            .map(|&r| Arc::new(self.schema.field(r).clone().with_nullable(true)))
            .collect();
        let schema = Arc::new(Schema::new(fields.clone()));
        (pieces.into_iter())
            .map(|piece| {
                let columns = (wanted.iter().zip(&fields))
                    .map(|(&r, field)| match footer.root(r) {
                        Some(fr) => {
                            let at = roots.binary_search(&fr).expect("decoded");
                            let column = piece.column(at);
                            match column.data_type() == field.data_type() {
                                true => Ok(column.clone()),
                                false => cast_to_the_table(column, field.data_type()),
                            }
                        }
                        None => Ok(arrow::array::new_null_array(
                            field.data_type(),
                            piece.num_rows(),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let options =
                    arrow::array::RecordBatchOptions::new().with_row_count(Some(piece.num_rows()));
                Ok(RecordBatch::try_new_with_options(
                    schema.clone(),
                    columns,
                    &options,
                )?)
            })
            .collect::<Result<_>>()
            .with_context(|| format!("file '{}' as the table's columns", self.files[file].name))
    }

    /// [`Source::decode_row_group`] of the file's own columns. Where it fails as the footer
    /// says, and padding the column chunks (PARQUET-816, see `footer`) changes them, it is
    /// decoded once more that way.
    async fn decode_columns(&self, fetched: Fetched) -> Result<Vec<RecordBatch>> {
        let Fetched {
            file,
            rg,
            roots,
            mask,
            chunks,
            selection,
            piece_rows,
            ..
        } = fetched;
        let mask = mask.expect("a projection of the file's columns");
        let f = &self.files[file];
        if let Some((selection, indexed)) = selection {
            let picked = Some(selection);
            let how = (&indexed, picked, piece_rows);
            return (self.decode_with(file, rg, &roots, mask, chunks, how)).await;
        }
        let footer = self.footer(file).await?;
        let first = self
            .decode_with(
                file,
                rg,
                &roots,
                mask.clone(),
                chunks.clone(),
                (&footer.metadata, None, piece_rows),
            )
            .await;
        let Err(e) = first else { return first };
        let padded = footer.padded.get_or_init(|| {
            let md =
                crate::source::footer::padded(footer.metadata.metadata(), f.size - footer.len)?;
            arrow_metadata(Arc::new(md)).ok()
        });
        let chunks_again = chunks.clone();
        let Some(padded) = padded else {
            return Err(self
                .naming_the_column(file, rg, &roots, chunks_again, e)
                .await);
        };
        match self
            .decode_with(file, rg, &roots, mask, chunks, (padded, None, piece_rows))
            .await
        {
            Ok(batch) => {
                tracing::warn!(
                    "file '{}' row group {rg}: its footer gives column chunks too short (a bug of old writers, PARQUET-816); read with the chunks padded",
                    f.name
                );
                Ok(batch)
            }
            Err(_) => Err(self
                .naming_the_column(file, rg, &roots, chunks_again, e)
                .await),
        }
    }

    /// A row group's decode error, named by the column that fails: each column is decoded
    /// alone (a decoder's panic caught) until one fails; where none does alone, the error as it
    /// was.
    async fn naming_the_column(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        chunks: Vec<(Range<u64>, Bytes)>,
        e: anyhow::Error,
    ) -> anyhow::Error {
        if roots.len() < 2 {
            return e;
        }
        let metadata = match self.footer(file).await {
            Ok(footer) => &footer.metadata,
            Err(_) => return e,
        };
        for &root in roots {
            let mask = ProjectionMask::roots(metadata.parquet_schema(), [root]);
            let one = [root];
            let how = (metadata, None, PIECE_ROWS);
            let alone = self.decode_with(file, rg, &one, mask, chunks.clone(), how);
            match std::panic::AssertUnwindSafe(alone).catch_unwind().await {
                Ok(Ok(_)) => continue,
                Ok(Err(alone)) => return alone,
                Err(panic) => {
                    let column = metadata.schema().field(root).name();
                    return anyhow!(
                        "file '{}' row group {rg} column '{column}' cannot be read: a decoder panicked: {}",
                        self.files[file].name,
                        crate::panic_text(panic)
                    );
                }
            }
        }
        e
    }

    async fn decode_with(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        mask: ProjectionMask,
        chunks: Vec<(Range<u64>, Bytes)>,
        (metadata, selection, piece_rows): (&ArrowReaderMetadata, Option<RowSelection>, usize),
    ) -> Result<Vec<RecordBatch>> {
        let f = &self.files[file];
        let what = match roots {
            [root] => format!(
                "file '{}' row group {rg} column '{}'",
                f.name,
                metadata.schema().field(*root).name()
            ),
            _ => format!("file '{}' row group {rg}", f.name),
        };
        let md = metadata.metadata();
        let chunks = match footer::pages_v2_flag_unreliable(md.file_metadata().created_by()) {
            false => chunks,
            // Compressed chunks' data pages v2, marked uncompressed by their writer (see footer).
            true => (chunks.into_iter())
                .map(|(range, bytes)| {
                    let compressed = (md.row_group(rg).columns().iter()).any(|c| {
                        let (start, len) = c.byte_range();
                        start == range.start
                            && len == range.end - range.start
                            && c.compression() != parquet::basic::Compression::UNCOMPRESSED
                    });
                    match compressed
                        .then(|| footer::pages_v2_compressed(&bytes))
                        .flatten()
                    {
                        Some(patched) => (range, Bytes::from(patched)),
                        None => (range, bytes),
                    }
                })
                .collect(),
        };
        let reader = Prefetched {
            chunks,
            inner: self.reader(file),
        };
        let rows = match &selection {
            Some(s) => s.row_count(),
            None => md.row_group(rg).num_rows() as usize,
        };
        let mut stream =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata.clone())
                .with_row_groups(vec![rg])
                .with_projection(mask)
                .with_batch_size(rows.clamp(1, piece_rows));
        if let Some(selection) = selection {
            stream = stream.with_row_selection(selection);
        }
        let stream = stream.build().with_context(|| what.clone())?;
        // Kept as the decoder's pieces (of `piece_rows`): a row group concatenated whole would be
        // a third copy of it in memory, beside the pieces and the tensor columns made of them.
        let pieces: Vec<RecordBatch> = stream
            .try_collect()
            .await
            .with_context(|| format!("{what} cannot be read"))?;
        let decoded: usize = pieces.iter().map(RecordBatch::num_rows).sum();
        if decoded != rows {
            bail!(
                "file '{}' row group {rg}: {decoded} rows decoded where {rows} were asked for",
                f.name
            );
        }
        Ok(pieces)
    }
}

/// One row group's column chunks, fetched and not yet decoded.
pub(crate) struct Fetched {
    file: usize,
    rg: usize,
    /// The dataset's columns asked for that files store, the file's root columns they are
    /// (ascending; the same where the files' columns are the dataset's), and the partition
    /// columns asked for.
    wanted: Vec<usize>,
    roots: Vec<usize>,
    partition_roots: Vec<usize>,
    /// The projection of `roots`; none where only partition columns are asked for.
    mask: Option<ProjectionMask>,
    chunks: Vec<(Range<u64>, Bytes)>,
    /// Only these rows, read through the page index of this view of the file: the decoder
    /// fetches the pages that hold them and no others.
    selection: Option<(RowSelection, ArrowReaderMetadata)>,
    /// The most rows a decoded piece holds.
    piece_rows: usize,
}

/// The rows of a decoded piece: kept small, a piece's buffers are reused by the allocator
/// from one piece to the next, where a whole row group's come fresh from the kernel.
const PIECE_ROWS: usize = 8192;

impl Fetched {
    /// The row group decoded as one piece: for a transform, whose worker is given it whole
    /// (pieces would be concatenated into it, a copy of every byte).
    pub(crate) fn in_one_piece(self) -> Fetched {
        Fetched {
            piece_rows: usize::MAX,
            ..self
        }
    }
}

/// A file's column cast to the table's type. Never a value turned into null: a lossy cast is an
/// error. A timestamp the file stores without a time zone, at any depth, is the instant the
/// table's type says (a Delta `timestamp` is one in UTC, whatever the writer flagged): cast to the
/// zone "UTC" as to the offset "+00:00" (the same instants), since casting it to a named zone
/// needs the zone database, which this build of arrow leaves out.
fn cast_to_the_table(
    column: &arrow::array::ArrayRef,
    to: &arrow::datatypes::DataType,
) -> Result<arrow::array::ArrayRef> {
    let options = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let by_offset = utc_as_offset(to);
    if by_offset == *to {
        return Ok(arrow::compute::cast_with_options(column, to, &options)?);
    }
    // Between zones a cast relabels: no zone is looked up.
    let column = arrow::compute::cast_with_options(column, &by_offset, &options)?;
    Ok(arrow::compute::cast_with_options(&column, to, &options)?)
}

/// `t` with every timestamp in the zone "UTC" in the offset "+00:00" instead.
fn utc_as_offset(t: &arrow::datatypes::DataType) -> arrow::datatypes::DataType {
    use arrow::datatypes::{DataType, Field};
    let field = |f: &Field| Arc::new(f.clone().with_data_type(utc_as_offset(f.data_type())));
    match t {
        DataType::Timestamp(unit, Some(tz)) if tz.as_ref() == "UTC" => {
            DataType::Timestamp(*unit, Some("+00:00".into()))
        }
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(|f| field(f)).collect()),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naive_timestamps_cast_to_utc_at_any_depth_keep_their_instants() {
        use arrow::array::{Array, AsArray, ListArray, TimestampNanosecondArray};
        use arrow::datatypes::{DataType, Field, TimeUnit, TimestampMicrosecondType as Us};
        let naive: arrow::array::ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![
            1_000, 2_000_000, -3_000,
        ]));
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let flat = cast_to_the_table(&naive, &utc).unwrap();
        assert_eq!(flat.data_type(), &utc);
        assert_eq!(flat.as_primitive::<Us>().values(), &[1, 2_000, -3]);
        let list: arrow::array::ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("element", naive.data_type().clone(), true)),
            arrow::buffer::OffsetBuffer::from_lengths([2, 1]),
            naive,
            None,
        ));
        let to = DataType::List(Arc::new(Field::new("element", utc.clone(), true)));
        let nested = cast_to_the_table(&list, &to).unwrap();
        assert_eq!(nested.data_type(), &to);
        let values = nested.as_list::<i32>().values().clone();
        assert_eq!(values.as_primitive::<Us>().values(), &[1, 2_000, -3]);
    }
}
