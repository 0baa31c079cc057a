//! Apache Iceberg tables (PRODUCT.md §8), read at a snapshot as pyiceberg's
//! `table.scan(snapshot_id=…).to_arrow()` reads them: the table's metadata file
//! (`metadata/*.metadata.json`: the newest, the one `version-hint.text` names, or the one the
//! source names), the snapshot's manifest list and manifests (Avro), the data files they hold
//! live, and the position and equality deletes that apply to them.
//!
//! Columns are matched by field id (the table's schema carries each column's id; files store
//! theirs in the Parquet schema), so renamed and reordered columns read right and a column
//! added later is null in older files. Identity partitions are columns of the data files, as
//! Iceberg writers store them. Position deletes become each data file's deleted rows, kept as
//! an inline deletion vector ([`crate::source::deletes`]), so snapshots pin them and reads
//! drop them as a Delta table's. Equality deletes become deleted rows the same way: the
//! columns they name are read from the data files they apply to when the table is read (at
//! the mount, or once by `tensorfs snapshot`, whose snapshot then pins the rows). The deletion
//! vectors of format 3 (Puffin files) are refused in one line naming them.

use crate::source::ObjectReader;
use crate::source::lake::{ColumnBounds, FileBounds, Table, TableKind, Version};
use crate::source::partition::Partitions;
use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use roaring::RoaringTreemap;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A data or delete file a manifest holds live.
struct Entry {
    content: i64,
    path: String,
    format: String,
    sequence: i64,
    /// Its size in bytes, as the manifest gives it (what a ranged read of its footer needs).
    size: u64,
    /// An equality delete file's columns, by field id.
    equality_ids: Vec<i64>,
    /// The partition spec and the partition's values it was written under: an equality delete
    /// applies to the data files of its partition (of every partition where its spec has none).
    spec_id: i64,
    partition: Value,
    /// The manifest's record of the file (its record count, column bounds and null counts),
    /// kept only for a `where=`.
    file: Value,
}

