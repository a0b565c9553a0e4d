//! Introspection (namespaces, paginated listings, per-tier statistics),
//! verification of stored content, and quarantine of corrupt entries.
//!
//! Everything here reads through the engines' [`Engine::namespaces`],
//! [`Engine::scan`] and [`Engine::meta`]; the kv and large tiers are merged
//! (an entry lives in one tier per the mode; if both report a digest, the
//! kv copy is the one [`Store::get`] serves, so it is the one listed).
//!
//! [`Store::quarantine`] is the **one path that removes a protected
//! entry**: it removes an entry only after its raw bytes have been saved
//! and only when they do not hash to the key's digest (the entry is
//! corrupt: no reader can ever be served it). Pins, fleet pin rows and
//! liveness references are left as they are: they name a key, not bytes.
//! The key is absent afterwards, so a put of the right content (a client
//! re-uploading it) publishes afresh and heals every reference; until then
//! readers get `missing` instead of a verification failure.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{self, StreamExt, TryStreamExt};
use store_gc::GateState;
use store_types::{
    BlobReader, Digest, Engine, EngineExt, EntryMeta, Error, Key, Namespace, PublishOutcome,
    Result, Tier, Timestamp,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use crate::blob::Blob;
use crate::Store;

/// What a tier stores under a key, judged by its stored bytes
/// ([`Store::stored_copy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StoredCopy {
    /// Nothing.
    Absent,
    /// Bytes that hash to the key's digest.
    Sound,
    /// Bytes that do not (`actual`: what they hash to, `None` when their
    /// length was wrong).
    Corrupt { actual: Option<Digest> },
}

/// What keeps a key's copy in place while a quarantine decides about it
/// (held for its `Drop`).
enum Hold {
    /// An unpinned key: the delete gate (puts of it wait).
    Gate { _gate: store_gc::DeleteGate },
    /// A pinned key: a pin of the quarantine's own.
    Pin { _pin: store_gc::Pin },
}

/// The largest page [`Store::list`] returns.
pub const MAX_LIST_LIMIT: usize = 1000;

/// Scan page size of [`Store::stats`] and [`Store::verify`].
const PAGE: usize = 1000;

/// Concurrent `meta` lookups while listing a page.
const META_CONCURRENCY: usize = 16;

/// One listed entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EntryInfo {
    /// The entry's digest.
    pub digest: Digest,
    /// Content length in bytes.
    pub size: u64,
    /// The tier holding it.
    pub tier: Tier,
    /// When it was published (Unix milliseconds).
    pub created_at: Timestamp,
}

/// One page of a namespace listing, in ascending digest order.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EntryPage {
    /// The entries (at most the requested limit).
    pub entries: Vec<EntryInfo>,
    /// The cursor of the next page (pass it as `after`), or `None` when
    /// this page is the last.
    pub next: Option<Digest>,
}

/// Statistics of one namespace in one tier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierStats {
    /// The namespace.
    pub namespace: Namespace,
    /// The tier.
    pub tier: Tier,
    /// Entries stored.
    pub entries: u64,
    /// Their content bytes.
    pub bytes: u64,
    /// Entries with at least one in-process pin of this store instance
    /// (fleet pin rows of other nodes are not counted).
    pub pinned: u64,
    /// Entries staged in the delete window (garbage, deleted by a later
    /// sweep unless rescued).
    pub staged: u64,
}

/// What [`Store::quarantine`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum QuarantineOutcome {
    /// No tier holds the key; the save callback was not called.
    Absent,
    /// The raw bytes hash to the key's digest: the entry is sound and was
    /// **not** removed (the saved copy is a good copy).
    Sound {
        /// The tier holding it.
        tier: Tier,
        /// Bytes read.
        size: u64,
    },
    /// The entry was corrupt; its raw bytes were saved, then it was removed
    /// from `tier`.
    Removed {
        /// The tier it was removed from.
        tier: Tier,
        /// Raw bytes saved.
        size: u64,
        /// What the raw bytes hash to.
        actual: Digest,
    },
}

