//! What a mount knows of a dataset before it reads a row: its objects (names, sizes, versions,
//! the rows of each row group), its schema, and the facts the mount-time checks need, found in
//! the footers once (schemas that disagree, undecodable codecs, nulls). A listing mount finds
//! them in every footer; a snapshot (PRODUCT.md §8) carries them, so that a host mounting it
//! reads no footer until a read needs one. Also the dataset's fingerprint, and what differs
//! between two catalogs when fingerprints disagree.

use crate::source::partition::Partitions;
use crate::source::petastorm::Unischema;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One object of the dataset, as listed when the dataset was read (or pinned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// The key relative to the source's prefix (the file name for a single-file source).
    pub(crate) name: String,
    pub(crate) size: u64,
    /// The version reads are pinned to (`if-match`), where the store gives one.
    pub(crate) e_tag: Option<String>,
    /// The store's own version id (S3 version, GCS generation), where it gives one.
    pub(crate) version: Option<String>,
    /// The modification time as the store reported it.
    pub(crate) modified: String,
    /// Bytes of the footer (metadata, length, magic), so that one GET fetches it exactly; 0
    /// where not known yet.
    pub(crate) footer_len: u64,
    /// Rows of each row group, as the file stores them.
    pub(crate) rg_rows: Vec<u64>,
    /// The rows the table deletes from the file (a Delta deletion vector), if it deletes any.
    pub(crate) deletes: Option<crate::source::deletes::DeletionVector>,
    /// How many of each row group's rows it deletes (empty: none), once known.
    pub(crate) rg_deleted: Vec<u64>,
    /// The object's bytes, where the table kind made it in memory (a Hudi file slice's merged
    /// log records): read from here, never from the store, and pinned with a snapshot.
    pub(crate) memory: Option<bytes::Bytes>,
}

impl Object {
    /// Rows the file stores.
    pub(crate) fn rows(&self) -> u64 {
        self.rg_rows.iter().sum()
    }

    /// Rows of each row group the dataset holds: those the table did not delete.
    pub(crate) fn live_rg_rows(&self) -> Vec<u64> {
        (self.rg_rows.iter().enumerate())
            .map(|(i, &n)| n - self.rg_deleted.get(i).copied().unwrap_or(0).min(n))
            .collect()
    }

    /// Rows the dataset holds of the file.
    pub(crate) fn live_rows(&self) -> u64 {
        self.live_rg_rows().iter().sum()
    }
}

/// The Parquet summary file (`_metadata`) a dataset is listed by, where it is one's: part of
/// what the dataset is, so part of its fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Summary {
    pub(crate) name: String,
    pub(crate) size: u64,
    pub(crate) e_tag: Option<String>,
}

/// What a column's statistics say of its nulls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NullFact {
    None,
    /// Nulls, first in this file.
    In(String),
    /// Statistics are missing, or (for lists) also count empty lists: these row groups (file,
    /// row group) must be read to know.
    Unknown(Vec<(u32, u32)>),
}

/// What a mount knows of a dataset before it reads a footer.
pub struct Catalog {
    pub objects: Vec<Object>,
    pub(crate) summary: Option<Summary>,
    /// The files' columns, then the partition columns.
    pub schema: SchemaRef,
    pub(crate) partitions: Partitions,
    /// The version of the Delta table the dataset is, if it is one.
    pub(crate) table: Option<crate::source::lake::Version>,
    pub facts: Facts,
    pub(crate) unischema: Option<Unischema>,
    /// The `where=` expression whose rows the objects' deletes hold beside the table's.
    pub(crate) selection: Option<String>,
}

/// A dataset as a snapshot pinned it.
pub struct Pinned {
    /// Where the snapshot was read from (its path or URL).
    pub(crate) at: String,
    /// The source's URL when it was pinned.
    pub(crate) url: url::Url,
    /// The prefix (in the source's store) the objects' names are relative to.
    pub(crate) root: String,
    pub catalog: Catalog,
}

/// What the mount-time checks need of the footers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// Files whose schemas disagree, as the refusal says it.
    pub(crate) schema_problem: Option<String>,
    /// Columns compressed with a codec tensorfs cannot decode, each with why.
    pub(crate) undecodable: BTreeMap<String, String>,
    /// For each root column of the schema.
    pub(crate) nulls: Vec<NullFact>,
    /// Memory the decoded footers take, all of them loaded.
    pub footer_memory: u64,
}

