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

use crate::model::dtype::DType;
use crate::source::whole_file_footer;
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::HashMap;
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

// The pickle machine ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    /// A class or function named by module and name (never looked up).
    Global(String, String),
    /// An object: its class, the arguments it was made with, its state and its items (an
    /// OrderedDict's).
    Object {
        class: Box<Value>,
        args: Vec<Value>,
        state: Box<Value>,
        items: Vec<(Value, Value)>,
    },
    Mark,
}

/// Classes a Unischema may name; no other global is accepted.
fn allowed_global(module: &str, name: &str) -> bool {
    match module {
        "petastorm.unischema" => matches!(name, "Unischema" | "UnischemaField"),
        "petastorm.codecs" => matches!(
            name,
            "ScalarCodec" | "NdarrayCodec" | "CompressedNdarrayCodec" | "CompressedImageCodec"
        ),
        "collections" => name == "OrderedDict",
        // A field's dtype may be `Decimal` (refused by its column's type, never called).
        "decimal" => name == "Decimal",
        "numpy" | "numpy.core.multiarray" => true,
        "pyspark.sql.types" => name.ends_with("Type"),
        "copy_reg" | "copyreg" => name == "_reconstructor",
        // Protocol 0 (Python 2's cPickle default) rebuilds objects through
        // `copy_reg._reconstructor(cls, object or tuple, args)`.
        "__builtin__" | "builtins" => matches!(name, "object" | "tuple"),
        _ => false,
    }
}