/// Options of [`Store::verify`].
#[derive(Clone, Default)]
pub struct VerifyOptions {
    /// Verify only this namespace (default: every namespace).
    pub namespace: Option<Namespace>,
    /// Entries read at the same time (0 is taken as 1; default 2 via
    /// [`VerifyOptions::new`]).
    pub concurrency: usize,
    /// Read at most this many bytes per second overall (`None`: unpaced).
    pub max_rate: Option<u64>,
    /// Quarantine corrupt entries into this directory: raw bytes to
    /// `DIR/<ns>/<digest>.corrupt` (fsynced), then [`Store::quarantine`].
    pub quarantine_dir: Option<PathBuf>,
    /// Called as bytes are read and entries finish.
    pub progress: Option<Arc<dyn Fn(VerifyEvent) + Send + Sync>>,
}

impl VerifyOptions {
    /// Every namespace, two entries at a time, unpaced, no quarantine.
    pub fn new() -> Self {
        VerifyOptions {
            concurrency: 2,
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for VerifyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyOptions")
            .field("namespace", &self.namespace)
            .field("concurrency", &self.concurrency)
            .field("max_rate", &self.max_rate)
            .field("quarantine_dir", &self.quarantine_dir)
            .finish()
    }
}

/// A progress event of [`Store::verify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyEvent {
    /// This many more bytes were read and hashed.
    Bytes(u64),
    /// One more entry was checked.
    Entry,
}

/// One corrupt entry found by [`Store::verify`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CorruptEntry {
    /// Its namespace.
    pub namespace: Namespace,
    /// Its digest (what the content should hash to).
    pub digest: Digest,
    /// The tier it was read from.
    pub tier: Tier,
    /// What the content hashed to (`None` when the length was wrong).
    pub actual: Option<Digest>,
    /// Where its raw bytes were saved, when quarantined.
    pub quarantined: Option<PathBuf>,
    /// Why quarantining failed, when it was asked for and failed (the
    /// entry then stays in place).
    pub quarantine_error: Option<String>,
}

/// The result of [`Store::verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerifySummary {
    /// Entries listed and read (`ok + corrupt + missing + failed`).
    pub checked: u64,
    /// Entries whose content hashed to their digest.
    pub ok: u64,
    /// Entries whose content did not.
    pub corrupt: u64,
    /// Entries listed but gone when read (deleted meanwhile).
    pub missing: u64,
    /// Entries whose read failed otherwise (I/O, backend).
    pub failed: u64,
    /// Content bytes read.
    pub bytes: u64,
    /// Corrupt entries quarantined (removed, bytes saved).
    pub quarantined: u64,
    /// The corrupt entries.
    pub corrupt_entries: Vec<CorruptEntry>,
    /// The failed reads: `ns/digest: error`.
    pub failures: Vec<String>,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
}

/// Paces reads to a byte rate shared by every worker.
struct Pacer {
    rate: Option<u64>,
    next: Mutex<Instant>,
}

impl Pacer {
    async fn take(&self, n: u64) {
        let Some(rate) = self.rate.filter(|r| *r > 0) else {
            return;
        };
        let at = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            // Idle time earns at most a short burst of credit.
            let floor = now.checked_sub(Duration::from_millis(100)).unwrap_or(now);
            let start = (*next).max(floor);
            *next = start + Duration::from_secs_f64(n as f64 / rate as f64);
            *next
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

/// Hashes and counts the bytes passing through.
struct Hashing {
    inner: Pin<Box<dyn AsyncRead + Send>>,
    state: Arc<Mutex<(blake3::Hasher, u64)>>,
}

impl AsyncRead for Hashing {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = self.inner.as_mut().poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let new = &buf.filled()[before..];
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.0.update(new);
            s.1 += new.len() as u64;
        }
        r
    }
}

impl Store {
    /// The engines in fall-through order: kv, then large.
    fn inspect_tiers(&self) -> Vec<(Tier, &dyn Engine)> {
        let kv: &dyn Engine = self.inner.kv.as_ref();
        let mut v = vec![(Tier::Kv, kv)];
        if let Some(l) = &self.inner.large {
            v.push((Tier::Large, l.as_ref() as &dyn Engine));
        }
        v
    }

