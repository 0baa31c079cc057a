//! Apache Hudi merge-on-read: a file slice's log files read and merged with its base file as
//! the `hudi` package (hudi-rs 0.5, its default file-group reader, a port of Java's
//! `HoodieFileGroupReader`) merges them.
//!
//! A log file (`.FILEID_INSTANT.log.VERSION_TOKEN` beside its base files) is a run of blocks:
//! `#HUDI#`, the block's length (u64), the log format version (u32, 1), the block type (u32),
//! a header (u32 count, then key u32, length u32, UTF-8 value), the content (u64 length, bytes),
//! a footer like the header, and the block's size less 8 (u64); all big-endian. Blocks read:
//! Avro data (3: u32 version 3, u32 count, then each record's length and Avro binary in the
//! writer schema of header key 2), Parquet data (5: a whole Parquet file), deletes (1: u32
//! version 3, u32 length, an Avro `HoodieDeleteRecordList`), and rollback commands (0, header
//! key 3 = "0": the blocks of instant key 1 seen before it are dropped). Corrupt and CDC blocks
//! are skipped, as hudi-rs skips them; an HFile block, another version or an unknown code is
//! refused in one line naming it.
//!
//! At instant T a data or delete block counts when its instant (header key 0) is at or before
//! T and, below table version 8, a completed commit; a rollback counts whatever its instant.
//! Records are keyed by `_hoodie_record_key` (or the record key fields where the table keeps
//! no meta fields) and merged in the order their instants were first seen: under
//! `EVENT_TIME_ORDERING` the record with the greater ordering value wins (ties to the newer),
//! under `COMMIT_TIME_ORDERING` the newer. The base file's rows with a winning log record, or
//! a winning delete, are the base file's deleted rows; the winning log records are served
//! after them as rows of their own.

use crate::source::ObjectReader;
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The record key column Hudi writes into every row and log record.
const RECORD_KEY: &str = "_hoodie_record_key";

/// A log file of a file slice, as its name and the timeline place it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogFile {
    /// Relative to the table's root.
    pub(crate) path: String,
    pub(crate) file_id: String,
    /// The instant its name gives: the slice's base instant below table version 8, the
    /// writing delta commit's from 8 on.
    pub(crate) instant: u64,
    pub(crate) version: u32,
    pub(crate) token: String,
    /// When the instant that wrote it completed (timeline layout 2), where known.
    pub(crate) completion: Option<u64>,
}

impl LogFile {
    /// A log file's name (`.FILEID_INSTANT.log.VERSION_TOKEN`) as hudi-rs parses it.
    pub(crate) fn parse(path: &str) -> Option<LogFile> {
        let name = path.rsplit('/').next()?;
        let rest = name.strip_prefix('.')?;
        let (file_id, rest) = rest.split_once('_')?;
        let (middle, token) = rest.rsplit_once('_')?;
        let parts: Vec<&str> = middle.split('.').collect();
        let [instant, "log", version] = parts[..] else {
            return None;
        };
        if token.is_empty() || file_id.is_empty() {
            return None;
        }
        Some(LogFile {
            path: path.to_string(),
            file_id: file_id.to_string(),
            instant: instant.parse().ok()?,
            version: version.parse().ok()?,
            token: token.to_string(),
            completion: None,
        })
    }

    /// hudi-rs's order of a slice's log files: completed ones by completion, then the others
    /// by instant; then version and write token.
    pub(crate) fn order(&self) -> (bool, u64, u32, String) {
        match self.completion {
            Some(c) => (false, c, self.version, self.token.clone()),
            None => (true, self.instant, self.version, self.token.clone()),
        }
    }
}

/// How records of one key are merged (`hoodie.record.merge.mode`, or as hudi-rs infers it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    EventTime,
    CommitTime,
}

impl Mode {
    /// The table's merge mode, as hudi-rs resolves it from its properties.
    pub(crate) fn of(
        get: &dyn Fn(&str) -> Option<String>,
        version: u32,
        ordered: bool,
    ) -> Result<Mode> {
        if let Some(m) = get("hoodie.record.merge.mode") {
            return match m.to_ascii_uppercase().as_str() {
                "EVENT_TIME_ORDERING" => Ok(Mode::EventTime),
                "COMMIT_TIME_ORDERING" => Ok(Mode::CommitTime),
                other => bail!(
                    "its records merge by a custom merger (hoodie.record.merge.mode={other}), which tensorfs does not run"
                ),
            };
        }
        let first = |keys: &[&str]| keys.iter().find_map(|k| get(k));
        let payload = first(&[
            "hoodie.compaction.payload.class",
            "hoodie.datasource.write.payload.class",
            "hoodie.table.legacy.payload.class",
        ]);
        let strategy = first(&[
            "hoodie.record.merge.strategy.id",
            "hoodie.compaction.record.merger.strategy",
        ]);
        let by_payload = payload.as_deref().map(|p| match p {
            "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
            | "org.apache.hudi.common.model.EventTimeAvroPayload" => Some(Mode::EventTime),
            "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload" => Some(Mode::CommitTime),
            _ => None,
        });
        let by_strategy = strategy.as_deref().map(|s| match s {
            "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5" => Some(Mode::EventTime),
            "ce9acb64-bde0-424c-9b91-f6ebba25356d" => Some(Mode::CommitTime),
            _ => None,
        });
        let decided = match version >= 8 {
            true => by_strategy.or(by_payload),
            false => by_payload.or(by_strategy),
        };
        match decided {
            None => Ok(match ordered {
                true => Mode::EventTime,
                false => Mode::CommitTime,
            }),
            Some(Some(mode)) => Ok(mode),
            Some(None) => bail!(
                "its records merge by a custom payload or merger ({}), which tensorfs does not run",
                payload.or(strategy).unwrap_or_default()
            ),
        }
    }
}

