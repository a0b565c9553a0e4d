//! The build-cache operations (issue 31, ADR-048): keys of a cache
//! namespace, as the HTTP cache protocol of ccache, sccache (WebDAV),
//! Gradle and Bazel names them, over [`store_core::Cache`].
//!
//! A key is a path of `[A-Za-z0-9._-]` segments (a reference name's
//! rules, at most 255 bytes): `ab/cdef…` (ccache `subdirs`), `<hex>`
//! (ccache `flat`, Gradle), `ac/<hex>` (Bazel, ccache `bazel`),
//! `a/b/c/<hex>` (sccache). Puts in a cache namespace issue no pin
//! token; every put records `cas/<digest>` or the given key.
//!
//! # Content addresses: SHA-256 and BLAKE3 (ADR-070)
//!
//! `cas/<64 hex>` is content addressed, by SHA-256 (Bazel's default, every
//! REAPI client's) or BLAKE3 (Blobpool's digest). Entries stay stored
//! under their BLAKE3 digest; the key `cas/<sha256>` pointing at the entry
//! *is* the SHA-256 index, so the cache's bound keeps both consistent
//! with no second table: a trim evicts the key (the name goes with it),
//! and the entry lives while any key names it. A put is verified while
//! it is read: the body's SHA-256 or BLAKE3 must be the name (over HTTP,
//! which does not say which; [`CacheOps::put_cas`] may say), else
//! `verification` (422) and nothing is stored or keyed. A get finds the
//! key, else — a BLAKE3 name — an entry of that digest put without it.
//!
//! # Action results (ADR-070)
//!
//! An `ac/<hash>` entry that is a REAPI `ActionResult` is served only
//! while every output it names is present (404 otherwise, and the client
//! runs the action again), and a hit refreshes the outputs' recency; the
//! rule, and what is served unvalidated, is in the `action` module's
//! docs. [`CacheOps::get_action_result`], [`CacheOps::put_action_result`],
//! [`CacheOps::put_cas`], [`CacheOps::get_cas`] and
//! [`CacheOps::find_missing`] are the calls a REAPI binding (gRPC) makes.

mod action;
mod cas;

pub use action::{ACTION_RESULT_MAX, TREE_CHECKED_MAX};
pub use cas::{CasDigest, DigestFunction};

use bytes::Bytes;
use store_core::{Author, Cache, Digest, Key, Namespace, PutReceipt, RefExpect, RefName, Replace};
use store_types::Error;
use tokio::io::AsyncRead;

use action::Validity;
use cas::Verifying;

use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::ops::blobs::Limited;
use crate::range::RangeRequest;
use crate::{GetResponse, Ops, PutOutcome, StatResponse};

/// The key a content-addressed put by BLAKE3 records: `cas/<digest>`
/// (Bazel's CAS path; a SHA-256 name's key is `cas/<sha256>`).
pub fn cas_key(digest: &Digest) -> RefName {
    RefName::new(format!("cas/{}", digest.to_hex())).expect("a digest's hex is a valid name")
}

pub use crate::ops::config::check_cache_path;

/// The 32 bytes a `cas/<64 hex>` key names (a SHA-256 or BLAKE3 digest);
/// `None` for other keys.
fn cas_digest(key: &RefName) -> Result<Option<Digest>, OpsError> {
    match key.as_str().strip_prefix("cas/") {
        Some(hex) => Digest::parse(hex).map(Some).map_err(|_| {
            OpsError::new(
                ErrorCode::KeyInvalid,
                format!(
                    "cache key {key}: a cas/ key names the body's SHA-256 digest (Bazel's \
                     default) or its BLAKE3 digest (bazel --digest_function=blake3 build, a \
                     startup option) in 64 lowercase hex characters"
                ),
            )
        }),
        None => Ok(None),
    }
}

/// A `/cache/{ns}/{key}` key as the cache handlers parse it: the key and,
/// for a `cas/` key, the 32 bytes it names (`key_invalid` otherwise). For
/// the `cache_keys` fuzz target.
#[doc(hidden)]
pub fn parse_cache_key(key: &str) -> Result<(RefName, Option<Digest>), OpsError> {
    let key = cache_key(key)?;
    let digest = cas_digest(&key)?;
    Ok((key, digest))
}

fn cache_key(key: &str) -> Result<RefName, OpsError> {
    RefName::new(key).map_err(|e| OpsError::new(ErrorCode::KeyInvalid, format!("cache key: {e}")))
}

fn no_entry(key: &RefName, ns: &Namespace) -> OpsError {
    OpsError::new(ErrorCode::NotFound, format!("no cache entry {key} in {ns}"))
}

