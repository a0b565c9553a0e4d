//! The [`Engine`], [`KvEngine`] and [`LargeEngine`] implementations.

use std::ops::Bound;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{
    Capabilities, Digest, Engine, EntryMeta, Instance, Key, KvEngine, LargeEngine, Namespace,
    PublishOutcome, ReadOptions, RefStore, Result, Sharing, SizedRead, Stage,
};

use crate::{MemEngine, MemStage};

impl MemEngine {
    /// The content of `key`, if present (a cheap handle clone).
    fn get(&self, key: &Key) -> Option<Bytes> {
        self.read_tables()
            .get(&key.namespace)
            .and_then(|t| t.get(&key.digest))
            .map(|e| e.bytes.clone())
    }
}

#[async_trait]
impl Engine for MemEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "mem",
            instance: Instance::Process,
            sharing: Sharing::ProcessLocal,
            durable: false,
            seam: None,
        }
    }

    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        Ok(self
            .read_tables()
            .get(&key.namespace)
            .and_then(|t| t.get(&key.digest))
            .map(|e| EntryMeta {
                size: e.bytes.len() as u64,
                created_at: e.created_at,
            }))
    }

    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let tables = self.read_tables();
        let table = tables.get(ns);
        Ok(digests
            .iter()
            .map(|d| table.is_some_and(|t| t.contains_key(d)))
            .collect())
    }

    /// Whole reads and spans alike are handle clones of the bytes.
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        self.get(key)
            .map(|bytes| SizedRead::from_bytes(bytes, options))
            .transpose()
    }

    /// The outboard kept with the entry (a handle clone).
    async fn read_outboard(&self, key: &Key) -> Result<Option<Bytes>> {
        Ok(self
            .read_tables()
            .get(&key.namespace)
            .and_then(|t| t.get(&key.digest))
            .and_then(|e| e.outboard.clone()))
    }

    /// Gives the entry `outboard` if it has none (one write-lock section).
    async fn store_outboard(&self, key: &Key, outboard: Bytes) -> Result<()> {
        let mut tables = self.write_tables();
        if let Some(e) = tables
            .get_mut(&key.namespace)
            .and_then(|t| t.get_mut(&key.digest))
        {
            e.outboard.get_or_insert(outboard);
        }
        Ok(())
    }

    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        let mut tables = self.write_tables();
        let Some(table) = tables.get_mut(ns) else {
            return Ok(vec![None; digests.len()]);
        };
        let freed = digests
            .iter()
            .map(|d| table.remove(d).map(|e| e.bytes.len() as u64))
            .collect();
        if table.is_empty() {
            tables.remove(ns);
        }
        Ok(freed)
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        Ok(self
            .read_tables()
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .map(|(ns, _)| ns.clone())
            .collect())
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        let tables = self.read_tables();
        let Some(table) = tables.get(ns) else {
            return Ok(Vec::new());
        };
        let lower = match after {
            Some(d) => Bound::Excluded(d),
            None => Bound::Unbounded,
        };
        Ok(table
            .range((lower, Bound::Unbounded))
            .take(limit)
            .map(|(d, e)| (*d, e.bytes.len() as u64))
            .collect())
    }
}

#[async_trait]
impl KvEngine for MemEngine {
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        Ok(
            if self.insert_if_absent(&key.namespace, key.digest, bytes, None) {
                PublishOutcome::Inserted
            } else {
                PublishOutcome::AlreadyPresent
            },
        )
    }

    /// The engine's references (shared by its clones; see the `refs`
    /// module).
    fn refs(&self) -> Option<Arc<dyn RefStore>> {
        Some(self.refs.clone())
    }

    /// The engine's cache keys (shared by its clones; see the `cache`
    /// module).
    fn cache(&self) -> Option<Arc<dyn store_types::CacheIndex>> {
        Some(self.cache.clone())
    }
}

#[async_trait]
impl LargeEngine for MemEngine {
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        Ok(Stage::Plain(Box::new(MemStage::new(
            self.clone(),
            ns.clone(),
        ))))
    }
}
