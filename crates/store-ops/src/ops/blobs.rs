//! The blob handlers: put, have, get (whole, ranged, bao), stat, delete.

use std::io;
use std::ops::Range;
use std::pin::Pin as StdPin;
use std::task::{Context, Poll};

use store_core::{Blob, Digest, Error, Key, Namespace, Tier};
use tokio::io::{AsyncRead, ReadBuf};

use super::Ops;
use crate::auth::Identity;
use crate::error::{ErrorCode, OpsError};
use crate::payload::{HaveRequest, HaveResponse, PutResponse, StatResponse};
use crate::range::RangeRequest;

/// What a successful put did (the wire answer plus what a binding may
/// report beside it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    /// The ADR-012 §2 answer.
    pub response: PutResponse,
    /// Content length.
    pub size: u64,
    /// The tier holding the entry.
    pub tier: Tier,
    /// Whether the entry already existed.
    pub deduplicated: bool,
}

impl PutOutcome {
    /// The answer for `receipt`, without a token yet.
    pub(crate) fn of(receipt: &store_core::PutReceipt, cache: bool) -> Self {
        PutOutcome {
            response: PutResponse {
                token: None,
                digest: receipt.digest.to_hex(),
                cache,
            },
            size: receipt.size,
            tier: receipt.tier,
            deduplicated: receipt.deduplicated,
        }
    }
}

/// A get, ready to stream.
#[derive(Debug)]
pub struct GetResponse {
    /// The content (verified at EOF for whole reads, see [`Blob`]).
    pub blob: Blob,
    /// The entry's digest.
    pub digest: Digest,
    /// The whole entry's size.
    pub size: u64,
    /// The tier holding the entry.
    pub tier: Tier,
    /// The served half-open range, for a ranged read.
    pub range: Option<Range<u64>>,
}

/// Entries up to this size are bao-encoded from one verified whole read
/// held in memory ([`Ops::get_bao`]); larger ones stream group by group.
pub const BAO_MEMORY_MAX: u64 = 64 * 1024;

/// A bao stream, ready to send ([`Ops::get_bao`]).
pub struct BaoResponse {
    /// The encoding; an `Err` item means the stream must be aborted.
    pub stream: crate::bao::ChunkStream,
    /// The entry's digest (the decoder's root hash).
    pub digest: Digest,
    /// The whole entry's size (the decoder needs it for the tree's shape).
    pub size: u64,
    /// The tier holding the entry.
    pub tier: Tier,
    /// The encoded half-open byte range, for a ranged request.
    pub range: Option<Range<u64>>,
}

impl std::fmt::Debug for BaoResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaoResponse")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("tier", &self.tier)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// The half-open range `req` selects in an entry of `size` bytes;
/// `invalid_range` (with the size) when unsatisfiable or several ranges.
fn resolve_range(size: u64, req: RangeRequest) -> Result<Range<u64>, OpsError> {
    let unsatisfiable = |msg: String| OpsError {
        size: Some(size),
        ..OpsError::new(ErrorCode::InvalidRange, msg)
    };
    match req {
        RangeRequest::Multiple => Err(unsatisfiable(
            "multiple byte ranges are not supported; ask for one range".into(),
        )),
        RangeRequest::Single(r) => r.resolve(size).ok_or_else(|| {
            unsatisfiable(format!(
                "range {r} is not satisfiable for an entry of {size} bytes"
            ))
        }),
    }
}