/// `r`, unless it found the entry `key` named missing: then the key is
/// forgotten (a sweep deleted its entry) and the answer is `not_found`.
async fn unless_gone<T>(
    r: Result<T, OpsError>,
    ns: &Namespace,
    cache: &Cache,
    key: &RefName,
    d: Digest,
) -> Result<T, OpsError> {
    match r {
        Err(e) if e.code == ErrorCode::Missing => {
            cache.forget_missing(ns, key, d).await?;
            Err(no_entry(key, ns))
        }
        r => r,
    }
}

/// The refusal of an entry larger than `ns`'s `max_bytes` (ADR-069):
/// `too_large`, 413.
fn over_bound(ns: &Namespace, max: u64, got: u64) -> OpsError {
    OpsError::new(
        ErrorCode::TooLarge,
        format!(
            "cache namespace {ns} holds at most {max} bytes (max_bytes) and this entry has at \
             least {got}: an entry larger than the bound is refused"
        ),
    )
}

/// `r`, the outcome of a put that read `body` (capped at `ns`'s
/// `max_bytes`), with a refusal for passing the bound named as such.
fn capped_outcome<R, T>(
    body: &Limited<R>,
    ns: &Namespace,
    r: store_core::Result<T>,
) -> Result<T, OpsError> {
    match body.passed() {
        Some((max, seen)) => Err(over_bound(ns, max, seen)),
        None => Ok(r?),
    }
}

/// What a cache put stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachePutOutcome {
    /// The entry's digest.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// Whether the entry existed already.
    pub deduplicated: bool,
    /// The digest the key named before (`None`: the key is new).
    pub previous: Option<Digest>,
}

impl Ops {
    /// What `identity` may replace of others' keys and references in `ns`
    /// (issue 39, ADR-052): nothing but its own rows with only `write`;
    /// anything with `delete`; nothing at all in a write-once cache
    /// namespace (there a key changes only by `DELETE` then `PUT`).
    pub(crate) fn author<'a>(&self, identity: &'a Identity, ns: &Namespace) -> Author<'a> {
        let may = if self.config().immutable_caches.contains(ns) {
            Replace::Nothing
        } else if identity.allows(Scope::Delete, Some(ns.as_str())) {
            Replace::Any
        } else {
            Replace::Own
        };
        Author {
            name: Some(identity.name()),
            may,
        }
    }

    /// Whether `ns` is one of this node's cache namespaces.
    pub(crate) fn is_cache_namespace(&self, ns: &Namespace) -> bool {
        self.config().cache_namespaces.contains(ns)
    }

    /// Writes `key → receipt's entry` while the receipt's pin holds it, if
    /// `expect` holds and `author` may change the key; returns the digest
    /// the key named before.
    pub(crate) async fn record_cache_key(
        &self,
        ns: &Namespace,
        key: &RefName,
        receipt: &PutReceipt,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>, OpsError> {
        let previous = self
            .cache_index()?
            .record_by(ns, key, receipt, expect, author)
            .await?;
        self.metrics().cache_put(ns.as_str(), receipt.size);
        Ok(previous)
    }

    /// `body` capped at `ns`'s `max_bytes` (ADR-069), refused at once
    /// (`too_large`) when `len` says it is larger.
    fn capped<R>(&self, ns: &Namespace, body: R, len: Option<u64>) -> Result<Limited<R>, OpsError> {
        let max = (self.cache_index()?.bound(ns)).and_then(|b| b.max_bytes);
        match (len, max) {
            (Some(n), Some(max)) if n > max => Err(over_bound(ns, max, n)),
            _ => Ok(Limited::new(body, max.unwrap_or(u64::MAX))),
        }
    }

    /// A put into cache namespace `ns` by the blob route: no token
    /// (ADR-048): its `cas/<digest>` key protects the entry once written,
    /// the receipt's pin until then. Larger than `max_bytes`: `too_large`.
    pub(crate) async fn put_cache_entry<R>(
        &self,
        ns: &Namespace,
        body: R,
        options: store_core::PutOptions,
    ) -> Result<PutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        let mut body = self.capped(ns, body, options.len)?;
        let r = self.store().put_opts(ns, &mut body, options).await;
        let receipt = capped_outcome(&body, ns, r)?;
        self.metrics().put(receipt.size, receipt.deduplicated);
        // `cas/<digest>` names only its digest: nothing to replace.
        let key = cas_key(&receipt.digest);
        self.record_cache_key(ns, &key, &receipt, RefExpect::Any, Author::LIBRARY)
            .await?;
        Ok(PutOutcome::of(&receipt, true))
    }

    fn cache_index(&self) -> Result<Cache, OpsError> {
        let none = || Error::Config("this kv engine holds no cache keys".into()).into();
        self.store().cache().ok_or_else(none)
    }

    /// The build-cache handlers.
    pub fn cache(&self) -> CacheOps<'_> {
        CacheOps(self)
    }
}

