//! The rows a `where=` keeps of a source (PRODUCT.md §11), decided once, when the dataset is
//! read, from the least that settles it:
//!
//! 1. before any footer, each object's partition values (hive keys, a table's partition
//!    columns): objects they rule out are no part of the dataset, never fetched;
//! 2. each row group's statistics, from the footers: a row group ruled out is not fetched, one
//!    they keep whole is not read;
//! 3. where the file has a page index, each page's statistics, in the row groups left: pages
//!    they rule out or keep whole are not fetched;
//! 4. the rest, EXPR's columns alone read and tested row by row.
//!
//! The rows not kept join the rows a table deletes from each file (its deletion vector), kept
//! with the object as an inline vector: from there the plan counts each row group's rows left,
//! the decode drops the others, a snapshot pins them and the fingerprint changes with them,
//! exactly as for a table's own deletes.

use crate::source::catalog::NullFact;
use crate::source::filter::{Checked, Decision, Filter, Known, Nulls};
use crate::source::lake::{ColumnBounds, FileBounds};
use crate::source::partition::Partitions;
use crate::source::{Source, SourceFile, deletes};
use anyhow::{Context, Result, anyhow};
use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{DataType, Schema};
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use roaring::RoaringTreemap;
use std::sync::Arc;

/// What a `where=` made of a source, for `dataset.json` and `tensorfs inspect`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selected {
    pub text: String,
    /// Whether this mount decided the rows (else a snapshot pinned them, and the counts
    /// below are not known).
    pub decided_here: bool,
    /// Objects ruled out by their partition values, before their footers.
    pub objects_ruled_out: u64,
    /// Row groups ruled out by statistics, and kept whole by them.
    pub row_groups_ruled_out: u64,
    pub row_groups_kept_whole: u64,
    /// Row groups whose EXPR columns were read to decide.
    pub row_groups_read: u64,
    /// Rows of those row groups their page index settled, whose pages were not fetched.
    pub rows_settled_by_page_index: u64,
}

/// How many row groups' EXPR columns are read at once.
const READS_AT_ONCE: usize = 8;

/// The objects (by position) that neither their partition values nor what a table's metadata
/// says of their columns (`table`: the table's data columns, and each file's bounds) rule
/// `filter` out.
pub(crate) fn objects_kept(
    filter: &Filter,
    units: usize,
    partitions: &Partitions,
    table: Option<(&Schema, &[Option<FileBounds>])>,
) -> Result<Vec<bool>> {
    let (data, bounds): (Vec<_>, &[Option<FileBounds>]) = match table {
        Some((schema, bounds)) if bounds.len() == units => (schema.fields().to_vec(), bounds),
        _ => (Vec::new(), &[]),
    };
    if partitions.is_empty() && bounds.iter().all(Option::is_none) {
        return Ok(vec![true; units]);
    }
    let first_partition = data.len();
    let schema = Schema::new([data, partitions.fields.clone()].concat());
    let checked = filter.check(&schema, true)?;
    let known = |column: usize| -> Result<Known> {
        if column >= first_partition {
            return Ok(Known::Constant(constant(
                partitions,
                column - first_partition,
            )?));
        }
        let field = schema.field(column);
        bounds_known(field.name(), field.data_type(), bounds)
    };
    let decisions = checked.decide(units, &known)?;
    Ok(decisions.into_iter().map(|d| d != Decision::None).collect())
}