/// Reads snapshot `version` (the current one when `None`) of the Iceberg table at `root`;
/// `names` are the objects under it (relative to it), `metadata` the metadata file the source
/// named, if it named one.
pub(crate) async fn open(at: &crate::source::lake::Opening<'_>) -> Result<Table> {
    let names: Vec<&str> = at.listed.iter().map(|(n, _)| n.as_str()).collect();
    let (store, root, metadata, version, filter) = (
        at.store.clone(),
        at.root,
        at.metadata,
        at.version,
        at.filter,
    );
    let stats = at.stats;
    let names = &names[..];
    let metadata = match metadata {
        Some(m) => m.to_string(),
        None => metadata_file(&store, root, names).await?,
    };
    let json: Value = serde_json::from_slice(&get(&store, root, &metadata).await?)
        .with_context(|| format!("its metadata '{metadata}' is not JSON"))?;
    let location = (json.get("location").and_then(Value::as_str))
        .context("its metadata names no location")?
        .trim_end_matches('/')
        .to_string();
    let relative = |uri: &str| -> Result<String> {
        let rest = (uri.strip_prefix(&location))
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| anyhow!("'{uri}' is outside the table's location '{location}'"))?;
        Ok(percent_encoding::percent_decode_str(rest)
            .decode_utf8_lossy()
            .into_owned())
    };
    let snapshots = (json.get("snapshots").and_then(Value::as_array))
        .cloned()
        .unwrap_or_default();
    let current = json
        .get("current-snapshot-id")
        .and_then(Value::as_i64)
        .filter(|&id| id >= 0);
    let wanted = match version {
        None => current,
        Some(crate::options::AsOf::Number(v)) => Some(v as i64),
        Some(at @ crate::options::AsOf::Time(t)) => Some(snapshot_at(&json, at, t)?),
    };
    let Some(id) = wanted else {
        bail!("it has no snapshot: it holds no data");
    };
    let snapshot = (snapshots.iter())
        .find(|s| s.get("snapshot-id").and_then(Value::as_i64) == Some(id))
        .ok_or_else(|| {
            let known: Vec<String> = (snapshots.iter().rev())
                .filter_map(|s| s.get("snapshot-id").and_then(Value::as_i64))
                .map(|s| s.to_string())
                .collect();
            let shown = known.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
            let more = match known.len() {
                n if n > 3 => format!(" and {} more", n - 3),
                _ => String::new(),
            };
            anyhow!(
                "it has no snapshot {id} (its newest: {shown}{more}): version= names a snapshot id"
            )
        })?;
    // The current snapshot reads as the table is now (its current schema, renames since
    // included), an older one as it was: as pyiceberg's scan() and scan(snapshot_id) do.
    let current_schema = json.get("current-schema-id").and_then(Value::as_i64);
    let schema_id = match version {
        None => current_schema,
        Some(_) => (snapshot.get("schema-id").and_then(Value::as_i64)).or(current_schema),
    };
    let schema = schema_of(&json, schema_id)?;
    let data_schema = Arc::new(Schema::new(struct_fields(schema)?));
    let list = (snapshot.get("manifest-list").and_then(Value::as_str))
        .context("its snapshot names no manifest list (format 1 manifests inline are not read)")?;
    let manifests = avro_records(&get(&store, root, &relative(list)?).await?)
        .with_context(|| format!("its manifest list '{list}'"))?;
    let mut entries: Vec<Entry> = Vec::new();
    let mut ruled_out = 0;
    for m in &manifests {
        let path = str_of(m, "manifest_path")?;
        // A manifest of data files whose partitions' summaries rule a where= out is not read.
        if let Some(filter) = filter
            && let Some(files) = manifest_ruled_out(m, &json, &data_schema, filter)
        {
            ruled_out += files;
            continue;
        }
        // A manifest's own sequence number is what its added entries inherit.
        let inherited = m
            .get("sequence_number")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let spec_id = m
            .get("partition_spec_id")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let records = avro_records(&get(&store, root, &relative(path)?).await?)
            .with_context(|| format!("its manifest '{path}'"))?;
        for r in records {
            let status = r.get("status").and_then(Value::as_i64).unwrap_or(1);
            if status == 2 {
                continue; // deleted
            }
            let file = r
                .get("data_file")
                .context("a manifest entry without data_file")?;
            let sequence = match r.get("sequence_number").and_then(Value::as_i64) {
                Some(s) => s,
                None => inherited,
            };
            let equality_ids = (file.get("equality_ids").and_then(Value::as_array))
                .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            entries.push(Entry {
                content: file.get("content").and_then(Value::as_i64).unwrap_or(0),
                path: relative(str_of(file, "file_path")?)?,
                format: str_of(file, "file_format")?.to_ascii_lowercase(),
                sequence,
                size: file
                    .get("file_size_in_bytes")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
                    .max(0) as u64,
                equality_ids,
                spec_id,
                partition: file.get("partition").cloned().unwrap_or(Value::Null),
                file: match filter {
                    Some(_) => file.clone(),
                    None => Value::Null,
                },
            });
        }
    }
    if let Some(e) = entries
        .iter()
        .find(|e| e.content == 2 && (e.format != "parquet" || e.equality_ids.is_empty()))
    {
        bail!(
            "snapshot {id} has an equality delete file '{}' {}, which tensorfs does not read",
            e.path,
            match e.format.as_str() {
                "parquet" => "naming no columns".to_string(),
                other => format!("in {other}"),
            }
        );
    }
    if let Some(e) = entries
        .iter()
        .find(|e| e.content == 1 && e.format != "parquet")
    {
        bail!(
            "snapshot {id} has deletes in a {} file ('{}': deletion vectors of format 3), which tensorfs does not apply yet",
            e.format,
            e.path
        );
    }
    if let Some(e) = entries
        .iter()
        .find(|e| e.content == 0 && e.format != "parquet")
    {
        bail!(
            "snapshot {id} has a {} data file ('{}'), and tensorfs reads Parquet",
            e.format,
            e.path
        );
    }
    // Each data file's deleted positions: from the position delete files at or after its data
    // sequence number.
    let mut positions: HashMap<String, RoaringTreemap> = HashMap::new();
    let data: Vec<&Entry> = entries.iter().filter(|e| e.content == 0).collect();
    let sequence_of: HashMap<&str, i64> =
        data.iter().map(|e| (e.path.as_str(), e.sequence)).collect();
    for d in entries.iter().filter(|e| e.content == 1) {
        let bytes = get(&store, root, &d.path).await?;
        for (path, pos) in
            position_deletes(bytes).with_context(|| format!("its delete file '{}'", d.path))?
        {
            let path = relative(&path)?;
            if sequence_of
                .get(path.as_str())
                .is_some_and(|&s| s <= d.sequence)
            {
                positions.entry(path).or_default().insert(pos);
            }
        }
    }
    // Equality deletes: each applies to the data files of its partition (every data file where
    // it was written unpartitioned) whose data sequence number is lower than its own; a row
    // whose values of its columns equal a deleted row's (null equal to null) is deleted. Each
    // data file they apply to is read once, its key columns only, by ranged reads.
    let mut equality: Vec<(&Entry, EqualityKeys)> = Vec::new();
    for d in entries.iter().filter(|e| e.content == 2) {
        let keys = EqualityKeys::of(
            ranged(&store, root, d, stats)?,
            &d.equality_ids,
            &data_schema,
        )
        .await
        .with_context(|| format!("its equality delete file '{}'", d.path))?;
        if !keys.deleted.is_empty() {
            equality.push((d, keys));
        }
    }
    for e in &data {
        let applying: Vec<&EqualityKeys> = (equality.iter())
            .filter(|(d, _)| {
                let everywhere = d.partition.as_object().is_some_and(|p| p.is_empty());
                e.sequence < d.sequence
                    && (everywhere || (e.spec_id == d.spec_id && e.partition == d.partition))
            })
            .map(|(_, keys)| keys)
            .collect();
        if applying.is_empty() {
            continue;
        }
        let mut ids: Vec<i64> = applying.iter().flat_map(|k| k.ids.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        let rows = deleted_rows(
            ranged(&store, root, e, stats)?,
            &ids,
            &data_schema,
            &applying,
        )
        .await
        .with_context(|| format!("data file '{}', for its equality deletes", e.path))?;
        positions.entry(e.path.clone()).or_default().extend(rows);
    }
    let mut files: Vec<String> = data.iter().map(|e| e.path.clone()).collect();
    files.sort();
    files.dedup();
    // Bounds are for a where= alone: a mount without one makes none.
    let bounds = match filter {
        None => Vec::new(),
        Some(_) => {
            let bounds_of: HashMap<&str, FileBounds> = (data.iter())
                .map(|e| (e.path.as_str(), file_bounds(&e.file, &data_schema)))
                .collect();
            (files.iter())
                .map(|f| bounds_of.get(f.as_str()).cloned())
                .collect()
        }
    };
    let deletes = (files.iter())
        .map(|f| {
            positions
                .get(f)
                .map(crate::source::deletes::inline_vector)
                .transpose()
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        version: Version {
            kind: TableKind::Iceberg,
            number: id as u64,
        },
        data_schema,
        partitions: Partitions::default(),
        files,
        deletes,
        bounds,
        ruled_out,
        memory: Default::default(),
    })
}

