//! The dataset source: Parquet objects behind `object_store`.
//!
//! A source is one Parquet object, a prefix whose `*.parquet` objects, in lexicographic key
//! order, form the dataset, or a table. Opening one ([`Source::over`]) is three steps, the same
//! for every kind: its table kind says which objects, with which partition values, statistics
//! and deletes, at which version (`lake`, the seam: `listing` for a plain prefix, `delta`,
//! `iceberg`, `hudi`; `summary` for a `_metadata` file and `snapshot` for a pinned dataset,
//! which know their footers already); the footers those objects need are loaded
//! (concurrently, kept between mounts); the source is assembled. A row group is then read
//! with a column projection (`rows`), as ranged GETs through one reader (`object`).
//!
//! Also here: `store` (SOURCE as a URL, the stores and their credentials, with `aws_profile`
//! and `iceberg_rest`), `catalog` (what a mount knows of each object), `footer` (footers from
//! the wild), `petastorm` (Unischemas and codecs), `deletes` (deletion vectors), `partition`
//! (hive partitions), `view` (schema → tensors), `filter` and `select` (`where=`: the
//! expression, and the rows it keeps of a source), `bucket` (Iceberg's bucket transform),
//! `mixture` (a `.toml` of sources).

pub(crate) mod aws_profile;
pub(crate) mod bucket;
pub mod catalog;
pub(crate) mod deletes;
pub(crate) mod delta;
pub(crate) mod delta_log;
pub mod filter;
pub(crate) mod footer;
pub(crate) mod hudi;
pub(crate) mod hudi_log;
pub(crate) mod iceberg;
pub(crate) mod iceberg_rest;
pub(crate) mod lake;
pub(crate) mod listing;
pub mod mixture;
pub(crate) mod object;
pub(crate) mod partition;
pub(crate) mod petastorm;
mod rows;
pub mod select;
pub mod snapshot;
pub(crate) mod store;
pub(crate) mod summary;
pub mod view;

use crate::model::kept;
use crate::source::partition::Partitions;
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::{Schema, SchemaRef};
use catalog::{Catalog, Earlier, Facts, Object, Pinned, Summary};
use futures::{StreamExt, TryStreamExt};
use listing::Listed;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use petastorm::read_unischema;
use snapshot::pinned_key;
use std::sync::Arc;
use std::time::Duration;
use url::Url;

pub(crate) use object::{
    ObjectReader, arrow_metadata, decode_footer, load_metadata, row_group_rows, whole_file_footer,
};
pub(crate) use store::{install_tls_provider, io_reason, store_of};
use store::{open_store, source_url};

/// How many footers are fetched at once when a mount starts.
const METADATA_CONCURRENCY: usize = 32;

/// A file's footer, decoded.
struct Footer {
    metadata: ArrowReaderMetadata,
    /// Its bytes (metadata, length, magic): where the last column chunk ends at the latest.
    len: u64,
    /// The metadata with column chunks padded (see [`footer::padded`]), once a row group failed
    /// to decode as the footer says; `None` inside when padding changes nothing.
    padded: std::sync::OnceLock<Option<ArrowReaderMetadata>>,
    /// For a table read by column names: where each of the table's columns is among the file's
    /// (none: the file lacks it). `None`: the file's columns are the dataset's, in place.
    columns: Option<Vec<Option<usize>>>,
}

impl Footer {
    fn new(metadata: ArrowReaderMetadata, len: u64, by_name: Option<&Schema>) -> Footer {
        let columns = by_name.map(|table| catalog::by_name(table, metadata.schema()));
        Footer {
            metadata,
            len,
            padded: std::sync::OnceLock::new(),
            columns,
        }
    }

    /// The file's root column that is the dataset's column `root`, if it has it.
    fn root(&self, root: usize) -> Option<usize> {
        match &self.columns {
            Some(columns) => columns[root],
            None => Some(root),
        }
    }
}

