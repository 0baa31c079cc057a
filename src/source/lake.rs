//! Which table a source is, or is inside (PRODUCT.md §8, "a table is read as its table, never
//! as loose files"): a directory that holds `_delta_log/` is a Delta table, one with a
//! `metadata/` of `*.metadata.json` an Apache Iceberg table, one with `.hoodie/` an Apache Hudi
//! table. Their data files hold deleted and superseded rows, so a source that is a table is
//! read as the table at a version, and a source inside one (a partition directory, a data
//! file) is refused: a plain listing of its files would serve rows the table no longer has.
//!
//! The seam every table kind answers through ([`TableKind::open`] → [`Table`]): which data files,
//! with which partition values, statistics and deletes, at which version. Each kind is one
//! file (`delta`, `iceberg`, `hudi`); a prefix that is no table is `listing`'s, a summary file
//! `summary`'s, a snapshot `snapshot`'s. What follows is the same for all
//! ([`crate::source::Source::over`]): the footers the files need, then the source.

use crate::source::{delta, hudi, iceberg};
use crate::stats::Stats;
use anyhow::Result;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};
use std::sync::Arc;
use url::Url;

/// A version of a table: a Delta version, an Iceberg snapshot id, a Hudi instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub(crate) kind: TableKind,
    pub number: u64,
}

impl Version {
    /// How `dataset.json` and messages name the table's kind.
    pub fn what(&self) -> &'static str {
        match self.kind {
            TableKind::Delta => "delta table",
            TableKind::Iceberg => "iceberg table",
            TableKind::Hudi => "hudi table",
        }
    }
}

/// A kind of table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TableKind {
    Delta,
    Iceberg,
    Hudi,
}

impl TableKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            TableKind::Delta => "Delta Lake",
            TableKind::Iceberg => "Apache Iceberg",
            TableKind::Hudi => "Apache Hudi",
        }
    }

    /// The directory under a table's root that makes it one.
    fn marker(self) -> &'static str {
        match self {
            TableKind::Delta => crate::source::delta::LOG,
            TableKind::Iceberg => "metadata",
            TableKind::Hudi => ".hoodie",
        }
    }
}

/// What a table kind is opened with: where the table is, what its root holds, and what the
/// mount asks of it.
pub(crate) struct Opening<'a> {
    pub(crate) store: &'a Arc<dyn ObjectStore>,
    /// The table's root as a URL, for the footers' keys.
    pub(crate) url: &'a Url,
    pub(crate) root: &'a Path,
    /// Every object under the root, relative to it, in key order.
    pub(crate) listed: &'a [(String, ObjectMeta)],
    /// The metadata file the source named (an Iceberg `*.metadata.json`), relative to the root.
    pub(crate) metadata: Option<&'a str>,
    pub(crate) version: Option<crate::options::AsOf>,
    /// `where=`: a kind that can rules files out before their footers are read.
    pub(crate) filter: Option<&'a crate::source::filter::Filter>,
    /// Footers kept between mounts, for a kind that reads one to find the schema.
    pub(crate) footers: Option<&'a std::path::Path>,
    pub(crate) stats: &'a Arc<Stats>,
}

impl TableKind {
    /// The table at the version asked for (its latest by default).
    pub(crate) async fn open(self, at: &Opening<'_>) -> Result<Table> {
        match self {
            TableKind::Delta => {
                delta::read(at.store.clone(), at.root, at.version, at.filter.is_some()).await
            }
            TableKind::Iceberg => iceberg::open(at).await,
            TableKind::Hudi => hudi::open(at).await,
        }
    }
}

/// One version of a table, as a mount reads it.
pub(crate) struct Table {
    pub(crate) version: Version,
    /// The table's columns stored in its files (partition columns the files lack left out),
    /// in the table's order, as Arrow types: files are read by name as these types.
    pub(crate) data_schema: arrow::datatypes::SchemaRef,
    /// Partition columns the files do not store, and each file's values.
    pub(crate) partitions: crate::source::partition::Partitions,
    /// The data files, in lexicographic path order, relative to the table's root.
    pub(crate) files: Vec<String>,
    /// Each file's deletion vector, where the table deletes rows of it.
    pub(crate) deletes: Vec<Option<crate::source::deletes::DeletionVector>>,
    /// What the table's metadata says of each file's columns (empty: nothing), for a
    /// `where=` to rule files out before their footers.
    pub(crate) bounds: Vec<Option<FileBounds>>,
    /// Data files a `where=` ruled out before they were even listed (an Iceberg manifest left
    /// unread).
    pub(crate) ruled_out: u64,
    /// Data files the table kind made in memory (a Hudi file slice's merged log records), by
    /// name: served from here, never listed.
    pub(crate) memory: std::collections::HashMap<String, bytes::Bytes>,
}

/// What a listing would say of an object made in memory: its size, and a version that names
/// its bytes (so the cache keys its columns by them).
pub(crate) fn memory_meta(location: Path, bytes: &bytes::Bytes) -> ObjectMeta {
    use sha2::{Digest, Sha256};
    ObjectMeta {
        location,
        last_modified: chrono::DateTime::UNIX_EPOCH,
        size: bytes.len() as u64,
        e_tag: Some(crate::source::hex(&Sha256::digest(bytes)[..16])),
        version: None,
    }
}

