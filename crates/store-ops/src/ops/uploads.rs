//! The resumable-upload handlers (ADR-034) over [`crate::uploads`],
//! behind [`Ops::uploads`].

use std::sync::Arc;

use store_core::{Digest, Error, Namespace};
use tokio::io::AsyncRead;

use super::blobs::PutOutcome;
use super::Ops;
use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::uploads::{Session, UploadStatus, Uploads};

/// The resumable-upload handlers of an [`Ops`] ([`Ops::uploads`]).
#[derive(Clone, Copy, Debug)]
pub struct UploadOps<'a>(&'a Ops);

impl Ops {
    /// The resumable-upload handlers.
    pub fn uploads(&self) -> UploadOps<'_> {
        UploadOps(self)
    }
}

impl UploadOps<'_> {
    /// The upload sessions, or `not_found` when they are not enabled.
    fn enabled(&self) -> Result<&Arc<Uploads>, OpsError> {
        self.0.inner.uploads.as_ref().ok_or_else(|| {
            OpsError::new(
                ErrorCode::NotFound,
                "resumable uploads are not enabled on this server (OpsConfig::uploads)",
            )
        })
    }

    /// The session `id` of `namespace`, if `identity` may use it.
    fn session(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
    ) -> Result<(&Arc<Uploads>, Arc<Session>), OpsError> {
        let uploads = self.enabled()?;
        let admin = identity.allows(Scope::Admin, None);
        let session = uploads.find(namespace, id, identity.name(), admin)?;
        Ok((uploads, session))
    }

    /// `uploads/open`: opens a resumable upload session into `namespace`
    /// for `identity` (ADR-034). Refused with `too_many_uploads` at the
    /// session caps. Cancel-safe: a dropped call leaves no session a client
    /// knows of (at worst an idle one that is reaped).
    pub async fn open(
        &self,
        identity: &Identity,
        namespace: &str,
    ) -> Result<UploadStatus, OpsError> {
        let ns = Namespace::new(namespace)?;
        self.enabled()?.create(identity.name(), ns).await
    }

    /// `uploads/status`: where session `id` stands (its committed offset).
    /// Cancel-safe: it only reads.
    pub async fn status(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
    ) -> Result<UploadStatus, OpsError> {
        let (_, session) = self.session(identity, namespace, id)?;
        Ok(session.status())
    }

    /// `uploads/append`: appends `body` to session `id`, starting at
    /// `start` (which must be the committed offset: `upload_offset`
    /// otherwise; `None` appends at it), and returns the new status. Each
    /// acknowledged append is synced; a body that breaks commits what
    /// arrived and fails with `incomplete_body`. The total is capped at
    /// [`OpsConfig::max_blob_size`](crate::OpsConfig::max_blob_size).
    ///
    /// Cancel-safe: the committed offset advances only once the bytes are
    /// synced, and never for the part a dropped call was writing.
    pub async fn append<R: AsyncRead + Unpin + Send>(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
        start: Option<u64>,
        body: R,
    ) -> Result<UploadStatus, OpsError> {
        let (uploads, session) = self.session(identity, namespace, id)?;
        let (guard, max) = (uploads.claim(&session)?, self.0.inner.cfg.max_blob_size);
        uploads.append(&session, &guard, start, body, max).await?;
        Ok(session.status())
    }

    /// `uploads/finish`: appends `body` (the last chunk, possibly empty) at
    /// `start` as [`UploadOps::append`], then stores the session's bytes
    /// in its namespace through the ordinary put, expecting `digest`, and
    /// ends the session: the answer is a put's (token and digest). A
    /// mismatch fails with `verification` and publishes nothing; the
    /// session stays (abort it, or let it expire).
    ///
    /// Cancel-safe as [`Ops::put`]: a dropped call leaves the session as
    /// it was (and at worst an unpinned entry, which a retried finish
    /// deduplicates onto).
    pub async fn finish<R: AsyncRead + Unpin + Send>(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
        digest: &str,
        start: Option<u64>,
        body: R,
    ) -> Result<PutOutcome, OpsError> {
        let expect = Digest::parse(digest.trim())?;
        let (uploads, session) = self.session(identity, namespace, id)?;
        let (guard, max) = (uploads.claim(&session)?, self.0.inner.cfg.max_blob_size);
        uploads.append(&session, &guard, start, body, max).await?;
        // A wrong digest is answered from the session's hasher, without
        // reading the spool again (issue 30).
        let actual = uploads.digest(&session, &guard).await?;
        if actual != expect {
            return Err(OpsError::from(Error::Verification {
                expected: expect,
                actual,
            }));
        }
        let reader = uploads.reader(&session).await?;
        let (owner, len) = (&session.owner, Some(session.offset()));
        let out = (self.0)
            .put_owned(owner, &session.ns, reader, len, Some(expect))
            .await?;
        uploads.remove(&session, &guard).await?;
        drop(guard);
        Ok(out)
    }

    /// Finishes session `id` into cache namespace `namespace` as the
    /// content address `hash` under `function` (REAPI ByteStream `Write`,
    /// ADR-071): appends `body` at `start` as [`UploadOps::append`], then
    /// streams the session's bytes through
    /// [`CacheOps::put_cas`](crate::cache::CacheOps::put_cas) (verified as
    /// it reads, the committed size as the declared length) and ends the
    /// session. A refusal (`verification`, `too_large`, ...) stores
    /// nothing and leaves the session as it was (abort it, or let it
    /// expire).
    ///
    /// Cancel-safe as `put_cas`: a dropped call leaves the session (and at
    /// worst an unkeyed entry, garbage for the next sweep).
    #[allow(clippy::too_many_arguments)]
    pub async fn finish_cas<R: AsyncRead + Unpin + Send>(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
        start: Option<u64>,
        body: R,
        function: Option<crate::cache::DigestFunction>,
        hash: &str,
    ) -> Result<crate::cache::CachePutOutcome, OpsError> {
        let (uploads, session) = self.session(identity, namespace, id)?;
        let (guard, max) = (uploads.claim(&session)?, self.0.inner.cfg.max_blob_size);
        uploads.append(&session, &guard, start, body, max).await?;
        let reader = uploads.reader(&session).await?;
        let len = Some(session.offset());
        let out = (self.0.cache())
            .put_cas(identity, namespace, function, hash, reader, len)
            .await?;
        uploads.remove(&session, &guard).await?;
        drop(guard);
        Ok(out)
    }

    /// `uploads/abort`: ends session `id` and removes its bytes.
    /// Cancel-safe: once it starts removing, the removal runs to its end.
    pub async fn abort(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
    ) -> Result<(), OpsError> {
        let (uploads, session) = self.session(identity, namespace, id)?;
        let guard = uploads.claim(&session)?;
        uploads.remove(&session, &guard).await
    }

    /// How many times an upload session's spool file was read whole (a
    /// matching finish, or a hasher rebuilt after a restart); 0 when
    /// uploads are not enabled. A wrong-digest finish never reads it.
    pub fn spool_reads(&self) -> u64 {
        self.0.inner.uploads.as_ref().map_or(0, |u| u.spool_reads())
    }

    /// Open upload sessions (0 when uploads are not enabled).
    pub fn sessions(&self) -> usize {
        self.0.inner.uploads.as_ref().map_or(0, |u| u.len())
    }
}
