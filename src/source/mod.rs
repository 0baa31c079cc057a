//! The dataset source: Parquet objects behind `object_store`.
//!
//! A source is one Parquet object, or a prefix whose `*.parquet` objects, in lexicographic key
//! order, form the dataset. Footers are loaded once, concurrently, and kept; a row group is then
//! read with a column projection, as ranged GETs that object_store coalesces.
//!
//! This folder, the sources: this module (the stores, listing, reading row groups), `catalog`
//! (what a mount knows of each object), `snapshot` (the file that pins it), `footer` (footers
//! from the wild), `petastorm`, `delta` (Delta Lake tables), `partition` (hive partitions),
//! `view` (schema → tensors), `filter` and `select` (`where=`: the expression, and the rows it
//! keeps of a source), `bucket` (Iceberg's bucket transform), `iceberg_rest` (a REST catalog's
//! tables), `aws_profile` (the AWS CLI's profiles).

pub(crate) mod aws_profile;
pub(crate) mod bucket;
pub mod catalog;
pub(crate) mod deletes;
pub(crate) mod delta;
pub(crate) mod delta_log;
pub mod filter;
pub(crate) mod footer;
pub(crate) mod hudi;
pub(crate) mod iceberg;
pub(crate) mod iceberg_rest;
pub(crate) mod lake;
pub mod mixture;
pub(crate) mod partition;
pub(crate) mod petastorm;
pub mod select;
pub mod snapshot;
pub mod view;

use crate::model::kept;
use crate::source::partition::Partitions;
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use bytes::Bytes;
use catalog::{Catalog, Earlier, Facts, Object, Pinned, Summary};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientConfigKey, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore,
    ObjectStoreExt, ObjectStoreScheme, RetryConfig,
};
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, RowSelection};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataBuilder, ParquetMetaDataReader,
};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use url::Url;

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
struct Progress {
    started: std::time::Instant,
    objects: usize,
    read: std::sync::atomic::AtomicUsize,
    said: std::sync::Mutex<std::time::Instant>,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(3);

    fn new(started: std::time::Instant, objects: usize) -> Progress {
        if started.elapsed() >= Self::EVERY {
            tracing::info!(
                "listed {objects} objects in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Progress {
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

/// A source's listing: its `*.parquet` objects, the kind of table it is the root of (if it
/// is one), and, for a table, every object's name (its metadata's too).
struct Listed {
    objects: Vec<(String, ObjectMeta)>,
    table: Option<lake::Kind>,
    names: Vec<String>,
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

/// Turns SOURCE (a URL or a local path) into a URL object_store understands.
fn source_url(source: &str) -> Result<Url> {
    if source.contains("://") {
        let mut url =
            Url::parse(source).map_err(|e| anyhow!("source '{source}' is not a valid URL: {e}"))?;
        if !url.username().is_empty() || url.password().is_some() {
            // Never shown: the refusal names the URL with its password masked.
            if url.password().is_some() {
                let _ = url.set_password(Some("****"));
            }
            bail!(
                "source '{url}': tensorfs takes no user name or password in a URL; give them as mount options (http_username=, http_password=) or in the environment"
            );
        }
        return Ok(url);
    }
    let path = std::fs::canonicalize(source)
        .map_err(|e| anyhow!("source '{source}' cannot be opened: {}", io_reason(&e)))?;
    let mut url = Url::from_file_path(&path)
        .map_err(|_| anyhow!("source '{source}' is not a usable path"))?;
    if path.is_dir() && !url.path().ends_with('/') {
        url.set_path(&format!("{}/", url.path()));
    }
    Ok(url)
}

/// The store and object path a URL names (a snapshot's), configured as a source's store is.
pub(crate) fn store_of(
    url: &str,
    store_options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path)> {
    open_store(&source_url(url)?, store_options)
}

/// Retries of remote requests: 5xx, throttling, resets and timeouts are retried with
/// exponential backoff and jitter (object_store's) for up to a minute, so a server that stays
/// down turns into EIO rather than a hung read, and a request that timed out is still retried.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(4),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: Duration::from_secs(60),
    }
}

/// Client defaults, as configuration keys so that the environment's and the mount's own keys
/// (`aws_allow_http`, `aws_timeout`, …) still apply over them.
const CLIENT_DEFAULTS: [(ClientConfigKey, &str); 2] = [
    (ClientConfigKey::ConnectTimeout, "5s"),
    (ClientConfigKey::Timeout, "15s"),
];

fn bad_key(key: &str) -> anyhow::Error {
    anyhow!("unknown mount option '{key}' for this kind of source")
}

/// Builds a cloud store: environment, then our client defaults, then the mount's keys.
macro_rules! cloud_store {
    ($builder:ty, $client_key:path, $url:expr, $options:expr) => {{
        let mut b = <$builder>::from_env()
            .with_url($url.as_str())
            .with_retry(retry());
        for (key, value) in CLIENT_DEFAULTS {
            b = b.with_config($client_key(key), value);
        }
        for (k, v) in $options {
            b = b.with_config(k.parse().map_err(|_| bad_key(k))?, v);
        }
        Arc::new(b.build()?) as Arc<dyn ObjectStore>
    }};
}

/// The object store for a URL, configured from the environment (`AWS_*`, `GOOGLE_*`,
/// `AZURE_*`) and from the object_store keys among the mount options.
/// Installs ring as rustls's crypto provider, once, before the first TLS client is built (the
/// HTTP client is built without one of its own, see Cargo.toml).
pub(crate) fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // An error means a provider is installed already, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn open_store(url: &Url, options: &[(String, String)]) -> Result<(Arc<dyn ObjectStore>, Path)> {
    install_tls_provider();
    // A REST catalog's options are the catalog's, not the store's (iceberg_rest).
    let options = &iceberg_rest::store_options(options)[..];
    let (scheme, path) = ObjectStoreScheme::parse(url)?;
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::Local => {
            if let Some((k, _)) = options.first() {
                return Err(bad_key(k));
            }
            Arc::new(LocalFileSystem::new())
        }
        ObjectStoreScheme::AmazonS3 => {
            // The AWS CLI's profile (aws_profile=, AWS_PROFILE) is no object_store key.
            let profile = (options.iter())
                .rfind(|(k, _)| k == aws_profile::OPTION)
                .map(|(_, v)| v.as_str());
            let rest: Vec<(String, String)> = (options.iter())
                .filter(|(k, _)| k != aws_profile::OPTION)
                .cloned()
                .collect();
            let mut b = AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .with_retry(retry());
            for (key, value) in CLIENT_DEFAULTS {
                b = b.with_config(AmazonS3ConfigKey::Client(key), value);
            }
            for (k, v) in &rest {
                b = b.with_config(k.parse().map_err(|_| bad_key(k))?, v);
            }
            Arc::new(aws_profile::apply(b, profile)?.build()?) as Arc<dyn ObjectStore>
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            cloud_store!(
                GoogleCloudStorageBuilder,
                GoogleConfigKey::Client,
                url,
                options
            )
        }
        ObjectStoreScheme::MicrosoftAzure => {
            cloud_store!(MicrosoftAzureBuilder, AzureConfigKey::Client, url, options)
        }
        ObjectStoreScheme::Http => {
            let mut client = ClientOptions::new();
            for (key, value) in CLIENT_DEFAULTS {
                client = client.with_config(key, value);
            }
            if let Some(header) = http_credentials(options)? {
                let mut headers = reqwest::header::HeaderMap::new();
                headers.insert(reqwest::header::AUTHORIZATION, header);
                client = client.with_default_headers(headers);
            }
            let client_keys = options
                .iter()
                .filter(|(k, _)| !HTTP_CREDENTIAL_KEYS.contains(&k.as_str()));
            for (k, v) in client_keys {
                let key = k
                    .strip_prefix("http_")
                    .or_else(|| k.strip_prefix("client_"))
                    .unwrap_or(k);
                client = client.with_config(key.parse().map_err(|_| bad_key(k))?, v);
            }
            let origin = &url[..url::Position::BeforePath];
            Arc::new(
                HttpBuilder::new()
                    .with_url(origin)
                    .with_retry(retry())
                    .with_client_options(client)
                    .build()?,
            )
        }
        other => bail!("{other:?} sources are not supported"),
    };
    Ok((store, Path::parse(path)?))
}

/// The `Authorization` header an HTTP source sends, and the other options. object_store's HTTP
/// store has no keys for credentials, so tensorfs takes its own: `http_username` with
/// `http_password` (basic), or `http_bearer_token`, from the mount options or else from the
/// environment (`TENSORFS_HTTP_USERNAME`, `TENSORFS_HTTP_PASSWORD`,
/// `TENSORFS_HTTP_BEARER_TOKEN`). The header is marked sensitive, so it is never logged.
fn http_credentials(options: &[(String, String)]) -> Result<Option<reqwest::header::HeaderValue>> {
    use base64::Engine;
    let given = |key: &str| -> Option<String> {
        let from_options = options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone());
        from_options.or_else(|| std::env::var(format!("TENSORFS_{}", key.to_uppercase())).ok())
    };
    let value = match (
        given("http_username"),
        given("http_password"),
        given("http_bearer_token"),
    ) {
        (None, None, None) => None,
        (Some(user), password, None) => {
            let pair = format!("{user}:{}", password.unwrap_or_default());
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            Some(format!("Basic {encoded}"))
        }
        (None, None, Some(token)) => Some(format!("Bearer {token}")),
        (None, Some(_), None) => bail!("http_password needs http_username"),
        (Some(_), _, Some(_)) | (None, Some(_), Some(_)) => {
            bail!("give http_username and http_password, or http_bearer_token, not both")
        }
    };
    value
        .map(|v| {
            let mut h = reqwest::header::HeaderValue::from_str(&v)
                .map_err(|_| anyhow!("HTTP credentials must be printable ASCII"))?;
            h.set_sensitive(true);
            Ok(h)
        })
        .transpose()
}

