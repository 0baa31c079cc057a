//! The tensor view: which tensors a dataset shows under the mount options, and what it refuses.
//!
//! Columns map to features (a column, a stack of columns, or a padded list column); a feature gives
//! one tensor, plus `NAME.len` for a padded list and `NAME.mask` when nulls are zero-filled.
//! Everything a mount would refuse is found here, before anything is mounted.

use crate::model::dtype::DType;
use crate::model::plan::Plan;
use crate::options::{Nulls, Options};
use crate::source::Source;
use crate::source::catalog::NullFact;
use anyhow::Result;
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Schema, TimeUnit};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeatureKind {
    /// A scalar or fixed-size-list column.
    Column { field: usize },
    /// Scalar columns stacked into `[B, k]`.
    Stack { fields: Vec<usize> },
    /// A variable-length list column zero-padded (or cut) to `len`.
    Pad { field: usize, len: usize },
    /// A column of cells a Petastorm codec encoded (`.npy`, zip, PNG, JPEG), decoded.
    Cell {
        field: usize,
        spec: crate::source::petastorm::Field,
    },
}

#[derive(Clone, Debug)]
pub struct Feature {
    pub name: String,
    pub kind: FeatureKind,
    /// The element type as decoded from Arrow (for a stack, its members' common type).
    pub(crate) source_dtype: DType,
    /// The element type served, after `cast=`.
    pub(crate) dtype: DType,
    /// The shape of one row.
    pub(crate) inner: Vec<usize>,
    /// Whether nulls are zero-filled and a mask tensor is served.
    pub(crate) mask: bool,
    pub(crate) unit: Option<&'static str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Data,
    Len,
    Mask,
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    /// The shape of one row; the batch file's shape is `[rows] + inner`.
    pub(crate) inner: Vec<usize>,
    pub feature: usize,
    pub part: Part,
    pub unit: Option<&'static str>,
}

impl Tensor {
    pub(crate) fn row_bytes(&self) -> usize {
        self.dtype.size() * self.inner.iter().product::<usize>()
    }

    pub fn shape(&self, rows: u64) -> Vec<usize> {
        let mut shape = vec![rows as usize];
        shape.extend(&self.inner);
        shape
    }
}

#[derive(Debug)]
pub struct View {
    pub features: Vec<Feature>,
    pub tensors: Vec<Tensor>,
    /// The Arrow field indices to read, ascending (the order of a projected batch's columns).
    pub(crate) roots: Vec<usize>,
    /// Why a mount would be refused; empty when it would not.
    pub problems: Vec<String>,
    /// The selected columns whose nulls had to be found by reading them: the first file that
    /// holds some, if any (a snapshot records what was found).
    pub(crate) nulls_read: Vec<(usize, Option<String>)>,
}

impl View {
    /// The bytes of one row of every tensor: a batch file's data is `batch_size` times this.
    pub(crate) fn row_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.row_bytes() as u64).sum()
    }

    /// Position of a field among the columns of a projected row group.
    pub(crate) fn column_of(&self, field: usize) -> usize {
        self.roots
            .binary_search(&field)
            .expect("field is projected")
    }

    /// The one line a refused mount prints; `listed`: where the other problems are shown.
    pub fn refusal(&self, listed: &str) -> Option<String> {
        let first = self.problems.first()?;
        Some(match self.problems.len() {
            1 => first.clone(),
            n => format!("{first} (and {} more: {listed})", n - 1),
        })
    }
}

/// What an Arrow type maps to.
enum Mapped {
    /// `[inner]` of `elem` per row.
    Fixed {
        elem: DType,
        inner: Vec<usize>,
        unit: Option<&'static str>,
    },
    /// A variable-length list of scalars.
    List {
        elem: DType,
        unit: Option<&'static str>,
    },
    /// Cells of a Petastorm field, `[inner]` of `elem` each.
    Cell {
        elem: DType,
        inner: Vec<usize>,
        spec: crate::source::petastorm::Field,
    },
    /// A Petastorm field that cannot be served, and why.
    Refused(String),
}

