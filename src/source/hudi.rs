//! Apache Hudi tables (PRODUCT.md §8): a table read at an instant, as the `hudi` package
//! (hudi-rs) reads it. Its root holds `.hoodie/`: `hoodie.properties` (the table's type
//! and layout) and the timeline, one file an instant (`.hoodie/` itself in table versions up
//! to 6; `.hoodie/timeline/` from 8 on, where a completed instant is named with its
//! completion time too). Each data file is a base file of a file group, named
//! `FILEID_WRITETOKEN_INSTANT.parquet` in its partition's directory. The table at an instant is
//! the newest base file of each file group written by an instant completed at or before it, less
//! the file groups a replace commit (an insert overwrite, a clustering) replaced by then.
//! Files of instants not completed (in flight, failed, rolled back) are none of it; cleaned
//! ones are gone.
//!
//! A merge-on-read table's file slices with log files are merged ([`crate::source::hudi_log`]):
//! each slice's log files attach by their completion time, as hudi-rs attaches them. A table
//! whose partition columns are only in its paths
//! (`hoodie.datasource.write.drop.partition.columns`) is refused in one line.
//! Hudi's meta columns (`_hoodie_commit_time`, …: strings) are left out of the dataset.

use crate::source::hudi_log::{LogFile, Merging};
use crate::source::lake::{ColumnBounds, FileBounds, Opening, TableKind, Version};
use crate::source::{ObjectReader, Origin, SourceFile, load_metadata, object_of};
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use object_store::ObjectMeta;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use url::Url;

/// The table at the instant asked for, as every table kind answers
/// ([`crate::source::lake::TableKind::open`]).
pub(crate) async fn open(at: &Opening<'_>) -> Result<crate::source::lake::Table> {
    let names: Vec<&str> = at.listed.iter().map(|(n, _)| n.as_str()).collect();
    let t = read(at.store.clone(), at.root, &names, at.version).await?;
    let metas: HashMap<&str, &ObjectMeta> =
        (at.listed.iter()).map(|(n, m)| (n.as_str(), m)).collect();
    let data_schema = schema(at.store, at.url, &t, &metas, at.footers, at.stats).await?;
    let (t, deletes, memory) = merged(at, t, &metas, &data_schema).await?;
    let bounds = match at.filter {
        Some(_) => partition_bounds(&t, &data_schema),
        None => Vec::new(),
    };
    let deletes = (t.files.iter()).map(|f| deletes.get(f).cloned()).collect();
    Ok(crate::source::lake::Table {
        version: Version {
            kind: TableKind::Hudi,
            number: t.version,
        },
        data_schema,
        partitions: Default::default(),
        deletes,
        bounds,
        ruled_out: 0,
        files: t.files,
        memory,
    })
}

/// A merge-on-read table's file slices with log files merged ([`crate::source::hudi_log`]):
/// each base file's rows a log replaced or deleted, as its deletion vector, and each slice's
/// log records served, as a file made in memory beside its base file (`t.files` gains it).
#[allow(clippy::type_complexity)]
async fn merged(
    at: &Opening<'_>,
    mut t: Table,
    metas: &HashMap<&str, &ObjectMeta>,
    data_schema: &arrow::datatypes::SchemaRef,
) -> Result<(
    Table,
    HashMap<String, crate::source::deletes::DeletionVector>,
    HashMap<String, bytes::Bytes>,
)> {
    let (mut deletes, mut memory) = (HashMap::new(), HashMap::new());
    let Some(merging) = t.merging.take() else {
        return Ok((t, deletes, memory));
    };
    // The columns the log records are read as: the table's, Hudi's own left out.
    let table = data_schema.as_ref();
    for slice in std::mem::take(&mut t.slices) {
        let base = match &slice.base {
            None => None,
            Some(name) => Some(listed_reader((at.store, at.url, at.stats), metas, name)?.1),
        };
        let what = || {
            format!(
                "file group '{}' of partition '{}'",
                slice.file_id, slice.partition
            )
        };
        let m = crate::source::hudi_log::merge_slice(
            at.store,
            at.root,
            base,
            &slice.logs,
            table,
            &merging,
            at.stats,
        )
        .await
        .with_context(what)?;
        if let Some(name) = &slice.base
            && !m.deleted.is_empty()
        {
            deletes.insert(
                name.clone(),
                crate::source::deletes::inline_vector(&m.deleted)?,
            );
        }
        if let Some(rows) = m.rows {
            let dir = match slice.partition.as_str() {
                "" => String::new(),
                p => format!("{p}/"),
            };
            let name = format!("{dir}{}.log-records-{}.parquet", slice.file_id, t.version);
            memory.insert(name.clone(), crate::source::hudi_log::parquet_bytes(&rows)?);
            t.files.push(name);
        }
    }
    t.files.sort();
    Ok((t, deletes, memory))
}