/// The snapshot current at time `t` (ms since the Unix epoch), as the metadata's
/// `snapshot-log` says (pyiceberg's `snapshot_as_of_timestamp`): its last entry at or before `t`.
fn snapshot_at(json: &Value, at: crate::options::AsOf, t: i64) -> Result<i64> {
    let log = (json.get("snapshot-log").and_then(Value::as_array))
        .cloned()
        .unwrap_or_default();
    let entries: Vec<(i64, i64)> = (log.iter())
        .filter_map(|e| {
            let ms = e.get("timestamp-ms")?.as_i64()?;
            Some((ms, e.get("snapshot-id")?.as_i64()?))
        })
        .collect();
    if let Some(&(_, id)) = entries.iter().rev().find(|&&(ms, _)| ms <= t) {
        return Ok(id);
    }
    match entries.first() {
        Some(&(ms, id)) => bail!(
            "it has no snapshot at or before {at}: its first, {id}, was made at {}",
            crate::options::AsOf::Time(ms)
        ),
        None => bail!("it has no snapshot at or before {at}: its snapshot log is empty"),
    }
}

/// The metadata file of a table whose root holds `names`: the one `version-hint.text` names,
/// else the newest (`NNNNN-UUID.metadata.json` or `vN.metadata.json`, by its number).
async fn metadata_file(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    names: &[&str],
) -> Result<String> {
    let number = |name: &str| -> Option<u64> {
        let file = name
            .strip_prefix("metadata/")?
            .strip_suffix(".metadata.json")?;
        let digits = file.trim_start_matches('v');
        let digits = digits.split('-').next()?;
        digits.parse().ok()
    };
    if names.contains(&"metadata/version-hint.text") {
        let hint = get(store, root, "metadata/version-hint.text").await?;
        let hint = String::from_utf8_lossy(&hint).trim().to_string();
        for candidate in [
            format!("metadata/v{hint}.metadata.json"),
            format!("metadata/{hint}"),
        ] {
            if names.contains(&candidate.as_str()) {
                return Ok(candidate);
            }
        }
        // A number beside NNNNN-UUID names: the file of that number.
        if let Ok(n) = hint.parse::<u64>()
            && let Some(name) = names.iter().find(|name| number(name) == Some(n))
        {
            return Ok(name.to_string());
        }
        bail!("its metadata/version-hint.text names '{hint}', which its metadata/ does not hold");
    }
    (names.iter())
        .filter(|n| n.starts_with("metadata/") && n.ends_with(".metadata.json"))
        .max_by_key(|n| (number(n), n.to_string()))
        .map(|n| n.to_string())
        .ok_or_else(|| anyhow!("its metadata/ holds no *.metadata.json"))
}

