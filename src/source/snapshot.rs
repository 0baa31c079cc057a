//! Snapshots: one dataset for every host (PRODUCT.md §8).
//!
//! `tensorfs snapshot` lists the source and reads every footer once, then writes what a mount
//! needs and nothing per row: the objects with their sizes and versions, the rows of each row
//! group, the schema, the facts the mount-time checks need, and the fingerprint. A mount with
//! `snapshot=` computes its plan from that alone and fetches a footer when a read first needs
//! it, so a host reading its share touches only its share of the objects.
//!
//! The file: a header (magic, format version, body length, SHA-256 of the body), then the body,
//! JSON compressed with zstd. Written to a temp file, synced and renamed (a local path), or with
//! one PUT (an object store, where a PUT is atomic). The objects are kept column by column, so
//! that names and versions compress well: see docs/dev/scale.md for what it weighs per object.
//!
//! Every mount of a listing also keeps its catalog this way in the cache directory, named by
//! its fingerprint, so that `fingerprint=` can say what changed when it refuses a mount.

use crate::source::catalog::{self, Catalog, Facts, NullFact, Object, Pinned, Summary};
use crate::source::view::View;
use crate::source::{Origin, Source, Where};
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use url::Url;

const MAGIC: &[u8; 18] = b"tensorfs snapshot\n";
/// The format's version: a change to what the body holds or means bumps it. Format 2 adds the
/// rows a table deletes from its files; a snapshot without deletes is written as format 1,
/// which an older tensorfs reads the same.
/// Format 3 adds the `where=` expression whose rows it keeps, which its fingerprint names (an
/// older tensorfs would compute another fingerprint and call the file damaged). Format 4 adds
/// the bytes of objects made in memory (a Hudi merge-on-read slice's merged log records), which
/// an older tensorfs would look for in the store.
const FORMAT: u32 = 4;
const FORMATS_READ: [u32; 4] = [1, 2, 3, 4];
/// Magic, format, body length, SHA-256 of the body.
const HEADER: usize = MAGIC.len() + 4 + 8 + 32;

/// The body of a snapshot file.
#[derive(Serialize, Deserialize)]
struct Body {
    /// The tensorfs that wrote it, for whoever reads the file.
    written_by: String,
    /// Seconds since the Unix epoch.
    created: u64,
    /// The source's URL, and the prefix in its store that the objects' names are relative to.
    url: String,
    root: String,
    /// "listing" or "summary file": how the pinned dataset was found.
    from: String,
    fingerprint: String,
    summary: Option<Summary>,
    /// The Arrow schema as an IPC message, in base64.
    schema: String,
    unischema: Option<crate::source::petastorm::Unischema>,
    facts: Facts,
    objects: Objects,
    /// How many of the schema's last fields are partition columns, and each object's values
    /// of them.
    #[serde(default)]
    partition_columns: usize,
    #[serde(default)]
    partition_values: Vec<Vec<crate::source::partition::Value>>,
    /// The version of the table it pins, if the dataset is one, and the table's kind (format
    /// 2; none is a Delta table's, as format 1 wrote them).
    #[serde(default)]
    table_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table_kind: Option<crate::source::lake::TableKind>,
    /// The `where=` expression whose rows the objects' deletes hold (format 3).
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    selection: Option<String>,
}

/// The objects, column by column (see [`catalog::Object`]).
#[derive(Default, Serialize, Deserialize)]
struct Objects {
    names: Vec<String>,
    sizes: Vec<u64>,
    e_tags: Vec<Option<String>>,
    versions: Vec<Option<String>>,
    modified: Vec<String>,
    footer_lens: Vec<u64>,
    /// Row groups of each object; their rows follow, all objects' in one list.
    row_groups: Vec<u32>,
    rows: Vec<u64>,
    /// The deletion vector of each object (format 2; all empty where none has one), and the
    /// rows each deletes from each of its row groups (all objects' in one list, each object's
    /// as many as it has row groups, where it has a deletion vector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deletes: Vec<Option<crate::source::deletes::DeletionVector>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deleted: Vec<u64>,
    /// The bytes of each object made in memory, in base64 (format 4; all empty where none
    /// is): a Hudi file slice's merged log records, which no store holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    made: Vec<Option<String>>,
}

