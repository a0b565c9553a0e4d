//! Content addresses of a cache namespace (ADR-070): `cas/<64 hex>` names
//! a body by its SHA-256 (Bazel's default digest function) or its BLAKE3
//! (Blobpool's own digest). Entries stay BLAKE3-addressed; the key
//! `cas/<sha256 hex>` is the index from the SHA-256 name to the entry, so
//! the cache's bound keeps name and entry consistent (the key is what the
//! trim evicts, and the entry lives while any key names it).
//!
//! A put is verified while it is read ([`Verifying`]): at the end of the
//! body the name must be the body's digest under the given function (or
//! under either, when none is given, as over HTTP), else the read fails
//! before the store publishes anything and no key is written.

use std::io;
use std::pin::Pin as StdPin;
use std::task::{Context, Poll};

use sha2::Digest as _;
use store_core::{Cache, Digest, Key, Namespace, RefExpect, RefName};
use tokio::io::{AsyncRead, ReadBuf};

use super::{cache_key, no_entry, unless_gone, CacheOps, CachePutOutcome};
use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::range::RangeRequest;
use crate::GetResponse;

/// A content-address function a cache namespace accepts (REAPI's
/// `DigestFunction` values `SHA256` and `BLAKE3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DigestFunction {
    /// SHA-256: Bazel's default, and every REAPI client's.
    Sha256,
    /// BLAKE3: Blobpool's own digest (entries are stored under it).
    Blake3,
}

impl DigestFunction {
    /// The function's name as errors and docs write it.
    pub fn name(self) -> &'static str {
        match self {
            DigestFunction::Sha256 => "SHA-256",
            DigestFunction::Blake3 => "BLAKE3",
        }
    }

    /// The hex digest of the empty body under this function (REAPI: the
    /// empty blob is always present, whether or not it was uploaded).
    pub fn empty_hex(self) -> &'static str {
        match self {
            DigestFunction::Sha256 => {
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            }
            DigestFunction::Blake3 => {
                "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
            }
        }
    }
}

impl std::fmt::Display for DigestFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One content address asked about by [`CacheOps::find_missing`] (REAPI's
/// `Digest` with the request's digest function).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CasDigest {
    /// The function `hash` is a digest under.
    pub function: DigestFunction,
    /// 64 lowercase hex characters.
    pub hash: String,
    /// The blob's size as the client gives it. Only the empty blob's is
    /// read (size 0 with the function's empty digest is always present);
    /// otherwise the content behind the name determines it.
    pub size: u64,
}

/// The `cas/<hex>` key of a content address (`key_invalid` unless `hex`
/// is 64 lowercase hex characters).
pub(super) fn cas_name(hex: &str) -> Result<(RefName, Digest), OpsError> {
    let key = cache_key(&format!("cas/{hex}"))?;
    let d = super::cas_digest(&key)?.expect("a cas/ key");
    Ok((key, d))
}

/// What a verified put found at the end of its body.
#[derive(Clone, Debug)]
enum Verdict {
    /// The name is the body's digest (or nothing is checked here).
    Matched,
    /// It is not: the digests the body has under the functions checked.
    Mismatch {
        sha256: Option<String>,
        blake3: Option<String>,
    },
}

/// A body reader that hashes what goes by and, at its end, fails the read
/// unless the expected name is the body's digest under one of the
/// functions it hashes (the store then publishes nothing). Hashing no
/// function (BLAKE3 alone, which the store's own `expect` checks), it
/// passes the body through.
pub(super) struct Verifying<R> {
    inner: R,
    name: [u8; 32],
    sha256: Option<sha2::Sha256>,
    blake3: Option<Box<blake3::Hasher>>,
    verdict: Option<Verdict>,
    /// The declared length and the bytes read: a body that ends at
    /// another length is left to the store's length check (`400`), the
    /// error a client must fix first.
    declared: Option<u64>,
    read: u64,
}

