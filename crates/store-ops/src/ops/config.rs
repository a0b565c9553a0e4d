//! [`OpsConfig`]: the limits, token lifetime and cache namespaces of an
//! [`crate::Ops`], and their validation against the store.

use std::time::Duration;

use store_core::{Error, RefName, Store};

use crate::tokens::DEFAULT_MAX_TOKENS;

/// Default largest blob a put accepts: 16 GiB.
pub const DEFAULT_MAX_BLOB_SIZE: u64 = 16 << 30;

/// Default largest `digests` list of one `blobs/have` existence probe.
pub const DEFAULT_MAX_HAVE_DIGESTS: usize = 10_000;

/// Limits and token lifetime of an [`Ops`](crate::Ops).
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
    ///   it ([`Ops::new`](crate::Ops::new) refuses otherwise), so a token never outlives
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
    /// owner (the same refusal). Tokens belong to the identity
    /// that put ([`Ops::put`](crate::Ops::put)). Default
    /// `None`; zero is refused.
    pub max_tokens_per_owner: Option<usize>,
    /// The store's fleet pin-row lifetime. [`Ops::new`](crate::Ops::new)
    /// takes it from the store ([`Gc::pin_ttl`](store_core::Gc::pin_ttl));
    /// a value given here must match it. The token TTL is checked against
    /// it and defaults to it; ignored for a non-fleet store. Default `None`.
    pub pin_ttl: Option<Duration>,
    /// Resumable upload sessions ([`crate::uploads`], ADR-034): where they
    /// spool, their idle expiry and caps. `None` (the default): the upload
    /// routes answer `not_found`.
    pub uploads: Option<crate::uploads::UploadConfig>,
    /// This node's cache namespaces (ADR-048): puts there take no pin
    /// token (their cache key `cas/<digest>` protects the entry) and the
    /// build-cache routes (`/cache/{ns}/{key}`) serve them. Each must have
    /// the store's `Cache` policy; the store's kv engine must hold cache
    /// keys ([`Ops::new`](crate::Ops::new) refuses otherwise). Default: none.
    pub cache_namespaces: std::collections::BTreeSet<store_core::Namespace>,
    /// Extra base paths of cache namespaces (`/bazel` → `bazel`): the
    /// build-cache routes also answer under `/bazel/{key}`. Each must be
    /// an absolute path of `[A-Za-z0-9._-]` segments that does not start
    /// with `/v1`, `/cache`, `/health` or `/metrics`, and name one of
    /// [`OpsConfig::cache_namespaces`] ([`Ops::new`](crate::Ops::new) refuses otherwise).
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

impl OpsConfig {
    /// This configuration checked against `store` (see [`crate::Ops::new`]),
    /// with the store's pin TTL and the effective token TTL filled in.
    pub(crate) fn checked(mut self, store: &Store) -> Result<OpsConfig, Error> {
        if let Some(ttl) = store.gc().pin_ttl() {
            match self.pin_ttl {
                Some(given) if given != ttl => {
                    return Err(Error::Config(format!(
                        "OpsConfig::pin_ttl ({}s) differs from the store's pin_ttl ({}s)",
                        given.as_secs_f64(),
                        ttl.as_secs_f64()
                    )))
                }
                _ => self.pin_ttl = Some(ttl),
            }
        }
        self.token_ttl = effective_token_ttl(store.gc().is_fleet(), &self)?;
        for (path, ns) in &self.cache_paths {
            check_cache_path(path)?;
            if !self.cache_namespaces.contains(ns) {
                return Err(Error::Config(format!(
                    "http_path {path:?} names {ns}, which is not a cache namespace"
                )));
            }
        }
        if let Some(ns) = self
            .immutable_caches
            .iter()
            .find(|ns| !self.cache_namespaces.contains(*ns))
        {
            return Err(Error::Config(format!(
                "{ns} is write-once (immutable) but not a cache namespace"
            )));
        }
        if !self.cache_namespaces.is_empty() && store.cache().is_none() {
            return Err(Error::Config(format!(
                "cache namespaces {:?} need a kv engine that holds cache keys (sqlite, \
                 postgres or mem)",
                self.cache_namespaces
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
            )));
        }
        Ok(self)
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
/// Checks a cache namespace's extra base path (`http_path`): absolute,
/// `[A-Za-z0-9._-]` segments, not shadowing the server's own routes.
pub fn check_cache_path(path: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::Config(format!("http_path {path:?}: {why}")));
    let Some(rest) = path.strip_prefix('/') else {
        return bad("must start with /");
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() {
        return bad("must not be the root");
    }
    if let Err(e) = RefName::new(rest) {
        return bad(&e.to_string());
    }
    let first = rest.split('/').next().unwrap_or_default();
    if ["v1", "cache", "health", "metrics"].contains(&first) {
        return bad(
            "must not start with /v1, /cache, /health or /metrics (the server's own routes)",
        );
    }
    Ok(())
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
