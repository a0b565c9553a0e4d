//! The [`Engine`], [`KvEngine`] and [`LargeEngine`] implementations.

use std::ops::Bound;

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{
    Capabilities, Digest, Engine, EntryMeta, Instance, Key, KvEngine, LargeEngine, Namespace,
    PublishOutcome, ReadOptions, Result, Sharing, SizedRead, Stage,
};

use crate::stage::ExampleStage;
use crate::ExampleEngine;

impl ExampleEngine {
    fn get(&self, key: &Key) -> Option<Bytes> {
        self.entries().get(key).map(|e| e.bytes.clone())
    }
}

/// The first key of `ns` (the all-zero digest is the smallest).
fn first_key(ns: &Namespace) -> Key {
    Key::new(ns.clone(), Digest::from_bytes([0; 32]))
}

#[async_trait]
impl Engine for ExampleEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "example",
            instance: Instance::Process,
            sharing: Sharing::ProcessLocal,
            durable: false,
            seam: None,
        }
    }

    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        Ok(self.entries().get(key).map(|e| EntryMeta {
            size: e.bytes.len() as u64,
            created_at: e.created_at,
        }))
    }

    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let entries = self.entries();
        Ok(digests
            .iter()
            .map(|d| entries.contains_key(&Key::new(ns.clone(), *d)))
            .collect())
    }

    /// The bytes in memory answer every read (a handle clone, sliced for
    /// a span).
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        self.get(key)
            .map(|bytes| SizedRead::from_bytes(bytes, options))
            .transpose()
    }

    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        let mut entries = self.entries();
        Ok(digests
            .iter()
            .map(|d| {
                entries
                    .remove(&Key::new(ns.clone(), *d))
                    .map(|e| e.bytes.len() as u64)
            })
            .collect())
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let mut out: Vec<Namespace> = Vec::new();
        for key in self.entries().keys() {
            if out.last() != Some(&key.namespace) {
                out.push(key.namespace.clone());
            }
        }
        Ok(out)
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        let start = match after {
            Some(d) => Bound::Excluded(Key::new(ns.clone(), d)),
            None => Bound::Included(first_key(ns)),
        };
        Ok(self
            .entries()
            .range((start, Bound::Unbounded))
            .take_while(|(k, _)| &k.namespace == ns)
            .take(limit)
            .map(|(k, e)| (k.digest, e.bytes.len() as u64))
            .collect())
    }
}

#[async_trait]
impl KvEngine for ExampleEngine {
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        Ok(if self.insert_if_absent(key, bytes) {
            PublishOutcome::Inserted
        } else {
            PublishOutcome::AlreadyPresent
        })
    }
}

#[async_trait]
impl LargeEngine for ExampleEngine {
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        Ok(Stage::Plain(Box::new(ExampleStage::new(
            self.clone(),
            ns.clone(),
        ))))
    }
}