struct Machine<'a> {
    b: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    memo: HashMap<u32, Value>,
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| anyhow!("the pickle ends inside an opcode"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64> {
        Ok(self
            .take(n)?
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | b as u64))
    }

    fn text(&mut self, n: usize) -> Result<String> {
        Ok(String::from_utf8(self.take(n)?.to_vec())?)
    }

    fn raw_line(&mut self) -> Result<&[u8]> {
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| anyhow!("the pickle ends inside a line"))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    fn line(&mut self) -> Result<String> {
        Ok(String::from_utf8(self.raw_line()?.to_vec())?)
    }

    fn pop(&mut self) -> Result<Value> {
        self.stack
            .pop()
            .ok_or_else(|| anyhow!("the pickle pops an empty stack"))
    }

    /// The values above the topmost mark, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>> {
        let at = self
            .stack
            .iter()
            .rposition(|v| *v == Value::Mark)
            .ok_or_else(|| anyhow!("the pickle has no mark"))?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items)
    }

    fn top(&mut self) -> Result<&mut Value> {
        self.stack
            .last_mut()
            .ok_or_else(|| anyhow!("the pickle's stack is empty"))
    }

    fn global(&mut self, module: String, name: String) -> Result<()> {
        if !allowed_global(&module, &name) {
            bail!("the Unischema pickle names {module}.{name}, which tensorfs does not read");
        }
        self.stack.push(Value::Global(module, name));
        Ok(())
    }

    fn set_items(&mut self, pairs: Vec<(Value, Value)>) -> Result<()> {
        match self.top()? {
            Value::Dict(d) => d.extend(pairs),
            Value::Object { items, .. } => items.extend(pairs),
            _ => bail!("the pickle sets items of something that is not a dict"),
        }
        Ok(())
    }

    fn run(mut self) -> Result<Value> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?;
                }
                0x95 => {
                    self.take(8)?;
                }
                b'.' => return self.pop(),
                b'(' => self.stack.push(Value::Mark),
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'K' => {
                    let v = self.u8()? as i64;
                    self.stack.push(Value::Int(v));
                }
                b'M' => {
                    let v = self.le(2)? as i64;
                    self.stack.push(Value::Int(v));
                }
                b'J' => {
                    let v = self.le(4)? as u32 as i32 as i64;
                    self.stack.push(Value::Int(v));
                }
                b'I' => {
                    let line = self.line()?;
                    let v = match line.as_str() {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        s => Value::Int(s.parse()?),
                    };
                    self.stack.push(v);
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let s = self.text(n)?;
                    self.stack.push(Value::Str(s));
                }
                b'X' => {
                    let n = self.le(4)? as usize;
                    let s = self.text(n)?;
                    self.stack.push(Value::Str(s));
                }
                0x8d => {
                    let n = self.le(8)? as usize;
                    let s = self.text(n)?;
                    self.stack.push(Value::Str(s));
                }
                b'U' => {
                    let n = self.u8()? as usize;
                    let s = self.text(n)?;
                    self.stack.push(Value::Str(s));
                }
                b'T' => {
                    let n = self.le(4)? as usize;
                    let s = self.text(n)?;
                    self.stack.push(Value::Str(s));
                }
                0x94 => {
                    let v = self.top()?.clone();
                    let k = self.memo.len() as u32;
                    self.memo.insert(k, v);
                }
                b'q' | b'r' => {
                    let k = if op == b'q' {
                        self.u8()? as u32
                    } else {
                        self.le(4)? as u32
                    };
                    let v = self.top()?.clone();
                    self.memo.insert(k, v);
                }
                b'p' => {
                    let k: u32 = self.line()?.parse()?;
                    let v = self.top()?.clone();
                    self.memo.insert(k, v);
                }
                b'h' | b'j' | b'g' => {
                    let k = match op {
                        b'h' => self.u8()? as u32,
                        b'j' => self.le(4)? as u32,
                        _ => self.line()?.parse()?,
                    };
                    let v = self
                        .memo
                        .get(&k)
                        .cloned()
                        .ok_or_else(|| anyhow!("the pickle reads memo {k}, never written"))?;
                    self.stack.push(v);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.global(m, n)?,
                        _ => bail!("the pickle names a class by something not a string"),
                    }
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.global(module, name)?;
                }
                b')' => self.stack.push(Value::Tuple(vec![])),
                b']' => self.stack.push(Value::List(vec![])),
                b'}' => self.stack.push(Value::Dict(vec![])),
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        bail!("the pickle makes a tuple of missing values");
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(items));
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(items));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::List(items));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = pairs(items)?;
                    self.stack.push(Value::Dict(pairs));
                }
                b'a' => {
                    let v = self.pop()?;
                    match self.top()? {
                        Value::List(l) => l.push(v),
                        _ => bail!("the pickle appends to something that is not a list"),
                    }
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::List(l) => l.extend(items),
                        _ => bail!("the pickle appends to something that is not a list"),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![(k, v)])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let pairs = pairs(items)?;
                    self.set_items(pairs)?;
                }
                0x81 | b'R' => {
                    let args = match self.pop()? {
                        Value::Tuple(a) => a,
                        _ => bail!("the pickle calls a class with arguments not a tuple"),
                    };
                    let class = self.pop()?;
                    let (class, args) = match class {
                        Value::Global(m, n) if n == "_reconstructor" => reconstructed(&m, args)?,
                        Value::Global(..) => (class, args),
                        _ => bail!("the pickle calls something that is not a class"),
                    };
                    self.stack.push(Value::Object {
                        class: Box::new(class),
                        args,
                        state: Box::new(Value::None),
                        items: vec![],
                    });
                }
                b'b' => {
                    let new = self.pop()?;
                    match self.top()? {
                        Value::Object { state, .. } => **state = new,
                        _ => bail!("the pickle sets the state of something that is not an object"),
                    }
                }
                // Protocol 0's text forms, as Python 2's cPickle wrote them by default.
                b'V' => {
                    let s = raw_unicode_escape(self.raw_line()?)?;
                    self.stack.push(Value::Str(s));
                }
                b'S' => {
                    let s = string_literal(self.raw_line()?)?;
                    self.stack.push(Value::Str(s));
                }
                b'L' => {
                    let line = self.line()?;
                    self.stack
                        .push(Value::Int(line.trim_end_matches('L').parse()?));
                }
                b'F' => {
                    let v = self.line()?.parse()?;
                    self.stack.push(Value::Float(v));
                }
                b'G' => {
                    let bits = self.take(8)?.iter().fold(0u64, |a, &b| (a << 8) | b as u64);
                    self.stack.push(Value::Float(f64::from_bits(bits)));
                }
                0x8a => {
                    let n = self.u8()? as usize;
                    if n > 8 {
                        bail!("the pickle holds an integer wider than 64 bits");
                    }
                    let v = self.le(n)?;
                    // Two's complement over n bytes.
                    let v = match n {
                        0 => 0,
                        8 => v as i64,
                        _ => ((v << (64 - 8 * n)) as i64) >> (64 - 8 * n),
                    };
                    self.stack.push(Value::Int(v));
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                }
                _ => bail!(
                    "the Unischema pickle uses opcode 0x{op:02x} at byte {}, which tensorfs does not read",
                    self.pos - 1
                ),
            }
        }
    }
}

