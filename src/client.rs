//! Commands that work on a live mount through its files: `tensorfs warm` materialises batches
//! ahead of a job by opening them (has one-open files built by asking each for an extended
//! attribute); `tensorfs stats` shows the counters of
//! `.tensorfs/stats.json`.

use crate::read::layout::{
    self, ALL, ALL_SAFETENSORS, batch_name, epoch_name, npy_file_name, rank_name, safetensors_name,
};
use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "'{}' cannot be read: is the directory a tensorfs mount?",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("'{}' is not JSON", path.display()))
}

/// `A..B` (B excluded), `A..=B`, or `N`.
pub(crate) fn parse_epochs(s: &str) -> Result<Range<u64>> {
    let num = |x: &str| {
        x.trim()
            .parse::<u64>()
            .map_err(|_| anyhow!("--epochs {s}: expected A..B, A..=B or N"))
    };
    Ok(if let Some((a, b)) = s.split_once("..=") {
        num(a)?..num(b)? + 1
    } else if let Some((a, b)) = s.split_once("..") {
        num(a)?..num(b)?
    } else {
        let n = num(s)?;
        n..n + 1
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Each batch's NNNNNN.safetensors.
    Safetensors,
    /// Each batch's NNNNNN/NAME.npy files.
    Npy,
    /// Both of the above.
    Both,
    /// Each directory's all.safetensors, built whole on the cache (no batch files).
    All,
    /// Each directory's all/NAME.npy files, built whole on the cache (no batch files).
    AllNpy,
}

/// `R-of-W`: rank R of W.
pub(crate) fn parse_rank(s: &str) -> Result<(u64, u64)> {
    let bad = || anyhow!("--rank {s}: expected R-of-W with R < W, such as 3-of-8");
    let (r, w) = s.split_once("-of-").ok_or_else(bad)?;
    let (r, w): (u64, u64) = (r.parse().map_err(|_| bad())?, w.parse().map_err(|_| bad())?);
    if r >= w {
        return Err(bad());
    }
    Ok((r, w))
}

/// Opens every batch file of the epochs (which materialises it on the mount's SSD cache), or
/// of the rank views `ranks` of them, `jobs` at a time, with a progress bar.
pub fn warm(
    mountpoint: &Path,
    epochs: Option<&str>,
    ranks: &[String],
    all_ranks: bool,
    format: Format,
    jobs: usize,
) -> Result<()> {
    let ds = read_json(&mountpoint.join("dataset.json"))?;
    // A mount split into partitions is read by many hosts, each its own share: building the
    // whole epoch on one host is rarely what its user meant.
    let partitions = ds["partitions"].as_u64().unwrap_or(1);
    if partitions > 1 && ranks.is_empty() && !all_ranks {
        let world = ds["world_size"].as_u64();
        let example = match world {
            Some(w) => format!("--rank R-of-{w}"),
            None => "--rank R-of-W".to_string(),
        };
        bail!(
            "{} splits the dataset into {partitions} partitions, one share per host: give {example} for each of this host's ranks, or --all-ranks to build every host's share here",
            mountpoint.display()
        );
    }
    let batches = ds["batches_per_epoch"]
        .as_u64()
        .context("dataset.json has no batches_per_epoch")?;
    let ranks: Vec<(u64, u64)> = ranks.iter().map(|r| parse_rank(r)).collect::<Result<_>>()?;
    // A rank view's batches: those of the epoch, every W-th from R, numbered from 0. Their
    // count comes from the plan (rank views leave the leftover batches out), so it is read
    // from the mount itself.
    let rank_count = |w: u64| -> Result<u64> {
        let dir = mountpoint.join(epoch_name(0)).join(rank_name(0, w));
        let n = std::fs::read_dir(&dir)
            .with_context(|| format!("'{}' cannot be listed", dir.display()))?
            .filter_map(|e| e.ok())
            .filter(|e| layout::parse_safetensors_name(&e.file_name().to_string_lossy()).is_some())
            .count();
        Ok(n as u64)
    };
    let dirs: Vec<(String, u64)> = if ranks.is_empty() {
        vec![(String::new(), batches)]
    } else {
        ranks
            .iter()
            .map(|&(r, w)| Ok((rank_name(r, w), rank_count(w)?)))
            .collect::<Result<_>>()?
    };
    let epochs = match epochs {
        Some(e) => parse_epochs(e)?,
        None => 0..ds["epochs"].as_u64().unwrap_or(1),
    };
    if epochs.is_empty() {
        bail!("--epochs selects no epoch");
    }
    let tensors: Vec<String> = ds["tensors"]
        .as_array()
        .context("dataset.json has no tensors")?
        .iter()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect();
    let mut files: Vec<PathBuf> = Vec::new();
    for e in epochs.clone() {
        for (sub, count) in &dirs {
            let base = mountpoint.join(epoch_name(e)).join(sub);
            match format {
                Format::All => files.push(base.join(ALL_SAFETENSORS)),
                Format::AllNpy => files.extend(
                    tensors
                        .iter()
                        .map(|t| base.join(ALL).join(npy_file_name(t))),
                ),
                _ => {}
            }
            if matches!(format, Format::All | Format::AllNpy) {
                continue;
            }
            for i in 0..*count {
                if format != Format::Npy {
                    files.push(base.join(safetensors_name(i)));
                }
                if format != Format::Safetensors {
                    files.extend(
                        tensors
                            .iter()
                            .map(|t| base.join(batch_name(i)).join(npy_file_name(t))),
                    );
                }
            }
        }
    }
    let started = Instant::now();
    let (bytes, failures) = match format {
        Format::All | Format::AllNpy => build_all(&files, jobs),
        _ => keep_all(&files, jobs),
    };
    let secs = started.elapsed().as_secs_f64();
    // A failure is one line: the count warmed goes with it.
    if let Some(first) = failures.first() {
        bail!(
            "{} of {} files could not be materialised ({} were), the first: {first}",
            failures.len(),
            files.len(),
            files.len() - failures.len()
        );
    }
    eprintln!(
        "warmed epochs {}..{} ({} files, {:.1} MB) in {secs:.1} s",
        epochs.start,
        epochs.end,
        files.len(),
        bytes as f64 / 1e6
    );
    Ok(())
}

/// Has every one-open file of `files` built whole on the mount's cache, `jobs` at a time,
/// with a progress bar: asks each for `user.tensorfs.warm` (which starts its build) until it
/// answers that the file is ready. The bytes built, and a line for each file that was not.
fn build_all(files: &[PathBuf], jobs: usize) -> (u64, Vec<String>) {
    const STEPS: u64 = 1000;
    let bar = ProgressBar::new(files.len() as u64 * STEPS).with_style(
        ProgressStyle::with_template("{bar:40} {percent}% of {msg}  eta {eta}")
            .expect("a valid template"),
    );
    let started = Instant::now();
    let sizes: Vec<u64> = (files.iter())
        .map(|f| std::fs::metadata(f).map_or(0, |md| md.len()))
        .collect();
    // Each file's part built, in STEPS.
    let done: Vec<AtomicU64> = files.iter().map(|_| AtomicU64::new(0)).collect();
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<String>> = Mutex::default();
    let show = || {
        let steps: Vec<u64> = done.iter().map(|d| d.load(Ordering::Relaxed)).collect();
        let bytes: f64 = (steps.iter().zip(&sizes))
            .map(|(&s, &size)| size as f64 * s as f64 / STEPS as f64)
            .sum();
        bar.set_position(steps.iter().sum());
        bar.set_message(format!(
            "{} files, {:.1} MB/s",
            files.len(),
            bytes / 1e6 / started.elapsed().as_secs_f64()
        ));
    };
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    let failed = built_whole(f, &done[i], &show, STEPS).err();
                    match failed {
                        None => done[i].store(STEPS, Ordering::Relaxed),
                        Some(why) => {
                            done[i].store(0, Ordering::Relaxed);
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{}: {why}", f.display()));
                        }
                    }
                    show();
                }
            });
        }
    });
    bar.finish_and_clear();
    let bytes = (done.iter().zip(&sizes))
        .filter(|(d, _)| d.load(Ordering::Relaxed) == STEPS)
        .map(|(_, &size)| size)
        .sum();
    (bytes, failures.into_inner().unwrap())
}

