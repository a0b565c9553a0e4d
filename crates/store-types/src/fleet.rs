//! Fleet-mode vocabulary (ADR-012 §3, §4, §6.6): the fleet liveness table
//! reference, the pin a put commits, and the locked execution batch of a
//! fleet sweep.

use std::time::Duration;

use async_trait::async_trait;

use crate::{CacheBounds, Digest, Instance, Key, Namespace, ProtectReason, Result, Timestamp};

/// A fleet liveness source: a table in the shared database, owned by the
/// embedder, whose rows name referenced digests. The store reads it and
/// never creates, alters or owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LivenessTable {
    /// Schema of the table.
    pub schema: String,
    /// Table name.
    pub table: String,
    /// Column holding the digest: `bytea` (32 bytes) or text (64 hex).
    pub digest_column: String,
    /// Column holding the namespace, if the table spans namespaces.
    pub namespace_column: Option<String>,
}

impl LivenessTable {
    /// A table reference without a namespace column.
    pub fn new(
        schema: impl Into<String>,
        table: impl Into<String>,
        digest_column: impl Into<String>,
    ) -> Self {
        LivenessTable {
            schema: schema.into(),
            table: table.into(),
            digest_column: digest_column.into(),
            namespace_column: None,
        }
    }

    /// Adds the namespace column.
    pub fn with_namespace_column(mut self, column: impl Into<String>) -> Self {
        self.namespace_column = Some(column.into());
        self
    }
}

/// A registered liveness table, bound to the namespace it speaks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BoundLivenessTable {
    /// The namespace whose entries the table protects.
    pub namespace: Namespace,
    /// The table.
    pub table: LivenessTable,
    /// Whether the digest column is text (hex) rather than bytea.
    pub digest_is_text: bool,
}

/// The pin row a fleet put commits: `(key, owner, expiry)` on `host`, the
/// expiry being `ttl` after the **host's** now (see
/// [`PinRows`](crate::PinRows), "Whose clock").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinIntent {
    /// The instance writing the row.
    pub owner: String,
    /// The putter's clock reading. Informational: hosts with a clock of
    /// their own (PostgreSQL) do not use it; the row expires `ttl` after
    /// the host's now.
    pub now: Timestamp,
    /// Row lifetime.
    pub ttl: Duration,
    /// Where `gc_pins` lives (the kv engine's database and schema).
    pub host: Instance,
}

impl PinIntent {
    /// When the row would expire by the putter's clock (`now + ttl`); a
    /// host with its own clock computes the expiry by that clock instead.
    pub fn expires_at(&self) -> Timestamp {
        self.now.plus(self.ttl)
    }
}

/// The generation of a fleet pin row (`gc_pins.pin_id`, ADR-054): assigned
/// when the row of (key, owner) is created and again whenever a pin finds
/// that row already expired by the host's clock; kept while a pin or
/// renewal merely extends an unexpired row. So one generation names one
/// span of time during which the row held without a gap.
pub type PinGeneration = i64;

/// What a fleet reference set presents to the fleet guard
/// ([`RefStore::set_checked`](crate::RefStore::set_checked), ADR-045 §7,
/// ADR-054): the node whose pin protects the entry and the generation of
/// the pin row **its own** pin wrote. The guard accepts the set only while
/// that row still has that generation and is unexpired, which proves the
/// pin held continuously since it was taken (a row that expired and was
/// pinned again, by a retry or another put of the node, carries a new
/// generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinProof<'a> {
    /// The pinning node (the store's owner name).
    pub owner: &'a str,
    /// The generation the pin returned ([`PinRows::pin_first`](crate::PinRows::pin_first)).
    pub generation: PinGeneration,
}

