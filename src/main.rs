use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tensorfs::daemon::{self, Ready};
use tensorfs::mount::{self, Dataset};
use tensorfs::options::Options;

#[derive(Parser)]
#[command(
    name = "tensorfs",
    version,
    about = "Mount a Parquet dataset as per-epoch tensor batch files"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount SOURCE (a Parquet file, a prefix of them, or an object-store URL) on MOUNTPOINT.
    #[command(after_help = tensorfs::options::help())]
    Mount {
        source: String,
        mountpoint: String,
        /// Mount options, comma-separated; may be repeated.
        #[arg(short = 'o', value_name = "OPT[,OPT...]")]
        options: Vec<String>,
        /// Stay in the foreground instead of daemonising.
        #[arg(short = 'f', long)]
        foreground: bool,
    },
    /// Materialise batches on the mount's local cache ahead of a job, with a progress bar.
    #[command(after_help = "Example: tensorfs warm /mnt/train --epochs 0..2 --rank 3-of-8")]
    Warm {
        mountpoint: std::path::PathBuf,
        /// Epochs to warm: A..B (B excluded), A..=B, or N. Default: the epochs the mount lists.
        #[arg(long)]
        epochs: Option<String>,
        /// Which files to materialise: by default each directory's all/NAME.npy, what
        /// `tensorfs.torch.BatchDataset` and `tensorfs.numpy` read.
        #[arg(long, value_enum, default_value = "all-npy")]
        format: tensorfs::client::Format,
        /// Warm one rank's view only, R-of-W (e.g. 3-of-8): the batches of
        /// `epoch-N/rank-R-of-W/`; repeat for each local rank.
        #[arg(long, value_name = "R-of-W")]
        rank: Vec<String>,
        /// On a mount split into partitions, warm every host's share here (without --rank,
        /// refused unless given: each host warms its own ranks).
        #[arg(long)]
        all_ranks: bool,
        /// Files opened at once.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
        jobs: u16,
    },
    /// Show the mount's live counters: throughput, cache, stalls, remote bytes.
    Stats {
        mountpoint: std::path::PathBuf,
        /// Refresh every second, with rates.
        #[arg(long)]
        watch: bool,
    },
    /// Pin the dataset SOURCE is now for every host: list it, read every footer once, and
    /// write SNAPSHOT (a local path or an object URL); mount it with -o snapshot=SNAPSHOT.
    #[command(
        after_help = "Example: tensorfs snapshot s3://bucket/train/ s3://bucket/train.snapshot -o aws_region=us-east-1\nPrints the dataset's fingerprint. Refuses what `tensorfs mount` with the same options would."
    )]
    Snapshot {
        source: String,
        snapshot: String,
        #[arg(short = 'o', value_name = "OPT[,OPT...]")]
        options: Vec<String>,
        /// An earlier snapshot of SOURCE: the objects it holds, unchanged since, are taken as
        /// it pinned them, and only the footers of the others are read.
        #[arg(long, value_name = "OLD")]
        from: Option<String>,
    },
    /// Show the tensor view a mount of SOURCE would show, and what it would refuse.
    Inspect {
        source: String,
        #[arg(short = 'o', value_name = "OPT[,OPT...]")]
        options: Vec<String>,
        /// Print the dataset.json a mount would show.
        #[arg(long)]
        json: bool,
    },
}

const SUBCOMMANDS: &[&str] = &["mount", "inspect", "warm", "stats", "snapshot", "help"];

/// `tensorfs SOURCE MOUNTPOINT -o …` (the form mount(8) calls) is `tensorfs mount …`.
fn arguments() -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    for a in std::env::args_os() {
        match a.into_string() {
            Ok(s) => args.push(s),
            Err(bad) => {
                return Err(format!(
                    "argument '{}' is not valid UTF-8",
                    bad.to_string_lossy()
                ));
            }
        }
    }
    if let Some(first) = args.get(1)
        && !first.starts_with('-')
        && !SUBCOMMANDS.contains(&first.as_str())
    {
        args.insert(1, "mount".into());
    }
    Ok(args)
}

fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("tensorfs: error: {}", tensorfs::one_line(e));
    ExitCode::FAILURE
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    // At debug level each span's close is logged with its busy and idle time: the producer's
    // fetch, decode, build and materialize, the consumer's open and read.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