/// tensorfs's own keys of an HTTP source (see [`http_credentials`]).
const HTTP_CREDENTIAL_KEYS: [&str; 3] = ["http_username", "http_password", "http_bearer_token"];

/// An I/O error as a refusal says it: the common ones in plain words.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
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
    /// in-process tests build it over object_store's in-memory store.
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
        let summary = prefix.filename() == Some(SUMMARY) && !source.ends_with('/');
        if summary && version.is_none() {
            let mut source = Self::summarised(store, url, prefix, source, footers, stats).await?;
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
            Some(_) => Self::list(&store, &prefix, &format!("{}/", source)).await?,
            None => Self::list(&store, &prefix, source).await?,
        };
        match listed.table {
            Some(_) => {}
            // Files inside a table (a partition directory, one data file) are no dataset.
            None => {
                if let Some((kind, root)) = lake::enclosing(&store, &prefix).await? {
                    let root = match url.scheme() {
                        "file" => format!("/{root}"),
                        scheme => format!("{scheme}://{}/{root}", url.host_str().unwrap_or("")),
                    };
                    bail!(
                        "source '{source}' lies inside the {} table at '{root}': mount the table's root, which reads it at a version (its files alone hold deleted and superseded rows)",
                        kind.name()
                    );
                }
            }
        }
        let in_source = |e: anyhow::Error| anyhow!("source '{source}': {}", crate::describe(&e));
        let table: Option<lake::Table> = match (listed.table, version) {
            (Some(lake::Kind::Delta), version) => Some(
                delta::read(store.clone(), &prefix, version, filter.is_some())
                    .await
                    .map_err(in_source)?,
            ),
            (Some(lake::Kind::Hudi), version) => {
                let names: Vec<&str> = listed.names.iter().map(String::as_str).collect();
                let t = hudi::read(store.clone(), &prefix, &names, version)
                    .await
                    .map_err(in_source)?;
                let metas: std::collections::HashMap<&str, &ObjectMeta> = (listed.objects.iter())
                    .map(|(n, m)| (n.as_str(), m))
                    .collect();
                let data_schema =
                    Self::hudi_schema(&store, url, &t, &metas, footers, &stats).await?;
                let bounds = match filter {
                    Some(_) => hudi::partition_bounds(&t, &data_schema),
                    None => Vec::new(),
                };
                Some(lake::Table {
                    version: lake::Version {
                        kind: lake::Kind::Hudi,
                        number: t.version,
                    },
                    data_schema,
                    partitions: Partitions::default(),
                    deletes: vec![None; t.files.len()],
                    bounds,
                    ruled_out: 0,
                    files: t.files,
                })
            }
            (Some(lake::Kind::Iceberg), version) => {
                let names: Vec<&str> = listed.names.iter().map(String::as_str).collect();
                let t = iceberg::read(
                    store.clone(),
                    &prefix,
                    &names,
                    metadata.as_deref(),
                    version,
                    filter,
                );
                Some(t.await.map_err(in_source)?)
            }
            (None, Some(v)) => bail!(
                "mount option version={v} is for Delta tables (and Iceberg and Hudi tables), and source '{source}' is no table: it has no {}/, metadata/ or {}/",
                delta::LOG,
                hudi::HOODIE
            ),
            (None, None) => None,
        };
        let objects = match &table {
            None => listed.objects,
            Some(t) => {
                let mut metas: std::collections::HashMap<String, ObjectMeta> =
                    listed.objects.into_iter().collect();
                let mut objects = Vec::with_capacity(t.files.len());
                for name in &t.files {
                    let meta = match metas.remove(name) {
                        Some(meta) => meta,
                        // Committed after the listing: asked for alone.
                        None => store.head(&child(&prefix, name)?).await.map_err(|e| {
                            anyhow!(
                                "source '{source}': file '{name}' of {} version {} cannot be read: {e}",
                                t.version.what(),
                                t.version.number
                            )
                        })?,
                    };
                    objects.push((name.clone(), meta));
                }
                objects
            }
        };
        let single_file = objects.len() == 1 && objects[0].1.location == prefix;
        // The partition columns (a table's, or the hive keys of the names listed), typed over
        // every object, before a `where=` rules any out.
        let mut table = table;
        let mut partitions = match &mut table {
            Some(t) => std::mem::take(&mut t.partitions),
            None if single_file => Partitions::default(),
            None => {
                let names: Vec<&str> = objects.iter().map(|(n, _)| n.as_str()).collect();
                Partitions::hive(&names)
            }
        };
        let listed_out = table.as_ref().map_or(0, |t| t.ruled_out);
        let (objects, ruled_out) = match filter {
            None => (objects, 0),
            Some(filter) => {
                let bounds = table
                    .as_ref()
                    .map(|t| (t.data_schema.as_ref(), &t.bounds[..]));
                let kept = select::objects_kept(filter, objects.len(), &partitions, bounds)?;
                let ruled_out = kept.iter().filter(|&&k| !k).count() as u64;
                let mut keep = kept.iter().copied();
                partitions.values.retain(|_| keep.next().unwrap_or(true));
                let mut keep = kept.into_iter();
                let objects: Vec<_> = (objects.into_iter())
                    .filter(|_| keep.next().unwrap_or(true))
                    .collect();
                if objects.is_empty() {
                    bail!(
                        "where={} keeps no object of source '{source}': its partition values rule every one out",
                        filter.text
                    );
                }
                (objects, listed_out + ruled_out)
            }
        };
        let progress = &Progress::new(started, objects.len());
        let root = match single_file {
            true => parent(&prefix),
            false => prefix.clone(),
        };
        let by_name = table.as_ref().map(|t| t.data_schema.as_ref());
        let earlier = from.and_then(|f| Earlier::of(f, table.as_ref().map(|t| &t.data_schema)));
        let earlier = &earlier;
        let deletes: std::collections::HashMap<&str, &deletes::DeletionVector> = (table.iter())
            .flat_map(|t| t.files.iter().zip(&t.deletes))
            .filter_map(|(name, dv)| Some((name.as_str(), dv.as_ref()?)))
            .collect();
        let deletes = &deletes;
        let table_root = &prefix;
        let files: Vec<SourceFile> = futures::stream::iter(objects)
            .map(|(name, meta)| {
                let (store, stats) = (store.clone(), stats.clone());
                async move {
                    let mut object = object_of(name, &meta);
                    object.deletes = deletes.get(object.name.as_str()).map(|&d| d.clone());
                    if let Some(pinned) = earlier.as_ref().and_then(|e| e.same(&object)) {
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
                        let rows = load_deletes(&store, url, table_root, &dv, &stats)
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
            .await?;
        if files.is_empty() {
            bail!("source '{source}' holds no data files");
        }
        // The files whose footers were read (all of them, unless `from` pinned some), and where
        // each is among all.
        let (positions, loaded): (Vec<usize>, Vec<(&str, &ArrowReaderMetadata)>) = (files.iter())
            .enumerate()
            .filter_map(|(i, f)| Some((i, (f.name.as_str(), &f.footer.get()?.metadata))))
            .unzip();
        Stats::add(&stats.c.objects_touched, loaded.len() as u64);
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        // Some objects taken as `from` pinned them: the facts of their footers are its.
        let grown = (earlier.as_ref())
            .filter(|_| loaded.len() < files.len())
            .map(|e| catalog::Grown {
                earlier: e,
                positions: &positions,
                names: &names,
            });
        // A table's schema and partition columns are its log's; a listing's, its first file's
        // and its hive directories'.
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
                    false => read_unischema(&store, &prefix, &stats).await?,
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
        let at = Where {
            store,
            url: url.clone(),
            root,
            display: source.to_string(),
            footers: footers.map(Into::into),
            stats,
        };
        let delta = catalog.table.is_some();
        let mut source = Source::new(at, catalog, origin)?;
        source.files = files;
        if !delta {
            source.infer_unischema_if_none().await;
        }
        if let Some(filter) = filter {
            source.select(filter, ruled_out).await?;
        }
        Ok(source)
    }

    /// A Hudi table's schema: the newest base file's columns, Hudi's meta columns left out.
    async fn hudi_schema(
        store: &Arc<dyn ObjectStore>,
        url: &Url,
        table: &hudi::Table,
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
        let meta = metas
            .get(newest.as_str())
            .ok_or_else(|| anyhow!("file '{newest}' of the Hudi table is not listed"))?;
        let file = SourceFile::new(url, meta.location.clone(), object_of(newest.clone(), meta));
        let reader =
            ObjectReader::new(store.clone(), &file, stats.clone(), Origin::Listing.since());
        let (metadata, _) = load_metadata(&reader, footers, &file.id, 0)
            .await
            .with_context(|| format!("file '{newest}' is not a readable Parquet file"))?;
        let schema = metadata.schema();
        let keep: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| !hudi::is_meta_column(schema.field(i).name()))
            .collect();
        Ok(Arc::new(schema.project(&keep)?))
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

    /// The dataset a Parquet summary file lists, as `pyarrow.dataset.parquet_dataset` reads it:
    /// its files in the order the summary first names them, each file's row groups in the
    /// summary's order. The summary is read whole (one GET) and the directory listed (for each
    /// file's size and version); each file's own footer is fetched when a read first needs it,
    /// and checked against the summary.
    async fn summarised(
        store: Arc<dyn ObjectStore>,
        url: &Url,
        path: Path,
        source: &str,
        footers: Option<&std::path::Path>,
        stats: Arc<Stats>,
    ) -> Result<Source> {
        let root = parent(&path);
        let got = store.get(&path).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => anyhow!("source '{source}' does not exist"),
            e => anyhow!("source '{source}' cannot be read: {e}"),
        })?;
        let meta = got.meta.clone();
        let bytes = got.bytes().await?;
        Stats::add(&stats.c.remote_requests, 1);
        Stats::add(&stats.c.remote_bytes, bytes.len() as u64);
        let summary = decode_footer(
            whole_file_footer(&bytes)
                .map_err(|e| anyhow!("source '{source}' is not a Parquet summary file: {e}"))?,
        )
        .map_err(|e| anyhow!("source '{source}' is not a readable Parquet summary file: {e:#}"))?;
        let md = summary.metadata();
        // Each file's row groups, in the order the summary first names the files.
        let mut order: Vec<String> = Vec::new();
        let mut groups: std::collections::HashMap<String, Vec<usize>> = Default::default();
        for (i, rg) in md.row_groups().iter().enumerate() {
            let Some(file) = rg.columns().first().and_then(|c| c.file_path()) else {
                bail!(
                    "source '{source}': the summary file's row group {i} names no file (file_path); it is not a dataset's _metadata"
                );
            };
            if !groups.contains_key(file) {
                order.push(file.to_string());
            }
            groups.entry(file.to_string()).or_default().push(i);
        }
        if order.is_empty() {
            bail!("source '{source}': the summary file lists no row groups");
        }
        let listed: std::collections::HashMap<String, ObjectMeta> =
            Self::list_all(&store, &root, source)
                .await?
                .into_iter()
                .collect();
        let mut objects = Vec::with_capacity(order.len());
        let mut per_file = Vec::with_capacity(order.len());
        for name in &order {
            let Some(meta) = listed.get(name) else {
                bail!("source '{source}': the summary file lists '{name}', which does not exist");
            };
            let row_groups: Vec<_> = groups[name]
                .iter()
                .map(|&i| md.row_group(i).clone())
                .collect();
            let file_md = ParquetMetaDataBuilder::new(md.file_metadata().clone())
                .set_row_groups(row_groups)
                .build();
            per_file.push(arrow_metadata(Arc::new(file_md))?);
            let mut object = object_of(name.clone(), meta);
            object.rg_rows = groups[name]
                .iter()
                .map(|&i| md.row_group(i).num_rows() as u64)
                .collect();
            objects.push(object);
        }
        let schema = summary.schema().clone();
        let pairs: Vec<(&str, &ArrowReaderMetadata)> =
            (order.iter().map(String::as_str)).zip(&per_file).collect();
        let mut facts = Facts::of(&schema, &pairs, &Partitions::default());
        // Each file's own footer, loaded when needed, is about its share of the summary.
        facts.footer_memory = md.memory_size() as u64;
        let catalog = Catalog {
            objects,
            summary: Some(Summary {
                name: path.filename().unwrap_or(SUMMARY).to_string(),
                size: meta.size,
                e_tag: meta.e_tag,
            }),
            schema,
            partitions: Partitions::default(),
            table: None,
            facts,
            unischema: read_unischema(&store, &root, &stats).await?,
            selection: None,
        };
        let at = Where {
            store,
            url: url.clone(),
            root,
            display: source.to_string(),
            footers: footers.map(Into::into),
            stats,
        };
        let mut source = Source::new(at, catalog, Origin::Summary)?;
        source.infer_unischema_if_none().await;
        Ok(source)
    }

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
            root: Path::parse(&pinned.root)?,
            display: source.to_string(),
            footers: footers.map(Into::into),
            stats,
        };
        Source::new(at, pinned.catalog, Origin::Snapshot(pinned.at))
    }

    /// What this source's objects are, for a snapshot: the catalog a pinned mount starts from.
    pub(crate) fn objects(&self) -> Vec<&Object> {
        self.files.iter().map(|f| &f.object).collect()
    }

    /// Where no Unischema was stored, the one the cells show, if they show one.
    async fn infer_unischema_if_none(&mut self) {
        if self.unischema.is_none() {
            self.unischema = self.infer_unischema().await;
        }
    }

    /// Without a stored Unischema, binary columns whose first cell is one a Petastorm codec
    /// writes (`.npy`, zip, PNG, JPEG) are read as such, with that cell's dtype and shape.
    async fn infer_unischema(&self) -> Option<crate::source::petastorm::Unischema> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::DataType;
        let schema = self.schema.clone();
        let binary: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| {
                matches!(
                    schema.field(i).data_type(),
                    DataType::Binary | DataType::LargeBinary
                )
            })
            .collect();
        if binary.is_empty() {
            return None;
        }
        let (file, rg) = self.files.iter().enumerate().find_map(|(fi, f)| {
            let rg = f.rg_rows.iter().position(|&rows| rows > 0)?;
            Some((fi, rg))
        })?;
        let batch = self.read_row_group(file, rg, &binary).await.ok()?;
        let fields: Vec<_> = binary
            .iter()
            .enumerate()
            .filter_map(|(c, &i)| {
                let column = batch.column(c);
                let row = (0..column.len()).find(|&r| column.is_valid(r))?;
                let cell = match column.data_type() {
                    DataType::LargeBinary => column.as_binary::<i64>().value(row),
                    _ => column.as_binary::<i32>().value(row),
                };
                let f = schema.field(i);
                crate::source::petastorm::infer_field(f.name(), f.is_nullable(), cell)
            })
            .collect();
        (!fields.is_empty()).then(|| crate::source::petastorm::Unischema {
            name: String::new(),
            fields,
            inferred: true,
        })
    }

    /// The objects of the dataset, in canonical order, with their names relative to the prefix,
    /// and whether the prefix is a Delta table's root (its `_delta_log/` holds a commit).
    async fn list(store: &Arc<dyn ObjectStore>, prefix: &Path, source: &str) -> Result<Listed> {
        // One object named by the source is the dataset, whatever its name says (a file that
        // is not Parquet is then refused by its footer, naming it); else the source is a prefix.
        // A source ending in '/' is a prefix: HTTP servers answer HEAD of a directory with its
        // HTML listing.
        if !prefix.as_ref().is_empty() && !source.ends_with('/') {
            match store.head(prefix).await {
                Ok(meta) => {
                    let name = prefix.filename().unwrap_or(prefix.as_ref()).to_string();
                    return Ok(Listed {
                        objects: vec![(name, meta)],
                        table: None,
                        names: Vec::new(),
                    });
                }
                Err(object_store::Error::NotFound { .. }) => {}
                // A directory of the local store cannot be HEAD: it is listed below.
                Err(_) if !prefix.as_ref().ends_with(".parquet") => {}
                Err(e) => bail!("source '{source}' cannot be read: {e}"),
            }
        }
        let all = Self::list_all(store, prefix, source).await?;
        let table = lake::kind_of(all.iter().map(|(name, _)| name.as_str()));
        let names = match table {
            Some(_) => all.iter().map(|(name, _)| name.clone()).collect(),
            None => Vec::new(),
        };
        let objects: Vec<(String, ObjectMeta)> = (all.into_iter())
            .filter(|(name, _)| name.ends_with(".parquet") && !hidden(name))
            .collect();
        if objects.is_empty() && table.is_none() {
            bail!("source '{source}' holds no *.parquet objects");
        }
        Ok(Listed {
            objects,
            table,
            names,
        })
    }

    /// Every object under `prefix`, in lexicographic key order, with its name relative to it.
    async fn list_all(
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

    /// Reads one row group of one file, only the given root columns (Arrow field indices), as
    /// one record batch.
    pub(crate) async fn read_row_group(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
    ) -> Result<RecordBatch> {
        self.read_rows(file, rg, roots, true, None).await
    }

    /// [`Source::read_row_group`], with the rows the table deletes dropped (`live`) or kept;
    /// only the rows a selection picks, where one is given (see [`Source::fetch_rows`]).
    async fn read_rows(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        live: bool,
        selection: Option<(RowSelection, ArrowReaderMetadata)>,
    ) -> Result<RecordBatch> {
        let fetched = self.fetch_rows(file, rg, roots, selection).await?;
        let pieces = self.decode_stored_or_live(fetched, live).await?;
        let schema = match pieces.first() {
            Some(p) => p.schema(),
            None => Arc::new(self.schema.project(roots)?),
        };
        Ok(arrow::compute::concat_batches(&schema, &pieces)?)
    }

    fn reader(&self, file: usize) -> ObjectReader {
        let (store, stats) = (self.store.clone(), self.stats.clone());
        ObjectReader::new(store, &self.files[file], stats, self.origin.since())
    }

    /// Fetches the column chunks of one row group that the given root columns need: I/O only,
    /// so that decoding ([`Source::decode_row_group`]) holds a worker without waiting on the
    /// network.
    #[tracing::instrument(name = "fetch", level = "debug", skip(self, roots))]
    pub(crate) async fn fetch_row_group(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
    ) -> Result<Fetched> {
        self.fetch_rows(file, rg, roots, None).await
    }

    /// [`Source::fetch_row_group`], or with a selection, nothing fetched: the decode fetches the
    /// pages that hold the rows selected.
    async fn fetch_rows(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        selection: Option<(RowSelection, ArrowReaderMetadata)>,
    ) -> Result<Fetched> {
        let f = &self.files[file];
        // The partition columns are no columns of the file: they are added as it is decoded.
        let (wanted, partition_roots): (Vec<usize>, Vec<usize>) =
            roots.iter().partition(|&&r| r < self.file_columns());
        let nothing = |wanted, selection| Fetched {
            file,
            rg,
            wanted,
            roots: Vec::new(),
            partition_roots: partition_roots.clone(),
            mask: None,
            chunks: Vec::new(),
            selection,
        };
        if wanted.is_empty() {
            return Ok(nothing(wanted, selection));
        }
        let footer = self.footer(file).await?;
        let mut roots: Vec<usize> = wanted.iter().filter_map(|&r| footer.root(r)).collect();
        roots.sort_unstable();
        roots.dedup();
        if roots.is_empty() {
            return Ok(nothing(wanted, selection));
        }
        let meta = footer.metadata.metadata();
        let mask =
            ProjectionMask::roots(meta.file_metadata().schema_descr(), roots.iter().copied());
        let ranges: Vec<Range<u64>> = meta
            .row_group(rg)
            .columns()
            .iter()
            .enumerate()
            .filter(|&(leaf, _)| mask.leaf_included(leaf))
            .map(|(_, c)| {
                let (start, len) = c.byte_range();
                start..start + len
            })
            .collect();
        // A selection's pages are fetched by its decode.
        let chunks = match selection.is_some() {
            true => Vec::new(),
            false => {
                let reader = self.reader(file);
                let fetched =
                    object_store::coalesce_ranges(&ranges, |r| reader.get_in_parts(r), COALESCE)
                        .await
                        .with_context(|| {
                            format!("file '{}' row group {rg} cannot be read", f.name)
                        })?;
                ranges.into_iter().zip(fetched).collect()
            }
        };
        Ok(Fetched {
            file,
            rg,
            wanted,
            roots,
            partition_roots,
            mask: Some(mask),
            chunks,
            selection,
        })
    }

    /// Decodes a fetched row group (CPU only, unless the decoder asks for bytes that were not
    /// fetched, which are then read), as record batches of up to 8,192 rows, in order, with
    /// the partition columns asked for after the file's own.
    pub(crate) async fn decode_row_group(&self, fetched: Fetched) -> Result<Vec<RecordBatch>> {
        self.decode_stored_or_live(fetched, true).await
    }

    /// Reads the given root columns of one row group as the file stores its rows, those the
    /// table deletes included: what a `where=` tests, by position in the file. With a
    /// selection, only the rows it picks, read through `indexed` (the file's footer with its
    /// page index): only the pages that hold them are fetched.
    pub(crate) async fn read_stored_rows(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        selection: Option<(RowSelection, &ArrowReaderMetadata)>,
    ) -> Result<RecordBatch> {
        let selection = selection.map(|(s, indexed)| (s, indexed.clone()));
        let batch = self.read_rows(file, rg, roots, false, selection).await?;
        // Decoded in the order fetch_row_group asks (the file's columns, then partition
        // columns): put back in the order asked.
        let order: Vec<usize> = (roots.iter())
            .map(|&r| {
                let name = self.schema.field(r).name();
                batch.schema().index_of(name).map_err(anyhow::Error::from)
            })
            .collect::<Result<_>>()?;
        Ok(batch.project(&order)?)
    }

    /// The footer of `file` with its page index, where the file has one: loaded with one read
    /// of the index's bytes.
    pub(crate) async fn page_indexed(&self, file: usize) -> Result<Option<ArrowReaderMetadata>> {
        let footer = self.footer(file).await?;
        let md = footer.metadata.metadata();
        let has_index = (md.row_groups().iter())
            .any(|g| g.columns().iter().any(|c| c.offset_index_range().is_some()));
        if !has_index {
            return Ok(None);
        }
        let mut reader = self.reader(file);
        let mut loader =
            parquet::file::metadata::ParquetMetaDataReader::new_with_metadata(md.as_ref().clone())
                .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
        loader.load_page_index(&mut reader).await.with_context(|| {
            format!(
                "file '{}': its page index cannot be read",
                self.files[file].name
            )
        })?;
        let md = loader.finish()?;
        Ok(Some(arrow_metadata(Arc::new(md))?))
    }

    /// [`Source::decode_row_group`], with the rows the table deletes dropped (`live`) or kept.
    async fn decode_stored_or_live(
        &self,
        fetched: Fetched,
        live: bool,
    ) -> Result<Vec<RecordBatch>> {
        let (file, rg) = (fetched.file, fetched.rg);
        let partition_roots = fetched.partition_roots.clone();
        let (wanted, roots) = (fetched.wanted.clone(), fetched.roots.clone());
        let pieces = match fetched.mask.is_some() {
            true => {
                let pieces = self.decode_columns(fetched).await?;
                match live {
                    true => self.without_deleted(file, rg, pieces).await?,
                    false => pieces,
                }
            }
            // Only partition columns: as many rows as the table keeps.
            false => {
                let rows = match live {
                    true => self.files[file].live_rg_rows()[rg] as usize,
                    false => self.files[file].rg_rows[rg] as usize,
                };
                let no_columns = Arc::new(arrow::datatypes::Schema::empty());
                let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
                vec![RecordBatch::try_new_with_options(
                    no_columns,
                    vec![],
                    &options,
                )?]
            }
        };
        let pieces = match self.table {
            Some(_) => self.as_the_table(file, pieces, &wanted, &roots).await?,
            None => pieces,
        };
        if partition_roots.is_empty() {
            return Ok(pieces);
        }
        let first = self.file_columns();
        (pieces.into_iter())
            .map(|piece| {
                let mut fields: Vec<_> = piece.schema().fields().iter().cloned().collect();
                let mut columns = piece.columns().to_vec();
                for &r in &partition_roots {
                    fields.push(self.partitions.fields[r - first].clone());
                    columns.push(self.partitions.column(file, r - first, piece.num_rows())?);
                }
                let schema = Arc::new(arrow::datatypes::Schema::new(fields));
                Ok(RecordBatch::try_new(schema, columns)?)
            })
            .collect()
    }

    /// Row group `rg` of `file` (`pieces`, its rows in order) without the rows the table
    /// deletes from it.
    async fn without_deleted(
        &self,
        file: usize,
        rg: usize,
        pieces: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        let f = &self.files[file];
        if f.deletes.is_none() {
            return Ok(pieces);
        }
        let deleted = self.deleted_rows(file).await?;
        let start: u64 = f.rg_rows[..rg].iter().sum();
        let end = start + f.rg_rows[rg];
        if deletes::count_in(deleted, start..end) == 0 {
            return Ok(pieces);
        }
        let mut at = start;
        (pieces.into_iter())
            .map(|piece| {
                let n = piece.num_rows() as u64;
                let keep: arrow::array::BooleanArray = (at..at + n)
                    .map(|row| Some(!deleted.contains(row)))
                    .collect();
                at += n;
                Ok(arrow::compute::filter_record_batch(&piece, &keep)?)
            })
            .collect()
    }

    /// The rows the table deletes from `file` (none where it has no deletion vector), loaded
    /// when first needed.
    pub(crate) async fn deleted_rows(&self, file: usize) -> Result<&Arc<roaring::RoaringTreemap>> {
        let f = &self.files[file];
        (f.deleted)
            .get_or_try_init(|| async {
                let rows = match &f.deletes {
                    None => roaring::RoaringTreemap::new(),
                    Some(dv) => {
                        let (url, root) = (&self.url, &self.root);
                        load_deletes(&self.store, url, root, dv, &self.stats).await?
                    }
                };
                Ok::<_, anyhow::Error>(Arc::new(rows))
            })
            .await
            .with_context(|| format!("file '{}'", f.name))
    }

    /// A table's file decoded, as the table's columns `wanted`: each found by name among the
    /// file's (decoded as `roots`, ascending), cast to the table's type where the file stores
    /// it otherwise, and null where the file lacks it.
    async fn as_the_table(
        &self,
        file: usize,
        pieces: Vec<RecordBatch>,
        wanted: &[usize],
        roots: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        let footer = self.footer(file).await?;
        let fields: Vec<arrow::datatypes::FieldRef> = (wanted.iter())
            .map(|&r| Arc::new(self.schema.field(r).clone().with_nullable(true)))
            .collect();
        let schema = Arc::new(Schema::new(fields.clone()));
        (pieces.into_iter())
            .map(|piece| {
                let columns = (wanted.iter().zip(&fields))
                    .map(|(&r, field)| match footer.root(r) {
                        Some(fr) => {
                            let at = roots.binary_search(&fr).expect("decoded");
                            let column = piece.column(at);
                            match column.data_type() == field.data_type() {
                                true => Ok(column.clone()),
                                false => cast_to_the_table(column, field.data_type()),
                            }
                        }
                        None => Ok(arrow::array::new_null_array(
                            field.data_type(),
                            piece.num_rows(),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let options =
                    arrow::array::RecordBatchOptions::new().with_row_count(Some(piece.num_rows()));
                Ok(RecordBatch::try_new_with_options(
                    schema.clone(),
                    columns,
                    &options,
                )?)
            })
            .collect::<Result<_>>()
            .with_context(|| format!("file '{}' as the table's columns", self.files[file].name))
    }

    /// [`Source::decode_row_group`] of the file's own columns. Where it fails as the footer
    /// says, and padding the column chunks (PARQUET-816, see `footer`) changes them, it is
    /// decoded once more that way.
    async fn decode_columns(&self, fetched: Fetched) -> Result<Vec<RecordBatch>> {
        let Fetched {
            file,
            rg,
            roots,
            mask,
            chunks,
            selection,
            ..
        } = fetched;
        let mask = mask.expect("a projection of the file's columns");
        let f = &self.files[file];
        if let Some((selection, indexed)) = selection {
            let picked = Some(selection);
            return (self.decode_with(file, rg, &roots, mask, chunks, (&indexed, picked))).await;
        }
        let footer = self.footer(file).await?;
        let first = self
            .decode_with(
                file,
                rg,
                &roots,
                mask.clone(),
                chunks.clone(),
                (&footer.metadata, None),
            )
            .await;
        let Err(e) = first else { return first };
        let padded = footer.padded.get_or_init(|| {
            let md =
                crate::source::footer::padded(footer.metadata.metadata(), f.size - footer.len)?;
            arrow_metadata(Arc::new(md)).ok()
        });
        let chunks_again = chunks.clone();
        let Some(padded) = padded else {
            return Err(self
                .naming_the_column(file, rg, &roots, chunks_again, e)
                .await);
        };
        match self
            .decode_with(file, rg, &roots, mask, chunks, (padded, None))
            .await
        {
            Ok(batch) => {
                tracing::warn!(
                    "file '{}' row group {rg}: its footer gives column chunks too short (a bug of old writers, PARQUET-816); read with the chunks padded",
                    f.name
                );
                Ok(batch)
            }
            Err(_) => Err(self
                .naming_the_column(file, rg, &roots, chunks_again, e)
                .await),
        }
    }

    /// A row group's decode error, named by the column that fails: each column is decoded
    /// alone (a decoder's panic caught) until one fails; where none does alone, the error as it
    /// was.
    async fn naming_the_column(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        chunks: Vec<(Range<u64>, Bytes)>,
        e: anyhow::Error,
    ) -> anyhow::Error {
        if roots.len() < 2 {
            return e;
        }
        let metadata = match self.footer(file).await {
            Ok(footer) => &footer.metadata,
            Err(_) => return e,
        };
        for &root in roots {
            let mask = ProjectionMask::roots(metadata.parquet_schema(), [root]);
            let one = [root];
            let alone = self.decode_with(file, rg, &one, mask, chunks.clone(), (metadata, None));
            match std::panic::AssertUnwindSafe(alone).catch_unwind().await {
                Ok(Ok(_)) => continue,
                Ok(Err(alone)) => return alone,
                Err(panic) => {
                    let column = metadata.schema().field(root).name();
                    return anyhow!(
                        "file '{}' row group {rg} column '{column}' cannot be read: a decoder panicked: {}",
                        self.files[file].name,
                        crate::panic_text(panic)
                    );
                }
            }
        }
        e
    }

    async fn decode_with(
        &self,
        file: usize,
        rg: usize,
        roots: &[usize],
        mask: ProjectionMask,
        chunks: Vec<(Range<u64>, Bytes)>,
        (metadata, selection): (&ArrowReaderMetadata, Option<RowSelection>),
    ) -> Result<Vec<RecordBatch>> {
        let f = &self.files[file];
        let what = match roots {
            [root] => format!(
                "file '{}' row group {rg} column '{}'",
                f.name,
                metadata.schema().field(*root).name()
            ),
            _ => format!("file '{}' row group {rg}", f.name),
        };
        let md = metadata.metadata();
        let chunks = match footer::pages_v2_flag_unreliable(md.file_metadata().created_by()) {
            false => chunks,
            // Compressed chunks' data pages v2, marked uncompressed by their writer (see footer).
            true => (chunks.into_iter())
                .map(|(range, bytes)| {
                    let compressed = (md.row_group(rg).columns().iter()).any(|c| {
                        let (start, len) = c.byte_range();
                        start == range.start
                            && len == range.end - range.start
                            && c.compression() != parquet::basic::Compression::UNCOMPRESSED
                    });
                    match compressed
                        .then(|| footer::pages_v2_compressed(&bytes))
                        .flatten()
                    {
                        Some(patched) => (range, Bytes::from(patched)),
                        None => (range, bytes),
                    }
                })
                .collect(),
        };
        let reader = Prefetched {
            chunks,
            inner: self.reader(file),
        };
        let rows = match &selection {
            Some(s) => s.row_count(),
            None => md.row_group(rg).num_rows() as usize,
        };
        let mut stream =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata.clone())
                .with_row_groups(vec![rg])
                .with_projection(mask)
                .with_batch_size(rows.clamp(1, 8192));
        if let Some(selection) = selection {
            stream = stream.with_row_selection(selection);
        }
        let stream = stream.build().with_context(|| what.clone())?;
        // Kept as the decoder's pieces: a row group concatenated whole would be a third copy of
        // it in memory, beside the pieces and the tensor columns transformed from them.
        let pieces: Vec<RecordBatch> = stream
            .try_collect()
            .await
            .with_context(|| format!("{what} cannot be read"))?;
        let decoded: usize = pieces.iter().map(RecordBatch::num_rows).sum();
        if decoded != rows {
            bail!(
                "file '{}' row group {rg}: {decoded} rows decoded where {rows} were asked for",
                f.name
            );
        }
        Ok(pieces)
    }
}

/// What a snapshot's source must match: its URL, where an Iceberg table named by a metadata
/// file (as catalogs hand them out) is the same table whichever of its metadata files names
/// it, its root.
fn pinned_key(u: &Url) -> String {
    let s = u.as_str().trim_end_matches('/');
    match s.ends_with(".metadata.json") {
        true => s.rsplitn(3, '/').nth(2).unwrap_or(s).to_string(),
        false => s.to_string(),
    }
}

/// Whether an object below the prefix lies in, or is, a file or directory whose name starts with
/// `_` or `.`: a writer's metadata and scratch (`_metadata`, Spark's `_temporary/`, Delta's
/// `_delta_log/` checkpoints, `.hoodie/`), never rows of the dataset, as pyarrow and Spark
/// read a directory.
fn hidden(name: &str) -> bool {
    name.split('/').any(|part| part.starts_with(['_', '.']))
}

/// The Unischema in `_common_metadata` under `prefix`, where Petastorm wrote one.
async fn read_unischema(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    stats: &Stats,
) -> Result<Option<crate::source::petastorm::Unischema>> {
    use crate::source::petastorm::{COMMON_METADATA, UNISCHEMA_KEY, parse_unischema};
    let path = prefix.clone().join(COMMON_METADATA);
    let bytes = match store.get(&path).await {
        Ok(r) => r.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => bail!("'{path}' cannot be read: {e}"),
    };
    Stats::add(&stats.c.remote_requests, 1);
    Stats::add(&stats.c.remote_bytes, bytes.len() as u64);
    let footer = whole_file_footer(&bytes).with_context(|| format!("'{path}'"))?;
    let metadata = &footer[..footer.len() - 8];
    let Some(pickle) = crate::source::footer::key_value(metadata, UNISCHEMA_KEY)
        .with_context(|| format!("'{path}' is not a readable Parquet metadata file"))?
    else {
        return Ok(None);
    };
    let unischema = parse_unischema(&pickle)
        .with_context(|| format!("the Petastorm Unischema in '{path}' cannot be read"))?;
    Ok(Some(unischema))
}

/// The footer (metadata, length, magic) of a whole Parquet file held in memory, such as a
/// metadata file (`_common_metadata`, `_metadata`).
fn whole_file_footer(bytes: &[u8]) -> Result<&[u8]> {
    let n = bytes.len();
    if n < 12 || &bytes[n - 4..] != b"PAR1" {
        bail!("not a Parquet metadata file");
    }
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    match n.checked_sub(8 + len) {
        Some(start) if start >= 4 => Ok(&bytes[start..]),
        _ => bail!("its footer is longer than the file"),
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

/// The file name of a Parquet summary file: a source naming one is the dataset it lists.
const SUMMARY: &str = "_metadata";

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

/// A file's column cast to the table's type. Never a value turned into null: a lossy cast is an
/// error. A timestamp the file stores without a time zone, at any depth, is the instant the
/// table's type says (a Delta `timestamp` is one in UTC, whatever the writer flagged): cast to the
/// zone "UTC" as to the offset "+00:00" (the same instants), since casting it to a named zone
/// needs the zone database, which this build of arrow leaves out.
fn cast_to_the_table(
    column: &arrow::array::ArrayRef,
    to: &arrow::datatypes::DataType,
) -> Result<arrow::array::ArrayRef> {
    let options = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let by_offset = utc_as_offset(to);
    if by_offset == *to {
        return Ok(arrow::compute::cast_with_options(column, to, &options)?);
    }
    // Between zones a cast relabels: no zone is looked up.
    let column = arrow::compute::cast_with_options(column, &by_offset, &options)?;
    Ok(arrow::compute::cast_with_options(&column, to, &options)?)
}

/// `t` with every timestamp in the zone "UTC" in the offset "+00:00" instead.
fn utc_as_offset(t: &arrow::datatypes::DataType) -> arrow::datatypes::DataType {
    use arrow::datatypes::{DataType, Field};
    let field = |f: &Field| Arc::new(f.clone().with_data_type(utc_as_offset(f.data_type())));
    match t {
        DataType::Timestamp(unit, Some(tz)) if tz.as_ref() == "UTC" => {
            DataType::Timestamp(*unit, Some("+00:00".into()))
        }
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(|f| field(f)).collect()),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        other => other.clone(),
    }
}

/// An object as listed, before its footer is read.
/// The row positions deletion vector `dv` of a table at `root` (`url`) deletes.
async fn load_deletes(
    store: &Arc<dyn ObjectStore>,
    url: &Url,
    root: &Path,
    dv: &deletes::DeletionVector,
    stats: &Stats,
) -> Result<roaring::RoaringTreemap> {
    let (path, absolute, offset) = match dv.location()? {
        deletes::Location::Inline(bytes) => return deletes::bitmap(&bytes),
        deletes::Location::File {
            path,
            absolute,
            offset,
        } => (path, absolute, offset),
    };
    let location = match absolute {
        false => child(root, &path)?,
        // An absolute path names the file by URL: one under the table's own.
        true => {
            let base = url.as_str().trim_end_matches('/');
            let rest = (path.strip_prefix(base))
                .and_then(|r| r.strip_prefix('/'))
                .ok_or_else(|| anyhow!("its deletion vector '{path}' is outside the table"))?;
            let rest = percent_encoding::percent_decode_str(rest).decode_utf8_lossy();
            child(root, &rest)?
        }
    };
    let range = offset..offset + deletes::stored_len(dv);
    let bytes = store
        .get_range(&location, range)
        .await
        .with_context(|| format!("its deletion vector '{location}' cannot be read"))?;
    Stats::add(&stats.c.remote_requests, 1);
    Stats::add(&stats.c.remote_bytes, bytes.len() as u64);
    deletes::stored_bitmap(&bytes, dv).with_context(|| format!("deletion vector '{location}'"))
}

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
    }
}

fn row_group_rows(md: &ParquetMetaData) -> Vec<u64> {
    md.row_groups()
        .iter()
        .map(|rg| rg.num_rows() as u64)
        .collect()
}

/// Bytes as lowercase hex digits.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How much of a file's end is fetched first: most footers fit, so one request does.
const FOOTER_GUESS: u64 = 64 << 10;

/// A file's Parquet metadata and its footer's length: from the footer kept in `kept` (a
/// directory) when there is one, else fetched (its suffix: `known_len` bytes where the length
/// is known, else in one request when the footer fits the guess) and kept for the next mount.
async fn load_metadata(
    reader: &ObjectReader,
    kept: Option<&std::path::Path>,
    id: &[u8; 32],
    known_len: u64,
) -> Result<(ArrowReaderMetadata, u64)> {
    let kept = kept.map(|dir| dir.join(format!("{}.footer", hex(&id[..16]))));
    let footer = match kept.as_deref().and_then(|p| kept::read_blob(p, id)) {
        Some(b) => Bytes::from(b),
        None => {
            let footer = fetch_footer(reader, known_len).await?;
            if let Some(p) = &kept
                && let Err(e) = kept::write_blob(p, id, &footer)
            {
                tracing::warn!("cannot keep the footer of '{}': {e:#}", reader.location);
            }
            footer
        }
    };
    Ok((decode_footer(&footer)?, footer.len() as u64))
}

/// Decodes a footer (metadata, length, magic) into the Arrow view of the file. Malformed input
/// is an error, never a panic, even where the Parquet decoder would panic.
pub(crate) fn decode_footer(footer: &[u8]) -> Result<ArrowReaderMetadata> {
    if footer.len() < 8 {
        bail!("a {}-byte footer is too short", footer.len());
    }
    let metadata = footer[..footer.len() - 8].to_vec();
    let decoded = crate::catch_panic(move || -> Result<ArrowReaderMetadata> {
        let metadata = crate::source::footer::decode(&metadata)?;
        arrow_metadata(Arc::new(metadata))
    });
    let decoded = decoded.unwrap_or_else(|panic| Err(anyhow!("the footer is malformed ({panic})")));
    // A refusal is one line: a mangled footer's names may hold line breaks the decoder quotes.
    decoded.map_err(|e| {
        let line = crate::describe(&e)
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        anyhow!("{line}")
    })
}

/// The Arrow view of a file, as pyarrow reads it. INT96 timestamps are nanoseconds with no
/// time zone, whatever unit a stored Arrow schema names: pyarrow ignores that schema for them
/// (values outside 1677-2262 wrap), where the parquet crate follows it.
fn arrow_metadata(md: Arc<ParquetMetaData>) -> Result<ArrowReaderMetadata> {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let plain = ArrowReaderMetadata::try_new(md.clone(), ArrowReaderOptions::new())?;
    let descr = md.file_metadata().schema_descr();
    let int96: Vec<usize> = (0..descr.num_columns())
        .map(|i| descr.column(i))
        .filter(|c| c.physical_type() == parquet::basic::Type::INT96 && c.path().parts().len() == 1)
        .filter_map(|c| plain.schema().index_of(c.name()).ok())
        .collect();
    let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
    let schema = plain.schema();
    let differs = |i: &usize| *schema.field(*i).data_type() != ns;
    if !int96.iter().any(differs) {
        return Ok(plain);
    }
    let fields: Vec<Field> = (schema.fields().iter().enumerate())
        .map(|(i, f)| match int96.contains(&i) {
            true => f.as_ref().clone().with_data_type(ns.clone()),
            false => f.as_ref().clone(),
        })
        .collect();
    let schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    let options = ArrowReaderOptions::new().with_schema(Arc::new(schema));
    Ok(ArrowReaderMetadata::try_new(md, options)?)
}

/// The footer of a Parquet file: its metadata, length and magic (the file's last bytes).
async fn fetch_footer(reader: &ObjectReader, known_len: u64) -> Result<Bytes> {
    let size = reader.size;
    if size < 12 {
        bail!("{size} bytes is too small for Parquet");
    }
    let guess = match known_len {
        0 => FOOTER_GUESS,
        len => len,
    }
    .min(size);
    let tail = reader.get(size - guess..size).await?;
    let end = &tail[tail.len() - 8..];
    match &end[4..] {
        b"PAR1" => {}
        b"PARE" => bail!("encrypted Parquet is not supported"),
        _ => bail!("no Parquet magic at the end of the file"),
    }
    let need = u32::from_le_bytes(end[..4].try_into().unwrap()) as u64 + 8;
    if need > size {
        bail!("the footer claims {need} bytes of a {size}-byte file");
    }
    if need <= guess {
        return Ok(tail.slice((guess - need) as usize..));
    }
    reader.get(size - need..size).await
}

/// An [`AsyncFileReader`] over one object of an object store, whose size is known so that the
/// footer is read without probing.
struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    location: Path,
    size: u64,
    /// The version every read is pinned to (`if-match`), when the store reports one.
    e_tag: Option<String>,
    /// The modification time listed, which pins reads where the store gives no ETag.
    modified: String,
    stats: Arc<Stats>,
    /// Since when the object must not have changed, for the error when it has.
    since: &'static str,
}

/// Ranges closer than this are fetched as one request; farther apart, the bytes between them
/// (other columns) are not worth fetching.
const COALESCE: u64 = 4 << 10;

/// Bytes of one ranged GET at most: one connection to an object store serves far less than a
/// host's bandwidth (about 100 MB/s from S3), so a larger range (a row group of a gigabyte has
/// column chunks of hundreds of megabytes) is fetched as parts, several at once.
const PART: u64 = 16 << 20;

/// Parts of one range fetched at once.
const PARTS_AT_ONCE: usize = 8;

impl ObjectReader {
    fn new(
        store: Arc<dyn ObjectStore>,
        file: &SourceFile,
        stats: Arc<Stats>,
        since: &'static str,
    ) -> Self {
        ObjectReader {
            store,
            location: file.location.clone(),
            size: file.size,
            e_tag: file.e_tag.clone(),
            modified: file.modified.clone(),
            stats,
            since,
        }
    }

    /// `range`: one GET, or parts of [`PART`] bytes fetched [`PARTS_AT_ONCE`] at a time.
    async fn get_in_parts(&self, range: Range<u64>) -> Result<Bytes> {
        let len = range.end - range.start;
        if len <= PART {
            return self.get(range).await;
        }
        let parts = (range.start..range.end)
            .step_by(PART as usize)
            .map(|at| at..(at + PART).min(range.end));
        let got: Vec<Bytes> = futures::stream::iter(parts)
            .map(|part| self.get(part))
            .buffered(PARTS_AT_ONCE)
            .try_collect()
            .await?;
        let mut whole = bytes::BytesMut::with_capacity(len as usize);
        for part in got {
            whole.extend_from_slice(&part);
        }
        Ok(whole.freeze())
    }

    /// One ranged GET, pinned to the object's version: an object replaced under a live mount
    /// fails the read rather than mixing two versions into a batch.
    async fn get(&self, range: Range<u64>) -> Result<Bytes> {
        Stats::add(&self.stats.c.remote_requests, 1);
        Stats::add(&self.stats.c.remote_bytes, range.end - range.start);
        let options = GetOptions {
            if_match: self.e_tag.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let result = async {
            let reply = self.store.get_opts(&self.location, options).await?;
            // Some servers ignore `if-match` (fake-gcs-server does): the reply's own version
            // and size are checked too, so a replaced object is never read at old offsets.
            // Where the store gives no ETag, the modification time is the version.
            let etag = |t: &str| t.trim_start_matches("W/").trim_matches('"').to_string();
            let replaced = match (&self.e_tag, &reply.meta.e_tag) {
                (Some(pinned), Some(now)) => etag(pinned) != etag(now),
                (None, _) => reply.meta.last_modified.to_string() != self.modified,
                _ => false,
            } || reply.meta.size != self.size;
            if replaced {
                return Err(object_store::Error::Precondition {
                    path: self.location.to_string(),
                    source: "the object's version or size changed".into(),
                });
            }
            reply.bytes().await
        }
        .await;
        let changed = |how: String| {
            anyhow::Error::new(crate::error::ObjectChanged {
                location: self.location.to_string(),
                since: self.since,
                how,
            })
        };
        let bytes = result.map_err(|e| match e {
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
                let version = self.e_tag.as_deref().unwrap_or("?");
                changed(format!("it is no longer version {version}"))
            }
            object_store::Error::NotFound { .. } => changed("it no longer exists".into()),
            e => anyhow!("object '{}': {e}", self.location),
        })?;
        if bytes.len() as u64 != range.end - range.start {
            bail!(
                "object '{}': {} bytes at {} instead of {}",
                self.location,
                bytes.len(),
                range.start,
                range.end - range.start
            );
        }
        Ok(bytes)
    }
}

/// One row group's column chunks, fetched and not yet decoded.
pub(crate) struct Fetched {
    file: usize,
    rg: usize,
    /// The dataset's columns asked for that files store, the file's root columns they are
    /// (ascending; the same where the files' columns are the dataset's), and the partition
    /// columns asked for.
    wanted: Vec<usize>,
    roots: Vec<usize>,
    partition_roots: Vec<usize>,
    /// The projection of `roots`; none where only partition columns are asked for.
    mask: Option<ProjectionMask>,
    chunks: Vec<(Range<u64>, Bytes)>,
    /// Only these rows, read through the page index of this view of the file: the decoder
    /// fetches the pages that hold them and no others.
    selection: Option<(RowSelection, ArrowReaderMetadata)>,
}

/// An [`AsyncFileReader`] over fetched ranges of an object: what they hold is answered from
/// memory, anything else read from the object.
struct Prefetched {
    chunks: Vec<(Range<u64>, Bytes)>,
    inner: ObjectReader,
}

impl Prefetched {
    fn held(&self, r: &Range<u64>) -> Option<Bytes> {
        self.chunks
            .iter()
            .find(|(c, _)| c.start <= r.start && r.end <= c.end)
            .map(|(c, b)| b.slice((r.start - c.start) as usize..(r.end - c.start) as usize))
    }
}

impl AsyncFileReader for Prefetched {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        match self.held(&range) {
            Some(b) => futures::future::ready(Ok(b)).boxed(),
            None => self.inner.get_bytes(range),
        }
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        self.inner.get_metadata(options)
    }
}