/// A Hudi table's schema: the newest base file's columns, Hudi's meta columns left out.
async fn schema(
    store: &Arc<dyn ObjectStore>,
    url: &Url,
    table: &Table,
    metas: &std::collections::HashMap<&str, &ObjectMeta>,
    footers: Option<&std::path::Path>,
    stats: &Arc<Stats>,
) -> Result<SchemaRef> {
    let Some(newest) = &table.newest else {
        bail!(
            "the Hudi table holds no data files at instant {}",
            table.version
        );
    };
    let (file, reader) = listed_reader((store, url, stats), metas, newest)?;
    let (metadata, _) = load_metadata(&reader, footers, &file.id, 0)
        .await
        .with_context(|| format!("file '{newest}' is not a readable Parquet file"))?;
    let schema = metadata.schema();
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| !is_meta_column(schema.field(i).name()))
        .collect();
    Ok(Arc::new(schema.project(&keep)?))
}

/// The fields a table property lists (`a,b`), none where it is unset or empty.
fn field_list(value: Option<&str>) -> Vec<String> {
    (value.unwrap_or("").split(','))
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect()
}

/// A reader of data file `name` as listed (`metas`), its version pinned as listed.
fn listed_reader(
    at: (&Arc<dyn ObjectStore>, &Url, &Arc<Stats>),
    metas: &HashMap<&str, &ObjectMeta>,
    name: &str,
) -> Result<(SourceFile, ObjectReader)> {
    let (store, url, stats) = at;
    let meta = metas
        .get(name)
        .ok_or_else(|| anyhow!("file '{name}' of the Hudi table is not listed"))?;
    let file = SourceFile::new(
        url,
        meta.location.clone(),
        object_of(name.to_string(), meta),
    );
    let reader = ObjectReader::new(store.clone(), &file, stats.clone(), Origin::Listing.since());
    Ok((file, reader))
}

/// The directory that makes a Hudi table.
pub(crate) const HOODIE: &str = ".hoodie";

/// Whether a column is one of Hudi's own.
pub(crate) fn is_meta_column(name: &str) -> bool {
    name.starts_with("_hoodie_")
}

/// One instant of a Hudi table, as a mount reads it.
pub(crate) struct Table {
    /// The instant read (`yyyyMMddHHmmssSSS`, as a number).
    pub(crate) version: u64,
    /// The base files of the table at that instant, relative to its root, in path order.
    pub(crate) files: Vec<String>,
    /// The one written last: its schema is the table's.
    pub(crate) newest: Option<String>,
    /// A merge-on-read table's file slices with log files to merge, and how they merge.
    pub(crate) slices: Vec<Slice>,
    pub(crate) merging: Option<crate::source::hudi_log::Merging>,
    /// How a file's partition path names its partition columns' values, where it does.
    pub(crate) paths: Option<PartitionPaths>,
}

/// A table's partition paths as values of its columns: what a simple or complex key generator
/// writes (`FIELD=VALUE/…` hive-style, else `VALUE/…`, one segment a field, percent-encoded
/// where the table says so). Other key generators (timestamp-based, custom) format the values,
/// and their paths are not read as values.
#[derive(Clone, Debug)]
pub(crate) struct PartitionPaths {
    fields: Vec<String>,
    hive_style: bool,
    url_encoded: bool,
}

/// A file slice of a merge-on-read table whose log files are merged at read time: its base
/// file (none for a file group of log files only) and its log files, in hudi-rs's order.
#[derive(Clone, Debug)]
pub(crate) struct Slice {
    pub(crate) partition: String,
    pub(crate) file_id: String,
    pub(crate) base: Option<String>,
    pub(crate) logs: Vec<LogFile>,
}

/// An instant of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Instant {
    time: u64,
    /// When it completed (timeline layout 2 names it), where known.
    completion: Option<u64>,
    action: String,
    /// The timeline file of the completed instant.
    file: String,
}