/// What merging needs of the table.
pub(crate) struct Merging {
    pub(crate) mode: Mode,
    /// The ordering (precombine) field, where the table has one.
    pub(crate) ordering: Option<String>,
    /// The record key fields, for a table that keeps no meta fields.
    pub(crate) key_fields: Vec<String>,
    pub(crate) meta_fields: bool,
    pub(crate) table_version: u32,
    /// The instants of completed commits (the blocks' gate below table version 8), and the
    /// earliest instant on the timeline (older ones count as completed).
    pub(crate) completed: HashSet<u64>,
    pub(crate) first_active: Option<u64>,
    /// The instant read.
    pub(crate) as_of: u64,
}

/// A file slice merged: the base file's rows a log replaced or deleted (their positions), and
/// the log records served, as one record batch of the table's columns.
pub(crate) struct Merged {
    pub(crate) deleted: roaring::RoaringTreemap,
    pub(crate) rows: Option<RecordBatch>,
}

/// A value records of one key are ordered by.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
enum Ordering {
    /// None given (a null, or a delete's `IntWrapper(0)`): compares as the long 0.
    Default,
    Long(i64),
    Double(f64),
    Decimal(i128, i8),
    String(String),
}

impl Ordering {
    fn class(&self) -> u8 {
        match self {
            Ordering::Default | Ordering::Long(_) => 0,
            Ordering::Double(_) => 1,
            Ordering::Decimal(..) => 2,
            Ordering::String(_) => 3,
        }
    }

    /// Whether `self` orders at or after `other` (same class only).
    fn at_least(&self, other: &Ordering) -> bool {
        match (self, other) {
            (Ordering::Decimal(a, sa), Ordering::Decimal(b, sb)) => {
                let (a, b) = scaled(*a, *sa, *b, *sb);
                a >= b
            }
            (Ordering::String(a), Ordering::String(b)) => a >= b,
            (Ordering::Double(a), Ordering::Double(b)) => a >= b,
            (a, b) => a.long() >= b.long(),
        }
    }

    fn long(&self) -> i64 {
        match self {
            Ordering::Long(v) => *v,
            _ => 0,
        }
    }
}

fn scaled(a: i128, sa: i8, b: i128, sb: i8) -> (i128, i128) {
    let up = |v: i128, by: i8| v.saturating_mul(10i128.saturating_pow(by.max(0) as u32));
    match sa.cmp(&sb) {
        std::cmp::Ordering::Less => (up(a, sb - sa), b),
        std::cmp::Ordering::Greater => (a, up(b, sa - sb)),
        std::cmp::Ordering::Equal => (a, b),
    }
}

/// A record of the buffer: a row of a decoded block, or a delete.
#[derive(Clone, Debug)]
struct Buffered {
    /// The block's batch and the row in it; none for a delete.
    row: Option<(usize, usize)>,
    ordering: Option<Ordering>,
}

impl Buffered {
    fn is_delete(&self) -> bool {
        self.row.is_none()
    }

    /// A delete that orders by commit time (no ordering value of its own).
    fn commit_time_delete(&self) -> bool {
        self.is_delete() && matches!(self.ordering, None | Some(Ordering::Default))
    }
}

/// Whether `new` wins over `old` under event-time ordering (ties go to the newer).
fn keep_newer(old: &Buffered, new: &Buffered) -> bool {
    if new.commit_time_delete() || old.commit_time_delete() {
        return true;
    }
    match (&old.ordering, &new.ordering) {
        (Some(o), Some(n)) => o.class() != n.class() || n.at_least(o),
        _ => true,
    }
}

/// The merge buffer of one slice: records by key, in the order keys were first seen.
struct Buffer {
    mode: Mode,
    by_key: HashMap<String, usize>,
    records: Vec<(String, Option<Buffered>)>,
}

impl Buffer {
    fn new(mode: Mode) -> Buffer {
        Buffer {
            mode,
            by_key: HashMap::new(),
            records: Vec::new(),
        }
    }

    fn existing(&self, key: &str) -> Option<&Buffered> {
        self.by_key
            .get(key)
            .and_then(|&i| self.records[i].1.as_ref())
    }

    fn set(&mut self, key: String, record: Buffered) {
        match self.by_key.get(&key) {
            Some(&i) => self.records[i].1 = Some(record),
            None => {
                self.by_key.insert(key.clone(), self.records.len());
                self.records.push((key, Some(record)));
            }
        }
    }

    fn record(&mut self, key: String, new: Buffered) {
        let wins = match (self.mode, self.existing(&key)) {
            (_, None) | (Mode::CommitTime, _) => true,
            (Mode::EventTime, Some(old)) => keep_newer(old, &new),
        };
        if wins {
            self.set(key, new);
        }
    }

    fn delete(&mut self, key: String, delete: Buffered) {
        let wins = match (self.mode, self.existing(&key)) {
            (_, None) | (Mode::CommitTime, _) => true,
            (Mode::EventTime, Some(old)) if old.commit_time_delete() => false,
            (Mode::EventTime, Some(old)) => match (&delete.ordering, &old.ordering) {
                (Some(d), Some(o)) if *d != Ordering::Default && d.class() == o.class() => {
                    // The delete loses only to a record ordered strictly after it.
                    !o.at_least(d) || d.at_least(o)
                }
                _ => true,
            },
        };
        if wins {
            self.set(key, delete);
        }
    }

