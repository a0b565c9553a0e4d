//! Staged writes: buffered small bodies, multipart uploads for large ones,
//! and the publish (conditional put, copy-if-not-exists from the stage, or
//! — for a stage that knows its digest — completing a multipart upload
//! made straight to the final name).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart,
};
use store_types::{Digest, Error, Key, Namespace, PublishOutcome, Result, StagedWrite};

use crate::error::{backend_err, unsupported};
use crate::Inner;

/// Where a stage is.
enum State {
    /// Below the multipart threshold: chunks kept in memory.
    Buffering { chunks: Vec<Bytes>, len: usize },
    /// Streaming into a multipart upload under `path`: a stage name, or
    /// (`direct`) the final name of the expected digest.
    Uploading {
        path: Path,
        direct: bool,
        upload: Box<WriteMultipart>,
    },
    /// A write failed; the upload is already aborted.
    Failed(Error),
    /// Published or aborted.
    Done,
}

/// An in-progress put into an [`crate::ObjectEngine`].
pub(crate) struct ObjectStage {
    inner: Arc<Inner>,
    ns: Namespace,
    /// The digest the caller promised to publish under
    /// ([`store_types::LargeEngine::stage_expecting`]).
    expected: Option<Digest>,
    state: State,
    /// The entry's outboard, written before the entry is published.
    outboard: Option<Bytes>,
}

impl ObjectStage {
    /// A stage that learns its key at publish.
    pub(crate) fn new(inner: Arc<Inner>, ns: Namespace) -> Self {
        ObjectStage {
            inner,
            ns,
            expected: None,
            outboard: None,
            state: State::Buffering {
                chunks: Vec::new(),
                len: 0,
            },
        }
    }

    /// A stage that may only publish under `Key(ns, expected)`: beyond the
    /// multipart threshold it uploads straight to that key's final name
    /// (unless [`crate::ObjectOptions::direct_expected_puts`] is off).
    pub(crate) fn expecting(inner: Arc<Inner>, ns: Namespace, expected: Digest) -> Self {
        let mut stage = ObjectStage::new(inner, ns);
        stage.expected = Some(expected);
        stage
    }

    /// Starts the multipart upload and hands it the buffered chunks.
    async fn start_upload(&mut self, chunks: Vec<Bytes>) -> Result<()> {
        let inner = &self.inner;
        let (path, direct) = match self.expected {
            Some(d) if inner.options.direct_expected_puts => {
                (inner.digest_path(&self.ns, &d), true)
            }
            _ => (inner.next_stage_path(), false),
        };
        let upload = inner
            .retry("starting a multipart upload", &path, || {
                inner.store.put_multipart(&path)
            })
            .await
            .map_err(|e| backend_err("starting a multipart upload", &path, e))?;
        let mut upload = Box::new(WriteMultipart::new_with_chunk_size(
            upload,
            inner.options.part_size,
        ));
        for c in chunks {
            upload.put(c);
        }
        self.state = State::Uploading {
            path,
            direct,
            upload,
        };
        Ok(())
    }

    async fn write_inner(&mut self, chunk: Bytes) -> Result<()> {
        match &mut self.state {
            State::Buffering { chunks, len } => {
                *len += chunk.len();
                chunks.push(chunk);
                if *len > self.inner.options.multipart_threshold {
                    let chunks = std::mem::take(chunks);
                    self.start_upload(chunks).await?;
                }
                Ok(())
            }
            State::Uploading { path, upload, .. } => {
                let concurrency = self.inner.options.upload_concurrency;
                if let Err(e) = upload.wait_for_capacity(concurrency).await {
                    return Err(backend_err("uploading a part of", path, e));
                }
                upload.put(chunk);
                Ok(())
            }
            State::Failed(e) => Err(e.clone()),
            State::Done => Err(finished()),
        }
    }
}

/// Per-key async locks, removed when no longer held or awaited.
#[derive(Default)]
pub(crate) struct KeyLocks(Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>);

/// A held per-key lock.
pub(crate) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: Key,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Locks `key`; the flag says whether another publish held it first.
    pub(crate) async fn lock(&self, key: &Key) -> (KeyGuard<'_>, bool) {
        let lock = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let (guard, waited) = match lock.clone().try_lock_owned() {
            Ok(g) => (g, false),
            Err(_) => (lock.clone().lock_owned().await, true),
        };
        let guard = KeyGuard {
            locks: self,
            key: key.clone(),
            lock,
            guard: Some(guard),
        };
        (guard, waited)
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.0.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map's reference and ours left: nobody waits.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.key);
        }
    }
}

