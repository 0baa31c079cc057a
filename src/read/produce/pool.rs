//! The transform workers: `threads` OS threads that decode, transform, gather and write
//! batches, scheduled below everything that serves readers.
//!
//! Beside them, one thread at the daemon's own priority stores the files a reader opens next
//! ([`Pool::serve`]): queued behind the workers' decodes, such a store made the open that waited
//! for it wait for a whole row group's decode (13 ms of a 14 ms open, traced on two cores).
//!
//! While no reader waits, they run as `SCHED_IDLE`: the kernel preempts them the moment a
//! reader (or the FUSE thread answering it) wakes up, so building ahead never delays a read
//! that the prefetcher has already made ready. (At nice 10 a woken reader could still wait for a
//! builder's time slice to run out.) While a reader waits for a build, they are ordinary
//! threads at nice 10, so that other busy processes on the host cannot starve the build the
//! reader needs. Leaving `SCHED_IDLE` needs `CAP_SYS_NICE`; without it they stay at nice 10.

use crate::stats::Stats;
use anyhow::{Result, anyhow};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// How the workers are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// `SCHED_IDLE`: run only when nothing else wants the CPU.
    Idle,
    /// `SCHED_OTHER` at nice [`NICE`].
    Low,
}

/// Niceness of the workers when they are not idle-class: below the threads that serve readers.
const NICE: libc::c_int = 10;

fn set_class(tid: libc::pid_t, class: Class) -> bool {
    let policy = match class {
        Class::Idle => libc::SCHED_IDLE,
        Class::Low => libc::SCHED_OTHER,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; the call only changes the scheduling of `tid`, a
    // thread of this process (0: the calling thread), or fails.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

/// Moves the calling thread to `SCHED_IDLE` (at nice [`NICE`] where that is refused), for a
/// thread that does only work ahead of any reader, to its end.
pub(crate) fn idle_class() {
    lower_own_priority();
    set_class(0, Class::Idle);
}

/// Where a job runs: on the workers (work ahead of any reader, below it), or on the serving
/// thread (what a reader opens next, never behind the workers' queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Workers,
    Serving,
}

/// Readers waiting for a build, and the workers' thread ids.
#[derive(Default)]
struct Waiters {
    count: usize,
    tids: Vec<libc::pid_t>,
}

impl Waiters {
    fn class(&self) -> Class {
        if self.count == 0 {
            Class::Idle
        } else {
            Class::Low
        }
    }
}

pub(crate) struct Pool {
    jobs: Mutex<Sender<Job>>,
    /// Jobs for the serving thread.
    serving: Mutex<Sender<Job>>,
    /// `None`: the workers cannot leave `SCHED_IDLE` again here, so they never enter it.
    waiters: Option<Arc<Mutex<Waiters>>>,
}

/// Lowers the calling thread to nice [`NICE`]; its thread id.
fn lower_own_priority() -> libc::pid_t {
    // SAFETY: gettid has no preconditions; setpriority on our own thread id only lowers its
    // priority, which needs no privilege. Failure leaves it as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
        tid
    }
}

/// Whether this process may move a thread into `SCHED_IDLE` and back out of it.
fn idle_class_reversible() -> bool {
    std::thread::spawn(|| {
        lower_own_priority();
        set_class(0, Class::Idle) && set_class(0, Class::Low)
    })
    .join()
    .unwrap_or(false)
}