/// An object of the table, by its path relative to the root.
async fn get(store: &Arc<dyn ObjectStore>, root: &Path, name: &str) -> Result<bytes::Bytes> {
    let path = crate::source::child(root, name)?;
    Ok(store
        .get(&path)
        .await
        .with_context(|| format!("'{name}' cannot be read"))?
        .bytes()
        .await?)
}

/// The records of an Avro object container file, as JSON.
fn avro_records(bytes: &[u8]) -> Result<Vec<Value>> {
    let reader = apache_avro::Reader::new(bytes).context("it is not an Avro file")?;
    reader
        .map(|v| {
            let v = v.context("its Avro cannot be read")?;
            Value::try_from(v).context("its Avro cannot be read")
        })
        .collect()
}

fn str_of<'a>(v: &'a Value, name: &str) -> Result<&'a str> {
    (v.get(name).and_then(Value::as_str)).ok_or_else(|| anyhow!("a record without '{name}'"))
}

/// The (file path, position) rows of a position delete file.
fn position_deletes(bytes: bytes::Bytes) -> Result<Vec<(String, u64)>> {
    use arrow::array::{Array, AsArray};
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let mut out = Vec::new();
    for batch in builder.build()? {
        let batch = batch?;
        let paths = (batch.column_by_name("file_path")).context("no file_path column")?;
        let paths = arrow::compute::cast(paths, &DataType::Utf8)?;
        let paths = paths.as_string::<i32>();
        let pos = (batch.column_by_name("pos")).context("no pos column")?;
        let pos = arrow::compute::cast(pos, &DataType::Int64)?;
        let pos = pos.as_primitive::<arrow::datatypes::Int64Type>();
        for i in 0..batch.num_rows() {
            if paths.is_valid(i) && pos.is_valid(i) {
                out.push((paths.value(i).to_string(), pos.value(i) as u64));
            }
        }
    }
    Ok(out)
}

/// The rows of an equality delete file, as the keys its columns make.
struct EqualityKeys {
    /// Its columns, by field id.
    ids: Vec<i64>,
    converter: arrow::row::RowConverter,
    deleted: HashSet<Vec<u8>>,
}