    /// Takes the record of `key` out.
    fn take(&mut self, key: &str) -> Option<Buffered> {
        let i = self.by_key.remove(key)?;
        self.records[i].1.take()
    }
}

/// One block of a log file.
struct Block {
    kind: u32,
    header: HashMap<u32, String>,
    content: Bytes,
}

const AVRO_DATA: u32 = 3;
const PARQUET_DATA: u32 = 5;
const DELETE: u32 = 1;
const COMMAND: u32 = 0;
const CORRUPT: u32 = 2;
const HFILE_DATA: u32 = 4;
const CDC_DATA: u32 = 6;
const INSTANT_TIME: u32 = 0;
const TARGET_INSTANT_TIME: u32 = 1;
const SCHEMA: u32 = 2;
const COMMAND_BLOCK_TYPE: u32 = 3;

/// The blocks of a log file.
fn blocks(bytes: &Bytes) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<Bytes> {
        let end = at.checked_add(n).filter(|&e| e <= bytes.len());
        let end = end.ok_or_else(|| anyhow!("a block runs past the file's end at byte {at}"))?;
        let b = bytes.slice(*at..end);
        *at = end;
        Ok(b)
    };
    let u32_at = |at: &mut usize| -> Result<u32> {
        Ok(u32::from_be_bytes(
            take(at, 4)?[..].try_into().expect("4 bytes"),
        ))
    };
    let u64_at = |at: &mut usize| -> Result<u64> {
        Ok(u64::from_be_bytes(
            take(at, 8)?[..].try_into().expect("8 bytes"),
        ))
    };
    let metadata = |at: &mut usize| -> Result<HashMap<u32, String>> {
        let n = u32_at(at)?;
        let mut m = HashMap::new();
        for _ in 0..n {
            let key = u32_at(at)?;
            if key > 8 {
                bail!("a block's header has key {key}, which Hudi does not define");
            }
            let len = u32_at(at)? as usize;
            let value = take(at, len)?;
            m.insert(key, String::from_utf8_lossy(&value).into_owned());
        }
        Ok(m)
    };
    while at < bytes.len() {
        let start = at;
        if &take(&mut at, 6)?[..] != b"#HUDI#" {
            bail!("no block starts at byte {start} (no #HUDI# magic)");
        }
        let len = u64_at(&mut at)? as usize;
        let end = at.saturating_add(len);
        let format = u32_at(&mut at)?;
        if format != 1 {
            bail!("its log format version is {format}, which tensorfs does not read (only 1)");
        }
        let kind = u32_at(&mut at)?;
        if kind > CDC_DATA {
            bail!("a block of type {kind}, which Hudi does not define");
        }
        let header = metadata(&mut at)?;
        let content_len = u64_at(&mut at)? as usize;
        let content = take(&mut at, content_len)?;
        let _footer = metadata(&mut at)?;
        let _back = u64_at(&mut at)?;
        if at != end {
            bail!("the block at byte {start} ends at {at}, where its length says {end}");
        }
        out.push(Block {
            kind,
            header,
            content,
        });
    }
    Ok(out)
}

fn instant_of(block: &Block, key: u32) -> Option<u64> {
    block.header.get(&key).and_then(|t| t.parse().ok())
}

/// The data and delete blocks of a slice's log files that count at the instant read, in the
/// order they are merged (instants in the order first seen, blocks in file order).
fn counted(logs: Vec<(String, Vec<Block>)>, m: &Merging) -> Result<Vec<Block>> {
    let mut order: Vec<u64> = Vec::new();
    let mut by_instant: HashMap<u64, Vec<Block>> = HashMap::new();
    for (file, blocks) in logs {
        for b in blocks {
            if b.kind == CORRUPT || b.kind == CDC_DATA {
                continue;
            }
            let Some(instant) = instant_of(&b, INSTANT_TIME) else {
                continue;
            };
            if b.kind == COMMAND {
                if b.header.get(&COMMAND_BLOCK_TYPE).map(String::as_str) == Some("0")
                    && let Some(target) = instant_of(&b, TARGET_INSTANT_TIME)
                    && by_instant.remove(&target).is_some()
                {
                    order.retain(|&i| i != target);
                }
                continue;
            }
            if b.kind == HFILE_DATA {
                bail!(
                    "log file '{file}' holds an HFile block, which tensorfs does not read in a data table"
                );
            }
            if instant > m.as_of {
                continue;
            }
            let committed = m.completed.contains(&instant)
                || m.first_active.is_some_and(|first| instant < first);
            if m.table_version < 8 && !committed {
                continue;
            }
            if !by_instant.contains_key(&instant) {
                order.push(instant);
            }
            by_instant.entry(instant).or_default().push(b);
        }
    }
    Ok(order
        .into_iter()
        .flat_map(|i| by_instant.remove(&i).unwrap_or_default())
        .collect())
}

