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
//! The handler only reads atomics and calls mmap(2) (a system call, safe in a signal handler
//! in practice, as every user-space SIGBUS recovery relies on); the registry is a fixed table
//! of slots so that it allocates nothing and takes no lock.

use memmap2::Mmap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How many mappings can be guarded at once: more than the mappings the builder holds
/// (`cache::mappings_allowed`, half of `vm.max_map_count`'s default). A mapping beyond them is
/// not made: the file is read instead.
const SLOTS: usize = 1 << 15;

struct Slot {
    /// The mapping's first byte; 0 for a free slot, `CLAIMED` while being filled.
    start: AtomicUsize,
    len: AtomicUsize,
    poisoned: AtomicBool,
}

const CLAIMED: usize = usize::MAX;

static REGISTRY: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        poisoned: AtomicBool::new(false),
    }
}; SLOTS];

static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS action before ours, for faults outside the mappings guarded; set once, before
/// ours is installed.
static PREVIOUS: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();
/// Whether the handler is installed: without it nothing is mapped.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A read-only mapping of a cache file, guarded against the file changing under it.
pub(crate) struct GuardedMap {
    map: Mmap,
    slot: usize,
    /// The file, and its change time and size when mapped: a write in place (which a mapping
    /// shows at once, and no fault reveals) changes them.
    file: std::fs::File,
    stamp: Option<(i64, i64, u64)>,
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
        let stamp = stamp(&file);
        Some(GuardedMap {
            map,
            slot,
            file,
            stamp,
        })
    }

    /// Whether the file changed since it was mapped (truncated, written in place, removed):
    /// its bytes read since may be zeros or another file's, not those checked. Asked after a
    /// read, it covers every change the read could have seen.
    pub(crate) fn poisoned(&self) -> bool {
        REGISTRY[self.slot].poisoned.load(Ordering::Acquire) || stamp(&self.file) != self.stamp
    }
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
        }
    });
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

    #[test]
    fn a_mapped_file_truncated_under_its_mapping_reads_as_zeros_and_says_so() {
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
        // The slot is freed with the mapping, and found again.
        let slot = map.slot;
        drop(map);
        assert_eq!(REGISTRY[slot].start.load(Ordering::Acquire), 0);
    }
}