    /// Namespaces holding at least one entry in any tier, sorted.
    ///
    /// Cancel-safe: it only reads.
    pub async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let mut all = BTreeSet::new();
        for (_, engine) in self.inspect_tiers() {
            all.extend(engine.namespaces().await?);
        }
        Ok(all.into_iter().collect())
    }

    /// Up to `limit` (1..=[`MAX_LIST_LIMIT`]) entries of `ns` with a digest
    /// greater than `after`, in ascending digest order, with size, tier and
    /// creation time; both tiers merged. [`Error::Config`] for a limit out
    /// of range.
    ///
    /// `next` is set when more entries follow (pass it as `after`). An
    /// entry deleted between the scan and its metadata lookup is left out.
    ///
    /// Cancel-safe: it only reads.
    pub async fn list(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<EntryPage> {
        if limit == 0 || limit > MAX_LIST_LIMIT {
            return Err(Error::Config(format!(
                "list limit must be 1..={MAX_LIST_LIMIT}, got {limit}"
            )));
        }
        let (found, more) = self.scan_merged(ns, after, limit).await?;
        let next = if more {
            found.last().map(|(d, _, _)| *d)
        } else {
            None
        };
        let tiers = self.inspect_tiers();
        let entries: Vec<Option<EntryInfo>> = stream::iter(found)
            .map(|(digest, _, tier)| {
                let key = Key::new(ns.clone(), digest);
                let engine = tiers.iter().find(|(t, _)| *t == tier).map(|(_, e)| *e);
                async move {
                    let meta: Option<EntryMeta> = match engine {
                        Some(e) => e.meta(&key).await?,
                        None => None,
                    };
                    Ok::<_, Error>(meta.map(|m| EntryInfo {
                        digest,
                        size: m.size,
                        tier,
                        created_at: m.created_at,
                    }))
                }
            })
            .buffered(META_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(EntryPage {
            entries: entries.into_iter().flatten().collect(),
            next,
        })
    }

    /// The first `limit` digests of `ns` after `after` over both tiers
    /// (kv first on duplicates), and whether more follow.
    async fn scan_merged(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<(Vec<(Digest, u64, Tier)>, bool)> {
        let mut merged: Vec<(Digest, u64, Tier)> = Vec::new();
        for (tier, engine) in self.inspect_tiers() {
            for (d, size) in engine.scan(ns, after, limit + 1).await? {
                merged.push((d, size, tier));
            }
        }
        // Stable sort keeps the kv copy first for equal digests.
        merged.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        merged.dedup_by(|b, a| a.0 == b.0);
        let more = merged.len() > limit;
        merged.truncate(limit);
        Ok((merged, more))
    }

    /// Entries, bytes, pinned and staged entries per namespace (every
    /// namespace, or only `ns`) and tier, sorted by namespace then tier.
    ///
    /// A full scan: one page of up to 1000 digests per round trip per tier,
    /// plus one delete-window lookup per page (and, for the large tier, one
    /// kv presence probe so an entry both tiers report is counted once, in
    /// kv). Counts are a snapshot taken page by page, not a transaction.
    ///
    /// Cancel-safe: it only reads.
    pub async fn stats(&self, ns: Option<&Namespace>) -> Result<Vec<TierStats>> {
        let namespaces = match ns {
            Some(n) => vec![n.clone()],
            None => self.namespaces().await?,
        };
        let kv: &dyn Engine = self.inner.kv.as_ref();
        let window = self.inner.gc.window();
        let mut out = Vec::new();
        for ns in namespaces {
            for (tier, engine) in self.inspect_tiers() {
                let mut s = TierStats {
                    namespace: ns.clone(),
                    tier,
                    entries: 0,
                    bytes: 0,
                    pinned: 0,
                    staged: 0,
                };
                let mut after = None;
                loop {
                    let page = engine.scan(&ns, after, PAGE).await?;
                    let Some(last) = page.last() else { break };
                    after = Some(last.0);
                    let full = page.len() == PAGE;
                    let page: Vec<(Digest, u64)> = if tier == Tier::Large {
                        let digests: Vec<Digest> = page.iter().map(|p| p.0).collect();
                        let in_kv = kv.has_many(&ns, &digests).await?;
                        page.into_iter()
                            .zip(in_kv)
                            .filter(|(_, k)| !k)
                            .map(|(p, _)| p)
                            .collect()
                    } else {
                        page
                    };
                    let digests: Vec<Digest> = page.iter().map(|p| p.0).collect();
                    let keys: Vec<Key> = digests.iter().map(|d| Key::new(ns.clone(), *d)).collect();
                    s.entries += page.len() as u64;
                    s.bytes += page.iter().map(|p| p.1).sum::<u64>();
                    s.pinned += self
                        .inner
                        .gc
                        .pins()
                        .pinned_many(&keys)
                        .into_iter()
                        .filter(|p| *p)
                        .count() as u64;
                    if !digests.is_empty() {
                        s.staged += window
                            .staged_many(&ns, &digests)
                            .await?
                            .into_iter()
                            .filter(|p| *p)
                            .count() as u64;
                    }
                    if !full {
                        break;
                    }
                }
                if s.entries > 0 {
                    out.push(s);
                }
            }
        }
        Ok(out)
    }

    /// Removes a **corrupt** entry, the one removal that ignores protection
    /// (pins, liveness, the protect callback): a corrupt entry protects
    /// nothing, since no read of it can ever succeed.
    ///
    /// Reads the raw, unverified bytes of the tier that serves the key (the
    /// one [`Store::get`] reads: kv, then large) and hands them to `save`,
    /// hashing them as `save` reads. Only when `save` returns `Ok` having
    /// read every byte, and the bytes do **not** hash to the key's digest,
    /// is the entry removed from that tier (and unstaged from the delete
    /// window); a sound entry is left in place ([`QuarantineOutcome::Sound`]).
    /// So the bytes are never lost: make `save` durable (fsync) before it
    /// returns.
    ///
    /// Pins and references stay: they name the key, which a put of the right
    /// content publishes afresh (healing every reference). Non-fleet: an
    /// unpinned key is held by the delete gate from the read to the removal,
    /// so a put arriving meanwhile waits and then writes a fresh entry; a
    /// put of a pinned key that finds the copy corrupt waits for this
    /// quarantine (its lock) and then stores its bytes afresh (ADR-053).
    ///
    /// **Only the bytes it hashed are removed** (issue 30, ADR-046). From
    /// before the read until the removal the copy cannot change: quarantines
    /// of the store run one at a time (quarantine is the one removal that
    /// ignores pins), a pinned key is pinned by the quarantine too (so a
    /// sweep or direct delete cannot remove it when the other pins go), an
    /// unpinned key is gated, and no engine's publish replaces an entry that
    /// exists (`PublishOutcome::AlreadyPresent`). So a fresh re-put that
    /// lands after another removal is never the victim of a removal decided
    /// on the corrupt copy's hash.
    ///
    /// Fleet stores are refused ([`Error::Config`]): removing a large-tier
    /// copy there needs a deletion fence, which this path does not take yet.
    ///
    /// Cancel-safe: dropping the future before the removal starts removes
    /// nothing; once started, the removal runs in a task of its own.
    pub async fn quarantine<F, Fut>(&self, key: &Key, save: F) -> Result<QuarantineOutcome>
    where
        F: FnOnce(Blob) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        if self.is_fleet() {
            return Err(Error::Config(
                "quarantine is not available on fleet stores (a large-tier removal needs a deletion fence)".into(),
            ));
        }
        // One quarantine at a time: the only removal that ignores pins.
        let one_at_a_time = Arc::clone(&self.inner.quarantine_lock).lock_owned().await;
        let hold = self.hold_for_quarantine(key).await;
        let mut found = None;
        for (tier, engine) in self.inspect_tiers() {
            if let Some(r) = engine.read_stored(key).await? {
                found = Some((tier, r));
                break;
            }
        }
        let Some((tier, raw)) = found else {
            return Ok(QuarantineOutcome::Absent);
        };
        let state = Arc::new(Mutex::new((blake3::Hasher::new(), 0u64)));
        let raw = raw.into_stream();
        let reader = BlobReader::stream(
            raw.len,
            Hashing {
                inner: raw.reader,
                state: Arc::clone(&state),
            },
        );
        save(Blob::unverified(reader, tier)).await?;
        let (actual, size) = {
            let s = state.lock().unwrap_or_else(|p| p.into_inner());
            (Digest::from_bytes(*s.0.finalize().as_bytes()), s.1)
        };
        if size < raw.len {
            return Err(Error::io(store_types::ErrorKind::InvalidData, "quarantine")
                .with_key(key)
                .with_source(format!(
                    "the save step read {size} of {} bytes; nothing removed",
                    raw.len
                )));
        }
        if actual == key.digest {
            return Ok(QuarantineOutcome::Sound { tier, size });
        }
        self.remove_quarantined(key, tier, actual, size, (hold, one_at_a_time))
            .await?;
        Ok(QuarantineOutcome::Removed { tier, size, actual })
    }

    /// What holds `key`'s copy for a quarantine until its removal: the
    /// delete gate when unpinned, else a pin of the quarantine's own (so the
    /// copy stays protected from sweeps and deletes even if the other pins
    /// go). A delete or sweep deciding about the key is let finish first.
    async fn hold_for_quarantine(&self, key: &Key) -> Hold {
        let keys = [key.clone()];
        let pins = self.inner.gc.pins();
        loop {
            let (gate, states) = pins.gate(&keys);
            match states[0] {
                GateState::Gated => break Hold::Gate { _gate: gate },
                // Pinned: pin it ourselves, so the copy stays protected from
                // sweeps and deletes until the removal even if the other
                // pins go.
                GateState::Pinned => {
                    drop(gate);
                    break Hold::Pin {
                        _pin: pins.pin(key.clone()).await,
                    };
                }
                // A delete or sweep is deciding about this key: let it.
                GateState::Busy => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    /// Removes the corrupt copy of `key` from `tier` (and unstages it), in a
    /// task of its own that keeps `hold` to the end: a started removal runs
    /// to completion whoever awaits it.
    async fn remove_quarantined(
        &self,
        key: &Key,
        tier: Tier,
        actual: Digest,
        size: u64,
        hold: (Hold, tokio::sync::OwnedMutexGuard<()>),
    ) -> Result<()> {
        let this = self.clone();
        let key = key.clone();
        let removal = tokio::spawn(async move {
            let _hold = hold;
            let engine = this
                .inspect_tiers()
                .into_iter()
                .find(|(t, _)| *t == tier)
                .map(|(_, e)| e)
                .expect("the tier read from");
            engine.delete_many(&key.namespace, &[key.digest]).await?;
            this.inner
                .gc
                .window()
                .unstage(std::slice::from_ref(&key))
                .await?;
            tracing::warn!(
                target: "blobpool::audit",
                key = %key,
                tier = %tier,
                actual = %actual,
                size,
                "quarantined a corrupt entry"
            );
            Ok::<_, Error>(())
        });
        removal.await.map_err(|e| {
            Error::backend(store_types::ErrorKind::Other, "run quarantine task").with_source(e)
        })?
    }

    /// What `tier` stores under `key`, read from storage (never an
    /// engine's in-memory copy) and hashed: what a quarantine would judge.
    /// A deduplicating put asks this before it acknowledges (ADR-053).
    /// Whether `tier` holds a copy of `key` (its metadata: a stat, no read
    /// of the bytes), so a put of a new entry pays no read (ADR-053).
    pub(crate) async fn has_copy(&self, tier: Tier, key: &Key) -> Result<bool> {
        Ok(self.tier_engine(tier).meta(key).await?.is_some())
    }

    pub(crate) async fn stored_copy(&self, tier: Tier, key: &Key) -> Result<StoredCopy> {
        let engine = self.tier_engine(tier);
        let Some(r) = engine.read_stored(key).await? else {
            return Ok(StoredCopy::Absent);
        };
        let mut blob = Blob::verified(r, tier, key.digest);
        loop {
            match blob.next_chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(StoredCopy::Sound),
                Err(e) => {
                    return match Error::from(e) {
                        Error::Verification { actual, .. } => Ok(StoredCopy::Corrupt {
                            actual: Some(actual),
                        }),
                        Error::LengthMismatch { .. } => Ok(StoredCopy::Corrupt { actual: None }),
                        Error::Missing => Ok(StoredCopy::Absent),
                        e => Err(e),
                    }
                }
            }
        }
    }

    /// Heals `key` in `tier` for a put that brought its right bytes and
    /// found a copy there that is not sound (ADR-053): under the quarantine
    /// lock — so a quarantine in progress finishes first, and none starts
    /// until the put has its answer — the copy is judged again; a corrupt
    /// one is removed (logged, not saved: the put's bytes replace it), then
    /// `publish` (which stores the put's bytes) runs. Without `publish` (a
    /// put whose bytes are gone) a sound copy is deduplicated onto, and
    /// otherwise the put fails with a transient error, acknowledged
    /// against nothing; the copy is gone, so putting again stores afresh.
    ///
    /// Runs in a task of its own that holds a pin of the key, so a started
    /// removal is always followed by the publish, whoever awaits it.
    pub(crate) async fn heal_copy(
        &self,
        key: &Key,
        tier: Tier,
        publish: Option<BoxFuture<'static, Result<PublishOutcome>>>,
    ) -> Result<PublishOutcome> {
        let this = self.clone();
        let key = key.clone();
        let heal = tokio::spawn(async move {
            let _one_at_a_time = this.inner.quarantine_lock.lock().await;
            let _pin = this.inner.gc.pins().pin(key.clone()).await;
            match this.stored_copy(tier, &key).await? {
                StoredCopy::Sound => {}
                StoredCopy::Absent => {}
                StoredCopy::Corrupt { actual } => {
                    this.tier_engine(tier)
                        .delete_many(&key.namespace, &[key.digest])
                        .await?;
                    tracing::warn!(
                        target: "blobpool::audit",
                        key = %key,
                        tier = %tier,
                        actual = ?actual,
                        healing = publish.is_some(),
                        "removed a corrupt entry a put brought the right bytes for"
                    );
                }
            }
            match publish {
                Some(publish) => publish.await,
                None => match this.stored_copy(tier, &key).await? {
                    StoredCopy::Sound => Ok(PublishOutcome::AlreadyPresent),
                    _ => Err(Error::backend(store_types::ErrorKind::Contended, "put")
                        .with_key(&key)
                        .with_source(
                            "the stored copy this put deduplicated onto was corrupt and is \
                                 gone; nothing was acknowledged: put again",
                        )),
                },
            }
        });
        heal.await.map_err(|e| {
            Error::backend(store_types::ErrorKind::Other, "run put healing task").with_source(e)
        })?
    }

    /// The engine of `tier` (the large one exists whenever a large entry
    /// was read or put).
    fn tier_engine(&self, tier: Tier) -> &dyn Engine {
        self.inspect_tiers()
            .into_iter()
            .find(|(t, _)| *t == tier)
            .map(|(_, e)| e)
            .expect("the store has this tier")
    }

    /// Re-reads every entry (or every entry of one namespace) through the
    /// verified read path ([`Store::get`]), `opts.concurrency` at a time and
    /// paced to `opts.max_rate`, and reports what it found. With
    /// `opts.quarantine_dir`, each corrupt entry's raw bytes are saved to
    /// `DIR/<ns>/<digest>.corrupt` (fsynced, with the directory) and the
    /// entry is removed with [`Store::quarantine`].
    ///
    /// An online operation: it takes no lock, and entries deleted meanwhile
    /// count as `missing`. `Err` only when listing fails; a failed read is
    /// counted in `failed`.
    ///
    /// Cancel-safe: it only reads until a quarantine, which is cancel-safe.
    pub async fn verify(&self, opts: &VerifyOptions) -> Result<VerifySummary> {
        let started = Instant::now();
        let pacer = Pacer {
            rate: opts.max_rate,
            next: Mutex::new(Instant::now()),
        };
        let namespaces = match &opts.namespace {
            Some(n) => vec![n.clone()],
            None => self.namespaces().await?,
        };
        let mut summary = VerifySummary::default();
        let concurrency = opts.concurrency.max(1);
        let bytes = AtomicU64::new(0);
        for ns in namespaces {
            let mut after = None;
            loop {
                let (page, more) = self.scan_merged(&ns, after, PAGE).await?;
                after = page.last().map(|p| p.0);
                let results: Vec<(Key, Tier, Result<()>)> = stream::iter(page)
                    .map(|(digest, _, tier)| {
                        let key = Key::new(ns.clone(), digest);
                        let (pacer, bytes) = (&pacer, &bytes);
                        async move {
                            let r = self.verify_one(&key, pacer, bytes, opts).await;
                            if let Some(p) = &opts.progress {
                                p(VerifyEvent::Entry);
                            }
                            (key, tier, r)
                        }
                    })
                    .buffer_unordered(concurrency)
                    .collect()
                    .await;
                for (key, tier, r) in results {
                    summary.checked += 1;
                    match r {
                        Ok(()) => summary.ok += 1,
                        Err(Error::Missing) => summary.missing += 1,
                        Err(Error::Verification { actual, .. }) => {
                            summary.corrupt += 1;
                            let mut c = CorruptEntry {
                                namespace: key.namespace.clone(),
                                digest: key.digest,
                                tier,
                                actual: Some(actual),
                                quarantined: None,
                                quarantine_error: None,
                            };
                            if let Some(dir) = &opts.quarantine_dir {
                                match self.quarantine_to(&key, dir).await {
                                    Ok(Some(path)) => {
                                        summary.quarantined += 1;
                                        c.quarantined = Some(path);
                                    }
                                    Ok(None) => {
                                        c.quarantine_error = Some(
                                            "not removed: the entry verified (or vanished) when re-read"
                                                .into(),
                                        )
                                    }
                                    Err(e) => c.quarantine_error = Some(e.to_string()),
                                }
                            }
                            summary.corrupt_entries.push(c);
                        }
                        Err(e) => {
                            summary.failed += 1;
                            summary.failures.push(format!("{key}: {e}"));
                        }
                    }
                }
                if !more {
                    break;
                }
            }
        }
        summary.bytes = bytes.load(Ordering::Relaxed);
        summary.duration_ms = started.elapsed().as_millis() as u64;
        Ok(summary)
    }

    /// One verified read to the end, paced; `Missing` when absent.
    async fn verify_one(
        &self,
        key: &Key,
        pacer: &Pacer,
        bytes: &AtomicU64,
        opts: &VerifyOptions,
    ) -> Result<()> {
        // The stored bytes, never an engine's in-memory copy of them.
        let mut found = None;
        for (tier, engine) in self.tiers() {
            if let Some(r) = engine.read_stored(key).await? {
                found = Some(Blob::verified(r, tier, key.digest));
                break;
            }
        }
        let Some(mut blob) = found else {
            return Err(Error::Missing);
        };
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = blob.read(&mut buf).await.map_err(Error::from)?;
            if n == 0 {
                return Ok(());
            }
            bytes.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(p) = &opts.progress {
                p(VerifyEvent::Bytes(n as u64));
            }
            pacer.take(n as u64).await;
        }
    }

    /// Quarantines `key` into `dir/<ns>/<digest>.corrupt`; the path when the
    /// entry was removed, `None` when it was sound or absent.
    async fn quarantine_to(&self, key: &Key, dir: &Path) -> Result<Option<PathBuf>> {
        let ns_dir = dir.join(key.namespace.as_str());
        let partial = ns_dir.join(format!(".{}.{}.partial", key.digest, std::process::id()));
        let saved: Arc<Mutex<Option<PathBuf>>> = Arc::default();
        let outcome = {
            let saved = Arc::clone(&saved);
            let partial = partial.clone();
            let ns_dir = ns_dir.clone();
            let digest = key.digest;
            self.quarantine(key, move |mut blob| async move {
                tokio::fs::create_dir_all(&ns_dir).await?;
                let mut f = tokio::fs::File::create(&partial).await?;
                tokio::io::copy(&mut blob, &mut f).await?;
                f.flush().await?;
                f.sync_all().await?;
                drop(f);
                let path = free_name(&ns_dir, &digest).await?;
                tokio::fs::rename(&partial, &path).await?;
                sync_dir(&ns_dir).await?;
                *saved.lock().unwrap_or_else(|p| p.into_inner()) = Some(path);
                Ok(())
            })
            .await
        };
        let path = saved.lock().unwrap_or_else(|p| p.into_inner()).take();
        match outcome {
            Ok(QuarantineOutcome::Removed { .. }) => Ok(path),
            Ok(_) => {
                // Sound after all: the saved copy is not evidence of anything.
                if let Some(p) = path {
                    let _ = tokio::fs::remove_file(p).await;
                }
                Ok(None)
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                Err(e)
            }
        }
    }
}

/// `dir/<digest>.corrupt`, or `<digest>.N.corrupt` when taken (an earlier
/// quarantine of other corrupt bytes under the same key).
async fn free_name(dir: &Path, digest: &Digest) -> Result<PathBuf> {
    let mut path = dir.join(format!("{digest}.corrupt"));
    let mut n = 1;
    while tokio::fs::try_exists(&path).await? {
        n += 1;
        path = dir.join(format!("{digest}.{n}.corrupt"));
    }
    Ok(path)
}

/// Makes a rename in `dir` durable.
async fn sync_dir(dir: &Path) -> Result<()> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(&dir)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::from_io("fsync directory", e).with_path(&dir))
    })
    .await
    .map_err(|e| {
        Error::io(store_types::ErrorKind::Other, "run directory fsync task").with_source(e)
    })??;
    Ok(())
}