/// Asks one-open file `f` for `user.tensorfs.warm` until it is ready, keeping `done` (in
/// `steps`) and the bar (`show`) up to date; why it was not built.
fn built_whole(f: &Path, done: &AtomicU64, show: &dyn Fn(), steps: u64) -> Result<(), String> {
    loop {
        match xattr::get(f, crate::requests::files::WARM_XATTR) {
            Ok(Some(v)) if v == b"ready" => return Ok(()),
            Ok(Some(v)) if v == b"skipped" => {
                return Err(
                    "not built: no room in the cache, or its build failed or was \
                    stopped by a reader (the mount's log says which)"
                        .into(),
                );
            }
            Ok(Some(v)) => {
                let part: f64 = String::from_utf8_lossy(&v).parse().unwrap_or(0.0);
                done.store((part * steps as f64) as u64, Ordering::Relaxed);
                show();
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(None) => return Err("the mount does not build one-open files".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Has every batch file of `files` materialised on the mount's cache, `jobs` at a time, with a
/// progress bar: asks each for `user.tensorfs.warm` (an open alone stores a shuffled epoch's
/// file in the page cache only, for a reader that reads it once). The bytes materialised, and
/// a line for each file that was not.
fn keep_all(files: &[PathBuf], jobs: usize) -> (u64, Vec<String>) {
    let bar = ProgressBar::new(files.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} files  {msg}  eta {eta}")
            .expect("a valid template"),
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let failures: Mutex<Vec<String>> = Mutex::default();
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                while let Some(f) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    match kept(f) {
                        Ok(size) => {
                            bytes.fetch_add(size, Ordering::Relaxed);
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{}: {e}", f.display())),
                    }
                    let mb = bytes.load(Ordering::Relaxed) as f64 / 1e6;
                    bar.set_message(format!(
                        "{mb:.1} MB, {:.1} MB/s",
                        mb / started.elapsed().as_secs_f64()
                    ));
                    bar.inc(1);
                }
            });
        }
    });
    bar.finish_and_clear();
    (bytes.into_inner(), failures.into_inner().unwrap())
}

