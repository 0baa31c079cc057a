//! Iceberg's bucket transform (the Iceberg table spec, "Bucket Transform Details"): a value's
//! 32-bit Murmur3 (x86 variant, seed 0) of the bytes the spec defines for its type,
//! `& 0x7fffffff`, `% N`. `where=bucket(user, 10) < 8` is then the split Spark, Trino and
//! pyiceberg's `BucketTransform` compute (PRODUCT.md §11).
//!
//! The bytes hashed: integers of every width, dates (days) and times as an 8-byte
//! little-endian long; timestamps as microseconds since the epoch (a nanosecond timestamp is
//! first made microseconds, as the spec says, so both units bucket alike); strings as UTF-8;
//! binary as they are; decimals as the unscaled value's minimal big-endian two's complement.
//! Floats and booleans have no bucket transform.

use anyhow::{Result, bail};
use arrow::array::{Array, ArrayRef, AsArray, Int32Array};
use arrow::datatypes::{DataType, TimeUnit};

/// Murmur3's 32-bit x86 hash of `data`, seed 0 (Austin Appleby's reference `MurmurHash3_x86_32`).
fn murmur3_32(data: &[u8]) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h: u32 = 0;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes(block.try_into().expect("4 bytes"));
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k: u32 = 0;
        for (i, &b) in tail.iter().enumerate() {
            k |= (b as u32) << (8 * i);
        }
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

fn of_long(v: i64) -> u32 {
    murmur3_32(&v.to_le_bytes())
}

/// The minimal big-endian two's complement of an unscaled decimal (Java's
/// `BigInteger.toByteArray`).
fn decimal_bytes(v: i128) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let mut start = 0;
    while start < 15 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        // A leading byte may go where it only repeats the next byte's sign.
        if (b == 0 && next & 0x80 == 0) || (b == 0xff && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    bytes[start..].to_vec()
}

/// Whether columns of type `t` have a bucket transform.
pub(crate) fn accepts(t: &DataType) -> bool {
    use DataType::*;
    match t {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32 | Date64 => true,
        Time32(_) | Time64(_) | Timestamp(_, _) | Decimal128(_, _) => true,
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            true
        }
        Dictionary(_, v) => accepts(v),
        _ => false,
    }
}