/// What a table's metadata says of one data file's columns without reading it (Delta's
/// `add.stats`, Iceberg's manifest bounds).
#[derive(Clone, Debug, Default)]
pub(crate) struct FileBounds {
    pub(crate) rows: Option<u64>,
    /// By the table's column name.
    pub(crate) columns: std::collections::HashMap<String, ColumnBounds>,
}

/// A column's least and greatest value in a file (one-value arrays of the column's type, each
/// a bound whatever the writer truncated) and its nulls, each where known.
#[derive(Clone, Debug, Default)]
pub(crate) struct ColumnBounds {
    pub(crate) min: Option<arrow::array::ArrayRef>,
    pub(crate) max: Option<arrow::array::ArrayRef>,
    pub(crate) nulls: Option<u64>,
}

/// The kind of table whose root holds the objects `names` (relative to it), if it is one. A
/// Delta table's log must hold a commit or a checkpoint pointer ([`crate::source::delta`]);
/// an Iceberg table's `metadata/` a `*.metadata.json` or `version-hint.text`; a Hudi table's
/// `.hoodie/` its `hoodie.properties`.
pub(crate) fn kind_of<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> Option<TableKind> {
    if crate::source::delta::is_table(names.clone()) {
        return Some(TableKind::Delta);
    }
    for name in names {
        if let Some(entry) = name.strip_prefix("metadata/")
            && !entry.contains('/')
            && (entry.ends_with(".metadata.json") || entry == "version-hint.text")
        {
            return Some(TableKind::Iceberg);
        }
        if name == ".hoodie/hoodie.properties" {
            return Some(TableKind::Hudi);
        }
    }
    None
}

/// The table `prefix` lies inside, if any: the nearest directory above it whose marker
/// directory holds what makes it a table, with its kind. One listing request (its first page)
/// for each marker of each directory above, made at once.
pub(crate) async fn enclosing(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<Option<(TableKind, Path)>> {
    let parts: Vec<_> = prefix.parts().collect();
    let mut checks = Vec::new();
    for depth in (0..parts.len()).rev() {
        let dir: Path = parts[..depth].iter().cloned().collect();
        for kind in [TableKind::Delta, TableKind::Iceberg, TableKind::Hudi] {
            let (store, dir) = (store.clone(), dir.clone());
            checks.push(async move {
                let marker = dir.clone().join(kind.marker());
                // The marker's first entries: enough to tell, one request.
                let names: Vec<String> = store
                    .list(Some(&marker))
                    .take(64)
                    .filter_map(|m| async move { m.ok() })
                    .map(|m| {
                        let full = m.location.as_ref().to_string();
                        let rel = full.strip_prefix(dir.as_ref()).unwrap_or(&full);
                        rel.trim_start_matches('/').to_string()
                    })
                    .collect()
                    .await;
                let found = kind_of(names.iter().map(String::as_str)) == Some(kind);
                (found, depth, kind, dir)
            });
        }
    }
    let found = futures::future::join_all(checks).await;
    // The nearest enclosing table: the deepest directory that is one.
    Ok((found.into_iter())
        .filter(|(found, ..)| *found)
        .max_by_key(|(_, depth, ..)| *depth)
        .map(|(_, _, kind, dir)| (kind, dir)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_make_tables() {
        assert_eq!(
            kind_of(["metadata/v3.metadata.json", "data/a.parquet"]),
            Some(TableKind::Iceberg)
        );
        assert_eq!(
            kind_of(["metadata/version-hint.text"]),
            Some(TableKind::Iceberg)
        );
        assert_eq!(
            kind_of([".hoodie/hoodie.properties", "p=1/a.parquet"]),
            Some(TableKind::Hudi)
        );
        assert_eq!(
            kind_of(["_delta_log/00000000000000000000.json"]),
            Some(TableKind::Delta)
        );
        // A metadata directory of something else, or a nested one, is no table.
        assert_eq!(kind_of(["metadata/notes.txt", "a.parquet"]), None);
        assert_eq!(kind_of(["x/metadata/v1.metadata.json"]), None);
        assert_eq!(kind_of([".hoodie/"]), None);
    }

    #[tokio::test]
    async fn a_prefix_inside_a_table_finds_its_nearest_root() {
        use object_store::ObjectStoreExt;
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        for key in [
            "lake/t/.hoodie/hoodie.properties",
            "lake/t/p=1/a.parquet",
            "lake/plain/b.parquet",
            "lake/plain/metadata/readme.txt",
        ] {
            store.put(&Path::from(key), vec![0u8].into()).await.unwrap();
        }
        let found = enclosing(&store, &Path::from("lake/t/p=1")).await.unwrap();
        assert_eq!(found, Some((TableKind::Hudi, Path::from("lake/t"))));
        assert_eq!(
            enclosing(&store, &Path::from("lake/plain")).await.unwrap(),
            None
        );
        assert_eq!(
            enclosing(&store, &Path::from("lake/t")).await.unwrap(),
            None
        );
    }
}
