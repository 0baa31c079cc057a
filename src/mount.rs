//! Opening a dataset: what `tensorfs mount`, `inspect` and `snapshot` share, the checks made
//! before anything is mounted, and the wiring of the served filesystem
//! ([`Dataset::filesystem`]). The daemon's life around it is `daemon`'s.

use crate::cache::DiskCache;
use crate::model::partitions::PlanFile;
use crate::model::plan::{Orders, Plan, Shuffle};
use crate::options::Options;
use crate::read::follow::prefetch::Prefetcher;
use crate::read::layout::Layout;
use crate::read::produce::ahead::Ahead;
use crate::read::produce::builder::{Builder, Limits, Parts};
use crate::read::produce::columns::Placement;
use crate::read::produce::eviction::Eviction;
use crate::read::produce::materialize::Materializer;
use crate::read::readers::Readers;
use crate::requests::fs::{Fs, Tree};
use crate::requests::serve::Serve;
use crate::source::Source;
use crate::source::view::{self, View};
use crate::stats::Stats;
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use std::sync::Arc;

pub use crate::kernel::mounting::check_mountpoint;

/// `where=`, parsed (its syntax refused in one line before anything is read).
fn where_filter(opts: &Options) -> Result<Option<crate::source::filter::Filter>> {
    (opts.selection.as_deref())
        .map(crate::source::filter::Filter::parse)
        .transpose()
}

/// The user's transform (`transform=`), started and tried on the source's first row group that
/// holds rows.
async fn start_transform(
    source: &Source,
    opts: &Options,
) -> Result<Option<Arc<crate::udf::Applied>>> {
    let Some(spec) = opts.udf() else {
        return Ok(None);
    };
    let udf = tokio::task::block_in_place(|| crate::udf::Udf::start(spec))?;
    let input = crate::udf::Applied::input_columns(&udf, &source.schema)?;
    let first = (source.files.iter().enumerate())
        .find_map(|(f, file)| Some((f, file.live_rg_rows().iter().position(|&r| r > 0)?)));
    let (batch, at) = match first {
        Some((f, rg)) => (
            source.read_row_group(f, rg, &input).await?,
            format!("file '{}' row group {rg}", source.files[f].name),
        ),
        None => (
            arrow::array::RecordBatch::new_empty(Arc::new(source.schema.project(&input)?)),
            "an empty dataset".to_string(),
        ),
    };
    let trial = || crate::udf::Applied::trial(udf, input, batch, &at);
    Ok(Some(Arc::new(tokio::task::block_in_place(trial)?)))
}

/// Opens one source (listed, or as `snapshot=` pinned it) under `opts`.
async fn open_source(
    source: &str,
    opts: &Options,
    footers: Option<&Path>,
    stats: Arc<Stats>,
    given: Option<crate::source::catalog::Pinned>,
) -> Result<Source> {
    let filter = where_filter(opts)?;
    // A table a REST catalog names is read at the metadata file the catalog gives.
    let name = source;
    let (located, store) = crate::source::iceberg_rest::resolve(name, &opts.store).await?;
    let source = located.as_str();
    let mut source = match &opts.snapshot {
        Some(at) => {
            // A mixture's snapshot holds its sources' (read and given here).
            let pinned = match given {
                Some(pinned) => pinned,
                None => crate::source::snapshot::read(at, &store).await?,
            };
            // The rows a snapshot keeps are pinned with it: a mount may name its where=,
            // never another.
            if let Some(f) = &filter
                && pinned.catalog.selection.as_deref() != Some(f.text.as_str())
            {
                let pinned_what = match &pinned.catalog.selection {
                    Some(p) => format!("where={p}"),
                    None => "every row (no where=)".to_string(),
                };
                bail!(
                    "where={} disagrees with snapshot '{at}', which pins {pinned_what}: leave where= out, or take a snapshot with it",
                    f.text
                );
            }
            let pins = pinned.catalog.table.map(|v| v.number);
            if let Some(v) = opts.version
                && (pins.map(crate::options::AsOf::Number) != Some(v))
            {
                let pinned_what = match pins {
                    Some(p) => format!("version {p}"),
                    None => "no table version".to_string(),
                };
                bail!(
                    "version={v} disagrees with snapshot '{at}', which pins {pinned_what}: leave version= out"
                );
            }
            Source::pinned(source, &store, pinned, footers, stats.clone())?
        }
        None => {
            let version = opts.version;
            Source::open(
                source,
                &store,
                footers,
                stats.clone(),
                version,
                filter.as_ref(),
            )
            .await?
        }
    };
    source.display = name.to_string();
    Ok(source)
}

