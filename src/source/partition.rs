//! Partition columns: values a file holds for all of its rows, which its directory names
//! (hive-style `key=value/`) or a Delta table's log gives, rather than its Parquet columns.
//! They are columns like any other (PRODUCT.md §8): appended to the files' schema, and given to
//! the transform as constant arrays beside each decoded piece of a row group. Hive keys are
//! typed as pyarrow's hive partitioning infers them (int32 where every value is a 32-bit
//! integer, else string; `__HIVE_DEFAULT_PARTITION__` and a missing key are null); a Delta
//! table's, as its schema says.

use anyhow::{Result, bail};
use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int8Array, Int16Array,
    Int32Array, Int64Array, StringArray, TimestampMicrosecondArray, new_null_array,
};
use arrow::datatypes::{DataType, Field, FieldRef};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a hive directory names for a null value.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// One partition value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Value {
    Null,
    /// Integers, and dates (days) and timestamps (microseconds) since the epoch.
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

/// The partition columns of a dataset: their fields, and each file's values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Partitions {
    pub fields: Vec<FieldRef>,
    /// For each file of the dataset (in order), a value for each field.
    pub(crate) values: Vec<Vec<Value>>,
}

impl Partitions {
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The hive partitioning of files named `names` (relative to the dataset's root), as
    /// `pyarrow.dataset.dataset(root, partitioning="hive")` reads it: keys in the order they
    /// first appear, values percent-decoded, each key int32 where all its values are 32-bit
    /// integers, else string.
    pub(crate) fn hive(names: &[&str]) -> Partitions {
        let parsed: Vec<Vec<(String, Option<String>)>> =
            names.iter().map(|n| segments(n)).collect();
        let mut keys: Vec<String> = Vec::new();
        for (key, _) in parsed.iter().flatten() {
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
        if keys.is_empty() {
            return Partitions::default();
        }
        let raw: Vec<Vec<Option<String>>> = (parsed.iter())
            .map(|kv| {
                (keys.iter())
                    .map(|k| {
                        kv.iter()
                            .find(|(key, _)| key == k)
                            .and_then(|(_, v)| v.clone())
                    })
                    .collect()
            })
            .collect();
        let ints: Vec<bool> = (0..keys.len())
            .map(|k| {
                raw.iter()
                    .filter_map(|f| f[k].as_deref())
                    .all(|v| int32(v).is_some())
            })
            .collect();
        let fields = (keys.iter().zip(&ints))
            .map(|(k, &int)| {
                let dt = if int { DataType::Int32 } else { DataType::Utf8 };
                Arc::new(Field::new(k, dt, true))
            })
            .collect();
        let values = (raw.into_iter())
            .map(|file| {
                (file.into_iter().zip(&ints))
                    .map(|(v, &int)| match (v, int) {
                        (None, _) => Value::Null,
                        (Some(v), true) => Value::Int(int32(&v).expect("checked") as i64),
                        (Some(v), false) => Value::Str(v),
                    })
                    .collect()
            })
            .collect();
        Partitions { fields, values }
    }

    /// Partition field `k`'s value in file `file`, as an array of `rows` rows.
    pub(crate) fn column(&self, file: usize, k: usize, rows: usize) -> Result<ArrayRef> {
        let dt = self.fields[k].data_type();
        let int = |v: i64| -> Result<i32> { Ok(i32::try_from(v)?) };
        Ok(match (&self.values[file][k], dt) {
            (Value::Null, dt) => new_null_array(dt, rows),
            (Value::Int(v), DataType::Int8) => {
                Arc::new(Int8Array::from(vec![i8::try_from(*v)?; rows]))
            }
            (Value::Int(v), DataType::Int16) => {
                Arc::new(Int16Array::from(vec![i16::try_from(*v)?; rows]))
            }
            (Value::Int(v), DataType::Int32) => Arc::new(Int32Array::from(vec![int(*v)?; rows])),
            (Value::Int(v), DataType::Int64) => Arc::new(Int64Array::from(vec![*v; rows])),
            (Value::Int(v), DataType::Date32) => Arc::new(Date32Array::from(vec![int(*v)?; rows])),
            (Value::Int(v), DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, tz)) => {
                let t = TimestampMicrosecondArray::from(vec![*v; rows]);
                Arc::new(t.with_timezone_opt(tz.clone()))
            }
            (Value::Float(v), DataType::Float32) => {
                Arc::new(Float32Array::from(vec![*v as f32; rows]))
            }
            (Value::Float(v), DataType::Float64) => Arc::new(Float64Array::from(vec![*v; rows])),
            (Value::Bool(v), DataType::Boolean) => Arc::new(BooleanArray::from(vec![*v; rows])),
            (Value::Str(s), DataType::Utf8) => {
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(s, rows)))
            }
            (v, dt) => bail!(
                "partition column '{}': {v:?} is no {dt}",
                self.fields[k].name()
            ),
        })
    }

    /// The first file (by index) where field `k` is null, if any.
    pub(crate) fn first_null(&self, k: usize) -> Option<usize> {
        self.values.iter().position(|f| f[k] == Value::Null)
    }
}

/// A 32-bit integer as pyarrow's hive inference reads one: digits, an optional leading `-`.
fn int32(v: &str) -> Option<i32> {
    let digits = v.strip_prefix('-').unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// The `key=value` directories of a file's relative name, values percent-decoded
/// (`None`: null).
fn segments(name: &str) -> Vec<(String, Option<String>)> {
    let mut dirs: Vec<&str> = name.split('/').collect();
    dirs.pop();
    dirs.into_iter()
        .filter_map(|d| d.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| {
            let v = percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned();
            let v = (v != HIVE_NULL).then_some(v);
            (k.to_string(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};

    #[test]
    fn hive_keys_are_typed_as_pyarrow_infers_them() {
        let p = Partitions::hive(&[
            "i=1/d=2026-11-01/s=x%20y/part.parquet",
            "i=-10/d=2026-11-02/s=__HIVE_DEFAULT_PARTITION__/part.parquet",
            "i=007/part.parquet",
        ]);
        let types: Vec<(&str, &DataType)> = (p.fields.iter())
            .map(|f| (f.name().as_str(), f.data_type()))
            .collect();
        assert_eq!(
            types,
            [
                ("i", &DataType::Int32),
                ("d", &DataType::Utf8),
                ("s", &DataType::Utf8)
            ]
        );
        assert_eq!(
            p.values[0],
            [
                Value::Int(1),
                Value::Str("2026-11-01".into()),
                Value::Str("x y".into())
            ]
        );
        assert_eq!(p.values[1][2], Value::Null);
        assert_eq!(p.values[2], [Value::Int(7), Value::Null, Value::Null]);
        assert_eq!(p.first_null(2), Some(1));
        let col = p.column(1, 0, 3).unwrap();
        assert_eq!(
            col.as_primitive::<arrow::datatypes::Int32Type>().values(),
            &[-10, -10, -10]
        );
        assert_eq!(p.column(2, 1, 2).unwrap().null_count(), 2);
    }

    #[test]
    fn values_that_are_not_all_32_bit_integers_make_strings() {
        for odd in ["+2", "3000000000", "1.5", ""] {
            let name = format!("a={odd}/x.parquet");
            let p = Partitions::hive(&["a=1/x.parquet", &name]);
            assert_eq!(p.fields[0].data_type(), &DataType::Utf8, "{odd}");
        }
        assert!(Partitions::hive(&["x.parquet", "plain/y.parquet"]).is_empty());
    }
}