/// Publishes a buffered body: one conditional put to the final name.
async fn publish_small(inner: &Inner, key: &Key, chunks: Vec<Bytes>) -> Result<PublishOutcome> {
    let target = inner.content_path(key);
    let (_guard, waited) = inner.publishing.lock(key).await;
    if waited && inner.exists(&target).await? {
        return Ok(PublishOutcome::AlreadyPresent);
    }
    let payload: PutPayload = chunks.into_iter().collect();
    if inner.caps.conditional_put {
        let r = inner
            .retry("publishing", &target, || {
                inner
                    .store
                    .put_opts(&target, payload.clone(), PutOptions::from(PutMode::Create))
            })
            .await;
        return match r {
            Ok(_) => Ok(PublishOutcome::Inserted),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(PublishOutcome::AlreadyPresent),
            Err(e) => Err(backend_err("publishing", &target, e)),
        };
    }
    // Fallback: look, then overwrite (identical bytes if we race).
    if inner.exists(&target).await? {
        return Ok(PublishOutcome::AlreadyPresent);
    }
    inner
        .retry("publishing", &target, || {
            inner.store.put(&target, payload.clone())
        })
        .await
        .map_err(|e| backend_err("publishing", &target, e))?;
    Ok(PublishOutcome::Inserted)
}

/// Publishes a multipart stage: complete it, copy it to the final name
/// unless that exists, remove the stage object.
async fn publish_large(
    inner: &Inner,
    key: &Key,
    path: Path,
    upload: Box<WriteMultipart>,
) -> Result<PublishOutcome> {
    // `finish` aborts the upload itself when it fails. Should the
    // completion have happened unseen, the object is removed too.
    if let Err(e) = upload.finish().await {
        inner.delete_quietly(&path).await;
        return Err(backend_err("completing the upload of", &path, e));
    }
    let outcome = copy_to_final(inner, key, &path).await;
    // The stage object has done its job either way; if the delete
    // fails, the reaper removes it after the grace period.
    inner.delete_quietly(&path).await;
    outcome
}

/// Publishes a multipart upload made straight to the final name: look
/// first (an existing entry means `AlreadyPresent`, and the upload is
/// aborted), else complete the upload, which is what makes the object
/// appear — atomically and complete.
///
/// object_store 0.14 offers no conditional completion of a multipart
/// upload (`PutMultipartOptions` has no `PutMode`, although S3 supports
/// `If-None-Match: *` on `CompleteMultipartUpload`), so the completion is
/// unconditional. The per-key lock makes the look-then-complete atomic
/// within this instance; across instances two publishers of one key may
/// both find it absent and both complete. Both wrote the same verified
/// bytes (the name is their digest), so the result is one correct entry;
/// only the outcome differs (both report `Inserted`), as in the
/// no-conditional-writes fallback.
async fn publish_direct(
    inner: &Inner,
    key: &Key,
    path: Path,
    upload: Box<WriteMultipart>,
) -> Result<PublishOutcome> {
    debug_assert_eq!(path, inner.content_path(key));
    let (_guard, _) = inner.publishing.lock(key).await;
    match inner.exists(&path).await {
        Ok(false) => {}
        Ok(true) => {
            let _ = upload.abort().await;
            return Ok(PublishOutcome::AlreadyPresent);
        }
        Err(e) => {
            let _ = upload.abort().await;
            return Err(e);
        }
    }
    // `finish` aborts the upload itself when it fails. Unlike a stage
    // object, an object the completion may have created unseen is left
    // alone: it sits at its own digest's name and holds the verified
    // bytes (or another publisher's identical ones), so it is a complete,
    // correct entry.
    upload
        .finish()
        .await
        .map_err(|e| backend_err("completing the upload of", &path, e))?;
    Ok(PublishOutcome::Inserted)
}