impl Objects {
    fn of(objects: &[&Object]) -> Objects {
        let mut o = Objects::default();
        for f in objects {
            o.names.push(f.name.clone());
            o.sizes.push(f.size);
            o.e_tags.push(f.e_tag.clone());
            o.versions.push(f.version.clone());
            o.modified.push(f.modified.clone());
            o.footer_lens.push(f.footer_len);
            o.row_groups.push(f.rg_rows.len() as u32);
            o.rows.extend(&f.rg_rows);
        }
        if objects.iter().any(|f| f.memory.is_some()) {
            let b64 = base64::engine::general_purpose::STANDARD;
            o.made = (objects.iter())
                .map(|f| f.memory.as_ref().map(|m| b64.encode(m)))
                .collect();
        }
        if objects.iter().any(|f| f.deletes.is_some()) {
            for f in objects {
                o.deletes.push(f.deletes.clone());
                if f.deletes.is_some() {
                    o.deleted.extend(
                        (0..f.rg_rows.len()).map(|i| f.rg_deleted.get(i).copied().unwrap_or(0)),
                    );
                }
            }
        }
        o
    }

    fn has_deletes(&self) -> bool {
        !self.deletes.is_empty()
    }

    fn into_objects(self) -> Result<Vec<Object>> {
        let n = self.names.len();
        let lengths = [
            self.sizes.len(),
            self.e_tags.len(),
            self.versions.len(),
            self.modified.len(),
            self.footer_lens.len(),
            self.row_groups.len(),
        ];
        let groups: u64 = self.row_groups.iter().map(|&g| g as u64).sum();
        if lengths.iter().any(|&l| l != n) || groups != self.rows.len() as u64 {
            bail!("its object lists disagree in length");
        }
        let deletes = match self.deletes.is_empty() {
            true => vec![None; n],
            false => self.deletes,
        };
        let deleted_groups: u64 = (deletes.iter().zip(&self.row_groups))
            .filter(|(d, _)| d.is_some())
            .map(|(_, &g)| g as u64)
            .sum();
        if deletes.len() != n || deleted_groups != self.deleted.len() as u64 {
            bail!("its deletion vectors disagree with its objects");
        }
        let made = match self.made.is_empty() {
            true => vec![None; n],
            false => self.made,
        };
        if made.len() != n {
            bail!("its objects made in memory disagree with its objects");
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut made = (made.into_iter())
            .map(|m| m.map(|m| b64.decode(m).map(bytes::Bytes::from)).transpose())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("an object made in memory is not base64: {e}"))?
            .into_iter();
        let mut deleted = self.deleted.into_iter();
        let mut deletes = deletes.into_iter();
        let mut rows = self.rows.into_iter();
        let objects = (self.names.into_iter())
            .zip(self.sizes)
            .zip(self.e_tags)
            .zip(self.versions)
            .zip(self.modified)
            .zip(self.footer_lens)
            .zip(self.row_groups)
            .map(
                |((((((name, size), e_tag), version), modified), footer_len), groups)| {
                    let rg_rows: Vec<u64> = rows.by_ref().take(groups as usize).collect();
                    let deletes = deletes.next().flatten();
                    let rg_deleted = match deletes.is_some() {
                        true => deleted.by_ref().take(groups as usize).collect(),
                        false => Vec::new(),
                    };
                    Object {
                        name,
                        size,
                        e_tag,
                        version,
                        modified,
                        footer_len,
                        rg_rows,
                        deletes,
                        rg_deleted,
                        memory: made.next().flatten(),
                    }
                },
            )
            .collect::<Vec<Object>>();
        // What the plan and the footer reads take from them must hold: rows that sum within
        // u64, and a footer length a file of the object's size can have.
        let mut total: u64 = 0;
        for o in &objects {
            total = (o.rg_rows.iter())
                .try_fold(total, |t, &r| t.checked_add(r))
                .ok_or_else(|| anyhow!("its row counts overflow"))?;
            if o.footer_len != 0 && !(12..=o.size).contains(&o.footer_len) {
                bail!("object '{}' has a footer of {} bytes", o.name, o.footer_len);
            }
            if o.rg_deleted.iter().zip(&o.rg_rows).any(|(d, r)| d > r) {
                bail!("object '{}' has more rows deleted than it holds", o.name);
            }
        }
        Ok(objects)
    }
}