/// How a column maps, under its Petastorm Unischema field where the dataset has one: encoded
/// cells become tensors of the field's dtype and shape; a scalar keeps its column's mapping
/// (and is served in the field's dtype, see [`features`]).
fn map_column(
    field: &arrow::datatypes::Field,
    unischema: Option<&crate::source::petastorm::Unischema>,
) -> Option<Mapped> {
    let spec = unischema.and_then(|u| u.field(field.name()));
    let Some(spec) = spec.filter(|s| s.codec.is_cell()) else {
        return match map_type(field.data_type()) {
            // Parquet stores an empty fixed-size list as a null at the list's level, which
            // neither the statistics nor the reader (arrow-rs) tell from a null row.
            Some(Mapped::Fixed { inner, .. }) if inner.contains(&0) => {
                Some(Mapped::Refused(format!(
                    "column '{}' ({}) has a dimension of 0, which tensorfs does not serve",
                    field.name(),
                    type_name(field.data_type())
                )))
            }
            mapped => mapped,
        };
    };
    let binary = matches!(
        field.data_type(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    );
    let what = format!(
        "field '{}' ({} {} {})",
        spec.name,
        spec.codec.name(),
        spec.numpy,
        spec.shape_text()
    );
    Some(match (binary, spec.dtype, spec.fixed_shape()) {
        (false, ..) => Mapped::Refused(format!(
            "{what} is stored as {}, not as encoded cells",
            type_name(field.data_type())
        )),
        (_, None, _) => Mapped::Refused(format!(
            "{what} has the dtype {}, which has no tensor mapping",
            spec.numpy
        )),
        (_, _, None) => Mapped::Refused(format!(
            "{what} has a variable shape in its Unischema (None is not a fixed size)"
        )),
        (true, Some(elem), Some(inner)) => Mapped::Cell {
            elem,
            inner,
            spec: spec.clone(),
        },
    })
}

fn unit_name(u: &TimeUnit) -> &'static str {
    match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    }
}

fn map_type(dt: &DataType) -> Option<Mapped> {
    let scalar = |elem| {
        Some(Mapped::Fixed {
            elem,
            inner: vec![],
            unit: None,
        })
    };
    let timed = |elem, unit| {
        Some(Mapped::Fixed {
            elem,
            inner: vec![],
            unit: Some(unit),
        })
    };
    match dt {
        DataType::Boolean => scalar(DType::Bool),
        DataType::Int8 => scalar(DType::I8),
        DataType::Int16 => scalar(DType::I16),
        DataType::Int32 => scalar(DType::I32),
        DataType::Int64 => scalar(DType::I64),
        DataType::UInt8 => scalar(DType::U8),
        DataType::UInt16 => scalar(DType::U16),
        DataType::UInt32 => scalar(DType::U32),
        DataType::UInt64 => scalar(DType::U64),
        DataType::Float16 => scalar(DType::F16),
        DataType::Float32 => scalar(DType::F32),
        DataType::Float64 => scalar(DType::F64),
        DataType::Date32 => timed(DType::I32, "D"),
        // Parquet stores dates as days; pyarrow reads a date64 column back as date32 days.
        DataType::Date64 => timed(DType::I32, "D"),
        DataType::Timestamp(u, _) => timed(DType::I64, unit_name(u)),
        DataType::Time32(u) => timed(DType::I32, unit_name(u)),
        DataType::Time64(u) => timed(DType::I64, unit_name(u)),
        DataType::Duration(u) => timed(DType::I64, unit_name(u)),
        DataType::Dictionary(_, values) => match map_type(values)? {
            Mapped::Fixed { elem, inner, unit } if inner.is_empty() => {
                Some(Mapped::Fixed { elem, inner, unit })
            }
            _ => None,
        },
        DataType::FixedSizeList(f, n) => match map_type(f.data_type())? {
            Mapped::Fixed { elem, inner, unit } => {
                let mut shape = vec![*n as usize];
                shape.extend(inner);
                Some(Mapped::Fixed {
                    elem,
                    inner: shape,
                    unit,
                })
            }
            _ => None,
        },
        DataType::List(f) | DataType::LargeList(f) => match map_type(f.data_type())? {
            Mapped::Fixed { elem, inner, unit } if inner.is_empty() => {
                Some(Mapped::List { elem, unit })
            }
            _ => None,
        },
        _ => None,
    }
}

/// A tensor's name is a file name with `.npy` after it, which the kernel takes up to 255 bytes.
fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && name.len() + ".npy".len() <= 255
}

/// Whether an array holds nulls that would be served: for a list, null elements (a null or
/// empty list is just length 0).
pub(crate) fn has_served_nulls(array: &dyn Array) -> bool {
    match array.data_type() {
        DataType::List(_) => array.as_list::<i32>().values().logical_null_count() > 0,
        DataType::LargeList(_) => array.as_list::<i64>().values().logical_null_count() > 0,
        DataType::FixedSizeList(..) => {
            array.logical_null_count() > 0
                || has_served_nulls(array.as_fixed_size_list().values().as_ref())
        }
        _ => array.logical_null_count() > 0,
    }
}