impl EqualityKeys {
    async fn of(file: ObjectReader, ids: &[i64], schema: &Schema) -> Result<EqualityKeys> {
        let types = (ids.iter())
            .map(|&id| Ok(table_field(schema, id)?.data_type().clone()))
            .collect::<Result<Vec<_>>>()?;
        let fields = types.into_iter().map(arrow::row::SortField::new);
        let converter = arrow::row::RowConverter::new(fields.collect())?;
        let mut deleted = HashSet::new();
        for columns in key_columns(file, ids, schema).await? {
            let rows = converter.convert_columns(&columns)?;
            deleted.extend(rows.iter().map(|r| r.as_ref().to_vec()));
        }
        Ok(EqualityKeys {
            ids: ids.to_vec(),
            converter,
            deleted,
        })
    }
}

/// The rows of a data file that equality deletes `applying` delete: its columns `ids` (every
/// column any of them names) read batch by batch, each delete's keys made of its own.
async fn deleted_rows(
    file: ObjectReader,
    ids: &[i64],
    schema: &Schema,
    applying: &[&EqualityKeys],
) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut first = 0u64;
    for columns in key_columns(file, ids, schema).await? {
        let len = columns.first().map_or(0, |c| c.len());
        for keys in applying {
            let own: Vec<arrow::array::ArrayRef> = (keys.ids.iter())
                .map(|id| columns[ids.binary_search(id).expect("a column read")].clone())
                .collect();
            let rows = keys.converter.convert_columns(&own)?;
            let hits = (rows.iter().enumerate()).filter(|(_, r)| keys.deleted.contains(r.as_ref()));
            out.extend(hits.map(|(i, _)| first + i as u64));
        }
        first += len as u64;
    }
    Ok(out)
}

/// The table's field of id `id`.
fn table_field(schema: &Schema, id: i64) -> Result<&Field> {
    (schema.fields().iter().map(|f| f.as_ref()))
        .find(|f| field_id(f) == Some(id))
        .ok_or_else(|| {
            anyhow!("its column of field id {id} is not a top-level column of the table")
        })
}

/// Columns `ids` of Parquet file `file`, batch by batch in file order, each in the table's type:
/// found by field id (by the table's name in a file written without field ids), null where the
/// file has no such column (one added to the table after the file was written).
async fn key_columns(
    file: ObjectReader,
    ids: &[i64],
    schema: &Schema,
) -> Result<Vec<Vec<arrow::array::ArrayRef>>> {
    use futures::TryStreamExt;
    use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
    let wanted = (ids.iter())
        .map(|&id| table_field(schema, id))
        .collect::<Result<Vec<_>>>()?;
    let builder = ParquetRecordBatchStreamBuilder::new(file).await?;
    let found = builder.schema().clone();
    let has_ids = found.fields().iter().any(|f| field_id(f).is_some());
    let at: Vec<Option<usize>> = (ids.iter().zip(&wanted))
        .map(|(&id, f)| match has_ids {
            true => found.fields().iter().position(|g| field_id(g) == Some(id)),
            false => found.index_of(f.name()).ok(),
        })
        .collect();
    let mut roots: Vec<usize> = at.iter().flatten().copied().collect();
    roots.sort_unstable();
    roots.dedup();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots.clone());
    let batches: Vec<arrow::array::RecordBatch> =
        builder.with_projection(mask).build()?.try_collect().await?;
    let mut out = Vec::new();
    for batch in batches {
        let mut columns = Vec::new();
        for (at, f) in at.iter().zip(&wanted) {
            let column = match at {
                None => arrow::array::new_null_array(f.data_type(), batch.num_rows()),
                Some(root) => {
                    let k = roots.binary_search(root).expect("a projected root");
                    arrow::compute::cast(batch.column(k), f.data_type())?
                }
            };
            columns.push(column);
        }
        out.push(columns);
    }
    Ok(out)
}

/// Reads of one object of the table, for the columns equality deletes need.
fn ranged(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    e: &Entry,
    stats: &Arc<crate::stats::Stats>,
) -> Result<ObjectReader> {
    if e.size == 0 {
        bail!("the manifest gives '{}' no size", e.path);
    }
    let location = crate::source::child(root, &e.path)?;
    Ok(ObjectReader::unpinned(
        store.clone(),
        location,
        e.size,
        stats.clone(),
    ))
}

