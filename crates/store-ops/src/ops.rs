//! The transport-neutral handlers.

use std::io;
use std::ops::Range;
use std::pin::Pin as StdPin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use store_core::{
    Blob, Digest, Error, Key, Namespace, Pin, Store, SweepOptions, SweepReport, Tier,
};
use tokio::io::{AsyncRead, ReadBuf};

use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::metrics::Metrics;
use crate::payload::{HaveRequest, HaveResponse, HealthResponse, PutResponse, StatResponse};
use crate::range::RangeRequest;
use crate::tokens::{TokenCapReached, TokenRegistry, DEFAULT_MAX_TOKENS};
use crate::uploads::{UploadStatus, Uploads};

/// Default largest blob a put accepts: 16 GiB.
pub const DEFAULT_MAX_BLOB_SIZE: u64 = 16 << 30;

/// Default largest `digests` list of one `blobs/have` existence probe.
pub const DEFAULT_MAX_HAVE_DIGESTS: usize = 10_000;

/// Limits and token lifetime of an [`Ops`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpsConfig {
    /// Largest blob a put accepts, in bytes (`too_large` beyond). Default
    /// [`DEFAULT_MAX_BLOB_SIZE`]. The store's own limits (kv-only
    /// threshold) apply as well.
    pub max_blob_size: u64,
    /// Largest `digests` list of one existence probe (`too_many` beyond).
    /// Default [`DEFAULT_MAX_HAVE_DIGESTS`].
    pub max_have_digests: usize,
    /// Idle lifetime of a pin token (ADR-018): a token not renewed for this
    /// long expires and its pin is dropped. Default `None`:
    /// - non-fleet, tokens never expire (ADR-012 §2: the in-process pin
    ///   does not expire) and live until released. Setting it is an
    ///   operator's choice that lets an idle token stop protecting its
    ///   entry;
    /// - fleet, it defaults to [`OpsConfig::pin_ttl`] and must not exceed
    ///   it ([`Ops::new`] refuses otherwise), so a token never outlives
    ///   the pin row it renews.
    ///
    /// Zero is refused.
    pub token_ttl: Option<Duration>,
    /// Cap on live pin tokens plus puts in flight (ADR-018). At the cap a
    /// put is refused with `too_many_tokens` before anything is stored; no
    /// token is ever evicted. Default [`DEFAULT_MAX_TOKENS`]; zero is
    /// refused.
    pub max_tokens: usize,
    /// Optional cap on the live tokens plus puts in flight of one token
    /// owner (the same refusal). Every caller of [`Ops::put`] is the
    /// store's owner today, so this binds like a lower `max_tokens`; it
    /// becomes a per-client cap once callers carry identities. Default
    /// `None`; zero is refused.
    pub max_tokens_per_owner: Option<usize>,
    /// The store's fleet pin-row lifetime. [`Ops::new`] takes it from the
    /// store ([`Store::pin_ttl`]); a value given here must match it. The
    /// token TTL is checked against it and defaults to it; ignored for a
    /// non-fleet store. Default `None`.
    pub pin_ttl: Option<Duration>,
    /// Resumable upload sessions ([`crate::uploads`], ADR-034): where they
    /// spool, their idle expiry and caps. `None` (the default): the upload
    /// routes answer `not_found`.
    pub uploads: Option<crate::uploads::UploadConfig>,
    /// This node's cache namespaces (ADR-048): puts there take no pin
    /// token (their cache key `cas/<digest>` protects the entry) and the
    /// build-cache routes (`/cache/{ns}/{key}`) serve them. Each must have
    /// the store's `Cache` policy; the store's kv engine must hold cache
    /// keys ([`Ops::new`] refuses otherwise). Default: none.
    pub cache_namespaces: std::collections::BTreeSet<store_core::Namespace>,
    /// Extra base paths of cache namespaces (`/bazel` → `bazel`): the
    /// build-cache routes also answer under `/bazel/{key}`. Each must be
    /// an absolute path of `[A-Za-z0-9._-]` segments that does not start
    /// with `/v1`, `/cache`, `/health` or `/metrics`, and name one of
    /// [`OpsConfig::cache_namespaces`] ([`Ops::new`] refuses otherwise).
    pub cache_paths: std::collections::BTreeMap<String, store_core::Namespace>,
    /// Write-once cache namespaces (`immutable = true`, ADR-052): a key,
    /// once set, names the same entry until an identity with `delete`
    /// removes it; a put of other bytes under it is refused (`403`). Each
    /// must be one of [`OpsConfig::cache_namespaces`]. Default: none.
    pub immutable_caches: std::collections::BTreeSet<store_core::Namespace>,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            max_blob_size: DEFAULT_MAX_BLOB_SIZE,
            max_have_digests: DEFAULT_MAX_HAVE_DIGESTS,
            token_ttl: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            max_tokens_per_owner: None,
            pin_ttl: None,
            uploads: None,
            cache_namespaces: Default::default(),
            cache_paths: Default::default(),
            immutable_caches: Default::default(),
        }
    }
}

