//! A byte-bounded LRU cache in front of single-flight builds ([`Memo`]): what the builder
//! keeps its decoded row groups, batches and single tensors in, each built once however many
//! callers want it at once, within its share of `memory_limit`.

use anyhow::Result;
use lru::LruCache;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// Something whose memory a cache counts.
pub(crate) trait Weighted {
    fn weight(&self) -> usize;

    /// Whether it holds a mapped file (see [`Memo::with_max_mappings`]).
    fn is_mapping(&self) -> bool {
        false
    }
}

struct MemoState<K, V> {
    cache: LruCache<K, Arc<V>>,
    bytes: usize,
    mappings: usize,
    flights: HashMap<K, Arc<OnceCell<Arc<V>>>>,
    /// Keys being built on a thread that does not wait ([`Memo::build_here`]): a caller of
    /// [`Memo::get_or_build`] waits for that build rather than making its own.
    here: HashMap<K, Arc<tokio::sync::Notify>>,
}

impl<K: Hash + Eq, V> MemoState<K, V> {
    /// Whether `key` is being built, by [`Memo::get_or_build`] or under a claim.
    fn building(&self, key: &K) -> bool {
        self.flights.contains_key(key) || self.here.contains_key(key)
    }
}

/// A byte-bounded LRU cache in front of single-flight builds: concurrent callers for one key
/// share one build.
pub(crate) struct Memo<K, V> {
    capacity: usize,
    /// At most this many values held that are mappings, whatever they weigh.
    max_mappings: usize,
    state: Mutex<MemoState<K, V>>,
}

impl<K: Hash + Eq + Clone, V: Weighted> Memo<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_max_mappings(capacity, usize::MAX)
    }

    /// Holding at most `max_mappings` values that are mapped files: their pages are the page
    /// cache's, left out of their weight, but each is a mapping, which a process has only so
    /// many of.
    pub(crate) fn with_max_mappings(capacity: usize, max_mappings: usize) -> Self {
        Memo {
            capacity,
            max_mappings,
            state: Mutex::new(MemoState {
                cache: LruCache::unbounded(),
                bytes: 0,
                mappings: 0,
                flights: HashMap::new(),
                here: HashMap::new(),
            }),
        }
    }

    pub(crate) async fn get_or_build<F>(&self, key: K, build: F) -> Result<Arc<V>>
    where
        F: Future<Output = Result<Arc<V>>>,
    {
        let cell = loop {
            let building_here = {
                let mut s = self.state.lock().unwrap();
                if let Some(v) = s.cache.get(&key) {
                    return Ok(v.clone());
                }
                match s.here.get(&key) {
                    Some(done) => done.clone(),
                    None => break s.flights.entry(key.clone()).or_default().clone(),
                }
            };
            // Registered before looking again, so the build's end is not missed; waited for
            // only while that same build is under way (one that ended meanwhile may have been
            // followed by another claim of the key, whose end this would never hear of).
            let done = building_here.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let same_build = (self.state.lock().unwrap().here.get(&key))
                .is_some_and(|now| Arc::ptr_eq(now, &building_here));
            if same_build {
                done.await;
            }
        };
        let value = cell.get_or_try_init(|| build).await?.clone();
        let mut s = self.state.lock().unwrap();
        if s.flights.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            s.flights.remove(&key);
            self.keep(&mut s, key, value.clone());
        }
        Ok(value)
    }

    /// The value of `key`, held, or built by `build` on the calling thread (which does not
    /// wait: a worker's) and held; callers of [`Memo::get_or_build`] meanwhile wait for it.
    /// `None` where `build` gives nothing, or another build of `key` is under way.
    pub(crate) fn build_here(
        &self,
        key: K,
        build: impl FnOnce() -> Option<Arc<V>>,
    ) -> Option<Arc<V>> {
        if let Some(v) = self.get(&key) {
            return Some(v);
        }
        let claimed = self.claim([key.clone()]);
        if claimed.keys().is_empty() {
            return None;
        }
        let value = build();
        claimed.end([value.clone()]);
        value
    }

    /// Claims the keys of `keys` that are neither held nor being built, for a build the caller
    /// makes of them all at once: callers of [`Memo::get_or_build`] wait for it rather than
    /// building their own. Each is ended by [`Claimed::end`], or unbuilt as the claim drops.
    pub(crate) fn claim(&self, keys: impl IntoIterator<Item = K>) -> Claimed<'_, K, V> {
        let mut s = self.state.lock().unwrap();
        let mut claimed = Vec::new();
        for key in keys {
            if s.cache.contains(&key) || s.building(&key) {
                continue;
            }
            s.here.insert(key.clone(), Arc::default());
            claimed.push(key);
        }
        Claimed {
            memo: self,
            keys: claimed,
        }
    }

    /// Ends the claim of `key`: holds `value` where there is one, and wakes whoever waits.
    fn end_claim(&self, key: K, value: Option<Arc<V>>) {
        let mut s = self.state.lock().unwrap();
        let done = s.here.remove(&key);
        if let Some(v) = value {
            self.keep(&mut s, key, v);
        }
        drop(s);
        if let Some(done) = done {
            done.notify_waiters();
        }
    }

    fn keep(&self, s: &mut MemoState<K, V>, key: K, value: Arc<V>) {
        let w = value.weight();
        if w > self.capacity {
            return;
        }
        s.bytes += w;
        s.mappings += usize::from(value.is_mapping());
        if let Some(old) = s.cache.put(key, value) {
            s.bytes -= old.weight();
            s.mappings -= usize::from(old.is_mapping());
        }
        while s.bytes > self.capacity || s.mappings > self.max_mappings {
            let Some((_, old)) = s.cache.pop_lru() else {
                break;
            };
            s.bytes -= old.weight();
            s.mappings -= usize::from(old.is_mapping());
        }
    }

    /// Forgets the value of `key`, if held: the next ask builds it again.
    pub(crate) fn remove(&self, key: &K) {
        let mut s = self.state.lock().unwrap();
        if let Some(old) = s.cache.pop(key) {
            s.bytes -= old.weight();
            s.mappings -= usize::from(old.is_mapping());
        }
    }

    /// The value of `key` if it is held now, without building it.
    pub(crate) fn get(&self, key: &K) -> Option<Arc<V>> {
        self.state.lock().unwrap().cache.get(key).cloned()
    }

    /// Whether `key` is held now (then used, as a [`Memo::get`] would) or being built.
    pub(crate) fn held_or_under_way(&self, key: &K) -> bool {
        let mut s = self.state.lock().unwrap();
        s.cache.get(key).is_some() || s.building(key)
    }

    /// Whether `key` is held now (its place in the LRU order unchanged).
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.state.lock().unwrap().cache.contains(key)
    }

    /// The bytes it may hold.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by the cache.
    pub(crate) fn bytes(&self) -> usize {
        self.state.lock().unwrap().bytes
    }
}

