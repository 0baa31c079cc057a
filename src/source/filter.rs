//! `where=EXPR` (PRODUCT.md §11): the rows a job trains on.
//!
//! EXPR is parsed as SQL by `sqlparser` into a small tree of tests, each a column (or
//! `bucket(COL, N)`) against literals, joined by `and`, `or` and `not`. Against a schema it is
//! checked (columns named, literals of the column's type) into a [`Checked`] expression, which
//! answers two questions:
//!
//! - over rows ([`Checked::keep`]): SQL's three-valued logic with arrow's kernels, a row kept
//!   only where EXPR is true (unknown drops it), as `pyarrow.dataset`'s filter keeps rows;
//! - over what is known of a unit of rows without reading them ([`Checked::decide`]): a file's
//!   partition values, a row group's statistics. Each test gives the set of outcomes its rows
//!   may have (true, false, unknown), combined through the tree, so a unit is ruled out when
//!   none may be true and kept whole when all must be.

use crate::source::bucket;
use anyhow::{Context, Result, anyhow, bail};
use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, Scalar, StringArray,
    new_null_array,
};
use arrow::compute::kernels::{boolean, cmp};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Schema};
use sqlparser::ast;
use std::sync::Arc;

/// A `where=` expression as parsed, before it meets a schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// EXPR as the user wrote it: what `dataset.json`, keys and snapshots name.
    pub(crate) text: String,
    expr: Expr,
}

#[derive(Clone, Debug, PartialEq)]
enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Test(Operand, Pred),
}

#[derive(Clone, Debug, PartialEq)]
enum Operand {
    Column(String),
    /// `bucket(COL, N)`.
    Bucket(String, u32),
}