/// A dataset opened under a set of options: what a mount would show.
pub struct Dataset {
    /// The source; a mixture's first.
    pub source: Arc<Source>,
    /// The source's view: the tensors every source of a mixture serves.
    pub view: Arc<View>,
    /// A mixture's sources (a `.toml` SOURCE), `source` first.
    pub mixture: Option<Mixture>,
    pub plan: Plan,
    pub stats: Arc<Stats>,
    /// The user's transform (`transform=`), tried on the first row group.
    pub udf: Option<Arc<crate::udf::Applied>>,
}

/// The sources of a mixture, in the `.toml`'s order.
pub struct Mixture {
    /// The `.toml` as named.
    pub path: String,
    pub members: Vec<Member>,
    /// The mixture's identity: its sources' fingerprints and sizes.
    fingerprint: String,
}

/// One source of a mixture.
pub struct Member {
    pub spec: crate::source::mixture::SourceSpec,
    pub source: Arc<Source>,
    pub view: Arc<View>,
    /// Its rows an epoch draws.
    pub drawn: u64,
}

impl Member {
    /// Its rows (those its `where` keeps).
    pub fn rows(&self) -> u64 {
        self.source.files.iter().map(|f| f.live_rows()).sum()
    }
}

/// The rows each row group of each of `source`'s files holds: a table's deleted rows, and
/// those a `where=` drops, are none of them.
fn live_rows(source: &Source) -> Vec<Vec<u64>> {
    source.files.iter().map(|f| f.live_rg_rows()).collect()
}

/// `source`'s files as the plan sees them, with their rows `live` ([`live_rows`]).
fn plan_files<'a>(source: &'a Source, live: &'a [Vec<u64>]) -> Vec<PlanFile<'a>> {
    (source.files.iter().zip(live))
        .map(|(f, rg_rows)| PlanFile {
            key: &f.name,
            rg_rows,
        })
        .collect()
}

/// Why a mixture's source cannot join it: the first tensor it serves otherwise than the first
/// source, or in another place (the batch files hold the tensors in one order).
fn tensors_differ(first: &View, other: &View) -> Option<String> {
    let say = |t: &crate::source::view::Tensor| format!("'{}' ({} {:?})", t.name, t.dtype, t.inner);
    for (i, t) in first.tensors.iter().enumerate() {
        let same = |o: &&crate::source::view::Tensor| {
            o.name == t.name && o.dtype == t.dtype && o.inner == t.inner && o.part == t.part
        };
        match other.tensors.get(i) {
            Some(o) if same(&o) => continue,
            Some(o) if o.name == t.name => {
                return Some(format!(
                    "serves tensor {}, where source 1 serves {}",
                    say(o),
                    say(t)
                ));
            }
            _ => {}
        }
        return Some(match other.tensors.iter().find(|o| o.name == t.name) {
            Some(_) => format!(
                "serves tensor '{}' in another place than source 1 does: give both one order with columns=",
                t.name
            ),
            None => format!("serves no tensor '{}', which source 1 serves", t.name),
        });
    }
    (other.tensors.get(first.tensors.len()))
        .map(|o| format!("serves tensor '{}', which source 1 does not", o.name))
}

impl Dataset {
    /// Opens the source (listed, or as `snapshot=` pinned it) and builds the view. A view with
    /// problems is returned as it is, so that `inspect` can show them; [`Dataset::check`] turns
    /// them into the refusal. `footers`: where footers are kept between mounts (none for
    /// `inspect`).
    pub async fn open(source: &str, opts: &Options, footers: Option<&Path>) -> Result<Dataset> {
        if crate::source::mixture::names_one(source) {
            return Dataset::mixed(source, opts, footers).await;
        }
        if let Some(n) = opts.epoch_rows {
            bail!(
                "epoch_rows={n} sizes the epochs of a mixture of sources (a .toml SOURCE), and '{source}' is one source: leave epoch_rows= out"
            );
        }
        let stats = Arc::new(Stats::default());
        let source = open_source(source, opts, footers, stats.clone(), None).await?;
        Dataset::over(Arc::new(source), opts, stats).await
    }