/// Column `name`'s bounds and nulls in each file, as its table's metadata gives them.
fn bounds_known(name: &str, t: &DataType, bounds: &[Option<FileBounds>]) -> Result<Known> {
    fn of<'a>(b: &'a Option<FileBounds>, name: &str) -> Option<&'a ColumnBounds> {
        b.as_ref().and_then(|b| b.columns.get(name))
    }
    if bounds.iter().all(|b| of(b, name).is_none()) {
        return Ok(Known::Unknown);
    }
    let one = |v: Option<&ArrayRef>| -> ArrayRef {
        match v {
            Some(v) if v.data_type() == t => v.clone(),
            _ => arrow::array::new_null_array(t, 1),
        }
    };
    let column = |pick: &dyn Fn(&ColumnBounds) -> Option<&ArrayRef>| -> Result<ArrayRef> {
        let values: Vec<ArrayRef> = bounds
            .iter()
            .map(|b| one(of(b, name).and_then(pick)))
            .collect();
        let refs: Vec<&dyn Array> = values.iter().map(|a| a.as_ref()).collect();
        Ok(arrow::compute::concat(&refs)?)
    };
    let nulls = (bounds.iter())
        .map(|b| {
            let rows = b.as_ref().and_then(|b| b.rows);
            Nulls::of(of(b, name).and_then(|c| c.nulls), rows)
        })
        .collect();
    Ok(Known::Bounds {
        min: column(&|c| c.min.as_ref())?,
        max: column(&|c| c.max.as_ref())?,
        nulls,
    })
}

/// Partition column `k`'s value in each file, one row a file.
fn constant(partitions: &Partitions, k: usize) -> Result<ArrayRef> {
    let one: Vec<ArrayRef> = (0..partitions.values.len())
        .map(|f| partitions.column(f, k, 1))
        .collect::<Result<_>>()?;
    let refs: Vec<&dyn Array> = one.iter().map(|a| a.as_ref()).collect();
    match refs.is_empty() {
        true => Ok(arrow::array::new_empty_array(
            partitions.fields[k].data_type(),
        )),
        false => Ok(arrow::compute::concat(&refs)?),
    }
}

impl Source {
    /// Applies `filter` to every row group of the source: see the module's comment.
    pub(crate) async fn select(&mut self, filter: &Filter, ruled_out: u64) -> Result<()> {
        let checked = filter.check(&self.schema, false)?;
        let mut selected = Selected {
            text: filter.text.clone(),
            decided_here: true,
            objects_ruled_out: ruled_out,
            ..Selected::default()
        };
        let this = &*self;
        let checked = &checked;
        let decided: Vec<(Vec<Decision>, (RoaringTreemap, u64))> =
            futures::stream::iter(0..this.files.len())
                .map(|file| async move {
                    let decisions = this.decide(file, checked).await?;
                    let dropped = this.dropped(file, checked, &decisions).await?;
                    Ok::<_, anyhow::Error>((decisions, dropped))
                })
                .buffered(READS_AT_ONCE)
                .try_collect()
                .await?;
        for (file, (decisions, (dropped, by_pages))) in decided.into_iter().enumerate() {
            selected.rows_settled_by_page_index += by_pages;
            for d in &decisions {
                match d {
                    Decision::None => selected.row_groups_ruled_out += 1,
                    Decision::All => selected.row_groups_kept_whole += 1,
                    Decision::Read => selected.row_groups_read += 1,
                }
            }
            if dropped.is_empty() {
                continue;
            }
            self.drop_rows(file, dropped).await?;
        }
        self.nulls_of_kept_rows().await?;
        if self.files.iter().all(|f| f.live_rows() == 0) {
            anyhow::bail!(
                "where={} keeps no row of source '{}'",
                filter.text,
                self.display
            );
        }
        self.selected = Some(selected);
        Ok(())
    }

