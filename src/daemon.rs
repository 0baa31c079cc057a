//! The daemon's life: forked from `tensorfs mount` before any thread exists, it reports the
//! mount live or its error through a pipe, hides secret option values from its command line,
//! serves the FUSE session (which `kernel::mounting` mounts and unmounts) until unmounted, and
//! has a watcher unmount what it leaves behind if it is killed (`auto_unmount`).

use crate::kernel::fuse::FuseAdapter;
use crate::kernel::mounting::{detach, fuse_device, session, unmount_on_signal};
use crate::metrics::Endpoint;
use crate::mount::{create_cache_dir, open_for_mount, runtime};
use crate::one_line;
use crate::options::Options;
use crate::read::follow::page_cache::PageCache;
use crate::requests::Requests;
use anyhow::{Context, Result, anyhow, bail};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How the mounted daemon tells the `tensorfs mount` process it is ready, or why it failed.
pub enum Ready {
    Foreground,
    Pipe(std::fs::File),
}

impl Ready {
    fn report(&mut self, outcome: &Result<()>) {
        if let Ready::Pipe(f) = self {
            let msg = match outcome {
                Ok(()) => "OK\n".to_string(),
                Err(e) => format!("{}\n", one_line(e)),
            };
            let _ = f.write_all(msg.as_bytes());
        }
    }
}

/// A pipe (close-on-exec) as its two ends.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (read_end, write_end) = std::io::pipe()?;
    Ok((OwnedFd::from(read_end), OwnedFd::from(write_end)))
}

/// Forks: the parent waits until the child reports the mount live (exit 0) or fails (prints
/// the child's error line, exit 1). Must be called before any thread exists.
pub fn daemonize(log_file: &Path) -> Result<Ready> {
    let (read_end, write_end) = pipe().context("pipe")?;
    // SAFETY: the process is single-threaded here (no runtime exists yet), so the child may
    // go on running arbitrary code.
    match unsafe { libc::fork() } {
        -1 => bail!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            drop(read_end);
            // SAFETY: setsid has no preconditions; in a fresh child it cannot fail.
            unsafe { libc::setsid() };
            redirect_stdio(log_file);
            Ok(Ready::Pipe(std::fs::File::from(write_end)))
        }
        _ => {
            drop(write_end);
            let mut msg = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut msg);
            match msg.trim_end() {
                "OK" => std::process::exit(0),
                "" => {
                    eprintln!(
                        "tensorfs: error: the daemon exited before the mount was ready; see {}",
                        log_file.display()
                    );
                    std::process::exit(1)
                }
                line => {
                    eprintln!("tensorfs: error: {line}");
                    std::process::exit(1)
                }
            }
        }
    }
}