/// Where a manifest of data files (content 0) holds only partitions `filter` rules out, by the
/// manifest list's summaries of its spec's identity-partitioned columns (`partitions`: each
/// field's `contains_null`, `lower_bound`, `upper_bound`): the data files it holds, as the list
/// counts them. `None` where it must be read. A manifest of deletes is always read: its deletes
/// may apply to files kept.
fn manifest_ruled_out(
    m: &Value,
    json: &Value,
    schema: &Schema,
    filter: &crate::source::filter::Filter,
) -> Option<u64> {
    use crate::source::filter::{Decision, Known, Nulls};
    if m.get("content").and_then(Value::as_i64).unwrap_or(0) != 0 {
        return None;
    }
    let summaries = m.get("partitions")?.as_array()?;
    let spec_id = m
        .get("partition_spec_id")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let spec = (json.get("partition-specs").and_then(Value::as_array))?
        .iter()
        .find(|s| s.get("spec-id").and_then(Value::as_i64) == Some(spec_id))?;
    let fields = spec.get("fields")?.as_array()?;
    let checked = filter.check(schema, true).ok()?;
    let known = |column: usize| -> anyhow::Result<Known> {
        let f = schema.field(column);
        let Some(id) = field_id(f) else {
            return Ok(Known::Unknown);
        };
        let at = fields.iter().position(|p| {
            p.get("source-id").and_then(Value::as_i64) == Some(id)
                && p.get("transform").and_then(Value::as_str) == Some("identity")
        });
        let Some(summary) = at.and_then(|i| summaries.get(i)) else {
            return Ok(Known::Unknown);
        };
        let bound = |k: &str| -> arrow::array::ArrayRef {
            let bytes: Option<Vec<u8>> = (summary.get(k).and_then(Value::as_array))
                .and_then(|a| a.iter().map(|b| b.as_u64().map(|b| b as u8)).collect());
            (bytes.and_then(|b| single_value(&b, f.data_type())))
                .unwrap_or_else(|| arrow::array::new_null_array(f.data_type(), 1))
        };
        let nulls = match summary.get("contains_null").and_then(Value::as_bool) {
            Some(false) => Nulls::None,
            _ => Nulls::Some,
        };
        Ok(Known::Bounds {
            min: bound("lower_bound"),
            max: bound("upper_bound"),
            nulls: vec![nulls],
        })
    };
    let decided = checked.decide(1, &known).ok()?;
    if decided.first() != Some(&Decision::None) {
        return None;
    }
    let count = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(count("added_files_count") + count("existing_files_count"))
}

/// What a manifest says of a data file's columns (`record_count`, `lower_bounds`,
/// `upper_bounds`, `null_value_counts`: maps by field id), as bounds of the table's columns.
/// Bounds are in Iceberg's single-value serialisation; writers truncate strings and binary to
/// a prefix for the lower bound and to a prefix raised at its last character for the upper, so
/// both still bound.
fn file_bounds(file: &Value, schema: &Schema) -> FileBounds {
    let by_id = |map: &str| -> HashMap<i64, &Value> {
        let entries = match file.get(map) {
            Some(Value::Array(a)) => a.as_slice(),
            _ => &[],
        };
        (entries.iter())
            .filter_map(|kv| Some((kv.get("key")?.as_i64()?, kv.get("value")?)))
            .collect()
    };
    let (lower, upper, nulls) = (
        by_id("lower_bounds"),
        by_id("upper_bounds"),
        by_id("null_value_counts"),
    );
    let mut columns = HashMap::new();
    for f in schema.fields() {
        let Some(id) = field_id(f) else { continue };
        let bytes = |v: Option<&&Value>| -> Option<Vec<u8>> {
            let a = v?.as_array()?;
            a.iter().map(|b| b.as_u64().map(|b| b as u8)).collect()
        };
        let bounds = ColumnBounds {
            min: bytes(lower.get(&id)).and_then(|b| single_value(&b, f.data_type())),
            max: bytes(upper.get(&id)).and_then(|b| single_value(&b, f.data_type())),
            nulls: nulls.get(&id).and_then(|v| v.as_u64()),
        };
        if bounds.min.is_some() || bounds.max.is_some() || bounds.nulls.is_some() {
            columns.insert(f.name().clone(), bounds);
        }
    }
    FileBounds {
        rows: file.get("record_count").and_then(Value::as_u64),
        columns,
    }
}