    /// A mixture: each source of the `.toml` at `path` opened under `opts` (its own `where`
    /// joining the mount's), checked to serve the same tensors, and drawn as sized.
    async fn mixed(path: &str, opts: &Options, footers: Option<&Path>) -> Result<Dataset> {
        let specs = crate::source::mixture::read(path)?;
        // A snapshot of the whole mixture pins every source.
        let whole = match &opts.snapshot {
            Some(at) => {
                let bytes = crate::source::snapshot::read_bytes(at, &opts.store).await?;
                let pins = crate::source::snapshot::decode_mixture(&bytes, at)?;
                let pinned: Vec<&str> = pins.iter().map(|(url, _)| url.as_str()).collect();
                let listed: Vec<&str> = specs.iter().map(|s| s.url.as_str()).collect();
                if pinned != listed {
                    bail!(
                        "snapshot '{at}' pins the mixture of {pinned:?}, and '{path}' lists {listed:?}: mount it with the .toml it was taken of"
                    );
                }
                Some((at, pins))
            }
            None => None,
        };
        let stats = Arc::new(Stats::default());
        let mut members: Vec<Member> = Vec::new();
        // The transform, tried on the first source's rows, turns every source's.
        let mut udf: Option<Arc<crate::udf::Applied>> = None;
        for (i, spec) in specs.into_iter().enumerate() {
            let mut own = opts.clone();
            own.selection = match (&opts.selection, &spec.selection) {
                (Some(a), Some(b)) => Some(format!("({a}) and ({b})")),
                (a, b) => a.clone().or(b.clone()),
            };
            own.version = spec.version.or(opts.version);
            own.snapshot = spec.snapshot.clone();
            let which = format!("mixture '{path}' source {} ('{}')", i + 1, spec.url);
            let mut given = None;
            if let Some((at, pins)) = &whole {
                if spec.snapshot.is_some() {
                    bail!(
                        "{which} names a snapshot of its own, and snapshot='{at}' pins the whole mixture: give one of them"
                    );
                }
                let label = format!("{at} (source {})", i + 1);
                given = Some(crate::source::snapshot::decode(&pins[i].1, &label)?);
                own.snapshot = Some(label);
                // The snapshot pins each source's version.
                own.version = None;
            }
            let source = open_source(&spec.location, &own, footers, stats.clone(), given)
                .await
                .map_err(|e| anyhow!("{which}: {e:#}"))?;
            let source = Arc::new(source);
            if members.is_empty() {
                udf = start_transform(&source, &own).await?;
            }
            if let Some(a) = &udf {
                // Its columns must be there in every source.
                crate::udf::Applied::input_columns(&a.udf, &source.schema)
                    .map_err(|e| anyhow!("{which}: {e}"))?;
            }
            let view = Arc::new(view::build_with(&source, &own, udf.as_deref()).await?);
            if let Some(line) = view.refusal("`tensorfs inspect` of that source lists them") {
                bail!("{which}: {line}");
            }
            if let Some(first) = members.first()
                && let Some(why) = tensors_differ(&first.view, &view)
            {
                bail!("{which} {why}");
            }
            members.push(Member {
                spec,
                source,
                view,
                drawn: 0,
            });
        }
        let rows: Vec<u64> = members.iter().map(Member::rows).collect();
        let sizes: Vec<_> = members.iter().map(|m| m.spec.size).collect();
        let drawn = crate::model::mix::drawn(&rows, &sizes, opts.epoch_rows)
            .map_err(|e| anyhow!("mixture '{path}': {e}"))?;
        for (m, n) in members.iter_mut().zip(drawn) {
            m.drawn = n;
        }
        let live: Vec<Vec<Vec<u64>>> = members.iter().map(|m| live_rows(&m.source)).collect();
        let sources: Vec<(Vec<PlanFile>, u64)> = (members.iter().zip(&live))
            .map(|(m, live)| (plan_files(&m.source, live), m.drawn))
            .collect();
        let plan = Plan::mixed(&sources, opts.order());
        let identity: Vec<String> = (members.iter())
            .map(|m| format!("{} {}", m.source.fingerprint(), m.spec.size))
            .collect();
        let refs: Vec<&[u8]> = identity.iter().map(|i| i.as_bytes()).collect();
        // 64 hex digits, as a source's: what fingerprint= takes.
        let fingerprint = crate::source::hex(&crate::model::kept::identity(&refs));
        if let Some(want) = &opts.fingerprint
            && *want != fingerprint
        {
            bail!("mixture '{path}' is dataset {fingerprint}, not {want} (fingerprint=)");
        }
        Ok(Dataset {
            source: members[0].source.clone(),
            view: members[0].view.clone(),
            mixture: Some(Mixture {
                path: path.to_string(),
                members,
                fingerprint,
            }),
            plan,
            stats,
            udf,
        })
    }

