//! A Delta table's log, replayed to one version's live data files (the Delta transaction
//! protocol, `PROTOCOL.md` of delta-io/delta): the newest complete checkpoint at or before the
//! version (classic, multi-part, or v2 with its sidecars; in Parquet or, for v2, JSON), then each
//! commit after it in order. A file is live once added and until removed, keyed by its path
//! and deletion vector. The protocol and metadata are the last ones the log names.
//!
//! Only what a mount needs is read: `add` (path, partition values, whether it has a deletion
//! vector), `remove`, `metaData`, `protocol` and `sidecar`. Log compaction files and
//! `_last_checkpoint` are hints a reader may skip: the listing finds every checkpoint.

use anyhow::{Context, Result, anyhow, bail};
use arrow::array::{Array, AsArray, RecordBatch, StringArray, StructArray};
use arrow::datatypes::DataType;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::source::deletes::DeletionVector;

/// The reader features a table may require that a mount reads: each is either handled here
/// (checkpoints in v2, timestamps without time zone, widened types cast as any file's are,
/// vacuum's protocol check) or refused where the table uses it (deletion vectors, column
/// mapping: [`crate::source::delta`]).
const READER_FEATURES: [&str; 8] = [
    "columnMapping",
    "deletionVectors",
    "timestampNtz",
    // Not a protocol name, but existing tables carry it for timestampNtz (the Delta kernel
    // reads them: delta-io/delta-kernel-rs#2557).
    "timestampWithoutTimezone",
    "typeWidening",
    "typeWidening-preview",
    "v2Checkpoint",
    "vacuumProtocolCheck",
];

/// The log cannot give the version asked for: it never had it, or its commits up to it were
/// cleaned up. Told apart from a log that cannot be read.
#[derive(Debug)]
pub(crate) struct NoVersion(pub String);

impl std::fmt::Display for NoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoVersion {}

/// Commits fetched at once after the checkpoint.
const COMMITS_AT_ONCE: usize = 16;

/// A live data file as the log adds it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Added {
    /// Relative to the table's root, percent-decoded (the log writes it as a URI; adds and
    /// removes of one file are matched decoded, since writers have encoded them differently).
    pub(crate) path: String,
    /// Partition values as strings; a null value is absent.
    pub(crate) partition_values: HashMap<String, String>,
    /// The rows the table deletes from the file, if it deletes any.
    pub(crate) deletion_vector: Option<DeletionVector>,
    /// `add.stats`, the file's statistics as JSON (numRecords, minValues, maxValues,
    /// nullCount), where the log has them and they were asked for.
    pub(crate) stats: Option<String>,
}

/// One version of the table, as its log says.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) version: u64,
    /// `metaData.schemaString`, parsed.
    pub(crate) schema: Value,
    pub(crate) partition_columns: Vec<String>,
    pub(crate) configuration: HashMap<String, String>,
    /// Whether the protocol lets the table map its columns (`delta.columnMapping.mode` counts
    /// only then): reader version 2, or 3 with the `columnMapping` feature.
    pub(crate) column_mapping: bool,
    /// The live files, in no particular order.
    pub(crate) files: Vec<Added>,
}

/// What the log's actions have made so far.
#[derive(Default)]
struct Replay {
    /// Live files by (path, deletion vector's id).
    live: HashMap<(String, Option<String>), Added>,
    metadata: Option<Value>,
    protocol: Option<Value>,
    /// Sidecar files a v2 checkpoint names (relative to `_delta_log/_sidecars/`).
    sidecars: Vec<String>,
    /// Whether the adds' statistics are kept (for a `where=`): most of a checkpoint's bytes.
    with_stats: bool,
}

impl Replay {
    /// File `path` (decoded) added, with deletion vector `dv` and partition values.
    fn add(
        &mut self,
        path: String,
        dv: Option<DeletionVector>,
        partition_values: HashMap<String, String>,
        stats: Option<String>,
    ) {
        let id = dv.as_ref().map(DeletionVector::unique_id);
        let stats = stats.filter(|_| self.with_stats);
        let added = Added {
            path: path.clone(),
            partition_values,
            deletion_vector: dv,
            stats,
        };
        self.live.insert((path, id), added);
    }

