//! Delta Lake tables (PRODUCT.md §8): the data files and partition values of one version,
//! from the table's log ([`crate::source::delta_log`]); a reader feature not read here is
//! refused, naming it.
//!
//! Deletion vectors are applied ([`crate::source::deletes`]); column mapping (`name` and `id`)
//! finds each column by its physical name or field id. The table's schema decides the types,
//! not each
//! file's: `Source` casts what a file stores to the table's type as it decodes.

use crate::source::catalog::{FIELD_ID, PHYSICAL_NAME};
use crate::source::delta_log::{self, Added};
use crate::source::lake::{ColumnBounds, FileBounds, Table, TableKind, Version};
use crate::source::partition::{Partitions, Value};
use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, TimeUnit};
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

/// The directory of a Delta table's log, at its root.
pub(crate) const LOG: &str = "_delta_log";

/// Whether the names under a source's root (relative to it) make it a Delta table: its
/// `_delta_log/` holds a commit (`NNNNNNNNNNNNNNNNNNNN.json`) or `_last_checkpoint`. A
/// `_delta_log/` with neither (a leftover, a stray checkpoint) is no table any reader can open,
/// and the directory is read as the Parquet files it holds, as pyarrow reads it.
pub(crate) fn is_table<'a>(names: impl IntoIterator<Item = &'a str>) -> bool {
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

/// Reads version `version` (the latest when `None`) of the Delta table at `root` through
/// `store`.
pub(crate) async fn read(
    store: Arc<dyn ObjectStore>,
    root: &Path,
    version: Option<crate::options::AsOf>,
    with_stats: bool,
) -> Result<Table> {
    let snapshot = delta_log::snapshot(&store, root, version, with_stats)
        .await
        .map_err(|e| match e.downcast_ref::<delta_log::NoVersion>() {
            Some(_) => e,
            None => anyhow!("its Delta log cannot be read: {e:#}"),
        })?;
    let version = snapshot.version;
    let mapping = match snapshot.configuration.get("delta.columnMapping.mode") {
        Some(mode) if snapshot.column_mapping => match mode.to_ascii_lowercase().as_str() {
            "none" => Mapping::None,
            "name" => Mapping::Name,
            "id" => Mapping::Id,
            other => bail!(
                "Delta table version {version} maps its columns in mode '{other}' (delta.columnMapping.mode), which the Delta protocol does not define"
            ),
        },
        _ => Mapping::None,
    };
    let arrow_schema =
        arrow_schema(&snapshot.schema, mapping).context("its schema has no Arrow equivalent")?;
    let mut found = snapshot.files;
    found.sort_by(|a, b| a.path.cmp(&b.path));
    // The partition columns, in the table's order (every file's values come from the log; a
    // null one is absent from a file's map).
    let keys: Vec<String> = (arrow_schema.fields().iter())
        .map(|f| f.name().clone())
        .filter(|name| snapshot.partition_columns.contains(name))
        .collect();
    if let Some(k) = (snapshot.partition_columns.iter()).find(|k| !keys.contains(k)) {
        bail!("partition column '{k}' is not in the table's schema");
    }
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
    let data_schema = Schema::new(data);
    // Statistics name the physical columns.
    let bounds = (found.iter())
        .map(|f| f.stats.as_deref().and_then(|s| bounds_of(s, &data_schema)))
        .collect();
    Ok(Table {
        version: Version {
            kind: TableKind::Delta,
            number: version,
        },
        bounds,
        ruled_out: 0,
        memory: Default::default(),
        data_schema: Arc::new(data_schema),
        partitions: Partitions { fields, values },
        deletes: found.iter().map(|f| f.deletion_vector.clone()).collect(),
        files: found.into_iter().map(|f| f.path).collect(),
    })
}

/// How a table's columns are found in its files (`delta.columnMapping.mode`): by their names
/// (none), by the physical names the schema gives them (`name`), or by their field ids (`id`,
/// the physical names where a file has no ids). Columns are served by their logical names
/// either way, through renames; partition values and statistics name the physical columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mapping {
    None,
    Name,
    Id,
}