/// The build-cache handlers of an [`Ops`] ([`Ops::cache`]).
#[derive(Clone, Copy, Debug)]
pub struct CacheOps<'a>(&'a Ops);

impl CacheOps<'_> {
    fn ns(&self, namespace: &str) -> Result<(Namespace, Cache), OpsError> {
        let ns = Namespace::new(namespace)?;
        if !self.0.is_cache_namespace(&ns) {
            return Err(OpsError::new(
                ErrorCode::NotFound,
                format!(
                    "namespace {ns} is not a cache namespace on this server (configure \
                     [gc.namespaces.{ns}] policy = \"cache\")"
                ),
            ));
        }
        Ok((ns, self.0.cache_index()?))
    }

    /// `Ok` when `namespace` is one of this node's cache namespaces, else
    /// the `not_found` answer naming the configuration it needs.
    pub fn check(&self, namespace: &str) -> Result<(), OpsError> {
        self.ns(namespace).map(|_| ())
    }

    /// `PUT /cache/{ns}/{key}` by `identity` (scope `write`, checked
    /// here): stores the body and points `key` at it if `precondition`
    /// holds (`If-Match` / `If-None-Match: *`: `ref_conflict`, 412,
    /// otherwise) and the identity may change the key (ADR-052: with only
    /// `write`, a key another identity set is replaced only by the same
    /// bytes, and a write-once namespace's keys by nobody: `forbidden`,
    /// 403). A `cas/<hex>` key's body must hash to the name by SHA-256 or
    /// BLAKE3 ([`CacheOps::put_cas`] with no function: `verification`,
    /// 422, otherwise, nothing stored). No pin token is issued.
    ///
    /// A body larger than the namespace's `max_bytes` is refused with
    /// `too_large` (413, ADR-069): before it is read when `len` says so,
    /// else once the read passes the bound, with nothing stored.
    ///
    /// A precondition `Absent` on a key that exists is refused before the
    /// body is read; every other refusal comes after the body is stored
    /// (the entry is then garbage for the next sweep, the key unchanged).
    ///
    /// Cancel-safe: dropped before the key is written, the entry (if
    /// stored) is garbage for the next sweep and the key unchanged.
    pub async fn put<R>(
        &self,
        identity: &Identity,
        namespace: &str,
        key: &str,
        body: R,
        len: Option<u64>,
        precondition: RefExpect,
    ) -> Result<CachePutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        self.put_checked(identity, namespace, key, body, len, precondition, None)
            .await
    }

    /// [`CacheOps::put`], a `cas/` key's body checked against its name
    /// under `function` (`None`: SHA-256 or BLAKE3).
    #[allow(clippy::too_many_arguments)]
    async fn put_checked<R>(
        &self,
        identity: &Identity,
        namespace: &str,
        key: &str,
        body: R,
        len: Option<u64>,
        precondition: RefExpect,
        function: Option<DigestFunction>,
    ) -> Result<CachePutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        self.0.authorize(identity, Scope::Write, Some(namespace))?;
        let (ns, cache) = self.ns(namespace)?;
        let key = cache_key(key)?;
        // A malformed `cas/` name is `key_invalid` before any bound.
        let name = cas_digest(&key)?;
        if precondition == RefExpect::Absent {
            if let Some(current) = cache.lookup(&ns, &key).await? {
                return Err(Error::RefConflict {
                    name: key.to_string(),
                    current: Some(current),
                }
                .into());
            }
        }
        let body = self.0.capped(&ns, self.0.limited(body, len)?, len)?;
        // BLAKE3 alone the store checks as it hashes; SHA-256 (or either)
        // the reader does, failing the read at the end of a body whose
        // digest is not the name (ADR-070).
        let expect = name.filter(|_| function == Some(DigestFunction::Blake3));
        let mut body = match name {
            Some(name) => Verifying::new(body, name, function, len),
            None => Verifying::off(body),
        };
        let options = store_core::PutOptions { len, expect };
        let r = self.0.store().put_opts(&ns, &mut body, options).await;
        let hex = key.as_str().trim_start_matches("cas/");
        if let (Some(_), Some(e)) = (name, body.refusal(hex, &r)) {
            return Err(e);
        }
        let receipt = capped_outcome(body.get_ref(), &ns, r)?;
        self.0.metrics().put(receipt.size, receipt.deduplicated);
        let author = self.0.author(identity, &ns);
        let previous = (self.0)
            .record_cache_key(&ns, &key, &receipt, precondition, author)
            .await?;
        Ok(CachePutOutcome {
            digest: receipt.digest,
            size: receipt.size,
            deduplicated: receipt.deduplicated,
            previous,
        })
    }

    /// The digest `key` names in the cache namespace, counting a hit or a
    /// miss. A `cas/<hex>` key also finds an entry of that (BLAKE3) digest
    /// put without the key; an `ac/` key's action result is validated
    /// ([`action`]): a miss when an output it names is gone.
    async fn resolve(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<(Namespace, Cache, RefName, Digest), OpsError> {
        let (ns, cache, key, d, _) = self.resolve_read(namespace, key).await?;
        Ok((ns, cache, key, d))
    }

    /// [`CacheOps::resolve`], with an `ac/` entry's bytes when validating
    /// it read them.
    async fn resolve_read(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<(Namespace, Cache, RefName, Digest, Option<Bytes>), OpsError> {
        let (ns, cache) = self.ns(namespace)?;
        let key = cache_key(key)?;
        let found = match cas_digest(&key)? {
            Some(_) => cas::resolve_name(self.0, &ns, &cache, &key, None).await?,
            None => cache.lookup(&ns, &key).await?,
        };
        let served = match found {
            None => Err(no_entry(&key, &ns)),
            Some(d) if key.as_str().starts_with("ac/") => {
                let v = action::validate(self.0, &ns, &cache, d).await;
                match unless_gone(v, &ns, &cache, &key, d).await {
                    Ok(Validity::Serve(bytes)) => Ok((d, bytes)),
                    Ok(Validity::Missing(why)) => Err(action::withheld(&key, &ns, &why)),
                    Err(e) => Err(e),
                }
            }
            Some(d) => Ok((d, None)),
        };
        self.0.metrics().cache_lookup(ns.as_str(), served.is_ok());
        let (d, bytes) = served?;
        Ok((ns, cache, key, d, bytes))
    }

    /// `GET /cache/{ns}/{key}`: the entry `key` names, streamed (`Range`
    /// as for blobs). `not_found` when the key or its entry is gone (a
    /// key whose entry a sweep deleted is removed). Cancel-safe (a read).
    pub async fn get(
        &self,
        namespace: &str,
        key: &str,
        range: Option<RangeRequest>,
    ) -> Result<GetResponse, OpsError> {
        let (ns, cache, key, d) = self.resolve(namespace, key).await?;
        let r = self.0.get_key(Key::new(ns.clone(), d), range).await;
        unless_gone(r, &ns, &cache, &key, d).await
    }

    /// `HEAD /cache/{ns}/{key}`: the entry's stat. Cancel-safe (a read).
    pub async fn stat(&self, namespace: &str, key: &str) -> Result<StatResponse, OpsError> {
        let (ns, cache, key, d) = self.resolve(namespace, key).await?;
        let r = self.0.stat(ns.as_str(), &d.to_hex()).await;
        unless_gone(r, &ns, &cache, &key, d).await
    }

    /// `DELETE /cache/{ns}/{key}`: removes the key; the digest it named
    /// (`None`: there was no such key). Its entry is garbage for the next
    /// sweep unless another key, a reference or a pin protects it. Scopes
    /// are the caller's business ([`Scope::Delete`]). Cancel-safe: one
    /// atomic removal of the key as it was read.
    pub async fn delete(&self, namespace: &str, key: &str) -> Result<Option<Digest>, OpsError> {
        let (ns, cache) = self.ns(namespace)?;
        let key = cache_key(key)?;
        // A malformed `cas/` key is `key_invalid` here as on every method.
        cas_digest(&key)?;
        // Removed only while it names what was read, so the digest
        // returned (and audited) is the one removed; a key replaced in
        // between is read again.
        loop {
            let Some(before) = cache.lookup(&ns, &key).await? else {
                return Ok(None);
            };
            if cache.remove(&ns, &key, Some(before)).await? {
                return Ok(Some(before));
            }
        }
    }

    /// Reads what each cache namespace's keys hold into the
    /// `blobpool_cache_keys`/`blobpool_cache_bytes` gauges, and what this
    /// node's trims evicted into `blobpool_cache_evicted_*` (called before
    /// `/metrics` renders; one aggregate read of the cache-key table).
    /// Cancel-safe (a read).
    pub async fn refresh_usage(&self) -> Result<(), OpsError> {
        let ops = self.0;
        if ops.config().cache_namespaces.is_empty() {
            return Ok(());
        }
        let Some(cache) = ops.store().cache() else {
            return Ok(());
        };
        let (usage, evicted) = (cache.usage().await?, cache.evicted());
        for ns in &ops.config().cache_namespaces {
            let u = usage.iter().find(|(n, _)| n == ns).map(|(_, u)| *u);
            let u = u.unwrap_or_default();
            ops.metrics().set_cache_usage(ns.as_str(), u.keys, u.bytes);
            let e = evicted.iter().find(|(n, _)| n == ns).map(|(_, e)| *e);
            let e = e.unwrap_or_default();
            ops.metrics()
                .set_cache_evicted(ns.as_str(), e.keys, e.bytes);
        }
        Ok(())
    }
}
