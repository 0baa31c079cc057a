//! The table kind of a Parquet summary file (`…/_metadata`, as Spark and Dask write it): the
//! files it lists, each with the row groups it gives, in its order.

use crate::source::catalog::{Catalog, Facts, Summary};
use crate::source::partition::Partitions;
use crate::source::petastorm::read_unischema;
use crate::source::{
    Origin, Source, Where, arrow_metadata, decode_footer, listing, object_of, parent,
    whole_file_footer,
};
use crate::stats::Stats;
use anyhow::{Result, anyhow, bail};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::file::metadata::ParquetMetaDataBuilder;
use std::sync::Arc;
use url::Url;

/// The file name of a Parquet summary file: a source naming one is the dataset it lists.
pub(crate) const SUMMARY: &str = "_metadata";

/// The dataset a Parquet summary file lists, as `pyarrow.dataset.parquet_dataset` reads it:
/// its files in the order the summary first names them, each file's row groups in the
/// summary's order. The summary is read whole (one GET) and the directory listed (for each
/// file's size and version); each file's own footer is fetched when a read first needs it,
/// and checked against the summary.
pub(super) async fn open(
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
    let listed: std::collections::HashMap<String, ObjectMeta> = listing::all(&store, &root, source)
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
