//! Datasets written by Petastorm: the Unischema its `materialize_dataset` stores in the
//! dataset's `_common_metadata`, read without running it, and the cells its codecs wrote,
//! decoded into tensors equal to what Petastorm's `make_reader` returns.
//!
//! The Unischema is a Python pickle. It is never executed: a small stack machine knows the
//! opcodes that build strings, numbers, tuples, dicts and objects, and records an object as its
//! class name, arguments and state. Only classes of Petastorm's own modules, `collections`,
//! NumPy's scalar types and pyspark's types may appear; anything else refuses the dataset.
//!
//! Cells: `NdarrayCodec` is one `.npy` file; `CompressedNdarrayCodec` a zip holding `arr.npy`;
//! `CompressedImageCodec` a PNG or JPEG that OpenCV wrote from RGB pixels (Petastorm swaps them
//! to BGR for OpenCV, which stores them as RGB; `make_reader` swaps OpenCV's BGR back), so a
//! standard decoder's RGB output is what `make_reader` returns. JPEG goes through the system
//! libjpeg-turbo, the decoder OpenCV uses, so pixels are equal, not merely close.

mod codecs;
mod pickle;

use crate::model::dtype::DType;
use crate::source::whole_file_footer;
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
pub(crate) use codecs::{decode_cell, decode_jpeg, decode_npy, decode_npz, decode_png};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use pickle::Value;
use std::sync::Arc;

