//! Tensors from Arrow: one row group's Arrow columns → fixed-stride tensor columns
//! (dictionaries decoded, casts, stacks, padded lists with their lengths, zero-filled nulls
//! with their masks).

use crate::model::dtype::DType;
use crate::source::view::{FeatureKind, Part, View};
use anyhow::{Context, Result, bail};
use arrow::array::{Array, AsArray, OffsetSizeTrait};
use arrow::datatypes::DataType;
use half::f16;
use std::ops::Range;

/// A transformed row group and what transforming it counted.
pub(crate) struct Transformed {
    pub(crate) rows: usize,
    pub(crate) tensors: Vec<TensorColumn>,
    /// Lists longer than their `pad=` length, cut.
    pub(crate) truncated: u64,
}

/// A tensor's column of a row group: bytes of its own, or, where the row group was decoded as
/// one piece (a transform's output, read where its worker wrote it), a plain column as Arrow
/// holds it, taken without a copy.
pub(crate) enum TensorColumn {
    Own(Vec<u8>),
    Arrow(arrow::buffer::Buffer),
}

impl std::ops::Deref for TensorColumn {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            TensorColumn::Own(v) => v,
            TensorColumn::Arrow(b) => b.as_slice(),
        }
    }
}

impl TensorColumn {
    /// Its bytes in a vector of their own: copied where Arrow holds them.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            TensorColumn::Own(v) => v,
            TensorColumn::Arrow(b) => b.as_slice().to_vec(),
        }
    }
}

/// Elements of one column, flattened: their type, little-endian bytes, and which are valid
/// (`None`: all of them). Null elements hold zeros.
struct Flat {
    dtype: DType,
    data: Vec<u8>,
    valid: Option<Vec<bool>>,
}

fn dtype_of(dt: &DataType) -> Option<DType> {
    Some(match dt {
        DataType::Boolean => DType::Bool,
        DataType::Int8 => DType::I8,
        DataType::Int16 => DType::I16,
        DataType::Int32 | DataType::Date32 | DataType::Time32(_) => DType::I32,
        DataType::Int64
        | DataType::Date64
        | DataType::Timestamp(..)
        | DataType::Time64(_)
        | DataType::Duration(_) => DType::I64,
        DataType::UInt8 => DType::U8,
        DataType::UInt16 => DType::U16,
        DataType::UInt32 => DType::U32,
        DataType::UInt64 => DType::U64,
        DataType::Float16 => DType::F16,
        DataType::Float32 => DType::F32,
        DataType::Float64 => DType::F64,
        _ => return None,
    })
}

fn flatten(array: &dyn Array) -> Result<Flat> {
    let valid: Option<Vec<bool>> = array
        .logical_nulls()
        .filter(|n| n.null_count() > 0)
        .map(|n| n.iter().collect());
    match array.data_type() {
        DataType::Dictionary(_, values) => {
            let decoded = arrow::compute::cast(array, values)?;
            flatten(decoded.as_ref())
        }
        // Served as days, as pyarrow reads a date64 column back (see `view::map_type`).
        DataType::Date64 => {
            let days = arrow::compute::cast(array, &DataType::Date32)?;
            flatten(days.as_ref())
        }
        DataType::FixedSizeList(_, n) => {
            let n = *n as usize;
            let list = array.as_fixed_size_list();
            let mut flat = flatten(list.values().as_ref())?;
            if let Some(rows) = valid {
                // A row's elements: n items, each of them every element of an inner list.
                let size = flat.dtype.size();
                let per_row = n
                    * (flat.data.len() / size)
                        .checked_div(rows.len() * n)
                        .unwrap_or(0);
                let elems = flat
                    .valid
                    .get_or_insert_with(|| vec![true; rows.len() * per_row]);
                for (r, ok) in rows.iter().enumerate() {
                    if !ok {
                        elems[r * per_row..(r + 1) * per_row].fill(false);
                        flat.data[r * per_row * size..(r + 1) * per_row * size].fill(0);
                    }
                }
            }
            Ok(flat)
        }
        DataType::Boolean => {
            let b = array.as_boolean();
            let data = (0..b.len())
                .map(|i| u8::from(b.value(i) && b.is_valid(i)))
                .collect();
            Ok(Flat {
                dtype: DType::Bool,
                data,
                valid,
            })
        }
        dt => {
            let Some(dtype) = dtype_of(dt) else {
                bail!("column type {dt} has no tensor mapping");
            };
            let size = dtype.size();
            let d = array.to_data();
            let buf = &d.buffers()[0].as_slice()[d.offset() * size..(d.offset() + d.len()) * size];
            let mut data = buf.to_vec();
            if let Some(v) = &valid {
                for (i, ok) in v.iter().enumerate() {
                    if !ok {
                        data[i * size..(i + 1) * size].fill(0);
                    }
                }
            }
            Ok(Flat { dtype, data, valid })
        }
    }
}