/// The first file where a column holds nulls, if it does: as the footers' statistics say, else
/// as reading the row groups they leave unknown tells (kept for the next mount).
async fn column_has_nulls(source: &Source, field: usize) -> Result<Option<String>> {
    match &source.facts.nulls[field] {
        NullFact::None => Ok(None),
        NullFact::In(file) => Ok(Some(file.clone())),
        NullFact::Unknown(groups) => {
            for &(file, rg) in groups {
                let (file, rg) = (file as usize, rg as usize);
                let fact = format!("nulls of root column {field} in row group {rg}");
                let nulls = match source.kept_fact(file, &fact).as_deref() {
                    Some([n]) => *n == 1,
                    _ => {
                        let batch = source.read_row_group(file, rg, &[field]).await?;
                        let column: &ArrayRef = batch.column(0);
                        let nulls = has_served_nulls(column.as_ref());
                        source.keep_fact(file, &fact, &[u8::from(nulls)]);
                        nulls
                    }
                };
                if nulls {
                    return Ok(Some(source.files[file].name.clone()));
                }
            }
            Ok(None)
        }
    }
}

/// An Arrow type as refusals name it: short, in the words of the Parquet/Arrow user.
fn type_name(dt: &DataType) -> String {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::FixedSizeBinary(n) => format!("fixed-size binary of {n} bytes"),
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => format!("decimal({p}, {s})"),
        DataType::Struct(_) => "struct".into(),
        DataType::Map(..) => "map".into(),
        DataType::Null => "null".into(),
        DataType::Dictionary(_, v) => format!("dictionary of {}", type_name(v)),
        DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => {
            format!("list of {}", type_name(f.data_type()))
        }
        DataType::FixedSizeList(f, n) => format!("list of {n} {}", type_name(f.data_type())),
        DataType::Timestamp(u, _) => format!("timestamp[{}]", unit_name(u)),
        other => other.to_string().to_lowercase(),
    }
}

/// The dataset's columns as the options select them.
struct Selection<'a> {
    schema: &'a Schema,
    unischema: Option<&'a crate::source::petastorm::Unischema>,
    index: HashMap<&'a str, usize>,
    /// The selected columns, in order.
    selected: Vec<usize>,
    mapped: HashMap<usize, Option<Mapped>>,
}

impl<'a> Selection<'a> {
    fn select(
        schema: &'a Schema,
        unischema: Option<&'a crate::source::petastorm::Unischema>,
        undecodable: &BTreeMap<String, String>,
        opts: &Options,
        problems: &mut Vec<String>,
    ) -> Selection<'a> {
        let index: HashMap<&str, usize> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name().as_str(), i))
            .collect();
        let selected: Vec<usize> = match &opts.columns {
            Some(cols) => {
                let mut out = Vec::new();
                for c in cols {
                    match index.get(c.as_str()) {
                        Some(&i) if out.contains(&i) => problems.push(format!(
                            "mount option columns= names column '{c}' twice"
                        )),
                        Some(&i) => out.push(i),
                        None => problems.push(format!(
                            "mount option columns= names column '{c}', which the dataset does not have (it has: {})",
                            all_names(schema)
                        )),
                    }
                }
                out
            }
            None => (0..schema.fields().len()).collect(),
        };
        let mapped = selected
            .iter()
            .map(|&i| match undecodable.get(schema.field(i).name()) {
                Some(why) => (i, Some(Mapped::Refused(why.clone()))),
                None => (i, map_column(schema.field(i), unischema)),
            })
            .collect();
        Selection {
            schema,
            unischema,
            index,
            selected,
            mapped,
        }
    }

    fn name(&self, i: usize) -> &'a str {
        self.schema.field(i).name().as_str()
    }

    fn is_list(&self, i: usize) -> bool {
        matches!(self.mapped[&i], Some(Mapped::List { .. }))
    }
}

/// The dataset's column names, escaped as an option value takes them.
fn all_names(schema: &Schema) -> String {
    let names: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| crate::options::escape(f.name()))
        .collect();
    names.join(", ")
}

/// The hint a refusal ends with: options that leave the refused columns out and serve every
/// other column that can be, pasteable as they are (names escaped, `pad=` for each
/// variable-length list kept, `nulls=zero` where a kept column has nulls). Every hint of one
/// refusal keeps the same columns, so any of them mounts.
struct Hint<'a> {
    cols: &'a Selection<'a>,
    /// The file where each column of a known mapping has nulls, if it has any.
    nulls: HashMap<usize, Option<String>>,
    nulls_error: bool,
    padded: Vec<&'a str>,
    /// Selection that go into a `stack=` of the options: their tensor is the stack's.
    stacked: HashSet<usize>,
    /// Tensor names the options' stacks take.
    stack_names: Vec<&'a str>,
}

