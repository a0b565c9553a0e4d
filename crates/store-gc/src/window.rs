use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use store_types::{Digest, Key, Namespace, Result, StagedCandidate, Timestamp, WindowClauses};

/// The delete window of an instance with no SQL-backed engine (`mem`,
/// `local`): candidates are staged in process memory and executed by the
/// next sweep of the same instance (ADR-012 §5). A restart forgets the
/// staging, which is safe — candidates are simply marked again.
#[derive(Debug, Default)]
pub struct InProcessWindow {
    rows: Mutex<BTreeMap<Key, (u64, Timestamp)>>,
}

impl InProcessWindow {
    /// An empty window.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, (u64, Timestamp)>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl WindowClauses for InProcessWindow {
    async fn stage(&self, candidates: &[StagedCandidate]) -> Result<()> {
        let mut rows = self.rows();
        for c in candidates {
            rows.entry(c.key.clone())
                .or_insert((c.size, c.visible_after));
        }
        Ok(())
    }

    async fn staged_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let rows = self.rows();
        Ok(digests
            .iter()
            .map(|d| rows.contains_key(&Key::new(ns.clone(), *d)))
            .collect())
    }

    async fn take_due(
        &self,
        now: Timestamp,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<StagedCandidate>> {
        let rows = self.rows();
        let iter: Box<dyn Iterator<Item = (&Key, &(u64, Timestamp))>> = match after {
            Some(a) => Box::new(
                rows.range::<Key, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            ),
            None => Box::new(rows.iter()),
        };
        Ok(iter
            .filter(|(_, (_, va))| *va <= now)
            .take(limit)
            .map(|(k, (size, va))| StagedCandidate {
                key: k.clone(),
                size: *size,
                visible_after: *va,
            })
            .collect())
    }

    async fn unstage(&self, keys: &[Key]) -> Result<()> {
        let mut rows = self.rows();
        for k in keys {
            rows.remove(k);
        }
        Ok(())
    }

    async fn staged_count(&self) -> Result<u64> {
        Ok(self.rows().len() as u64)
    }
}