/// The snapshot of an opened source, with the nulls its view had to read recorded.
pub fn encode(source: &Source, view: &View) -> Result<Vec<u8>> {
    let mut facts = source.facts.clone();
    for (field, file) in &view.nulls_read {
        facts.nulls[*field] = match file {
            Some(f) => NullFact::In(f.clone()),
            None => NullFact::None,
        };
    }
    let from = match (source.summary.is_some(), source.table) {
        (_, Some(v)) => v.what(),
        (true, None) => "summary file",
        (false, None) => "listing",
    };
    let delta = |v: &crate::source::lake::Version| v.kind == crate::source::lake::TableKind::Delta;
    let body = Body {
        written_by: format!("tensorfs {}", env!("CARGO_PKG_VERSION")),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        url: source.url.to_string(),
        root: source.root.to_string(),
        from: from.into(),
        fingerprint: source.fingerprint().to_string(),
        summary: source.summary.clone(),
        schema: base64::engine::general_purpose::STANDARD
            .encode(catalog::schema_bytes(&source.schema)),
        unischema: source.unischema.clone(),
        facts,
        objects: Objects::of(&source.objects()),
        partition_columns: source.partitions.fields.len(),
        partition_values: source.partitions.values.clone(),
        table_version: source.table.map(|v| v.number),
        table_kind: source.table.filter(|v| !delta(v)).map(|v| v.kind),
        selection: source.selected.as_ref().map(|s| s.text.clone()),
    };
    // Without deletes, the body is format 1's: a snapshot an older tensorfs can read.
    let format = if !body.objects.made.is_empty() {
        FORMAT
    } else if body.selection.is_some() {
        3
    } else if body.objects.has_deletes() || body.table_kind.is_some() {
        2
    } else {
        1
    };
    let json = serde_json::to_vec(&body)?;
    let compressed = zstd::bulk::compress(&json, 9)?;
    let mut out = Vec::with_capacity(HEADER + compressed.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&(compressed.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&compressed));
    out.extend_from_slice(&compressed);
    Ok(out)
}