impl<'a> Hint<'a> {
    async fn new(
        source: &Source,
        cols: &'a Selection<'a>,
        opts: &'a Options,
        applied: Option<&crate::udf::Applied>,
    ) -> Result<Hint<'a>> {
        let mut nulls = HashMap::new();
        for &i in &cols.selected {
            if cols.mapped[&i].is_some() {
                let found = match applied {
                    // A transform's later row groups may return nulls its first did not: with
                    // nulls=zero, every output column is served with its mask.
                    Some(_) if opts.nulls == Nulls::Zero => Some("the transform's output".into()),
                    Some(a) => (a.nulls[i]).then(|| "the transform's output".to_string()),
                    None => column_has_nulls(source, i).await?,
                };
                nulls.insert(i, found);
            }
        }
        let stacked = opts
            .stacks
            .iter()
            .flat_map(|(_, members)| members)
            .filter_map(|c| cols.index.get(c.as_str()).copied())
            .collect();
        Ok(Hint {
            cols,
            nulls,
            nulls_error: opts.nulls == Nulls::Error,
            padded: opts.pads.iter().map(|(c, _)| c.as_str()).collect(),
            stacked,
            stack_names: opts.stacks.iter().map(|(n, _)| n.as_str()).collect(),
        })
    }

    fn has_nulls(&self, i: usize) -> bool {
        self.nulls.get(&i).is_some_and(Option::is_some)
    }

    /// The selected columns, but `excluded`, that a mount can serve together: those of a
    /// tensor mapping (variable-length lists given a `pad=`), less any whose tensors would not
    /// be valid file names or would take a name an earlier one takes (`x.mask` beside a
    /// column `x` with nulls).
    fn keep(&self, excluded: &[usize]) -> Vec<usize> {
        let candidates: Vec<usize> = self
            .cols
            .selected
            .iter()
            .copied()
            .filter(|i| !excluded.contains(i))
            .filter(|i| {
                matches!(
                    self.cols.mapped[i],
                    Some(Mapped::Fixed { .. } | Mapped::Cell { .. } | Mapped::List { .. })
                )
            })
            .collect();
        // Masks are named if any candidate has nulls; should every such column be dropped,
        // the names claimed are still those of the columns kept.
        let masks = candidates.iter().any(|&i| self.has_nulls(i));
        let mut taken: HashSet<String> = self.stack_names.iter().map(|n| n.to_string()).collect();
        let mut keep = Vec::new();
        for i in candidates {
            if self.stacked.contains(&i) {
                keep.push(i);
                continue;
            }
            let name = self.cols.name(i);
            let mut names = vec![name.to_string()];
            if self.cols.is_list(i) {
                names.push(format!("{name}.len"));
            }
            if masks && self.has_nulls(i) {
                names.push(format!("{name}.mask"));
            }
            let fits = names
                .iter()
                .all(|n| valid_file_name(n) && !taken.contains(n));
            if fits {
                taken.extend(names);
                keep.push(i);
            }
        }
        keep
    }

    /// `leave WHAT out with` the options that serve `keep`.
    fn options_for(&self, keep: &[usize], what: &str) -> String {
        if keep.is_empty() {
            return "no other column of the dataset can be served".into();
        }
        let escaped = |i: usize| crate::options::escape(self.cols.name(i));
        let columns: Vec<String> = keep.iter().map(|&i| escaped(i)).collect();
        let columns = columns.join(":");
        let zero = self.nulls_error && keep.iter().any(|&i| self.has_nulls(i));
        let zero = if zero { ",nulls=zero" } else { "" };
        let pads: Vec<String> = keep
            .iter()
            .filter(|&&i| self.cols.is_list(i) && !self.padded.contains(&self.cols.name(i)))
            .map(|&i| format!("pad={}:L", escaped(i)))
            .collect();
        match pads.len() {
            0 => format!("leave {what} out with columns={columns}{zero}"),
            n => format!(
                "leave {what} out with columns={columns} and give the variable-length {} a length L (longer ones are cut) with {}{zero}",
                if n == 1 { "list" } else { "lists" },
                pads.join(",")
            ),
        }
    }

    /// The options that leave the columns `refused` out and keep every other column that can
    /// be served.
    fn leave_out(&self, refused: &[usize], pronoun: &str) -> String {
        self.options_for(&self.keep(refused), pronoun)
    }

    /// `, or` and the options that leave every column with nulls out, where one is left.
    fn or_leave_out_nulls(&self) -> String {
        let with_nulls: Vec<usize> = self
            .cols
            .selected
            .iter()
            .copied()
            .filter(|&i| self.has_nulls(i))
            .collect();
        match self.keep(&with_nulls) {
            keep if keep.is_empty() => String::new(),
            keep => format!(", or {}", self.options_for(&keep, "the columns with nulls")),
        }
    }

    /// `, or` and the hint, where there is another column to serve.
    fn or_leave_out(&self, refused: &[usize], pronoun: &str) -> String {
        match self.keep(refused) {
            keep if keep.is_empty() => String::new(),
            keep => format!(", or {}", self.options_for(&keep, pronoun)),
        }
    }
}