/// The class and arguments of `copy_reg._reconstructor(cls, base, arg)`: an object of `cls`
/// made as `base` is from `arg` (a tuple subclass, such as a namedtuple, from its values).
fn reconstructed(module: &str, args: Vec<Value>) -> Result<(Value, Vec<Value>)> {
    debug_assert!(allowed_global(module, "_reconstructor"));
    let mut it = args.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(class @ Value::Global(..)), Some(Value::Global(_, base)), arg) => {
            let args = match (base.as_str(), arg) {
                ("tuple", Some(Value::Tuple(values))) => values,
                _ => vec![],
            };
            Ok((class, args))
        }
        _ => bail!("the pickle reconstructs something that is not a class"),
    }
}

/// A protocol-0 `V` line: raw-unicode-escape, where `\uXXXX` and `\UXXXXXXXX` are escapes and
/// every other byte is a Latin-1 character.
fn raw_unicode_escape(line: &[u8]) -> Result<String> {
    let mut out = String::new();
    let mut i = 0;
    while i < line.len() {
        let width = match (line[i], line.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            (b, _) => {
                out.push(b as char);
                i += 1;
                continue;
            }
        };
        let hex = line
            .get(i + 2..i + 2 + width)
            .ok_or_else(|| anyhow!("the pickle ends inside a unicode escape"))?;
        let code = u32::from_str_radix(std::str::from_utf8(hex)?, 16)?;
        out.push(char::from_u32(code).ok_or_else(|| anyhow!("the pickle escapes no character"))?);
        i += 2 + width;
    }
    Ok(out)
}

/// A protocol-0 `S` line: a Python 2 string literal in quotes, with backslash escapes. Its bytes
/// are read as UTF-8 where they are valid, else as Latin-1.
fn string_literal(line: &[u8]) -> Result<String> {
    let inner = match line {
        [q @ (b'\'' | b'"'), inner @ .., last] if last == q => inner,
        _ => bail!("the pickle holds a string without its quotes"),
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut it = inner.iter().copied();
    while let Some(b) = it.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        let e = it
            .next()
            .ok_or_else(|| anyhow!("the pickle's string ends in a backslash"))?;
        bytes.push(match e {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'0' => 0,
            b'x' => {
                let hex = [it.next(), it.next()];
                let [Some(h), Some(l)] = hex else {
                    bail!("the pickle's string ends inside an escape");
                };
                u8::from_str_radix(std::str::from_utf8(&[h, l])?, 16)?
            }
            other => other,
        });
    }
    Ok(String::from_utf8(bytes)
        .unwrap_or_else(|e| e.into_bytes().iter().map(|&b| b as char).collect()))
}

fn pairs(items: Vec<Value>) -> Result<Vec<(Value, Value)>> {
    if !items.len().is_multiple_of(2) {
        bail!("the pickle sets a key without a value");
    }
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
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
    let root = Machine {
        b: pickle,
        pos: 0,
        stack: vec![],
        memo: HashMap::new(),
    }
    .run()?;
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

// Cells ----------------------------------------------------------------------------------------

/// A decoded cell: its dtype, shape and little-endian C-order bytes.
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<u8>,
}