/// The Avro schema of a delete block's content: the ordering value is a union of one-field
/// wrapper records (as Hudi writes it; not a union of primitives).
const DELETE_RECORDS: &str = r#"{"type":"record","name":"HoodieDeleteRecordList","namespace":"org.apache.hudi.avro.model","fields":[{"name":"deleteRecordList","type":{"type":"array","items":{"type":"record","name":"HoodieDeleteRecord","fields":[{"name":"recordKey","type":["null","string"]},{"name":"partitionPath","type":["null","string"]},{"name":"orderingVal","type":["null",
{"type":"record","name":"BooleanWrapper","fields":[{"name":"value","type":"boolean"}]},
{"type":"record","name":"IntWrapper","fields":[{"name":"value","type":"int"}]},
{"type":"record","name":"LongWrapper","fields":[{"name":"value","type":"long"}]},
{"type":"record","name":"FloatWrapper","fields":[{"name":"value","type":"float"}]},
{"type":"record","name":"DoubleWrapper","fields":[{"name":"value","type":"double"}]},
{"type":"record","name":"BytesWrapper","fields":[{"name":"value","type":"bytes"}]},
{"type":"record","name":"StringWrapper","fields":[{"name":"value","type":"string"}]},
{"type":"record","name":"DateWrapper","fields":[{"name":"value","type":"int"}]},
{"type":"record","name":"DecimalWrapper","fields":[{"name":"value","type":{"type":"bytes","logicalType":"decimal","precision":30,"scale":15}}]},
{"type":"record","name":"TimeMicrosWrapper","fields":[{"name":"value","type":"long"}]},
{"type":"record","name":"TimestampMicrosWrapper","fields":[{"name":"value","type":"long"}]}
]}]}}}]}"#;

/// A delete block's records: each key and its ordering value.
fn deletes(block: &Block) -> Result<Vec<(String, Option<Ordering>)>> {
    use apache_avro::types::Value;
    let c = &block.content;
    if c.len() < 8 {
        bail!("a delete block of {} bytes", c.len());
    }
    let version = u32::from_be_bytes(c[..4].try_into().expect("4 bytes"));
    if version != 3 {
        bail!(
            "a delete block of version {version}, which tensorfs does not read (only 3; older ones are Kryo)"
        );
    }
    let len = u32::from_be_bytes(c[4..8].try_into().expect("4 bytes")) as usize;
    let body = c
        .get(8..8 + len)
        .ok_or_else(|| anyhow!("a delete block shorter than it says"))?;
    let schema = apache_avro::Schema::parse_str(DELETE_RECORDS).expect("a valid schema");
    let value = apache_avro::from_avro_datum(&schema, &mut &body[..], None)
        .context("a delete block's records cannot be read")?;
    let plain = |v: &Value| -> Value {
        match v {
            Value::Union(_, inner) => (**inner).clone(),
            v => v.clone(),
        }
    };
    let Value::Record(fields) = value else {
        bail!("a delete block holds no record list");
    };
    let Some((_, Value::Array(items))) = fields.into_iter().next() else {
        bail!("a delete block holds no record list");
    };
    let mut out = Vec::new();
    for item in items {
        let Value::Record(f) = item else { continue };
        let get = |name: &str| f.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let Some(Value::String(key)) = get("recordKey").map(plain) else {
            bail!("a delete record has no record key");
        };
        let ordering = match get("orderingVal") {
            Some(Value::Union(branch, inner)) => {
                let value = match &**inner {
                    Value::Record(w) => w.first().map(|(_, v)| v.clone()),
                    _ => None,
                };
                match (branch, value) {
                    (0, _) | (_, None) => Some(Ordering::Default),
                    (2, Some(Value::Int(0))) => Some(Ordering::Default),
                    (_, Some(Value::Boolean(b))) => Some(Ordering::Long(b as i64)),
                    (_, Some(Value::Int(v))) => Some(Ordering::Long(v as i64)),
                    (_, Some(Value::Long(v))) => Some(Ordering::Long(v)),
                    (_, Some(Value::Float(v))) => Some(Ordering::Double(v as f64)),
                    (_, Some(Value::Double(v))) => Some(Ordering::Double(v)),
                    (_, Some(Value::String(s))) => Some(Ordering::String(s)),
                    (_, Some(Value::Decimal(d))) => {
                        let bytes: Vec<u8> = (&d).try_into().unwrap_or_default();
                        Some(Ordering::Decimal(signed_be(&bytes), 15))
                    }
                    (_, Some(other)) => bail!(
                        "a delete record orders by a value of a kind tensorfs does not compare ({other:?})"
                    ),
                }
            }
            _ => Some(Ordering::Default),
        };
        out.push((key, ordering));
    }
    Ok(out)
}

/// A big-endian two's complement integer (a decimal's unscaled value).
fn signed_be(bytes: &[u8]) -> i128 {
    let mut v: i128 = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
        -1
    } else {
        0
    };
    for &b in bytes.iter().take(16) {
        v = (v << 8) | b as i128;
    }
    v
}

/// The columns a log block's records are read as: the table's, then the record key and
/// Hudi's delete markers.
fn block_schema(table: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = (table.fields().iter())
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    for name in [RECORD_KEY, "_hoodie_operation"] {
        if table.field_with_name(name).is_err() {
            fields.push(Field::new(name, DataType::Utf8, true));
        }
    }
    if table.field_with_name("_hoodie_is_deleted").is_err() {
        fields.push(Field::new("_hoodie_is_deleted", DataType::Boolean, true));
    }
    Arc::new(Schema::new(fields))
}