/// Time `t` (ms since the Unix epoch) as an instant of the timeline: `yyyyMMddHHmmssSSS`, or
/// `yyyyMMddHHmmss` where the timeline's instants (`like`) have seconds only; in UTC or in the
/// local time zone, as the table's `hoodie.table.timeline.timezone` says (local by default).
fn instant_of(t: i64, utc: bool, like: u64) -> u64 {
    let secs = t.div_euclid(1000) as libc::time_t;
    let ms = t.rem_euclid(1000) as u64;
    // SAFETY: a zeroed tm is a valid out-parameter; gmtime_r and localtime_r fill it.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        match utc {
            true => libc::gmtime_r(&secs, &mut tm),
            false => libc::localtime_r(&secs, &mut tm),
        };
        tm
    };
    let seconds = (tm.tm_year as u64 + 1900) * 10_000_000_000
        + (tm.tm_mon as u64 + 1) * 100_000_000
        + tm.tm_mday as u64 * 1_000_000
        + tm.tm_hour as u64 * 10_000
        + tm.tm_min as u64 * 100
        + tm.tm_sec as u64;
    match like >= 10_000_000_000_000_000 {
        true => seconds * 1000 + ms,
        false => seconds,
    }
}

/// Reads instant `version` (the latest completed when `None`) of the Hudi table at `root`;
/// `names` are the objects under it (relative to it), as listed.
pub(crate) async fn read(
    store: Arc<dyn ObjectStore>,
    root: &Path,
    names: &[&str],
    version: Option<crate::options::AsOf>,
) -> Result<Table> {
    let props_path = root.clone().join(HOODIE).join("hoodie.properties");
    let props = store
        .get(&props_path)
        .await
        .context("its .hoodie/hoodie.properties cannot be read")?
        .bytes()
        .await?;
    let props = properties(&String::from_utf8_lossy(&props));
    let get = |k: &str| props.get(k).map(String::as_str);
    if get("hoodie.datasource.write.drop.partition.columns") == Some("true") {
        bail!(
            "its partition columns are only in its paths (hoodie.datasource.write.drop.partition.columns=true), which tensorfs does not read yet"
        );
    }
    let mor = get("hoodie.table.type") == Some("MERGE_ON_READ");
    let table_version: u32 = get("hoodie.table.version")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // The timeline's directory, relative to the root.
    let timeline = match (table_version >= 8, get("hoodie.timeline.path")) {
        (true, Some(p)) => format!("{HOODIE}/{p}"),
        (true, None) => format!("{HOODIE}/timeline"),
        (false, _) => HOODIE.to_string(),
    };
    let completed = completed_instants(names, &timeline);
    let commits: Vec<&Instant> = (completed.iter())
        .filter(|i| {
            matches!(
                i.action.as_str(),
                "commit" | "replacecommit" | "deltacommit"
            )
        })
        .collect();
    let Some(latest) = commits.iter().map(|i| i.time).max() else {
        bail!("its timeline has no completed commit");
    };
    let as_of = match version {
        None => latest,
        Some(crate::options::AsOf::Number(v)) if commits.iter().any(|i| i.time == v) => v,
        Some(crate::options::AsOf::Number(v)) => bail!(
            "it has no completed commit at instant {v} (its latest is {latest}): version= names a commit's instant time"
        ),
        Some(at @ crate::options::AsOf::Time(t)) => {
            let utc = get("hoodie.table.timeline.timezone")
                .is_some_and(|z| z.eq_ignore_ascii_case("utc"));
            let first = commits.iter().map(|i| i.time).min().unwrap_or(latest);
            let then = instant_of(t, utc, first);
            match (commits.iter())
                .map(|i| i.time)
                .filter(|&c| c <= then)
                .max()
            {
                Some(c) => c,
                None => bail!(
                    "it has no completed commit at or before {at} (instant {then}): its first is {first}"
                ),
            }
        }
    };
    let written: HashSet<u64> = (commits.iter())
        .filter(|i| i.time <= as_of)
        .map(|i| i.time)
        .collect();
    // File groups replaced by then, as (partition, file id).
    let mut replaced: HashSet<(String, String)> = HashSet::new();
    for i in commits
        .iter()
        .filter(|i| i.action == "replacecommit" && i.time <= as_of)
    {
        let path = crate::source::child(root, &i.file)?;
        let bytes = store
            .get(&path)
            .await
            .with_context(|| format!("its replace commit {} cannot be read", i.time))?
            .bytes()
            .await?;
        let groups = replaced_file_groups(&bytes)
            .with_context(|| format!("its replace commit {}", i.time))?;
        replaced.extend(groups);
    }
    // The newest base file of each file group, written by a commit at or before the instant.
    let mut newest: BTreeMap<(String, String), (u64, String)> = BTreeMap::new();
    let mut logs = false;
    for name in names {
        if name.starts_with(HOODIE) {
            continue;
        }
        // Hidden files: partition metadata, and the log files of a merge-on-read table
        // (`.FILEID_INSTANT.log.N_TOKEN`).
        if name.split('/').any(|p| p.starts_with('.')) {
            logs |= name.contains(".log.");
            continue;
        }
        let Some((partition, base)) = split_partition(name) else {
            continue;
        };
        let Some((file_id, instant)) = base_file(base) else {
            continue;
        };
        if !written.contains(&instant) {
            continue;
        }
        let group = (partition.to_string(), file_id.to_string());
        if replaced.contains(&group) {
            continue;
        }
        let slot = newest.entry(group).or_insert((0, String::new()));
        if instant >= slot.0 {
            *slot = (instant, name.to_string());
        }
    }
    let (newest, slices, merging) = match mor && logs {
        false => (newest, Vec::new(), None),
        true => {
            let ordering = field_list(
                (get("hoodie.table.ordering.fields")).or(get("hoodie.table.precombine.field")),
            );
            if ordering.len() > 1 {
                bail!(
                    "it orders its records by several fields ({}), which tensorfs does not merge yet",
                    ordering.join(",")
                );
            }
            let owned = |k: &str| get(k).map(str::to_string);
            let merging = Merging {
                mode: crate::source::hudi_log::Mode::of(
                    &owned,
                    table_version,
                    !ordering.is_empty(),
                )?,
                ordering: ordering.first().cloned(),
                key_fields: field_list(get("hoodie.table.recordkey.fields")),
                meta_fields: get("hoodie.populate.meta.fields") != Some("false"),
                table_version,
                completed: commits.iter().map(|i| i.time).collect(),
                first_active: completed.first().map(|i| i.time),
                as_of,
            };
            let (newest, slices) = file_slices(names, &commits, &replaced, table_version, as_of);
            (newest, slices, Some(merging))
        }
    };
    let last = newest.values().max().map(|(_, name)| name.clone());
    let mut files: Vec<String> = newest.into_values().map(|(_, name)| name).collect();
    files.sort();
    let keygen = (get("hoodie.table.keygenerator.class"))
        .or(get("hoodie.table.keygenerator.type"))
        .unwrap_or("");
    let plain = [
        "SimpleKeyGenerator",
        "ComplexKeyGenerator",
        "SIMPLE",
        "COMPLEX",
    ]
    .iter()
    .any(|k| keygen.ends_with(k));
    let fields = field_list(get("hoodie.table.partition.fields"));
    let paths = (plain && !fields.is_empty()).then(|| PartitionPaths {
        fields,
        hive_style: get("hoodie.datasource.write.hive_style_partitioning") == Some("true"),
        url_encoded: get("hoodie.datasource.write.partitionpath.urlencode") == Some("true"),
    });
    Ok(Table {
        version: as_of,
        files,
        newest: last,
        paths,
        slices,
        merging,
    })
}