/// A `.npy` file's array.
pub(crate) fn decode_npy(b: &[u8]) -> Result<Cell> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        bail!("not a .npy cell");
    }
    let (header_len, at) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes(b[8..12].try_into()?) as usize, 12),
        v => bail!(".npy version {v} is not read"),
    };
    let header = std::str::from_utf8(
        b.get(at..at + header_len)
            .ok_or_else(|| anyhow!("a .npy header runs past the cell"))?,
    )?;
    let descr = quoted_after(header, "'descr'").ok_or_else(|| anyhow!("no descr in a .npy"))?;
    let fortran = header
        .split("'fortran_order'")
        .nth(1)
        .is_some_and(|s| s.trim_start_matches([':', ' ']).starts_with("True"));
    let shape_text = header
        .split("'shape'")
        .nth(1)
        .and_then(|s| s.split_once('(').map(|(_, r)| r))
        .and_then(|s| s.split_once(')').map(|(l, _)| l))
        .ok_or_else(|| anyhow!("no shape in a .npy"))?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<_, _>>()?;
    // The byte order, then the kind: a descr too short (or not ASCII) for that is no dtype.
    let Some((order, kind)) = descr.split_at_checked(1) else {
        bail!("a .npy of dtype '{descr}', which has no tensor mapping");
    };
    let dtype = match kind {
        "b1" => DType::Bool,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        _ => bail!("a .npy of dtype '{descr}', which has no tensor mapping"),
    };
    let size = dtype.size();
    // Sizes from the header are checked: a header claiming more elements than a usize holds
    // is a short cell, never a wrapped length.
    let end = (shape.iter())
        .try_fold(size, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_add(at + header_len));
    let Some(end) = end else {
        bail!("a .npy cell's shape {shape:?} is too large");
    };
    let data = b
        .get(at + header_len..end)
        .ok_or_else(|| anyhow!("a .npy cell is shorter than its shape"))?;
    let mut data = data.to_vec();
    if order == ">" && size > 1 {
        for e in data.chunks_exact_mut(size) {
            e.reverse();
        }
    }
    if fortran && shape.len() > 1 {
        data = fortran_to_c(&data, &shape, size);
    }
    Ok(Cell { dtype, shape, data })
}

fn quoted_after<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let rest = header.split(key).nth(1)?;
    let rest = rest.split_once('\'')?.1;
    Some(rest.split_once('\'')?.0)
}

/// Reorders column-major elements into row-major order.
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let mut out = vec![0; data.len()];
    let mut idx = vec![0usize; shape.len()];
    for c in 0..n {
        // idx: the C-order multi-index of element c; its Fortran offset is sum idx[k] * stride_f[k].
        let mut f = 0;
        let mut stride = 1;
        for (k, &d) in shape.iter().enumerate() {
            f += idx[k] * stride;
            stride *= d;
        }
        out[c * size..(c + 1) * size].copy_from_slice(&data[f * size..(f + 1) * size]);
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

/// An `.npz` cell's `arr` member (or its only member).
pub(crate) fn decode_npz(b: &[u8]) -> Result<Cell> {
    use std::io::Read;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(b)).context("not a zip cell")?;
    let index = zip.index_for_name("arr.npy").unwrap_or(0);
    let mut member = zip.by_index(index).context("the zip cell has no member")?;
    let mut npy = Vec::with_capacity(member.size() as usize);
    member.read_to_end(&mut npy)?;
    decode_npy(&npy)
}