impl Facts {
    /// The facts of the files' footers (`schema`: the dataset's, the first file's, whose
    /// columns every file has in the same places) and of the partition columns after them.
    pub(crate) fn of(
        schema: &Schema,
        files: &[(&str, &ArrowReaderMetadata)],
        partitions: &Partitions,
    ) -> Facts {
        let facts = Facts::mapped(schema, files, partitions, |_, i| Some(i));
        Facts {
            schema_problem: facts.schema_problem.or_else(|| check_schemas(files)),
            ..facts
        }
    }

    /// The facts of a table's files, whose columns are found by name and read as the table's
    /// `schema` says (a Delta table's files may store a column otherwise, or lack one added
    /// since: it is then null).
    pub(crate) fn of_table(
        schema: &Schema,
        files: &[(&str, &ArrowReaderMetadata)],
        partitions: &Partitions,
    ) -> Facts {
        let columns: Vec<Vec<Option<usize>>> = (files.iter())
            .map(|(_, md)| by_name(schema, md.schema()))
            .collect();
        let facts = Facts::mapped(schema, files, partitions, |f, i| columns[f][i]);
        let unreadable =
            (files.iter()).find_map(|(name, md)| table_schema_problem(schema, name, md));
        Facts {
            schema_problem: facts.schema_problem.or(unreadable),
            ..facts
        }
    }

    /// The facts, with `root(f, i)` the root column of file `f` that is field `i` (none: the
    /// file lacks it, and it is null there).
    fn mapped(
        schema: &Schema,
        files: &[(&str, &ArrowReaderMetadata)],
        partitions: &Partitions,
        root: impl Fn(usize, usize) -> Option<usize>,
    ) -> Facts {
        let mut nulls: Vec<NullFact> = (schema.fields().iter().enumerate())
            .map(|(i, f)| {
                let is_list = matches!(f.data_type(), DataType::List(_) | DataType::LargeList(_));
                null_fact(files, is_list, |f| root(f, i))
            })
            .collect();
        nulls.extend(
            (0..partitions.fields.len()).map(|k| match partitions.first_null(k) {
                Some(f) => NullFact::In(files[f].0.to_string()),
                None => NullFact::None,
            }),
        );
        Facts {
            schema_problem: partition_clash(schema, partitions),
            undecodable: undecodable_columns(files),
            nulls,
            footer_memory: (files.iter())
                .map(|(_, md)| md.metadata().memory_size() as u64)
                .sum(),
        }
    }
}

/// What an earlier snapshot pinned of a dataset, for a new one (`tensorfs snapshot --from`):
/// its objects, unchanged since, need no footer read, and the facts of their footers are the
/// earlier snapshot's.
pub(crate) struct Earlier<'a> {
    objects: std::collections::HashMap<&'a str, &'a Object>,
    /// Its objects in order, as its facts number them.
    names: Vec<&'a str>,
    facts: &'a Facts,
    /// The files' own columns (its schema less the partition columns).
    pub(crate) file_schema: SchemaRef,
}

impl<'a> Earlier<'a> {
    /// What `pinned` holds that a listing of the same dataset can take as it is: nothing for a
    /// summary file (read whole anyway), nor for a table whose schema changed since (its files
    /// must be checked against the new one).
    pub(crate) fn of(pinned: &'a Pinned, table: Option<&SchemaRef>) -> Option<Earlier<'a>> {
        let c = &pinned.catalog;
        let files = c.schema.fields().len() - c.partitions.fields.len();
        let file_schema = Arc::new(c.schema.project(&(0..files).collect::<Vec<_>>()).ok()?);
        let usable = match (table, c.table) {
            _ if c.summary.is_some() => false,
            (None, None) => true,
            (Some(t), Some(_)) => **t == *file_schema,
            _ => false,
        };
        usable.then(|| Earlier {
            objects: c.objects.iter().map(|o| (o.name.as_str(), o)).collect(),
            names: c.objects.iter().map(|o| o.name.as_str()).collect(),
            facts: &c.facts,
            file_schema,
        })
    }

    /// The object as pinned, if `now` is it unchanged (the same size and version).
    pub(crate) fn same(&self, now: &Object) -> Option<&'a Object> {
        let then = self.objects.get(now.name.as_str())?;
        let same = then.size == now.size
            && then.e_tag == now.e_tag
            && then.version == now.version
            && then.modified == now.modified
            && then.deletes == now.deletes;
        same.then_some(*then)
    }
}