    /// Identifies the dataset's content: the source's fingerprint, or the mixture's.
    pub fn fingerprint(&self) -> &str {
        match &self.mixture {
            Some(m) => &m.fingerprint,
            None => self.source.fingerprint(),
        }
    }

    /// Every source the mount reads, with its view: the one, or a mixture's in order.
    pub(crate) fn sources(&self) -> Vec<(Arc<Source>, Arc<View>)> {
        match &self.mixture {
            Some(m) => (m.members.iter())
                .map(|m| (m.source.clone(), m.view.clone()))
                .collect(),
            None => vec![(self.source.clone(), self.view.clone())],
        }
    }

    /// The dataset of an opened source (its `stats` are the source's) under `opts`.
    pub async fn over(source: Arc<Source>, opts: &Options, stats: Arc<Stats>) -> Result<Dataset> {
        if let Some(want) = &opts.fingerprint {
            crate::source::snapshot::check_fingerprint(&source, want, &opts.cache_dir)?;
        }
        let udf = start_transform(&source, opts).await?;
        let view = Arc::new(view::build_with(&source, opts, udf.as_deref()).await?);
        let live = live_rows(&source);
        let plan = Plan::new(&plan_files(&source, &live), opts.order());
        Ok(Dataset {
            source,
            view,
            mixture: None,
            plan,
            stats,
            udf,
        })
    }

    pub fn check(&self) -> Result<()> {
        match self.view.refusal("`tensorfs inspect` lists them") {
            Some(line) => Err(anyhow!(line)),
            None => Ok(()),
        }
    }

    pub fn dataset_json(&self, opts: &Options) -> serde_json::Value {
        let mut json = view::dataset_json(&self.source, &self.view, &self.plan, opts);
        if let Some(a) = &self.udf {
            json["transform"] = a.json();
        }
        json["epoch_rows"] = serde_json::json!(self.plan.drawn_rows());
        if let Some(m) = &self.mixture {
            // The first source's own facts give way to the mixture's.
            json["source"] = serde_json::json!(m.path);
            json["fingerprint"] = serde_json::json!(m.fingerprint);
            json["origin"] = serde_json::json!({"kind": "mixture"});
            json["where"] = serde_json::Value::Null;
            json["petastorm"] = serde_json::Value::Null;
            let files: Vec<serde_json::Value> = (m.members.iter())
                .flat_map(|member| view::files_json(&member.source))
                .collect();
            json["files"] = serde_json::json!(files);
            json["mixture"] = (m.members.iter())
                .map(|member| {
                    let s = &member.source;
                    serde_json::json!({
                        "url": member.spec.url,
                        "size": member.spec.size.to_string(),
                        "rows": member.rows(),
                        "drawn": member.drawn,
                        "fingerprint": s.fingerprint(),
                        "where": s.selected.as_ref().map(|w| &w.text),
                        "version": s.table.map(|v| v.number),
                        "origin": view::origin_json(s),
                    })
                })
                .collect();
        }
        json
    }