/// Fields that cannot be served (Petastorm fields, columns of an undecodable codec), one line
/// each.
fn refused_fields(cols: &Selection, hint: &Hint) -> Vec<String> {
    cols.selected
        .iter()
        .filter_map(|i| match &cols.mapped[i] {
            Some(Mapped::Refused(why)) => Some(format!("{why}; {}", hint.leave_out(&[*i], "it"))),
            _ => None,
        })
        .collect()
}

/// Selected columns of types with no tensor mapping, all in one line.
fn unsupported_types(cols: &Selection, hint: &Hint) -> Option<String> {
    let unsupported: Vec<String> = cols
        .selected
        .iter()
        .filter(|i| cols.mapped[i].is_none())
        .map(|&i| {
            format!(
                "'{}' ({})",
                cols.name(i),
                type_name(cols.schema.field(i).data_type())
            )
        })
        .collect();
    if unsupported.is_empty() {
        return None;
    }
    let (what, verb, it) = match unsupported.len() {
        1 => ("column", "has", "it"),
        _ => ("columns", "have", "them"),
    };
    Some(format!(
        "{what} {} {verb} no tensor mapping (strings, structs, maps and decimals are not served); {}",
        unsupported.join(", "),
        hint.leave_out(&[], it)
    ))
}

/// Checks `stack=` and `pad=` against the columns; returns each stacked column's stack.
fn check_stacks_and_pads(
    cols: &Selection,
    opts: &Options,
    problems: &mut Vec<String>,
) -> HashMap<usize, usize> {
    let mut stack_of: HashMap<usize, usize> = HashMap::new();
    for (si, (name, members)) in opts.stacks.iter().enumerate() {
        for c in members {
            match cols.index.get(c.as_str()) {
                Some(&i) if cols.selected.contains(&i) => {
                    stack_of.insert(i, si);
                }
                Some(_) => problems.push(format!(
                    "mount option stack={name}: column '{c}' is not among columns="
                )),
                None => problems.push(format!(
                    "mount option stack={name}: the dataset has no column '{c}' (it has: {})",
                    all_names(cols.schema)
                )),
            }
        }
    }
    for (c, _) in &opts.pads {
        match cols.index.get(c.as_str()) {
            None => problems.push(format!(
                "mount option pad={c}: the dataset has no column '{c}' (it has: {})",
                all_names(cols.schema)
            )),
            // Left out by columns=: nothing to pad. (A hint's columns= pasted beside the pad=
            // that was refused mounts.)
            Some(i) if !cols.selected.contains(i) => {}
            Some(&i) if !cols.is_list(i) => problems.push(format!(
                "mount option pad={c}: column '{c}' is not a variable-length list of scalars ({})",
                type_name(cols.schema.field(i).data_type())
            )),
            Some(_) => {}
        }
    }
    stack_of
}

/// The feature of stack `si`, if its members can form one.
fn stack_item(
    cols: &Selection,
    opts: &Options,
    si: usize,
    casts: &HashMap<&str, DType>,
    problems: &mut Vec<String>,
) -> Option<Feature> {
    let (sname, members) = &opts.stacks[si];
    let mut fields = Vec::new();
    let mut dtypes: Vec<(String, DType)> = Vec::new();
    for c in members {
        let Some(&fi) = cols.index.get(c.as_str()) else {
            continue;
        };
        match cols.mapped.get(&fi) {
            Some(Some(Mapped::Fixed { elem, inner, .. })) if inner.is_empty() => {
                fields.push(fi);
                dtypes.push((c.clone(), casts.get(c.as_str()).copied().unwrap_or(*elem)));
            }
            Some(Some(_)) => problems.push(format!(
                "mount option stack={sname}: column '{c}' is not a scalar column ({})",
                type_name(cols.schema.field(fi).data_type())
            )),
            _ => {}
        }
    }
    if fields.len() != members.len() {
        return None;
    }
    if let Some((c, d)) = dtypes.iter().find(|(_, d)| *d != dtypes[0].1) {
        problems.push(format!(
            "mount option stack={sname}: columns '{}' ({}) and '{c}' ({d}) have different dtypes; make them one with cast=, e.g. cast={}:{}",
            dtypes[0].0,
            dtypes[0].1,
            crate::options::escape(c),
            dtypes[0].1
        ));
        return None;
    }
    let source_dtype = dtypes[0].1;
    Some(Feature {
        name: sname.clone(),
        kind: FeatureKind::Stack { fields },
        source_dtype,
        dtype: casts.get(sname.as_str()).copied().unwrap_or(source_dtype),
        inner: vec![members.len()],
        mask: false,
        unit: None,
    })
}