/// The Arrow schema of a table's schema (`schemaString`), as the Delta project's kernel maps
/// it: timestamps in microseconds (with time zone UTC, or none for `timestamp_ntz`), lists of
/// `element`, maps of `key_value` entries. Under column mapping, each top-level field carries
/// its physical name (and, in `id` mode, its field id) in its metadata, as the file reads
/// need it (`catalog::by_name`).
fn arrow_schema(schema: &serde_json::Value, mapping: Mapping) -> Result<Schema> {
    let fields = struct_fields(schema)?;
    if mapping == Mapping::None {
        return Ok(Schema::new(fields));
    }
    let described = (schema.get("fields").and_then(serde_json::Value::as_array))
        .context("a struct without fields")?;
    let fields: Vec<Field> = (fields.iter().zip(described))
        .map(|(f, d)| {
            let meta = d.get("metadata");
            let get = |k: &str| meta.and_then(|m| m.get(k));
            let mut metadata = f.metadata().clone();
            if let Some(physical) = get(PHYSICAL_NAME).and_then(serde_json::Value::as_str) {
                metadata.insert(PHYSICAL_NAME, physical);
            }
            if mapping == Mapping::Id
                && let Some(id) = get("delta.columnMapping.id").and_then(serde_json::Value::as_i64)
            {
                metadata.insert(FIELD_ID, id.to_string());
            }
            f.as_ref().clone().with_metadata(metadata)
        })
        .collect();
    Ok(Schema::new(fields))
}

/// The name of a table's column in its files and log: its physical name under column mapping.
fn physical(field: &Field) -> &str {
    field
        .metadata()
        .get(PHYSICAL_NAME)
        .map_or(field.name().as_str(), String::as_str)
}

fn struct_fields(s: &serde_json::Value) -> Result<Fields> {
    let fields = (s.get("fields").and_then(serde_json::Value::as_array))
        .context("a struct without fields")?;
    fields
        .iter()
        .map(|f| {
            let name = (f.get("name").and_then(serde_json::Value::as_str))
                .context("a field without a name")?;
            let t = f.get("type").context("a field without a type")?;
            let nullable = f
                .get("nullable")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true);
            let t = arrow_type(t).with_context(|| format!("column '{name}'"))?;
            Ok(Field::new(name, t, nullable))
        })
        .collect()
}

fn arrow_type(t: &serde_json::Value) -> Result<DataType> {
    use serde_json::Value as J;
    let flag = |k: &str| t.get(k).and_then(J::as_bool).unwrap_or(true);
    Ok(match t {
        J::String(name) => match name.as_str() {
            "string" => DataType::Utf8,
            "long" => DataType::Int64,
            "integer" => DataType::Int32,
            "short" => DataType::Int16,
            "byte" => DataType::Int8,
            "float" => DataType::Float32,
            "double" => DataType::Float64,
            "boolean" => DataType::Boolean,
            "binary" => DataType::Binary,
            "date" => DataType::Date32,
            "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            "timestamp_ntz" => DataType::Timestamp(TimeUnit::Microsecond, None),
            other => match other
                .strip_prefix("decimal(")
                .and_then(|d| d.strip_suffix(')'))
                .and_then(|d| d.split_once(','))
            {
                Some((p, s)) => DataType::Decimal128(
                    p.trim().parse().context("a decimal's precision")?,
                    s.trim().parse().context("a decimal's scale")?,
                ),
                None => bail!("type '{other}'"),
            },
        },
        J::Object(o) => match o.get("type").and_then(J::as_str) {
            Some("struct") => DataType::Struct(struct_fields(t)?),
            Some("array") => {
                let item = arrow_type(
                    t.get("elementType")
                        .context("an array without elementType")?,
                )?;
                DataType::List(Arc::new(Field::new("element", item, flag("containsNull"))))
            }
            Some("map") => {
                let key = arrow_type(t.get("keyType").context("a map without keyType")?)?;
                let value = arrow_type(t.get("valueType").context("a map without valueType")?)?;
                let entries = Fields::from(vec![
                    Field::new("key", key, false),
                    Field::new("value", value, flag("valueContainsNull")),
                ]);
                DataType::Map(
                    Arc::new(Field::new("key_value", DataType::Struct(entries), false)),
                    false,
                )
            }
            other => bail!("type {other:?}"),
        },
        other => bail!("type {other}"),
    })
}