/// Reads a snapshot file's bytes; `at` names it in errors. A file that is not a snapshot, is
/// cut short, fails its checksum or was written by a newer format is refused, saying which.
pub fn decode(bytes: &[u8], at: &str) -> Result<Pinned> {
    let refused = |why: &str| anyhow!("snapshot '{at}' {why}");
    if is_mixture(bytes) {
        return Err(refused(
            "is the snapshot of a mixture of sources: mount it with the .toml it was taken of",
        ));
    }
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(refused("is not a tensorfs snapshot"));
    }
    if bytes.len() < HEADER {
        return Err(refused("is truncated"));
    }
    let format = u32::from_le_bytes(bytes[18..22].try_into().expect("4 bytes"));
    if !FORMATS_READ.contains(&format) {
        return Err(refused(&format!(
            "is of format {format}, which this tensorfs (format {FORMAT}) cannot read"
        )));
    }
    let len = u64::from_le_bytes(bytes[22..30].try_into().expect("8 bytes"));
    let body = &bytes[HEADER..];
    if (body.len() as u64) < len {
        return Err(refused(&format!(
            "is truncated ({} of its {} bytes)",
            HEADER + body.len(),
            HEADER as u64 + len
        )));
    }
    if body.len() as u64 > len {
        return Err(refused("has bytes after its end"));
    }
    if Sha256::digest(body).as_slice() != &bytes[30..62] {
        return Err(refused("is damaged: its checksum does not match"));
    }
    let damaged = |e: anyhow::Error| refused(&format!("is damaged: {e:#}"));
    let json = inflate(body).map_err(damaged)?;
    let body: Body = serde_json::from_slice(&json).map_err(|e| damaged(e.into()))?;
    let schema = base64::engine::general_purpose::STANDARD
        .decode(&body.schema)
        .map_err(anyhow::Error::from)
        .and_then(|b| catalog::schema_from_bytes(&b))
        .map_err(|e| damaged(e.context("its schema")))?;
    let objects = body.objects.into_objects().map_err(damaged)?;
    let n = schema.fields().len();
    let partitions = match body.partition_columns {
        0 => crate::source::partition::Partitions::default(),
        k if k <= n && body.partition_values.len() == objects.len() => {
            crate::source::partition::Partitions {
                fields: schema.fields()[n - k..].to_vec(),
                values: body.partition_values,
            }
        }
        _ => {
            return Err(damaged(anyhow!(
                "its partition columns disagree with its schema"
            )));
        }
    };
    if partitions
        .values
        .iter()
        .any(|v| v.len() != partitions.fields.len())
    {
        return Err(damaged(anyhow!(
            "its partition values disagree with its columns"
        )));
    }
    check_facts(&body.facts, schema.fields().len(), &objects).map_err(damaged)?;
    let url = url::Url::parse(&body.url).map_err(|e| damaged(e.into()))?;
    let refs: Vec<&Object> = objects.iter().collect();
    let table = body
        .table_version
        .map(|number| crate::source::lake::Version {
            kind: body
                .table_kind
                .unwrap_or(crate::source::lake::TableKind::Delta),
            number,
        });
    let fingerprint = catalog::fingerprint(
        body.summary.as_ref(),
        table,
        &refs,
        body.unischema.as_ref(),
        body.selection.as_deref(),
    );
    if fingerprint != body.fingerprint {
        return Err(damaged(anyhow!(
            "its objects give fingerprint {fingerprint}, not the {} it records",
            body.fingerprint
        )));
    }
    Ok(Pinned {
        at: at.to_string(),
        url,
        root: body.root,
        catalog: Catalog {
            objects,
            summary: body.summary,
            schema,
            partitions,
            table,
            facts: body.facts,
            unischema: body.unischema,
            selection: body.selection,
        },
    })
}

/// The largest body a snapshot inflates to: 100,000 objects take some 20 MB of JSON.
const BODY_LIMIT: u64 = 4 << 30;

/// The body, decompressed, refusing one that would inflate past [`BODY_LIMIT`].
fn inflate(compressed: &[u8]) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(compressed)?
        .take(BODY_LIMIT + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > BODY_LIMIT {
        bail!("its body inflates past {} bytes", BODY_LIMIT);
    }
    Ok(out)
}

/// The facts refer only to columns and row groups that exist.
fn check_facts(facts: &Facts, columns: usize, objects: &[Object]) -> Result<()> {
    if facts.nulls.len() != columns {
        bail!(
            "it gives nulls of {} columns for a schema of {columns}",
            facts.nulls.len()
        );
    }
    let out_of_range = facts.nulls.iter().any(|n| match n {
        NullFact::Unknown(groups) => (groups.iter()).any(|&(f, rg)| {
            (objects.get(f as usize)).is_none_or(|o| rg as usize >= o.rg_rows.len())
        }),
        _ => false,
    });
    if out_of_range {
        bail!("its facts name objects it does not list");
    }
    Ok(())
}

/// Whether `at` names an object in a store (a URL) rather than a local path.
fn is_url(at: &str) -> bool {
    at.contains("://") && !at.starts_with("file://")
}

/// The snapshot at `at` (a local path or a URL the store options reach).
pub(crate) async fn read(at: &str, store_options: &[(String, String)]) -> Result<Pinned> {
    decode(&read_bytes(at, store_options).await?, at)
}