/// The features the selected columns give: columns, stacks, padded lists.
fn features(
    cols: &Selection,
    opts: &Options,
    stack_of: &HashMap<usize, usize>,
    hint: &Hint,
    problems: &mut Vec<String>,
) -> Vec<Feature> {
    let pads: HashMap<&str, usize> = opts.pads.iter().map(|(c, l)| (c.as_str(), *l)).collect();
    let casts: HashMap<&str, DType> = opts.casts.iter().map(|(c, d)| (c.as_str(), *d)).collect();
    let mut features: Vec<Feature> = Vec::new();
    let mut stacks_done: HashSet<usize> = HashSet::new();
    for &i in &cols.selected {
        let name = cols.name(i);
        let Some(m) = &cols.mapped[&i] else { continue };
        if let Some(&si) = stack_of.get(&i) {
            if stacks_done.insert(si)
                && let Some(feature) = stack_item(cols, opts, si, &casts, problems)
            {
                features.push(feature);
            }
            continue;
        }
        let (kind, elem, inner, unit) = match m {
            Mapped::Fixed { elem, inner, unit } => (
                FeatureKind::Column { field: i },
                *elem,
                inner.clone(),
                *unit,
            ),
            Mapped::Cell { elem, inner, spec } => (
                FeatureKind::Cell {
                    field: i,
                    spec: spec.clone(),
                },
                *elem,
                inner.clone(),
                None,
            ),
            Mapped::Refused(_) => continue,
            Mapped::List { elem, unit } => match pads.get(name) {
                Some(&len) => (FeatureKind::Pad { field: i, len }, *elem, vec![len], *unit),
                None => {
                    problems.push(format!(
                        "column '{name}' is a variable-length list ({}); give it a fixed length with pad={}:L (longer lists are cut){}",
                        type_name(cols.schema.field(i).data_type()),
                        crate::options::escape(name),
                        hint.or_leave_out(&[i], "it")
                    ));
                    continue;
                }
            },
        };
        // A Petastorm scalar is served in its Unischema's dtype, as make_reader returns it.
        let unischema_dtype = cols
            .unischema
            .and_then(|u| u.field(name))
            .filter(|f| f.codec == crate::source::petastorm::Codec::Scalar)
            .and_then(|f| f.dtype);
        features.push(Feature {
            name: name.to_string(),
            kind,
            source_dtype: elem,
            dtype: casts.get(name).copied().or(unischema_dtype).unwrap_or(elem),
            inner,
            mask: false,
            unit,
        });
    }
    for (c, _) in &opts.casts {
        // A column left out by columns= has nothing to cast, as with pad=.
        let known = features.iter().any(|it| it.name == *c)
            || opts.stacks.iter().any(|(_, members)| members.contains(c))
            || cols.index.contains_key(c.as_str());
        if !known {
            problems.push(format!(
                "mount option cast={c}: the dataset has no column or stack '{c}' (it has: {})",
                all_names(cols.schema)
            ));
        }
    }
    features
}

impl Feature {
    fn fields(&self) -> Vec<usize> {
        match &self.kind {
            FeatureKind::Column { field }
            | FeatureKind::Pad { field, .. }
            | FeatureKind::Cell { field, .. } => {
                vec![*field]
            }
            FeatureKind::Stack { fields } => fields.clone(),
        }
    }
}

/// Nulls, found from the statistics (and from the data where those cannot tell): a mask with
/// `nulls=zero`, else a refusal.
fn mark_nulls(features: &mut [Feature], cols: &Selection, hint: &Hint, problems: &mut Vec<String>) {
    for feature in features {
        let with_nulls = feature
            .fields()
            .into_iter()
            .find_map(|f| Some((f, hint.nulls.get(&f)?.clone()?)));
        let Some((f, file)) = with_nulls else {
            continue;
        };
        if !hint.nulls_error {
            feature.mask = true;
            continue;
        }
        let col = cols.name(f);
        let others = hint.or_leave_out_nulls();
        problems.push(format!(
            "column '{col}' has null values (in '{file}'); mount with nulls=zero to fill them with zeros and add a '{}.mask' tensor{others}",
            feature.name,
        ));
    }
}