    /// Applies one action of a commit or checkpoint, given as JSON.
    fn apply_json(&mut self, action: &Value) -> Result<()> {
        let Some(action) = action.as_object() else {
            bail!("an action is not a JSON object");
        };
        if let Some(add) = action.get("add") {
            let path = decoded(&str_field(add, "path")?)?;
            let values = (add.get("partitionValues").and_then(Value::as_object))
                .map(|values| {
                    (values.iter())
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            let stats = add.get("stats").and_then(Value::as_str).map(str::to_string);
            self.add(path, dv_of(add.get("deletionVector")), values, stats);
        }
        if let Some(remove) = action.get("remove") {
            let path = decoded(&str_field(remove, "path")?)?;
            let dv = dv_of(remove.get("deletionVector"));
            self.live
                .remove(&(path, dv.as_ref().map(DeletionVector::unique_id)));
        }
        if let Some(m) = action.get("metaData") {
            self.metadata = Some(m.clone());
        }
        if let Some(p) = action.get("protocol") {
            self.protocol = Some(p.clone());
        }
        if let Some(s) = action.get("sidecar") {
            self.sidecars.push(str_field(s, "path")?);
        }
        Ok(())
    }

    /// Applies the actions of a checkpoint (or sidecar) in Parquet: each row holds one.
    fn apply_parquet(&mut self, batch: &RecordBatch) -> Result<()> {
        if let Some(add) = batch.column_by_name("add") {
            let add = add.as_struct_opt().context("'add' is not a struct")?;
            let paths = strings(add, "path")?;
            let dvs = match add.column_by_name("deletionVector") {
                Some(dv) => dvs_of(dv)?,
                None => vec![None; add.len()],
            };
            let values = add.column_by_name("partitionValues");
            let stats = match add.column_by_name("stats") {
                Some(_) => strings(add, "stats")?,
                None => vec![None; add.len()],
            };
            for i in 0..add.len() {
                let (true, Some(path)) = (add.is_valid(i), paths[i].as_deref()) else {
                    continue;
                };
                let values = match values {
                    Some(v) => map_row(v, i)?,
                    None => HashMap::new(),
                };
                self.add(decoded(path)?, dvs[i].clone(), values, stats[i].clone());
            }
        }
        // Removes in a checkpoint are tombstones of files already gone from its adds.
        if let Some(m) = last_action(batch, "metaData")? {
            self.metadata = Some(m);
        }
        if let Some(p) = last_action(batch, "protocol")? {
            self.protocol = Some(p);
        }
        if let Some(sidecar) = batch.column_by_name("sidecar") {
            let sidecar = sidecar
                .as_struct_opt()
                .context("'sidecar' is not a struct")?;
            let paths = strings(sidecar, "path")?;
            for i in (0..sidecar.len()).filter(|&i| sidecar.is_valid(i)) {
                if let Some(p) = paths[i].clone() {
                    self.sidecars.push(p);
                }
            }
        }
        Ok(())
    }
}

/// The last action `name` (a struct column) of a checkpoint's batch, as the JSON a commit writes.
fn last_action(batch: &RecordBatch, name: &str) -> Result<Option<Value>> {
    let Some(column) = batch.column_by_name(name) else {
        return Ok(None);
    };
    let column = (column.as_struct_opt()).with_context(|| format!("'{name}' is not a struct"))?;
    (0..column.len())
        .rfind(|&i| column.is_valid(i))
        .map(|i| struct_row_json(column, i))
        .transpose()
}

fn str_field(action: &Value, name: &str) -> Result<String> {
    (action.get(name).and_then(Value::as_str))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("an action has no '{name}'"))
}

/// A deletion vector as an action gives it; `None` where there is none (no struct, or no
/// storage type).
fn dv_of(dv: Option<&Value>) -> Option<DeletionVector> {
    let dv = dv.and_then(Value::as_object)?;
    let storage = dv.get("storageType").and_then(Value::as_str)?;
    let number = |name: &str| dv.get(name).and_then(Value::as_u64);
    Some(DeletionVector {
        storage_type: storage.to_string(),
        path_or_inline_dv: (dv.get("pathOrInlineDv").and_then(Value::as_str))
            .unwrap_or("")
            .to_string(),
        offset: number("offset"),
        // A remove names the vector only to match its add; a read checks the size it needs.
        size_in_bytes: number("sizeInBytes").unwrap_or(0),
        cardinality: number("cardinality").unwrap_or(0),
    })
}

/// [`dv_of`] of every row of a checkpoint's `deletionVector` column.
fn dvs_of(column: &Arc<dyn Array>) -> Result<Vec<Option<DeletionVector>>> {
    let dv = column
        .as_struct_opt()
        .context("'deletionVector' is not a struct")?;
    let storage = strings(dv, "storageType")?;
    let paths = strings(dv, "pathOrInlineDv").unwrap_or_else(|_| vec![None; dv.len()]);
    let numbers = |name: &str| -> Result<Vec<Option<u64>>> {
        let Some(o) = dv.column_by_name(name) else {
            return Ok(vec![None; dv.len()]);
        };
        let o = arrow::compute::cast(o, &DataType::Int64)?;
        let o = o.as_primitive::<arrow::datatypes::Int64Type>();
        Ok((0..o.len())
            .map(|i| o.is_valid(i).then(|| o.value(i) as u64))
            .collect())
    };
    let (offsets, sizes, counts) = (
        numbers("offset")?,
        numbers("sizeInBytes")?,
        numbers("cardinality")?,
    );
    (0..dv.len())
        .map(|i| {
            let Some(storage) = storage[i].as_deref().filter(|_| dv.is_valid(i)) else {
                return Ok(None);
            };
            Ok(Some(DeletionVector {
                storage_type: storage.to_string(),
                path_or_inline_dv: paths[i].clone().unwrap_or_default(),
                offset: offsets[i],
                size_in_bytes: sizes[i].unwrap_or(0),
                cardinality: counts[i].unwrap_or(0),
            }))
        })
        .collect()
}

/// A path as the log writes it (a URI reference), percent-decoded.
fn decoded(path: &str) -> Result<String> {
    Ok(percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| anyhow!("file '{path}' of the table is not a UTF-8 path"))?
        .into_owned())
}