fn parquet_err(e: anyhow::Error) -> ParquetError {
    ParquetError::External(e.into())
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.get(range).await.map_err(parquet_err) }.boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let this = &*self;
            object_store::coalesce_ranges(&ranges, |r| this.get(r), COALESCE)
                .await
                .map_err(parquet_err)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .with_page_index_policy(PageIndexPolicy::Skip)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn naive_timestamps_cast_to_utc_at_any_depth_keep_their_instants() {
        use arrow::array::{Array, AsArray, ListArray, TimestampNanosecondArray};
        use arrow::datatypes::{DataType, Field, TimeUnit, TimestampMicrosecondType as Us};
        let naive: arrow::array::ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![
            1_000, 2_000_000, -3_000,
        ]));
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let flat = cast_to_the_table(&naive, &utc).unwrap();
        assert_eq!(flat.data_type(), &utc);
        assert_eq!(flat.as_primitive::<Us>().values(), &[1, 2_000, -3]);
        let list: arrow::array::ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("element", naive.data_type().clone(), true)),
            arrow::buffer::OffsetBuffer::from_lengths([2, 1]),
            naive,
            None,
        ));
        let to = DataType::List(Arc::new(Field::new("element", utc.clone(), true)));
        let nested = cast_to_the_table(&list, &to).unwrap();
        assert_eq!(nested.data_type(), &to);
        let values = nested.as_list::<i32>().values().clone();
        assert_eq!(values.as_primitive::<Us>().values(), &[1, 2_000, -3]);
    }

    #[test]
    fn http_credentials_are_one_sensitive_header() {
        let opts = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let given = opts(&[
            ("http_username", "ada"),
            ("http_password", "s3cr3t"),
            ("client_timeout", "5s"),
        ]);
        let header = http_credentials(&given).unwrap().unwrap();
        // base64("ada:s3cr3t")
        assert_eq!(header.to_str().unwrap(), "Basic YWRhOnMzY3IzdA==");
        assert!(header.is_sensitive());
        let bearer = opts(&[("http_bearer_token", "tok")]);
        assert_eq!(http_credentials(&bearer).unwrap().unwrap(), "Bearer tok");
        let both = opts(&[("http_username", "a"), ("http_bearer_token", "t")]);
        assert!(http_credentials(&both).is_err());
        let half = opts(&[("http_password", "p")]);
        assert!(http_credentials(&half).is_err());
    }

    /// The HTTP client is built without a TLS provider of its own: building an https store
    /// must find ring installed, and a request must fail as a request (nothing listens on
    /// port 9 here), not panic.
    #[tokio::test]
    async fn https_stores_build_with_the_ring_provider() {
        for url in ["https://127.0.0.1:9/data/", "s3://bucket/data/"] {
            let url = Url::parse(url).unwrap();
            let options = match url.scheme() {
                "s3" => vec![
                    (
                        "aws_endpoint".to_string(),
                        "https://127.0.0.1:9".to_string(),
                    ),
                    ("aws_region".to_string(), "us-east-1".to_string()),
                    ("aws_skip_signature".to_string(), "true".to_string()),
                ],
                _ => vec![],
            };
            let (store, prefix) = open_store(&url, &options).expect("the store builds");
            let listed = tokio::time::timeout(
                std::time::Duration::from_secs(120),
                store.list_with_delimiter(Some(&prefix)),
            )
            .await
            .expect("the request ends");
            assert!(listed.is_err(), "{url}: nothing listens there");
        }
    }

    /// The footer of a small real file, written by the parquet crate.
    fn real_footer() -> Vec<u8> {
        use arrow::array::{Float32Array, Int64Array, RecordBatch};
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(0..100)) as _),
            (
                "x",
                Arc::new(Float32Array::from_iter_values((0..100).map(|i| i as f32))) as _,
            ),
        ])
        .unwrap();
        let mut buf = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let len =
            u32::from_le_bytes(buf[buf.len() - 8..buf.len() - 4].try_into().unwrap()) as usize;
        buf[buf.len() - 8 - len..].to_vec()
    }

    #[test]
    fn a_real_footer_decodes() {
        let md = decode_footer(&real_footer()).unwrap();
        assert_eq!(md.schema().fields().len(), 2);
        assert_eq!(md.metadata().file_metadata().num_rows(), 100);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_footers_are_errors_not_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            // Random bytes never hold every field a Parquet footer requires.
            prop_assert!(decode_footer(&bytes).is_err());
        }

        #[test]
        fn mutated_footers_never_panic(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut footer = real_footer();
            for (at, byte) in flips {
                let i = at.index(footer.len() - 8);
                footer[i] = byte;
            }
            let len = cut.index(footer.len());
            for bytes in [&footer[..], &footer[len..]] {
                let started = std::time::Instant::now();
                // Decoded, or refused in one line: a panic of the Parquet decoder included.
                if let Err(e) = decode_footer(bytes) {
                    prop_assert!(!format!("{e:#}").contains('\n'), "{e:#}");
                }
                // Our own readers of footers never panic, whatever the bytes.
                let meta = &bytes[..bytes.len().saturating_sub(8)];
                let ours = std::panic::catch_unwind(|| {
                    let _ = crate::source::footer::key_value(meta, "k");
                });
                prop_assert!(ours.is_ok(), "reading a footer's key-value metadata panicked");
                prop_assert!(started.elapsed() < std::time::Duration::from_secs(5));
            }
        }
    }
}