/// An Avro data block's records as a record batch of `schema`'s columns, found by name (a
/// column the writer schema lacks is null, and refused where the table serves it).
fn avro_rows(block: &Block, schema: &SchemaRef, table: &Schema) -> Result<RecordBatch> {
    use apache_avro::types::Value;
    let c = &block.content;
    if c.len() < 8 {
        bail!("an Avro data block of {} bytes", c.len());
    }
    let version = u32::from_be_bytes(c[..4].try_into().expect("4 bytes"));
    if version != 3 {
        bail!("an Avro data block of version {version}, which tensorfs does not read (only 3)");
    }
    let writer = block
        .header
        .get(&SCHEMA)
        .ok_or_else(|| anyhow!("an Avro data block names no schema"))?;
    let writer = apache_avro::Schema::parse_str(writer)
        .context("an Avro data block's schema cannot be read")?;
    let count = u32::from_be_bytes(c[4..8].try_into().expect("4 bytes")) as usize;
    let mut at = 8usize;
    let mut records: Vec<Vec<(String, Value)>> = Vec::with_capacity(count);
    for _ in 0..count {
        let len = c
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| anyhow!("an Avro data block shorter than its count"))?;
        at += 4;
        let body = c
            .get(at..at + len)
            .ok_or_else(|| anyhow!("an Avro data block shorter than its records"))?;
        at += len;
        match apache_avro::from_avro_datum(&writer, &mut &body[..], None)
            .context("an Avro record of a log block cannot be read")?
        {
            Value::Record(fields) => records.push(fields),
            other => bail!("an Avro data block holds a {other:?}, not a record"),
        }
    }
    let names: HashSet<&str> = records
        .first()
        .map(|r| r.iter().map(|(n, _)| n.as_str()).collect())
        .unwrap_or_default();
    if !records.is_empty()
        && let Some(missing) = table
            .fields()
            .iter()
            .find(|f| !names.contains(f.name().as_str()))
    {
        bail!(
            "a log block's records lack column '{}' (a partial update), which tensorfs does not merge yet",
            missing.name()
        );
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let values: Vec<Option<&Value>> = (records.iter())
            .map(|r| r.iter().find(|(n, _)| n == f.name()).map(|(_, v)| v))
            .collect();
        columns.push(
            avro_array(&values, f.data_type())
                .with_context(|| format!("column '{}' of a log block", f.name()))?,
        );
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Avro values as an Arrow array of type `t`.
fn avro_array(values: &[Option<&apache_avro::types::Value>], t: &DataType) -> Result<ArrayRef> {
    use apache_avro::types::Value;
    use arrow::array::*;
    let plain: Vec<Option<&Value>> = (values.iter())
        .map(|v| {
            let mut v = (*v)?;
            while let Value::Union(_, inner) = v {
                v = inner;
            }
            (!matches!(v, Value::Null)).then_some(v)
        })
        .collect();
    let int = |v: &Value| -> Option<i64> {
        match v {
            Value::Int(x) | Value::Date(x) | Value::TimeMillis(x) => Some(*x as i64),
            Value::Long(x)
            | Value::TimeMicros(x)
            | Value::TimestampMillis(x)
            | Value::TimestampMicros(x)
            | Value::TimestampNanos(x)
            | Value::LocalTimestampMillis(x)
            | Value::LocalTimestampMicros(x)
            | Value::LocalTimestampNanos(x) => Some(*x),
            Value::Boolean(b) => Some(*b as i64),
            _ => None,
        }
    };
    let float = |v: &Value| -> Option<f64> {
        match v {
            Value::Float(x) => Some(*x as f64),
            Value::Double(x) => Some(*x),
            v => int(v).map(|x| x as f64),
        }
    };
    let bytes = |v: &Value| -> Option<Vec<u8>> {
        match v {
            Value::Bytes(b) | Value::Fixed(_, b) => Some(b.clone()),
            Value::String(s) => Some(s.as_bytes().to_vec()),
            Value::Decimal(d) => d.try_into().ok(),
            _ => None,
        }
    };
    // Timestamps: Avro's unit as the value says, converted to the column's.
    let in_unit = |v: &Value, unit: &TimeUnit| -> Option<i64> {
        let (x, per_s): (i64, i64) = match v {
            Value::TimestampMillis(x) | Value::LocalTimestampMillis(x) => (*x, 1_000),
            Value::TimestampMicros(x) | Value::LocalTimestampMicros(x) => (*x, 1_000_000),
            Value::TimestampNanos(x) | Value::LocalTimestampNanos(x) => (*x, 1_000_000_000),
            v => (int(v)?, 1_000_000),
        };
        let want: i64 = match unit {
            TimeUnit::Second => 1,
            TimeUnit::Millisecond => 1_000,
            TimeUnit::Microsecond => 1_000_000,
            TimeUnit::Nanosecond => 1_000_000_000,
        };
        Some(match want >= per_s {
            true => x.saturating_mul(want / per_s),
            false => x.div_euclid(per_s / want),
        })
    };
    let refuse = |v: &Value| anyhow!("an Avro {v:?} is not a {t}");
    macro_rules! prim {
        ($builder:ty, $get:expr) => {{
            let mut b = <$builder>::new();
            for v in &plain {
                match v {
                    None => b.append_null(),
                    Some(v) => b.append_value($get(v).ok_or_else(|| refuse(v))?),
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    Ok(match t {
        DataType::Boolean => prim!(BooleanBuilder, |v: &Value| match v {
            Value::Boolean(b) => Some(*b),
            _ => None,
        }),
        DataType::Int8 => prim!(Int8Builder, |v: &Value| int(v)
            .and_then(|x| i8::try_from(x).ok())),
        DataType::Int16 => prim!(Int16Builder, |v: &Value| int(v)
            .and_then(|x| i16::try_from(x).ok())),
        DataType::Int32 => prim!(Int32Builder, |v: &Value| int(v)
            .and_then(|x| i32::try_from(x).ok())),
        DataType::Int64 => prim!(Int64Builder, int),
        DataType::UInt8 => prim!(UInt8Builder, |v: &Value| int(v)
            .and_then(|x| u8::try_from(x).ok())),
        DataType::UInt16 => prim!(UInt16Builder, |v: &Value| int(v)
            .and_then(|x| u16::try_from(x).ok())),
        DataType::UInt32 => prim!(UInt32Builder, |v: &Value| int(v)
            .and_then(|x| u32::try_from(x).ok())),
        DataType::UInt64 => prim!(UInt64Builder, |v: &Value| int(v)
            .and_then(|x| u64::try_from(x).ok())),
        DataType::Float32 => prim!(Float32Builder, |v: &Value| float(v).map(|x| x as f32)),
        DataType::Float64 => prim!(Float64Builder, float),
        DataType::Date32 => prim!(Date32Builder, |v: &Value| int(v)
            .and_then(|x| i32::try_from(x).ok())),
        DataType::Utf8 => prim!(StringBuilder, |v: &Value| match v {
            Value::String(s) | Value::Enum(_, s) => Some(s.clone()),
            Value::Uuid(u) => Some(u.to_string()),
            _ => None,
        }),
        DataType::LargeUtf8 => prim!(LargeStringBuilder, |v: &Value| match v {
            Value::String(s) | Value::Enum(_, s) => Some(s.clone()),
            _ => None,
        }),
        DataType::Binary => prim!(BinaryBuilder, bytes),
        DataType::LargeBinary => prim!(LargeBinaryBuilder, bytes),
        DataType::FixedSizeBinary(n) => {
            let mut b = FixedSizeBinaryBuilder::with_capacity(plain.len(), *n);
            for v in &plain {
                match v {
                    None => b.append_null(),
                    Some(v) => b.append_value(bytes(v).ok_or_else(|| refuse(v))?)?,
                }
            }
            Arc::new(b.finish())
        }
        DataType::Timestamp(unit, tz) => {
            let mut out: Vec<Option<i64>> = Vec::with_capacity(plain.len());
            for v in &plain {
                out.push(match v {
                    None => None,
                    Some(v) => Some(in_unit(v, unit).ok_or_else(|| refuse(v))?),
                });
            }
            let a: ArrayRef = match unit {
                TimeUnit::Second => {
                    Arc::new(TimestampSecondArray::from(out).with_timezone_opt(tz.clone()))
                }
                TimeUnit::Millisecond => {
                    Arc::new(TimestampMillisecondArray::from(out).with_timezone_opt(tz.clone()))
                }
                TimeUnit::Microsecond => {
                    Arc::new(TimestampMicrosecondArray::from(out).with_timezone_opt(tz.clone()))
                }
                TimeUnit::Nanosecond => {
                    Arc::new(TimestampNanosecondArray::from(out).with_timezone_opt(tz.clone()))
                }
            };
            a
        }
        DataType::Decimal128(p, s) => {
            let mut out: Vec<Option<i128>> = Vec::with_capacity(plain.len());
            for v in &plain {
                out.push(match v {
                    None => None,
                    Some(v) => Some(signed_be(&bytes(v).ok_or_else(|| refuse(v))?)),
                });
            }
            Arc::new(Decimal128Array::from(out).with_precision_and_scale(*p, *s)?)
        }
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            let mut lens = Vec::with_capacity(plain.len());
            let mut children: Vec<Option<&Value>> = Vec::new();
            for v in &plain {
                match v {
                    None => lens.push(None),
                    Some(Value::Array(items)) => {
                        lens.push(Some(items.len()));
                        children.extend(items.iter().map(Some));
                    }
                    Some(v) => return Err(refuse(v)),
                }
            }
            let child = avro_array(&children, item.data_type())?;
            let nulls = arrow::buffer::NullBuffer::from(
                lens.iter().map(Option::is_some).collect::<Vec<_>>(),
            );
            let lens = lens.iter().map(|l| l.unwrap_or(0));
            match t {
                DataType::List(_) => Arc::new(ListArray::try_new(
                    item.clone(),
                    arrow::buffer::OffsetBuffer::from_lengths(lens),
                    child,
                    Some(nulls),
                )?),
                DataType::LargeList(_) => Arc::new(LargeListArray::try_new(
                    item.clone(),
                    arrow::buffer::OffsetBuffer::from_lengths(lens),
                    child,
                    Some(nulls),
                )?),
                DataType::FixedSizeList(_, n) => Arc::new(FixedSizeListArray::try_new(
                    item.clone(),
                    *n,
                    child,
                    Some(nulls),
                )?),
                _ => unreachable!("a list type"),
            }
        }
        DataType::Struct(fields) => {
            let mut columns = Vec::with_capacity(fields.len());
            for f in fields {
                let values: Vec<Option<&Value>> = (plain.iter())
                    .map(|v| match v {
                        Some(Value::Record(r)) => {
                            r.iter().find(|(n, _)| n == f.name()).map(|(_, v)| v)
                        }
                        _ => None,
                    })
                    .collect();
                columns.push(avro_array(&values, f.data_type())?);
            }
            let nulls = arrow::buffer::NullBuffer::from(
                plain.iter().map(Option::is_some).collect::<Vec<_>>(),
            );
            Arc::new(StructArray::try_new(fields.clone(), columns, Some(nulls))?)
        }
        other => {
            bail!("a log block's column of type {other}, which tensorfs does not read from Avro")
        }
    })
}

/// A Parquet data block's rows as a record batch of `schema`'s columns (by name, cast).
fn parquet_rows(block: &Block, schema: &SchemaRef) -> Result<RecordBatch> {
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        block.content.clone(),
    )
    .context("a Parquet data block cannot be read")?
    .build()?;
    let batches: Vec<RecordBatch> = reader.collect::<std::result::Result<_, _>>()?;
    let Some(first) = batches.first() else {
        return Ok(RecordBatch::new_empty(schema.clone()));
    };
    let whole = arrow::compute::concat_batches(&first.schema(), &batches)?;
    let mut columns = Vec::new();
    for f in schema.fields() {
        columns.push(match whole.column_by_name(f.name()) {
            Some(c) => arrow::compute::cast(c, f.data_type())?,
            None => arrow::array::new_null_array(f.data_type(), whole.num_rows()),
        });
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Each row's record key: `_hoodie_record_key`, or (no meta fields) the key fields' values.
fn keys(batch: &RecordBatch, m: &Merging) -> Result<Vec<Option<String>>> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .ok_or_else(|| anyhow!("its rows lack record key column '{name}'"))
    };
    let strings = |c: &ArrayRef| -> Result<Vec<Option<String>>> {
        let c = arrow::compute::cast(c, &DataType::Utf8)?;
        let c = c.as_string::<i32>();
        Ok((0..c.len())
            .map(|i| c.is_valid(i).then(|| c.value(i).to_string()))
            .collect())
    };
    if m.meta_fields {
        let from_meta = strings(column(RECORD_KEY)?)?;
        if from_meta.iter().all(Option::is_some) || m.key_fields.is_empty() {
            return Ok(from_meta);
        }
    }
    let parts: Vec<Vec<Option<String>>> = (m.key_fields.iter())
        .map(|f| strings(column(f)?))
        .collect::<Result<_>>()?;
    Ok((0..batch.num_rows())
        .map(|i| match parts.len() {
            1 => parts[0][i].clone(),
            _ => Some(
                (m.key_fields.iter().zip(&parts))
                    .map(|(f, p)| format!("{f}:{}", p[i].as_deref().unwrap_or("null")))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        })
        .collect())
}

/// Each row's ordering value (none where the table has no ordering field).
fn orderings(batch: &RecordBatch, m: &Merging) -> Result<Vec<Option<Ordering>>> {
    let Some(field) = &m.ordering else {
        return Ok(vec![None; batch.num_rows()]);
    };
    let Some(c) = batch.column_by_name(field) else {
        return Ok(vec![Some(Ordering::Default); batch.num_rows()]);
    };
    // Each row's value, a null ordering as none given.
    let each = |value: &dyn Fn(usize) -> Ordering| -> Vec<Option<Ordering>> {
        (0..c.len())
            .map(|i| {
                Some(if c.is_valid(i) {
                    value(i)
                } else {
                    Ordering::Default
                })
            })
            .collect()
    };
    Ok(match c.data_type() {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            let c = arrow::compute::cast(c, &DataType::Float64)?;
            let c = c.as_primitive::<arrow::datatypes::Float64Type>();
            each(&|i| Ordering::Double(c.value(i)))
        }
        DataType::Decimal128(_, s) => {
            let c = c.as_primitive::<arrow::datatypes::Decimal128Type>();
            each(&|i| Ordering::Decimal(c.value(i), *s))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let c = arrow::compute::cast(c, &DataType::Utf8)?;
            let c = c.as_string::<i32>();
            each(&|i| Ordering::String(c.value(i).to_string()))
        }
        DataType::Boolean => {
            let c = c.as_boolean();
            each(&|i| Ordering::Long(c.value(i) as i64))
        }
        t if t.is_integer() || t.is_temporal() => {
            let c = arrow::compute::cast(c, &DataType::Int64)?;
            let c = c.as_primitive::<arrow::datatypes::Int64Type>();
            each(&|i| Ordering::Long(c.value(i)))
        }
        t => bail!("its ordering field '{field}' is a {t}, which tensorfs does not compare"),
    })
}

/// Whether each row is a delete Hudi marks in the row itself.
fn marked_deleted(batch: &RecordBatch) -> Vec<bool> {
    let n = batch.num_rows();
    let mut out = vec![false; n];
    if let Some(c) = batch.column_by_name("_hoodie_is_deleted")
        && let Some(c) = c.as_boolean_opt()
    {
        for (i, o) in out.iter_mut().enumerate() {
            *o |= c.is_valid(i) && c.value(i);
        }
    }
    if let Some(c) = batch.column_by_name("_hoodie_operation")
        && let Ok(c) = arrow::compute::cast(c, &DataType::Utf8)
    {
        let c = c.as_string::<i32>();
        for (i, o) in out.iter_mut().enumerate() {
            *o |= c.is_valid(i) && matches!(c.value(i), "D" | "-U");
        }
    }
    out
}

/// Merges a file slice at the instant read: its base file (`base`, where it has one, read for
/// its record keys and ordering values only) and its log files (`logs`, in hudi-rs's order).
/// `table` is the table's columns as served (Hudi's meta columns left out).
pub(crate) async fn merge_slice(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    base: Option<ObjectReader>,
    logs: &[LogFile],
    table: &Schema,
    m: &Merging,
    stats: &Stats,
) -> Result<Merged> {
    let mut read = Vec::with_capacity(logs.len());
    for log in logs {
        let path = crate::source::child(root, &log.path)?;
        let bytes = (store.get(&path).await)
            .with_context(|| format!("log file '{}' cannot be read", log.path))?
            .bytes()
            .await?;
        Stats::add(&stats.c.remote_requests, 1);
        Stats::add(&stats.c.remote_bytes, bytes.len() as u64);
        let b = blocks(&bytes).with_context(|| format!("log file '{}'", log.path))?;
        read.push((log.path.clone(), b));
    }
    let schema = block_schema(table);
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut buffer = Buffer::new(m.mode);
    for block in counted(read, m)? {
        match block.kind {
            DELETE => {
                for (key, ordering) in deletes(&block)? {
                    buffer.delete(
                        key,
                        Buffered {
                            row: None,
                            ordering,
                        },
                    );
                }
            }
            AVRO_DATA | PARQUET_DATA => {
                let batch = match block.kind {
                    AVRO_DATA => avro_rows(&block, &schema, table)?,
                    _ => parquet_rows(&block, &schema)?,
                };
                let (keys, orderings, deleted) = (
                    keys(&batch, m)?,
                    orderings(&batch, m)?,
                    marked_deleted(&batch),
                );
                let at = batches.len();
                for (i, ((key, ordering), deleted)) in
                    keys.into_iter().zip(orderings).zip(deleted).enumerate()
                {
                    let key = key.ok_or_else(|| anyhow!("a log record has no record key"))?;
                    let record = Buffered {
                        row: (!deleted).then_some((at, i)),
                        ordering,
                    };
                    match deleted {
                        true => buffer.delete(key, record),
                        false => buffer.record(key, record),
                    }
                }
                batches.push(batch);
            }
            _ => {}
        }
    }
    // The base file's rows, in order: each kept, or replaced by its key's log record.
    let mut deleted = roaring::RoaringTreemap::new();
    let mut served: Vec<(usize, usize)> = Vec::new();
    if let Some(reader) = base {
        let builder = parquet::arrow::ParquetRecordBatchStreamBuilder::new(reader).await?;
        let wanted: Vec<&str> = match m.meta_fields {
            true => vec![RECORD_KEY],
            false => m.key_fields.iter().map(String::as_str).collect(),
        };
        let wanted: Vec<&str> = wanted.into_iter().chain(m.ordering.as_deref()).collect();
        let file_schema = builder.schema().clone();
        let roots: Vec<usize> = (0..file_schema.fields().len())
            .filter(|&i| wanted.contains(&file_schema.field(i).name().as_str()))
            .collect();
        let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), roots);
        let stream = builder.with_projection(mask).build()?;
        let parts: Vec<RecordBatch> = stream.try_collect().await?;
        let mut position = 0u64;
        for part in parts {
            let (keys, orderings) = (keys(&part, m)?, orderings(&part, m)?);
            for (key, ordering) in keys.into_iter().zip(orderings) {
                let Some(log) = key.as_deref().and_then(|k| buffer.take(k)) else {
                    position += 1;
                    continue;
                };
                let base = Buffered {
                    row: Some((usize::MAX, 0)),
                    ordering,
                };
                let log_wins = match m.mode {
                    Mode::CommitTime => true,
                    Mode::EventTime => keep_newer(&base, &log),
                };
                if log_wins {
                    deleted.insert(position);
                    if let Some(row) = log.row {
                        served.push(row);
                    }
                }
                position += 1;
            }
        }
    }
    served.extend(buffer.records.into_iter().filter_map(|(_, r)| r?.row));
    let rows = match served.is_empty() {
        true => None,
        false => {
            let columns = (0..table.fields().len())
                .map(|c| {
                    let arrays: Vec<&dyn Array> =
                        batches.iter().map(|b| b.column(c).as_ref()).collect();
                    arrow::compute::interleave(&arrays, &served)
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let table = Arc::new(table.clone());
            Some(RecordBatch::try_new(table, columns)?)
        }
    };
    Ok(Merged { deleted, rows })
}

/// A record batch as the bytes of a Parquet file of one row group.
pub(crate) fn parquet_bytes(rows: &RecordBatch) -> Result<Bytes> {
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, rows.schema(), None)?;
    w.write(rows)?;
    w.close()?;
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_file_names_are_parsed_as_hudi_rs_parses_them() {
        let f = LogFile::parse("region=us/.db2fca8f-0_20260307135830801.log.1_0-10-23").unwrap();
        assert_eq!(f.file_id, "db2fca8f-0");
        assert_eq!(f.instant, 20260307135830801);
        assert_eq!((f.version, f.token.as_str()), (1, "0-10-23"));
        assert!(LogFile::parse("region=us/.hoodie_partition_metadata").is_none());
        assert!(LogFile::parse("a_1_2.parquet").is_none());
        assert!(LogFile::parse(".x_1.cdc.1_0").is_none());
    }

    #[test]
    fn event_time_keeps_the_greater_ordering_and_ties_go_to_the_newer() {
        let r = |row, o| Buffered {
            row: Some((0, row)),
            ordering: Some(Ordering::Long(o)),
        };
        let mut b = Buffer::new(Mode::EventTime);
        b.record("k".into(), r(0, 5));
        b.record("k".into(), r(1, 3));
        assert_eq!(b.existing("k").unwrap().row, Some((0, 0)));
        b.record("k".into(), r(2, 5));
        assert_eq!(b.existing("k").unwrap().row, Some((0, 2)));
        // A delete without an ordering of its own always wins; one ordered lower loses.
        b.delete(
            "k".into(),
            Buffered {
                row: None,
                ordering: Some(Ordering::Long(1)),
            },
        );
        assert!(!b.existing("k").unwrap().is_delete());
        b.delete(
            "k".into(),
            Buffered {
                row: None,
                ordering: Some(Ordering::Default),
            },
        );
        assert!(b.existing("k").unwrap().is_delete());
        let mut c = Buffer::new(Mode::CommitTime);
        c.record("k".into(), r(0, 5));
        c.record("k".into(), r(1, 3));
        assert_eq!(c.existing("k").unwrap().row, Some((0, 1)));
    }

    #[test]
    fn decimals_compare_by_value_across_scales() {
        assert!(Ordering::Decimal(150, 2).at_least(&Ordering::Decimal(15, 1)));
        assert!(!Ordering::Decimal(149, 2).at_least(&Ordering::Decimal(15, 1)));
        assert_eq!(signed_be(&[0xff, 0x38]), -200);
    }
}