impl<R> Verifying<R> {
    /// `inner` (of `declared` length, if known), checked against `name`
    /// under `function` (`None`: SHA-256 or BLAKE3).
    pub(super) fn new(
        inner: R,
        name: Digest,
        function: Option<DigestFunction>,
        declared: Option<u64>,
    ) -> Self {
        let (sha256, blake3) = match function {
            Some(DigestFunction::Sha256) => (Some(sha2::Sha256::new()), None),
            Some(DigestFunction::Blake3) => (None, None),
            None => (
                Some(sha2::Sha256::new()),
                Some(Box::new(blake3::Hasher::new())),
            ),
        };
        Verifying {
            inner,
            name: *name.as_bytes(),
            sha256,
            blake3,
            verdict: None,
            declared,
            read: 0,
        }
    }

    /// The wrapped reader.
    pub(super) fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The mismatch the end of the body found, if any.
    fn mismatch(&self) -> Option<(Option<&str>, Option<&str>)> {
        match &self.verdict {
            Some(Verdict::Mismatch { sha256, blake3 }) => {
                Some((sha256.as_deref(), blake3.as_deref()))
            }
            _ => None,
        }
    }

    /// Judges the whole body (once); an error when the name is not its
    /// digest.
    fn finish(&mut self) -> io::Result<()> {
        if self.verdict.is_none() {
            let sha = self.sha256.take().map(|h| <[u8; 32]>::from(h.finalize()));
            let b3 = self.blake3.take().map(|h| *h.finalize().as_bytes());
            let unchecked = sha.is_none() && b3.is_none();
            self.verdict = Some(if unchecked || [sha, b3].contains(&Some(self.name)) {
                Verdict::Matched
            } else {
                Verdict::Mismatch {
                    sha256: sha.map(|d| Digest::from_bytes(d).to_hex()),
                    blake3: b3.map(|d| Digest::from_bytes(d).to_hex()),
                }
            });
        }
        match &self.verdict {
            Some(Verdict::Mismatch { .. }) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the body does not hash to its cas/ name",
            )),
            _ => Ok(()),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Verifying<R> {
    fn poll_read(
        mut self: StdPin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        match StdPin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if new.is_empty() && room {
                    // The end of the body: judged before the store
                    // learns it ended (unless its length is wrong).
                    if this.declared.is_some_and(|n| n != this.read) {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Ready(this.finish());
                }
                this.read += new.len() as u64;
                if let Some(h) = &mut this.sha256 {
                    h.update(new);
                }
                if let Some(h) = &mut this.blake3 {
                    h.update(new);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

/// The refusal of a body that does not hash to its `cas/` name: 422
/// `verification`, naming the functions checked and what the body hashes
/// to under them.
fn mismatch_error(hex: &str, sha256: Option<&str>, blake3: Option<&str>) -> OpsError {
    let got = match (sha256, blake3) {
        (Some(s), Some(b)) => format!("its SHA-256 is {s} and its BLAKE3 is {b}"),
        (Some(s), None) => format!("its SHA-256 is {s}"),
        (None, Some(b)) => format!("its BLAKE3 is {b}"),
        (None, None) => "it hashes to something else".to_string(),
    };
    OpsError::new(
        ErrorCode::Verification,
        format!(
            "cache key cas/{hex} names the body's SHA-256 or BLAKE3 digest, and {got}: \
             nothing was stored"
        ),
    )
}

impl<R> Verifying<R> {
    /// `inner`, not checked (a key that is no content address).
    pub(super) fn off(inner: R) -> Self {
        Verifying {
            inner,
            name: [0; 32],
            sha256: None,
            blake3: None,
            verdict: Some(Verdict::Matched),
            declared: None,
            read: 0,
        }
    }

    /// The refusal of the put `r` that read this body from the key
    /// `cas/<hex>`: the mismatch the end of the body found (the store saw
    /// only a failed read), or the store's own BLAKE3 check's.
    pub(super) fn refusal<T>(&self, hex: &str, r: &store_core::Result<T>) -> Option<OpsError> {
        if let Some((sha256, blake3)) = self.mismatch() {
            return Some(mismatch_error(hex, sha256, blake3));
        }
        match r {
            Err(store_core::Error::Verification { actual, .. }) => {
                Some(mismatch_error(hex, None, Some(&actual.to_hex())))
            }
            _ => None,
        }
    }
}

impl CacheOps<'_> {
    /// Stores `body` under the content address `hash` (64 lowercase hex)
    /// in cache namespace `namespace`, by `identity` (scope `write`,
    /// checked here), and points the key `cas/<hash>` at the entry.
    ///
    /// `function` says what `hash` is a digest under; `None` (HTTP, where
    /// the client does not say) accepts a body whose SHA-256 or BLAKE3 is
    /// `hash`. The body is verified as it is read: on a mismatch the put
    /// fails with `verification` (422, naming both functions) before the
    /// store publishes anything, and no key is written. The entry is
    /// stored under its BLAKE3 digest ([`CachePutOutcome::digest`]); a
    /// SHA-256 name is the key `cas/<sha256>` pointing at it (ADR-070).
    ///
    /// `declared_len` is checked as for blob puts; a body larger than the
    /// namespace's `max_bytes` is `too_large` (413). A content address
    /// names one body, so a re-put (by any identity with `write`, in a
    /// write-once namespace too) finds the key naming the same entry: the
    /// ADR-052 rules never refuse it.
    ///
    /// Cancel-safe: dropped before the key is written, the entry (if
    /// stored) is garbage for the next sweep and the key unchanged.
    pub async fn put_cas<R>(
        &self,
        identity: &Identity,
        namespace: &str,
        function: Option<DigestFunction>,
        hash: &str,
        body: R,
        declared_len: Option<u64>,
    ) -> Result<CachePutOutcome, OpsError>
    where
        R: AsyncRead + Unpin + Send,
    {
        let (key, _) = cas_name(hash)?;
        self.put_checked(
            identity,
            namespace,
            key.as_str(),
            body,
            declared_len,
            RefExpect::Any,
            function,
        )
        .await
    }

    /// The entry the content address `hash` names in `namespace`, for
    /// `identity` (scope `read`, checked here), streamed as
    /// [`CacheOps::get`] streams it (`range` as for blobs).
    ///
    /// The key `cas/<hash>` is looked up first; with no such key, a name
    /// that may be BLAKE3 (`function` `Blake3` or `None`) also finds the
    /// entry of that digest put without a key. `not_found` otherwise.
    /// Notes the access (the bound's recency). Cancel-safe (a read).
    pub async fn get_cas(
        &self,
        identity: &Identity,
        namespace: &str,
        function: Option<DigestFunction>,
        hash: &str,
        range: Option<RangeRequest>,
    ) -> Result<GetResponse, OpsError> {
        self.0.authorize(identity, Scope::Read, Some(namespace))?;
        let (ns, cache) = self.ns(namespace)?;
        let (key, _) = cas_name(hash)?;
        let found = resolve_name(self.0, &ns, &cache, &key, function).await?;
        self.0.metrics().cache_lookup(ns.as_str(), found.is_some());
        let d = found.ok_or_else(|| no_entry(&key, &ns))?;
        let r = self.0.get(ns.as_str(), &d.to_hex(), range).await;
        unless_gone(r, &ns, &cache, &key, d).await
    }

    /// Which of `digests` `namespace` lacks, for `identity` (scope
    /// `read`, checked here): the indexes into `digests` of the missing
    /// ones, in order (REAPI `FindMissingBlobs`).
    ///
    /// A digest is present when its `cas/<hash>` key, or (BLAKE3) an entry
    /// of that digest, names an entry that exists; the empty blob always
    /// is. The SHA-256 names' keys are read in one batch and the entries
    /// asked about in one `has_many` per tier. Every present one's
    /// recency is refreshed (a client that finds a blob present will not
    /// upload it, so it must outlive the keys nobody asked about). A hash
    /// that is not 64 lowercase hex is `key_invalid`.
    ///
    /// Cancel-safe (reads; the noted accesses are written in batches).
    pub async fn find_missing(
        &self,
        identity: &Identity,
        namespace: &str,
        digests: &[CasDigest],
    ) -> Result<Vec<usize>, OpsError> {
        self.0.authorize(identity, Scope::Read, Some(namespace))?;
        let (ns, cache) = self.ns(namespace)?;
        let named = present_entries(self.0, &ns, &cache, digests).await?;
        Ok((0..digests.len()).filter(|&i| named[i].is_none()).collect())
    }
}

/// For each of `digests`, the entry of `ns` it names, if present (the
/// empty blob: `Some` of BLAKE3's empty digest). Notes each present
/// entry's access.
///
/// Two batched reads: the SHA-256 names' keys in one
/// [`Cache::lookup_many`], then every candidate entry in one `has_many`
/// (a BLAKE3 name is the entry's own digest: a `cas/` key of it can name
/// nothing else, so it needs no key lookup).
pub(super) async fn present_entries(
    ops: &crate::Ops,
    ns: &Namespace,
    cache: &Cache,
    digests: &[CasDigest],
) -> Result<Vec<Option<Digest>>, OpsError> {
    let mut out = vec![None; digests.len()];
    let mut ask: Vec<(usize, Digest)> = Vec::new();
    let (mut keyed, mut keys) = (Vec::new(), Vec::new());
    for (i, d) in digests.iter().enumerate() {
        if d.size == 0 && d.hash == d.function.empty_hex() {
            out[i] = Some(Digest::of(b""));
            continue;
        }
        match d.function {
            // The name is the entry's digest: no key is built for it.
            DigestFunction::Blake3 => match Digest::parse(&d.hash) {
                Ok(name) => ask.push((i, name)),
                // Not a digest: the `cas/` key's error, naming the rule.
                Err(_) => ask.push((i, cas_name(&d.hash)?.1)),
            },
            DigestFunction::Sha256 => {
                keyed.push(i);
                keys.push(cas_name(&d.hash)?.0);
            }
        }
    }
    let found = cache.lookup_many(ns, &keys).await?;
    ask.extend((keyed.into_iter().zip(found)).filter_map(|(i, d)| d.map(|d| (i, d))));
    let entries: Vec<Digest> = ask.iter().map(|(_, d)| *d).collect();
    let present = ops.store().has_many(ns, &entries).await?;
    for ((i, d), here) in ask.into_iter().zip(present) {
        if here {
            cache.note_access(ns, d);
            out[i] = Some(d);
        }
    }
    Ok(out)
}

/// The entry digest the `cas/` key `key` may resolve to: the key's
/// (`true`: keyed; the lookup notes the access), else — a name that may be
/// BLAKE3 — the name itself (`false`: nothing says such an entry exists).
async fn candidate(
    ns: &Namespace,
    cache: &Cache,
    key: &RefName,
    function: Option<DigestFunction>,
) -> Result<Option<(Digest, bool)>, OpsError> {
    if let Some(d) = cache.lookup(ns, key).await? {
        return Ok(Some((d, true)));
    }
    if function == Some(DigestFunction::Sha256) {
        return Ok(None);
    }
    Ok(super::cas_digest(key)?.map(|d| (d, false)))
}

/// The entry the `cas/` key `key` names: its key's, else (a name that may
/// be BLAKE3) the entry of that digest when it exists, its access noted.
pub(super) async fn resolve_name(
    ops: &crate::Ops,
    ns: &Namespace,
    cache: &Cache,
    key: &RefName,
    function: Option<DigestFunction>,
) -> Result<Option<Digest>, OpsError> {
    match candidate(ns, cache, key, function).await? {
        Some((d, true)) => Ok(Some(d)),
        Some((d, false)) => {
            let here = ops.store().stat(&Key::new(ns.clone(), d)).await?.is_some();
            if here {
                cache.note_access(ns, d);
            }
            Ok(here.then_some(d))
        }
        None => Ok(None),
    }
}
