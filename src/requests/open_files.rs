//! Open files: what each open is read from, and each inode's passthrough mode.
//!
//! The kernel wants one backing file per inode at a time, so the opens of one inode share its
//! passthrough id, which lives as long as the last of them. It also refuses (EIO) to mix modes on
//! one inode: while the inode is open by passthrough every open must be, and while it is open
//! through the page cache none may be. So an open follows the mode its inode is in, whatever its
//! own materialisation gave.
//!
//! Generic over the passthrough id (`B`: fuser's `BackingId` in the adapter), so the rules are
//! tested without a kernel.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What reads of an open file come from: the backing file it was opened on, or the content it
/// was opened with (stats.json: one snapshot per open, so a read never mixes two); neither, for
/// a file the daemon builds from memory.
#[derive(Clone, Default)]
pub(crate) struct ReadFrom {
    pub(crate) file: Option<Arc<File>>,
    pub(crate) snapshot: Option<Arc<Vec<u8>>>,
}

struct Open<B> {
    from: ReadFrom,
    backing: Option<Arc<B>>,
}

struct State<B> {
    open: HashMap<u64, Open<B>>,
    backing: HashMap<u64, Weak<B>>,
    /// Opens of batch files served by the daemon (through the page cache), per inode.
    cached: HashMap<u64, u32>,
}

/// How an open of a batch file is answered.
pub(crate) enum Mode<B> {
    /// Reads go to the backing file, by this id.
    Passthrough(Arc<B>),
    /// Reads come to the daemon; the kernel keeps the pages across opens.
    Cached,
}

pub(crate) struct OpenFiles<B> {
    state: Mutex<State<B>>,
    next_fh: AtomicU64,
}

impl<B> Default for OpenFiles<B> {
    fn default() -> Self {
        OpenFiles {
            state: Mutex::new(State {
                open: HashMap::new(),
                backing: HashMap::new(),
                cached: HashMap::new(),
            }),
            next_fh: AtomicU64::new(1),
        }
    }
}

impl<B> OpenFiles<B> {
    /// A new file handle number.
    pub(crate) fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an open whose reads come from `snapshot`.
    pub(crate) fn open_snapshot(&self, fh: u64, snapshot: Vec<u8>) {
        let from = ReadFrom {
            file: None,
            snapshot: Some(Arc::new(snapshot)),
        };
        let open = Open {
            from,
            backing: None,
        };
        self.state.lock().unwrap().open.insert(fh, open);
    }

    /// Records an open of batch file `ino` as `fh`, materialised as `file` (or not), and says
    /// how it is answered: by passthrough where the inode is in that mode already, or where it
    /// is open in no mode, `passthrough` is allowed and `register` gives `file` an id; else
    /// through the page cache. A failed `register` is returned beside the mode (the open is then
    /// served by the daemon).
    pub(crate) fn open_batch<E>(
        &self,
        ino: u64,
        fh: u64,
        file: Option<Arc<File>>,
        passthrough: bool,
        register: impl FnOnce(&File) -> Result<B, E>,
    ) -> (Mode<B>, Option<E>) {
        let mut s = self.state.lock().unwrap();
        let in_use = s.backing.get(&ino).and_then(Weak::upgrade);
        let cached = s.cached.get(&ino).copied().unwrap_or(0) > 0;
        let mut refused = None;
        let backing = match (&file, in_use) {
            (_, Some(id)) => Some(id),
            (Some(f), None) if !cached && passthrough => match register(f) {
                Ok(id) => {
                    let id = Arc::new(id);
                    s.backing.insert(ino, Arc::downgrade(&id));
                    Some(id)
                }
                Err(e) => {
                    refused = Some(e);
                    None
                }
            },
            _ => None,
        };
        if backing.is_none() {
            *s.cached.entry(ino).or_default() += 1;
        }
        let from = ReadFrom {
            file,
            snapshot: None,
        };
        let open = Open {
            from,
            backing: backing.clone(),
        };
        s.open.insert(fh, open);
        let mode = match backing {
            Some(id) => Mode::Passthrough(id),
            None => Mode::Cached,
        };
        (mode, refused)
    }