/// Column `name` of `s` as strings (whatever string type the writer chose).
fn strings(s: &StructArray, name: &str) -> Result<Vec<Option<String>>> {
    let column = (s.column_by_name(name)).with_context(|| format!("no '{name}' field"))?;
    let column = arrow::compute::cast(column, &DataType::Utf8)?;
    let column: &StringArray = column.as_string();
    Ok(column.iter().map(|v| v.map(str::to_string)).collect())
}

/// Row `i` of a map column of strings (`partitionValues`, `configuration`); null values left
/// out.
fn map_row(column: &Arc<dyn Array>, i: usize) -> Result<HashMap<String, String>> {
    let map = column.as_map_opt().context("not a map")?;
    let mut out = HashMap::new();
    if !map.is_valid(i) {
        return Ok(out);
    }
    let entries = map.value(i);
    let keys = arrow::compute::cast(entries.column(0), &DataType::Utf8)?;
    let values = arrow::compute::cast(entries.column(1), &DataType::Utf8)?;
    for (k, v) in keys
        .as_string::<i32>()
        .iter()
        .zip(values.as_string::<i32>().iter())
    {
        if let (Some(k), Some(v)) = (k, v) {
            out.insert(k.to_string(), v.to_string());
        }
    }
    Ok(out)
}

/// Row `i` of a struct column as the JSON object a commit would write (the few fields read:
/// strings, integers, lists of strings, maps of strings, nested structs).
fn struct_row_json(s: &StructArray, i: usize) -> Result<Value> {
    let mut object = serde_json::Map::new();
    for (field, column) in s.fields().iter().zip(s.columns()) {
        if !column.is_valid(i) {
            continue;
        }
        let value = match column.data_type() {
            DataType::Struct(_) => struct_row_json(column.as_struct(), i)?,
            DataType::Map(..) => Value::Object(
                (map_row(column, i)?.into_iter())
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            ),
            DataType::List(_) | DataType::LargeList(_) => {
                let list = arrow::compute::cast(column, &DataType::new_list(DataType::Utf8, true))?;
                let items = list.as_list::<i32>().value(i);
                Value::Array(
                    (items.as_string::<i32>().iter())
                        .map(|v| v.map_or(Value::Null, |v| Value::String(v.to_string())))
                        .collect(),
                )
            }
            t if t.is_integer() => {
                let v = arrow::compute::cast(column, &DataType::Int64)?;
                Value::from(v.as_primitive::<arrow::datatypes::Int64Type>().value(i))
            }
            DataType::Boolean => Value::Bool(column.as_boolean().value(i)),
            _ => match arrow::compute::cast(column, &DataType::Utf8) {
                Ok(v) => Value::String(v.as_string::<i32>().value(i).to_string()),
                Err(_) => continue,
            },
        };
        object.insert(field.name().clone(), value);
    }
    Ok(Value::Object(object))
}