/// Validates `cfg` for a store that is (`fleet`) or is not fleet, and
/// returns the effective token idle lifetime.
fn effective_token_ttl(fleet: bool, cfg: &OpsConfig) -> Result<Option<Duration>, Error> {
    if cfg.token_ttl == Some(Duration::ZERO) {
        return Err(Error::Config(
            "token_ttl must be greater than zero (leave it unset: non-fleet tokens then never \
             expire, fleet tokens live pin_ttl after their last renewal)"
                .into(),
        ));
    }
    if cfg.max_tokens == 0 {
        return Err(Error::Config(
            "max_tokens must be at least 1 (zero would refuse every put)".into(),
        ));
    }
    if cfg.max_tokens_per_owner == Some(0) {
        return Err(Error::Config(
            "max_tokens_per_owner must be at least 1 when set (zero would refuse every put)".into(),
        ));
    }
    if !fleet {
        return Ok(cfg.token_ttl);
    }
    let pin_ttl = cfg.pin_ttl.ok_or_else(|| {
        Error::Config(
            "the store is fleet: OpsConfig::pin_ttl must be set to the store's pin_ttl, \
             so that pin tokens cannot outlive the pin rows they renew (ADR-018)"
                .into(),
        )
    })?;
    match cfg.token_ttl {
        None => Ok(Some(pin_ttl)),
        Some(ttl) if ttl > pin_ttl => Err(Error::Config(format!(
            "token_ttl ({}s) exceeds pin_ttl ({}s): in fleet mode a pin token must not \
             outlive the pin row it renews (ADR-018); lower token_ttl or raise pin_ttl",
            ttl.as_secs_f64(),
            pin_ttl.as_secs_f64()
        ))),
        Some(ttl) => Ok(Some(ttl)),
    }
}

/// `d` ± 10%.
fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.9..1.1))
}

/// At most one "cap reached" warning per this interval.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(60);

struct Inner {
    store: Store,
    tokens: TokenRegistry<Pin>,
    metrics: Metrics,
    cfg: OpsConfig,
    /// When the last "token cap reached" warning was logged.
    last_cap_warning: Mutex<Option<Instant>>,
    /// The node's upload sessions, when enabled.
    uploads: Option<Arc<Uploads>>,
}

/// The ops-layer handlers over one [`Store`], with the process's pin-token
/// registry and counters. Cheap to clone; clones share everything.
///
/// Handlers return payloads or an [`OpsError`]; they do not count their
/// errors — a transport binding does that once per answered error with
/// [`Metrics::error`].
#[derive(Clone)]
pub struct Ops {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops")
            .field("store", &self.inner.store)
            .field("cfg", &self.inner.cfg)
            .field("tokens", &self.inner.tokens)
            .finish()
    }
}

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

fn parse_ns(namespace: &str) -> Result<Namespace, OpsError> {
    Namespace::new(namespace).map_err(OpsError::from)
}

fn parse_key(namespace: &str, digest: &str) -> Result<Key, OpsError> {
    Key::parse(namespace, digest).map_err(OpsError::from)
}