/// The key of `_common_metadata`'s key-value metadata that holds the pickled Unischema.
pub(crate) const UNISCHEMA_KEY: &str = "dataset-toolkit.unischema.v1";
/// The metadata file Petastorm writes beside the data.
pub(crate) const COMMON_METADATA: &str = "_common_metadata";

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Codec {
    /// A plain Parquet column, served in the Unischema's dtype.
    Scalar,
    /// One `.npy` per cell.
    Ndarray,
    /// A zip of one `.npy` per cell.
    CompressedNdarray,
    Png,
    Jpeg,
}

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::Scalar => "ScalarCodec",
            Codec::Ndarray => "NdarrayCodec",
            Codec::CompressedNdarray => "CompressedNdarrayCodec",
            Codec::Png => "CompressedImageCodec(png)",
            Codec::Jpeg => "CompressedImageCodec(jpeg)",
        }
    }

    /// Whether the column holds encoded cells (binary) rather than values.
    pub fn is_cell(self) -> bool {
        self != Codec::Scalar
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Field {
    pub(crate) name: String,
    /// NumPy's name of the dtype (`uint8`, `str_`, …).
    pub(crate) numpy: String,
    /// The dtype, where tensorfs serves it.
    pub(crate) dtype: Option<DType>,
    /// `None` dimensions vary from row to row.
    pub(crate) shape: Vec<Option<usize>>,
    pub codec: Codec,
    pub(crate) nullable: bool,
}

impl Field {
    /// The fixed shape of one row, if the Unischema fixes it.
    pub(crate) fn fixed_shape(&self) -> Option<Vec<usize>> {
        self.shape.iter().copied().collect()
    }

    pub(crate) fn shape_text(&self) -> String {
        let dims: Vec<String> = self
            .shape
            .iter()
            .map(|d| d.map_or("None".into(), |n| n.to_string()))
            .collect();
        match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Unischema {
    pub name: String,
    pub fields: Vec<Field>,
    /// Made from the cells themselves (no Unischema was stored): each field's codec, dtype and
    /// shape are those of its first cell.
    pub inferred: bool,
}

impl Unischema {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// NumPy's dtype of a name: a type's (`float32`) or a type code (`f4`, `<f4`, `|u1`), as a
/// Unischema built with `np.dtype('f4')` stores it. Big-endian codes have no tensor mapping.
fn numpy_dtype(name: &str) -> Option<DType> {
    let code = name.trim_start_matches(['<', '=', '|']);
    let name = match code {
        "b1" | "?" => "bool",
        "i1" | "b" => "int8",
        "i2" | "h" => "int16",
        "i4" | "i" => "int32",
        "i8" | "l" | "q" => "int64",
        "u1" | "B" => "uint8",
        "u2" | "H" => "uint16",
        "u4" | "I" => "uint32",
        "u8" | "L" | "Q" => "uint64",
        "f2" | "e" => "float16",
        "f4" | "f" => "float32",
        "f8" | "d" => "float64",
        _ if name.starts_with('>') => return None,
        _ => name,
    };
    Some(match name {
        "bool_" | "bool" => DType::Bool,
        "int8" => DType::I8,
        "int16" => DType::I16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "float16" => DType::F16,
        "float32" => DType::F32,
        "float64" => DType::F64,
        _ => return None,
    })
}

fn class_name(v: &Value) -> Option<(&str, &str)> {
    match v {
        Value::Object { class, .. } => match class.as_ref() {
            Value::Global(m, n) => Some((m.as_str(), n.as_str())),
            _ => None,
        },
        _ => None,
    }
}

/// A key of an object's state dict.
fn state_get<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    let Value::Object { state, .. } = v else {
        return None;
    };
    match state.as_ref() {
        Value::Dict(d) => d
            .iter()
            .find(|(k, _)| *k == Value::Str(key.into()))
            .map(|(_, v)| v),
        // (state, slotstate) as BUILD may get it.
        Value::Tuple(t) if !t.is_empty() => {
            let Value::Dict(d) = &t[0] else { return None };
            d.iter()
                .find(|(k, _)| *k == Value::Str(key.into()))
                .map(|(_, v)| v)
        }
        _ => None,
    }
}

fn parse_field(v: &Value) -> Result<Field> {
    if class_name(v) != Some(("petastorm.unischema", "UnischemaField")) {
        bail!("a Unischema field is not a UnischemaField");
    }
    let Value::Object { args, .. } = v else {
        unreachable!()
    };
    let [name, dtype, shape, codec, rest @ ..] = args.as_slice() else {
        bail!("a UnischemaField has {} values, not 5", args.len());
    };
    let Value::Str(name) = name else {
        bail!("a UnischemaField's name is not a string");
    };
    let numpy = match dtype {
        Value::Global(_, n) => n.clone(),
        Value::Object { args, .. } => match args.first() {
            // numpy.dtype('float32', …)
            Some(Value::Str(s)) => s.clone(),
            _ => bail!("field '{name}': its dtype is not a NumPy type"),
        },
        _ => bail!("field '{name}': its dtype is not a NumPy type"),
    };
    let shape = match shape {
        Value::Tuple(dims) => dims
            .iter()
            .map(|d| match d {
                Value::Int(n) if *n >= 0 => Ok(Some(*n as usize)),
                Value::None => Ok(None),
                _ => bail!("field '{name}': its shape holds something not a size"),
            })
            .collect::<Result<Vec<_>>>()?,
        _ => bail!("field '{name}': its shape is not a tuple"),
    };
    let codec = match class_name(codec) {
        Some(("petastorm.codecs", "ScalarCodec")) => Codec::Scalar,
        Some(("petastorm.codecs", "NdarrayCodec")) => Codec::Ndarray,
        Some(("petastorm.codecs", "CompressedNdarrayCodec")) => Codec::CompressedNdarray,
        Some(("petastorm.codecs", "CompressedImageCodec")) => {
            // Petastorm before 0.3 kept the format in `_format`.
            let format = state_get(codec, "_image_codec").or_else(|| state_get(codec, "_format"));
            match format {
                Some(Value::Str(s)) if s.trim_start_matches('.') == "png" => Codec::Png,
                Some(Value::Str(s)) if matches!(s.trim_start_matches('.'), "jpeg" | "jpg") => {
                    Codec::Jpeg
                }
                _ => bail!("field '{name}': an image codec of a format tensorfs does not read"),
            }
        }
        // No codec: a NumPy scalar, as make_reader returns it.
        None if *codec == Value::None => Codec::Scalar,
        _ => bail!("field '{name}': a codec tensorfs does not read"),
    };
    let nullable = matches!(rest.first(), Some(Value::Bool(true)));
    Ok(Field {
        name: name.clone(),
        dtype: numpy_dtype(&numpy),
        numpy,
        shape,
        codec,
        nullable,
    })
}

/// The values of a dict or an `OrderedDict`, in order. Python 3 pickles an `OrderedDict`'s
/// items as set items; Python 2 as its one argument, a list of `[key, value]` lists.
fn ordered_values(v: &Value) -> Option<Vec<&Value>> {
    match v {
        Value::Dict(d) => Some(d.iter().map(|(_, v)| v).collect()),
        Value::Object { items, .. } if !items.is_empty() => {
            Some(items.iter().map(|(_, v)| v).collect())
        }
        Value::Object { args, .. } => match args.as_slice() {
            [] => Some(vec![]),
            [Value::List(pairs)] => pairs
                .iter()
                .map(|p| match p {
                    Value::List(kv) | Value::Tuple(kv) if kv.len() == 2 => Some(&kv[1]),
                    _ => None,
                })
                .collect(),
            _ => None,
        },
        _ => None,
    }
}

/// The Unischema a pickle holds.
pub(crate) fn parse_unischema(pickle: &[u8]) -> Result<Unischema> {
    let root = pickle::load(pickle)?;
    if class_name(&root) != Some(("petastorm.unischema", "Unischema")) {
        bail!("the stored schema is not a Petastorm Unischema");
    }
    let name = match state_get(&root, "_name") {
        Some(Value::Str(s)) => s.clone(),
        _ => String::new(),
    };
    let fields = match state_get(&root, "_fields") {
        Some(v) => ordered_values(v),
        None => None,
    };
    let fields = fields
        .ok_or_else(|| anyhow!("the Unischema has no fields"))?
        .into_iter()
        .map(parse_field)
        .collect::<Result<Vec<_>>>()?;
    Ok(Unischema {
        name,
        fields,
        inferred: false,
    })
}

/// A field as its first cell shows it, where the cell is one a Petastorm codec writes (a
/// `.npy`, a zip of one, a PNG or a JPEG): for datasets without a stored Unischema.
pub(crate) fn infer_field(name: &str, nullable: bool, cell: &[u8]) -> Option<Field> {
    let (codec, decoded) = if cell.starts_with(b"\x93NUMPY") {
        (Codec::Ndarray, decode_npy(cell))
    } else if cell.starts_with(b"PK\x03\x04") {
        (Codec::CompressedNdarray, decode_npz(cell))
    } else if cell.starts_with(b"\x89PNG") {
        (Codec::Png, decode_png(cell))
    } else if cell.starts_with(b"\xff\xd8\xff") {
        (Codec::Jpeg, decode_jpeg(cell))
    } else {
        return None;
    };
    let decoded = decoded.ok()?;
    Some(Field {
        name: name.to_string(),
        numpy: decoded.dtype.name().to_string(),
        dtype: Some(decoded.dtype),
        shape: decoded.shape.into_iter().map(Some).collect(),
        codec,
        nullable,
    })
}

impl crate::source::Source {
    /// Where no Unischema was stored, the one the cells show, if they show one.
    pub(crate) async fn infer_unischema_if_none(&mut self) {
        if self.unischema.is_none() {
            self.unischema = self.infer_unischema().await;
        }
    }

    /// Without a stored Unischema, binary columns whose first cell is one a Petastorm codec
    /// writes (`.npy`, zip, PNG, JPEG) are read as such, with that cell's dtype and shape.
    async fn infer_unischema(&self) -> Option<crate::source::petastorm::Unischema> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::DataType;
        let schema = self.schema.clone();
        let binary: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| {
                matches!(
                    schema.field(i).data_type(),
                    DataType::Binary | DataType::LargeBinary
                )
            })
            .collect();
        if binary.is_empty() {
            return None;
        }
        let (file, rg) = self.files.iter().enumerate().find_map(|(fi, f)| {
            let rg = f.rg_rows.iter().position(|&rows| rows > 0)?;
            Some((fi, rg))
        })?;
        let batch = self.read_row_group(file, rg, &binary).await.ok()?;
        let fields: Vec<_> = binary
            .iter()
            .enumerate()
            .filter_map(|(c, &i)| {
                let column = batch.column(c);
                let row = (0..column.len()).find(|&r| column.is_valid(r))?;
                let cell = match column.data_type() {
                    DataType::LargeBinary => column.as_binary::<i64>().value(row),
                    _ => column.as_binary::<i32>().value(row),
                };
                let f = schema.field(i);
                crate::source::petastorm::infer_field(f.name(), f.is_nullable(), cell)
            })
            .collect();
        (!fields.is_empty()).then(|| crate::source::petastorm::Unischema {
            name: String::new(),
            fields,
            inferred: true,
        })
    }
}

/// The Unischema in `_common_metadata` under `prefix`, where Petastorm wrote one.
pub(crate) async fn read_unischema(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    stats: &Stats,
) -> Result<Option<crate::source::petastorm::Unischema>> {
    use crate::source::petastorm::{COMMON_METADATA, UNISCHEMA_KEY, parse_unischema};
    let path = prefix.clone().join(COMMON_METADATA);
    let bytes = match store.get(&path).await {
        Ok(r) => r.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => bail!("'{path}' cannot be read: {e}"),
    };
    Stats::add(&stats.c.remote_requests, 1);
    Stats::add(&stats.c.remote_bytes, bytes.len() as u64);
    let footer = whole_file_footer(&bytes).with_context(|| format!("'{path}'"))?;
    let metadata = &footer[..footer.len() - 8];
    let Some(pickle) = crate::source::footer::key_value(metadata, UNISCHEMA_KEY)
        .with_context(|| format!("'{path}' is not a readable Parquet metadata file"))?
    else {
        return Ok(None);
    };
    let unischema = parse_unischema(&pickle)
        .with_context(|| format!("the Petastorm Unischema in '{path}' cannot be read"))?;
    Ok(Some(unischema))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pickle::{raw_unicode_escape, string_literal};
    use proptest::prelude::*;

    /// A `.npy` of `data` behind a header giving `shape` as its text.
    fn npy(shape: &str, data: &[u8]) -> Vec<u8> {
        let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape}), }}");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        b.extend(data);
        b
    }

    proptest! {
        #[test]
        fn npy_shapes_past_the_cell_are_errors_not_wrapped_lengths(
            dims in prop::collection::vec(any::<u64>(), 1..5),
            data in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let shape: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            let b = npy(&shape.join(", "), &data);
            let started = std::time::Instant::now();
            match decode_npy(&b) {
                Ok(cell) => prop_assert_eq!(cell.data.len(), cell.shape.iter().product::<usize>() * 4),
                Err(e) => prop_assert!(e.to_string().contains("shape") || e.to_string().contains("short"), "{}", e),
            }
            prop_assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
    }

    /// Found by `fuzz/`'s `npy` target: a descr of no characters (or one not starting with an
    /// ASCII byte-order mark) was split at its first byte and panicked.
    #[test]
    fn a_descr_too_short_for_a_byte_order_is_an_error() {
        for descr in ["", "é4", "<"] {
            let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2,), }}");
            let mut b = b"\x93NUMPY\x01\x00".to_vec();
            b.extend((header.len() as u16).to_le_bytes());
            b.extend(header.as_bytes());
            b.extend([0; 8]);
            let e = decode_npy(&b).unwrap_err();
            assert!(
                e.to_string().contains("no tensor mapping"),
                "{descr:?}: {e}"
            );
        }
    }

    #[test]
    fn a_shape_of_more_elements_than_memory_is_refused() {
        let e = decode_npy(&npy("4611686018427387904, 8", &[0; 16])).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
    }

    /// A JPEG written by MozJPEG's encoder: gray 16 × 8, a ramp.
    fn jpeg(gray: bool) -> Vec<u8> {
        let space = match gray {
            true => mozjpeg::ColorSpace::JCS_GRAYSCALE,
            false => mozjpeg::ColorSpace::JCS_RGB,
        };
        let channels = if gray { 1 } else { 3 };
        let mut c = mozjpeg::Compress::new(space);
        c.set_size(16, 8);
        let mut started = c.start_compress(Vec::new()).unwrap();
        let pixels: Vec<u8> = (0..16 * 8 * channels).map(|i| (i * 2) as u8).collect();
        started.write_scanlines(&pixels).unwrap();
        started.finish().unwrap()
    }

    #[test]
    fn jpeg_cells_decode_to_their_shape_and_bad_ones_are_errors() {
        let cell = decode_jpeg(&jpeg(true)).unwrap();
        assert_eq!((cell.shape.clone(), cell.data.len()), (vec![8, 16], 128));
        let cell = decode_jpeg(&jpeg(false)).unwrap();
        assert_eq!((cell.shape.clone(), cell.data.len()), (vec![8, 16, 3], 384));
        for bad in [&b"not a jpeg"[..], &jpeg(false)[..40], &[0xff, 0xd8][..]] {
            let Err(e) = decode_jpeg(bad) else {
                panic!("{} bytes decoded", bad.len());
            };
            assert!(
                e.to_string().contains("a JPEG cell cannot be decoded"),
                "{e}"
            );
        }
    }

    #[test]
    fn npy_cells_decode_in_c_order_little_endian() {
        // np.save of np.arange(6, dtype='>i2').reshape(2, 3, order='F')
        let header = "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3), }";
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let padded = format!("{header:<117}\n");
        b.extend((padded.len() as u16).to_le_bytes());
        b.extend(padded.as_bytes());
        // Fortran order of [[0, 1, 2], [3, 4, 5]]: 0, 3, 1, 4, 2, 5, big-endian.
        for v in [0i16, 3, 1, 4, 2, 5] {
            b.extend(v.to_be_bytes());
        }
        let cell = decode_npy(&b).unwrap();
        assert_eq!(cell.dtype, DType::I16);
        assert_eq!(cell.shape, vec![2, 3]);
        let got: Vec<i16> = cell
            .data
            .chunks(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn unischemas_of_older_petastorm_versions_are_read() {
        // tests/fixtures/petastorm/pickles/make.py wrote these; see there for what each is.
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/petastorm/pickles"
        );
        for name in ["protocol0", "protocol0-py2", "protocol2"] {
            let b = std::fs::read(format!("{dir}/{name}.pickle")).unwrap();
            let u = parse_unischema(&b).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(u.name, "Old", "{name}");
            let got: Vec<_> = u
                .fields
                .iter()
                .map(|f| {
                    (
                        f.name.as_str(),
                        f.numpy.as_str(),
                        f.dtype,
                        f.codec,
                        f.nullable,
                    )
                })
                .collect();
            let want = vec![
                ("id", "int32", Some(DType::I32), Codec::Scalar, false),
                ("image", "uint8", Some(DType::U8), Codec::Png, false),
                ("photo", "uint8", Some(DType::U8), Codec::Jpeg, false),
                ("emb", "f4", Some(DType::F32), Codec::Ndarray, true),
                ("price", "Decimal", None, Codec::Scalar, false),
            ];
            assert_eq!(got, want, "{name}");
            let shapes: Vec<_> = u.fields.iter().map(Field::shape_text).collect();
            assert_eq!(
                shapes,
                ["()", "(4, 5, 3)", "(6, 7)", "(3,)", "()"],
                "{name}"
            );
        }
    }

    #[test]
    fn protocol_zero_text_forms() {
        assert_eq!(
            raw_unicode_escape(b"a\\u00e9\\U0001f600\xe9").unwrap(),
            "a\u{e9}\u{1f600}\u{e9}"
        );
        assert_eq!(string_literal(b"'it\\'s\\n\\x41'").unwrap(), "it's\nA");
        assert_eq!(string_literal(b"\"caf\xc3\xa9\"").unwrap(), "caf\u{e9}");
        assert!(string_literal(b"'open").is_err());
    }

    #[test]
    fn foreign_pickles_are_refused_without_running_them() {
        // pickle.dumps(os.system) at protocol 4: a global outside the allowed modules.
        let b = b"\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
        let e = parse_unischema(b).unwrap_err().to_string();
        assert!(e.contains("posix.system"), "{e}");
        assert!(parse_unischema(b"\x80\x04K\x01.").is_err());
        for n in 0..b.len() {
            assert!(parse_unischema(&b[..n]).is_err());
        }
    }
}