    /// Whether inode `ino` is open by no one (so no read of it is under way).
    pub(crate) fn unopened(&self, ino: u64) -> bool {
        let s = self.state.lock().unwrap();
        s.cached.get(&ino).copied().unwrap_or(0) == 0
            && s.backing.get(&ino).and_then(Weak::upgrade).is_none()
    }

    /// What reads of `fh` come from (nothing recorded: the daemon builds them).
    pub(crate) fn read_from(&self, fh: u64) -> ReadFrom {
        let s = self.state.lock().unwrap();
        s.open.get(&fh).map(|o| o.from.clone()).unwrap_or_default()
    }

    /// `fh` of inode `ino` is closed: the inode leaves a mode with its last open.
    pub(crate) fn release(&self, ino: u64, fh: u64) {
        let mut s = self.state.lock().unwrap();
        if let Some(closed) = s.open.remove(&fh)
            && closed.backing.is_none()
            && closed.from.snapshot.is_none()
            && let Some(n) = s.cached.get_mut(&ino)
        {
            *n -= 1;
            if *n == 0 {
                s.cached.remove(&ino);
            }
        }
        if s.backing.get(&ino).is_some_and(|w| w.strong_count() == 0) {
            s.backing.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Option<Arc<File>> {
        Some(Arc::new(tempfile::tempfile().unwrap()))
    }

    fn id(mode: &Mode<u32>) -> Option<u32> {
        match mode {
            Mode::Passthrough(id) => Some(**id),
            Mode::Cached => None,
        }
    }

    #[test]
    fn opens_of_an_inode_share_its_mode_until_the_last_closes() {
        let files: OpenFiles<u32> = OpenFiles::default();
        let mut ids = 0..;
        let mut register = |_: &File| Ok::<u32, ()>(ids.next().unwrap());
        // Materialised, passthrough allowed: by passthrough; a second open shares the id.
        let (a, _) = files.open_batch(7, 1, file(), true, &mut register);
        let (b, _) = files.open_batch(7, 2, file(), true, &mut register);
        assert_eq!((id(&a), id(&b)), (Some(0), Some(0)));
        // Even an open that found nothing materialised follows the inode's mode.
        let (c, _) = files.open_batch(7, 3, None, true, &mut register);
        assert_eq!(id(&c), Some(0));
        drop((a, b, c));
        for fh in 1..=3 {
            files.release(7, fh);
        }
        // Served from memory first: later opens stay cached while it is open.
        let (d, _) = files.open_batch(7, 4, None, true, &mut register);
        let (e, _) = files.open_batch(7, 5, file(), true, &mut register);
        assert!(id(&d).is_none() && id(&e).is_none());
        files.release(7, 4);
        files.release(7, 5);
        // Closed: the next open registers a new id.
        let (f, _) = files.open_batch(7, 6, file(), true, &mut register);
        assert_eq!(id(&f), Some(1));
    }

    #[test]
    fn a_refused_registration_is_served_cached_and_reported() {
        let files: OpenFiles<u32> = OpenFiles::default();
        let (mode, refused) = files.open_batch(3, 1, file(), true, |_| Err("no passthrough"));
        assert!(id(&mode).is_none());
        assert_eq!(refused, Some("no passthrough"));
        let (mode, refused) =
            files.open_batch(4, 2, file(), false, |_| -> Result<u32, ()> { panic!() });
        assert!(id(&mode).is_none() && refused.is_none());
        files.open_snapshot(9, b"{}".to_vec());
        assert_eq!(
            files.read_from(9).snapshot.as_deref(),
            Some(&b"{}".to_vec())
        );
        assert!(files.read_from(10).file.is_none());
    }
}
