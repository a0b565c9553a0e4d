//! Staged writes: chunks accumulate privately and publish atomically.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{Error, Key, Namespace, PublishOutcome, Result, StagedWrite};

use crate::MemEngine;

/// An in-progress large write into a [`MemEngine`].
///
/// Chunks are kept as received (no copy) until `publish`, which joins them
/// into one buffer and inserts the entry if its key is absent. Dropping
/// the stage discards the chunks.
pub(crate) struct MemStage {
    engine: MemEngine,
    ns: Namespace,
    chunks: Vec<Bytes>,
    len: usize,
    /// The entry's outboard, published with it.
    outboard: Option<Bytes>,
}

impl MemStage {
    /// A fresh, empty stage for an entry of `ns` in `engine`.
    pub(crate) fn new(engine: MemEngine, ns: Namespace) -> Self {
        MemStage {
            engine,
            ns,
            chunks: Vec::new(),
            len: 0,
            outboard: None,
        }
    }

    /// The staged content as one buffer (no copy for zero or one chunk).
    fn into_bytes(mut self) -> Bytes {
        match self.chunks.len() {
            0 => Bytes::new(),
            1 => self.chunks.pop().expect("one chunk"),
            _ => {
                // Huge-page backed when large (TUNING.md §puts-hashed-while-read): the join writes
                // the whole entry into fresh memory.
                let mut buf = store_types::buffer::entry_buffer(self.len);
                for c in &self.chunks {
                    buf.extend_from_slice(c);
                }
                buf.freeze()
            }
        }
    }
}

impl fmt::Debug for MemStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemStage")
            .field("ns", &self.ns)
            .field("len", &self.len)
            .finish()
    }
}

#[async_trait]
impl StagedWrite for MemStage {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.chunks.push(chunk);
        }
        Ok(())
    }

    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.outboard = Some(outboard);
        Ok(())
    }

    /// Publishes under `key`, whose namespace must be the one the stage
    /// was opened for ([`Error::KeyInvalid`] otherwise, nothing published).
    async fn publish(self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        if key.namespace != self.ns {
            return Err(Error::KeyInvalid(format!(
                "stage opened for namespace {} cannot publish {key}",
                self.ns
            )));
        }
        let engine = self.engine.clone();
        let mut this = self;
        let outboard = this.outboard.take();
        let bytes = this.into_bytes();
        Ok(
            if engine.insert_if_absent(&key.namespace, key.digest, bytes, outboard) {
                PublishOutcome::Inserted
            } else {
                PublishOutcome::AlreadyPresent
            },
        )
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