/// A merge-on-read table's file slices at instant `as_of`, as hudi-rs lists them: each file
/// group's slices keyed by its committed base files' instants; each log file (of a completed
/// instant, from table version 8 on) in the slice with the greatest key at or before its
/// completion (else its own instant), or opening a slice of its own where none is; the slice
/// read is the one with the greatest key at or before `as_of`, in a file group not replaced.
/// Returns each group's base file read (by (partition, file id): its instant and name) and the
/// slices with log files.
#[allow(clippy::type_complexity)]
fn file_slices(
    names: &[&str],
    commits: &[&Instant],
    replaced: &HashSet<(String, String)>,
    table_version: u32,
    as_of: u64,
) -> (BTreeMap<(String, String), (u64, String)>, Vec<Slice>) {
    let completion: HashMap<u64, Option<u64>> =
        commits.iter().map(|i| (i.time, i.completion)).collect();
    // Each group's slices: key → (base file, log files).
    let mut groups: BTreeMap<(String, String), BTreeMap<u64, (Option<String>, Vec<LogFile>)>> =
        BTreeMap::new();
    let mut logs: Vec<((String, String), LogFile)> = Vec::new();
    for name in names {
        if name.starts_with(HOODIE) {
            continue;
        }
        let Some((partition, file)) = split_partition(name) else {
            continue;
        };
        if file.starts_with('.') {
            if let Some(mut log) = LogFile::parse(name) {
                log.completion = completion.get(&log.instant).copied().flatten();
                // From table version 8 on a log file is its own delta commit's: one not
                // completed is none of the table.
                if table_version >= 8 && !completion.contains_key(&log.instant) {
                    continue;
                }
                logs.push(((partition.to_string(), log.file_id.clone()), log));
            }
            continue;
        }
        let Some((file_id, instant)) = base_file(file) else {
            continue;
        };
        if !completion.contains_key(&instant) {
            continue;
        }
        let group = groups
            .entry((partition.to_string(), file_id.to_string()))
            .or_default();
        group.entry(instant).or_default().0 = Some(name.to_string());
    }
    logs.sort_by_key(|(_, l)| l.order());
    for (group, log) in logs {
        let slices = groups.entry(group).or_default();
        let key = log.completion.unwrap_or(log.instant);
        let at = match slices.range(..=key).next_back() {
            Some((&k, _)) => k,
            None => log.instant,
        };
        slices.entry(at).or_default().1.push(log);
    }
    let mut newest = BTreeMap::new();
    let mut out = Vec::new();
    for ((partition, file_id), slices) in groups {
        if replaced.contains(&(partition.clone(), file_id.clone())) {
            continue;
        }
        let Some((&key, (base, logs))) = slices.range(..=as_of).next_back() else {
            continue;
        };
        if logs.is_empty() {
            if let Some(base) = base {
                newest.insert((partition, file_id), (key, base.clone()));
            }
            continue;
        }
        let mut logs = logs.clone();
        logs.sort_by_key(LogFile::order);
        if let Some(base) = base {
            newest.insert((partition.clone(), file_id.clone()), (key, base.clone()));
        }
        out.push(Slice {
            partition,
            file_id,
            base: base.clone(),
            logs,
        });
    }
    (newest, out)
}