/// Keys of a [`Memo`] claimed for one build ([`Memo::claim`]).
pub(crate) struct Claimed<'a, K: Hash + Eq + Clone, V: Weighted> {
    memo: &'a Memo<K, V>,
    keys: Vec<K>,
}

impl<K: Hash + Eq + Clone, V: Weighted> Claimed<'_, K, V> {
    /// The keys claimed, in the order asked for.
    pub(crate) fn keys(&self) -> &[K] {
        &self.keys
    }

    /// Ends every claim, the keys in order with `values`, held where there is one.
    pub(crate) fn end(mut self, values: impl IntoIterator<Item = Option<Arc<V>>>) {
        let keys = std::mem::take(&mut self.keys);
        let mut values = values.into_iter();
        for key in keys {
            self.memo.end_claim(key, values.next().flatten());
        }
    }
}

impl<K: Hash + Eq + Clone, V: Weighted> Drop for Claimed<'_, K, V> {
    /// A build that failed or was dropped: its keys are left unbuilt, and their waiters build
    /// their own.
    fn drop(&mut self) {
        for key in std::mem::take(&mut self.keys) {
            self.memo.end_claim(key, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Blob(usize);
    impl Weighted for Blob {
        fn weight(&self) -> usize {
            self.0
        }
    }

    /// Weighs nothing; a mapping or not.
    struct Mapping(bool);
    impl Weighted for Mapping {
        fn weight(&self) -> usize {
            0
        }
        fn is_mapping(&self) -> bool {
            self.0
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_callers_share_one_build() {
        let memo: Arc<Memo<u32, Blob>> = Arc::new(Memo::new(1000));
        let builds = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let memo = memo.clone();
                let builds = builds.clone();
                tokio::spawn(async move {
                    memo.get_or_build(7, async {
                        builds.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok(Arc::new(Blob(10)))
                    })
                    .await
                    .unwrap()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().0, 10);
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn callers_wait_for_a_build_on_a_worker_thread() {
        let memo: Arc<Memo<u32, Blob>> = Arc::new(Memo::new(1000));
        let builds = Arc::new(AtomicUsize::new(0));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let worker = {
            let (memo, builds) = (memo.clone(), builds.clone());
            std::thread::spawn(move || {
                memo.build_here(7, || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    Some(Arc::new(Blob(10)))
                })
            })
        };
        started_rx.recv().unwrap();
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (memo, builds) = (memo.clone(), builds.clone());
                tokio::spawn(async move {
                    memo.get_or_build(7, async {
                        builds.fetch_add(1, Ordering::SeqCst);
                        Ok(Arc::new(Blob(20)))
                    })
                    .await
                    .unwrap()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().0, 10);
        }
        assert_eq!(worker.join().unwrap().unwrap().0, 10);
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        // A build under way elsewhere is not made again here.
        assert!(memo.build_here(8, || Some(Arc::new(Blob(1)))).is_some());
        assert_eq!(memo.build_here(9, || None).map(|b| b.0), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn held_or_under_way_counts_held_keys_as_used_and_sees_builds_of_both_kinds() {
        let memo: Arc<Memo<u32, Blob>> = Arc::new(Memo::new(60));
        for k in [1, 2] {
            memo.get_or_build(k, async { Ok(Arc::new(Blob(30))) })
                .await
                .unwrap();
        }
        assert!(!memo.held_or_under_way(&3));
        // Asked about, 1 is the most recently used: 3 evicts 2.
        assert!(memo.held_or_under_way(&1));
        memo.get_or_build(3, async { Ok(Arc::new(Blob(30))) })
            .await
            .unwrap();
        assert!(memo.contains(&1) && !memo.contains(&2));
        // An async build under way, and one on a worker thread.
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let (building, built_from) = tokio::sync::oneshot::channel::<()>();
        let async_build = {
            let memo = memo.clone();
            tokio::spawn(async move {
                memo.get_or_build(4, async {
                    building.send(()).unwrap();
                    wait.await.unwrap();
                    Ok(Arc::new(Blob(1)))
                })
                .await
            })
        };
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let worker = {
            let memo = memo.clone();
            std::thread::spawn(move || {
                memo.build_here(5, || {
                    started_tx.send(()).unwrap();
                    finish_rx.recv().unwrap();
                    Some(Arc::new(Blob(1)))
                })
            })
        };
        started_rx.recv().unwrap();
        built_from.await.unwrap();
        assert!(memo.held_or_under_way(&4) && memo.held_or_under_way(&5));
        assert!(
            !memo.contains(&4) && !memo.contains(&5),
            "neither is held yet"
        );
        release.send(()).unwrap();
        finish_tx.send(()).unwrap();
        async_build.await.unwrap().unwrap();
        worker.join().unwrap().unwrap();
        assert!(memo.held_or_under_way(&4) && memo.held_or_under_way(&5));
    }

    #[tokio::test]
    async fn the_cache_stays_within_its_capacity() {
        let memo: Memo<u32, Blob> = Memo::new(100);
        for k in 0..50 {
            memo.get_or_build(k, async { Ok(Arc::new(Blob(30))) })
                .await
                .unwrap();
            assert!(memo.bytes() <= 100);
        }
        assert_eq!(memo.bytes(), 90);
        // Too large to keep: served, not cached.
        memo.get_or_build(99, async { Ok(Arc::new(Blob(500))) })
            .await
            .unwrap();
        assert!(memo.bytes() <= 100);
    }

    #[tokio::test]
    async fn mappings_are_held_up_to_their_limit() {
        let memo: Memo<u32, Mapping> = Memo::with_max_mappings(100, 3);
        for k in 0..30 {
            let mapped = k < 5;
            memo.get_or_build(k, async move { Ok(Arc::new(Mapping(mapped))) })
                .await
                .unwrap();
        }
        // The last three mappings, and every value that is none.
        let held: Vec<u32> = (0..30).filter(|k| memo.contains(k)).collect();
        assert_eq!(held, (2..30).collect::<Vec<u32>>());
    }

    #[tokio::test]
    async fn a_failed_build_is_retried_by_the_next_caller() {
        let memo: Memo<u32, Blob> = Memo::new(100);
        assert!(
            memo.get_or_build(1, async { anyhow::bail!("boom") })
                .await
                .is_err()
        );
        assert_eq!(
            memo.get_or_build(1, async { Ok(Arc::new(Blob(1))) })
                .await
                .unwrap()
                .0,
            1
        );
    }
}