impl Ops {
    /// `blobs/put` by `identity`: stores `body` in `namespace` and mints a
    /// pin token (none in a cache namespace, ADR-048).
    ///
    /// `len` is the declared length (a body of another length fails with
    /// `length_mismatch`); `expect` an expected digest (`verification` on
    /// mismatch). Bodies over [`OpsConfig::max_blob_size`](crate::OpsConfig::max_blob_size) fail with
    /// `too_large` — immediately when `len` says so, otherwise as soon as
    /// the limit is crossed. A failed put publishes nothing; a read error
    /// of `body` aborts it.
    ///
    /// A token slot is reserved before `body` is read: at the cap
    /// ([`OpsConfig::max_tokens`](crate::OpsConfig::max_tokens), [`OpsConfig::max_tokens_per_owner`](crate::OpsConfig::max_tokens_per_owner)) the
    /// put fails with `too_many_tokens` (with a retry delay) without
    /// reading `body` or storing anything. No existing token is evicted.
    ///
    /// **Cancel-safe** as far as the ops layer goes: dropping the future
    /// frees the reserved slot and mints no token (the slot is a drop
    /// guard). The store's own cancellation rules apply to the entry:
    /// cancelled before the store published it, nothing is stored; just
    /// after, the entry exists unpinned, like any entry no token protects.
    ///
    /// The token belongs to `identity` (only it, or an admin, may renew or
    /// release it) and counts against its cap
    /// ([`OpsConfig::max_tokens_per_owner`](crate::OpsConfig::max_tokens_per_owner)). Scopes are the caller's
    /// business ([`Ops::authorize`] with [`Scope::Write`](crate::auth::Scope::Write)).
    pub async fn put<R>(
        &self,
        identity: &Identity,
        namespace: &str,
        body: R,
        len: Option<u64>,
        expect: Option<&str>,
    ) -> Result<PutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        let ns = Namespace::new(namespace)?;
        let expect = expect.map(|d| Digest::parse(d.trim())).transpose()?;
        self.put_owned(identity.name(), &ns, body, len, expect)
            .await
    }

    /// `body` limited to the largest accepted blob; refused at once when
    /// `len` says it is larger.
    pub(crate) fn limited<R>(&self, body: R, len: Option<u64>) -> Result<Limited<R>, OpsError> {
        let limit = self.inner.cfg.max_blob_size;
        match len {
            Some(n) if n > limit => Err(Error::TooLarge { limit, got: n }.into()),
            _ => Ok(Limited::new(body, limit)),
        }
    }

    /// A put whose token (if any) belongs to `owner`.
    pub(super) async fn put_owned<R>(
        &self,
        owner: &str,
        ns: &Namespace,
        body: R,
        len: Option<u64>,
        expect: Option<Digest>,
    ) -> Result<PutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        let options = store_core::PutOptions { len, expect };
        let body = self.limited(body, len)?;
        if self.is_cache_namespace(ns) {
            return self.put_cache_entry(ns, body, options).await;
        }
        // Reserve the token slot before anything is stored; dropped with
        // this future or on any error below, it frees itself.
        let slot = self
            .inner
            .tokens
            .reserve(owner)
            .map_err(|e| self.cap_reached(e))?;
        let receipt = self.inner.store.put_opts(ns, body, options).await?;
        self.inner.metrics.put(receipt.size, receipt.deduplicated);
        // The token holds the receipt's in-process pin (ADR-012 §2). In
        // fleet mode the put also committed a pin row, which renewal probes
        // extend through `Gc::renew_pin` (ADR-018). No await between the
        // receipt and the mint: the pin cannot be lost to a cancellation.
        let mut out = PutOutcome::of(&receipt, false);
        out.response.token = Some(slot.mint(receipt.key().clone(), receipt.pin));
        Ok(out)
    }

    /// `blobs/have` by `identity`: an existence probe (no token) or a renewal probe
    /// (token + exactly one digest). See ADR-012 §2 and ADR-018.
    ///
    /// Cancel-safe: it changes nothing but a token's idle deadline (when
    /// there is a TTL) and, in fleet mode, its pin row's expiry; a probe
    /// dropped between the two leaves the token ahead of its row, which
    /// the next probe corrects (`present: [false]` if the row expired).
    ///
    /// A renewal probe fails with `forbidden` when the token belongs to
    /// another identity than `identity` (nothing is renewed). Scopes are
    /// the caller's business ([`Scope::Read`](crate::auth::Scope::Read) for an existence probe,
    /// [`Scope::Write`](crate::auth::Scope::Write) for a renewal).
    pub async fn have(
        &self,
        identity: &Identity,
        req: HaveRequest,
    ) -> Result<HaveResponse, OpsError> {
        let max = self.inner.cfg.max_have_digests;
        if req.digests.len() > max {
            return Err(OpsError::new(
                ErrorCode::TooMany,
                format!(
                    "a have request lists at most {max} digests, got {}",
                    req.digests.len()
                ),
            ));
        }
        let ns = Namespace::new(&req.namespace)?;
        let digests = req
            .digests
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Digest::parse(d)
                    .map_err(|e| OpsError::new(ErrorCode::KeyInvalid, format!("digests[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.inner.metrics.have(digests.len(), req.token.is_some());
        match req.token {
            None => Ok(HaveResponse {
                present: self.inner.store.has_many(&ns, &digests).await?,
            }),
            Some(token) => {
                if digests.len() != 1 {
                    return Err(OpsError::bad_request(format!(
                        "a renewal probe (with a token) carries exactly one digest, got {}",
                        digests.len()
                    )));
                }
                let key = Key::new(ns, digests[0]);
                // A foreign token is refused; an unknown or expired one
                // answers `present: [false]` below, as ADR-012 §2 says.
                if self.inner.tokens.lookup(&token).is_some() {
                    self.check_owner(identity, &token)?;
                }
                // (a) the token must map to a pin on this key, in this
                // namespace (extending the token's idle deadline, if any)...
                if !self.inner.tokens.renew(&token, &key) {
                    return Ok(HaveResponse {
                        present: vec![false],
                    });
                }
                // (b) ...and the store renews the pin itself: a no-op check
                // for in-process pins, `pin_renew` on the row in fleet mode.
                // A pin row that expired ends the token: the putter's
                // backstop is to put again.
                if !self.inner.store.gc().renew_pin(&key).await? {
                    self.inner.tokens.release(&token);
                    return Ok(HaveResponse {
                        present: vec![false],
                    });
                }
                // (c) answer presence as usual.
                Ok(HaveResponse {
                    present: vec![self.inner.store.has(&key).await?],
                })
            }
        }
    }

    /// A streaming read of the entry, or of one byte range of it.
    ///
    /// `missing` when absent; `invalid_range` (with the size) for an
    /// unsatisfiable range or several ranges.
    pub async fn get(
        &self,
        namespace: &str,
        digest: &str,
        range: Option<RangeRequest>,
    ) -> Result<GetResponse, OpsError> {
        self.get_key(Key::parse(namespace, digest)?, range).await
    }

    /// [`Ops::get`] of a key already parsed (the cache routes resolve a
    /// cache key to one: no hex round trip).
    pub(crate) async fn get_key(
        &self,
        key: Key,
        range: Option<RangeRequest>,
    ) -> Result<GetResponse, OpsError> {
        let store = &self.inner.store;
        let resp = match range {
            None => {
                let blob = store.get(&key).await?.ok_or(Error::Missing)?;
                GetResponse {
                    digest: key.digest,
                    size: blob.len(),
                    tier: blob.tier(),
                    range: None,
                    blob,
                }
            }
            Some(req) => {
                let stat = store.stat(&key).await?.ok_or(Error::Missing)?;
                let r = resolve_range(stat.size, req)?;
                let blob = store.read_range(&key, r.clone()).await?;
                GetResponse {
                    digest: key.digest,
                    size: stat.size,
                    tier: blob.tier(),
                    range: Some(r),
                    blob,
                }
            }
        };
        self.inner.metrics.get();
        Ok(resp)
    }

    /// A verified (bao) stream of the entry, or of one byte range of it
    /// (ADR-033): bao-tree's encoding with the entry's outboard, which a
    /// client decodes against the digest as it arrives ([`crate::bao`]).
    ///
    /// `missing` when absent; `invalid_range` (with the size) for an
    /// unsatisfiable range or several ranges. Entries of at most
    /// [`BAO_MEMORY_MAX`] bytes are read whole (verified) and their outboard
    /// computed; larger ones stream the chunk groups covering the range
    /// through `Store::read_range` (each verified before the encoder sees
    /// it) with the store's validated outboard, so memory stays bounded at
    /// any size. The first covering group is read before this returns: a
    /// corrupt one fails here with `verification` (before a transport
    /// commits to a response); a later one ends the stream with an error.
    ///
    /// Cancel-safe: it only reads; dropping the future (or the returned
    /// stream) leaves nothing behind.
    pub async fn get_bao(
        &self,
        namespace: &str,
        digest: &str,
        range: Option<RangeRequest>,
    ) -> Result<BaoResponse, OpsError> {
        let key = Key::parse(namespace, digest)?;
        let store = &self.inner.store;
        let stat = store.stat(&key).await?.ok_or(Error::Missing)?;
        let range = match range {
            None => None,
            Some(req) => Some(resolve_range(stat.size, req)?),
        };
        let stream = if stat.size <= BAO_MEMORY_MAX {
            let blob = store.get(&key).await?.ok_or(Error::Missing)?;
            let data = blob.bytes().await?;
            crate::bao::encode_memory(key.digest, data, range.as_ref())?
        } else {
            let hashes = store.outboard(&key).await?.ok_or(Error::Missing)?;
            let span = match &range {
                None => 0..stat.size,
                Some(r) => store_types::outboard::covering_groups(r, stat.size),
            };
            let blob = store.read_range(&key, span.clone()).await?;
            let mut reader = crate::bao::SpanReader::new(Box::pin(blob), span, stat.size);
            reader
                .prefetch()
                .await
                .map_err(|e| OpsError::from(Error::from_io("bao stream", e)))?;
            crate::bao::encode_span(&hashes, reader, range.as_ref())
        };
        self.inner.metrics.get();
        self.inner.metrics.bao_get();
        Ok(BaoResponse {
            stream,
            digest: key.digest,
            size: stat.size,
            tier: stat.tier,
            range,
        })
    }

    /// Size, tier and creation time; `missing` when absent.
    pub async fn stat(&self, namespace: &str, digest: &str) -> Result<StatResponse, OpsError> {
        let key = Key::parse(namespace, digest)?;
        let stat = self.inner.store.stat(&key).await?.ok_or(Error::Missing)?;
        self.inner.metrics.stat();
        Ok(StatResponse {
            namespace: key.namespace.to_string(),
            digest: key.digest.to_hex(),
            size: stat.size,
            tier: stat.tier,
            created_at: stat.created_at.0,
        })
    }

    /// Direct delete: `gc_refuse` (with the reason) while the key is
    /// protected, `missing` when absent.
    pub async fn delete(&self, namespace: &str, digest: &str) -> Result<(), OpsError> {
        let key = Key::parse(namespace, digest)?;
        self.inner.store.delete(&key).await?;
        self.inner.metrics.delete();
        Ok(())
    }
}

/// Fails the read with `TooLarge` once more than `limit` bytes went by.
pub(crate) struct Limited<R> {
    inner: R,
    seen: u64,
    limit: u64,
}

impl<R> Limited<R> {
    /// `inner`, failing once more than `limit` bytes went by.
    pub(crate) fn new(inner: R, limit: u64) -> Self {
        Limited {
            inner,
            seen: 0,
            limit,
        }
    }

    /// `(limit, bytes seen)` when the read went past the limit.
    pub(crate) fn passed(&self) -> Option<(u64, u64)> {
        (self.seen > self.limit).then_some((self.limit, self.seen))
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Limited<R> {
    fn poll_read(
        mut self: StdPin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match StdPin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.seen += (buf.filled().len() - before) as u64;
                if this.seen > this.limit {
                    return Poll::Ready(Err(Error::TooLarge {
                        limit: this.limit,
                        got: this.seen,
                    }
                    .into()));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}