/// Batch file `f` materialised on the mount's cache: its size.
fn kept(f: &Path) -> std::io::Result<u64> {
    let size = std::fs::metadata(f)?.len();
    match xattr::get(f, crate::requests::files::WARM_XATTR)? {
        Some(v) if v == b"ready" => Ok(size),
        _ => Err(std::io::Error::other(
            "not materialised: no room in the cache (the mount's log says more)",
        )),
    }
}

fn n(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

fn ratio(hits: f64, misses: f64) -> String {
    if hits + misses == 0.0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * hits / (hits + misses))
    }
}

/// The counters as lines; with `prev` (and the seconds since), rates too.
fn render(v: &Value, prev: Option<(&Value, f64)>) -> String {
    let rate = |k: &str| match prev {
        Some((p, secs)) if secs > 0.0 => format!("  ({:.1}/s)", (n(v, k) - n(p, k)) / secs),
        _ => String::new(),
    };
    let mb = |k: &str| n(v, k) / 1e6;
    let mb_rate = |k: &str| match prev {
        Some((p, secs)) if secs > 0.0 => {
            format!("  ({:.1} MB/s)", (n(v, k) - n(p, k)) / 1e6 / secs)
        }
        _ => String::new(),
    };
    let mut out = vec![
        format!(
            "served      {:.0} batches{}, {:.1} MB{}",
            n(v, "batches_served"),
            rate("batches_served"),
            mb("bytes_served"),
            mb_rate("bytes_served")
        ),
        format!(
            "waits       {:.0} opens and daemon reads timed, {:.3} s waited in all, p99 {:.1} ms",
            n(v, "stall_count"),
            n(v, "stall_ns") / 1e9,
            n(v, "stall_p99_us") / 1e3
        ),
        format!(
            "source      {:.0} requests, {:.1} MB read{}",
            n(v, "remote_requests"),
            mb("remote_bytes"),
            mb_rate("remote_bytes")
        ),
        format!(
            "decode      {:.0} row groups, {:.0} rows, {:.2} s ({:.2} s of CPU)",
            n(v, "row_groups_decoded"),
            n(v, "rows_decoded"),
            n(v, "decode_ns") / 1e9,
            n(v, "decode_cpu_ns") / 1e9
        ),
        format!(
            "build       {:.0} batches gathered ({:.2} s of CPU), {:.0} batch files written ({:.2} s of CPU)",
            n(v, "batches_built"),
            n(v, "gather_cpu_ns") / 1e9,
            n(v, "batch_files_written"),
            n(v, "batch_write_cpu_ns") / 1e9
        ),
        format!(
            "next epoch  {:.0} batch files built ahead of their reader's epoch",
            n(v, "next_epoch_files_built")
        ),
        format!(
            "ahead       {:.0} one-open files built ahead ({:.1} MB, {:.0} over files gone by), {:.0} without room, {:.0} kept ones checked, {:.0} opens from them, {:.0} before they were done",
            n(v, "ahead_files_built"),
            mb("ahead_bytes_built"),
            n(v, "ahead_written_over"),
            n(v, "ahead_skipped"),
            n(v, "ahead_kept_checked"),
            n(v, "ahead_opens"),
            n(v, "ahead_late")
        ),
        format!(
            "cache       {:.1} of {:.1} MB, {:.1} MB written; batch files {} hit, columns {} hit; {:.0} evicted, {:.0} corrupt dropped, {:.0} writes failed",
            mb("cache_bytes"),
            mb("cache_capacity"),
            mb("cache_written_bytes"),
            ratio(n(v, "batch_file_hits"), n(v, "batch_file_misses")),
            ratio(n(v, "column_hits"), n(v, "column_misses")),
            n(v, "cache_evictions"),
            n(v, "cache_corrupt_dropped"),
            n(v, "cache_write_failures")
        ),
        format!(
            "serving     {:.0} lookups, {:.0} opens, {:.0} by passthrough, {:.0} daemon reads, {:.0} files stored in the page cache; memory {:.1} MB",
            n(v, "lookups"),
            n(v, "opens"),
            n(v, "passthrough_opens"),
            n(v, "daemon_reads"),
            n(v, "page_cache_stores"),
            mb("memory_bytes")
        ),
    ];
    for r in v["readers"].as_array().into_iter().flatten() {
        out.push(format!(
            "reader      {} at batch {}, {} ready ahead",
            r["dir"].as_str().unwrap_or("?"),
            r["batch"],
            r["ahead"]
        ));
    }
    out.join("\n")
}