impl Pool {
    pub(crate) fn new(threads: usize) -> Result<Pool> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let waiters = idle_class_reversible().then(Arc::<Mutex<Waiters>>::default);
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let waiters = waiters.clone();
            std::thread::Builder::new()
                .name(format!("tensorfs-transform-{i}"))
                .spawn(move || {
                    let tid = lower_own_priority();
                    if let Some(w) = &waiters {
                        let mut w = w.lock().unwrap();
                        set_class(tid, w.class());
                        w.tids.push(tid);
                    }
                    loop {
                        let job = rx.lock().unwrap().recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })?;
        }
        let (serving, serve_jobs) = channel::<Job>();
        std::thread::Builder::new()
            .name("tensorfs-serve".into())
            .spawn(move || {
                for job in serve_jobs {
                    job();
                }
            })?;
        Ok(Pool {
            jobs: Mutex::new(tx),
            serving: Mutex::new(serving),
            waiters,
        })
    }

    /// Runs `f` on the serving thread, nobody waiting for it: the store of files a reader opens
    /// next, which must not wait for the decodes queued for the workers. `f` must not wait for
    /// a job of the serving thread, nor for a decode.
    pub(crate) fn serve(&self, f: impl FnOnce() + Send + 'static) {
        self.ahead(Lane::Serving, f)
    }

    /// Runs `f` in `lane`, nobody waiting for it: work ahead of a reader. `f` must not wait for
    /// a job of that lane (on the serving thread, nor for a decode).
    pub(crate) fn ahead(&self, lane: Lane, f: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(move || {
            if let Err(panic) = crate::catch_panic(f) {
                tracing::error!("a store ahead of its reader failed: {panic}");
            }
        });
        let jobs = match lane {
            Lane::Workers => &self.jobs,
            Lane::Serving => &self.serving,
        };
        // Sent only while the pool is alive: its threads stop with it.
        let _ = jobs.lock().unwrap().send(job);
    }

    /// Runs `f` on a worker; a panic in it is an error for the caller, not a lost worker.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        self.run_in(Lane::Workers, f).await
    }

    /// Runs `f` in `lane`: on a worker ([`Pool::run`]) or on the serving thread
    /// ([`Pool::serve`]); a panic in it is an error for the caller.
    pub(crate) async fn run_in<T: Send + 'static>(
        &self,
        lane: Lane,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let (jobs, who, threads) = match lane {
            Lane::Workers => (&self.jobs, "a decoder", "the transform workers have"),
            Lane::Serving => (&self.serving, "a store", "the serving thread has"),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(crate::catch_panic(f));
        });
        let stopped = || anyhow!("{threads} stopped");
        jobs.lock().unwrap().send(job).map_err(|_| stopped())?;
        rx.await
            .map_err(|_| stopped())?
            .map_err(|panic| anyhow!("{who} failed: {panic}"))
    }

    /// A reader waits for a build until the guard is dropped: the workers leave `SCHED_IDLE`
    /// meanwhile, whatever they are building (the build the reader waits for may be one the
    /// prefetcher started).
    pub(crate) fn reader_waits(&self) -> ReaderWaits<'_> {
        self.adjust(1);
        ReaderWaits(self)
    }

    fn adjust(&self, delta: isize) {
        let Some(w) = &self.waiters else { return };
        let mut w = w.lock().unwrap();
        let before = w.class();
        w.count = w.count.checked_add_signed(delta).expect("balanced waits");
        let after = w.class();
        if after != before {
            for &tid in &w.tids {
                set_class(tid, after);
            }
        }
    }
}

/// See [`Pool::reader_waits`].
#[must_use]
pub(crate) struct ReaderWaits<'a>(&'a Pool);

impl Drop for ReaderWaits<'_> {
    fn drop(&mut self) {
        self.0.adjust(-1);
    }
}

/// A runtime for I/O done ahead of any reader (the fetches of row groups decoded ahead), on
/// threads at nice [`NICE`]. Reading a local source, such a fetch is one large read on a
/// blocking thread; at normal priority it held the CPU that a reader woken meanwhile wanted.
/// Measured on two cores, a reader opening a batch file every 1.7 ms, eight runs each: opens
/// over 1 ms, 4.5 an epoch at normal priority against 2.75 here; the share of the epoch it
/// waited, 6.27% against 6.07% (means).
pub(crate) struct Background(Option<tokio::runtime::Runtime>);

