//! The transport-neutral handlers.

use std::io;
use std::ops::Range;
use std::pin::Pin as StdPin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use store_core::{
    Blob, Digest, Error, Key, Namespace, Pin, Store, SweepOptions, SweepReport, Tier,
};
use tokio::io::{AsyncRead, ReadBuf};

use crate::error::{ErrorCode, OpsError};
use crate::metrics::Metrics;
use crate::payload::{HaveRequest, HaveResponse, HealthResponse, PutResponse, StatResponse};
use crate::range::RangeRequest;
use crate::tokens::{TokenRegistry, DEFAULT_MAX_TOKENS, DEFAULT_TOKEN_TTL};

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
    /// Idle lifetime of a pin token (ADR-018). Default
    /// [`DEFAULT_TOKEN_TTL`].
    pub token_ttl: Duration,
    /// Cap on live pin tokens (ADR-018). Default [`DEFAULT_MAX_TOKENS`].
    pub max_tokens: usize,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            max_blob_size: DEFAULT_MAX_BLOB_SIZE,
            max_have_digests: DEFAULT_MAX_HAVE_DIGESTS,
            token_ttl: DEFAULT_TOKEN_TTL,
            max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

struct Inner {
    store: Store,
    tokens: TokenRegistry<Pin>,
    metrics: Metrics,
    cfg: OpsConfig,
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

fn parse_ns(namespace: &str) -> Result<Namespace, OpsError> {
    Namespace::new(namespace).map_err(OpsError::from)
}

fn parse_key(namespace: &str, digest: &str) -> Result<Key, OpsError> {
    Key::parse(namespace, digest).map_err(OpsError::from)
}

impl Ops {
    /// Handlers over `store` with `cfg`'s limits.
    pub fn new(store: Store, cfg: OpsConfig) -> Self {
        Ops {
            inner: Arc::new(Inner {
                tokens: TokenRegistry::new(cfg.token_ttl, cfg.max_tokens),
                store,
                metrics: Metrics::default(),
                cfg,
            }),
        }
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
        let receipt = self.inner.store.put(&ns, body, len, expect).await?;
        self.inner.metrics.put(receipt.size, receipt.deduplicated);
        let digest = receipt.digest;
        let (size, tier, deduplicated) = (receipt.size, receipt.tier, receipt.deduplicated);
        let key = receipt.key().clone();
        // The token holds the receipt's in-process pin (ADR-012 §2). In
        // fleet mode the put also committed a pin row, which renewal probes
        // extend through `Store::renew_pin` (ADR-018).
        let token = self
            .inner
            .tokens
            .mint(key, self.inner.store.owner(), receipt.pin);
        Ok(PutOutcome {
            response: PutResponse {
                token,
                digest: digest.to_hex(),
            },
            size,
            tier,
            deduplicated,
        })
    }

    /// `blobs/have`: an existence probe (no token) or a renewal probe
    /// (token + exactly one digest). See ADR-012 §2 and ADR-018.
    pub async fn have(&self, req: HaveRequest) -> Result<HaveResponse, OpsError> {
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
                // (a) the token must map to a pin on this key, in this
                // namespace (extending the token's idle deadline)...
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

    /// Releases a pin token (its pin is dropped). `missing` if the token is
    /// unknown, expired or was minted by another process.
    pub fn release_token(&self, token: &str) -> Result<(), OpsError> {
        if self.inner.tokens.release(token) {
            Ok(())
        } else {
            Err(OpsError::new(ErrorCode::Missing, "no such token"))
        }
    }

    /// Ends expired tokens now (dropping their pins); returns how many.
    pub fn reap_tokens(&self) -> usize {
        self.inner.tokens.reap()
    }

    /// Spawns a task ending expired tokens every `every`. The task stops by
    /// itself once every clone of this `Ops` is dropped.
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
                let unsatisfiable = |msg: String| OpsError {
                    size: Some(stat.size),
                    ..OpsError::new(ErrorCode::InvalidRange, msg)
                };
                let r = match req {
                    RangeRequest::Multiple => {
                        return Err(unsatisfiable(
                            "multiple byte ranges are not supported; ask for one range".into(),
                        ))
                    }
                    RangeRequest::Single(r) => r.resolve(stat.size).ok_or_else(|| {
                        unsatisfiable(format!(
                            "range {r} is not satisfiable for an entry of {} bytes",
                            stat.size
                        ))
                    })?,
                };
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
            error: probe.err().map(|e| e.to_string()),
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
struct Limited<R> {
    inner: R,
    seen: u64,
    limit: u64,
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