/// A listing of which some objects were taken from an [`Earlier`] snapshot: the facts of the
/// whole, from the footers read (`loaded`, at `positions` among all `names`) and the earlier
/// snapshot's, equal to what reading every footer finds.
pub(crate) struct Grown<'a> {
    pub(crate) earlier: &'a Earlier<'a>,
    pub(crate) positions: &'a [usize],
    pub(crate) names: &'a [&'a str],
}

impl Grown<'_> {
    /// [`Facts::of`] of the whole listing. `schema`: its first file's.
    pub(crate) fn facts(
        &self,
        schema: &Schema,
        loaded: &[(&str, &ArrowReaderMetadata)],
        partitions: &Partitions,
    ) -> Facts {
        let new = Facts::mapped(schema, loaded, &Partitions::default(), |_, i| Some(i));
        // Every file against the first, in order; the earlier ones all have its file schema.
        let schema_of = |i: usize| -> &Schema {
            match self.positions.binary_search(&i) {
                Ok(k) => loaded[k].1.schema(),
                Err(_) => &self.earlier.file_schema,
            }
        };
        let differs = (1..self.names.len()).find_map(|i| {
            let diff = schema_difference(schema, schema_of(i))?;
            Some(format!(
                "files '{}' and '{}' have different schemas: {diff}",
                self.names[0], self.names[i]
            ))
        });
        self.merged(
            new,
            partitions,
            partition_clash(schema, partitions).or(differs),
        )
    }

    /// [`Facts::of_table`] of the whole listing.
    pub(crate) fn facts_of_table(
        &self,
        schema: &Schema,
        loaded: &[(&str, &ArrowReaderMetadata)],
        partitions: &Partitions,
    ) -> Facts {
        let new = Facts::of_table(schema, loaded, &Partitions::default());
        let problem = partition_clash(schema, partitions).or(new.schema_problem.clone());
        self.merged(new, partitions, problem)
    }

    /// The facts of the footers read (`new`, numbering files among `loaded`) and the earlier
    /// snapshot's, with the partition columns' nulls.
    fn merged(&self, new: Facts, partitions: &Partitions, schema_problem: Option<String>) -> Facts {
        let index: std::collections::HashMap<&str, usize> = (self.names.iter().enumerate())
            .map(|(i, n)| (*n, i))
            .collect();
        let at = |name: &str| index.get(name).copied();
        let earlier = self.earlier.facts;
        let reused: Vec<usize> = (0..self.names.len())
            .filter(|i| self.positions.binary_search(i).is_err())
            .collect();
        let mut nulls: Vec<NullFact> = Vec::with_capacity(new.nulls.len());
        for (column, fact) in new.nulls.into_iter().enumerate() {
            let new = match fact {
                NullFact::Unknown(rgs) => NullFact::Unknown(
                    (rgs.into_iter())
                        .map(|(f, rg)| (self.positions[f as usize] as u32, rg))
                        .collect(),
                ),
                fact => fact,
            };
            let old = match earlier.nulls.get(column) {
                Some(NullFact::Unknown(rgs)) => NullFact::Unknown(
                    (rgs.iter())
                        .filter_map(|&(f, rg)| {
                            let name = self.earlier.names.get(f as usize)?;
                            Some((at(name)? as u32, rg))
                        })
                        .collect(),
                ),
                // The first file with nulls then is gone: which of the others have some, its
                // facts cannot say, so every row group of theirs is to be read.
                Some(NullFact::In(name)) if at(name).is_none() => NullFact::Unknown(
                    (reused.iter())
                        .flat_map(|&f| {
                            let rgs = self.earlier.objects[self.names[f]].rg_rows.len();
                            (0..rgs as u32).map(move |rg| (f as u32, rg))
                        })
                        .collect(),
                ),
                Some(fact) => fact.clone(),
                None => NullFact::None,
            };
            nulls.push(match (old, new) {
                (NullFact::In(a), NullFact::In(b)) => {
                    NullFact::In(if at(&a) < at(&b) { a } else { b })
                }
                (NullFact::In(a), _) | (_, NullFact::In(a)) => NullFact::In(a),
                (NullFact::Unknown(mut a), NullFact::Unknown(b)) => {
                    a.extend(b);
                    a.sort_unstable();
                    NullFact::Unknown(a)
                }
                (NullFact::Unknown(a), NullFact::None) | (NullFact::None, NullFact::Unknown(a)) => {
                    NullFact::Unknown(a)
                }
                (NullFact::None, NullFact::None) => NullFact::None,
            });
        }
        nulls.extend(
            (0..partitions.fields.len()).map(|k| match partitions.first_null(k) {
                Some(f) => NullFact::In(self.names[f].to_string()),
                None => NullFact::None,
            }),
        );
        // Each column's first file (in order) compressed with a codec that cannot be read.
        let first_file = |why: &str| {
            let name = why
                .split("of file '")
                .nth(1)?
                .split("' is compressed")
                .next()?;
            at(name)
        };
        let mut undecodable = new.undecodable;
        for (column, why) in &earlier.undecodable {
            if first_file(why).is_none() {
                continue;
            }
            let earlier_first = undecodable
                .get(column)
                .is_none_or(|now| first_file(why) < first_file(now));
            if earlier_first {
                undecodable.insert(column.clone(), why.clone());
            }
        }
        let kept =
            reused.len() as u64 * earlier.footer_memory / self.earlier.names.len().max(1) as u64;
        Facts {
            schema_problem,
            undecodable,
            nulls,
            footer_memory: kept + new.footer_memory,
        }
    }
}

