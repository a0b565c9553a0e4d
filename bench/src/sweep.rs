//! The sweep benchmark: a mark sweep over `n` fresh, unpinned entries whose
//! liveness source answers "not referenced" for all of them, so the sweep
//! arbitrates and stages every one. Between timed sweeps (untimed) the
//! window is emptied again so each sweep does the full work.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use store_core::{Digest, Key, LivenessSource, Store, SweepOptions};

use crate::data::unique_body;
use crate::fixtures::{err, ns, BenchResult};
use crate::measure::{LocalFut, Workload};

/// Entries per sweep in the suite.
pub const SWEEP_ENTRIES: usize = 100_000;

/// A liveness source that references nothing.
pub struct NothingLive;

#[async_trait]
impl LivenessSource for NothingLive {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
        Ok(vec![false; keys.len()])
    }
}

/// Puts `n` tiny fresh entries into [`ns`] with `concurrency` putters and
/// returns their keys (the receipts' pins are dropped: nothing is pinned).
pub async fn fill(store: &Store, n: usize, concurrency: usize) -> BenchResult<Vec<Key>> {
    fill_ns(store, &ns(), n, 32, concurrency).await
}

/// Puts `n` fresh unique entries of `size` bytes into `ns` with
/// `concurrency` putters; returns their keys (pins dropped).
pub async fn fill_ns(
    store: &Store,
    ns: &store_core::Namespace,
    n: usize,
    size: usize,
    concurrency: usize,
) -> BenchResult<Vec<Key>> {
    let writers = concurrency.max(1);
    let mut tasks = Vec::new();
    for t in 0..writers {
        let (store, ns) = (store.clone(), ns.clone());
        let count = n / writers + usize::from(t < n % writers);
        tasks.push(tokio::spawn(async move {
            let mut keys = Vec::with_capacity(count);
            for _ in 0..count {
                let body = bytes::Bytes::from(unique_body(size));
                let r = store.put_bytes(&ns, body).await.map_err(err)?;
                keys.push(r.key().clone());
            }
            Ok::<_, String>(keys)
        }));
    }
    let mut keys = Vec::with_capacity(n);
    for t in tasks {
        keys.extend(t.await.map_err(err)??);
    }
    Ok(keys)
}

/// The timed mark sweep (one sweep per timed run).
pub struct SweepWork {
    store: Store,
    keys: Vec<Key>,
    staged: bool,
    /// `arbitrated()` of the last sweep.
    pub last_arbitrated: u64,
}

impl SweepWork {
    /// Registers a [`NothingLive`] source for [`ns`] on `store`, whose
    /// entries are `keys`.
    pub async fn new(store: Store, keys: Vec<Key>) -> BenchResult<Self> {
        store
            .gc()
            .register_liveness_source(ns(), Arc::new(NothingLive))
            .await
            .map_err(err)?;
        Ok(SweepWork {
            store,
            keys,
            staged: false,
            last_arbitrated: 0,
        })
    }
}

impl Workload for SweepWork {
    fn reset(&mut self) -> LocalFut<'_> {
        Box::pin(async move {
            if self.staged {
                for chunk in self.keys.chunks(10_000) {
                    self.store
                        .gc()
                        .window()
                        .unstage(chunk)
                        .await
                        .expect("unstage");
                }
                self.staged = false;
            }
        })
    }

    fn run(&mut self, n: u64) -> LocalFut<'_> {
        assert_eq!(n, 1, "one sweep per timed run");
        Box::pin(async move {
            let report = self
                .store
                .gc()
                .sweep(SweepOptions::default())
                .await
                .expect("sweep");
            self.staged = true;
            let want = self.keys.len() as u64;
            assert_eq!(report.aborted, None, "sweep aborted");
            assert_eq!(report.arbitrated(), want, "every entry arbitrated");
            assert_eq!(report.total.staged, want, "every entry staged");
            self.last_arbitrated = report.arbitrated();
        })
    }

    fn max_batch(&self) -> u64 {
        1
    }
}

/// The least work of an in-memory mark sweep: walk the entries in digest
/// order, a page at a time, and insert each into a hash map (the window).
pub struct MemRawSweep {
    entries: BTreeMap<Digest, u64>,
    window: HashMap<Key, u64>,
}

impl MemRawSweep {
    /// Over the digests of `keys`.
    pub fn new(keys: &[Key]) -> Self {
        MemRawSweep {
            entries: keys.iter().map(|k| (k.digest, 32)).collect(),
            window: HashMap::new(),
        }
    }
}

impl Workload for MemRawSweep {
    fn reset(&mut self) -> LocalFut<'_> {
        self.window.clear();
        Box::pin(async {})
    }

    fn run(&mut self, _n: u64) -> LocalFut<'_> {
        let ns = ns();
        let mut after: Option<Digest> = None;
        loop {
            let page: Vec<(Digest, u64)> = match after {
                None => self
                    .entries
                    .iter()
                    .take(1000)
                    .map(|(d, s)| (*d, *s))
                    .collect(),
                Some(a) => self
                    .entries
                    .range((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                    .take(1000)
                    .map(|(d, s)| (*d, *s))
                    .collect(),
            };
            let Some(last) = page.last() else { break };
            after = Some(last.0);
            for (d, s) in page {
                self.window.insert(Key::new(ns.clone(), d), s);
            }
        }
        assert_eq!(self.window.len(), self.entries.len());
        Box::pin(async {})
    }

    fn max_batch(&self) -> u64 {
        1
    }
}

/// The least work of a SQLite mark sweep: page through the entries and
/// insert each page into `gc_window` in one transaction
/// ([`crate::raw::RawSqlite::mark_all`]) over a raw database holding as
/// many entries.
pub struct RawSqliteSweep {
    db: crate::raw::RawSqlite,
    expected: u64,
}

impl RawSqliteSweep {
    /// Fills `db` with `n` tiny entries in [`ns`].
    pub fn new(mut db: crate::raw::RawSqlite, n: usize) -> BenchResult<Self> {
        db.fill(ns().as_str(), n)?;
        Ok(RawSqliteSweep {
            db,
            expected: n as u64,
        })
    }
}

impl Workload for RawSqliteSweep {
    fn reset(&mut self) -> LocalFut<'_> {
        self.db.clear_window().expect("clear window");
        Box::pin(async {})
    }

    fn run(&mut self, _n: u64) -> LocalFut<'_> {
        let staged = self
            .db
            .mark_all(ns().as_str(), SweepOptions::default().batch)
            .expect("raw mark");
        assert_eq!(staged, self.expected);
        Box::pin(async {})
    }

    fn max_batch(&self) -> u64 {
        1
    }
}
