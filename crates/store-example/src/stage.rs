//! Staged writes: a private buffer, published in one critical section.

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{Error, Key, Namespace, PublishOutcome, Result, StagedWrite};

use crate::ExampleEngine;

/// An in-progress large write: the bytes so far, invisible until
/// `publish`. Dropping it frees them.
pub(crate) struct ExampleStage {
    engine: ExampleEngine,
    ns: Namespace,
    buf: Vec<u8>,
}

impl ExampleStage {
    pub(crate) fn new(engine: ExampleEngine, ns: Namespace) -> Self {
        ExampleStage {
            engine,
            ns,
            buf: Vec::new(),
        }
    }
}

#[async_trait]
impl StagedWrite for ExampleStage {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.buf.extend_from_slice(&chunk);
        Ok(())
    }

    /// Publishes under `key`, whose namespace must be the stage's
    /// ([`Error::KeyInvalid`] otherwise, nothing published).
    async fn publish(self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        if key.namespace != self.ns {
            return Err(Error::KeyInvalid(format!(
                "stage opened for namespace {} cannot publish {key}",
                self.ns
            )));
        }
        let bytes = Bytes::from(self.buf);
        Ok(if self.engine.insert_if_absent(key, bytes) {
            PublishOutcome::Inserted
        } else {
            PublishOutcome::AlreadyPresent
        })
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