/// A file of the log, by its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum LogFile {
    Commit(u64),
    /// A single-file checkpoint: classic (`V.checkpoint.parquet`) or v2
    /// (`V.checkpoint.UUID.json|parquet`); the name.
    Checkpoint(u64, String),
    /// Part `part` of `parts` of a multi-part checkpoint.
    Part(u64, u32, u32),
}

/// What a name in `_delta_log/` is; `None` for anything else (`.crc`, `_last_checkpoint`, log
/// compaction files, sidecars).
fn log_file(name: &str) -> Option<LogFile> {
    let (version, rest) = name.split_at_checked(20)?;
    if !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u64 = version.parse().ok()?;
    if rest == ".json" {
        return Some(LogFile::Commit(v));
    }
    let rest = rest.strip_prefix(".checkpoint.")?;
    if rest == "parquet" {
        return Some(LogFile::Checkpoint(v, name.to_string()));
    }
    let digits = |s: &str| s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(parts) = rest.strip_suffix(".parquet")
        && let Some((part, of)) = parts.split_once('.')
        && digits(part)
        && digits(of)
    {
        return Some(LogFile::Part(v, part.parse().ok()?, of.parse().ok()?));
    }
    let uuid = rest
        .strip_suffix(".json")
        .or_else(|| rest.strip_suffix(".parquet"))?;
    (!uuid.contains('.') && !uuid.is_empty()).then(|| LogFile::Checkpoint(v, name.to_string()))
}

/// The newest checkpoint at or before `version` whose files are all there: its version and
/// file names.
fn newest_checkpoint(files: &BTreeSet<LogFile>, version: u64) -> Option<(u64, Vec<String>)> {
    let mut best: Option<(u64, Vec<String>)> = None;
    let mut parts: BTreeMap<(u64, u32), BTreeSet<u32>> = BTreeMap::new();
    for f in files {
        match f {
            LogFile::Checkpoint(v, name)
                if *v <= version && best.as_ref().is_none_or(|(b, _)| v > b) =>
            {
                best = Some((*v, vec![name.clone()]));
            }
            LogFile::Part(v, part, of) if *v <= version => {
                parts.entry((*v, *of)).or_default().insert(*part);
            }
            _ => {}
        }
    }
    for ((v, of), have) in parts {
        let complete = have.len() == of as usize && (1..=of).all(|p| have.contains(&p));
        if complete && best.as_ref().is_none_or(|(b, _)| v > *b) {
            let names = (1..=of)
                .map(|p| format!("{v:020}.checkpoint.{p:010}.{of:010}.parquet"))
                .collect();
            best = Some((v, names));
        }
    }
    best
}