    /// `shuffle=global` gathers every batch from every row group's columns of its partition, so
    /// all of them must fit the local cache, with room for the batch files kept ready ahead: a
    /// mount where they cannot is refused. `shuffle=block` gathers from a block of each
    /// partition at a time and decodes the next one ahead: where two blocks of every partition a
    /// host reads do not fit, it is served (row groups decoded again where the cache cannot
    /// keep them), with a warning. With `world_size=W` dividing `partitions=P`, a host reading
    /// one rank's view needs only that rank's partitions: the largest such share is what must
    /// fit.
    pub(crate) fn check_cache_room(&self, opts: &Options, capacity: u64) -> Result<()> {
        let wide = opts.shuffle;
        if !wide.mixes_wide() {
            return Ok(());
        }
        let plan = &self.plan;
        let row: u64 = self.view.tensors.iter().map(|t| t.row_bytes() as u64).sum();
        let parts = plan.partitions();
        // Rows a partition's columns need in the cache at once.
        let in_flight = |p: u64| -> u64 {
            let len = plan.partition_len(p);
            match wide {
                Shuffle::Block => (2 * plan.block_rows(p)).min(len),
                _ => len,
            }
        };
        let share = |rank: u64, world: u64| -> u64 {
            (rank..parts).step_by(world as usize).map(in_flight).sum()
        };
        let (rows, what) = match opts.world_size {
            Some(w) if parts > 1 && parts.is_multiple_of(w) && w > 1 => (
                (0..w).map(|r| share(r, w)).max().unwrap_or(0),
                format!(
                    "one rank's share of the decoded dataset (partitions R, R+{w}, … of {parts})"
                ),
            ),
            _ => (share(0, 1), "the whole decoded dataset".to_string()),
        };
        // Each partition's share of a row group split between two counts as a whole one.
        let groups = (plan.row_groups() as u64 * rows).div_ceil(plan.rows().max(1)) + parts;
        // Each file (a row group's columns, a batch file) takes up to one aligned page more: its
        // header, or its last page's rest.
        let page = crate::read::format::DATA_ALIGN as u64;
        let columns = rows * row + groups * page;
        let batches = (opts.prefetch + 2) * (opts.batch_size * row + page);
        let need = columns + batches;
        if need <= capacity {
            return Ok(());
        }
        let (need, capacity) = (
            crate::options::human_size(need),
            crate::options::human_size(capacity),
        );
        if wide == Shuffle::Global {
            bail!(
                "shuffle=global needs {what} in the local cache ({need} with the batches kept ready), but cache_size is {capacity}; raise cache_size, use more partitions= across hosts with world_size=, or use shuffle=block or shuffle=window"
            );
        }
        tracing::warn!(
            "shuffle=block gathers each batch from a block of {} rows of its partition and decodes the next block ahead: for {what} that needs {need} in the local cache, but cache_size is {capacity}, so row groups will be decoded again as batches need them (slow); raise cache_size, lower shuffle_block=, or use shuffle=window",
            plan.block_rows(0)
        );
        Ok(())
    }

    /// The files of this dataset's mount.
    pub(crate) fn layout(&self) -> Arc<Layout> {
        Arc::new(Layout::new(self.view.tensors.clone()))
    }

    /// Opens the local cache for this dataset and these content options.
    pub(crate) fn open_cache(
        &self,
        opts: &Options,
        layout: Arc<Layout>,
        placement: &Placement,
    ) -> Result<DiskCache> {
        let content = opts.content();
        let fingerprint = self.fingerprint();
        let sources = self.sources();
        let decode: Vec<String> = sources.iter().map(|(s, _)| s.decode_identity()).collect();
        let decode = decode.join(" ");
        let columns = content.columns.to_string();
        let order = content.order.to_string();
        // The transform's own identity: its sources' digest (the options name it only).
        let udf = self.udf.as_ref().map_or("", |a| a.udf.digest());
        let parts = placement.rule();
        let ckey = crate::model::kept::key_name(&[
            decode.as_bytes(),
            columns.as_bytes(),
            udf.as_bytes(),
            parts.as_bytes(),
        ]);
        let bkey = crate::model::kept::key_name(&[
            fingerprint.as_bytes(),
            columns.as_bytes(),
            order.as_bytes(),
            udf.as_bytes(),
        ]);
        let names = (sources.iter().flat_map(|(s, _)| &s.files))
            .flat_map(|f| (0..f.rg_rows.len()).map(|rg| crate::cache::columns_name(&f.id, rg)))
            .collect();
        let capacity = match opts.cache_size {
            Some(n) => n,
            None => free_space(&opts.cache_dir)? / 5 * 4,
        };
        DiskCache::open(
            &opts.cache_dir,
            ckey,
            bkey,
            capacity,
            layout,
            names,
            &self.stats,
        )
    }