    /// The footers say a column has nulls; where a `where=` dropped rows, those may have been
    /// all of them. The row groups with kept rows whose statistics show nulls (or none) are
    /// then left for the view to read, as it reads those statistics leave unknown.
    async fn nulls_of_kept_rows(&mut self) -> Result<()> {
        if self.files.iter().all(|f| f.deletes.is_none()) {
            return Ok(());
        }
        for column in 0..self.file_columns() {
            if !matches!(self.facts.nulls.get(column), Some(NullFact::In(_))) {
                continue;
            }
            let mut unknown = Vec::new();
            let mut found = None;
            'files: for (fi, f) in self.files.iter().enumerate() {
                let live = f.live_rg_rows();
                let footer = self.footer(fi).await?;
                let Some(root) = footer.root(column) else {
                    if live.iter().any(|&n| n > 0) {
                        found = Some(f.name.clone());
                        break 'files;
                    }
                    continue;
                };
                let md = footer.metadata.metadata();
                let descr = md.file_metadata().schema_descr();
                let leaves: Vec<usize> = (0..descr.num_columns())
                    .filter(|&l| descr.get_column_root_idx(l) == root)
                    .collect();
                for (rg, &n) in live.iter().enumerate() {
                    let chunk = md.row_group(rg);
                    let maybe = leaves.iter().any(|&l| {
                        let count = chunk
                            .column(l)
                            .statistics()
                            .and_then(|s| s.null_count_opt());
                        count != Some(0)
                    });
                    if n > 0 && maybe {
                        unknown.push((fi as u32, rg as u32));
                    }
                }
            }
            self.facts.nulls[column] = match (found, unknown.is_empty()) {
                (Some(file), _) => NullFact::In(file),
                (None, true) => NullFact::None,
                (None, false) => NullFact::Unknown(unknown),
            };
        }
        Ok(())
    }

    /// Partition column `k`'s value in `file`, the same in each of its `units` units.
    fn partition_known(&self, file: usize, k: usize, units: usize) -> Result<Known> {
        let one = self.partitions.column(file, k, 1)?;
        let refs: Vec<&dyn Array> = vec![one.as_ref(); units];
        Ok(Known::Constant(match units {
            0 => arrow::array::new_empty_array(one.data_type()),
            _ => arrow::compute::concat(&refs)?,
        }))
    }

    /// Each row group of `file`: ruled out, kept whole, or to be read, from its statistics and
    /// partition values.
    async fn decide(&self, file: usize, checked: &Checked) -> Result<Vec<Decision>> {
        let groups = self.files[file].rg_rows.len();
        let footer = self.footer(file).await?;
        let md = footer.metadata.metadata();
        let file_schema = footer.metadata.schema();
        let parquet_schema = md.file_metadata().schema_descr();
        let first_partition = self.file_columns();
        let known = |column: usize| -> Result<Known> {
            if column >= first_partition {
                return self.partition_known(file, column - first_partition, groups);
            }
            let Some(at) = footer.root(column) else {
                // A table's file without the column: it is null there.
                let t = self.schema.field(column).data_type();
                return Ok(Known::Constant(arrow::array::new_null_array(t, groups)));
            };
            let name = file_schema.field(at).name();
            let Ok(converter) = StatisticsConverter::try_new(name, file_schema, parquet_schema)
            else {
                return Ok(Known::Unknown);
            };
            let (Ok(min), Ok(max), Ok(null_counts)) = (
                converter.row_group_mins(md.row_groups()),
                converter.row_group_maxes(md.row_groups()),
                converter.row_group_null_counts(md.row_groups()),
            ) else {
                return Ok(Known::Unknown);
            };
            let rows = &self.files[file].rg_rows;
            let nulls = (0..groups)
                .map(|g| {
                    Nulls::of(
                        null_counts.is_valid(g).then(|| null_counts.value(g)),
                        Some(rows[g]),
                    )
                })
                .collect();
            Ok(Known::Bounds { min, max, nulls })
        };
        checked.decide(groups, &known)
    }

    /// The rows of `file` that `checked` does not keep, as positions in the file, and how many
    /// rows of the row groups read the page index settled.
    async fn dropped(
        &self,
        file: usize,
        checked: &Checked,
        decisions: &[Decision],
    ) -> Result<(RoaringTreemap, u64)> {
        let f = &self.files[file];
        let mut dropped = RoaringTreemap::new();
        let mut by_pages = 0;
        let indexed = match decisions.contains(&Decision::Read) {
            true => self.page_indexed(file).await?,
            false => None,
        };
        let mut start = 0u64;
        for (rg, (&d, &rows)) in decisions.iter().zip(&f.rg_rows).enumerate() {
            match d {
                Decision::All => {}
                Decision::None => {
                    dropped.insert_range(start..start + rows);
                }
                Decision::Read => {
                    let (keep, settled) = self
                        .kept_in(file, rg, checked, indexed.as_ref())
                        .await
                        .with_context(|| format!("where={}", checked.text))?;
                    by_pages += settled;
                    dropped.extend((0..rows).filter(|&i| !keep[i as usize]).map(|i| start + i));
                }
            }
            start += rows;
        }
        Ok((dropped, by_pages))
    }

    /// Which rows of row group `rg` `checked` keeps, and how many of them the page index
    /// (`indexed`: the footer with it, where the file has one) settled without their pages.
    async fn kept_in(
        &self,
        file: usize,
        rg: usize,
        checked: &Checked,
        indexed: Option<&ArrowReaderMetadata>,
    ) -> Result<(Vec<bool>, u64)> {
        let rows = self.files[file].rg_rows[rg];
        let segments = match indexed {
            Some(ix) => self.page_decisions(file, rg, checked, ix).await?,
            None => None,
        };
        let Some((bounds, decisions)) = segments else {
            let batch = (self.read_stored_rows(file, rg, &checked.columns, None)).await?;
            let keep = checked.keep(&batch)?;
            if keep.len() as u64 != rows {
                return Err(anyhow!(
                    "file '{}' row group {rg}: {} rows read of {rows}",
                    self.files[file].name,
                    keep.len()
                ));
            }
            return Ok(((0..keep.len()).map(|i| keep.value(i)).collect(), 0));
        };
        let mut keep = vec![false; rows as usize];
        let mut selectors = Vec::new();
        let mut settled = 0;
        for (k, d) in decisions.iter().enumerate() {
            let (a, b) = (bounds[k] as usize, bounds[k + 1] as usize);
            let n = b - a;
            match d {
                Decision::Read => selectors.push(RowSelector::select(n)),
                Decision::All => {
                    keep[a..b].fill(true);
                    selectors.push(RowSelector::skip(n));
                    settled += n as u64;
                }
                Decision::None => {
                    selectors.push(RowSelector::skip(n));
                    settled += n as u64;
                }
            }
        }
        if (settled as usize) < keep.len() {
            let ix = indexed.expect("segments come from the page index");
            let selection = RowSelection::from(selectors);
            let picked = Some((selection, ix));
            let batch = (self.read_stored_rows(file, rg, &checked.columns, picked)).await?;
            let read = checked.keep(&batch)?;
            let mut at = 0;
            for (k, d) in decisions.iter().enumerate() {
                if *d != Decision::Read {
                    continue;
                }
                for slot in &mut keep[bounds[k] as usize..bounds[k + 1] as usize] {
                    *slot = read.value(at);
                    at += 1;
                }
            }
        }
        Ok((keep, settled))
    }

    /// The stretches of row group `rg` that the page index tells apart (bounded by where any of
    /// EXPR's columns starts a page) with what their pages' statistics decide of each: none
    /// where an EXPR column has no offset index, or the row group is one stretch.
    async fn page_decisions(
        &self,
        file: usize,
        rg: usize,
        checked: &Checked,
        ix: &ArrowReaderMetadata,
    ) -> Result<Option<(Vec<u64>, Vec<Decision>)>> {
        let md = ix.metadata();
        let Some(pi) = md.page_index() else {
            return Ok(None);
        };
        let pi = pi.as_ref();
        let footer = self.footer(file).await?;
        let (file_schema, parquet_schema) = (ix.schema(), md.file_metadata().schema_descr());
        let rows = self.files[file].rg_rows[rg];
        let first_partition = self.file_columns();
        let mut bounds = std::collections::BTreeSet::from([0, rows]);
        let mut pages: std::collections::HashMap<usize, (StatisticsConverter, Vec<u64>)> =
            Default::default();
        for &c in &checked.columns {
            let Some(at) = (c < first_partition).then(|| footer.root(c)).flatten() else {
                continue;
            };
            let name = file_schema.field(at).name();
            let Ok(converter) = StatisticsConverter::try_new(name, file_schema, parquet_schema)
            else {
                return Ok(None);
            };
            let Some(index) =
                (converter.parquet_column_index()).and_then(|leaf| pi.offset_index(rg, leaf))
            else {
                return Ok(None);
            };
            let firsts: Vec<u64> = (index.page_locations().iter())
                .map(|l| l.first_row_index as u64)
                .collect();
            if firsts.first() != Some(&0) {
                return Ok(None);
            }
            bounds.extend(firsts.iter().copied().filter(|&r| r < rows));
            pages.insert(c, (converter, firsts));
        }
        let bounds: Vec<u64> = bounds.into_iter().collect();
        let segments = bounds.len() - 1;
        if segments <= 1 {
            return Ok(None);
        }
        let known = |column: usize| -> Result<Known> {
            if column >= first_partition {
                return self.partition_known(file, column - first_partition, segments);
            }
            let Some((converter, firsts)) = pages.get(&column) else {
                // A table's file without the column: it is null there.
                let t = self.schema.field(column).data_type();
                return Ok(Known::Constant(arrow::array::new_null_array(t, segments)));
            };
            let rgs = [rg];
            let (Ok(min), Ok(max), Ok(null_counts)) = (
                converter.data_page_mins(pi, &rgs),
                converter.data_page_maxes(pi, &rgs),
                converter.data_page_null_counts(pi, &rgs),
            ) else {
                return Ok(Known::Unknown);
            };
            // The page of each stretch, and its rows.
            let page_of: Vec<u32> = (bounds[..segments].iter())
                .map(|&b| (firsts.partition_point(|&f| f <= b) - 1) as u32)
                .collect();
            let page_rows = |p: usize| firsts.get(p + 1).copied().unwrap_or(rows) - firsts[p];
            let picks = arrow::array::UInt32Array::from(page_of.clone());
            let nulls = (page_of.iter().map(|&p| p as usize))
                .map(|p| {
                    let count = null_counts.is_valid(p).then(|| null_counts.value(p));
                    Nulls::of(count, Some(page_rows(p)))
                })
                .collect();
            Ok(Known::Bounds {
                min: arrow::compute::take(&min, &picks, None)?,
                max: arrow::compute::take(&max, &picks, None)?,
                nulls,
            })
        };
        let decisions = checked.decide(segments, &known)?;
        Ok(Some((bounds, decisions)))
    }

    /// Drops `dropped` (positions) from `file`, beside the rows its table deletes.
    async fn drop_rows(&mut self, file: usize, dropped: RoaringTreemap) -> Result<()> {
        let mut all = match self.files[file].deletes.is_some() {
            true => self.deleted_rows(file).await?.as_ref().clone(),
            false => RoaringTreemap::new(),
        };
        all |= dropped;
        let f = &mut self.files[file];
        let mut object = f.object.clone();
        object.deletes = Some(deletes::inline_vector(&deletes::with_runs(&all))?);
        object.rg_deleted = deletes::per_row_group(&all, &object.rg_rows);
        // Another set of rows is another identity (what the cache keys the file's columns by).
        let mut again = SourceFile::new(&self.url, f.location.clone(), object);
        again.footer = std::mem::take(&mut f.footer);
        again.deleted = tokio::sync::OnceCell::new_with(Some(Arc::new(all)));
        *f = again;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::partition::Value;
    use arrow::datatypes::Field;

    #[test]
    fn partition_values_rule_objects_out_before_their_footers() {
        let partitions = Partitions {
            fields: vec![
                Arc::new(Field::new("day", DataType::Int32, true)),
                Arc::new(Field::new("region", DataType::Utf8, true)),
            ],
            values: vec![
                vec![Value::Int(1), Value::Str("eu".into())],
                vec![Value::Int(2), Value::Str("us".into())],
                vec![Value::Int(3), Value::Null],
            ],
        };
        let kept =
            |expr: &str| objects_kept(&Filter::parse(expr).unwrap(), 3, &partitions, None).unwrap();
        assert_eq!(kept("day >= 2"), [false, true, true]);
        assert_eq!(kept("day >= 2 and x > 1"), [false, true, true]);
        assert_eq!(kept("day >= 2 or x > 1"), [true, true, true]);
        assert_eq!(kept("region = 'eu' or day = 3"), [true, false, true]);
        assert_eq!(kept("region != 'eu'"), [false, true, false]);
        let days: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1, 2, 3]));
        let b = crate::source::bucket::buckets(&days, 4).unwrap();
        let want: Vec<bool> = b.iter().map(|v| v == Some(b.value(0))).collect();
        assert_eq!(kept(&format!("bucket(day, 4) = {}", b.value(0))), want[..]);
    }
}
