//! Delta Lake tables (PRODUCT.md §8): the data files and partition values of one version,
//! read from the table's log by `delta_kernel` (the Delta project's own reader, with its
//! default engine over the source's object store): checkpoints (classic and v2), log
//! compaction files and commits are its business, and a reader feature it does not support is
//! refused by it, naming the feature.
//!
//! What tensorfs does not read yet is refused in one line: deletion vectors (the version and
//! that it has them) and column mapping. The table's schema decides the types, not each
//! file's: `Source` casts what a file stores to the table's type as it decodes.

use crate::source::partition::{Partitions, Value};
use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef, TimeUnit};
use delta_kernel::engine::arrow_conversion::TryFromKernel;
use delta_kernel::snapshot::Snapshot;
use object_store::ObjectStore;
use std::collections::HashMap;
use std::sync::Arc;
use url::Url;

/// The directory of a Delta table's log, at its root.
pub const LOG: &str = "_delta_log";

/// Whether the names under a source's root (relative to it) make it a Delta table: its
/// `_delta_log/` holds a commit (`NNNNNNNNNNNNNNNNNNNN.json`) or `_last_checkpoint`. A
/// `_delta_log/` with neither (a leftover, a stray checkpoint) is no table any reader can open,
/// and the directory is read as the Parquet files it holds, as pyarrow reads it.
pub fn is_table<'a>(names: impl IntoIterator<Item = &'a str>) -> bool {
    names.into_iter().any(|name| {
        let Some(entry) = name.strip_prefix(LOG).and_then(|n| n.strip_prefix('/')) else {
            return false;
        };
        entry == "_last_checkpoint"
            || entry
                .strip_suffix(".json")
                .is_some_and(|v| v.len() == 20 && v.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// One version of a Delta table, as a mount reads it.
pub struct Table {
    pub version: u64,
    /// The table's columns stored in its files (the partition columns left out), in the
    /// table's order, as Arrow types.
    pub data_schema: SchemaRef,
    /// The partition columns, typed as the table's schema says, and each file's values.
    pub partitions: Partitions,
    /// The data files, in lexicographic path order (their paths relative to the table's root,
    /// percent-decoded).
    pub files: Vec<String>,
}

/// A scan file of the kernel, as far as a mount needs it.
struct Found {
    path: String,
    partition_values: HashMap<String, String>,
    deletion_vector: bool,
}

/// Reads version `version` (the latest when `None`) of the Delta table at `root` (a URL
/// ending in `/`) through `store`. Blocking: the kernel runs its own I/O.
pub fn read(store: Arc<dyn ObjectStore>, root: &Url, version: Option<u64>) -> Result<Table> {
    let engine = delta_kernel_default_engine::DefaultEngine::builder(store).build();
    let mut builder = Snapshot::builder_for(root.as_str());
    if let Some(v) = version {
        builder = builder.at_version(v);
    }
    let snapshot = builder.build(&engine).map_err(|e| match version {
        Some(v) => anyhow!("the Delta table has no version {v} ({e})"),
        None => anyhow!("its Delta log cannot be read: {e}"),
    })?;
    let version = snapshot.version();
    if let Some(mode) = &snapshot.table_properties().column_mapping_mode
        && format!("{mode:?}").to_lowercase() != "none"
    {
        bail!(
            "Delta table version {version} uses column mapping (delta.columnMapping.mode = {mode:?}), which tensorfs does not read"
        );
    }
    let schema = snapshot.schema();
    let arrow_schema =
        Schema::try_from_kernel(schema.as_ref()).context("its schema has no Arrow equivalent")?;
    let scan = snapshot
        .clone()
        .scan_builder()
        .build()
        .context("the table cannot be scanned")?;
    let mut found: Vec<Found> = Vec::new();
    for metadata in scan.scan_metadata(&engine)? {
        found = metadata?.visit_scan_files(found, |found, file| {
            found.push(Found {
                path: file.path,
                partition_values: file.partition_values,
                deletion_vector: file.dv_info.has_vector(),
            })
        })?;
    }
    if let Some(f) = found.iter().find(|f| f.deletion_vector) {
        bail!(
            "Delta table version {version} has deletion vectors (file '{}' and maybe others), which tensorfs does not apply yet; rewrite the table without them (OPTIMIZE, or REORG TABLE … APPLY (PURGE))",
            f.path
        );
    }
    for f in &mut found {
        f.path = percent_encoding::percent_decode_str(&f.path)
            .decode_utf8()
            .map_err(|_| anyhow!("file '{}' of the table is not a UTF-8 path", f.path))?
            .into_owned();
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    // The partition columns: the table's columns its files do not store (every file's values
    // come from the log; a null one is absent from a file's map).
    let stored: Vec<String> = (scan.physical_schema().fields())
        .map(|f| f.name().to_string())
        .collect();
    let keys: Vec<String> = (arrow_schema.fields().iter())
        .map(|f| f.name().clone())
        .filter(|name| !stored.contains(name))
        .collect();
    let data: Vec<FieldRef> = (arrow_schema.fields().iter())
        .filter(|f| !keys.contains(f.name()))
        .cloned()
        .collect();
    let fields: Vec<FieldRef> = (keys.iter())
        .map(|k| {
            let f = arrow_schema.field_with_name(k)?;
            Ok(Arc::new(f.clone().with_nullable(true)))
        })
        .collect::<Result<_>>()?;
    let values = (found.iter())
        .map(|f| {
            (fields.iter())
                .map(|field| partition_value(f, field))
                .collect::<Result<Vec<Value>>>()
        })
        .collect::<Result<_>>()?;
    Ok(Table {
        version,
        data_schema: Arc::new(Schema::new(data)),
        partitions: Partitions { fields, values },
        files: found.into_iter().map(|f| f.path).collect(),
    })
}

/// A partition value as the log writes it (a string; none for null), as the field's type.
fn partition_value(file: &Found, field: &FieldRef) -> Result<Value> {
    let Some(raw) = file.partition_values.get(field.name()) else {
        return Ok(Value::Null);
    };
    let bad = || {
        anyhow!(
            "file '{}': partition value '{raw}' of column '{}' is no {}",
            file.path,
            field.name(),
            field.data_type()
        )
    };
    Ok(match field.data_type() {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            Value::Int(raw.parse().map_err(|_| bad())?)
        }
        DataType::Float32 | DataType::Float64 => {
            let v: f64 = raw.parse().map_err(|_| bad())?;
            // A snapshot keeps values as JSON, which has no NaN or infinity.
            if !v.is_finite() {
                bail!(
                    "file '{}': partition value '{raw}' of column '{}' is not a finite number, which tensorfs does not serve",
                    file.path,
                    field.name()
                );
            }
            Value::Float(v)
        }
        DataType::Boolean => Value::Bool(raw.parse().map_err(|_| bad())?),
        DataType::Date32 => {
            let day = chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d").map_err(|_| bad())?;
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
            Value::Int((day - epoch).num_days())
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            // The protocol's two forms: `2026-11-01 12:00:00[.ffffff]` and ISO 8601 (`…T…Z`).
            let t = chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f")
                .map(|t| t.and_utc())
                .or_else(|_| chrono::DateTime::parse_from_rfc3339(raw).map(|t| t.to_utc()))
                .map_err(|_| bad())?;
            Value::Int(t.timestamp_micros())
        }
        // Strings (and the types tensorfs serves no tensor for) keep their text: the view
        // refuses their columns by type.
        _ => Value::Str(raw.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::is_table;

    #[test]
    fn a_table_is_a_log_with_a_commit_or_a_checkpoint_pointer() {
        assert!(is_table([
            "_delta_log/00000000000000000000.json",
            "a.parquet"
        ]));
        assert!(is_table(["_delta_log/_last_checkpoint"]));
        assert!(!is_table([
            "_delta_log/00000000000000000010.checkpoint.parquet"
        ]));
        assert!(!is_table([
            "_delta_log/0.json",
            "sub/_delta_log/00000000000000000000.json"
        ]));
        assert!(!is_table(["a.parquet"]));
    }
}