/// Each file's partition values as bounds of the table's columns of `schema` (integers,
/// strings and booleans, whose paths are their values as written), for a `where=` to rule
/// files out before their footers.
pub(crate) fn partition_bounds(
    t: &Table,
    schema: &arrow::datatypes::Schema,
) -> Vec<Option<FileBounds>> {
    let Some(paths) = &t.paths else {
        return Vec::new();
    };
    (t.files.iter())
        .map(|file| {
            let (partition, _) = split_partition(file)?;
            let segments: Vec<&str> = partition.split('/').filter(|s| !s.is_empty()).collect();
            let values: Vec<(&str, &str)> = match paths.hive_style {
                true => segments.iter().filter_map(|s| s.split_once('=')).collect(),
                false if segments.len() == paths.fields.len() => {
                    (paths.fields.iter().map(String::as_str))
                        .zip(segments)
                        .collect()
                }
                false => return None,
            };
            let mut columns = HashMap::new();
            for (field, raw) in values {
                let raw = match paths.url_encoded {
                    true => percent_encoding::percent_decode_str(raw)
                        .decode_utf8_lossy()
                        .into_owned(),
                    false => raw.to_string(),
                };
                let Some((_, f)) = schema.column_with_name(field) else {
                    continue;
                };
                let t = f.data_type();
                let plain = t.is_integer()
                    || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Boolean);
                if !plain || raw == "__HIVE_DEFAULT_PARTITION__" || raw == "default" {
                    continue;
                }
                let text: arrow::array::ArrayRef =
                    Arc::new(arrow::array::StringArray::from(vec![raw.as_str()]));
                let strict = arrow::compute::CastOptions {
                    safe: false,
                    ..Default::default()
                };
                let Ok(value) = arrow::compute::cast_with_options(&text, t, &strict) else {
                    continue;
                };
                columns.insert(
                    field.to_string(),
                    ColumnBounds {
                        min: Some(value.clone()),
                        max: Some(value),
                        nulls: Some(0),
                    },
                );
            }
            Some(FileBounds {
                rows: None,
                columns,
            })
        })
        .collect()
}

/// Java properties (`key=value` lines, `#` comments, `\` escapes), as Hudi writes them.
fn properties(text: &str) -> HashMap<String, String> {
    let unescape = |s: &str| {
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            match (c, c == '\\') {
                (_, true) => out.extend(chars.next()),
                (c, false) => out.push(c),
            }
        }
        out
    };
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', '!']))
        .filter_map(|l| {
            let at = l.find(['=', ':'])?;
            Some((unescape(l[..at].trim()), unescape(l[at + 1..].trim())))
        })
        .collect()
}