    /// The filesystem core over this dataset and its cache: the tree, and the serving facade
    /// over the parts that build, cache, materialise and prefetch batches, wired together. What
    /// a mount serves (through [`Requests`]), and what the in-process tests drive without FUSE.
    pub fn filesystem(
        &self,
        opts: &Options,
        runtime: tokio::runtime::Handle,
    ) -> Result<(Fs, Arc<Serve>)> {
        let layout = self.layout();
        let widths: Vec<usize> = self.view.tensors.iter().map(|t| t.row_bytes()).collect();
        let placement = Arc::new(Placement::for_mount(
            &widths,
            opts.shuffle,
            self.udf.is_some(),
        ));
        let cache = Arc::new(self.open_cache(opts, layout.clone(), &placement)?);
        self.check_cache_room(opts, cache.capacity())?;
        let dataset_json = serde_json::to_vec_pretty(&self.dataset_json(opts))?;
        let buffers = self.buffer_memory(opts, dataset_json.len() as u64)?;
        let orders = Arc::new(Orders::new(self.plan.clone()));
        let readers = Arc::new(Readers::default());
        let eviction = Arc::new(Eviction::new(
            orders.clone(),
            readers.clone(),
            cache.clone(),
        ));
        let builder = Arc::new(Builder::new(
            Parts {
                sources: self.sources(),
                view: self.view.clone(),
                placement,
                orders,
                stats: self.stats.clone(),
                cache: cache.clone(),
                eviction: eviction.clone(),
                udf: self.udf.clone(),
            },
            runtime.clone(),
            Limits {
                threads: opts.threads,
                memory: buffers,
                prefetch: opts.prefetch,
            },
        )?);
        let materializer = Arc::new(Materializer::new(
            builder.clone(),
            layout.clone(),
            cache.clone(),
            eviction,
        ));
        let ahead = Ahead::new(
            materializer.clone(),
            builder.clone(),
            cache,
            layout.clone(),
            runtime.clone(),
            opts.epochs,
            opts.prefetch > 0,
        );
        let prefetcher = Prefetcher::new(
            materializer.clone(),
            builder.clone(),
            readers,
            layout.clone(),
            runtime,
            opts.prefetch,
            opts.epochs,
        );
        let serve = Arc::new(Serve::new(
            materializer,
            builder,
            prefetcher,
            ahead,
            layout.clone(),
        ));
        let fs = Fs::new(Tree {
            backing: serve.clone(),
            layout,
            epochs: opts.epochs,
            world_size: opts.world_size,
            dataset_json,
        });
        Ok((fs, serve))
    }

    /// What `memory_limit` leaves for the buffers (decoded row groups, built batches) once the
    /// mount's lasting memory is counted: every file's decoded footer (about 5 KiB an object,
    /// docs/dev/scale.md; a mount of a snapshot loads those its reads need, at most all) and
    /// `dataset.json`. Refused where that takes more than half the limit.
    pub(crate) fn buffer_memory(&self, opts: &Options, dataset_json: u64) -> Result<u64> {
        let sources = self.sources();
        let footers: u64 = sources.iter().map(|(s, _)| s.facts.footer_memory).sum();
        let files: usize = sources.iter().map(|(s, _)| s.files.len()).sum();
        let held = footers + dataset_json;
        let Some(buffers) = crate::read::produce::budget::buffers(opts.memory_limit, held) else {
            let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
            bail!(
                "the footers of the dataset's {} files and dataset.json take {} of memory_limit={}: raise memory_limit to at least {}",
                files,
                mib(held),
                mib(opts.memory_limit),
                mib(2 * held)
            );
        };
        Ok(buffers)
    }
}

/// Bytes free for unprivileged use on the filesystem holding `dir`.
fn free_space(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs is plain old data that statvfs(3) fills; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        bail!(
            "cache_dir '{}': {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The mount's runtime: I/O on a couple of async workers; decoding runs on blocking threads,
/// bounded by the engine's `threads` permits.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    // Blocking threads: the decoders (at most `threads`, each of which may wait on file reads
    // of its own) and short file reads and writes. Each thread costs memory (a malloc arena),
    // so they are bounded.
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(3 * threads + 8)
        .thread_name("tensorfs-worker")
        .enable_all()
        .build()?)
}

