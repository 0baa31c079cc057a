//! The batch file formats: `.npy` (one tensor) and safetensors (every tensor of a batch).
//!
//! Headers are computed from dtypes and shapes alone, so a file's exact size is known before
//! its data exists, and they are padded so that the data starts at a multiple of
//! `DATA_ALIGN` (4096): `O_DIRECT` and `cuFileRead` readers can read the data at aligned
//! offsets. Data is little-endian, C order.

use crate::model::dtype::DType;

/// Where tensor data starts in every batch file.
pub(crate) const DATA_ALIGN: usize = 4096;

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// A tensor as a file format sees it: name, element type and full shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorLayout<'_> {
    pub(crate) fn data_len(&self) -> usize {
        self.dtype.size() * self.shape.iter().product::<usize>()
    }
}

fn round_up(n: usize) -> usize {
    n.div_ceil(DATA_ALIGN) * DATA_ALIGN
}

fn python_tuple(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", dims.join(", "))
        }
    }
}

/// The header's dictionary: these, the dtype's descr and the shape's tuple between them.
const NPY_DICT: [&str; 3] = ["{'descr': '", "', 'fortran_order': False, 'shape': ", ", }"];

/// The header of a version 1.0 `.npy` file; its length is a multiple of 4096.
pub fn npy_header(dtype: DType, shape: &[usize]) -> Vec<u8> {
    let [open, middle, close] = NPY_DICT;
    let dict = format!(
        "{open}{}{middle}{}{close}",
        dtype.npy_descr(),
        python_tuple(shape)
    );
    let total = npy_total(dict.len());
    // Version 1.0 stores the header length in a u16.
    assert!(total - 10 <= u16::MAX as usize, "npy header too long");
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&((total - 10) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// The length of [`npy_header`] without building it: counted, not formatted (it is asked
/// for on every read of a one-open file, where formatting it was 2% of a cold epoch's CPU).
pub(crate) fn npy_header_len(dtype: DType, shape: &[usize]) -> usize {
    npy_total(npy_dict_len(dtype, shape))
}

/// The length of [`npy_header`]'s dictionary.
fn npy_dict_len(dtype: DType, shape: &[usize]) -> usize {
    let digits = |d: usize| d.checked_ilog10().map_or(1, |l| l as usize + 1);
    let tuple = match shape {
        [] => 2,
        [one] => digits(*one) + 3,
        _ => 2 + shape.iter().map(|&d| digits(d)).sum::<usize>() + 2 * (shape.len() - 1),
    };
    NPY_DICT.iter().map(|p| p.len()).sum::<usize>() + dtype.npy_descr().len() + tuple
}

/// A `.npy` header's length for a dictionary of `dict` bytes: the magic (6), the version (2),
/// the header's length (2), the dictionary, padding and '\n'.
fn npy_total(dict: usize) -> usize {
    round_up(10 + dict + 1)
}

/// The header of a safetensors file holding `tensors` back to back, in that order: the
/// 8-byte length, then the JSON header padded with spaces (as the format allows) so that the
/// data buffer starts at a multiple of 4096.
pub fn safetensors_header(tensors: &[TensorLayout<'_>]) -> Vec<u8> {
    let mut json = String::from("{");
    let mut offset = 0usize;
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        let end = offset + t.data_len();
        let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            serde_json::to_string(t.name).expect("a string serialises"),
            t.dtype.safetensors(),
            dims.join(","),
        ));
        offset = end;
    }
    json.push('}');
    let total = round_up(8 + json.len());
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&((total - 8) as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(total, b' ');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_exact() {
        let h = npy_header(DType::F32, &[1024, 4]);
        assert_eq!(h.len(), 4096);
        assert_eq!(&h[..6], NPY_MAGIC);
        assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize, 4086);
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 4), }"));
        assert!(text.ends_with(" \n"));
        assert!(npy_header(DType::Bool, &[7])[10..].starts_with(b"{'descr': '|b1'"));
        assert!(
            std::str::from_utf8(&npy_header(DType::I64, &[3])[10..])
                .unwrap()
                .contains("(3,)")
        );
    }

    #[test]
    fn npy_header_len_counts_what_npy_header_formats() {
        let long: Vec<usize> = (0..700).map(|i| 1_000_000 + i).collect();
        let shapes: [&[usize]; 9] = [
            &[],
            &[0],
            &[9],
            &[10],
            &[99, 100],
            &[1024, 4, 1],
            &[usize::MAX],
            &[7, 0, 123_456_789],
            &long,
        ];
        for shape in shapes {
            for dtype in [DType::Bool, DType::F32, DType::I64] {
                let h = npy_header(dtype, shape);
                assert_eq!(npy_header_len(dtype, shape), h.len(), "{dtype:?} {shape:?}");
                let dict = h[10..].iter().position(|&c| c == b'}').unwrap() + 1;
                assert_eq!(npy_dict_len(dtype, shape), dict, "{dtype:?} {shape:?}");
            }
        }
        assert!(
            npy_header_len(DType::F32, &long) > DATA_ALIGN,
            "a header past one page"
        );
    }

    #[test]
    fn safetensors_header_is_aligned_and_valid_json() {
        let tensors = [
            TensorLayout {
                name: "a",
                dtype: DType::F32,
                shape: vec![3, 2],
            },
            TensorLayout {
                name: "b.len",
                dtype: DType::I32,
                shape: vec![3],
            },
            TensorLayout {
                name: "q\"x",
                dtype: DType::U8,
                shape: vec![0],
            },
        ];
        let h = safetensors_header(&tensors);
        assert_eq!(h.len(), 4096);
        let n = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
        assert_eq!(n, 4088);
        let v: serde_json::Value = serde_json::from_slice(&h[8..]).unwrap();
        assert_eq!(v["a"]["data_offsets"], serde_json::json!([0, 24]));
        assert_eq!(v["b.len"]["data_offsets"], serde_json::json!([24, 36]));
        assert_eq!(v["b.len"]["dtype"], "I32");
        assert_eq!(v["q\"x"]["shape"], serde_json::json!([0]));
    }

    #[test]
    fn long_headers_round_up_to_the_next_block() {
        let names: Vec<String> = (0..200)
            .map(|i| format!("column_with_a_long_name_{i}"))
            .collect();
        let tensors: Vec<TensorLayout<'_>> = names
            .iter()
            .map(|n| TensorLayout {
                name: n,
                dtype: DType::F64,
                shape: vec![1024],
            })
            .collect();
        let h = safetensors_header(&tensors);
        assert_eq!(h.len() % 4096, 0);
        assert!(h.len() > 4096);
        serde_json::from_slice::<serde_json::Value>(&h[8..]).unwrap();
    }
}