/// The bytes of the file at `at` (a local path or a URL the store options reach).
pub(crate) async fn read_bytes(at: &str, store_options: &[(String, String)]) -> Result<Vec<u8>> {
    Ok(match is_url(at) {
        true => {
            let (store, path) = crate::source::store_of(at, store_options)
                .with_context(|| format!("snapshot '{at}'"))?;
            let got = store.get(&path).await.map_err(|e| match e {
                object_store::Error::NotFound { .. } => anyhow!("snapshot '{at}' does not exist"),
                e => anyhow!("snapshot '{at}' cannot be read: {e}"),
            })?;
            got.bytes()
                .await
                .with_context(|| format!("snapshot '{at}' cannot be read"))?
                .to_vec()
        }
        false => {
            let path = at.strip_prefix("file://").unwrap_or(at);
            std::fs::read(path).map_err(|e| {
                anyhow!(
                    "snapshot '{at}' cannot be read: {}",
                    crate::source::io_reason(&e)
                )
            })?
        }
    })
}

const MIXTURE_MAGIC: &[u8; 26] = b"tensorfs mixture snapshot\n";
const MIXTURE_FORMAT: u32 = 1;

/// A snapshot of a mixture: each source's `url` as its `.toml` writes it, and its snapshot.
/// Magic, format, the count, then each source's URL and snapshot, each behind its length; each
/// snapshot checks its own body.
pub fn encode_mixture(sources: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = MIXTURE_MAGIC.to_vec();
    out.extend(MIXTURE_FORMAT.to_le_bytes());
    out.extend((sources.len() as u32).to_le_bytes());
    for (url, snapshot) in sources {
        out.extend((url.len() as u64).to_le_bytes());
        out.extend(url.as_bytes());
        out.extend((snapshot.len() as u64).to_le_bytes());
        out.extend(snapshot);
    }
    out
}

/// Whether `bytes` are a mixture's snapshot.
pub fn is_mixture(bytes: &[u8]) -> bool {
    bytes.starts_with(MIXTURE_MAGIC)
}