/// Prints the mount's counters; with `watch`, every second, with rates, until interrupted.
pub fn stats(mountpoint: &Path, watch: bool) -> Result<()> {
    let path = mountpoint.join(".tensorfs/stats.json");
    let mut prev: Option<(Value, Instant)> = None;
    loop {
        let v = read_json(&path)?;
        let now = Instant::now();
        let shown = render(
            &v,
            prev.as_ref()
                .map(|(p, t)| (p, now.duration_since(*t).as_secs_f64())),
        );
        if !watch {
            println!("{shown}");
            return Ok(());
        }
        // Clear the screen and redraw, as watch(1) does.
        println!("\x1b[2J\x1b[H{shown}");
        prev = Some((v, now));
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_ranges() {
        assert_eq!(parse_epochs("0..3").unwrap(), 0..3);
        assert_eq!(parse_epochs("2..=4").unwrap(), 2..5);
        assert_eq!(parse_epochs("7").unwrap(), 7..8);
        assert!(parse_epochs("a..b").is_err());
    }

    #[test]
    fn rendering_shows_rates_against_the_previous_sample() {
        let a = serde_json::json!({"bytes_served": 0, "batches_served": 0});
        let b = serde_json::json!({"bytes_served": 4e6, "batches_served": 10, "readers": [{"dir": "epoch-0", "batch": 3, "ahead": 8}]});
        let text = render(&b, Some((&a, 2.0)));
        assert!(text.contains("(5.0/s)"), "{text}");
        assert!(text.contains("(2.0 MB/s)"), "{text}");
        assert!(text.contains("epoch-0 at batch 3, 8 ready ahead"), "{text}");
    }
}