/// The tensors the features give: each feature's data, `NAME.len` for a padded list, `NAME.mask`
/// where nulls are zero-filled.
fn tensors_of(features: &[Feature]) -> Vec<Tensor> {
    let mut tensors = Vec::new();
    for (ii, feature) in features.iter().enumerate() {
        let mut push = |name: String, dtype, inner: Vec<usize>, part, unit| {
            tensors.push(Tensor {
                name,
                dtype,
                inner,
                feature: ii,
                part,
                unit,
            })
        };
        push(
            feature.name.clone(),
            feature.dtype,
            feature.inner.clone(),
            Part::Data,
            feature.unit,
        );
        if matches!(feature.kind, FeatureKind::Pad { .. }) {
            push(
                format!("{}.len", feature.name),
                DType::I32,
                vec![],
                Part::Len,
                None,
            );
        }
        if feature.mask {
            push(
                format!("{}.mask", feature.name),
                DType::U8,
                feature.inner.clone(),
                Part::Mask,
                None,
            );
        }
    }
    tensors
}

/// Every tensor must be a distinct, valid file name.
fn check_tensor_names(
    tensors: &[Tensor],
    features: &[Feature],
    hint: &Hint,
    problems: &mut Vec<String>,
) {
    let mut names = HashSet::new();
    for t in tensors {
        if !valid_file_name(&t.name) {
            problems.push(format!(
                "tensor '{}' cannot be a file name; rename it with stack={}",
                t.name,
                hint.or_leave_out(&features[t.feature].fields(), "its column")
            ));
        } else if !names.insert(t.name.as_str()) {
            problems.push(format!(
                "two tensors are named '{}'; rename one with stack=",
                t.name
            ));
        }
    }
}

/// Builds the view of `source` under `opts`. Refusals are collected in `problems`; an error
/// is returned only when the source cannot be read.
pub async fn build(source: &Source, opts: &Options) -> Result<View> {
    build_with(source, opts, None).await
}

/// [`build`], over the output of a transform where there is one (`applied`): its columns are
/// then the ones `columns=`, `cast=`, `pad=`, `stack=` and `nulls=` name, and their nulls are
/// what the transform returned for the first row group.
pub(crate) async fn build_with(
    source: &Source,
    opts: &Options,
    applied: Option<&crate::udf::Applied>,
) -> Result<View> {
    let no_codecs = BTreeMap::new();
    let (schema, mut problems, undecodable, unischema) = match applied {
        None => (
            source.schema.clone(),
            source.facts.schema_problem.iter().cloned().collect(),
            &source.facts.undecodable,
            source.unischema.as_ref(),
        ),
        Some(a) => (a.schema.clone(), Vec::new(), &no_codecs, None),
    };
    let cols = Selection::select(&schema, unischema, undecodable, opts, &mut problems);
    let hint = Hint::new(source, &cols, opts, applied).await?;
    problems.extend(unsupported_types(&cols, &hint));
    problems.extend(refused_fields(&cols, &hint));
    let stack_of = check_stacks_and_pads(&cols, opts, &mut problems);
    let mut features = features(&cols, opts, &stack_of, &hint, &mut problems);
    mark_nulls(&mut features, &cols, &hint, &mut problems);
    let tensors = tensors_of(&features);
    check_tensor_names(&tensors, &features, &hint, &mut problems);
    if features.is_empty() && problems.is_empty() {
        problems.push("the dataset has no columns to serve".into());
    }
    // Each refusal is one line; a line break in a name it quotes is shown as its escape.
    for p in &mut problems {
        *p = p.replace('\n', "\\n").replace('\r', "\\r");
    }
    let roots: BTreeSet<usize> = features.iter().flat_map(Feature::fields).collect();
    let mut nulls_read: Vec<(usize, Option<String>)> = (hint.nulls.iter())
        .filter(|_| applied.is_none())
        .filter(|(i, _)| matches!(source.facts.nulls[**i], NullFact::Unknown(_)))
        .map(|(i, file)| (*i, file.clone()))
        .collect();
    nulls_read.sort();
    Ok(View {
        features,
        tensors,
        roots: roots.into_iter().collect(),
        problems,
        nulls_read,
    })
}

/// Placeholder of the count of objects touched in `dataset.json`, replaced as it is served
/// (`Fs`): a JSON number padded with spaces to the widest count, so the file's size is fixed.
pub(crate) const TOUCHED_PLACEHOLDER: &str = "0                   ";

/// Where the dataset came from: a listing, a summary file, or a snapshot (with its path and,
/// live, how many of its objects this host has touched).
pub(crate) fn origin_json(source: &Source) -> serde_json::Value {
    use crate::source::Origin;
    let columns: Vec<&str> = (source.partitions.fields.iter())
        .map(|f| f.name().as_str())
        .collect();
    let mut v = json!({
        "from": source.origin.name(),
        "objects": source.files.len(),
        "partition_columns": columns,
    });
    match &source.origin {
        Origin::Listing => {}
        Origin::Table(version) => v["version"] = json!(version.number),
        Origin::Summary => v["summary_file"] = json!(source.summary.as_ref().map(|s| &s.name)),
        Origin::Snapshot(at) => {
            v["snapshot"] = json!(at);
            v["objects_touched"] = json!(TOUCHED_PLACEHOLDER);
            if let Some(version) = source.table {
                v["version"] = json!(version.number);
            }
        }
    }
    v
}