pub struct SourceFile {
    pub(crate) object: Object,
    /// Names this version of the object: its URL, key, size and version.
    pub(crate) id: [u8; 32],
    pub(crate) location: Path,
    /// Loaded when a read first needs it (at start, for a listing).
    footer: tokio::sync::OnceCell<Footer>,
    /// The rows the table deletes from it, loaded when a read first needs them.
    deleted: tokio::sync::OnceCell<Arc<roaring::RoaringTreemap>>,
}

impl std::ops::Deref for SourceFile {
    type Target = Object;

    fn deref(&self) -> &Object {
        &self.object
    }
}

impl SourceFile {
    fn new(url: &Url, location: Path, object: Object) -> SourceFile {
        // The same file with other rows deleted decodes to other columns.
        let version = format!(
            "{:?}|{:?}|{}|{:?}",
            object.e_tag,
            object.version,
            object.modified,
            object.deletes.as_ref().map(|d| d.unique_id())
        );
        let id = kept::identity(&[
            url.as_str().as_bytes(),
            location.as_ref().as_bytes(),
            &object.size.to_le_bytes(),
            version.as_bytes(),
        ]);
        SourceFile {
            object,
            id,
            location,
            footer: tokio::sync::OnceCell::new(),
            deleted: tokio::sync::OnceCell::new(),
        }
    }
}

/// Where a dataset's objects and facts came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Listed, and every footer read, when mounted.
    Listing,
    /// The files a Parquet summary file (`_metadata`) lists, with their row groups.
    Summary,
    /// A version of a table (Delta, Iceberg, Hudi): its data files as its metadata says.
    Table(lake::Version),
    /// Pinned by `tensorfs snapshot` (the snapshot's path or URL): nothing is listed, and a
    /// footer is fetched when a read first needs it.
    Snapshot(String),
}

impl Origin {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Origin::Listing => "listing",
            Origin::Summary => "summary file",
            Origin::Table(v) => v.what(),
            Origin::Snapshot(_) => "snapshot",
        }
    }

    /// Since when its objects must not have changed, as a log line says it.
    fn since(&self) -> &'static str {
        match self {
            Origin::Listing | Origin::Table(_) => "under the mount",
            Origin::Summary => "since the summary file listed it",
            Origin::Snapshot(_) => "since the snapshot",
        }
    }
}

/// How a listing mount goes, said every few seconds while it is long: a mount of many objects
/// is otherwise silent until it returns (stderr with --foreground, else the daemon's log).
struct ListingProgress {
    started: std::time::Instant,
    objects: usize,
    read: std::sync::atomic::AtomicUsize,
    said: std::sync::Mutex<std::time::Instant>,
}

impl ListingProgress {
    const EVERY: Duration = Duration::from_secs(3);