/// The completed instants of the timeline in directory `timeline` (relative to the root),
/// from the listed `names`: `TIME.ACTION` (table version 6), or `TIME_COMPLETION.ACTION` (8
/// on); requested and in-flight ones (`.requested`, `.inflight`) are not completed.
fn completed_instants(names: &[&str], timeline: &str) -> Vec<Instant> {
    let prefix = format!("{timeline}/");
    let mut out = Vec::new();
    for name in names {
        let Some(file) = name.strip_prefix(&prefix) else {
            continue;
        };
        if file.contains('/') {
            continue;
        }
        let Some((stem, action)) = file.split_once('.') else {
            continue;
        };
        if action.contains('.') || action == "inflight" || action == "requested" {
            continue;
        }
        let (time, completion) = match stem.split_once('_') {
            Some((t, c)) => (t, c.parse::<u64>().ok()),
            None => (stem, None),
        };
        if time.len() < 14 || !time.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(time) = time.parse::<u64>() else {
            continue;
        };
        out.push(Instant {
            time,
            completion,
            action: action.to_string(),
            file: name.to_string(),
        });
    }
    out.sort_by_key(|i| i.time);
    out
}

/// A data file's partition directory and name.
fn split_partition(name: &str) -> Option<(&str, &str)> {
    match name.rsplit_once('/') {
        Some((partition, base)) => Some((partition, base)),
        None => Some(("", name)),
    }
}

/// A base file's file id and instant: `FILEID_WRITETOKEN_INSTANT.parquet`.
fn base_file(name: &str) -> Option<(&str, u64)> {
    let stem = name.strip_suffix(".parquet")?;
    let (rest, instant) = stem.rsplit_once('_')?;
    let (file_id, _token) = rest.rsplit_once('_')?;
    Some((file_id, instant.parse().ok()?))
}

/// The file groups a replace commit's metadata replaces, as (partition, file id): JSON up to
/// table version 6, an Avro file from 8 on.
fn replaced_file_groups(bytes: &[u8]) -> Result<Vec<(String, String)>> {
    let map: serde_json::Value = match bytes.starts_with(b"Obj\x01") {
        false => serde_json::from_slice(bytes).context("its JSON cannot be read")?,
        true => {
            let reader = apache_avro::Reader::new(bytes).context("its Avro cannot be read")?;
            let mut record = None;
            for value in reader {
                record = Some(value.context("its Avro cannot be read")?);
            }
            let record = record.ok_or_else(|| anyhow!("it holds no record"))?;
            // A union's value converts as the branch it holds.
            serde_json::Value::try_from(record).context("its Avro cannot be read")?
        }
    };
    let groups = (map.get("partitionToReplaceFileIds")).and_then(serde_json::Value::as_object);
    let mut out = Vec::new();
    for (partition, ids) in groups.into_iter().flatten() {
        for id in ids.as_array().into_iter().flatten() {
            if let Some(id) = id.as_str() {
                out.push((partition.clone(), id.to_string()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_files_and_instants_are_named_as_hudi_names_them() {
        assert_eq!(
            base_file("a079bdb3-731c-4894-b855-abfcd6921007-0_0-203-274_20240418173551906.parquet"),
            Some(("a079bdb3-731c-4894-b855-abfcd6921007-0", 20240418173551906))
        );
        assert_eq!(base_file("part-0.parquet"), None);
        let names = [
            ".hoodie/20240418173550988.commit",
            ".hoodie/20240418173550988.commit.requested",
            ".hoodie/20240418173551906.inflight",
            ".hoodie/timeline/20250713010536861_20250713010537206.commit",
            ".hoodie/timeline/20250713010536861.commit.requested",
            ".hoodie/.aux/x",
        ];
        let v6: Vec<u64> = completed_instants(&names, ".hoodie")
            .iter()
            .map(|i| i.time)
            .collect();
        assert_eq!(v6, [20240418173550988]);
        let v8 = completed_instants(&names, ".hoodie/timeline");
        assert_eq!(v8.len(), 1);
        assert_eq!(
            (v8[0].time, v8[0].action.as_str()),
            (20250713010536861, "commit")
        );
    }

    #[test]
    fn properties_unescape() {
        let p = properties("#c\nhoodie.table.type=COPY_ON_WRITE\nhoodie.x={\"a\"\\:1}\n");
        assert_eq!(p["hoodie.table.type"], "COPY_ON_WRITE");
        assert_eq!(p["hoodie.x"], "{\"a\":1}");
    }
}
