//! Mounting and unmounting the FUSE session: the mount point checked, mount(2) with the type
//! `fuse.tensorfs` where this process may (else fuser through fusermount3), the session's
//! configuration, and the unmount a signal or the last close ends it with.

use crate::kernel::fuse::FuseAdapter;
use crate::options::Options;
use anyhow::{Context, Result, anyhow, bail};
use fuser::{Config, MountOption, SessionACL};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Whether a FUSE filesystem is mounted on `mountpoint`.
pub(crate) fn fuse_mounted_on(mountpoint: &Path) -> bool {
    fuse_device(mountpoint).is_some()
}

/// The device (`major:minor`) of the FUSE filesystem mounted on `mountpoint`, from
/// /proc/self/mountinfo, which asks nothing of the mount itself. (fuser's own mount calls the
/// type plain `fuse`; through fusermount3 it is `fuse.tensorfs`.)
pub(crate) fn fuse_device(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        let here = fields.get(4).map(|p| unescape_mountinfo(p))
            == Some(mountpoint.to_string_lossy().into_owned());
        let fuse = (fields.get(sep + 1)).is_some_and(|t| *t == "fuse" || t.starts_with("fuse."));
        (here && fuse).then(|| fields.get(2).map(|d| d.to_string()))?
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks the mount point before any work: a directory without a FUSE mount on it, and empty
/// unless `nonempty` (a mount over files would hide them).
pub fn check_mountpoint(mountpoint: &str, nonempty: bool) -> Result<PathBuf> {
    // ECONNABORTED: a look that was waiting when the dead daemon's connection was aborted (its
    // last thread still exiting as this mount began).
    let unusable = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOTCONN | libc::ECONNABORTED) => anyhow!(
            "mount point '{mountpoint}' is a FUSE mount whose daemon has died; unmount it first (umount {mountpoint})"
        ),
        _ => anyhow!("mount point '{mountpoint}' cannot be used: {e}"),
    };
    let path = std::fs::canonicalize(mountpoint).map_err(unusable)?;
    if !std::fs::metadata(&path).map_err(unusable)?.is_dir() {
        bail!("mount point '{mountpoint}' is not a directory");
    }
    if fuse_mounted_on(&path) {
        bail!("mount point '{mountpoint}' already has a FUSE mount; unmount it first");
    }
    if !nonempty && std::fs::read_dir(&path).map_err(unusable)?.next().is_some() {
        bail!(
            "mount point '{mountpoint}' is not empty: mounting would hide its files; empty it, or mount over it with -o nonempty"
        );
    }
    Ok(path)
}

/// Lazy unmount (`umount -l`): the mount point is free at once, open files keep working.
pub(crate) fn detach(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?;
    // SAFETY: c is a valid C string naming our own mount point.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    // Without the privilege for umount2, fusermount3 does it for the mount's owner.
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("fusermount3 -u -z failed"))
    }
}

/// How the kernel is asked to mount: read-only, the source as the device name (absolute for a
/// local path, as `findmnt` shows it), type `fuse.tensorfs`.
fn fuse_config(source: &str, opts: &Options) -> Config {
    let mount_options = vec![
        MountOption::FSName(device_name(source)),
        MountOption::Subtype("tensorfs".into()),
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
    ];
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = match opts.allow_other {
        true => SessionACL::All,
        false => SessionACL::Owner,
    };
    config.n_threads = Some(fuse_threads());
    config.clone_fd = true;
    config
}

/// Threads reading FUSE requests: one per four cores, one to four. They only answer what is
/// known at once (lookups, attributes, listings, opens of checked files) and hand everything
/// else to the async workers, so a few keep up with many readers. More than a host needs
/// cost wake-ups: the kernel wakes its waiting threads in turn, each cold. Measured on two
/// cores, a reader opening a batch file every 1.7 ms: one thread against four, its opens took
/// 68–72 against 87–102 ms per 976, and it waited on reads for 5.9–6.2% of the epoch against
/// 7.0–8.1%; warm reads by 1, 4 and 8 readers at once were as fast.
fn fuse_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 4)
}

/// The device name a mount shows (`findmnt`'s SOURCE): the source, absolute for a local path.
fn device_name(source: &str) -> String {
    match std::fs::canonicalize(source) {
        Ok(abs) if !source.contains("://") => abs.display().to_string(),
        _ => source.to_string(),
    }
}

/// Mounts by mount(2) with the type `fuse.tensorfs` (fuser's own mount calls every filesystem
/// plain `fuse`), returning the `/dev/fuse` descriptor the session serves. `None` where the
/// process may not call mount(2) (not root): fuser then mounts through fusermount3.
fn mount_typed(mountpoint: &Path, source: &str, opts: &Options) -> Result<Option<OwnedFd>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("/dev/fuse cannot be opened")?;
    let root_mode = std::fs::metadata(mountpoint)?.mode();
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid},default_permissions",
        dev.as_raw_fd()
    );
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let c = |s: &[u8]| std::ffi::CString::new(s).context("a name holds a NUL byte");
    let (src, target) = (
        c(device_name(source).as_bytes())?,
        c(mountpoint.as_os_str().as_bytes())?,
    );
    let (fstype, data) = (c(b"fuse.tensorfs")?, c(data.as_bytes())?);
    let flags = libc::MS_NODEV | libc::MS_NOSUID | libc::MS_RDONLY;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        return Ok(Some(OwnedFd::from(dev)));
    }
    match std::io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::EPERM) => Ok(None),
        e => Err(anyhow!("cannot mount on '{}': {e}", mountpoint.display())),
    }
}

/// The FUSE session on `mountpoint`: mounted here with its own type where this process may,
/// else by fuser (through fusermount3).
pub(crate) fn session(
    adapter: FuseAdapter,
    mountpoint: &Path,
    source: &str,
    opts: &Options,
) -> Result<fuser::Session<FuseAdapter>> {
    let config = fuse_config(source, opts);
    if let Some(fd) = mount_typed(mountpoint, source, opts)? {
        let acl = config.acl;
        return fuser::Session::from_fd(adapter, fd, acl, config).map_err(|e| {
            let _ = detach(mountpoint);
            anyhow!("cannot mount on '{}': {e}", mountpoint.display())
        });
    }
    fuser::Session::new(adapter, mountpoint, &config)
        .map_err(|e| anyhow!("cannot mount on '{}': {e}", mountpoint.display()))
}

/// Unmounts `mountpoint`: at once where nothing is open, else detached (the session ends with
/// the last close).
fn unmount(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?;
    // SAFETY: c is a valid C string naming our own mount point.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    tracing::info!(
        "unmount: {}; detaching the mount instead",
        std::io::Error::last_os_error()
    );
    detach(mountpoint)
}

/// SIGTERM and SIGINT unmount cleanly; the session then ends by itself. With files still
/// open, the mount is detached instead, and the session ends with the last close.
pub(crate) fn unmount_on_signal(
    runtime: &tokio::runtime::Runtime,
    mut unmounter: fuser::SessionUnmounter,
    mountpoint: &Path,
) {
    let detach_path = mountpoint.to_path_buf();
    runtime.spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received: unmounting");
        // A session fuser mounted is unmounted by fuser (through fusermount3 where it must);
        // one mounted here, by umount2.
        let done = match unmounter.unmount() {
            Ok(()) if fuse_mounted_on(&detach_path) => unmount(&detach_path),
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::info!("unmount: {e}; detaching the mount instead");
                detach(&detach_path)
            }
        };
        if let Err(e) = done {
            tracing::error!("unmounting failed: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
    }
}
