//! The Unischema's pickle, never executed: a small stack machine knows the opcodes that build
//! strings, numbers, tuples, dicts and objects, and records an object as its class name,
//! arguments and state. Only classes of Petastorm's own modules, `collections`, NumPy's scalar
//! types and pyspark's types may appear; anything else refuses the dataset.

use anyhow::{Result, anyhow, bail};
use std::collections::HashMap;

/// The value a pickle builds.
pub(super) fn load(pickle: &[u8]) -> Result<Value> {
    Machine {
        b: pickle,
        pos: 0,
        stack: vec![],
        memo: HashMap::new(),
    }
    .run()
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Value {
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
pub(super) fn raw_unicode_escape(line: &[u8]) -> Result<String> {
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
pub(super) fn string_literal(line: &[u8]) -> Result<String> {
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