/// A PNG cell: 8-bit gray `[H, W]` or RGB `[H, W, 3]` (RGBA `[H, W, 4]`), as OpenCV's
/// `IMREAD_UNCHANGED` and Petastorm's channel swap give it.
pub(crate) fn decode_png(b: &[u8]) -> Result<Cell> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(b));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().context("not a PNG cell")?;
    let mut buf = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let info = reader
        .next_frame(&mut buf)
        .context("a PNG cell cannot be decoded")?;
    buf.truncate(info.buffer_size());
    let (h, w) = (info.height as usize, info.width as usize);
    let (channels, dtype) = match (info.color_type, info.bit_depth) {
        (png::ColorType::Grayscale, png::BitDepth::Eight) => (1, DType::U8),
        (png::ColorType::Rgb, png::BitDepth::Eight) => (3, DType::U8),
        (png::ColorType::Rgba, png::BitDepth::Eight) => (4, DType::U8),
        (png::ColorType::Grayscale, png::BitDepth::Sixteen) => (1, DType::U16),
        (png::ColorType::Rgb, png::BitDepth::Sixteen) => (3, DType::U16),
        (c, d) => bail!("a PNG cell of {c:?} at {d:?} bits, which has no tensor mapping"),
    };
    if dtype == DType::U16 {
        // PNG stores samples big-endian; tensors are little-endian.
        for e in buf.chunks_exact_mut(2) {
            e.swap(0, 1);
        }
    }
    let shape = if channels == 1 {
        vec![h, w]
    } else {
        vec![h, w, channels]
    };
    Ok(Cell {
        dtype,
        shape,
        data: buf,
    })
}

/// A JPEG cell, decoded by libjpeg-turbo's decoder (as MozJPEG carries it, built from source
/// by its crate): gray `[H, W]` or RGB `[H, W, 3]`, with libjpeg's defaults (the accurate
/// integer IDCT, fancy upsampling), as OpenCV decodes for Petastorm. A malformed cell is an
/// error: libjpeg's fatal errors unwind out of the decoder and are caught here.
pub(crate) fn decode_jpeg(b: &[u8]) -> Result<Cell> {
    let decode = || -> std::io::Result<Cell> {
        let d = mozjpeg::Decompress::new_mem(b)?;
        let gray = d.color_space() == mozjpeg::ColorSpace::JCS_GRAYSCALE;
        let mut image = match gray {
            true => d.grayscale()?,
            false => d.rgb()?,
        };
        let (h, w, channels) = (image.height(), image.width(), if gray { 1 } else { 3 });
        let data = image.read_scanlines::<u8>()?;
        image.finish()?;
        if data.len() != h * w * channels {
            return Err(std::io::Error::other(format!(
                "{} of its {} bytes of pixels decoded",
                data.len(),
                h * w * channels
            )));
        }
        let shape = match channels {
            1 => vec![h, w],
            _ => vec![h, w, channels],
        };
        Ok(Cell {
            dtype: DType::U8,
            shape,
            data,
        })
    };
    match crate::catch_panic(decode) {
        Ok(Ok(cell)) => Ok(cell),
        Ok(Err(e)) => Err(anyhow!("a JPEG cell cannot be decoded: {e}")),
        Err(why) => Err(anyhow!("a JPEG cell cannot be decoded: {why}")),
    }
}

/// Decodes a cell of `field` into its tensor's row bytes, checking it against the Unischema.
pub(crate) fn decode_cell(field: &Field, codec: Codec, cell: &[u8]) -> Result<Vec<u8>> {
    let decoded = match codec {
        Codec::Ndarray => decode_npy(cell)?,
        Codec::CompressedNdarray => decode_npz(cell)?,
        Codec::Png => decode_png(cell)?,
        Codec::Jpeg => decode_jpeg(cell)?,
        Codec::Scalar => bail!("a scalar field has no cells"),
    };
    let want_shape = field.fixed_shape().unwrap_or_default();
    if Some(decoded.dtype) != field.dtype || decoded.shape != want_shape {
        let dims: Vec<String> = decoded.shape.iter().map(|d| d.to_string()).collect();
        bail!(
            "the cell is {} ({}) where the Unischema says {} {}",
            decoded.dtype.name(),
            dims.join(", "),
            field.numpy,
            field.shape_text()
        );
    }
    Ok(decoded.data)
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