/// A bound in Iceberg's single-value binary serialisation as a one-value array of type `t`
/// (a column promoted since, int to long or float to double, read from the narrower form).
fn single_value(b: &[u8], t: &DataType) -> Option<arrow::array::ArrayRef> {
    use arrow::array::{
        BooleanArray, Date32Array, Float32Array, Float64Array, Int32Array, Int64Array, StringArray,
        TimestampMicrosecondArray, TimestampNanosecondArray,
    };
    let le4 = || Some(<[u8; 4]>::try_from(b).ok());
    let le8 = || Some(<[u8; 8]>::try_from(b).ok());
    let long = || match b.len() {
        4 => Some(i32::from_le_bytes(le4()??) as i64),
        8 => Some(i64::from_le_bytes(le8()??)),
        _ => None,
    };
    Some(match t {
        DataType::Boolean if b.len() == 1 => Arc::new(BooleanArray::from(vec![b[0] != 0])),
        DataType::Int32 => Arc::new(Int32Array::from(vec![i32::from_le_bytes(le4()??)])),
        DataType::Int64 => Arc::new(Int64Array::from(vec![long()?])),
        DataType::Date32 => Arc::new(Date32Array::from(vec![i32::from_le_bytes(le4()??)])),
        DataType::Float32 => Arc::new(Float32Array::from(vec![f32::from_le_bytes(le4()??)])),
        DataType::Float64 => Arc::new(Float64Array::from(vec![match b.len() {
            4 => f32::from_le_bytes(le4()??) as f64,
            _ => f64::from_le_bytes(le8()??),
        }])),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            Arc::new(TimestampMicrosecondArray::from(vec![long()?]).with_timezone_opt(tz.clone()))
        }
        DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
            Arc::new(TimestampNanosecondArray::from(vec![long()?]).with_timezone_opt(tz.clone()))
        }
        DataType::Utf8 => Arc::new(StringArray::from(vec![std::str::from_utf8(b).ok()?])),
        _ => return None,
    })
}

/// A field's Iceberg field id, as Parquet stores it.
fn field_id(f: &Field) -> Option<i64> {
    (f.metadata().get(crate::source::catalog::FIELD_ID)).and_then(|v| v.parse().ok())
}

/// The table's schema with id `id` (its `schemas`; or the single `schema` of format 1).
fn schema_of(json: &Value, id: Option<i64>) -> Result<&Value> {
    if let Some(schemas) = json.get("schemas").and_then(Value::as_array) {
        let found = (schemas.iter())
            .find(|s| s.get("schema-id").and_then(Value::as_i64) == id)
            .or_else(|| schemas.last());
        if let Some(s) = found {
            return Ok(s);
        }
    }
    json.get("schema").context("its metadata holds no schema")
}

/// Arrow fields of an Iceberg struct, each with its field id in the metadata Parquet's are.
fn struct_fields(s: &Value) -> Result<Fields> {
    let fields = (s.get("fields").and_then(Value::as_array)).context("a struct without fields")?;
    fields
        .iter()
        .map(|f| {
            let name = str_of(f, "name")?;
            let id = f
                .get("id")
                .and_then(Value::as_i64)
                .context("a field without an id")?;
            let required = f.get("required").and_then(Value::as_bool).unwrap_or(false);
            let t = f.get("type").context("a field without a type")?;
            let dt = arrow_type(t).with_context(|| format!("column '{name}'"))?;
            Ok(field(name, dt, !required, id))
        })
        .collect()
}

