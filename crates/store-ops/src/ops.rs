//! [`Ops`], the transport-neutral handler set, and its construction. The
//! handlers live beside it by area: [`blobs`] (put, have, get, stat,
//! delete), [`tokens`] (release and owner checks), [`uploads`] (resumable
//! sessions), [`tasks`] (reapers, sweep scheduler, inventory refresher);
//! the crate's `admin`, `cache` and `refs` files add theirs. Each area
//! file uses this one, never the reverse.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use store_core::{Error, Pin, Store};

use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::metrics::Metrics;
use crate::tokens::TokenRegistry;
use crate::uploads::Uploads;
use config::OpsConfig;

mod background;
pub(crate) mod blobs;
pub(crate) mod config;
mod tasks;
mod tokens;
pub(crate) mod uploads;

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

impl Ops {
    /// Handlers over `store` with `cfg`'s limits.
    ///
    /// Refuses with [`Error::Config`] a zero `token_ttl`, `max_tokens` or
    /// `max_tokens_per_owner`, and, when the store is fleet
    /// ([`Gc::is_fleet`](store_core::Gc::is_fleet)), a `token_ttl` above
    /// the store's pin TTL ([`Gc::pin_ttl`](store_core::Gc::pin_ttl)) or an
    /// [`OpsConfig::pin_ttl`] that differs from it. The kept configuration
    /// ([`Ops::config`]) holds the effective `token_ttl` (fleet: `pin_ttl`
    /// when unset).
    pub fn new(store: Store, cfg: OpsConfig) -> Result<Self, Error> {
        let cfg = cfg.checked(&store)?;
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
}