/// One locked batch of a fleet sweep's execute phase: a transaction on the
/// GC host holding an exclusive per-key lock on every candidate, so no put
/// can commit a pin on them until it ends.
///
/// # Contract
///
/// - Every fleet put takes the same per-key lock, shared, in the
///   transaction that commits its pin row (with the entry, or before the
///   publishing rename), so `protected` sees every pin committed before the
///   batch locked, and no pin can commit until the batch ends.
/// - `protected` runs as a fresh statement after the locks are held.
/// - Nothing is durable until `commit`; dropping the batch rolls back.
#[async_trait]
pub trait FleetBatch: Send {
    /// Protection of each key: an unexpired pin row (by the host's clock;
    /// `now` is for hosts without one), or a row in one of `tables` naming
    /// it.
    async fn protected(
        &mut self,
        keys: &[Key],
        tables: &[BoundLivenessTable],
        now: Timestamp,
    ) -> Result<Vec<Option<ProtectReason>>>;
    /// Deletes the host's own kv entries inside the batch transaction;
    /// freed size per digest (`None` when absent here).
    async fn delete_entries(
        &mut self,
        ns: &Namespace,
        digests: &[Digest],
    ) -> Result<Vec<Option<u64>>>;
    /// Removes window rows inside the batch transaction.
    async fn unstage(&mut self, keys: &[Key]) -> Result<()>;
    /// Writes a durable **deletion fence** for each key inside the batch
    /// transaction. From its commit until [`crate::BatchClauses::unfence`],
    /// every fleet put, pin and publish of a fenced key waits (it never
    /// deduplicates onto an entry that is being deleted), so the batch can
    /// commit — ending its locks and its session's part — *before* the
    /// large-tier media deletes run: losing the session can no longer
    /// un-protect a delete in flight.
    async fn fence(&mut self, keys: &[Key]) -> Result<()>;
    /// Whether each key is already fenced (another delete of it is in
    /// flight), read inside the batch after its locks are held. A fenced
    /// key must be left alone: neither deleted, fenced again nor unstaged —
    /// its own fencer clears the fence when its delete has finished.
    async fn fenced(&mut self, keys: &[Key]) -> Result<Vec<bool>>;
    /// Commits, releasing the locks.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// A namespace's GC policy as one fleet node records it in the shared
/// database (ADR-045). `max_age` has no fleet form (its age check is an
/// in-process probe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FleetPolicy {
    /// Entries no reference points at (and no pin holds) are garbage.
    Refs,
    /// The same garbage as `Refs`, spelled for namespaces that are swept
    /// from the start (references still protect).
    Unreferenced,
    /// The policy layer never makes the namespace swept; set on any node,
    /// it wins over every other node's `Refs`/`Unreferenced` and over the
    /// implicit `refs` of a namespace that uses references.
    Keep,
    /// A cache namespace (ADR-048): entries are live while a cache key
    /// points at them (or a reference or pin protects them); a sweep first
    /// removes the keys outside the bound. Nodes with different bounds
    /// combine to the loosest ([`CacheBounds::loosest`]).
    Cache(CacheBounds),
}