/// The content of `dataset.json`.
/// The source's files, as dataset.json lists them.
pub(crate) fn files_json(source: &Source) -> Vec<serde_json::Value> {
    (source.files.iter())
        .map(|f| json!({"path": f.name, "rows": f.live_rows(), "row_groups": f.rg_rows.len(), "size": f.size}))
        .collect()
}

pub(crate) fn dataset_json(
    source: &Source,
    view: &View,
    plan: &Plan,
    opts: &Options,
) -> serde_json::Value {
    let batches = plan.batches();
    let tensors: Vec<serde_json::Value> = view
        .tensors
        .iter()
        .map(|t| {
            let mut v = json!({
                "name": t.name,
                "dtype": t.dtype.name(),
                "shape": t.shape(opts.batch_size),
                "safetensors_dtype": t.dtype.safetensors(),
                "npy": format!("{}.npy", t.name),
            });
            if let Some(u) = t.unit {
                v["unit"] = json!(u);
            }
            v
        })
        .collect();
    let files = files_json(source);
    let world = opts.world_size;
    json!({
        "source": source.display,
        "fingerprint": source.fingerprint(),
        "origin": origin_json(source),
        "rows": plan.rows(),
        "row_groups": plan.row_groups(),
        "batch_size": opts.batch_size,
        "drop_last": opts.drop_last,
        "batches_per_epoch": batches,
        "last_batch_rows": plan.last_batch_len(),
        "epochs": opts.epochs,
        "shuffle": opts.shuffle.name(),
        // Rows each batch is mixed from under shuffle=block (the first partition's blocks).
        "shuffle_block_rows": (opts.shuffle == crate::model::plan::Shuffle::Block).then(|| plan.block_rows(0)),
        "seed": opts.seed,
        "world_size": world,
        "rank_batches_per_epoch": world.map(|w| plan.rank_batches(w)),
        "rank_left_out_batches": world.map(|w| plan.rank_left_out(w)),
        // The partitions (PRODUCT.md §5): batch i < single_partition_batches is drawn from
        // partition i mod partitions; the leftover rows form the batches after them.
        "partitions": plan.partitions(),
        // Each partition's rows: its full batches' (the same for all) and its leftover rows.
        "partition_rows": (0..plan.partitions()).map(|i| plan.partition_drawn(i)).collect::<Vec<_>>(),
        // The row groups each partition draws from (one split between partitions counts in
        // each): what a host reading it fetches and decodes.
        "partition_row_groups": (0..plan.partitions()).map(|i| plan.partition_row_groups(i).count()).collect::<Vec<_>>(),
        // What a partition's home holds: whole "objects", or "row_groups" of fewer objects.
        "partition_units": if plan.whole_objects() { "objects" } else { "row_groups" },
        "batches_per_partition": plan.batches_per_partition(),
        "single_partition_batches": plan.single_partition_batches().min(batches),
        "leftover_rows": plan.leftover_rows(),
        "leftover_batches": batches - plan.single_partition_batches().min(batches),
        "tensors": tensors,
        "petastorm": source.unischema.as_ref().map(|u| json!({
            "unischema": (!u.inferred).then_some(&u.name),
            // Without a stored Unischema, each field is as its first cell shows it.
            "from": if u.inferred { "cells" } else { "_common_metadata" },
            "fields": u.fields.iter().map(|f| json!({
                "name": f.name,
                "dtype": f.numpy,
                "shape": f.shape,
                "codec": f.codec.name(),
                "nullable": f.nullable,
            })).collect::<Vec<_>>(),
        })),
        "files": files,
        "where": source.selected.as_ref().map(|s| {
            let mut w = json!({"expr": s.text, "rows": plan.rows()});
            if s.decided_here {
                w["objects_ruled_out"] = json!(s.objects_ruled_out);
                w["row_groups_ruled_out"] = json!(s.row_groups_ruled_out);
                w["row_groups_kept_whole"] = json!(s.row_groups_kept_whole);
                w["row_groups_read"] = json!(s.row_groups_read);
                w["rows_settled_by_page_index"] = json!(s.rows_settled_by_page_index);
            }
            w
        }),
        "options": opts.to_json(),
        // Which of them decide the batches' rows (a resume must agree on these).
        "order_options": Options::order_option_names(),
    })
}