/// Reads version `version` (the latest when `None`) of the table whose root is `root`.
pub(crate) async fn snapshot(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    version: Option<crate::options::AsOf>,
    with_stats: bool,
) -> Result<Snapshot> {
    let log = root.clone().join(super::delta::LOG);
    let listed: Vec<object_store::ObjectMeta> = store.list(Some(&log)).try_collect().await?;
    let files: BTreeSet<LogFile> = (listed.iter())
        .filter_map(|m| {
            m.location
                .prefix_match(&log)?
                .collect::<Vec<_>>()
                .first()
                .cloned()
        })
        .filter_map(|part| log_file(part.as_ref()))
        .collect();
    let commits: BTreeSet<u64> = (files.iter())
        .filter_map(|f| match f {
            LogFile::Commit(v) => Some(*v),
            _ => None,
        })
        .collect();
    let versions = (files.iter()).map(|f| match f {
        LogFile::Commit(v) | LogFile::Checkpoint(v, _) | LogFile::Part(v, ..) => *v,
    });
    let (first, latest) = (versions.clone().min(), versions.max());
    let (Some(first), Some(latest)) = (first, latest) else {
        bail!("its _delta_log/ holds no commit");
    };
    let version = match version {
        None => latest,
        Some(crate::options::AsOf::Number(n)) => n,
        Some(at @ crate::options::AsOf::Time(t)) => as_of_time(store, &log, &listed, at, t).await?,
    };
    let checkpoint = newest_checkpoint(&files, version);
    let from = checkpoint.as_ref().map_or(0, |(v, _)| v + 1);
    if checkpoint.as_ref().is_none_or(|(v, _)| *v != version) && !commits.contains(&version) {
        return Err(NoVersion(match version < first {
            true => format!(
                "the Delta table has no version {version} any more: its log starts at version {first}"
            ),
            false => format!("the Delta table has no version {version} (its latest is {latest})"),
        })
        .into());
    }
    if let Some(missing) = (from..=version).find(|v| !commits.contains(v)) {
        // Log retention removes the commits before a checkpoint it keeps.
        let cleaned = newest_checkpoint(&files, latest).is_some_and(|(c, _)| c > version);
        return Err(match cleaned {
            true => NoVersion(format!(
                "the Delta table has no version {version} any more: commit {missing} was cleaned up from its log"
            ))
            .into(),
            false => {
                anyhow!("its Delta log lacks commit {missing} (of versions {from} to {version})")
            }
        });
    }
    let mut replay = Replay {
        with_stats,
        ..Replay::default()
    };
    if let Some((_, names)) = &checkpoint {
        for name in names {
            read_log_file(store, &log.clone().join(name.as_str()), &mut replay)
                .await
                .with_context(|| format!("checkpoint {name}"))?;
        }
        for sidecar in std::mem::take(&mut replay.sidecars) {
            let path = log
                .clone()
                .join("_sidecars")
                .join(decoded(&sidecar)?.as_str());
            read_log_file(store, &path, &mut replay)
                .await
                .with_context(|| format!("sidecar {sidecar}"))?;
        }
    }
    // Fetched several at a time (a table appended to by a stream has many commits after its
    // last checkpoint), applied in order.
    let mut fetched = futures::stream::iter(from..=version)
        .map(|v| {
            let name = format!("{v:020}.json");
            let path = log.clone().join(name.as_str());
            async move {
                let bytes = store.get(&path).await?.bytes().await;
                anyhow::Ok((name, bytes?))
            }
        })
        .buffered(COMMITS_AT_ONCE);
    while let Some((name, bytes)) = fetched.try_next().await? {
        apply_json_lines(&bytes, &mut replay).with_context(|| format!("commit {name}"))?;
    }
    let protocol = replay.protocol.context("its log names no protocol")?;
    let column_mapping = check_protocol(&protocol, version)?;
    let metadata = replay.metadata.context("its log names no metaData")?;
    let schema: Value = serde_json::from_str(
        (metadata.get("schemaString").and_then(Value::as_str))
            .context("its metaData has no schemaString")?,
    )
    .context("its schemaString is not JSON")?;
    let partition_columns = (metadata.get("partitionColumns").and_then(Value::as_array))
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let configuration = (metadata.get("configuration").and_then(Value::as_object))
        .map(|c| {
            c.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Ok(Snapshot {
        version,
        schema,
        partition_columns,
        configuration,
        column_mapping,
        files: replay.live.into_values().collect(),
    })
}

/// Refuses a protocol this reader does not speak, naming what it lacks; else whether it lets
/// the table map its columns.
fn check_protocol(protocol: &Value, version: u64) -> Result<bool> {
    let min_reader = protocol
        .get("minReaderVersion")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    if min_reader > 3 {
        bail!(
            "Delta table version {version} needs a reader of protocol version {min_reader}, which tensorfs is not"
        );
    }
    let features = (protocol.get("readerFeatures").and_then(Value::as_array))
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>())
        .unwrap_or_default();
    if min_reader == 3 {
        let unknown: Vec<&str> = (features.iter().copied())
            .filter(|f| !READER_FEATURES.contains(f))
            .collect();
        if !unknown.is_empty() {
            bail!(
                "Delta table version {version} needs the reader feature(s) {}, which tensorfs does not support",
                unknown.join(", ")
            );
        }
    }
    Ok(min_reader == 2 || min_reader == 3 && features.contains(&"columnMapping"))
}

/// Applies the actions of a log file in newline-delimited JSON.
fn apply_json_lines(bytes: &[u8], replay: &mut Replay) -> Result<()> {
    for line in bytes.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let action: Value = serde_json::from_slice(line).context("a line is not JSON")?;
        replay.apply_json(&action)?;
    }
    Ok(())
}