impl FleetPolicy {
    /// The stored spelling: `refs`, `unreferenced`, `keep`, or `cache`
    /// followed by ` max_bytes=N` and ` max_age_ms=N` where bounded.
    pub fn spelling(self) -> String {
        match self {
            FleetPolicy::Refs => "refs".into(),
            FleetPolicy::Unreferenced => "unreferenced".into(),
            FleetPolicy::Keep => "keep".into(),
            FleetPolicy::Cache(b) => {
                let mut s = String::from("cache");
                if let Some(n) = b.max_bytes {
                    s.push_str(&format!(" max_bytes={n}"));
                }
                if let Some(a) = b.max_age {
                    s.push_str(&format!(" max_age_ms={}", a.as_millis()));
                }
                s
            }
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<FleetPolicy> {
        match s {
            "refs" => return Some(FleetPolicy::Refs),
            "unreferenced" => return Some(FleetPolicy::Unreferenced),
            "keep" => return Some(FleetPolicy::Keep),
            _ => {}
        }
        let mut words = s.split(' ');
        if words.next() != Some("cache") {
            return None;
        }
        let mut b = CacheBounds::default();
        for w in words {
            let (k, v) = w.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            match k {
                "max_bytes" if b.max_bytes.is_none() => b.max_bytes = Some(v),
                "max_age_ms" if b.max_age.is_none() => {
                    b.max_age = Some(std::time::Duration::from_millis(v))
                }
                _ => return None,
            }
        }
        Some(FleetPolicy::Cache(b))
    }
}

/// The cache namespaces of a fleet and their combined bounds (ADR-048):
/// every namespace with a `cache` row of any node, unless any node's row
/// says `keep`; bounds combine to the loosest of the nodes'.
pub fn fleet_cache_namespaces(
    rows: &[PolicyRow],
) -> std::collections::BTreeMap<Namespace, CacheBounds> {
    let mut out: std::collections::BTreeMap<Namespace, CacheBounds> = Default::default();
    for r in rows {
        if let FleetPolicy::Cache(b) = r.policy {
            out.entry(r.namespace.clone())
                .and_modify(|c| *c = c.loosest(b))
                .or_insert(b);
        }
    }
    out.retain(|ns, _| {
        !rows
            .iter()
            .any(|r| &r.namespace == ns && r.policy == FleetPolicy::Keep)
    });
    out
}

/// One node's policy for one namespace, as stored in the shared database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRow {
    /// The namespace.
    pub namespace: Namespace,
    /// The node that set it (its stable owner name).
    pub owner: String,
    /// The policy.
    pub policy: FleetPolicy,
}

/// The namespaces the policy layer sweeps in a fleet (ADR-045): those with
/// a `refs`/`unreferenced` row of any node, or marked as using references
/// (`marked`), unless **any** node's row says `keep`.
pub fn fleet_swept_namespaces(
    rows: &[PolicyRow],
    marked: &[Namespace],
) -> std::collections::BTreeSet<Namespace> {
    let kept: std::collections::BTreeSet<&Namespace> = rows
        .iter()
        .filter(|r| r.policy == FleetPolicy::Keep)
        .map(|r| &r.namespace)
        .collect();
    rows.iter()
        .filter(|r| r.policy != FleetPolicy::Keep)
        .map(|r| &r.namespace)
        .chain(marked)
        .filter(|ns| !kept.contains(ns))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ns: &str, owner: &str, policy: FleetPolicy) -> PolicyRow {
        PolicyRow {
            namespace: Namespace::new(ns).unwrap(),
            owner: owner.into(),
            policy,
        }
    }

    #[test]
    fn keep_on_any_node_wins() {
        let n = |s: &str| Namespace::new(s).unwrap();
        let rows = [
            row("a", "n1", FleetPolicy::Refs),
            row("a", "n2", FleetPolicy::Keep),
            row("b", "n1", FleetPolicy::Unreferenced),
            row("c", "n2", FleetPolicy::Keep),
        ];
        let swept = fleet_swept_namespaces(&rows, &[n("c"), n("d")]);
        assert_eq!(swept.into_iter().collect::<Vec<_>>(), [n("b"), n("d")]);
        for p in [
            FleetPolicy::Refs,
            FleetPolicy::Unreferenced,
            FleetPolicy::Keep,
            FleetPolicy::Cache(CacheBounds::default()),
            FleetPolicy::Cache(CacheBounds {
                max_bytes: Some(50 << 30),
                max_age: Some(std::time::Duration::from_secs(86400)),
            }),
            FleetPolicy::Cache(CacheBounds {
                max_bytes: None,
                max_age: Some(std::time::Duration::from_millis(1500)),
            }),
        ] {
            assert_eq!(FleetPolicy::parse(&p.spelling()), Some(p));
        }
        assert_eq!(FleetPolicy::parse("max_age"), None);
        assert_eq!(FleetPolicy::parse("cache max_bytes=x"), None);
        assert_eq!(FleetPolicy::parse("cache max_bytes=1 max_bytes=2"), None);
        assert_eq!(FleetPolicy::parse("cache size=1"), None);
    }

    #[test]
    fn cache_rows_combine_loosest_and_keep_wins() {
        let n = |s: &str| Namespace::new(s).unwrap();
        let c = |b: Option<u64>| {
            FleetPolicy::Cache(CacheBounds {
                max_bytes: b,
                max_age: None,
            })
        };
        let rows = [
            row("a", "n1", c(Some(10))),
            row("a", "n2", c(Some(20))),
            row("b", "n1", c(Some(10))),
            row("b", "n2", FleetPolicy::Keep),
            row("d", "n1", FleetPolicy::Refs),
        ];
        let caches = fleet_cache_namespaces(&rows);
        assert_eq!(caches.len(), 1);
        assert_eq!(caches[&n("a")].max_bytes, Some(20));
        let swept = fleet_swept_namespaces(&rows, &[]);
        assert_eq!(swept.into_iter().collect::<Vec<_>>(), [n("a"), n("d")]);
    }
}