fn redirect_stdio(log_file: &Path) {
    let open = |path: &Path, append: bool| {
        std::fs::OpenOptions::new()
            .read(!append)
            .append(append)
            .create(append)
            .open(path)
    };
    use std::os::fd::AsRawFd;
    if let Ok(null) = open(Path::new("/dev/null"), false) {
        // SAFETY: both descriptors are valid; dup2 onto 0 and 1 replaces them atomically.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
    let log = log_file
        .parent()
        .map(create_cache_dir)
        .and_then(|r| r.ok())
        .and_then(|_| open(log_file, true).ok());
    // Without a log (the cache directory cannot be made), stderr goes nowhere rather than to
    // the terminal: the failure reaches it once, through the parent.
    if let Some(sink) = log.or_else(|| open(Path::new("/dev/null"), true).ok()) {
        // SAFETY: as above.
        unsafe { libc::dup2(sink.as_raw_fd(), 2) };
    }
}

/// Overwrites secret option values in this process's command line, so that `ps` and
/// /proc/PID/cmdline of the daemon do not show them.
pub fn hide_secrets(opts: &Options) {
    let secrets: Vec<Vec<u8>> = opts
        .store
        .iter()
        .filter(|(k, v)| crate::options::is_secret(k) && !v.is_empty())
        .map(|(k, v)| format!("{k}={v}").into_bytes())
        .collect();
    if secrets.is_empty() {
        return;
    }
    // Fields 48 and 49 of /proc/self/stat: where the argument strings lie in our memory.
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    let Some((_, after_comm)) = stat.rsplit_once(')') else {
        return;
    };
    // After the command name, field 3 of the file is index 0 here.
    let fields: Vec<usize> = after_comm
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let (Some(&start), Some(&end)) = (fields.get(45), fields.get(46)) else {
        return;
    };
    if start == 0 || end <= start {
        return;
    }
    // SAFETY: [arg_start, arg_end) is this process's own argument area, mapped and writable
    // for the life of the process; nothing else reads it while we rewrite bytes in place
    // (std copied the arguments at start-up).
    let args = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    mask_values(args, &secrets);
}

/// Overwrites with `*` the value of every `key=value` of `pairs` found in `args` (the value
/// only, and only where it follows its key, so nothing else in the command line changes).
fn mask_values(args: &mut [u8], pairs: &[Vec<u8>]) {
    for pair in pairs {
        let key_len = pair.iter().position(|&b| b == b'=').map_or(0, |p| p + 1);
        let mut i = 0;
        while i + pair.len() <= args.len() {
            if &args[i..i + pair.len()] == pair.as_slice() {
                args[i + key_len..i + pair.len()].fill(b'*');
                i += pair.len();
            } else {
                i += 1;
            }
        }
    }
}

/// Where a daemonised mount logs.
pub fn log_file(opts: &Options) -> PathBuf {
    opts.cache_dir.join("tensorfs.log")
}

/// Raises this process's soft limit on open files to its hard limit. The daemon holds a file
/// for each open of a materialised file, however many its readers keep open (a loader that
/// keeps every batch memory-mapped keeps thousands), and the soft limit is often 1024: past it,
/// opens of cache files would fail with EMFILE and the files be built again in memory.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!(
                    "cannot raise the limit on open files to {}: {}",
                    limit.rlim_max,
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

/// `auto_unmount`: a process that unmounts the mount once the daemon is gone, however it ended
/// (SIGKILL, the OOM killer), so that a restart needs no manual unmount. It learns the mount's
/// FUSE device once mounted, then waits for the end of a pipe only the daemon holds, and
/// detaches the mount if that device is still mounted there. It is forked before any thread
/// and before the mount, so it holds no FUSE descriptor (which would keep a dead mount
/// answering) and, closing it, none of the pipe the `tensorfs mount` process waits on. Unlike
/// fusermount3's own auto_unmount, it needs no `allow_other` on the mount.
struct Watcher(std::fs::File);

impl Watcher {
    fn start(mountpoint: &Path, ready: &Ready) -> Result<Watcher> {
        use std::os::fd::AsRawFd;
        let (read_end, write_end) = pipe().context("auto_unmount: pipe")?;
        // SAFETY: called before the runtime exists, so this process has one thread and the
        // child may run ordinary code.
        match unsafe { libc::fork() } {
            -1 => bail!("auto_unmount: fork: {}", std::io::Error::last_os_error()),
            0 => {
                drop(write_end);
                if let Ready::Pipe(f) = ready {
                    // SAFETY: closing the child's copy of the report pipe; the child exits
                    // below without ever using or dropping that File.
                    unsafe { libc::close(f.as_raw_fd()) };
                }
                // Its own session: signals to the daemon's process group do not reach it.
                // SAFETY: setsid and prctl have no preconditions; a failure changes nothing.
                unsafe {
                    libc::setsid();
                    libc::prctl(libc::PR_SET_NAME, c"tensorfs-umount".as_ptr());
                }
                let mut said = String::new();
                let _ = std::fs::File::from(read_end).read_to_string(&mut said);
                if let Some(device) = said.lines().next()
                    && fuse_device(mountpoint).as_deref() == Some(device)
                    && let Err(e) = detach(mountpoint)
                {
                    eprintln!("tensorfs: auto_unmount of {}: {e}", mountpoint.display());
                }
                std::process::exit(0)
            }
            _ => Ok(Watcher(std::fs::File::from(write_end))),
        }
    }

    /// The mount is live: the watcher unmounts it when this process ends.
    fn watch(&mut self, mountpoint: &Path) {
        match fuse_device(mountpoint) {
            Some(device) => {
                let _ = writeln!(self.0, "{device}");
            }
            None => tracing::warn!("auto_unmount: the mount's device is not found"),
        }
    }
}

/// Opens the dataset, mounts it and serves until unmounted.
pub fn serve(source: &str, mountpoint: &Path, opts: &Options, mut ready: Ready) -> Result<()> {
    raise_open_files_limit();
    let mut watcher = match opts.auto_unmount {
        true => Some(Watcher::start(mountpoint, &ready)?),
        false => None,
    };
    let runtime = runtime(opts.threads)?;
    let mounted = open_for_mount(source, opts, &runtime).and_then(|dataset| {
        let (fs, serve) = dataset.filesystem(opts, runtime.handle().clone())?;
        let fs = Arc::new(fs);
        let metrics = opts.metrics.as_deref().map(Endpoint::bind).transpose()?;
        let passthrough = opts.passthrough == crate::options::Passthrough::Auto;
        let kernel_opens = opts.opens == crate::options::Opens::Kernel;
        let requests = Arc::new(Requests::new(
            fs.clone(),
            serve.clone(),
            passthrough,
            kernel_opens,
        ));
        let adapter = FuseAdapter::new(requests, runtime.handle().clone());
        let session = session(adapter, mountpoint, source, opts)?;
        // At once: a daemon killed from here on leaves no dead mount behind.
        if let Some(w) = &mut watcher {
            w.watch(mountpoint);
        }
        let kernel = Arc::new(crate::kernel::Session::new(session.notifier()));
        serve.store_in(PageCache::new(kernel, mountpoint), kernel_opens);
        if let Some(endpoint) = metrics {
            endpoint.serve(fs.clone());
        }
        Ok((dataset, session, serve))
    });
    let (dataset, mut session, serve) = match mounted {
        Ok(m) => m,
        Err(e) => {
            ready.report(&Err(anyhow!("{}", one_line(&e))));
            return Err(e);
        }
    };
    tracing::info!(
        "mounted {source} on {}: {} rows, {} batches per epoch, {} tensors",
        mountpoint.display(),
        dataset.plan.rows(),
        dataset.plan.batches(),
        dataset.view.tensors.len()
    );
    if let Some(w) = opts.world_size
        && dataset.plan.rank_batches(w) == 0
    {
        // Valid (every batch is in the epoch directories), but rarely what was meant.
        tracing::warn!(
            "the rank views of world_size={w} hold no batch: every partition has fewer than \
             batch_size rows, or the epoch fewer than {w} batches (see `tensorfs inspect`)"
        );
    }
    ready.report(&Ok(()));
    drop(ready);
    unmount_on_signal(&runtime, session.unmount_callable(), mountpoint);
    match session.run() {
        Ok(()) => {}
        // An unmount while requests are in flight (`umount -l`, `fusermount3 -u` under load)
        // ends the connection under them: the kernel answers the session's next read or reply
        // with ECONNABORTED (or ENODEV). That is the end of the mount, not a failure.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::ENODEV)) => {
            tracing::info!("the kernel ended the connection ({e})");
        }
        Err(e) => return Err(anyhow::Error::new(e).context("FUSE session")),
    }
    tracing::info!("unmounted {}", mountpoint.display());
    let sealed = serve.seal_kept();
    if sealed > 0 {
        tracing::info!("{sealed} files built ahead kept for a later mount");
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_secret_values_are_masked() {
        let mut args = b"tensorfs\0s3://test-bucket/test/\0/mnt/test\0-o\0aws_access_key_id=test,aws_secret_access_key=test-secret\0".to_vec();
        let pairs = vec![
            b"aws_access_key_id=test".to_vec(),
            b"aws_secret_access_key=test-secret".to_vec(),
        ];
        mask_values(&mut args, &pairs);
        assert_eq!(
            args,
            b"tensorfs\0s3://test-bucket/test/\0/mnt/test\0-o\0aws_access_key_id=****,aws_secret_access_key=***********\0"
        );
    }
}