/// A partition value as the log writes it (a string; none for null), as the field's type.
fn partition_value(file: &Added, field: &FieldRef) -> Result<Value> {
    let Some(raw) = file.partition_values.get(physical(field)) else {
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

/// A file's `add.stats` (JSON: numRecords, minValues, maxValues, nullCount) as bounds of the
/// table's top-level columns of `schema`; `None` where it does not parse.
fn bounds_of(stats: &str, schema: &Schema) -> Option<FileBounds> {
    let v: serde_json::Value = serde_json::from_str(stats).ok()?;
    let of = |what: &str, name: &str| v.get(what).and_then(|m| m.get(name));
    let mut columns = std::collections::HashMap::new();
    for f in schema.fields() {
        let (name, t) = (physical(f), f.data_type());
        let bounds = ColumnBounds {
            min: of("minValues", name).and_then(|x| stat_value(x, t, false)),
            max: of("maxValues", name).and_then(|x| stat_value(x, t, true)),
            nulls: of("nullCount", name).and_then(serde_json::Value::as_u64),
        };
        if bounds.min.is_some() || bounds.max.is_some() || bounds.nulls.is_some() {
            columns.insert(f.name().clone(), bounds);
        }
    }
    Some(FileBounds {
        rows: v.get("numRecords").and_then(serde_json::Value::as_u64),
        columns,
    })
}

/// Characters Delta writers keep of a string's statistics: a longer value was cut, so a
/// maximum of this length may be below the column's greatest value.
const STRING_STATS_PREFIX: usize = 32;

/// A statistic's JSON value as a one-value array of type `t`, made a bound: a maximum that
/// writers truncate (strings cut to a prefix, timestamps to milliseconds) is left out or
/// raised to cover what was cut. Decimals and nested columns are left out.
fn stat_value(v: &serde_json::Value, t: &DataType, upper: bool) -> Option<arrow::array::ArrayRef> {
    use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
    let raw: ArrayRef = match (v, t) {
        (_, DataType::Decimal128(..) | DataType::Decimal256(..)) => return None,
        (serde_json::Value::Number(n), t) if t.is_numeric() => match n.as_i64() {
            Some(i) => Arc::new(Int64Array::from(vec![i])),
            None => Arc::new(Float64Array::from(vec![n.as_f64()?])),
        },
        (serde_json::Value::String(s), DataType::Utf8 | DataType::LargeUtf8) => {
            if upper && s.chars().count() >= STRING_STATS_PREFIX {
                return None;
            }
            Arc::new(StringArray::from(vec![s.as_str()]))
        }
        (serde_json::Value::String(s), DataType::Date32 | DataType::Timestamp(..)) => {
            Arc::new(StringArray::from(vec![s.as_str()]))
        }
        (serde_json::Value::Bool(b), DataType::Boolean) => Arc::new(BooleanArray::from(vec![*b])),
        _ => return None,
    };
    let strict = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let value = arrow::compute::cast_with_options(&raw, t, &strict).ok()?;
    let DataType::Timestamp(unit, _) = t else {
        return Some(value);
    };
    if !upper {
        return Some(value);
    }
    let one_ms = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 1_000,
        TimeUnit::Nanosecond => 1_000_000,
    };
    let raw = arrow::compute::cast(&value, &DataType::Int64).ok()?;
    let raw = raw.as_any().downcast_ref::<Int64Array>()?;
    let raised: ArrayRef = Arc::new(Int64Array::from(vec![raw.value(0).checked_add(one_ms)?]));
    arrow::compute::cast(&raised, t).ok()
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