/// A partition column that is also a column of the files, as the refusal says it.
fn partition_clash(schema: &Schema, partitions: &Partitions) -> Option<String> {
    (partitions.fields.iter())
        .find(|p| schema.field_with_name(p.name()).is_ok())
        .map(|p| {
            format!(
                "column '{}' is both in the files and a partition directory ({}=…/); rename one",
                p.name(),
                p.name()
            )
        })
}

/// Compares every file's schema with the first one's, by column names and types.
fn check_schemas(files: &[(&str, &ArrowReaderMetadata)]) -> Option<String> {
    let (first, a) = files.first()?;
    let a = a.schema();
    for (name, md) in &files[1..] {
        if let Some(diff) = schema_difference(a, md.schema()) {
            return Some(format!(
                "files '{first}' and '{name}' have different schemas: {diff}"
            ));
        }
    }
    None
}

/// How two schemas differ as far as their tensors are concerned, if they do.
pub(crate) fn schema_difference(a: &Schema, b: &Schema) -> Option<String> {
    let names = |s: &Schema| {
        s.fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
    };
    if names(a) != names(b) {
        return Some(format!(
            "columns [{}] and [{}]",
            names(a).join(", "),
            names(b).join(", ")
        ));
    }
    a.fields()
        .iter()
        .zip(b.fields())
        .find(|(x, y)| as_served(x.data_type()) != as_served(y.data_type()))
        .map(|(x, y)| {
            format!(
                "column '{}' is {} and {}",
                x.name(),
                x.data_type(),
                y.data_type()
            )
        })
}