impl Ops {
    /// Handlers over `store` with `cfg`'s limits.
    ///
    /// Refuses with [`Error::Config`] a zero `token_ttl`, `max_tokens` or
    /// `max_tokens_per_owner`, and, when the store is fleet
    /// ([`Store::is_fleet`]), a `token_ttl` above the store's pin TTL
    /// ([`Store::pin_ttl`]) or an [`OpsConfig::pin_ttl`] that differs from it. The kept configuration ([`Ops::config`]) holds
    /// the effective `token_ttl` (fleet: `pin_ttl` when unset).
    pub fn new(store: Store, mut cfg: OpsConfig) -> Result<Self, Error> {
        if let Some(ttl) = store.pin_ttl() {
            match cfg.pin_ttl {
                Some(given) if given != ttl => {
                    return Err(Error::Config(format!(
                        "OpsConfig::pin_ttl ({}s) differs from the store's pin_ttl ({}s)",
                        given.as_secs_f64(),
                        ttl.as_secs_f64()
                    )))
                }
                _ => cfg.pin_ttl = Some(ttl),
            }
        }
        cfg.token_ttl = effective_token_ttl(store.is_fleet(), &cfg)?;
        for (path, ns) in &cfg.cache_paths {
            crate::cache::check_cache_path(path)?;
            if !cfg.cache_namespaces.contains(ns) {
                return Err(Error::Config(format!(
                    "http_path {path:?} names {ns}, which is not a cache namespace"
                )));
            }
        }
        if let Some(ns) = cfg
            .immutable_caches
            .iter()
            .find(|ns| !cfg.cache_namespaces.contains(*ns))
        {
            return Err(Error::Config(format!(
                "{ns} is write-once (immutable) but not a cache namespace"
            )));
        }
        if !cfg.cache_namespaces.is_empty() && store.cache().is_none() {
            return Err(Error::Config(format!(
                "cache namespaces {:?} need a kv engine that holds cache keys (sqlite, \
                 postgres or mem)",
                cfg.cache_namespaces
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
            )));
        }
        let uploads = cfg
            .uploads
            .clone()
            .map(Uploads::open)
            .transpose()?
            .map(Arc::new);
        Ok(Ops {
            inner: Arc::new(Inner {
                tokens: TokenRegistry::new(cfg.token_ttl, cfg.max_tokens, cfg.max_tokens_per_owner),
                store,
                metrics: Metrics::default(),
                cfg,
                last_cap_warning: Mutex::new(None),
                uploads,
            }),
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The limits.
    pub fn config(&self) -> &OpsConfig {
        &self.inner.cfg
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The pin-token registry.
    pub fn tokens(&self) -> &TokenRegistry<Pin> {
        &self.inner.tokens
    }

    /// `blobs/put`: stores `body` in `namespace` and mints a pin token.
    ///
    /// `len` is the declared length (a body of another length fails with
    /// `length_mismatch`); `expect` an expected digest (`verification` on
    /// mismatch). Bodies over [`OpsConfig::max_blob_size`] fail with
    /// `too_large` — immediately when `len` says so, otherwise as soon as
    /// the limit is crossed. A failed put publishes nothing; a read error
    /// of `body` aborts it.
    ///
    /// A token slot is reserved before `body` is read: at the cap
    /// ([`OpsConfig::max_tokens`], [`OpsConfig::max_tokens_per_owner`]) the
    /// put fails with `too_many_tokens` (with a retry delay) without
    /// reading `body` or storing anything. No existing token is evicted.
    ///
    /// **Cancel-safe** as far as the ops layer goes: dropping the future
    /// frees the reserved slot and mints no token (the slot is a drop
    /// guard). The store's own cancellation rules apply to the entry:
    /// cancelled before the store published it, nothing is stored; just
    /// after, the entry exists unpinned, like any entry no token protects.
    pub async fn put<R>(
        &self,
        namespace: &str,
        body: R,
        len: Option<u64>,
        expect: Option<&str>,
    ) -> Result<PutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        let owner = self.inner.store.owner().to_string();
        self.put_owned(&owner, namespace, body, len, expect).await
    }

    /// [`Ops::put`] for `identity`: the token belongs to it (only it, or
    /// an admin, may renew or release it) and counts against its cap
    /// ([`OpsConfig::max_tokens_per_owner`]). Scopes are the caller's
    /// business ([`Ops::authorize`] with [`Scope::Write`]). Cancel-safe as
    /// [`Ops::put`].
    pub async fn put_as<R>(
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
        self.put_owned(identity.name(), namespace, body, len, expect)
            .await
    }

    /// A put's namespace, its body limited to the largest accepted blob
    /// (refused at once when `len` says it is larger) and what the store
    /// checks it against.
    fn put_request<R>(
        &self,
        namespace: &str,
        body: R,
        len: Option<u64>,
        expect: Option<&str>,
    ) -> Result<(Namespace, Limited<R>, store_core::PutOptions), OpsError> {
        let ns = parse_ns(namespace)?;
        let expect = expect
            .map(|d| Digest::parse(d.trim()))
            .transpose()
            .map_err(OpsError::from)?;
        let limit = self.inner.cfg.max_blob_size;
        if let Some(n) = len {
            if n > limit {
                return Err(Error::TooLarge { limit, got: n }.into());
            }
        }
        let body = Limited {
            inner: body,
            seen: 0,
            limit,
        };
        Ok((ns, body, store_core::PutOptions { len, expect }))
    }

    async fn put_owned<R>(
        &self,
        owner: &str,
        namespace: &str,
        body: R,
        len: Option<u64>,
        expect: Option<&str>,
    ) -> Result<PutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        let (ns, body, options) = self.put_request(namespace, body, len, expect)?;
        if self.is_cache_namespace(&ns) {
            // No token (ADR-048): the cache key protects the entry once
            // written; the receipt's pin protects it until then.
            let receipt = self.inner.store.put_opts(&ns, body, options).await?;
            self.inner.metrics.put(receipt.size, receipt.deduplicated);
            // `cas/<digest>` names only its digest: nothing to replace.
            self.record_cache_key(
                &ns,
                &crate::cache::cas_key(&receipt.digest),
                &receipt,
                store_core::RefExpect::Any,
                store_core::Author::LIBRARY,
            )
            .await?;
            return Ok(PutOutcome {
                response: PutResponse {
                    token: None,
                    digest: receipt.digest.to_hex(),
                    cache: true,
                },
                size: receipt.size,
                tier: receipt.tier,
                deduplicated: receipt.deduplicated,
            });
        }
        // Reserve the token slot before anything is stored; dropped with
        // this future or on any error below, it frees itself.
        let slot = self
            .inner
            .tokens
            .reserve(owner)
            .map_err(|e| self.cap_reached(e))?;
        let receipt = self.inner.store.put_opts(&ns, body, options).await?;
        self.inner.metrics.put(receipt.size, receipt.deduplicated);
        let digest = receipt.digest;
        let (size, tier, deduplicated) = (receipt.size, receipt.tier, receipt.deduplicated);
        let key = receipt.key().clone();
        // The token holds the receipt's in-process pin (ADR-012 §2). In
        // fleet mode the put also committed a pin row, which renewal probes
        // extend through `Store::renew_pin` (ADR-018). No await between the
        // receipt and the mint: the pin cannot be lost to a cancellation.
        let token = slot.mint(key, receipt.pin);
        Ok(PutOutcome {
            response: PutResponse {
                token: Some(token),
                digest: digest.to_hex(),
                cache: false,
            },
            size,
            tier,
            deduplicated,
        })
    }

    /// The `too_many_tokens` answer; logs a warning at most once a minute.
    fn cap_reached(&self, e: TokenCapReached) -> OpsError {
        let now = Instant::now();
        let mut last = self
            .inner
            .last_cap_warning
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| now.duration_since(t) >= CAP_WARNING_EVERY) {
            *last = Some(now);
            let st = self.inner.tokens.stats();
            tracing::warn!(
                "refusing puts: {e} ({} live tokens, {} puts in flight, {} refusals so far)",
                st.live,
                st.reserved,
                st.refused
            );
        }
        e.into()
    }

    /// `blobs/have`: an existence probe (no token) or a renewal probe
    /// (token + exactly one digest). See ADR-012 §2 and ADR-018.
    ///
    /// Cancel-safe: it changes nothing but a token's idle deadline (when
    /// there is a TTL) and, in fleet mode, its pin row's expiry; a probe
    /// dropped between the two leaves the token ahead of its row, which
    /// the next probe corrects (`present: [false]` if the row expired).
    pub async fn have(&self, req: HaveRequest) -> Result<HaveResponse, OpsError> {
        self.have_owned(None, req).await
    }

    /// [`Ops::have`] for `identity`: a renewal probe fails with
    /// `forbidden` when the token belongs to another identity (nothing is
    /// renewed). Scopes are the caller's business ([`Scope::Read`] for an
    /// existence probe, [`Scope::Write`] for a renewal). Cancel-safe as
    /// [`Ops::have`].
    pub async fn have_as(
        &self,
        identity: &Identity,
        req: HaveRequest,
    ) -> Result<HaveResponse, OpsError> {
        self.have_owned(Some(identity), req).await
    }

    async fn have_owned(
        &self,
        identity: Option<&Identity>,
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
        let ns = parse_ns(&req.namespace)?;
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
                if let Some(id) = identity {
                    if self.inner.tokens.lookup(&token).is_some() {
                        self.check_owner(id, &token)?;
                    }
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
                if !self.inner.store.renew_pin(&key).await? {
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

    /// Releases a pin token (its pin is dropped, its slot under the caps
    /// freed). `missing` if the token is unknown, expired or was minted by
    /// another process.
    pub fn release_token(&self, token: &str) -> Result<(), OpsError> {
        if self.inner.tokens.release(token) {
            Ok(())
        } else {
            Err(OpsError::new(ErrorCode::Missing, "no such token"))
        }
    }

    /// [`Ops::release_token`] for `identity`: only the token's owner, or an
    /// identity with [`Scope::Admin`], may release it (`forbidden`
    /// otherwise, nothing released). The owner also needs
    /// [`Scope::Write`] on the token's namespace (a key whose write scope
    /// was withdrawn cannot act on what it minted). Returns the key the
    /// token pinned (for the audit line).
    pub fn release_token_as(&self, identity: &Identity, token: &str) -> Result<Key, OpsError> {
        let (key, _) = self.check_owner(identity, token)?;
        if !identity.allows(Scope::Admin, None) {
            self.authorize(identity, Scope::Write, Some(key.namespace.as_str()))?;
        }
        if self.inner.tokens.release(token) {
            Ok(key)
        } else {
            Err(OpsError::new(ErrorCode::Missing, "no such token"))
        }
    }

    /// The token's key and owner, if `identity` may act on it: it owns it,
    /// or is an admin. An unknown token is `missing`.
    pub(crate) fn check_owner(
        &self,
        identity: &Identity,
        token: &str,
    ) -> Result<(Key, String), OpsError> {
        let (key, owner) = self
            .inner
            .tokens
            .lookup(token)
            .ok_or_else(|| OpsError::new(ErrorCode::Missing, "no such token"))?;
        if owner != identity.name() && !identity.allows(Scope::Admin, None) {
            return Err(if identity.is_anonymous() {
                OpsError::new(
                    ErrorCode::Unauthorized,
                    "authentication required: this pin token belongs to an identity",
                )
            } else {
                OpsError::new(
                    ErrorCode::Forbidden,
                    "this pin token belongs to another identity",
                )
            });
        }
        Ok((key, owner))
    }

    /// `Ok` when `identity` holds `scope` on `namespace` (`None`: the whole
    /// server); otherwise `unauthorized` for the anonymous identity (it
    /// should authenticate) and `forbidden` for an authenticated one.
    pub fn authorize(
        &self,
        identity: &Identity,
        scope: Scope,
        namespace: Option<&str>,
    ) -> Result<(), OpsError> {
        if identity.allows(scope, namespace) {
            return Ok(());
        }
        let what = match namespace {
            Some(ns) => format!("{scope} on namespace {ns:?}"),
            None => format!("{scope} on the server"),
        };
        Err(if identity.is_anonymous() {
            OpsError::new(
                ErrorCode::Unauthorized,
                format!("authentication required: anonymous requests may not {what}"),
            )
        } else {
            OpsError::new(
                ErrorCode::Forbidden,
                format!("identity {:?} lacks the scope {what}", identity.name()),
            )
        })
    }

    /// Ends expired tokens now (dropping their pins); returns how many.
    pub fn reap_tokens(&self) -> usize {
        self.inner.tokens.reap()
    }

    /// The upload sessions, or `not_found` when they are not enabled.
    fn uploads(&self) -> Result<&Arc<Uploads>, OpsError> {
        self.inner.uploads.as_ref().ok_or_else(|| {
            OpsError::new(
                ErrorCode::NotFound,
                "resumable uploads are not enabled on this server (OpsConfig::uploads)",
            )
        })
    }

    /// The session `id` of `namespace`, if `identity` may use it.
    fn upload_session(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
    ) -> Result<(&Arc<Uploads>, Arc<crate::uploads::Session>), OpsError> {
        let uploads = self.uploads()?;
        let admin = identity.allows(Scope::Admin, None);
        let session = uploads.find(namespace, id, identity.name(), admin)?;
        Ok((uploads, session))
    }

    /// `uploads/open`: opens a resumable upload session into `namespace`
    /// for `identity` (ADR-034). Refused with `too_many_uploads` at the
    /// session caps. Cancel-safe: a dropped call leaves no session a client
    /// knows of (at worst an idle one that is reaped).
    pub async fn upload_open(
        &self,
        identity: &Identity,
        namespace: &str,
    ) -> Result<UploadStatus, OpsError> {
        let ns = parse_ns(namespace)?;
        self.uploads()?.create(identity.name(), ns).await
    }

    /// `uploads/status`: where session `id` stands (its committed offset).
    /// Cancel-safe: it only reads.
    pub async fn upload_status(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
    ) -> Result<UploadStatus, OpsError> {
        let (_, session) = self.upload_session(identity, namespace, id)?;
        Ok(session.status())
    }

    /// `uploads/append`: appends `body` to session `id`, starting at
    /// `start` (which must be the committed offset: `upload_offset`
    /// otherwise; `None` appends at it), and returns the new status. Each
    /// acknowledged append is synced; a body that breaks commits what
    /// arrived and fails with `incomplete_body`. The total is capped at
    /// [`OpsConfig::max_blob_size`].
    ///
    /// Cancel-safe: the committed offset advances only once the bytes are
    /// synced, and never for the part a dropped call was writing.
    pub async fn upload_append<R: AsyncRead + Unpin + Send>(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
        start: Option<u64>,
        body: R,
    ) -> Result<UploadStatus, OpsError> {
        let (uploads, session) = self.upload_session(identity, namespace, id)?;
        let guard = uploads.claim(&session)?;
        uploads
            .append(&session, &guard, start, body, self.inner.cfg.max_blob_size)
            .await?;
        Ok(session.status())
    }

    /// `uploads/finish`: appends `body` (the last chunk, possibly empty) at
    /// `start` as [`Ops::upload_append`], then stores the session's bytes
    /// in its namespace through the ordinary put, expecting `digest`, and
    /// ends the session: the answer is a put's (token and digest). A
    /// mismatch fails with `verification` and publishes nothing; the
    /// session stays (abort it, or let it expire).
    ///
    /// Cancel-safe as [`Ops::put`]: a dropped call leaves the session as
    /// it was (and at worst an unpinned entry, which a retried finish
    /// deduplicates onto).
    pub async fn upload_finish<R: AsyncRead + Unpin + Send>(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
        digest: &str,
        start: Option<u64>,
        body: R,
    ) -> Result<PutOutcome, OpsError> {
        let expect = Digest::parse(digest.trim()).map_err(OpsError::from)?;
        let (uploads, session) = self.upload_session(identity, namespace, id)?;
        let guard = uploads.claim(&session)?;
        uploads
            .append(&session, &guard, start, body, self.inner.cfg.max_blob_size)
            .await?;
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
        let hex = expect.to_hex();
        let out = self
            .put_owned(
                &session.owner,
                session.ns.as_str(),
                reader,
                Some(session.offset()),
                Some(&hex),
            )
            .await?;
        uploads.remove(&session, &guard).await?;
        drop(guard);
        Ok(out)
    }

    /// `uploads/abort`: ends session `id` and removes its bytes.
    /// Cancel-safe: once it starts removing, the removal runs to its end.
    pub async fn upload_abort(
        &self,
        identity: &Identity,
        namespace: &str,
        id: &str,
    ) -> Result<(), OpsError> {
        let (uploads, session) = self.upload_session(identity, namespace, id)?;
        let guard = uploads.claim(&session)?;
        uploads.remove(&session, &guard).await
    }

    /// How many times an upload session's spool file was read whole (a
    /// matching finish, or a hasher rebuilt after a restart); 0 when
    /// uploads are not enabled. A wrong-digest finish never reads it.
    pub fn upload_spool_reads(&self) -> u64 {
        self.inner.uploads.as_ref().map_or(0, |u| u.spool_reads())
    }

    /// Open upload sessions (0 when uploads are not enabled).
    pub fn upload_sessions(&self) -> usize {
        self.inner.uploads.as_ref().map_or(0, |u| u.len())
    }

    /// Reaps upload sessions idle past their timeout; returns how many.
    pub async fn reap_uploads(&self) -> usize {
        match &self.inner.uploads {
            Some(u) => u.reap().await,
            None => 0,
        }
    }

    /// Spawns the upload-session reaper (every quarter of the idle timeout,
    /// at most a minute), or `None` when uploads are not enabled. The task
    /// stops by itself once every clone of this `Ops` is dropped.
    pub fn spawn_upload_reaper(&self) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.inner.uploads.as_ref()?.reap_every();
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(uploads) = weak.upgrade().and_then(|i| i.uploads.clone()) else {
                    return;
                };
                uploads.reap().await;
            }
        }))
    }

    /// Spawns a task ending expired tokens every `every` (useful only when
    /// tokens have a TTL). The task stops by itself once every clone of
    /// this `Ops` is dropped.
    pub fn spawn_token_reaper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(inner) => {
                        inner.tokens.reap();
                    }
                    None => return,
                }
            }
        })
    }

    /// Spawns a task running [`Ops::sweep`] every `every` ±10% (jitter, so
    /// the nodes of a fleet drift apart; the fleet sweep lock keeps at most
    /// one sweep running and a node that finds it held reports
    /// `aborted: sweeper_lock`). Each report goes to the `blobpool::gc`
    /// log target and to the sweep metrics. The task stops by itself once
    /// every clone of this `Ops` is dropped, or when aborted (a sweep in
    /// progress then finishes its batch: sweeps run as tasks of their own,
    /// ADR-021).
    pub fn spawn_sweep_scheduler(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(jittered(every)).await;
                let Some(inner) = weak.upgrade() else { return };
                let ops = Ops { inner };
                match ops.sweep().await {
                    Ok(report) => tracing::info!(
                        target: "blobpool::gc",
                        "scheduled sweep: {}",
                        serde_json::to_string(&report).unwrap_or_default()
                    ),
                    Err(e) => {
                        tracing::warn!(target: "blobpool::gc", "scheduled sweep failed: {}", store_types::Report::new(&e))
                    }
                }
            }
        })
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
        let key = parse_key(namespace, digest)?;
        let store = &self.inner.store;
        let resp = match range {
            None => {
                let blob = store
                    .get(&key)
                    .await?
                    .ok_or_else(|| OpsError::from(Error::Missing))?;
                GetResponse {
                    digest: key.digest,
                    size: blob.len(),
                    tier: blob.tier(),
                    range: None,
                    blob,
                }
            }
            Some(req) => {
                let stat = store
                    .stat(&key)
                    .await?
                    .ok_or_else(|| OpsError::from(Error::Missing))?;
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
        let key = parse_key(namespace, digest)?;
        let store = &self.inner.store;
        let stat = store
            .stat(&key)
            .await?
            .ok_or_else(|| OpsError::from(Error::Missing))?;
        let range = match range {
            None => None,
            Some(req) => Some(resolve_range(stat.size, req)?),
        };
        let stream = if stat.size <= BAO_MEMORY_MAX {
            let blob = store
                .get(&key)
                .await?
                .ok_or_else(|| OpsError::from(Error::Missing))?;
            let data = blob.bytes().await?;
            crate::bao::encode_memory(key.digest, data, range.as_ref())?
        } else {
            let hashes = store
                .outboard(&key)
                .await?
                .ok_or_else(|| OpsError::from(Error::Missing))?;
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
        let key = parse_key(namespace, digest)?;
        let stat = self
            .inner
            .store
            .stat(&key)
            .await?
            .ok_or_else(|| OpsError::from(Error::Missing))?;
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
        let key = parse_key(namespace, digest)?;
        self.inner.store.delete(&key).await?;
        self.inner.metrics.delete();
        Ok(())
    }

    /// One GC pass; the report is data even when the sweep aborted.
    pub async fn sweep(&self) -> Result<SweepReport, OpsError> {
        let report = self.inner.store.sweep(SweepOptions::default()).await?;
        self.inner.metrics.sweep(&report);
        Ok(report)
    }

    /// Asks every tier one cheap question; `status: "unavailable"` with the
    /// error when a tier fails.
    pub async fn health(&self) -> HealthResponse {
        let store = &self.inner.store;
        let probe_ns = Namespace::new("health").expect("valid namespace");
        let probe = store
            .has_many(&probe_ns, &[Digest::from_bytes([0; 32])])
            .await;
        HealthResponse {
            status: if probe.is_ok() { "ok" } else { "unavailable" }.to_string(),
            mode: mode_name(store),
            fleet: store.is_fleet(),
            tokens: self.inner.tokens.len() as u64,
            error: probe
                .err()
                .map(|e| store_types::Report::new(&e).to_string()),
        }
    }

    /// The Prometheus text exposition of the counters.
    pub fn render_metrics(&self) -> String {
        self.inner.tokens.reap();
        self.inner.metrics.render(&self.inner.tokens.stats())
    }
}

fn mode_name(store: &Store) -> String {
    match store.mode() {
        store_core::Mode::MemOnly => "mem-only",
        store_core::Mode::KvOnly { .. } => "kv-only",
        store_core::Mode::DualTier { .. } => "dual-tier",
    }
    .to_string()
}

/// Fails the read with `TooLarge` once more than `limit` bytes went by.
pub(crate) struct Limited<R> {
    inner: R,
    seen: u64,
    limit: u64,
}

impl<R> Limited<R> {
    pub(crate) fn new(inner: R, limit: u64) -> Self {
        Limited {
            inner,
            seen: 0,
            limit,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    fn cfg(token_ttl: Option<Duration>, pin_ttl: Option<Duration>) -> OpsConfig {
        OpsConfig {
            token_ttl,
            pin_ttl,
            ..Default::default()
        }
    }

    fn config_error(r: Result<Option<Duration>, Error>) -> String {
        match r {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn non_fleet_tokens_have_no_idle_expiry_unless_set() {
        assert_eq!(OpsConfig::default().token_ttl, None);
        assert_eq!(effective_token_ttl(false, &cfg(None, None)).unwrap(), None);
        // pin_ttl is irrelevant outside a fleet.
        assert_eq!(
            effective_token_ttl(false, &cfg(None, secs(60))).unwrap(),
            None
        );
        // An operator's explicit choice is kept, whatever pin_ttl says.
        assert_eq!(
            effective_token_ttl(false, &cfg(secs(3600), secs(60))).unwrap(),
            secs(3600)
        );
    }

    #[test]
    fn fleet_token_ttl_defaults_to_and_is_bounded_by_pin_ttl() {
        assert_eq!(
            effective_token_ttl(true, &cfg(None, secs(900))).unwrap(),
            secs(900)
        );
        assert_eq!(
            effective_token_ttl(true, &cfg(secs(300), secs(900))).unwrap(),
            secs(300)
        );
        assert_eq!(
            effective_token_ttl(true, &cfg(secs(900), secs(900))).unwrap(),
            secs(900)
        );
        let m = config_error(effective_token_ttl(true, &cfg(secs(901), secs(900))));
        assert!(m.contains("token_ttl (901s) exceeds pin_ttl (900s)"), "{m}");
        // Without pin_ttl the bound cannot be checked: refused.
        let m = config_error(effective_token_ttl(true, &cfg(None, None)));
        assert!(m.contains("pin_ttl must be set"), "{m}");
        let m = config_error(effective_token_ttl(true, &cfg(secs(10), None)));
        assert!(m.contains("pin_ttl must be set"), "{m}");
    }

    #[test]
    fn scheduled_sweeps_are_jittered_within_ten_percent() {
        for _ in 0..200 {
            let j = jittered(Duration::from_secs(100));
            assert!(
                j >= Duration::from_secs(90) && j <= Duration::from_secs(110),
                "{j:?}"
            );
        }
    }

    #[test]
    fn zero_limits_are_refused() {
        for fleet in [false, true] {
            let m = config_error(effective_token_ttl(fleet, &cfg(secs(0), secs(900))));
            assert!(m.contains("token_ttl must be greater than zero"), "{m}");
            let c = OpsConfig {
                max_tokens: 0,
                pin_ttl: secs(900),
                ..Default::default()
            };
            assert!(config_error(effective_token_ttl(fleet, &c)).contains("max_tokens"));
            let c = OpsConfig {
                max_tokens_per_owner: Some(0),
                pin_ttl: secs(900),
                ..Default::default()
            };
            assert!(config_error(effective_token_ttl(fleet, &c)).contains("max_tokens_per_owner"));
        }
    }
}