/// Each value's bucket of `n` (null where the value is null).
pub(crate) fn buckets(values: &ArrayRef, n: u32) -> Result<Int32Array> {
    use DataType::*;
    if let Dictionary(_, v) = values.data_type() {
        let plain = arrow::compute::cast(values, v)?;
        return buckets(&plain, n);
    }
    let hashes: Vec<Option<u32>> = match values.data_type() {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32 => {
            let longs = arrow::compute::cast(values, &Int64)?;
            let longs = longs.as_primitive::<arrow::datatypes::Int64Type>();
            longs.iter().map(|v| v.map(of_long)).collect()
        }
        Date64 => {
            let days = arrow::compute::cast(values, &Date32)?;
            return buckets(&days, n);
        }
        Time32(_) | Time64(_) => {
            let micros = arrow::compute::cast(values, &Time64(TimeUnit::Microsecond))?;
            let micros = arrow::compute::cast(&micros, &Int64)?;
            return buckets(&micros, n);
        }
        Timestamp(unit, _) => {
            let raw = arrow::compute::cast(values, &Int64)?;
            let raw = raw.as_primitive::<arrow::datatypes::Int64Type>();
            let to_micros = |v: i64| match unit {
                TimeUnit::Second => v * 1_000_000,
                TimeUnit::Millisecond => v * 1_000,
                TimeUnit::Microsecond => v,
                TimeUnit::Nanosecond => v.div_euclid(1_000),
            };
            raw.iter()
                .map(|v| v.map(|v| of_long(to_micros(v))))
                .collect()
        }
        Decimal128(_, _) => {
            let d = values.as_primitive::<arrow::datatypes::Decimal128Type>();
            d.iter()
                .map(|v| v.map(|v| murmur3_32(&decimal_bytes(v))))
                .collect()
        }
        Utf8 | LargeUtf8 | Utf8View => {
            let s = arrow::compute::cast(values, &LargeUtf8)?;
            let s = s.as_string::<i64>();
            s.iter()
                .map(|v| v.map(|v| murmur3_32(v.as_bytes())))
                .collect()
        }
        Binary | LargeBinary | BinaryView => {
            let b = arrow::compute::cast(values, &LargeBinary)?;
            let b = b.as_binary::<i64>();
            b.iter().map(|v| v.map(murmur3_32)).collect()
        }
        FixedSizeBinary(_) => {
            let b = values.as_fixed_size_binary();
            b.iter().map(|v| v.map(murmur3_32)).collect()
        }
        other => bail!("bucket() takes no column of type {other}"),
    };
    Ok(hashes
        .into_iter()
        .map(|h| h.map(|h| ((h & 0x7fff_ffff) % n.max(1)) as i32))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        BinaryArray, Date32Array, Decimal128Array, Int32Array, Int64Array, StringArray,
        Time64MicrosecondArray, TimestampMicrosecondArray, TimestampNanosecondArray,
    };
    use std::sync::Arc;

    /// The hash of one value, as the spec's table gives it (a Java int).
    fn hash_of(values: ArrayRef) -> i32 {
        // Bucket of 2^31 - 1 leaves the masked hash as it is, but for its sign bit.
        buckets(&values, i32::MAX as u32).unwrap().value(0)
    }

    /// The Iceberg spec's "Appendix B: 32-bit Hash Requirements" examples, masked to 31 bits
    /// (what a bucket keeps), and a bucket pyiceberg computes.
    #[test]
    fn the_spec_s_hash_examples() {
        let mask = |h: i32| ((h as u32) & 0x7fff_ffff) % (i32::MAX as u32);
        let cases: Vec<(ArrayRef, i32)> = vec![
            (Arc::new(Int32Array::from(vec![34])), 2017239379),
            (Arc::new(Int64Array::from(vec![34])), 2017239379),
            (
                Arc::new(
                    Decimal128Array::from(vec![1420])
                        .with_precision_and_scale(9, 2)
                        .unwrap(),
                ),
                -500754589,
            ),
            // 2017-11-16
            (Arc::new(Date32Array::from(vec![17486])), -653330422),
            // 22:31:08
            (
                Arc::new(Time64MicrosecondArray::from(vec![81068000000])),
                -662762989,
            ),
            // 2017-11-16T22:31:08
            (
                Arc::new(TimestampMicrosecondArray::from(vec![1510871468000000])),
                -2047944441,
            ),
            (
                Arc::new(TimestampNanosecondArray::from(vec![1510871468000000000])),
                -2047944441,
            ),
            (Arc::new(StringArray::from(vec!["iceberg"])), 1210000089),
            (
                Arc::new(BinaryArray::from(vec![&[0u8, 1, 2, 3][..]])),
                -188683207,
            ),
        ];
        for (values, expected) in cases {
            let t = values.data_type().clone();
            assert_eq!(hash_of(values) as u32, mask(expected), "{t}");
        }
    }

    #[test]
    fn buckets_are_the_masked_hash_modulo_n_and_nulls_stay_null() {
        let values: ArrayRef = Arc::new(Int64Array::from(vec![Some(34), None]));
        let b = buckets(&values, 16).unwrap();
        assert_eq!(b.value(0), ((2017239379u32 & 0x7fff_ffff) % 16) as i32);
        assert!(b.is_null(1));
    }

    #[test]
    fn decimals_hash_their_minimal_two_s_complement() {
        assert_eq!(decimal_bytes(1420), vec![0x05, 0x8c]);
        assert_eq!(decimal_bytes(0), vec![0]);
        assert_eq!(decimal_bytes(-1), vec![0xff]);
        assert_eq!(decimal_bytes(128), vec![0x00, 0x80]);
        assert_eq!(decimal_bytes(-129), vec![0xff, 0x7f]);
    }
}