/// A mixture's snapshot read back: each source's URL and its snapshot's bytes.
pub fn decode_mixture(bytes: &[u8], at: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let refused = |why: &str| anyhow!("snapshot '{at}' {why}");
    if !is_mixture(bytes) {
        return Err(refused("is not the snapshot of a mixture of sources"));
    }
    let mut rest = &bytes[MIXTURE_MAGIC.len()..];
    let mut take = |n: usize| -> Result<&[u8]> {
        if rest.len() < n {
            return Err(refused("is truncated"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let format = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
    if format != MIXTURE_FORMAT {
        return Err(refused(&format!(
            "is a mixture's of format {format}, which this tensorfs (format {MIXTURE_FORMAT}) cannot read"
        )));
    }
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
    let mut out = Vec::new();
    for _ in 0..count {
        let len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes")) as usize;
        let url = String::from_utf8(take(len)?.to_vec()).map_err(|_| refused("is damaged"))?;
        let len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes")) as usize;
        out.push((url, take(len)?.to_vec()));
    }
    if !rest.is_empty() {
        return Err(refused("has bytes past its end"));
    }
    Ok(out)
}

/// Writes `bytes` to `at` whole or not at all: a local path through a synced temp file renamed
/// into place, an object with one PUT.
pub(crate) async fn write(
    at: &str,
    bytes: Vec<u8>,
    store_options: &[(String, String)],
) -> Result<()> {
    match is_url(at) {
        true => {
            let (store, path) = crate::source::store_of(at, store_options)
                .with_context(|| format!("snapshot '{at}'"))?;
            store
                .put(&path, bytes.into())
                .await
                .map_err(|e| anyhow!("snapshot '{at}' cannot be written: {e}"))?;
            Ok(())
        }
        false => {
            let path = Path::new(at.strip_prefix("file://").unwrap_or(at));
            // Readable by the job's other users, as a dataset's description is.
            write_local(path, &bytes, 0o644)
                .map_err(|e| anyhow!("snapshot '{at}' cannot be written: {e:#}"))
        }
    }
}

/// Crash-safe: written beside `path` (with `mode`), synced, renamed over it, the directory
/// synced.
fn write_local(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().context("it names no file")?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| anyhow!(crate::source::io_reason(&e)))
}

/// Where a mount keeps the catalog of each dataset it listed, by fingerprint.
fn record_path(cache_dir: &Path, fingerprint: &str) -> std::path::PathBuf {
    cache_dir
        .join("v1")
        .join("datasets")
        .join(format!("{fingerprint}.snapshot"))
}

/// Keeps the catalog of a listed dataset in the cache directory (once per fingerprint), so
/// that a later mount refused by `fingerprint=` can say what changed since. A failure only
/// loses that detail.
pub(crate) fn record(source: &Source, view: &View, cache_dir: &Path) {
    if matches!(source.origin, Origin::Snapshot(_)) {
        return;
    }
    let path = record_path(cache_dir, source.fingerprint());
    if path.exists() {
        return;
    }
    let kept = (|| -> Result<()> {
        crate::model::kept::private_dir(path.parent().expect("a parent"))?;
        // Private, as everything in the cache directory is.
        write_local(&path, &encode(source, view)?, 0o600)
    })();
    if let Err(e) = kept {
        tracing::debug!("the dataset's catalog is not kept: {e:#}");
    }
}

/// Refuses a dataset whose fingerprint is not `want`, in one line naming both and, where this
/// host has seen the dataset `want` names (a snapshot mounted, or a listing kept in
/// `cache_dir`), what differs.
pub(crate) fn check_fingerprint(source: &Source, want: &str, cache_dir: &Path) -> Result<()> {
    let have = source.fingerprint();
    if have == want {
        return Ok(());
    }
    let then = std::fs::read(record_path(cache_dir, want))
        .ok()
        .and_then(|b| decode(&b, want).ok());
    let what = match then {
        Some(then) => {
            let before: Vec<&Object> = then.catalog.objects.iter().collect();
            catalog::differences(&before, &source.objects())
        }
        None => format!(
            "{} objects now; what changed is not known here, as this host never listed the dataset {want} (cache_dir has no record of it)",
            source.files.len()
        ),
    };
    bail!(
        "source '{}' is dataset {have}, not {want} (fingerprint=): {what}",
        source.display
    )
}

impl Source {
    /// The dataset a snapshot pinned, reached through `source` with these store options.
    /// Nothing is listed, no footer is read.
    pub(crate) fn pinned(
        source: &str,
        store_options: &[(String, String)],
        pinned: Pinned,
        footers: Option<&std::path::Path>,
        stats: Arc<Stats>,
    ) -> Result<Source> {
        let (store, url, _) = Self::store_for(source, store_options)?;
        Self::pinned_over(store, &url, source, pinned, footers, stats)
    }

    /// `Source::pinned` over any object store (`url`: the source's).
    pub fn pinned_over(
        store: Arc<dyn ObjectStore>,
        url: &Url,
        source: &str,
        pinned: Pinned,
        footers: Option<&std::path::Path>,
        stats: Arc<Stats>,
    ) -> Result<Source> {
        if pinned_key(url) != pinned_key(&pinned.url) {
            bail!(
                "snapshot '{}' pins the dataset at '{}', not source '{source}'",
                pinned.at,
                pinned.url
            );
        }
        let at = Where {
            store,
            url: pinned.url,
            root: object_store::path::Path::parse(&pinned.root)?,
            display: source.to_string(),
            footers: footers.map(Into::into),
            stats,
        };
        Source::new(at, pinned.catalog, Origin::Snapshot(pinned.at))
    }
}

/// What a snapshot's source must match: its URL, where an Iceberg table named by a metadata
/// file (as catalogs hand them out) is the same table whichever of its metadata files names
/// it, its root.
pub(crate) fn pinned_key(u: &Url) -> String {
    let s = u.as_str().trim_end_matches('/');
    match s.ends_with(".metadata.json") {
        true => s.rsplitn(3, '/').nth(2).unwrap_or(s).to_string(),
        false => s.to_string(),
    }
}