impl Operand {
    fn column(&self) -> &str {
        match self {
            Operand::Column(c) | Operand::Bucket(c, _) => c,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl Op {
    /// `lit OP col` as `col OP' lit`.
    fn flipped(self) -> Op {
        match self {
            Op::Lt => Op::Gt,
            Op::LtEq => Op::GtEq,
            Op::Gt => Op::Lt,
            Op::GtEq => Op::LtEq,
            same => same,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Pred {
    Cmp(Op, Lit),
    In(Vec<Lit>, bool),
    Between(Lit, Lit, bool),
    IsNull(bool),
}

#[derive(Clone, Debug, PartialEq)]
enum Lit {
    Null,
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
}

impl Lit {
    fn describe(&self) -> String {
        match self {
            Lit::Null => "null".into(),
            Lit::Int(i) => format!("integer {i}"),
            Lit::Float(f) => format!("decimal {f}"),
            Lit::Str(s) => format!("string '{s}'"),
            Lit::Bool(b) => format!("boolean {b}"),
        }
    }

    fn array(&self) -> ArrayRef {
        match self {
            Lit::Null => new_null_array(&DataType::Null, 1),
            Lit::Int(i) => Arc::new(Int64Array::from(vec![*i])),
            Lit::Float(f) => Arc::new(Float64Array::from(vec![*f])),
            Lit::Str(s) => Arc::new(StringArray::from(vec![s.as_str()])),
            Lit::Bool(b) => Arc::new(BooleanArray::from(vec![*b])),
        }
    }
}

impl Filter {
    /// Parses EXPR; a syntax error names `where=` and the column it is found at.
    pub fn parse(text: &str) -> Result<Filter> {
        let dialect = sqlparser::dialect::GenericDialect {};
        let unparsable = |e: sqlparser::parser::ParserError| {
            let why = e.to_string();
            let why = why.trim_start_matches("sql parser error: ");
            // The parser names the line and column of a token it did not expect, but not the
            // end it reached too soon.
            match why.contains("Column") {
                true => anyhow!("where={text} does not parse: {why}"),
                false => anyhow!(
                    "where={text} does not parse: {why} at column {}",
                    text.chars().count() + 1
                ),
            }
        };
        let mut parser = sqlparser::parser::Parser::new(&dialect)
            .try_with_sql(text)
            .map_err(unparsable)?;
        let expr = parser.parse_expr().map_err(unparsable)?;
        let next = parser.peek_token();
        if next.token != sqlparser::tokenizer::Token::EOF {
            bail!(
                "where={text} does not parse: unexpected '{}' at column {}",
                next.token,
                next.span.start.column
            );
        }
        let expr = Self::lower(text, &expr)?;
        Ok(Filter {
            text: text.to_string(),
            expr,
        })
    }

    fn lower(text: &str, e: &ast::Expr) -> Result<Expr> {
        use ast::Expr as E;
        let refused = |what: &str| anyhow!("where={text}: {what}");
        Ok(match e {
            E::Nested(inner) => Self::lower(text, inner)?,
            E::BinaryOp { left, op, right } => match op {
                ast::BinaryOperator::And => Expr::And(
                    Box::new(Self::lower(text, left)?),
                    Box::new(Self::lower(text, right)?),
                ),
                ast::BinaryOperator::Or => Expr::Or(
                    Box::new(Self::lower(text, left)?),
                    Box::new(Self::lower(text, right)?),
                ),
                _ => {
                    let op = match op {
                        ast::BinaryOperator::Eq => Op::Eq,
                        ast::BinaryOperator::NotEq => Op::NotEq,
                        ast::BinaryOperator::Lt => Op::Lt,
                        ast::BinaryOperator::LtEq => Op::LtEq,
                        ast::BinaryOperator::Gt => Op::Gt,
                        ast::BinaryOperator::GtEq => Op::GtEq,
                        other => {
                            return Err(refused(&format!(
                                "'{other}' is no operator where= takes (= != < <= > >= in between is null and or not)"
                            )));
                        }
                    };
                    match (Self::operand(text, left)?, Self::operand(text, right)?) {
                        (Side::Operand(o), Side::Lit(l)) => Expr::Test(o, Pred::Cmp(op, l)),
                        (Side::Lit(l), Side::Operand(o)) => {
                            Expr::Test(o, Pred::Cmp(op.flipped(), l))
                        }
                        (Side::Operand(a), Side::Operand(b)) => {
                            return Err(refused(&format!(
                                "it compares column '{}' with column '{}': where= compares columns with literals",
                                a.column(),
                                b.column()
                            )));
                        }
                        (Side::Lit(_), Side::Lit(_)) => {
                            return Err(refused(&format!(
                                "'{e}' compares two literals: name a column"
                            )));
                        }
                    }
                }
            },
            E::UnaryOp {
                op: ast::UnaryOperator::Not,
                expr,
            } => Expr::Not(Box::new(Self::lower(text, expr)?)),
            E::In {
                expr,
                target: ast::InTarget::List(list),
                negated,
                ..
            } => {
                let o = Self::column_side(text, expr)?;
                let list = (list.iter())
                    .map(|l| Self::literal(text, l))
                    .collect::<Result<_>>()?;
                Expr::Test(o, Pred::In(list, *negated))
            }
            E::Between {
                expr,
                negated,
                low,
                high,
            } => {
                let o = Self::column_side(text, expr)?;
                let (low, high) = (Self::literal(text, low)?, Self::literal(text, high)?);
                Expr::Test(o, Pred::Between(low, high, *negated))
            }
            E::IsNull(expr) => Expr::Test(Self::column_side(text, expr)?, Pred::IsNull(false)),
            E::IsNotNull(expr) => Expr::Test(Self::column_side(text, expr)?, Pred::IsNull(true)),
            // A boolean column alone: its true rows.
            E::Identifier(_) | E::CompoundIdentifier(_) => Expr::Test(
                Self::column_side(text, e)?,
                Pred::Cmp(Op::Eq, Lit::Bool(true)),
            ),
            other => {
                return Err(refused(&format!(
                    "'{other}' is no test where= takes: compare a column with literals (= != < <= > >=, in, between, is null), joined by and, or, not"
                )));
            }
        })
    }

    fn column_side(text: &str, e: &ast::Expr) -> Result<Operand> {
        match Self::operand(text, e)? {
            Side::Operand(o) => Ok(o),
            Side::Lit(l) => bail!("where={text}: '{e}' tests {}, not a column", l.describe()),
        }
    }

    fn literal(text: &str, e: &ast::Expr) -> Result<Lit> {
        match Self::operand(text, e)? {
            Side::Lit(l) => Ok(l),
            Side::Operand(o) => bail!(
                "where={text}: column '{}' stands where a literal must",
                o.column()
            ),
        }
    }

    fn operand(text: &str, e: &ast::Expr) -> Result<Side> {
        use ast::Expr as E;
        let refused = |what: String| anyhow!("where={text}: {what}");
        Ok(match e {
            E::Nested(inner) => Self::operand(text, inner)?,
            E::Identifier(id) => Side::Operand(Operand::Column(id.value.clone())),
            E::CompoundIdentifier(ids) => Side::Operand(Operand::Column(
                ids.iter()
                    .map(|i| i.value.as_str())
                    .collect::<Vec<_>>()
                    .join("."),
            )),
            E::Value(v) => Side::Lit(Self::value(text, &v.value)?),
            E::UnaryOp {
                op: op @ (ast::UnaryOperator::Minus | ast::UnaryOperator::Plus),
                expr,
            } => match Self::operand(text, expr)? {
                Side::Lit(Lit::Int(i)) if *op == ast::UnaryOperator::Minus => {
                    Side::Lit(Lit::Int(-i))
                }
                Side::Lit(Lit::Float(f)) if *op == ast::UnaryOperator::Minus => {
                    Side::Lit(Lit::Float(-f))
                }
                Side::Lit(l @ (Lit::Int(_) | Lit::Float(_))) => Side::Lit(l),
                _ => return Err(refused(format!("'{e}' is no number"))),
            },
            // A name SQL knows as a function without parentheses (`user`) is a column here.
            E::Function(f) if matches!(f.args, ast::FunctionArguments::None) => {
                Side::Operand(Operand::Column(f.name.to_string()))
            }
            E::Function(f) => Side::Operand(Self::bucket(text, f)?),
            other => {
                return Err(refused(format!(
                    "'{other}' is neither a column nor a literal"
                )));
            }
        })
    }

    fn value(text: &str, v: &ast::Value) -> Result<Lit> {
        use ast::Value as V;
        Ok(match v {
            V::Number(n, _) => match n.parse::<i64>() {
                Ok(i) => Lit::Int(i),
                Err(_) => Lit::Float(
                    n.parse::<f64>()
                        .map_err(|_| anyhow!("where={text}: '{n}' is no number"))?,
                ),
            },
            V::SingleQuotedString(s) | V::DoubleQuotedString(s) => Lit::Str(s.clone()),
            V::Boolean(b) => Lit::Bool(*b),
            V::Null => Lit::Null,
            other => bail!("where={text}: '{other}' is no literal where= takes"),
        })
    }

    fn bucket(text: &str, f: &ast::Function) -> Result<Operand> {
        let name = f.name.to_string();
        if !name.eq_ignore_ascii_case("bucket") {
            bail!("where={text}: '{name}' is no function where= knows (it knows bucket(COL, N))");
        }
        let wrong = || {
            anyhow!(
                "where={text}: bucket takes a column and a whole number of buckets, as bucket(user, 10)"
            )
        };
        let ast::FunctionArguments::List(list) = &f.args else {
            return Err(wrong());
        };
        let args: Vec<&ast::Expr> = (list.args.iter())
            .map(|a| match a {
                ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
                _ => Err(wrong()),
            })
            .collect::<Result<_>>()?;
        let [column, n] = args[..] else {
            return Err(wrong());
        };
        let column = match Self::operand(text, column)? {
            Side::Operand(Operand::Column(c)) => c,
            _ => return Err(wrong()),
        };
        match Self::operand(text, n)? {
            Side::Lit(Lit::Int(n)) if n > 0 && n <= i32::MAX as i64 => {
                Ok(Operand::Bucket(column, n as u32))
            }
            _ => Err(wrong()),
        }
    }

    /// EXPR against `schema`: every column named must be one of its fields, each literal of
    /// its column's type. With `partial`, a column `schema` lacks is a test whose outcome is
    /// not known (before the footers, the schema holds only the partition columns).
    pub(crate) fn check(&self, schema: &Schema, partial: bool) -> Result<Checked> {
        let mut columns = Vec::new();
        let tree = self.checked(&self.expr, schema, partial, &mut columns)?;
        Ok(Checked {
            text: self.text.clone(),
            tree,
            columns,
        })
    }

    fn checked(
        &self,
        e: &Expr,
        schema: &Schema,
        partial: bool,
        columns: &mut Vec<usize>,
    ) -> Result<Node> {
        let mut sub = |e: &Expr| self.checked(e, schema, partial, columns).map(Box::new);
        Ok(match e {
            Expr::And(a, b) => Node::And(sub(a)?, sub(b)?),
            Expr::Or(a, b) => Node::Or(sub(a)?, sub(b)?),
            Expr::Not(a) => Node::Not(sub(a)?),
            Expr::Test(operand, pred) => {
                let name = operand.column();
                let Some((at, field)) = schema.column_with_name(name) else {
                    if partial {
                        return Ok(Node::Unknown);
                    }
                    let names: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    bail!(
                        "where={}: no column '{name}'{}",
                        self.text,
                        nearest(name, &names)
                    );
                };
                if !columns.contains(&at) {
                    columns.push(at);
                }
                let (value_type, bucket) = match operand {
                    Operand::Column(_) => (field.data_type().clone(), None),
                    Operand::Bucket(_, n) => {
                        if !bucket::accepts(field.data_type()) {
                            bail!(
                                "where={}: bucket() takes integers, dates, times, timestamps, decimals, strings and binary, and column '{name}' is {}",
                                self.text,
                                field.data_type()
                            );
                        }
                        (DataType::Int32, Some(*n))
                    }
                };
                let what = match bucket {
                    Some(n) => format!("bucket({name}, {n})"),
                    None => format!("column '{name}'"),
                };
                let mut leaf = Leaf {
                    column: at,
                    bucket,
                    as_type: None,
                    float: matches!(
                        value_type,
                        DataType::Float16 | DataType::Float32 | DataType::Float64
                    ),
                    pred: LeafPred::IsNull(false),
                };
                let mut lit = |l: &Lit| -> Result<ArrayRef> {
                    let (v, as_type) = coerce(&self.text, &what, &value_type, l)?;
                    if as_type.is_some() {
                        leaf.as_type = as_type;
                    }
                    Ok(v)
                };
                let pred = match pred {
                    Pred::Cmp(op, l) => LeafPred::Cmp(*op, lit(l)?),
                    Pred::In(list, negated) => {
                        LeafPred::In(list.iter().map(&mut lit).collect::<Result<_>>()?, *negated)
                    }
                    Pred::Between(a, b, negated) => LeafPred::Between(lit(a)?, lit(b)?, *negated),
                    Pred::IsNull(negated) => LeafPred::IsNull(*negated),
                };
                leaf.pred = pred;
                // One wider type for the column and every literal of the test.
                if let Some(wide) = leaf.as_type.clone() {
                    leaf.pred = leaf.pred.cast(&wide)?;
                }
                Node::Leaf(leaf)
            }
        })
    }
}

enum Side {
    Operand(Operand),
    Lit(Lit),
}

/// `, nearest: a, b` for the names of `names` closest to `name`.
fn nearest(name: &str, names: &[&str]) -> String {
    let mut scored: Vec<(usize, &str)> = (names.iter())
        .map(|n| {
            let d = crate::options::distance(&name.to_lowercase(), &n.to_lowercase());
            (d, *n)
        })
        .collect();
    scored.sort();
    let close: Vec<&str> = (scored.iter())
        .take(3)
        .filter(|(d, n)| *d <= (n.len().max(name.len()) / 2).max(2))
        .map(|(_, n)| *n)
        .collect();
    match close.is_empty() {
        true => format!(" (columns: {})", names.join(", ")),
        false => format!(" (nearest: {})", close.join(", ")),
    }
}

/// The literal `l` as a value of a column of type `column` (`what` names it): the literal in
/// the column's type where it is exactly that, else (numbers) both in the wider type, given
/// as the type to read the column as.
fn coerce(
    text: &str,
    what: &str,
    column: &DataType,
    l: &Lit,
) -> Result<(ArrayRef, Option<DataType>)> {
    use DataType::*;
    let value_type = match column {
        Dictionary(_, v) => v.as_ref().clone(),
        t => t.clone(),
    };
    let plain = matches!(column, Dictionary(..)).then(|| value_type.clone());
    if *l == Lit::Null {
        return Ok((new_null_array(&value_type, 1), plain));
    }
    let numeric = value_type.is_numeric();
    let fits = match (&value_type, l) {
        (_, Lit::Int(_) | Lit::Float(_)) => numeric,
        (Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView, Lit::Str(_)) => true,
        (FixedSizeBinary(_), Lit::Str(_)) => true,
        (Date32 | Date64 | Timestamp(..) | Time32(_) | Time64(_), Lit::Str(_)) => true,
        (Boolean, Lit::Bool(_)) => true,
        _ => false,
    };
    let lit_type = match l {
        Lit::Int(_) => "an integer",
        Lit::Float(_) => "a decimal",
        Lit::Str(_) => "a string",
        Lit::Bool(_) => "a boolean",
        Lit::Null => "null",
    };
    if !fits {
        bail!(
            "where={text}: {what} is {value_type}, and {} is {lit_type}",
            l.describe()
        );
    }
    let raw = l.array();
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    let cast = cast_with_options(&raw, &value_type, &strict);
    if !numeric {
        let v = cast.map_err(|e| {
            anyhow!(
                "where={text}: {what} is {value_type}, and {} is no {value_type} ({e})",
                l.describe()
            )
        })?;
        return Ok((v, plain));
    }
    // A number the column's type holds exactly is compared in that type; another (300 for an
    // int8 column, 0.5 for an integer one, 0.1 for a float32 one) in the wider type.
    if let Ok(v) = &cast
        && let Ok(back) = cast_with_options(v, raw.data_type(), &strict)
        && back.as_ref() == raw.as_ref()
    {
        return Ok((v.clone(), plain));
    }
    let wide = match (l, &value_type) {
        (Lit::Int(_), t) if t.is_integer() && *t != UInt64 => Int64,
        _ => Float64,
    };
    Ok((cast_with_options(&raw, &wide, &strict)?, Some(wide)))
}

/// A `where=` expression checked against a dataset's schema.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) text: String,
    tree: Node,
    /// The schema's columns EXPR reads, in the order it names them.
    pub(crate) columns: Vec<usize>,
}

#[derive(Debug)]
enum Node {
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
    Leaf(Leaf),
    /// A test of a column not known yet (see [`Filter::check`]'s `partial`).
    Unknown,
}

#[derive(Debug)]
struct Leaf {
    /// The column, by its index in the schema checked against.
    column: usize,
    /// `bucket(COL, N)`: the test is of the column's buckets.
    bucket: Option<u32>,
    /// The type the column is read as to compare (a dictionary's values, a wider number).
    as_type: Option<DataType>,
    /// A float column: its NaNs are neither less nor greater than anything (pyarrow's rule;
    /// arrow-rs orders NaN above every number), and statistics do not count them.
    float: bool,
    pred: LeafPred,
}

#[derive(Debug)]
enum LeafPred {
    Cmp(Op, ArrayRef),
    In(Vec<ArrayRef>, bool),
    Between(ArrayRef, ArrayRef, bool),
    IsNull(bool),
}

impl LeafPred {
    fn cast(self, to: &DataType) -> Result<LeafPred> {
        let c = |a: ArrayRef| -> Result<ArrayRef> { Ok(arrow::compute::cast(&a, to)?) };
        Ok(match self {
            LeafPred::Cmp(op, v) => LeafPred::Cmp(op, c(v)?),
            LeafPred::In(list, n) => {
                LeafPred::In(list.into_iter().map(c).collect::<Result<_>>()?, n)
            }
            LeafPred::Between(a, b, n) => LeafPred::Between(c(a)?, c(b)?, n),
            p @ LeafPred::IsNull(_) => p,
        })
    }
}

fn compare(op: Op, values: &dyn arrow::array::Datum, v: &ArrayRef) -> Result<BooleanArray> {
    let v = Scalar::new(v.clone());
    Ok(match op {
        Op::Eq => cmp::eq(values, &v)?,
        Op::NotEq => cmp::neq(values, &v)?,
        Op::Lt => cmp::lt(values, &v)?,
        Op::LtEq => cmp::lt_eq(values, &v)?,
        Op::Gt => cmp::gt(values, &v)?,
        Op::GtEq => cmp::gt_eq(values, &v)?,
    })
}

/// False where a float is NaN (null where it is null).
fn not_nan(values: &ArrayRef) -> Result<BooleanArray> {
    let f = arrow::compute::cast(values, &DataType::Float64)?;
    let f = f
        .as_any()
        .downcast_ref::<Float64Array>()
        .context("floats")?;
    Ok(f.iter().map(|v| v.map(|v| !v.is_nan())).collect())
}

impl Leaf {
    /// The column's values as the test compares them.
    fn operand(&self, values: &ArrayRef) -> Result<ArrayRef> {
        let values = match self.bucket {
            Some(n) => Arc::new(bucket::buckets(values, n)?) as ArrayRef,
            None => values.clone(),
        };
        Ok(match &self.as_type {
            Some(t) if values.data_type() != t => arrow::compute::cast(&values, t)?,
            _ => values,
        })
    }

    /// The test of each value (null: unknown).
    fn test(&self, values: &ArrayRef) -> Result<BooleanArray> {
        let x = self.operand(values)?;
        let ordered = |op: Op, v: &ArrayRef| -> Result<BooleanArray> {
            let r = compare(op, &x, v)?;
            match (self.float && self.bucket.is_none(), op) {
                (true, Op::Gt | Op::GtEq) => Ok(boolean::and(&r, &not_nan(&x)?)?),
                _ => Ok(r),
            }
        };
        Ok(match &self.pred {
            LeafPred::Cmp(op, v) => ordered(*op, v)?,
            LeafPred::In(list, negated) => {
                let mut any = BooleanArray::from(vec![false; x.len()]);
                for v in list {
                    any = boolean::or_kleene(&any, &compare(Op::Eq, &x, v)?)?;
                }
                match negated {
                    true => boolean::not(&any)?,
                    false => any,
                }
            }
            LeafPred::Between(a, b, negated) => {
                let r = boolean::and_kleene(&ordered(Op::GtEq, a)?, &ordered(Op::LtEq, b)?)?;
                match negated {
                    true => boolean::not(&r)?,
                    false => r,
                }
            }
            LeafPred::IsNull(false) => arrow::compute::is_null(&x)?,
            LeafPred::IsNull(true) => arrow::compute::is_not_null(&x)?,
        })
    }

    /// What each unit's rows may give, from what is `known` of the column in each unit.
    fn decide(&self, known: &Known, units: usize) -> Result<Vec<Outcomes>> {
        let all = |o: Outcomes| vec![o; units];
        match known {
            Known::Unknown => Ok(all(T | F | N)),
            Known::Constant(values) => {
                let r = self.test(values)?;
                Ok((0..units)
                    .map(|u| match r.is_null(u) {
                        true => N,
                        false if r.value(u) => T,
                        false => F,
                    })
                    .collect())
            }
            Known::Bounds { min, max, nulls } => self.decide_by_bounds(min, max, nulls),
        }
    }

    fn decide_by_bounds(
        &self,
        min: &ArrayRef,
        max: &ArrayRef,
        nulls: &[Nulls],
    ) -> Result<Vec<Outcomes>> {
        let units = nulls.len();
        if let LeafPred::IsNull(negated) = self.pred {
            return Ok((nulls.iter())
                .map(|n| {
                    let (t, f) = (*n != Nulls::None, *n != Nulls::All);
                    let (t, f) = if negated { (f, t) } else { (t, f) };
                    (if t { T } else { 0 }) | (if f { F } else { 0 })
                })
                .collect());
        }
        let with_nulls = |n: Nulls, o: Outcomes| match n {
            Nulls::All => N,
            Nulls::None => o,
            Nulls::Some => o | N,
        };
        // Bucket values are not ordered as the column's: only their nulls are known.
        if self.bucket.is_some() {
            return Ok(nulls.iter().map(|&n| with_nulls(n, T | F)).collect());
        }
        let cast = |a: &ArrayRef| -> Result<ArrayRef> {
            let t = self.as_type.clone().unwrap_or_else(|| match a.data_type() {
                DataType::Dictionary(_, v) => v.as_ref().clone(),
                t => t.clone(),
            });
            Ok(match a.data_type() == &t {
                true => a.clone(),
                false => cast_with_options(a, &t, &CastOptions::default())?,
            })
        };
        let (min, max) = (cast(min)?, cast(max)?);
        // Each bound against a literal, per unit: true, false, or unknown (no bound).
        let holds = |b: &ArrayRef, op: Op, v: &ArrayRef| -> Result<Vec<Option<bool>>> {
            let r = compare(op, b, v)?;
            Ok((0..units)
                .map(|u| (!r.is_null(u)).then(|| r.value(u)))
                .collect())
        };
        // "May" a bound test hold: unknown bounds may.
        let may = |r: &[Option<bool>], u: usize| r[u].unwrap_or(true);
        let float = self.float;
        let mut out = Vec::with_capacity(units);
        match &self.pred {
            LeafPred::Cmp(op, v) => {
                let (min_lt, min_le) = (holds(&min, Op::Lt, v)?, holds(&min, Op::LtEq, v)?);
                let (max_gt, max_ge) = (holds(&max, Op::Gt, v)?, holds(&max, Op::GtEq, v)?);
                for (u, &n) in nulls.iter().enumerate() {
                    let (t, f) = match op {
                        Op::Eq => (
                            may(&min_le, u) && may(&max_ge, u),
                            may(&min_lt, u) || may(&max_gt, u) || float,
                        ),
                        Op::NotEq => (
                            may(&min_lt, u) || may(&max_gt, u) || float,
                            may(&min_le, u) && may(&max_ge, u),
                        ),
                        Op::Lt => (may(&min_lt, u), may(&max_ge, u) || float),
                        Op::LtEq => (may(&min_le, u), may(&max_gt, u) || float),
                        Op::Gt => (may(&max_gt, u), may(&min_le, u) || float),
                        Op::GtEq => (may(&max_ge, u), may(&min_lt, u) || float),
                    };
                    out.push(with_nulls(n, outcomes(t, f)));
                }
            }
            LeafPred::In(list, negated) => {
                let mut t = vec![false; units];
                let mut f = vec![true; units];
                for v in list {
                    let (min_le, max_ge) = (holds(&min, Op::LtEq, v)?, holds(&max, Op::GtEq, v)?);
                    let (min_eq, max_eq) = (holds(&min, Op::Eq, v)?, holds(&max, Op::Eq, v)?);
                    for u in 0..units {
                        t[u] |= may(&min_le, u) && may(&max_ge, u);
                        // Every value is this one: none is outside the list.
                        if min_eq[u] == Some(true) && max_eq[u] == Some(true) && !float {
                            f[u] = false;
                        }
                    }
                }
                for u in 0..units {
                    let (t, f) = if *negated { (f[u], t[u]) } else { (t[u], f[u]) };
                    out.push(with_nulls(nulls[u], outcomes(t, f)));
                }
            }
            LeafPred::Between(a, b, negated) => {
                let (max_ge_a, min_le_b) = (holds(&max, Op::GtEq, a)?, holds(&min, Op::LtEq, b)?);
                let (min_lt_a, max_gt_b) = (holds(&min, Op::Lt, a)?, holds(&max, Op::Gt, b)?);
                for (u, &n) in nulls.iter().enumerate() {
                    let t = may(&max_ge_a, u) && may(&min_le_b, u);
                    let f = may(&min_lt_a, u) || may(&max_gt_b, u) || float;
                    let (t, f) = if *negated { (f, t) } else { (t, f) };
                    out.push(with_nulls(n, outcomes(t, f)));
                }
            }
            LeafPred::IsNull(_) => unreachable!("decided above"),
        }
        Ok(out)
    }
}

/// The outcomes a unit's rows may have: a set of [`T`], [`F`] and [`N`] (unknown).
pub(crate) type Outcomes = u8;
pub(crate) const T: Outcomes = 1;
pub(crate) const F: Outcomes = 2;
pub(crate) const N: Outcomes = 4;

fn outcomes(t: bool, f: bool) -> Outcomes {
    (if t { T } else { 0 }) | (if f { F } else { 0 })
}

fn has(o: Outcomes, x: Outcomes) -> bool {
    o & x != 0
}

/// SQL's `and` of any row of outcomes `a` with any of `b`.
fn and3(a: Outcomes, b: Outcomes) -> Outcomes {
    let t = has(a, T) && has(b, T);
    let f = has(a, F) || has(b, F);
    let n = (has(a, N) && has(b, T | N)) || (has(b, N) && has(a, T | N));
    outcomes(t, f) | if n { N } else { 0 }
}

fn or3(a: Outcomes, b: Outcomes) -> Outcomes {
    let t = has(a, T) || has(b, T);
    let f = has(a, F) && has(b, F);
    let n = (has(a, N) && has(b, F | N)) || (has(b, N) && has(a, F | N));
    outcomes(t, f) | if n { N } else { 0 }
}

fn not3(a: Outcomes) -> Outcomes {
    outcomes(has(a, F), has(a, T)) | (a & N)
}

/// What is known of one column over some units (files, or row groups), without their rows.
#[derive(Clone, Debug)]
pub(crate) enum Known {
    /// Nothing.
    Unknown,
    /// Its one value in each unit (a partition column), an array of one value per unit.
    Constant(ArrayRef),
    /// Each unit's bounds (null: not known) and nulls, as statistics give them.
    Bounds {
        min: ArrayRef,
        max: ArrayRef,
        nulls: Vec<Nulls>,
    },
}

/// A unit's nulls of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nulls {
    None,
    All,
    /// Some, or not known.
    Some,
}

impl Nulls {
    /// What a unit's null count (`None`: not known) says of its `rows` rows.
    pub(crate) fn of(count: Option<u64>, rows: Option<u64>) -> Nulls {
        match (count, rows) {
            (Some(0), _) => Nulls::None,
            (Some(n), Some(r)) if n >= r => Nulls::All,
            _ => Nulls::Some,
        }
    }
}

/// What a unit of rows is, for EXPR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No row is kept: nothing of it is read.
    None,
    /// Every row is kept: EXPR's columns are not read.
    All,
    /// Its rows must be read (EXPR's columns only) to know.
    Read,
}

impl Checked {
    /// Each unit's decision, from what is known of each of EXPR's columns there (`known`:
    /// by the column's index in the schema).
    pub(crate) fn decide(
        &self,
        units: usize,
        known: &dyn Fn(usize) -> Result<Known>,
    ) -> Result<Vec<Decision>> {
        let o = self.outcomes(&self.tree, units, known)?;
        Ok((o.into_iter())
            .map(|o| match o {
                _ if !has(o, T) => Decision::None,
                T => Decision::All,
                _ => Decision::Read,
            })
            .collect())
    }

    fn outcomes(
        &self,
        n: &Node,
        units: usize,
        known: &dyn Fn(usize) -> Result<Known>,
    ) -> Result<Vec<Outcomes>> {
        let pair = |a: &Node, b: &Node| -> Result<(Vec<Outcomes>, Vec<Outcomes>)> {
            Ok((
                self.outcomes(a, units, known)?,
                self.outcomes(b, units, known)?,
            ))
        };
        Ok(match n {
            Node::And(a, b) => {
                let (a, b) = pair(a, b)?;
                a.into_iter().zip(b).map(|(a, b)| and3(a, b)).collect()
            }
            Node::Or(a, b) => {
                let (a, b) = pair(a, b)?;
                a.into_iter().zip(b).map(|(a, b)| or3(a, b)).collect()
            }
            Node::Not(a) => (self.outcomes(a, units, known)?.into_iter())
                .map(not3)
                .collect(),
            Node::Unknown => vec![T | F | N; units],
            Node::Leaf(leaf) => leaf.decide(&known(leaf.column)?, units)?,
        })
    }

    /// The rows of `batch` that EXPR keeps; `batch` holds EXPR's columns, in
    /// [`Checked::columns`]' order.
    pub(crate) fn keep(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let r = self.eval(&self.tree, batch)?;
        // Unknown is not kept.
        Ok(match r.nulls() {
            Some(_) => r.iter().map(|v| Some(v == Some(true))).collect(),
            None => r,
        })
    }

    fn eval(&self, n: &Node, batch: &RecordBatch) -> Result<BooleanArray> {
        Ok(match n {
            Node::And(a, b) => boolean::and_kleene(&self.eval(a, batch)?, &self.eval(b, batch)?)?,
            Node::Or(a, b) => boolean::or_kleene(&self.eval(a, batch)?, &self.eval(b, batch)?)?,
            Node::Not(a) => boolean::not(&self.eval(a, batch)?)?,
            Node::Unknown => bail!("where={}: a column is not known", self.text),
            Node::Leaf(leaf) => {
                let at = (self.columns.iter())
                    .position(|&c| c == leaf.column)
                    .expect("a column of the expression");
                leaf.test(batch.column(at))?
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::Field;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("x", DataType::Int32, true),
            Field::new("city", DataType::Utf8, true),
            Field::new("f", DataType::Float32, true),
            Field::new("day", DataType::Date32, true),
        ])
    }

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(schema()),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), Some(5), None, Some(9)])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some("b"),
                    Some("c"),
                ])),
                Arc::new(arrow::array::Float32Array::from(vec![
                    Some(0.5),
                    Some(f32::NAN),
                    None,
                    Some(2.0),
                ])),
                Arc::new(arrow::array::Date32Array::from(vec![
                    Some(0),
                    Some(1),
                    Some(2),
                    None,
                ])),
            ],
        )
        .unwrap()
    }

    fn kept(expr: &str) -> Vec<bool> {
        let c = Filter::parse(expr)
            .unwrap()
            .check(&schema(), false)
            .unwrap();
        let b = batch();
        let cols: Vec<ArrayRef> = c.columns.iter().map(|&i| b.column(i).clone()).collect();
        let fields: Vec<Field> = (c.columns.iter())
            .map(|&i| b.schema().field(i).clone())
            .collect();
        let b = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
        c.keep(&b).unwrap().iter().map(|v| v.unwrap()).collect()
    }

    #[test]
    fn rows_are_kept_by_sql_s_three_valued_logic() {
        assert_eq!(kept("x > 1"), [false, true, false, true]);
        assert_eq!(kept("not x > 1"), [true, false, false, false]);
        assert_eq!(kept("x > 1 or city = 'a'"), [true, true, false, true]);
        assert_eq!(kept("x in (1, 9)"), [true, false, false, true]);
        assert_eq!(kept("x not in (1, 9)"), [false, true, false, false]);
        assert_eq!(kept("x between 2 and 9"), [false, true, false, true]);
        assert_eq!(kept("x not between 2 and 9"), [true, false, false, false]);
        assert_eq!(kept("city is null"), [false, true, false, false]);
        assert_eq!(
            kept("city is not null and x < 6"),
            [true, false, false, false]
        );
        assert_eq!(kept("5 <= x"), [false, true, false, true]);
        assert_eq!(kept("x > 1.5"), [false, true, false, true]);
        assert_eq!(kept("x < 300000"), [true, true, false, true]);
        assert_eq!(kept("day >= '1970-01-02'"), [false, true, true, false]);
        assert_eq!(kept("x = null"), [false, false, false, false]);
    }

    #[test]
    fn nan_is_neither_greater_nor_less() {
        assert_eq!(kept("f > 0"), [true, false, false, true]);
        assert_eq!(kept("f < 10"), [true, false, false, true]);
        assert_eq!(kept("f != 2"), [true, true, false, false]);
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let e = |expr: &str| match Filter::parse(expr).and_then(|f| f.check(&schema(), false)) {
            Ok(_) => panic!("{expr} was taken"),
            Err(e) => e.to_string(),
        };
        assert!(
            e("cty = 'a'").contains("no column 'cty' (nearest: city"),
            "{}",
            e("cty = 'a'")
        );
        let wrong = e("x = 'a'");
        assert!(
            wrong.contains("column 'x' is Int32, and string 'a' is a string"),
            "{wrong}"
        );
        assert!(e("day > 'yesterday'").contains("is no Date32"));
        let syntax = e("x > ");
        assert!(syntax.starts_with("where=x >  does not parse"), "{syntax}");
        assert!(syntax.contains("at column 5"), "{syntax}");
        assert!(
            e("x > 1 1").contains("unexpected '1' at column 7"),
            "{}",
            e("x > 1 1")
        );
        assert!(e("x = city").contains("compares column 'x' with column 'city'"));
        assert!(e("bucket(f, 4) = 1").contains("bucket() takes"));
        assert!(e("lower(city) = 'a'").contains("'lower' is no function"));
    }

    fn bounds(min: Vec<Option<i32>>, max: Vec<Option<i32>>, nulls: Vec<Nulls>) -> Known {
        Known::Bounds {
            min: Arc::new(Int32Array::from(min)),
            max: Arc::new(Int32Array::from(max)),
            nulls,
        }
    }

    #[test]
    fn statistics_rule_units_out_keep_them_whole_or_ask_to_read() {
        let decide = |expr: &str, known: Known| {
            let c = Filter::parse(expr)
                .unwrap()
                .check(&schema(), false)
                .unwrap();
            c.decide(3, &|col| match col {
                0 => Ok(known.clone()),
                _ => Ok(Known::Unknown),
            })
            .unwrap()
        };
        let k = bounds(
            vec![Some(0), Some(10), None],
            vec![Some(5), Some(20), None],
            vec![Nulls::None, Nulls::None, Nulls::Some],
        );
        let (o, a, r) = (Decision::None, Decision::All, Decision::Read);
        assert_eq!(decide("x > 7", k.clone()), [o, a, r]);
        assert_eq!(decide("x <= 5", k.clone()), [a, o, r]);
        assert_eq!(decide("x = 7", k.clone()), [o, o, r]);
        assert_eq!(decide("not x = 7", k.clone()), [a, a, r]);
        assert_eq!(decide("x between 6 and 30", k.clone()), [o, a, r]);
        assert_eq!(decide("x in (1, 30)", k.clone()), [r, o, r]);
        assert_eq!(decide("x > 7 and city = 'a'", k.clone()), [o, r, r]);
        assert_eq!(decide("x > 7 or city = 'a'", k.clone()), [r, a, r]);
        assert_eq!(decide("x is null", k.clone()), [o, o, r]);
        let constant = Known::Constant(Arc::new(Int32Array::from(vec![Some(3), None, Some(8)])));
        assert_eq!(decide("x > 7", constant.clone()), [o, o, a]);
        assert_eq!(decide("not x > 7", constant), [a, o, o]);
    }

    #[test]
    fn a_partial_check_leaves_unknown_columns_undecided() {
        let partitions = Schema::new(vec![Field::new("day", DataType::Utf8, true)]);
        let c = Filter::parse("day in ('a', 'b') and x > 3")
            .unwrap()
            .check(&partitions, true)
            .unwrap();
        let days = Known::Constant(Arc::new(StringArray::from(vec!["a", "c"])));
        let d = c.decide(2, &|_| Ok(days.clone())).unwrap();
        assert_eq!(d, [Decision::Read, Decision::None]);
    }
}
