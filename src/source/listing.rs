//! The plain listing, the table kind of a prefix that is no table: its `*.parquet` objects in
//! key order (hidden ones left out, as pyarrow and Spark read a directory), their partition
//! values from hive directory names. A listing also tells which kind of table a prefix is the
//! root of, and refuses a prefix that lies inside a table.

use crate::source::lake;
use crate::source::partition::Partitions;
use anyhow::{Result, anyhow, bail};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use url::Url;

/// A source's listing.
pub(crate) enum Listed {
    /// A prefix that is no table (or one object): its `*.parquet` objects.
    Plain(Vec<(String, ObjectMeta)>),
    /// The root of a table of this kind, with every object under it (its metadata's too).
    Table(lake::TableKind, Vec<(String, ObjectMeta)>),
}

/// Lists what `prefix` holds: one object named by the source is the dataset, whatever its name
/// says (a file that is not Parquet is then refused by its footer, naming it); else the source
/// is a prefix, a table's root or a plain one. A plain prefix inside a table is refused: its
/// files alone hold deleted and superseded rows.
pub(crate) async fn list(
    store: &Arc<dyn ObjectStore>,
    url: &Url,
    prefix: &Path,
    source: &str,
) -> Result<Listed> {
    // A source ending in '/' is a prefix: HTTP servers answer HEAD of a directory with its
    // HTML listing.
    if !prefix.as_ref().is_empty() && !source.ends_with('/') {
        match store.head(prefix).await {
            Ok(meta) => {
                let name = prefix.filename().unwrap_or(prefix.as_ref()).to_string();
                refuse_inside_a_table(store, url, prefix, source).await?;
                return Ok(Listed::Plain(vec![(name, meta)]));
            }
            Err(object_store::Error::NotFound { .. }) => {}
            // A directory of the local store cannot be HEAD: it is listed below.
            Err(_) if !prefix.as_ref().ends_with(".parquet") => {}
            Err(e) => bail!("source '{source}' cannot be read: {e}"),
        }
    }
    let all = self::all(store, prefix, source).await?;
    if let Some(kind) = lake::kind_of(all.iter().map(|(name, _)| name.as_str())) {
        return Ok(Listed::Table(kind, all));
    }
    refuse_inside_a_table(store, url, prefix, source).await?;
    let objects: Vec<(String, ObjectMeta)> = (all.into_iter())
        .filter(|(name, _)| name.ends_with(".parquet") && !hidden(name))
        .collect();
    if objects.is_empty() {
        bail!("source '{source}' holds no *.parquet objects");
    }
    Ok(Listed::Plain(objects))
}

/// Files inside a table (a partition directory, one data file) are no dataset.
async fn refuse_inside_a_table(
    store: &Arc<dyn ObjectStore>,
    url: &Url,
    prefix: &Path,
    source: &str,
) -> Result<()> {
    let Some((kind, root)) = lake::enclosing(store, prefix).await? else {
        return Ok(());
    };
    let root = match url.scheme() {
        "file" => format!("/{root}"),
        scheme => format!("{scheme}://{}/{root}", url.host_str().unwrap_or("")),
    };
    bail!(
        "source '{source}' lies inside the {} table at '{root}': mount the table's root, which reads it at a version (its files alone hold deleted and superseded rows)",
        kind.name()
    )
}

/// The partition columns of a plain listing: the hive keys of its objects' names (none for one
/// object named alone).
pub(crate) fn partitions(objects: &[(String, ObjectMeta)], single_file: bool) -> Partitions {
    match single_file {
        true => Partitions::default(),
        false => Partitions::hive(&objects.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()),
    }
}

/// Every object under `prefix`, in lexicographic key order, with its name relative to it.
pub(crate) async fn all(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    source: &str,
) -> Result<Vec<(String, ObjectMeta)>> {
    let listed: Vec<ObjectMeta> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .map_err(|e| match e {
            object_store::Error::NotFound { .. } => {
                anyhow!("source '{source}' does not exist")
            }
            // The HTTP client refusing a plain http:// URL it was not allowed.
            e if e.to_string().contains("builder error") => {
                let key = match source.split_once("://").map(|(scheme, _)| scheme) {
                    Some("s3" | "s3a") => "aws_allow_http",
                    Some("az" | "abfs" | "abfss" | "azure" | "adl") => "azure_allow_http",
                    _ => "client_allow_http",
                };
                anyhow!(
                    "source '{source}' cannot be listed: a plain http:// endpoint needs -o {key}=true"
                )
            }
            e => anyhow!("source '{source}' cannot be listed: {e}"),
        })?;
    if listed.is_empty() {
        bail!("source '{source}' does not exist (or holds nothing)");
    }
    let strip = prefix.as_ref().len();
    let mut objects: Vec<(String, ObjectMeta)> = listed
        .into_iter()
        .map(|m| {
            let name = m.location.as_ref()[strip..]
                .trim_start_matches('/')
                .to_string();
            (name, m)
        })
        .collect();
    objects.sort_by(|a, b| a.1.location.as_ref().cmp(b.1.location.as_ref()));
    Ok(objects)
}

/// Whether an object below the prefix lies in, or is, a file or directory whose name starts with
/// `_` or `.`: a writer's metadata and scratch (`_metadata`, Spark's `_temporary/`, Delta's
/// `_delta_log/` checkpoints, `.hoodie/`), never rows of the dataset, as pyarrow and Spark
/// read a directory.
fn hidden(name: &str) -> bool {
    name.split('/').any(|part| part.starts_with(['_', '.']))
}