fn field(name: &str, dt: DataType, nullable: bool, id: i64) -> Field {
    let metadata = HashMap::from([(crate::source::catalog::FIELD_ID.to_string(), id.to_string())]);
    Field::new(name, dt, nullable).with_metadata(metadata)
}

/// The Arrow type of an Iceberg type, as pyiceberg reads it.
fn arrow_type(t: &Value) -> Result<DataType> {
    if let Some(name) = t.as_str() {
        return Ok(match name {
            "boolean" => DataType::Boolean,
            "int" => DataType::Int32,
            "long" => DataType::Int64,
            "float" => DataType::Float32,
            "double" => DataType::Float64,
            "date" => DataType::Date32,
            "time" => DataType::Time64(TimeUnit::Microsecond),
            "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, None),
            "timestamptz" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            "timestamp_ns" => DataType::Timestamp(TimeUnit::Nanosecond, None),
            "timestamptz_ns" => DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            "string" => DataType::Utf8,
            "uuid" => DataType::FixedSizeBinary(16),
            "binary" => DataType::Binary,
            other => {
                if let Some(n) = other
                    .strip_prefix("fixed[")
                    .and_then(|r| r.strip_suffix(']'))
                {
                    DataType::FixedSizeBinary(n.trim().parse()?)
                } else if let Some(ps) = other
                    .strip_prefix("decimal(")
                    .and_then(|r| r.strip_suffix(')'))
                {
                    let (p, s) = ps.split_once(',').context("a decimal without a scale")?;
                    DataType::Decimal128(p.trim().parse()?, s.trim().parse()?)
                } else {
                    bail!("type '{other}' is not an Iceberg type tensorfs knows");
                }
            }
        });
    }
    match t.get("type").and_then(Value::as_str) {
        Some("struct") => Ok(DataType::Struct(struct_fields(t)?)),
        Some("list") => {
            let id = t.get("element-id").and_then(Value::as_i64).unwrap_or(0);
            let required = t
                .get("element-required")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let element = arrow_type(t.get("element").context("a list without an element")?)?;
            Ok(DataType::List(Arc::new(field(
                "element", element, !required, id,
            ))))
        }
        Some("map") => {
            let key = arrow_type(t.get("key").context("a map without a key")?)?;
            let value = arrow_type(t.get("value").context("a map without a value")?)?;
            let entries = Fields::from(vec![
                Field::new("key", key, false),
                Field::new("value", value, true),
            ]);
            Ok(DataType::Map(
                Arc::new(Field::new("key_value", DataType::Struct(entries), false)),
                false,
            ))
        }
        _ => bail!("a type tensorfs does not know: {t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_map_as_pyiceberg_reads_them() {
        let schema = serde_json::json!({"type": "struct", "fields": [
            {"id": 1, "name": "id", "required": true, "type": "long"},
            {"id": 2, "name": "x", "required": false, "type": "float"},
            {"id": 3, "name": "v", "required": false, "type": {"type": "list", "element-id": 4, "element": "int", "element-required": true}},
            {"id": 5, "name": "d", "required": false, "type": "decimal(10, 2)"},
        ]});
        let fields = struct_fields(&schema).unwrap();
        assert_eq!(fields[0].data_type(), &DataType::Int64);
        assert!(!fields[0].is_nullable());
        assert_eq!(fields[1].metadata()["PARQUET:field_id"], "2");
        assert!(
            matches!(fields[2].data_type(), DataType::List(e) if e.data_type() == &DataType::Int32)
        );
        assert_eq!(fields[3].data_type(), &DataType::Decimal128(10, 2));
    }

    #[test]
    fn deleted_positions_round_trip_through_an_inline_vector() {
        let mut rows = RoaringTreemap::new();
        rows.extend([0u64, 7, 1 << 33]);
        let dv = crate::source::deletes::inline_vector(&rows).unwrap();
        let crate::source::deletes::Location::Inline(bytes) = dv.location().unwrap() else {
            panic!("inline")
        };
        assert_eq!(crate::source::deletes::bitmap(&bytes).unwrap(), rows);
        assert_eq!(dv.cardinality, 3);
    }
}