/// The version current at time `t` (ms since the Unix epoch), as the Delta protocol times a
/// version: its commit's `inCommitTimestamp` where the table writes in-commit timestamps (as
/// Databricks does by default), else its commit file's modification time. In-commit timestamps
/// only grow, so where the newest commit has one the version is found by a binary search, a
/// few commits read; else it is the last commit whose file was written at or before `t`.
async fn as_of_time(
    store: &Arc<dyn ObjectStore>,
    log: &Path,
    listed: &[object_store::ObjectMeta],
    at: crate::options::AsOf,
    t: i64,
) -> Result<u64> {
    let times: std::collections::BTreeMap<u64, i64> = (listed.iter())
        .filter_map(|m| {
            let part = m.location.prefix_match(log)?.next()?;
            match log_file(part.as_ref())? {
                LogFile::Commit(v) => Some((v, m.last_modified.timestamp_millis())),
                _ => None,
            }
        })
        .collect();
    let versions: Vec<u64> = times.keys().copied().collect();
    let newest = versions.last().copied();
    let timed = match newest {
        Some(v) => in_commit_timestamp(store, log, v).await?.is_some(),
        None => false,
    };
    if timed {
        let times = &times;
        let time_of = |v: u64| async move {
            let ict = in_commit_timestamp(store, log, v).await?;
            anyhow::Ok(ict.unwrap_or(times[&v]))
        };
        // The first version timed after `t`.
        let (mut lo, mut hi) = (0, versions.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match time_of(versions[mid]).await? <= t {
                true => lo = mid + 1,
                false => hi = mid,
            }
        }
        if lo > 0 {
            return Ok(versions[lo - 1]);
        }
        let first = versions[0];
        let when = crate::options::AsOf::Time(time_of(first).await?);
        return Err(NoVersion(format!(
            "the Delta table has no version at or before {at}: its first, version {first}, was committed at {when}"
        ))
        .into());
    }
    if let Some((&v, _)) = times.iter().rev().find(|&(_, &ms)| ms <= t) {
        return Ok(v);
    }
    let first = match times.iter().next() {
        Some((v, ms)) => format!(
            ": its first, version {v}, was committed at {}",
            crate::options::AsOf::Time(*ms)
        ),
        None => String::new(),
    };
    Err(NoVersion(format!(
        "the Delta table has no version at or before {at}{first}"
    ))
    .into())
}

/// Commit `v`'s in-commit timestamp, where its first action (its `commitInfo`, which a table
/// with in-commit timestamps writes first) holds one.
async fn in_commit_timestamp(
    store: &Arc<dyn ObjectStore>,
    log: &Path,
    v: u64,
) -> Result<Option<i64>> {
    let path = log.clone().join(format!("{v:020}.json").as_str());
    // The first line is enough, and a commit of many files is large: its head first.
    let head = store.get_range(&path, 0..65536).await;
    let bytes = match head {
        Ok(b) if b.contains(&b'\n') => b,
        _ => store.get(&path).await?.bytes().await?,
    };
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let action: Value = match serde_json::from_slice(first) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    Ok(action
        .get("commitInfo")
        .and_then(|c| c.get("inCommitTimestamp"))
        .and_then(Value::as_i64))
}

