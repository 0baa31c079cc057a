//! Mapped cache files that cannot kill the daemon.
//!
//! A columns file the daemon has mapped can be truncated under it: by another process, by a
//! disk error, by a full disk. The next access past the file's new end raises SIGBUS, whose
//! default action ends the process, and with it every reader's mount. So each mapping is
//! registered here, and a SIGBUS handler answers a fault inside a registered mapping by
//! mapping zeroed anonymous pages over the whole of it and marking it poisoned: the faulting
//! read goes on, reading zeros, and the code that read it asks [`GuardedMap::poisoned`] before
//! it uses what it read, drops the file and builds the row group again from the source. A
//! fault anywhere else goes to the action that was in place before (the default: the process
//! ends, as it would have).
//!
//! A write in place raises no fault: the mapping shows the new bytes at once. So each mapped
//! file also holds a read lease (`F_SETLEASE`): another process's open of it for writing, or a
//! truncate, waits in the kernel until the lease is given up, and the lease-break signal's
//! handler marks the mapping poisoned before it gives it up. No byte of the file can change
//! before the mark is set, so a read checked after it is a read of the bytes mapped. Where no
//! lease can be had (a filesystem without leases, a file open for writing somewhere), the
//! file's change time and size are compared instead, at each check: a `statx` per row group
//! gathered, which the leases spare (measured: 7% of the daemon's CPU in a cold epoch of
//! 80-byte rows under the default shuffle).
//!
//! The handlers only read and write atomics and call mmap(2) and fcntl(2) (system calls, safe
//! in a signal handler in practice, as every user-space SIGBUS recovery relies on); the
//! registry is a fixed table of slots so that it allocates nothing and takes no lock.

use memmap2::Mmap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// How many mappings can be guarded at once: more than the mappings the builder holds
/// (`cache::mappings_allowed`, half of `vm.max_map_count`'s default). A mapping beyond them is
/// not made: the file is read instead.
const SLOTS: usize = 1 << 15;

struct Slot {
    /// The mapping's first byte; 0 for a free slot, `CLAIMED` while being filled.
    start: AtomicUsize,
    len: AtomicUsize,
    poisoned: AtomicBool,
    /// The descriptor holding the file's read lease; -1 where none.
    leased_fd: AtomicI32,
}

const CLAIMED: usize = usize::MAX;

static REGISTRY: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        poisoned: AtomicBool::new(false),
        leased_fd: AtomicI32::new(-1),
    }
}; SLOTS];

static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS action before ours, for faults outside the mappings guarded; set once, before
/// ours is installed.
static PREVIOUS: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();
/// Whether the handler is installed: without it nothing is mapped.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The signal a lease break sends (set with `F_SETSIG`, so that it says which descriptor); 0
/// where its handler could not be installed, and no lease is taken.
static LEASE_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// `fcntl`'s command that names the signal a descriptor's lease break sends (Linux's value;
/// the libc crate names it for few targets).
const F_SETSIG: libc::c_int = 10;

/// A read-only mapping of a cache file, guarded against the file changing under it.
pub(crate) struct GuardedMap {
    map: Mmap,
    slot: usize,
    /// The file, and (where it holds no lease) its change time and size when mapped: a write
    /// in place (which a mapping shows at once, and no fault reveals) changes them.
    file: std::fs::File,
    stamp: Option<(i64, i64, u64)>,
    /// Whether the file holds a read lease: then no change escapes the poisoned mark, and the
    /// stamp is neither taken nor compared.
    leased: bool,
}

fn stamp(file: &std::fs::File) -> Option<(i64, i64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    Some((m.ctime(), m.ctime_nsec(), m.size()))
}

impl GuardedMap {
    /// Guards `map`; `None` where no slot is free or no handler could be installed (the
    /// caller then reads the file instead).
    pub(crate) fn new(map: Mmap, file: std::fs::File) -> Option<GuardedMap> {
        install();
        if !INSTALLED.load(Ordering::Acquire) || map.is_empty() {
            return None;
        }
        let slot = (0..SLOTS).find(|&i| {
            REGISTRY[i]
                .start
                .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let s = &REGISTRY[slot];
        s.len.store(map.len(), Ordering::Release);
        s.poisoned.store(false, Ordering::Release);
        s.start.store(map.as_ptr() as usize, Ordering::Release);
        let leased = lease(slot, &file);
        let stamp = if leased { None } else { stamp(&file) };
        Some(GuardedMap {
            map,
            slot,
            file,
            stamp,
            leased,
        })
    }

    /// Whether the file changed since it was mapped (truncated, written in place, removed):
    /// its bytes read since may be zeros or another file's, not those checked. Asked after a
    /// read, it covers every change the read could have seen.
    pub(crate) fn poisoned(&self) -> bool {
        REGISTRY[self.slot].poisoned.load(Ordering::Acquire)
            || (!self.leased && stamp(&self.file) != self.stamp)
    }
}

/// Takes a read lease on `file`, mapped in `slot`, whose break the handler answers; whether
/// it holds one. The slot names the descriptor first, so that a break at once finds it.
fn lease(slot: usize, file: &std::fs::File) -> bool {
    let signal = LEASE_SIGNAL.load(Ordering::Acquire);
    if signal == 0 {
        return false;
    }
    let fd = file.as_raw_fd();
    let s = &REGISTRY[slot];
    s.leased_fd.store(fd, Ordering::Release);
    // SAFETY: fcntl on a descriptor this mapping owns, with integer arguments.
    let leased = unsafe {
        libc::fcntl(fd, F_SETSIG, signal) == 0
            && libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) == 0
    };
    if !leased {
        s.leased_fd.store(-1, Ordering::Release);
    }
    leased
}

impl std::ops::Deref for GuardedMap {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Out of the registry before the mapping goes (the field drops after this): the handler
        // must never map over an address range that is no longer this mapping's.
        let s = &REGISTRY[self.slot];
        // The descriptor (closed as the field drops, which gives up its lease) is no longer
        // the slot's: a break of it then finds no slot, and waits the moment until the close.
        s.leased_fd.store(-1, Ordering::Release);
        s.poisoned.store(false, Ordering::Release);
        s.start.store(0, Ordering::Release);
    }
}