pub(crate) fn create_cache_dir(dir: &Path) -> Result<()> {
    crate::model::kept::private_dir(dir).with_context(|| format!("cache_dir '{}'", dir.display()))
}

/// Opens the dataset for a mount: footers kept in the cache directory, every refusal found
/// before anything is mounted.
pub(crate) fn open_for_mount(
    source: &str,
    opts: &Options,
    runtime: &tokio::runtime::Runtime,
) -> Result<Dataset> {
    create_cache_dir(&opts.cache_dir)?;
    let footers = opts.cache_dir.join("v1").join("footers");
    let d = open_checked(source, opts, runtime, Some(&footers))?;
    for (source, view) in d.sources() {
        crate::source::snapshot::record(&source, &view, &opts.cache_dir);
    }
    Ok(d)
}

/// Opens the dataset and refuses it as a mount would, with a panic of a decoder turned into
/// the refusal.
fn open_checked(
    source: &str,
    opts: &Options,
    runtime: &tokio::runtime::Runtime,
    footers: Option<&Path>,
) -> Result<Dataset> {
    let open = || runtime.block_on(Dataset::open(source, opts, footers));
    let d = crate::catch_panic(open).unwrap_or_else(|panic| {
        Err(anyhow!(
            "source '{source}': a file is malformed beyond what the Parquet reader can report ({panic})"
        ))
    })?;
    d.check()?;
    Ok(d)
}

/// `tensorfs snapshot`: lists the source and reads every footer once (with `from`, an earlier
/// snapshot of it, only those of the objects it does not hold), refuses what a mount with these
/// options would (with the same line), and pins the dataset in `dest` (a local path or an
/// object URL the store options reach). Returns its fingerprint.
pub fn snapshot(source: &str, dest: &str, opts: &Options, from: Option<&str>) -> Result<String> {
    let runtime = runtime(opts.threads)?;
    if crate::source::mixture::names_one(source) && from.is_some() {
        bail!(
            "--from with a mixture (a .toml SOURCE) is not implemented yet: take the snapshot without it"
        );
    }
    let d = match from {
        None => open_checked(source, opts, &runtime, None)?,
        Some(at) => {
            let earlier = runtime.block_on(crate::source::snapshot::read(at, &opts.store))?;
            let open = || {
                runtime.block_on(async {
                    let stats = Arc::new(Stats::default());
                    let (located, store) =
                        crate::source::iceberg_rest::resolve(source, &opts.store).await?;
                    let mut opened = Source::open_from(
                        &located,
                        &store,
                        opts.version,
                        &earlier,
                        stats.clone(),
                        where_filter(opts)?.as_ref(),
                    )
                    .await?;
                    opened.display = source.to_string();
                    let source = opened;
                    Dataset::over(Arc::new(source), opts, stats).await
                })
            };
            let d = crate::catch_panic(open).unwrap_or_else(|panic| {
                Err(anyhow!(
                    "source '{source}': a file is malformed beyond what the Parquet reader can report ({panic})"
                ))
            })?;
            d.check()?;
            d
        }
    };
    let dataset_json = serde_json::to_vec_pretty(&d.dataset_json(opts))?;
    d.buffer_memory(opts, dataset_json.len() as u64)?;
    // Without cache_size=, the room a mount gets depends on the host's disk.
    if let Some(capacity) = opts.cache_size {
        d.check_cache_room(opts, capacity)?;
    }
    // A mixture's snapshot is each source's behind its url.
    let bytes = match &d.mixture {
        None => crate::source::snapshot::encode(&d.source, &d.view)?,
        Some(m) => {
            let pins = (m.members.iter())
                .map(|member| {
                    let bytes = crate::source::snapshot::encode(&member.source, &member.view)?;
                    Ok((member.spec.url.clone(), bytes))
                })
                .collect::<Result<Vec<_>>>()?;
            crate::source::snapshot::encode_mixture(&pins)
        }
    };
    runtime.block_on(crate::source::snapshot::write(dest, bytes, &opts.store))?;
    Ok(d.fingerprint().to_string())
}
