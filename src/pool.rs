//! The transform workers: `threads` OS threads at a lower CPU priority (nice 10) that decode,
//! transform, gather and write batches. Readers' requests are answered on other threads (FUSE,
//! async I/O) that the kernel then schedules first, so building ahead never makes a reader
//! wait for a CPU.

use anyhow::{Result, anyhow};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

pub struct Pool {
    jobs: Mutex<Sender<Job>>,
}

/// Niceness of the workers: below the threads that serve readers.
const NICE: libc::c_int = 10;

impl Pool {
    pub fn new(threads: usize) -> Result<Pool> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("tensorfs-transform-{i}"))
                .spawn(move || {
                    // SAFETY: gettid has no preconditions; setpriority on our own thread id only
                    // lowers its priority, which needs no privilege. Failure leaves it as it was.
                    unsafe {
                        let tid = libc::gettid() as libc::id_t;
                        libc::setpriority(libc::PRIO_PROCESS, tid, NICE);
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
        Ok(Pool {
            jobs: Mutex::new(tx),
        })
    }

    /// Runs `f` on a worker; a panic in it is an error for the caller, not a lost worker.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            if let Some(v) = crate::catch_panic(f) {
                let _ = tx.send(v);
            } else {
                tracing::error!("a transform worker's job panicked");
            }
        });
        self.jobs
            .lock()
            .unwrap()
            .send(job)
            .map_err(|_| anyhow!("the transform workers have stopped"))?;
        rx.await
            .map_err(|_| anyhow!("a transform job failed (see the log)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_and_panics_are_errors() {
        let pool = Pool::new(2).unwrap();
        assert_eq!(pool.run(|| 6 * 7).await.unwrap(), 42);
        assert!(pool.run(|| -> u8 { panic!("boom") }).await.is_err());
        // The worker survives its job's panic.
        assert_eq!(pool.run(|| 1).await.unwrap(), 1);
        assert_eq!(pool.run(|| 2).await.unwrap(), 2);
    }
}