impl Background {
    pub(crate) fn new(threads: usize) -> Result<Background> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(threads + 2)
            .thread_name("tensorfs-ahead")
            .on_thread_start(|| {
                lower_own_priority();
            })
            .enable_all()
            .build()?;
        Ok(Background(Some(runtime)))
    }

    /// Runs `f` on the background runtime; a panic in it is an error for the caller.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let runtime = self.0.as_ref().expect("a runtime until dropped");
        runtime
            .spawn(f)
            .await
            .map_err(|e| anyhow!("work ahead of the readers failed: {e}"))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // The builder may be dropped on an async worker, where blocking on the runtime's
        // threads is not allowed.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// CPU time the calling thread has used, in nanoseconds: a worker's work apart from its waits.
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `f()`, the calling thread's CPU time in it added to `counter` (nanoseconds).
pub(crate) fn cpu_counted<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let started = thread_cpu_ns();
    let out = f();
    Stats::add(counter, thread_cpu_ns().saturating_sub(started));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn jobs_run_and_panics_are_errors() {
        let pool = Pool::new(2).unwrap();
        assert_eq!(pool.run(|| 6 * 7).await.unwrap(), 42);
        let e = pool.run(|| -> u8 { panic!("boom at row 7") }).await;
        assert_eq!(
            e.unwrap_err().to_string(),
            "a decoder failed: boom at row 7"
        );
        // The worker survives its job's panic.
        assert_eq!(pool.run(|| 1).await.unwrap(), 1);
        assert_eq!(pool.run(|| 2).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn stores_never_queue_behind_the_workers_jobs() {
        let pool = Pool::new(2).unwrap();
        // Both workers held, and more jobs queued behind them, as decodes ahead hold them.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        let mut busy = Vec::new();
        for _ in 0..4 {
            let held = held.clone();
            busy.push(pool.run(move || held.lock().unwrap().recv().unwrap()));
        }
        let busy = futures::future::join_all(busy);
        tokio::pin!(busy);
        // A store is run meanwhile (queued behind them, it would wait for ever), and its panic
        // is an error of its own.
        let stored = tokio::time::timeout(
            Duration::from_secs(60),
            pool.run_in(Lane::Serving, || 6 * 7),
        );
        assert_eq!(stored.await.expect("not queued behind").unwrap(), 42);
        let e = pool
            .run_in(Lane::Serving, || -> u8 { panic!("page 3") })
            .await;
        assert_eq!(e.unwrap_err().to_string(), "a store failed: page 3");
        let (tx, rx) = tokio::sync::oneshot::channel();
        pool.serve(move || {
            let _ = tx.send(());
        });
        rx.await.unwrap();
        assert!(
            futures::poll!(busy.as_mut()).is_pending(),
            "the workers are still held"
        );
        for _ in 0..4 {
            release.send(()).unwrap();
        }
        assert!(busy.await.into_iter().all(|r| r.is_ok()));
    }

    /// The scheduling policy and niceness of the calling thread, as the kernel reports them.
    fn own_scheduling() -> (i32, i32) {
        // SAFETY: both calls only read the calling thread's scheduling parameters.
        unsafe {
            (
                libc::sched_getscheduler(0),
                libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t),
            )
        }
    }

    #[tokio::test]
    async fn workers_yield_to_readers_unless_a_reader_waits() {
        let pool = Pool::new(2).unwrap();
        // The class in force, as the workers themselves see it.
        async fn seen(pool: &Pool) -> Vec<(i32, i32)> {
            let mut out = Vec::new();
            for _ in 0..8 {
                out.push(pool.run(own_scheduling).await.unwrap());
            }
            out.sort();
            out.dedup();
            out
        }
        let low = vec![(libc::SCHED_OTHER, NICE)];
        if pool.waiters.is_none() {
            // Without CAP_SYS_NICE: nice 10 throughout.
            assert_eq!(seen(&pool).await, low);
            return;
        }
        assert_eq!(seen(&pool).await, vec![(libc::SCHED_IDLE, NICE)]);
        {
            let _a = pool.reader_waits();
            let _b = pool.reader_waits();
            assert_eq!(seen(&pool).await, low);
            drop(_a);
            assert_eq!(seen(&pool).await, low, "one reader still waits");
        }
        assert_eq!(seen(&pool).await, vec![(libc::SCHED_IDLE, NICE)]);
    }
}