/// Applies the actions of one log file: newline-delimited JSON, or Parquet.
async fn read_log_file(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    replay: &mut Replay,
) -> Result<()> {
    let bytes = store.get(path).await?.bytes().await?;
    if path.as_ref().ends_with(".json") {
        return apply_json_lines(&bytes, replay);
    }
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    // Of the adds only what is read (their statistics, most of a checkpoint's bytes, only for
    // a `where=`).
    let mut wanted = vec![
        "add.path",
        "add.partitionValues",
        "add.deletionVector",
        "metaData",
        "protocol",
        "sidecar.path",
    ];
    if replay.with_stats {
        wanted.push("add.stats");
    }
    let schema = builder.parquet_schema();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&i| {
            let path = schema.column(i).path().string();
            (wanted.iter()).any(|w| path == *w || path.starts_with(&format!("{w}.")))
        })
        .collect();
    let mask = ProjectionMask::leaves(schema, leaves);
    for batch in builder.with_projection(mask).build()? {
        replay.apply_parquet(&batch?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies actions written as a commit writes them.
    fn apply(r: &mut Replay, lines: &str) {
        apply_json_lines(lines.as_bytes(), r).unwrap();
    }

    #[test]
    fn log_names_are_told_apart() {
        assert_eq!(
            log_file("00000000000000000007.json"),
            Some(LogFile::Commit(7))
        );
        assert_eq!(
            log_file("00000000000000000010.checkpoint.parquet"),
            Some(LogFile::Checkpoint(
                10,
                "00000000000000000010.checkpoint.parquet".into()
            ))
        );
        assert_eq!(
            log_file("00000000000000000010.checkpoint.0000000002.0000000003.parquet"),
            Some(LogFile::Part(10, 2, 3))
        );
        let v2 = "00000000000000000008.checkpoint.e5ac4dc4-b8d3-4362-8572-c52142a9da1f.json";
        assert_eq!(log_file(v2), Some(LogFile::Checkpoint(8, v2.into())));
        for other in [
            "00000000000000000007.crc",
            "_last_checkpoint",
            "00000000000000000001.00000000000000000004.compacted.json",
            "7.json",
        ] {
            assert_eq!(log_file(other), None, "{other}");
        }
    }

    #[test]
    fn adds_and_removes_meet_by_decoded_path_and_deletion_vector_id() {
        let mut r = Replay::default();
        apply(
            &mut r,
            r#"{"add":{"path":"a%20b.parquet","partitionValues":{}}}"#,
        );
        apply(&mut r, r#"{"remove":{"path":"a b.parquet"}}"#);
        assert!(r.live.is_empty());
        // A null offset is no offset; a struct without a storage type is no deletion vector.
        let dv = r#"{"storageType":"u","pathOrInlineDv":"x","offset":null}"#;
        apply(
            &mut r,
            &format!(r#"{{"add":{{"path":"c.parquet","deletionVector":{dv}}}}}"#),
        );
        apply(
            &mut r,
            r#"{"remove":{"path":"c.parquet","deletionVector":{"storageType":"u","pathOrInlineDv":"x"}}}"#,
        );
        assert!(r.live.is_empty());
        apply(
            &mut r,
            r#"{"add":{"path":"d.parquet","deletionVector":{"storageType":null}}}"#,
        );
        assert!(
            r.live[&("d.parquet".to_string(), None)]
                .deletion_vector
                .is_none()
        );
    }

    #[test]
    fn the_newest_complete_checkpoint_at_or_before_the_version_is_chosen() {
        let files: BTreeSet<LogFile> = [
            "00000000000000000005.checkpoint.parquet",
            "00000000000000000010.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000010.checkpoint.0000000002.0000000002.parquet",
            "00000000000000000012.checkpoint.0000000001.0000000002.parquet",
        ]
        .iter()
        .filter_map(|n| log_file(n))
        .collect();
        assert_eq!(newest_checkpoint(&files, 4), None);
        assert_eq!(newest_checkpoint(&files, 9).unwrap().0, 5);
        // 12's second part is missing: 10's two parts.
        let (v, names) = newest_checkpoint(&files, 20).unwrap();
        assert_eq!((v, names.len()), (10, 2));
    }

    #[test]
    fn a_file_is_live_from_its_add_until_its_remove_keyed_with_its_deletion_vector() {
        let mut r = Replay::default();
        apply(
            &mut r,
            r#"{"add":{"path":"a.parquet","partitionValues":{"y":"1","z":null}}}"#,
        );
        apply(
            &mut r,
            r#"{"add":{"path":"b.parquet","partitionValues":{}}}"#,
        );
        apply(&mut r, r#"{"remove":{"path":"a.parquet"}}"#);
        let dv = r#"{"storageType":"u","pathOrInlineDv":"x","offset":1}"#;
        apply(
            &mut r,
            &format!(r#"{{"add":{{"path":"b.parquet","deletionVector":{dv}}}}}"#),
        );
        apply(&mut r, r#"{"remove":{"path":"b.parquet"}}"#);
        let live: Vec<&Added> = r.live.values().collect();
        assert_eq!(live.len(), 1);
        assert!(live[0].path == "b.parquet" && live[0].deletion_vector.is_some());
        apply(
            &mut r,
            r#"{"add":{"path":"c.parquet","partitionValues":{"y":"1","z":null}}}"#,
        );
        let c = &r.live[&("c.parquet".to_string(), None)];
        assert_eq!(c.partition_values.len(), 1);
    }
}