async fn copy_to_final(inner: &Inner, key: &Key, stage: &Path) -> Result<PublishOutcome> {
    let target = inner.content_path(key);
    let (_guard, waited) = inner.publishing.lock(key).await;
    if waited && inner.exists(&target).await? {
        return Ok(PublishOutcome::AlreadyPresent);
    }
    if inner.caps.copy_if_not_exists {
        let r = inner
            .retry("publishing", &target, || {
                inner.store.copy_opts(
                    stage,
                    &target,
                    CopyOptions::new().with_mode(CopyMode::Create),
                )
            })
            .await;
        match r {
            Ok(()) => return Ok(PublishOutcome::Inserted),
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Ok(PublishOutcome::AlreadyPresent)
            }
            Err(e) if unsupported(&e) => {
                tracing::warn!(error = %e, "copy-if-not-exists unsupported after all; \
                        falling back to HEAD-then-copy");
            }
            Err(e) => return Err(backend_err("publishing", &target, e)),
        }
    }
    if inner.exists(&target).await? {
        return Ok(PublishOutcome::AlreadyPresent);
    }
    inner
        .retry("publishing", &target, || inner.store.copy(stage, &target))
        .await
        .map_err(|e| backend_err("publishing", &target, e))?;
    Ok(PublishOutcome::Inserted)
}

#[async_trait]
impl StagedWrite for ObjectStage {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if chunk.is_empty() {
            return match &self.state {
                State::Failed(e) => Err(e.clone()),
                _ => Ok(()),
            };
        }
        match self.write_inner(chunk).await {
            Ok(()) => Ok(()),
            Err(e) => {
                if let State::Uploading { upload, .. } =
                    std::mem::replace(&mut self.state, State::Failed(e.clone()))
                {
                    let _ = upload.abort().await;
                }
                Err(e)
            }
        }
    }

    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.outboard = Some(outboard);
        Ok(())
    }

    /// Publishes under `key`, whose namespace must be the one the stage
    /// was opened for, and whose digest the expected one if the stage was
    /// opened expecting one ([`Error::KeyInvalid`] otherwise: a breach of
    /// the caller's contract; the stage is discarded). Whatever fails,
    /// nothing is left visible under `key` unless it is complete, and the
    /// stage's upload or object is removed.
    async fn publish(mut self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        let state = std::mem::replace(&mut self.state, State::Done);
        let breach = if key.namespace != self.ns {
            Some(format!(
                "stage opened for namespace {} cannot publish {key}",
                self.ns
            ))
        } else {
            self.expected
                .filter(|d| *d != key.digest)
                .map(|d| format!("stage opened expecting digest {d} cannot publish {key}"))
        };
        if let Some(breach) = breach {
            if let State::Uploading { upload, .. } = state {
                let _ = upload.abort().await;
            }
            return Err(Error::KeyInvalid(breach));
        }
        // The outboard first: once the entry is visible, so is its outboard.
        if let Some(ob) = self.outboard.take() {
            if let Err(e) = self.inner.put_outboard(key, &ob).await {
                if let State::Uploading { upload, .. } = state {
                    let _ = upload.abort().await;
                }
                return Err(e);
            }
        }
        match state {
            State::Buffering { chunks, .. } => publish_small(&self.inner, key, chunks).await,
            State::Uploading {
                path,
                direct: true,
                upload,
            } => publish_direct(&self.inner, key, path, upload).await,
            State::Uploading {
                path,
                direct: false,
                upload,
            } => publish_large(&self.inner, key, path, upload).await,
            State::Failed(e) => Err(e),
            State::Done => Err(finished()),
        }
    }

    /// Discards the stage, aborting its multipart upload.
    async fn abort(mut self: Box<Self>) -> Result<()> {
        if let State::Uploading { upload, .. } = std::mem::replace(&mut self.state, State::Done) {
            let _ = upload.abort().await;
        }
        Ok(())
    }
}

impl Drop for ObjectStage {
    /// A stage dropped mid-upload aborts the upload in the background.
    fn drop(&mut self) {
        if let State::Uploading { upload, path, .. } =
            std::mem::replace(&mut self.state, State::Done)
        {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        if let Err(e) = upload.abort().await {
                            tracing::debug!(path = %path, error = %e,
                                "aborting a dropped stage's upload failed");
                        }
                    });
                }
                Err(_) => tracing::debug!(path = %path,
                    "stage dropped outside a runtime; its multipart upload is left to the store"),
            }
        }
    }
}

impl Inner {
    /// Whether an object exists at `path` (a HEAD).
    pub(crate) async fn exists(&self, path: &Path) -> Result<bool> {
        match self
            .retry("looking up", path, || self.store.head(path))
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(backend_err("looking up", path, e)),
        }
    }
}

/// The error of a use of a stage that already published or failed.
fn finished() -> Error {
    Error::io(store_types::ErrorKind::Other, "object store: use stage")
        .with_source("the stage already finished")
}