fn install() {
    if PREVIOUS.get().is_some() {
        return;
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sysconf and sigaction are called with valid arguments; PREVIOUS is set
        // before the handler that reads it is installed.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Release);
            }
            let mut previous: libc::sigaction = std::mem::zeroed();
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return;
            }
            let _ = PREVIOUS.set(previous);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
            // The lease break's signal: a real-time one that nothing else of the daemon's
            // uses, restarting what it interrupts (a thread of ours may be the one whose open
            // broke the lease).
            let signal = libc::SIGRTMIN() + 3;
            let mut on_break: libc::sigaction = std::mem::zeroed();
            on_break.sa_sigaction = on_lease_break as *const () as usize;
            on_break.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
            libc::sigemptyset(&mut on_break.sa_mask);
            if libc::sigaction(signal, &on_break, std::ptr::null_mut()) == 0 {
                LEASE_SIGNAL.store(signal, Ordering::Release);
            }
        }
    });
}

/// The part of a `SIGIO`-kind siginfo that names the descriptor (Linux's layout on 64-bit
/// targets: the three ints, padding, then `si_band` and `si_fd`); the libc crate has no
/// accessor for it.
#[repr(C)]
struct SigPollInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    band: libc::c_long,
    fd: libc::c_int,
}
const _: () = assert!(
    std::mem::offset_of!(SigPollInfo, fd) == 24,
    "Linux's 64-bit siginfo"
);

/// A lease of a mapped file is being broken (another open for writing, a truncate, both of
/// which wait for it): the file's mappings are marked poisoned, then the lease is given up,
/// so that the change comes after the mark. A descriptor no slot names is left alone: its
/// lease goes with its close, under way.
extern "C" fn on_lease_break(_sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo of the SIGIO kind for a signal set by F_SETSIG.
    let fd = unsafe { (*(info as *const SigPollInfo)).fd };
    let mut found = false;
    for s in REGISTRY.iter() {
        if s.leased_fd.load(Ordering::Acquire) == fd {
            s.poisoned.store(true, Ordering::Release);
            found = true;
        }
    }
    if found {
        // SAFETY: fcntl with integer arguments; on a descriptor closed meanwhile it fails.
        unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in REGISTRY.iter() {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || start == CLAIMED {
            continue;
        }
        let len = s.len.load(Ordering::Acquire);
        if addr < start || addr >= start + len {
            continue;
        }
        let page = PAGE.load(Ordering::Acquire);
        let whole = len.div_ceil(page) * page;
        // SAFETY: [start, start + whole) is a live read-only mapping of ours (registered, and
        // unregistered before it is unmapped); zeroed anonymous pages replace it in place.
        let mapped = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                whole,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            s.poisoned.store(true, Ordering::Release);
            return;
        }
        break;
    }
    // Not a mapping of ours (or it could not be replaced): what would have happened without us.
    // SAFETY: PREVIOUS was set before this handler was installed and is never written again;
    // a handler it names takes these arguments.
    unsafe {
        let Some(previous) = PREVIOUS.get().copied() else {
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
            return;
        };
        let handler = previous.sa_sigaction;
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // Restored, then the fault happens again as the instruction is retried.
            libc::sigaction(libc::SIGBUS, &previous, std::ptr::null_mut());
        } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, context);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Both tests break leases and fault: one at a time, so that neither sees the other's.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_mapped_file_truncated_under_its_mapping_reads_as_zeros_and_says_so() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cols");
        let page = PAGE.load(Ordering::Acquire).max(4096);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 4 * page]).unwrap();
        drop(f);
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a file of this test's own.
        let map = GuardedMap::new(unsafe { Mmap::map(&file) }.unwrap(), file).expect("guarded");
        assert_eq!(map[3 * page], 7);
        assert!(!map.poisoned());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(page as u64)
            .unwrap();
        // Past the new end: SIGBUS, answered with zeros.
        let past = std::hint::black_box(&map[..])[3 * page + 1];
        assert_eq!(past, 0);
        assert!(map.poisoned());
    }

    #[test]
    fn a_mapped_file_written_in_place_says_so_before_the_write_lands() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cols");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a file of this test's own.
        let map = GuardedMap::new(unsafe { Mmap::map(&file) }.unwrap(), file).expect("guarded");
        assert!(map.leased, "a local file takes a read lease");
        assert!(!map.poisoned());
        // The same size, the same bytes but one: no fault reveals it. The open for writing
        // waits for the lease, which the handler gives up once the mapping is marked.
        let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(
            map.poisoned(),
            "marked before the open for writing returned"
        );
        use std::io::{Seek, SeekFrom};
        w.seek(SeekFrom::Start(100)).unwrap();
        w.write_all(&[9]).unwrap();
        assert_eq!(map[100], 9);
        assert!(map.poisoned());
        drop(map);
        // A file open for writing takes no lease: the stamp is compared instead.
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: as above.
        let map = GuardedMap::new(unsafe { Mmap::map(&file) }.unwrap(), file).expect("guarded");
        assert!(!map.leased);
        assert!(!map.poisoned());
        w.seek(SeekFrom::Start(8192)).unwrap();
        w.write_all(&[9]).unwrap();
        assert!(map.poisoned(), "the write changed the file's size");
    }
}