    fn new(started: std::time::Instant, objects: usize) -> ListingProgress {
        if started.elapsed() >= Self::EVERY {
            tracing::info!(
                "listed {objects} objects in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        ListingProgress {
            started,
            objects,
            read: Default::default(),
            said: std::sync::Mutex::new(started),
        }
    }

    fn footer_read(&self) {
        let read = self.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let mut said = self.said.lock().unwrap();
        if said.elapsed() >= Self::EVERY {
            *said = std::time::Instant::now();
            tracing::info!(
                "read {read} of {} footers ({:.0} s)",
                self.objects,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// How a source is listed: where footers are kept between mounts, the table version asked for,
/// and an earlier snapshot of the dataset whose unchanged objects need no footer read.
#[derive(Clone, Copy, Default)]
pub struct Listing<'a> {
    pub footers: Option<&'a std::path::Path>,
    pub version: Option<crate::options::AsOf>,
    pub from: Option<&'a Pinned>,
    /// `where=`: only the rows it keeps (PRODUCT.md §11).
    pub filter: Option<&'a filter::Filter>,
}

/// What a table kind chose of a source: its objects, with what the table says of them.
struct Chosen {
    table: Option<lake::Table>,
    objects: Vec<(String, ObjectMeta)>,
    /// The partition columns (a table's, or the hive keys of the names listed), typed over
    /// every object listed, before a `where=` rules any out.
    partitions: Partitions,
    /// One object named alone: its directory is the root.
    single_file: bool,
    /// Objects a `where=` ruled out before their footers were read.
    ruled_out: u64,
}

impl Chosen {
    /// Leaves out the objects `filter` rules out by their partition values or the table's
    /// statistics; refused where none is left.
    fn keep_where(&mut self, filter: &filter::Filter, source: &str) -> Result<()> {
        let bounds = (self.table.as_ref()).map(|t| (t.data_schema.as_ref(), &t.bounds[..]));
        let kept = select::objects_kept(filter, self.objects.len(), &self.partitions, bounds)?;
        self.ruled_out += kept.iter().filter(|&&k| !k).count() as u64;
        let mut keep = kept.iter().copied();
        (self.partitions.values).retain(|_| keep.next().unwrap_or(true));
        let mut keep = kept.into_iter();
        self.objects.retain(|_| keep.next().unwrap_or(true));
        if self.objects.is_empty() {
            bail!(
                "where={} keeps no object of source '{source}': its partition values rule every one out",
                filter.text
            );
        }
        Ok(())
    }
}

/// Where a source's objects are, and what its reads count into.
struct Where {
    store: Arc<dyn ObjectStore>,
    url: Url,
    root: Path,
    display: String,
    footers: Option<std::path::PathBuf>,
    stats: Arc<Stats>,
}

pub struct Source {
    /// The source as the user named it, for messages.
    pub display: String,
    /// The source as a URL: what a snapshot pins.
    pub(crate) url: Url,
    /// The prefix the objects' names are relative to.
    pub(crate) root: Path,
    pub origin: Origin,
    pub(crate) summary: Option<Summary>,
    /// The dataset's schema: its first file's columns, as read, then the partition columns.
    pub(crate) schema: SchemaRef,
    /// The partition columns (hive directories, a Delta table's): fields after the files'
    /// columns.
    pub partitions: Partitions,
    /// The Delta table version the dataset is, if it is one: its files' columns are then found
    /// by name and read as the table's schema says.
    pub table: Option<lake::Version>,
    pub(crate) facts: Facts,
    /// The Unischema of a dataset Petastorm wrote, from its `_common_metadata`.
    pub unischema: Option<crate::source::petastorm::Unischema>,
    /// What `where=` kept of it, where one was given (or pinned).
    pub selected: Option<select::Selected>,
    store: Arc<dyn ObjectStore>,
    stats: Arc<Stats>,
    /// Where footers and other facts about the objects are kept between mounts.
    kept: Option<std::path::PathBuf>,
    pub files: Vec<SourceFile>,
    fingerprint: std::sync::OnceLock<String>,
}

/// A field's name, nullability and type, nested fields alike, as a stable string (a `Debug` of
/// a field would hold its metadata, a hash map in no fixed order).
fn field_key(f: &arrow::datatypes::Field) -> String {
    use arrow::datatypes::DataType;
    let ty = match f.data_type() {
        DataType::List(c) => format!("List<{}>", field_key(c)),
        DataType::LargeList(c) => format!("LargeList<{}>", field_key(c)),
        DataType::ListView(c) => format!("ListView<{}>", field_key(c)),
        DataType::LargeListView(c) => format!("LargeListView<{}>", field_key(c)),
        DataType::FixedSizeList(c, n) => format!("FixedSizeList<{}, {n}>", field_key(c)),
        DataType::Struct(fields) => {
            let inner: Vec<String> = fields.iter().map(|c| field_key(c)).collect();
            format!("Struct<{}>", inner.join(", "))
        }
        DataType::Map(c, sorted) => format!("Map<{}, {sorted}>", field_key(c)),
        DataType::Dictionary(k, v) => format!("Dictionary<{k}, {v}>"),
        other => format!("{other}"),
    };
    format!("{}: {ty} {}", f.name(), f.is_nullable())
}

impl Source {
    /// Lists the source and loads every file's footer (concurrently; from `footers`, a
    /// directory of footers kept by earlier mounts, when the object has not changed). A source
    /// naming a Parquet summary file (`…/_metadata`) is the dataset it lists.
    pub(crate) async fn open(
        source: &str,
        store_options: &[(String, String)],
        footers: Option<&std::path::Path>,
        stats: Arc<Stats>,
        version: Option<crate::options::AsOf>,
        filter: Option<&filter::Filter>,
    ) -> Result<Source> {
        let (store, url, prefix) = Self::store_for(source, store_options)?;
        let at = Listing {
            footers,
            version,
            from: None,
            filter,
        };
        Self::over(store, &url, prefix, source, stats, at).await
    }

    /// [`Source::open`] of a dataset pinned before as `from` (`tensorfs snapshot --from`): the
    /// objects `from` holds, unchanged, are taken as it pinned them, and only the footers of the
    /// others are read.
    pub(crate) async fn open_from(
        source: &str,
        store_options: &[(String, String)],
        version: Option<crate::options::AsOf>,
        from: &Pinned,
        stats: Arc<Stats>,
        filter: Option<&filter::Filter>,
    ) -> Result<Source> {
        let (store, url, prefix) = Self::store_for(source, store_options)?;
        if pinned_key(&url) != pinned_key(&from.url) {
            bail!(
                "snapshot '{}' pins the dataset at '{}', not source '{source}'",
                from.at,
                from.url
            );
        }
        let at = Listing {
            footers: None,
            version,
            from: Some(from),
            filter,
        };
        Self::over(store, &url, prefix, source, stats, at).await
    }

    /// The store, URL and path a source names.
    fn store_for(
        source: &str,
        store_options: &[(String, String)],
    ) -> Result<(Arc<dyn ObjectStore>, Url, Path)> {
        let url = source_url(source)?;
        let (store, prefix) = open_store(&url, store_options)
            .map_err(|e| anyhow!("source '{source}' cannot be used: {}", crate::describe(&e)))?;
        Ok((store, url, prefix))
    }

    /// The dataset under `prefix` of any object store (`url` names it in the footers' keys):
    /// in-process tests build it over object_store's in-memory store. Its table kind says which
    /// objects (with their partition values, statistics and deletes, at which version); then
    /// the footers they need are loaded, and the source assembled.
    pub async fn over(
        store: Arc<dyn ObjectStore>,
        url: &Url,
        prefix: Path,
        source: &str,
        stats: Arc<Stats>,
        at: Listing<'_>,
    ) -> Result<Source> {
        let Listing {
            footers,
            version,
            from,
            filter,
        } = at;
        let summary = prefix.filename() == Some(summary::SUMMARY) && !source.ends_with('/');
        if summary && version.is_none() {
            let mut source = summary::open(store, url, prefix, source, footers, stats).await?;
            if let Some(filter) = filter {
                source.select(filter, 0).await?;
            }
            return Ok(source);
        }
        let started = std::time::Instant::now();
        // A source naming an Iceberg table's metadata file (as catalogs hand them out) is that
        // table, at its root, read by that file.
        let (prefix, metadata) = match prefix.as_ref().ends_with(".metadata.json") {
            true => {
                let root = parent(&parent(&prefix));
                let name = prefix.as_ref()[root.as_ref().len()..].trim_start_matches('/');
                (root.clone(), Some(name.to_string()))
            }
            false => (prefix, None),
        };
        let listed = match &metadata {
            Some(_) => listing::list(&store, url, &prefix, &format!("{source}/")).await?,
            None => listing::list(&store, url, &prefix, source).await?,
        };
        let (mut table, objects) = match listed {
            Listed::Table(kind, all) => {
                let opening = lake::Opening {
                    store: &store,
                    url,
                    root: &prefix,
                    listed: &all,
                    metadata: metadata.as_deref(),
                    version,
                    filter,
                    footers,
                    stats: &stats,
                };
                let in_source =
                    |e: anyhow::Error| anyhow!("source '{source}': {}", crate::describe(&e));
                let table = kind.open(&opening).await.map_err(in_source)?;
                let objects = Self::table_objects(&store, &prefix, source, &table, all).await?;
                (Some(table), objects)
            }
            Listed::Plain(_) if version.is_some() => bail!(
                "mount option version={} is for Delta tables (and Iceberg and Hudi tables), and source '{source}' is no table: it has no {}/, metadata/ or {}/",
                version.expect("given"),
                delta::LOG,
                hudi::HOODIE
            ),
            Listed::Plain(objects) => (None, objects),
        };
        let single_file = objects.len() == 1 && objects[0].1.location == prefix;
        let mut chosen = Chosen {
            partitions: match &mut table {
                Some(t) => std::mem::take(&mut t.partitions),
                None => listing::partitions(&objects, single_file),
            },
            ruled_out: table.as_ref().map_or(0, |t| t.ruled_out),
            table,
            objects,
            single_file,
        };
        if let Some(filter) = filter {
            chosen.keep_where(filter, source)?;
        }
        let at = Where {
            store,
            url: url.clone(),
            root: match single_file {
                true => parent(&prefix),
                false => prefix.clone(),
            },
            display: source.to_string(),
            footers: footers.map(Into::into),
            stats,
        };
        let earlier =
            from.and_then(|f| Earlier::of(f, chosen.table.as_ref().map(|t| &t.data_schema)));
        let files = Self::load_footers(&at, &prefix, &chosen, earlier.as_ref(), started).await?;
        Self::assemble(at, &prefix, chosen, files, earlier.as_ref(), filter).await
    }

    /// The chosen objects as source files, each with its footer (and its deletes) loaded:
    /// concurrently, from the footers kept by earlier mounts where they are, and none for an
    /// object `earlier` pinned unchanged.
    async fn load_footers(
        at: &Where,
        table_root: &Path,
        chosen: &Chosen,
        earlier: Option<&Earlier<'_>>,
        started: std::time::Instant,
    ) -> Result<Vec<SourceFile>> {
        let (url, footers) = (&at.url, at.footers.as_deref());
        let progress = &ListingProgress::new(started, chosen.objects.len());
        let table = chosen.table.as_ref();
        let by_name = table.map(|t| t.data_schema.as_ref());
        let deletes: std::collections::HashMap<&str, &deletes::DeletionVector> = (table.iter())
            .flat_map(|t| t.files.iter().zip(&t.deletes))
            .filter_map(|(name, dv)| Some((name.as_str(), dv.as_ref()?)))
            .collect();
        let deletes = &deletes;
        futures::stream::iter(chosen.objects.iter().cloned())
            .map(|(name, meta)| {
                let (store, stats) = (at.store.clone(), at.stats.clone());
                async move {
                    let memory = table.and_then(|t| t.memory.get(&name)).cloned();
                    let mut object = object_of(name, &meta);
                    object.memory = memory;
                    object.deletes = deletes.get(object.name.as_str()).map(|&d| d.clone());
                    if let Some(pinned) = earlier.and_then(|e| e.same(&object)) {
                        // Pinned before, unchanged since: its footer is not read.
                        object.rg_rows = pinned.rg_rows.clone();
                        object.rg_deleted = pinned.rg_deleted.clone();
                        object.footer_len = pinned.footer_len;
                        return Ok(SourceFile::new(url, meta.location, object));
                    }
                    let mut file = SourceFile::new(url, meta.location, object);
                    let reader = ObjectReader::new(
                        store.clone(),
                        &file,
                        stats.clone(),
                        Origin::Listing.since(),
                    );
                    let (metadata, footer_len) = load_metadata(&reader, footers, &file.id, 0)
                        .await
                        .map_err(|e| {
                            anyhow!(
                                "file '{}' is not a readable Parquet file: {}",
                                file.name,
                                crate::describe(&e)
                            )
                        })?;
                    file.object.footer_len = footer_len;
                    file.object.rg_rows = row_group_rows(metadata.metadata());
                    let footer = Footer::new(metadata, footer_len, by_name);
                    file.footer = tokio::sync::OnceCell::new_with(Some(footer));
                    if let Some(dv) = file.object.deletes.clone() {
                        // What each row group keeps, for the plan; the rows, for the decode.
                        let rows = deletes::load(&store, url, table_root, &dv, &stats)
                            .await
                            .with_context(|| format!("file '{}'", file.name))?;
                        file.object.rg_deleted =
                            deletes::per_row_group(&rows, &file.object.rg_rows);
                        file.deleted = tokio::sync::OnceCell::new_with(Some(Arc::new(rows)));
                    }
                    progress.footer_read();
                    Ok::<_, anyhow::Error>(file)
                }
            })
            .buffered(METADATA_CONCURRENCY)
            .try_collect()
            .await
    }

    /// The source of the chosen objects' files: its schema and partition columns (a table's,
    /// else its first file's and its hive directories'), the facts of its footers, a Petastorm
    /// Unischema, and what `where=` keeps.
    async fn assemble(
        at: Where,
        table_root: &Path,
        chosen: Chosen,
        files: Vec<SourceFile>,
        earlier: Option<&Earlier<'_>>,
        filter: Option<&filter::Filter>,
    ) -> Result<Source> {
        let source = at.display.clone();
        if files.is_empty() {
            bail!("source '{source}' holds no data files");
        }
        // The files whose footers were read (all of them, unless `from` pinned some), and where
        // each is among all.
        let (positions, loaded): (Vec<usize>, Vec<(&str, &ArrowReaderMetadata)>) = (files.iter())
            .enumerate()
            .filter_map(|(i, f)| Some((i, (f.name.as_str(), &f.footer.get()?.metadata))))
            .unzip();
        Stats::add(&at.stats.c.objects_touched, loaded.len() as u64);
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        // Some objects taken as `from` pinned them: the facts of their footers are its.
        let grown = earlier
            .filter(|_| loaded.len() < files.len())
            .map(|e| catalog::Grown {
                earlier: e,
                positions: &positions,
                names: &names,
            });
        // A table's schema and partition columns are its log's; a listing's, its first file's
        // and its hive directories'.
        let Chosen {
            table,
            partitions,
            single_file,
            ruled_out,
            ..
        } = chosen;
        let (file_schema, partitions, facts, unischema, table_version) = match table {
            Some(t) => {
                let facts = match &grown {
                    None => Facts::of_table(&t.data_schema, &loaded, &partitions),
                    Some(g) => g.facts_of_table(&t.data_schema, &loaded, &partitions),
                };
                (t.data_schema, partitions, facts, None, Some(t.version))
            }
            None => {
                let facts_of = |schema: &Schema| match &grown {
                    None => Facts::of(schema, &loaded, &partitions),
                    Some(g) => g.facts(schema, &loaded, &partitions),
                };
                // The dataset's schema is its first file's.
                let schema = match (positions.first(), &grown) {
                    (Some(0), _) | (_, None) => loaded[0].1.schema().clone(),
                    (_, Some(g)) => g.earlier.file_schema.clone(),
                };
                let facts = facts_of(&schema);
                let unischema = match single_file {
                    true => None,
                    false => read_unischema(&at.store, table_root, &at.stats).await?,
                };
                (schema, partitions, facts, unischema, None)
            }
        };
        let catalog = Catalog {
            objects: Vec::new(),
            summary: None,
            schema: with_partitions(&file_schema, &partitions),
            partitions,
            table: table_version,
            facts,
            unischema,
            selection: None,
        };
        let origin = table_version.map_or(Origin::Listing, Origin::Table);
        let table = catalog.table.is_some();
        let mut source = Source::new(at, catalog, origin)?;
        source.files = files;
        if !table {
            source.infer_unischema_if_none().await;
        }
        if let Some(filter) = filter {
            source.select(filter, ruled_out).await?;
        }
        Ok(source)
    }

    /// The objects of a table's data files, as listed, or (committed after the listing) asked
    /// for alone.
    async fn table_objects(
        store: &Arc<dyn ObjectStore>,
        root: &Path,
        source: &str,
        table: &lake::Table,
        listed: Vec<(String, ObjectMeta)>,
    ) -> Result<Vec<(String, ObjectMeta)>> {
        let mut metas: std::collections::HashMap<String, ObjectMeta> = listed.into_iter().collect();
        let mut objects = Vec::with_capacity(table.files.len());
        for name in &table.files {
            let meta = match metas.remove(name) {
                Some(meta) => meta,
                None if table.memory.contains_key(name) => {
                    lake::memory_meta(child(root, name)?, &table.memory[name])
                }
                None => store.head(&child(root, name)?).await.map_err(|e| {
                    anyhow!(
                        "source '{source}': file '{name}' of {} version {} cannot be read: {e}",
                        table.version.what(),
                        table.version.number
                    )
                })?,
            };
            objects.push((name.clone(), meta));
        }
        Ok(objects)
    }

    /// A source of `catalog`'s objects, none of whose footers is loaded yet.
    fn new(at: Where, catalog: Catalog, origin: Origin) -> Result<Source> {
        let Catalog {
            objects,
            summary,
            schema,
            partitions,
            table,
            facts,
            unischema,
            selection,
        } = catalog;
        let selected = selection.map(|text| select::Selected {
            text,
            ..Default::default()
        });
        let files = (objects.into_iter())
            .map(|o| Ok(SourceFile::new(&at.url, child(&at.root, &o.name)?, o)))
            .collect::<Result<_>>()?;
        Ok(Source {
            display: at.display,
            url: at.url,
            root: at.root,
            origin,
            summary,
            schema,
            partitions,
            table,
            facts,
            unischema,
            store: at.store,
            stats: at.stats,
            kept: at.footers,
            files,
            selected,
            fingerprint: std::sync::OnceLock::new(),
        })
    }

    /// What this source's objects are, for a snapshot: the catalog a pinned mount starts from.
    pub(crate) fn objects(&self) -> Vec<&Object> {
        self.files.iter().map(|f| &f.object).collect()
    }

    fn fact_path(&self, file: usize, what: &str) -> Option<(std::path::PathBuf, [u8; 32])> {
        let id = kept::identity(&[&self.files[file].id, what.as_bytes()]);
        Some((
            self.kept.as_ref()?.join(format!("{}.fact", hex(&id[..16]))),
            id,
        ))
    }

    /// A fact about one file that an earlier mount found out and kept (such as whether a list
    /// column holds nulls, which only reading it tells).
    pub(crate) fn kept_fact(&self, file: usize, what: &str) -> Option<Vec<u8>> {
        let (path, id) = self.fact_path(file, what)?;
        kept::read_blob(&path, &id)
    }

    pub(crate) fn keep_fact(&self, file: usize, what: &str, value: &[u8]) {
        if let Some((path, id)) = self.fact_path(file, what)
            && let Err(e) = kept::write_blob(&path, &id, value)
        {
            tracing::warn!("cannot keep '{}': {e:#}", path.display());
        }
    }

    /// How many of the schema's fields are the files' own columns (the partition columns
    /// follow them).
    pub(crate) fn file_columns(&self) -> usize {
        self.schema.fields().len() - self.partitions.fields.len()
    }

    /// Identifies the dataset's content (see `catalog::fingerprint`).
    pub fn fingerprint(&self) -> &str {
        self.fingerprint.get_or_init(|| {
            let objects = self.objects();
            catalog::fingerprint(
                self.summary.as_ref(),
                self.table,
                &objects,
                self.unischema.as_ref(),
                self.selected.as_ref().map(|s| s.text.as_str()),
            )
        })
    }

    /// What decides an object's decoded columns beyond its own bytes and the column options: the
    /// dataset's schema (its partition columns and a table's types included), whether a table
    /// reads its files' columns by name, and a Petastorm Unischema. The cache keys columns by it
    /// and by each object's version, not by the whole dataset, so a dataset that grows keeps
    /// them ([`crate::cache`]).
    pub(crate) fn decode_identity(&self) -> String {
        let mut parts = vec![format!("table {}", self.table.is_some())];
        for f in self.schema.fields() {
            parts.push(field_key(f));
        }
        if let Some(u) = &self.unischema {
            parts.push(format!("unischema {}", u.inferred));
            for f in &u.fields {
                let (codec, shape) = (f.codec.name(), f.shape_text());
                parts.push(format!(
                    "{} {} {shape} {codec} {}",
                    f.name, f.numpy, f.nullable
                ));
            }
        }
        let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
        kept::key_name(&refs)
    }

    /// The footer of `file`: loaded when a read first needs it (a listing loaded them all),
    /// from the footers kept by earlier mounts or else fetched (one GET, where its length is
    /// known), and checked against what the catalog says of the file.
    async fn footer(&self, file: usize) -> Result<&Footer> {
        let f = &self.files[file];
        f.footer.get_or_try_init(|| self.load_footer(file)).await
    }

    async fn load_footer(&self, file: usize) -> Result<Footer> {
        let f = &self.files[file];
        let reader = self.reader(file);
        let (metadata, len) = load_metadata(&reader, self.kept.as_deref(), &f.id, f.footer_len)
            .await
            .with_context(|| format!("file '{}': its footer cannot be read", f.name))?;
        Stats::add(&self.stats.c.objects_touched, 1);
        let rows = row_group_rows(metadata.metadata());
        let ours = self.file_schema()?;
        let differs = match rows == f.rg_rows {
            false => Some(format!(
                "its footer gives {} rows in {} row groups, not {} in {}",
                rows.iter().sum::<u64>(),
                rows.len(),
                f.rows(),
                f.rg_rows.len()
            )),
            true => {
                match self.table {
                    // A table's files are read by name, as the table's types.
                    Some(_) => catalog::table_schema_problem(&ours, &f.name, &metadata),
                    None => catalog::schema_difference(&ours, metadata.schema())
                        .map(|d| format!("its schema differs ({d})")),
                }
            }
        };
        if let Some(how) = differs {
            return Err(anyhow::Error::new(crate::error::ObjectChanged {
                location: f.location.to_string(),
                since: self.origin.since(),
                how,
            }));
        }
        let by_name = self.table.map(|_| ours.as_ref());
        Ok(Footer::new(metadata, len, by_name))
    }

    /// The dataset's columns that its files store (the partition columns left out).
    fn file_schema(&self) -> Result<SchemaRef> {
        let columns: Vec<usize> = (0..self.file_columns()).collect();
        Ok(Arc::new(self.schema.project(&columns)?))
    }
}

/// The files' schema with the partition columns after their columns.
fn with_partitions(files: &SchemaRef, partitions: &Partitions) -> SchemaRef {
    if partitions.is_empty() {
        return files.clone();
    }
    let fields: Vec<_> = (files.fields().iter().cloned())
        .chain(partitions.fields.iter().cloned())
        .collect();
    Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        files.metadata().clone(),
    ))
}

/// The path `prefix` lies in ("" at the top).
fn parent(prefix: &Path) -> Path {
    let parts: Vec<_> = prefix.parts().collect();
    Path::from_iter(parts[..parts.len().saturating_sub(1)].iter().cloned())
}

/// The object `name` (relative, with `/`, as a listing gave it) under `root`.
pub(crate) fn child(root: &Path, name: &str) -> Result<Path> {
    let path = match root.as_ref() {
        "" => name.to_string(),
        root => format!("{root}/{name}"),
    };
    Path::parse(&path).map_err(|e| anyhow!("'{name}' is not an object's name: {e}"))
}

/// An object as listed, before its footer is read.
fn object_of(name: String, meta: &ObjectMeta) -> Object {
    Object {
        deletes: None,
        rg_deleted: Vec::new(),
        name,
        size: meta.size,
        e_tag: meta.e_tag.clone(),
        version: meta.version.clone(),
        modified: meta.last_modified.to_string(),
        footer_len: 0,
        rg_rows: Vec::new(),
        memory: None,
    }
}

/// Bytes as lowercase hex digits.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