fn main() -> ExitCode {
    // Few malloc arenas: the daemon's many short-lived threads would otherwise each grow one,
    // and its memory far past memory_limit.
    // SAFETY: mallopt only tunes the allocator, before any allocation-heavy work.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    tensorfs::quiet_panics();
    let cli = match arguments() {
        Ok(args) => Cli::parse_from(args),
        Err(line) => {
            eprintln!("tensorfs: error: {line}");
            return ExitCode::FAILURE;
        }
    };
    if !matches!(cli.command, Command::Mount { .. }) {
        // A command that prints (inspect, stats) ends quietly when its reader goes away
        // (`tensorfs inspect … | head`), as other tools do. Not the daemon: a socket closed
        // under it must be an error, not a signal.
        // SAFETY: restoring a signal's default disposition has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Mount {
            source,
            mountpoint,
            options,
            foreground,
        } => {
            let run = || -> anyhow::Result<()> {
                let opts = Options::parse(&options)?;
                let mountpoint = mount::check_mountpoint(&mountpoint, opts.nonempty)?;
                let ready = if foreground {
                    Ready::Foreground
                } else {
                    daemon::daemonize(&daemon::log_file(&opts))?
                };
                daemon::hide_secrets(&opts);
                init_logging(&opts.log);
                daemon::serve(&source, &mountpoint, &opts, ready)
            };
            match run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Warm {
            mountpoint,
            epochs,
            format,
            rank,
            all_ranks,
            jobs,
        } => match tensorfs::client::warm(
            &mountpoint,
            epochs.as_deref(),
            &rank,
            all_ranks,
            format,
            jobs as usize,
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Command::Stats { mountpoint, watch } => match tensorfs::client::stats(&mountpoint, watch) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Command::Snapshot {
            source,
            snapshot,
            options,
            from,
        } => {
            let run = || -> anyhow::Result<String> {
                let opts = Options::parse(&options)?;
                init_logging(&opts.log);
                mount::snapshot(&source, &snapshot, &opts, from.as_deref())
            };
            match run() {
                Ok(fingerprint) => {
                    println!("{fingerprint}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Inspect {
            source,
            options,
            json,
        } => {
            let run = || -> anyhow::Result<bool> {
                let opts = Options::parse(&options)?;
                let dataset =
                    mount::runtime(opts.threads)?.block_on(Dataset::open(&source, &opts, None))?;
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&dataset.dataset_json(&opts))?
                    );
                    dataset.check()?;
                    return Ok(true);
                }
                print_view(&dataset, &opts);
                match dataset.view.refusal("listed above") {
                    Some(line) => Err(anyhow::anyhow!(line)),
                    None => Ok(true),
                }
            };
            match run() {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
    }
}

fn print_view(d: &Dataset, opts: &Options) {
    match &d.mixture {
        Some(m) => print_mixture(d, m),
        None => print_source(d),
    }
    print_order_and_tensors(d, opts);
}

/// A mixture's sources: what each keeps and draws.
fn print_mixture(d: &Dataset, m: &tensorfs::mount::Mixture) {
    println!(
        "mixture      {} ({} sources, {} rows; an epoch draws {})",
        m.path,
        m.members.len(),
        d.plan.rows(),
        d.plan.drawn_rows()
    );
    println!("fingerprint  {}", d.fingerprint());
    for (i, member) in m.members.iter().enumerate() {
        let s = &member.source;
        let rows = member.rows();
        let selected = (s.selected.as_ref()).map(|w| format!(", where {}", w.text));
        println!(
            "source {:<6}{} ({} files, {rows} rows{}): {}, {} drawn an epoch",
            i + 1,
            member.spec.url,
            s.files.len(),
            selected.unwrap_or_default(),
            member.spec.size,
            member.drawn
        );
    }
}

fn print_source(d: &Dataset) {
    let files = d.source.files.len();
    println!(
        "source       {} ({files} file{}, {} rows, {} row groups)",
        d.source.display,
        if files == 1 { "" } else { "s" },
        d.plan.rows(),
        d.plan.row_groups()
    );
    println!("fingerprint  {}", d.source.fingerprint());
    if let Some(version) = d.source.table {
        println!(
            "{:<13}version {}, {} data files",
            version.what(),
            version.number,
            d.source.files.len()
        );
    }
    if let Some(s) = &d.source.selected {
        println!("where        {}", s.text);
        match s.decided_here {
            true => println!(
                "{:<13}{} rows kept; ruled out before their footers: {} objects; by row-group statistics: {} row groups ({} kept whole); {} row groups read to decide ({} of their rows settled by the page index)",
                "",
                d.plan.rows(),
                s.objects_ruled_out,
                s.row_groups_ruled_out,
                s.row_groups_kept_whole,
                s.row_groups_read,
                s.rows_settled_by_page_index
            ),
            false => println!(
                "{:<13}{} rows kept, as the snapshot pins them",
                "",
                d.plan.rows()
            ),
        }
    }
    if !d.source.partitions.is_empty() {
        let columns: Vec<String> = (d.source.partitions.fields.iter())
            .map(|f| format!("{} ({})", f.name(), f.data_type()))
            .collect();
        println!("partition columns  {}", columns.join(", "));
    }
    if let Some(a) = &d.udf {
        println!(
            "transform    {} (digest {}, {} workers, {}){}: the tensors below are its output's",
            a.udf.spec().target,
            &a.udf.digest()[..16],
            a.json()["workers"],
            a.udf.runtime,
            if a.udf.petastorm {
                ", a Petastorm TransformSpec"
            } else {
                ""
            }
        );
    }
    if let tensorfs::source::Origin::Snapshot(at) = &d.source.origin {
        println!("snapshot     {at} (nothing listed)");
    }
    match &d.source.unischema {
        Some(u) if u.inferred => println!(
            "petastorm    no Unischema: {} fields read as their first cells show them",
            u.fields.len()
        ),
        Some(u) => println!(
            "petastorm    Unischema '{}' ({} fields, from _common_metadata)",
            u.name,
            u.fields.len()
        ),
        None => {}
    }
}

fn print_order_and_tensors(d: &Dataset, opts: &Options) {
    println!(
        "batches      {} per epoch of {} rows (last: {} rows), shuffle={}",
        d.plan.batches(),
        opts.batch_size,
        d.plan.last_batch_len(),
        opts.shuffle.name()
    );
    let p = d.plan.partitions();
    if p > 1 {
        let sizes: Vec<u64> = (0..p).map(|i| d.plan.partition_len(i)).collect();
        let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
        println!(
            "partitions   {p} of {}..{} rows ({}): {} batches each ({} single-partition batches), then {} leftover rows in {} batches",
            lo.unwrap_or(&0),
            hi.unwrap_or(&0),
            if d.plan.whole_objects() {
                "whole objects drawn from the seed"
            } else {
                "row groups drawn from the seed"
            },
            d.plan.batches_per_partition(),
            d.plan.single_partition_batches(),
            d.plan.leftover_rows(),
            d.plan.batches() - d.plan.single_partition_batches().min(d.plan.batches()),
        );
    }
    if let Some(w) = opts.world_size {
        println!(
            "ranks        {w}: {} batches each, {} left out of rank views{}",
            d.plan.rank_batches(w),
            d.plan.rank_left_out(w),
            if p > 1 && !p.is_multiple_of(w) {
                format!(
                    " (world_size={w} does not divide partitions={p}: each rank reads from every partition)"
                )
            } else {
                String::new()
            }
        );
    }
    println!("tensors");
    let width = d
        .view
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0);
    for t in &d.view.tensors {
        let shape: Vec<String> = t
            .shape(opts.batch_size)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let unit = t.unit.map(|u| format!("  unit {u}")).unwrap_or_default();
        let item = &d.view.features[t.feature];
        let scalar_field = (d.source.unischema.as_ref())
            .and_then(|u| u.field(&item.name))
            .filter(|f| !f.codec.is_cell());
        let codec = match (&item.kind, scalar_field) {
            _ if t.part != tensorfs::source::view::Part::Data => String::new(),
            (tensorfs::source::view::FeatureKind::Cell { spec, .. }, _) => {
                format!("  from {} cells", spec.codec.name())
            }
            (tensorfs::source::view::FeatureKind::Column { .. }, Some(f)) => {
                format!("  from {} values", f.codec.name())
            }
            _ => String::new(),
        };
        let unit = format!("{unit}{codec}");
        println!(
            "  {:width$}  {:8} [{}]{unit}",
            t.name,
            t.dtype.name(),
            shape.join(", ")
        );
    }
    // One problem is the error line itself; several are listed here, and the error line
    // names the first.
    if d.view.problems.len() > 1 {
        println!("refused");
        for p in &d.view.problems {
            println!("  - {p}");
        }
    }
}