/// A column's type as far as its tensor is concerned, which files may write differently and
/// still agree, as pyarrow reads them as one dataset: dictionary-encoded or plain, and a list's
/// element named `element` (the Parquet spec), `item` (pyarrow before 13) or otherwise.
fn as_served(dt: &DataType) -> DataType {
    let element = |f: &arrow::datatypes::FieldRef| {
        Arc::new(arrow::datatypes::Field::new(
            "item",
            as_served(f.data_type()),
            true,
        ))
    };
    match dt {
        DataType::Dictionary(_, values) => as_served(values),
        DataType::List(f) => DataType::List(element(f)),
        DataType::LargeList(f) => DataType::LargeList(element(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(element(f), *n),
        dt => dt.clone(),
    }
}

/// Why file `name` (`md`) cannot be read as `table`'s columns, if it cannot: a column it stores
/// as a type that is not the table's, nor one the table's widens without loss.
pub(crate) fn table_schema_problem(
    table: &Schema,
    name: &str,
    md: &ArrowReaderMetadata,
) -> Option<String> {
    let file = md.schema();
    let columns = by_name(table, file);
    (table.fields().iter().zip(columns))
        .filter_map(|(t, c)| Some((t, file.field(c?))))
        .find(|(t, f)| !widens(f.data_type(), t.data_type()))
        .map(|(t, f)| {
            format!(
                "file '{name}' stores column '{}' as {}, which is not the table's {}",
                t.name(),
                f.data_type(),
                t.data_type()
            )
        })
}

/// Whether a file's column of type `from` reads as the table's `to` without loss: the same as
/// served, a fixed-size list where the table has lists, integers and floats widened (Delta's
/// type widening), timestamps in another unit or zone.
fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let (from, to) = (as_served(from), as_served(to));
    if from == to {
        return true;
    }
    let rank = |dt: &DataType| match dt {
        Int8 => Some(1),
        Int16 | UInt8 => Some(2),
        Int32 | UInt16 => Some(3),
        Int64 | UInt32 => Some(4),
        _ => None,
    };
    match (&from, &to) {
        (FixedSizeList(a, _) | List(a) | LargeList(a), List(b) | LargeList(b)) => {
            widens(a.data_type(), b.data_type())
        }
        // Delta's timestamps are microseconds in UTC; writers store them in other units and
        // without the zone (Spark's INT96 reads as nanoseconds), which `DeltaTable` reads as
        // the table's type, as the cast does here.
        (Timestamp(..), Timestamp(..)) => true,
        (Float16 | Float32, Float32 | Float64) => true,
        (Int8 | Int16 | Int32 | UInt8 | UInt16, Float64) => true,
        (a, b) => matches!((rank(a), rank(b)), (Some(x), Some(y)) if x <= y),
    }
}

/// Where each field of `table` is among `file`'s root columns: by field id where the table's
/// field has one (an Iceberg table's, whose columns may be renamed) and the file stores ids,
/// else by name (a file added to a table from elsewhere, written without ids).
pub(crate) fn by_name(table: &Schema, file: &Schema) -> Vec<Option<usize>> {
    let id = |f: &arrow::datatypes::Field| f.metadata().get(FIELD_ID).cloned();
    let file_has_ids = file.fields().iter().any(|g| id(g).is_some());
    (table.fields().iter())
        .map(|f| match id(f).filter(|_| file_has_ids) {
            Some(want) => (file.fields().iter()).position(|g| id(g).as_ref() == Some(&want)),
            // A Delta table's column under column mapping is stored by its physical name.
            None => {
                let stored = f.metadata().get(PHYSICAL_NAME).unwrap_or(f.name());
                file.index_of(stored).ok()
            }
        })
        .collect()
}

/// The key under which Parquet's field ids are in an Arrow field's metadata (the parquet
/// crate puts them there).
pub(crate) const FIELD_ID: &str = "PARQUET:field_id";

/// The key under which a Delta table's column under column mapping keeps the name its files
/// store it by (the Delta protocol's own field metadata key).
pub(crate) const PHYSICAL_NAME: &str = "delta.columnMapping.physicalName";

fn null_fact(
    files: &[(&str, &ArrowReaderMetadata)],
    is_list: bool,
    root: impl Fn(usize) -> Option<usize>,
) -> NullFact {
    let mut unknown = Vec::new();
    for (fi, (name, md)) in files.iter().enumerate() {
        let Some(field) = root(fi) else {
            // A column the file lacks is null in every row (a missing list is lists of 0).
            match is_list || md.metadata().file_metadata().num_rows() == 0 {
                true => continue,
                false => return NullFact::In(name.to_string()),
            }
        };
        let md = md.metadata();
        let descr = md.file_metadata().schema_descr();
        let leaves: Vec<usize> = (0..descr.num_columns())
            .filter(|&l| descr.get_column_root_idx(l) == field)
            .collect();
        for rg in 0..md.num_row_groups() {
            let chunk = md.row_group(rg);
            if chunk.num_rows() == 0 {
                // No rows, no nulls: nothing to read (its chunks may have no pages at all).
                continue;
            }
            let counts: Vec<Option<u64>> = leaves
                .iter()
                .map(|&l| {
                    chunk
                        .column(l)
                        .statistics()
                        .and_then(|s| s.null_count_opt())
                })
                .collect();
            let any = counts.iter().any(|c| c.is_some_and(|n| n > 0));
            if any && !is_list {
                return NullFact::In(name.to_string());
            }
            if any || counts.iter().any(Option::is_none) {
                unknown.push((fi as u32, rg as u32));
            }
        }
    }
    match unknown.is_empty() {
        true => NullFact::None,
        false => NullFact::Unknown(unknown),
    }
}

/// Columns whose chunks a footer shows compressed with a codec tensorfs cannot decode (LZO,
/// which the parquet crate does not implement), each with the first file that shows it: refused
/// at mount rather than failing every read.
fn undecodable_columns(files: &[(&str, &ArrowReaderMetadata)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, md) in files {
        let md = md.metadata();
        let descr = md.file_metadata().schema_descr();
        for rg in md.row_groups() {
            for (leaf, chunk) in rg.columns().iter().enumerate() {
                if chunk.compression() != parquet::basic::Compression::LZO {
                    continue;
                }
                let root = descr.get_column_root(leaf).name().to_string();
                let why = format!(
                    "column '{root}' of file '{name}' is compressed with LZO, which tensorfs cannot decode"
                );
                out.entry(root).or_insert(why);
            }
        }
    }
    out
}

/// Identifies the dataset's content: the Delta table version it is (if so), the summary file
/// it is listed by (if so), every object's
/// key, size and ETag, in order, and the Petastorm fields they are read as (a
/// `_common_metadata` edited or removed changes how the same cells decode).
pub(crate) fn fingerprint(
    summary: Option<&Summary>,
    table: Option<crate::source::lake::Version>,
    objects: &[&Object],
    unischema: Option<&Unischema>,
    selection: Option<&str>,
) -> String {
    let mut h = Sha256::new();
    // The rows a `where=` keeps are the objects' deletes below; EXPR is named too, so that two
    // selections are two datasets even where they keep the same rows today.
    if let Some(expr) = selection {
        h.update(format!("where {expr}\0"));
    }
    // A Delta table's as it always was; the other kinds' named.
    match table {
        Some(v) if v.kind == crate::source::lake::TableKind::Delta => {
            h.update(format!("delta table version {}\0", v.number))
        }
        Some(v) => h.update(format!("{} version {}\0", v.what(), v.number)),
        None => {}
    }
    if let Some(s) = summary {
        h.update(format!("summary\0{}\0", s.name));
        h.update(s.size.to_le_bytes());
        h.update(s.e_tag.as_deref().unwrap_or("").as_bytes());
        h.update([0]);
    }
    for f in objects {
        h.update(f.name.as_bytes());
        h.update([0]);
        h.update(f.size.to_le_bytes());
        match &f.e_tag {
            Some(e_tag) => h.update(e_tag.as_bytes()),
            // Without an ETag, the modification time tells a replaced object.
            None => h.update(format!("modified {}", f.modified)),
        }
        h.update([0]);
        // The same file with other rows deleted is another dataset.
        if let Some(dv) = &f.deletes {
            h.update(format!("deletes {}\0", dv.unique_id()));
        }
    }
    if let Some(u) = unischema {
        h.update(if u.inferred { "cells\0" } else { "unischema\0" });
        for f in &u.fields {
            let (name, numpy, shape) = (&f.name, &f.numpy, f.shape_text());
            let (codec, nullable) = (f.codec.name(), f.nullable);
            h.update(format!("{name}\0{numpy}\0{shape}\0{codec}\0{nullable}\0"));
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// How the objects of `now` differ from those of `then`: added, removed, changed (another
/// size or version), each with its first few keys, in one phrase.
pub(crate) fn differences(then: &[&Object], now: &[&Object]) -> String {
    let key = |o: &Object| (o.size, o.e_tag.clone());
    let before: BTreeMap<&str, _> = then.iter().map(|o| (o.name.as_str(), key(o))).collect();
    let after: BTreeMap<&str, _> = now.iter().map(|o| (o.name.as_str(), key(o))).collect();
    let added: Vec<&str> = (after.keys())
        .filter(|k| !before.contains_key(*k))
        .copied()
        .collect();
    let removed: Vec<&str> = (before.keys())
        .filter(|k| !after.contains_key(*k))
        .copied()
        .collect();
    let changed: Vec<&str> = (after.iter())
        .filter(|(k, v)| before.get(*k).is_some_and(|b| b != *v))
        .map(|(k, _)| *k)
        .collect();
    let some = |what: &str, keys: &[&str]| -> Option<String> {
        const SHOWN: usize = 3;
        if keys.is_empty() {
            return None;
        }
        let mut named: Vec<String> = keys.iter().take(SHOWN).map(|k| format!("'{k}'")).collect();
        if keys.len() > SHOWN {
            named.push(format!("… {} more", keys.len() - SHOWN));
        }
        Some(format!("{} {what} ({})", keys.len(), named.join(", ")))
    };
    let parts: Vec<String> = [
        some("added", &added),
        some("removed", &removed),
        some("changed", &changed),
    ]
    .into_iter()
    .flatten()
    .collect();
    match parts.is_empty() {
        true => {
            "the same objects, read differently (the summary file or Petastorm's metadata)".into()
        }
        false => format!("objects {}", parts.join(", ")),
    }
}

/// The Arrow schema as bytes (its IPC message) and back: how a snapshot carries it.
pub(crate) fn schema_bytes(schema: &Schema) -> Vec<u8> {
    use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
    let mut tracker = DictionaryTracker::new(false);
    IpcDataGenerator::default()
        .schema_to_bytes_with_dictionary_tracker(schema, &mut tracker, &IpcWriteOptions::default())
        .ipc_message
}

pub(crate) fn schema_from_bytes(bytes: &[u8]) -> anyhow::Result<SchemaRef> {
    Ok(Arc::new(
        arrow::ipc::convert::try_schema_from_flatbuffer_bytes(bytes)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, size: u64, e_tag: &str) -> Object {
        Object {
            deletes: None,
            rg_deleted: Vec::new(),
            name: name.into(),
            size,
            e_tag: Some(e_tag.into()),
            version: None,
            modified: String::new(),
            footer_len: 0,
            rg_rows: vec![10],
            memory: None,
        }
    }

    fn refs(v: &[Object]) -> Vec<&Object> {
        v.iter().collect()
    }

    #[test]
    fn differences_name_what_was_added_removed_and_changed() {
        let then = [
            object("a", 1, "x"),
            object("b", 2, "y"),
            object("c", 3, "z"),
        ];
        let now = [
            object("a", 1, "x"),
            object("b", 2, "y2"),
            object("d", 4, "w"),
            object("e", 4, "w"),
        ];
        let said = differences(&refs(&then), &refs(&now));
        assert_eq!(
            said,
            "objects 2 added ('d', 'e'), 1 removed ('c'), 1 changed ('b')"
        );
        let many: Vec<Object> = (0..5).map(|i| object(&format!("n{i}"), 1, "e")).collect();
        let said = differences(&[], &refs(&many));
        assert_eq!(said, "objects 5 added ('n0', 'n1', 'n2', … 2 more)");
    }

    #[test]
    fn the_fingerprint_changes_with_any_object_and_the_summary() {
        let a = [object("a", 1, "x"), object("b", 2, "y")];
        let base = fingerprint(None, None, &refs(&a), None, None);
        assert_eq!(base, fingerprint(None, None, &refs(&a), None, None));
        let replaced = [object("a", 1, "x"), object("b", 2, "y2")];
        assert_ne!(base, fingerprint(None, None, &refs(&replaced), None, None));
        assert_ne!(base, fingerprint(None, None, &refs(&a[..1]), None, None));
        let summary = Summary {
            name: "_metadata".into(),
            size: 10,
            e_tag: None,
        };
        assert_ne!(
            base,
            fingerprint(Some(&summary), None, &refs(&a), None, None)
        );
        let v3 = crate::source::lake::Version {
            kind: crate::source::lake::TableKind::Delta,
            number: 3,
        };
        assert_ne!(base, fingerprint(None, Some(v3), &refs(&a), None, None));
    }

    #[test]
    fn schemas_round_trip_through_their_bytes() {
        use arrow::datatypes::{Field, TimeUnit};
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "emb",
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 8),
                true,
            ),
            Field::new(
                "tokens",
                DataType::List(Arc::new(Field::new("element", DataType::Int32, true))),
                true,
            ),
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new_dictionary("d", DataType::Int32, DataType::Int64, true),
        ]);
        let back = schema_from_bytes(&schema_bytes(&schema)).unwrap();
        assert_eq!(back.as_ref(), &schema);
    }
}