#[derive(Clone, Copy)]
enum Num {
    I(i128),
    F(f64),
}

fn load(d: DType, b: &[u8]) -> Num {
    macro_rules! int {
        ($t:ty) => {
            Num::I(<$t>::from_le_bytes(b.try_into().unwrap()) as i128)
        };
    }
    match d {
        DType::Bool => Num::I(i128::from(b[0] != 0)),
        DType::I8 => int!(i8),
        DType::I16 => int!(i16),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::U8 => int!(u8),
        DType::U16 => int!(u16),
        DType::U32 => int!(u32),
        DType::U64 => int!(u64),
        DType::F16 => Num::F(f16::from_le_bytes(b.try_into().unwrap()).to_f64()),
        DType::F32 => Num::F(f32::from_le_bytes(b.try_into().unwrap()) as f64),
        DType::F64 => Num::F(f64::from_le_bytes(b.try_into().unwrap())),
    }
}

/// NumPy's `astype` where it is defined: integers wrap, floats round to nearest, floats to
/// integers truncate (saturating, NaN to 0, where NumPy leaves it undefined).
fn store(d: DType, n: Num, out: &mut Vec<u8>) {
    macro_rules! int {
        ($t:ty) => {
            out.extend_from_slice(
                &match n {
                    Num::I(v) => v as $t,
                    Num::F(f) => f as $t,
                }
                .to_le_bytes(),
            )
        };
    }
    let as_f64 = match n {
        Num::I(v) => v as f64,
        Num::F(f) => f,
    };
    match d {
        DType::Bool => out.push(u8::from(match n {
            Num::I(v) => v != 0,
            Num::F(f) => f != 0.0,
        })),
        DType::I8 => int!(i8),
        DType::I16 => int!(i16),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::U8 => int!(u8),
        DType::U16 => int!(u16),
        DType::U32 => int!(u32),
        DType::U64 => int!(u64),
        DType::F16 => out.extend_from_slice(&f16::from_f64(as_f64).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(as_f64 as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&as_f64.to_le_bytes()),
    }
}

/// Converts little-endian elements of `from` to `to`.
pub(crate) fn cast(data: Vec<u8>, from: DType, to: DType) -> Vec<u8> {
    if from == to {
        return data;
    }
    let mut out = Vec::with_capacity(data.len() / from.size() * to.size());
    for e in data.chunks_exact(from.size()) {
        store(to, load(from, e), &mut out);
    }
    out
}

/// An feature's mask tensor, where it serves one (`nulls=zero`): one byte an element.
fn mask_bytes(
    feature: &crate::source::view::Feature,
    valid: &Option<Vec<bool>>,
    elems: usize,
) -> Vec<u8> {
    match valid {
        _ if !feature.mask => Vec::new(),
        Some(v) => v.iter().map(|&ok| u8::from(ok)).collect(),
        None => vec![1; elems],
    }
}

struct Padded {
    data: Vec<u8>,
    lens: Vec<u8>,
    valid: Vec<bool>,
    has_nulls: bool,
    truncated: u64,
}

fn pad<O: OffsetSizeTrait>(array: &dyn Array, len: usize, dtype: DType) -> Result<Padded> {
    let list = array.as_list::<O>();
    let values = flatten(list.values().as_ref())?;
    let size = dtype.size();
    let rows = list.len();
    let mut out = Padded {
        data: vec![0; rows * len * size],
        lens: Vec::with_capacity(rows * 4),
        valid: vec![false; rows * len],
        has_nulls: false,
        truncated: 0,
    };
    let offsets = list.value_offsets();
    for r in 0..rows {
        let (start, end) = (offsets[r].as_usize(), offsets[r + 1].as_usize());
        let n = if list.is_null(r) { 0 } else { end - start };
        let kept = n.min(len);
        out.truncated += u64::from(n > len);
        out.data[r * len * size..(r * len + kept) * size]
            .copy_from_slice(&values.data[start * size..(start + kept) * size]);
        for k in 0..kept {
            let ok = values.valid.as_ref().is_none_or(|v| v[start + k]);
            out.valid[r * len + k] = ok;
            out.has_nulls |= !ok;
        }
        out.lens.extend_from_slice(&(kept as i32).to_le_bytes());
    }
    Ok(out)
}

/// A column of Petastorm cells decoded row by row into the field's dtype and shape; null cells
/// are zeros (and invalid in the mask). A cell that disagrees with the Unischema fails the row
/// group, naming the field and the row.
fn decode_cells(
    array: &dyn Array,
    spec: &crate::source::petastorm::Field,
    feature: &crate::source::view::Feature,
    first_row: usize,
) -> Result<(Vec<u8>, Option<Vec<bool>>)> {
    let row_bytes = feature.inner.iter().product::<usize>() * feature.source_dtype.size();
    let elems = feature.inner.iter().product::<usize>();
    let cell = |r: usize| -> Option<&[u8]> {
        if array.is_null(r) {
            return None;
        }
        Some(match array.data_type() {
            DataType::LargeBinary => array.as_binary::<i64>().value(r),
            DataType::BinaryView => array.as_binary_view().value(r),
            _ => array.as_binary::<i32>().value(r),
        })
    };
    let mut data = Vec::with_capacity(array.len() * row_bytes);
    let mut valid: Option<Vec<bool>> = None;
    for r in 0..array.len() {
        match cell(r) {
            Some(bytes) => {
                let decoded = crate::source::petastorm::decode_cell(spec, spec.codec, bytes)
                    .with_context(|| format!("field '{}' row {}", spec.name, first_row + r))?;
                data.extend_from_slice(&decoded);
            }
            None => {
                data.resize(data.len() + row_bytes, 0);
                let v = valid.get_or_insert_with(|| vec![true; array.len() * elems]);
                v[r * elems..(r + 1) * elems].fill(false);
            }
        }
    }
    Ok((data, valid))
}

/// Transforms one row group, projected to `view.roots` and decoded as `pieces` (record
/// batches in row order), into the view's tensor columns. Each piece is let go once
/// transformed, so the row group is held about once, not as Arrow arrays and tensor columns
/// both.
pub(crate) fn of_row_group(
    view: &View,
    pieces: Vec<arrow::array::RecordBatch>,
) -> Result<Transformed> {
    let rows: usize = pieces.iter().map(|p| p.num_rows()).sum();
    // Of several pieces, each tensor's column of the whole row group, allocated once: the
    // pieces are appended to it, a plain column straight from Arrow's buffer (every byte a
    // cold epoch copies costs CPU twice where the memory is fresh). Of one piece, each column
    // is taken as it is: a plain one as Arrow holds it, any other as converted.
    let whole = pieces.len() == 1;
    let mut tensors: Vec<Vec<u8>> = (view.tensors.iter())
        .map(|t| match (t.part, whole) {
            (Part::Len, _) | (_, true) => Vec::new(),
            _ => Vec::with_capacity(rows * t.row_bytes()),
        })
        .collect();
    let mut as_arrow = vec![None; view.tensors.len()];
    let (mut first_row, mut truncated) = (0, 0);
    for piece in pieces {
        let taken = whole.then_some(&mut as_arrow[..]);
        truncated += append_piece(view, &piece, first_row, &mut tensors, taken)?;
        first_row += piece.num_rows();
    }
    let tensors = (tensors.into_iter().zip(as_arrow))
        .map(|(own, arrow)| match arrow {
            Some(buffer) => TensorColumn::Arrow(buffer),
            None => TensorColumn::Own(own),
        })
        .collect();
    Ok(Transformed {
        rows,
        tensors,
        truncated,
    })
}

/// The bytes of a column that is its values as they are: a primitive (or fixed-size list of
/// primitives) column of `dtype` without nulls, as Arrow holds it.
fn plain_bytes(array: &dyn Array, dtype: DType) -> Option<(arrow::buffer::Buffer, Range<usize>)> {
    if array.logical_nulls().is_some_and(|n| n.null_count() > 0) {
        return None;
    }
    match array.data_type() {
        DataType::FixedSizeList(_, n) => {
            let list = array.as_fixed_size_list();
            let values = list.values();
            // A list's values are sliced with it: its rows are its values from the first.
            let (buffer, range) = plain_bytes(values.as_ref(), dtype)?;
            let len = list.len() * *n as usize * dtype.size();
            (len <= range.len()).then_some((buffer, range.start..range.start + len))
        }
        DataType::Dictionary(..) | DataType::Date64 | DataType::Boolean => None,
        dt if dtype_of(dt) == Some(dtype) => {
            let d = array.to_data();
            let size = dtype.size();
            let range = d.offset() * size..(d.offset() + d.len()) * size;
            Some((d.buffers().first()?.clone(), range))
        }
        _ => None,
    }
}

/// Appends rows `first_row..` of a row group (`batch`), projected to `view.roots`, to the
/// view's tensor columns `tensors`; the rows of lists `pad=` cut. Given `taken` (the batch is
/// the whole row group), a plain column's buffer goes there instead, not copied.
fn append_piece(
    view: &View,
    batch: &arrow::array::RecordBatch,
    first_row: usize,
    tensors: &mut [Vec<u8>],
    mut taken: Option<&mut [Option<arrow::buffer::Buffer>]>,
) -> Result<u64> {
    let rows = batch.num_rows();
    let mut truncated = 0;
    for (ii, feature) in view.features.iter().enumerate() {
        let column = |field: usize| batch.column(view.column_of(field)).as_ref();
        if let FeatureKind::Column { field } = &feature.kind
            && !feature.mask
            && feature.source_dtype == feature.dtype
            && let Some((buffer, range)) = plain_bytes(column(*field), feature.dtype)
        {
            let expected = rows * feature.inner.iter().product::<usize>() * feature.dtype.size();
            if range.len() == expected {
                let data = view
                    .tensors
                    .iter()
                    .position(|t| t.feature == ii && t.part == Part::Data);
                match (data, taken.as_deref_mut()) {
                    (Some(t), Some(taken)) => {
                        taken[t] = Some(buffer.slice_with_length(range.start, range.len()))
                    }
                    (Some(t), None) => tensors[t].extend_from_slice(&buffer.as_slice()[range]),
                    (None, _) => {}
                }
                continue;
            }
        }
        let null_error = || {
            anyhow::anyhow!(
                "column '{}' holds nulls that the mount did not find (in its statistics, or in a transform's first row group); mount with nulls=zero",
                feature.name
            )
        };
        let (data, len, mask) = match &feature.kind {
            FeatureKind::Column { field } => {
                let flat = flatten(column(*field))?;
                if flat.valid.is_some() && !feature.mask {
                    return Err(null_error());
                }
                let elems = flat.data.len() / flat.dtype.size();
                let mask = mask_bytes(feature, &flat.valid, elems);
                (cast(flat.data, flat.dtype, feature.dtype), None, mask)
            }
            FeatureKind::Stack { fields } => {
                let k = fields.len();
                let size = feature.source_dtype.size();
                let mut data = vec![0u8; rows * k * size];
                let mut mask = vec![1u8; rows * k];
                for (j, &f) in fields.iter().enumerate() {
                    let flat = flatten(column(f))?;
                    if flat.valid.is_some() && !feature.mask {
                        return Err(null_error());
                    }
                    let member = cast(flat.data, flat.dtype, feature.source_dtype);
                    for r in 0..rows {
                        data[(r * k + j) * size..(r * k + j + 1) * size]
                            .copy_from_slice(&member[r * size..(r + 1) * size]);
                        if let Some(v) = &flat.valid {
                            mask[r * k + j] = u8::from(v[r]);
                        }
                    }
                }
                (cast(data, feature.source_dtype, feature.dtype), None, mask)
            }
            FeatureKind::Cell { field, spec } => {
                let (data, valid) = decode_cells(column(*field), spec, feature, first_row)?;
                if valid.is_some() && !feature.mask {
                    return Err(null_error());
                }
                let elems = data.len() / feature.source_dtype.size();
                let mask = mask_bytes(feature, &valid, elems);
                (cast(data, feature.source_dtype, feature.dtype), None, mask)
            }
            FeatureKind::Pad { field, len } => {
                let array = column(*field);
                let p = match array.data_type() {
                    DataType::LargeList(_) => pad::<i64>(array, *len, feature.source_dtype)?,
                    _ => pad::<i32>(array, *len, feature.source_dtype)?,
                };
                if p.has_nulls && !feature.mask {
                    return Err(null_error());
                }
                truncated += p.truncated;
                let mask = p.valid.iter().map(|&ok| u8::from(ok)).collect();
                (
                    cast(p.data, feature.source_dtype, feature.dtype),
                    Some(p.lens),
                    mask,
                )
            }
        };
        let expected = rows * feature.inner.iter().product::<usize>() * feature.dtype.size();
        if data.len() != expected {
            bail!(
                "column '{}' decoded to {} bytes, expected {expected}",
                feature.name,
                data.len()
            );
        }
        let (mut data, mut len, mut mask) = (Some(data), len, Some(mask));
        for (ti, t) in view
            .tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.feature == ii)
        {
            let part = match t.part {
                Part::Data => data.take(),
                Part::Len => len.take(),
                Part::Mask => mask.take(),
            }
            .expect("each part is served once");
            match tensors[ti].capacity() {
                // Nothing reserved (a length column, or any column of a row group of one
                // piece): taken as it is.
                0 => tensors[ti] = part,
                _ => tensors[ti].extend_from_slice(&part),
            }
        }
    }
    Ok(truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_follow_numpy() {
        let ints: Vec<u8> = [-1i64, 300, 7]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let as_u8 = cast(ints.clone(), DType::I64, DType::U8);
        assert_eq!(as_u8, vec![255, 44, 7]);
        let as_f32 = cast(ints, DType::I64, DType::F32);
        let back: Vec<f32> = as_f32
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, vec![-1.0, 300.0, 7.0]);
        let floats: Vec<u8> = [1.5f64, -2.7, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            cast(floats.clone(), DType::F64, DType::I32)[..4],
            1i32.to_le_bytes()
        );
        assert_eq!(cast(floats.clone(), DType::F64, DType::Bool), vec![1, 1, 0]);
        let h = cast(floats, DType::F64, DType::F16);
        assert_eq!(f16::from_le_bytes([h[0], h[1]]).to_f64(), 1.5);
    }

    #[test]
    fn a_null_row_of_a_nested_fixed_size_list_zeroes_that_row_only() {
        use arrow::array::{FixedSizeListArray, Int32Array};
        use arrow::buffer::NullBuffer;
        use arrow::datatypes::Field;
        use std::sync::Arc;
        // int32[4 rows][2][2], row 1 null at the outer level, one leaf (row 2) null.
        let leaf = Int32Array::from_iter((1..=16).map(|v| (v != 10).then_some(v)));
        let pair = Arc::new(Field::new("feature", DataType::Int32, true));
        let inner = FixedSizeListArray::new(pair, 2, Arc::new(leaf), None);
        let row = Arc::new(Field::new("feature", inner.data_type().clone(), true));
        let nulls = NullBuffer::from(vec![true, false, true, true]);
        let outer = FixedSizeListArray::new(row, 2, Arc::new(inner), Some(nulls));
        let flat = flatten(&outer).unwrap();
        let values: Vec<i32> = flat
            .data
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut want: Vec<i32> = (1..=16).collect();
        want[4..8].fill(0);
        want[9] = 0;
        assert_eq!(values, want);
        let valid = flat.valid.unwrap();
        let want_valid: Vec<bool> = (0..16).map(|i| !(4..8).contains(&i) && i != 9).collect();
        assert_eq!(valid, want_valid);
    }
}
