//! Named references (issue 13, ADR-024): `(namespace, name) → digest`
//! rows in the kv engine's database that tell GC an entry is still needed.
//!
//! The kv engines that can hold them (`mem`, `sqlite`, `postgres`) answer
//! [`KvEngine::refs`](crate::KvEngine::refs) with a [`RefStore`]; the
//! facade (`store_core::Refs`) adds the protocol around it (the entry must
//! exist and stay pinned while its reference is written) and registers the
//! references as a liveness source.

use std::fmt;

use async_trait::async_trait;

use crate::{Digest, Error, LivenessTable, Namespace, PinProof, Result};

/// Longest reference name, in bytes.
pub const REF_NAME_MAX_LEN: usize = 255;

/// A validated reference name: 1–255 characters of `[A-Za-z0-9._/-]`,
/// `/`-separated segments that are neither empty nor `.` or `..` (so
/// names map safely onto paths and URLs: `builds/2026-12-01/app.tar`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RefName(String);

impl RefName {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<RefName> {
        let name = name.into();
        let bad = |why: &str| Err(Error::KeyInvalid(format!("reference name {name:?}: {why}")));
        if name.is_empty() || name.len() > REF_NAME_MAX_LEN {
            return bad("1 to 255 characters expected");
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')))
        {
            return bad(&format!("{c:?} is not allowed (use A-Z a-z 0-9 . _ / -)"));
        }
        if name
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return bad("segments between `/` must not be empty, `.` or `..`");
        }
        Ok(RefName(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RefName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The precondition of a reference update (compare-and-swap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefExpect {
    /// Whatever the reference holds, or its absence.
    Any,
    /// The reference must not exist (create only).
    Absent,
    /// The reference must hold this digest.
    Digest(Digest),
}

impl RefExpect {
    /// Whether `current` satisfies the precondition.
    pub fn holds(self, current: Option<Digest>) -> bool {
        match self {
            RefExpect::Any => true,
            RefExpect::Absent => current.is_none(),
            RefExpect::Digest(d) => current == Some(d),
        }
    }
}

/// What a writer may replace or remove of what others wrote (issue 39,
/// ADR-052): the `write` scope only adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// Anything: the `delete` scope, or the embedding application.
    Any,
    /// Rows the writer set itself (their owner is the writer's name).
    Own,
    /// Nothing (a write-once cache namespace): a set must create the row
    /// or name the digest it already holds.
    Nothing,
}

/// Who writes a reference or a cache key: the name stored as the row's
/// owner and what the writer may replace (issue 39, ADR-052).
///
/// Whatever `may` says, a set that names the digest the row already holds
/// changes nothing and is allowed (the owner stays the first writer's);
/// creating a row is always allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Author<'a> {
    /// The writer's name (an identity), stored as the owner of the rows
    /// it creates; `None` for the embedding application.
    pub name: Option<&'a str>,
    /// What it may replace or remove.
    pub may: Replace,
}

impl Author<'static> {
    /// The embedding application: no owner name, replaces anything.
    pub const LIBRARY: Author<'static> = Author {
        name: None,
        may: Replace::Any,
    };
}

impl Author<'_> {
    /// Whether this author may replace (`new` = `Some`) or remove (`None`)
    /// a row holding `current` that `owner` set.
    pub fn may_change(&self, current: Digest, owner: Option<&str>, new: Option<Digest>) -> bool {
        if new == Some(current) {
            return true;
        }
        match self.may {
            Replace::Any => true,
            Replace::Own => self.name.is_some() && owner == self.name,
            Replace::Nothing => false,
        }
    }

    /// [`Author::may_change`] as a result: the [`Error::NotOwner`] of a
    /// refused change of `name`.
    pub fn check(
        &self,
        name: &RefName,
        current: Option<(Digest, Option<&str>)>,
        new: Option<Digest>,
    ) -> Result<()> {
        match current {
            Some((d, owner)) if !self.may_change(d, owner, new) => Err(Error::NotOwner {
                name: name.to_string(),
                current: d,
                write_once: self.may == Replace::Nothing,
            }),
            _ => Ok(()),
        }
    }
}

/// One reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefEntry {
    /// The name.
    pub name: RefName,
    /// The digest it points at.
    pub digest: Digest,
}

/// References held in a kv engine's database.
///
/// # Contract
///
/// - `set` and `delete` are atomic compare-and-swap operations: the
///   precondition is checked and the row written in one transaction (or
///   under one lock); a failed precondition changes nothing and returns
///   [`Error::RefConflict`] with the current digest.
/// - A committed `set` is visible to `referenced` (and, for a fleet, to
///   the liveness table) before `set` returns; durability follows the
///   engine's commit rules.
/// - `set` does **not** mark the namespace as *using references*: the
///   facade calls [`RefStore::mark_uses_refs`] after a committed `set`
///   whose caller may change the namespace's GC policy (ADR-045: a failed,
///   refused or unprivileged set never turns a `keep` namespace into a
///   swept one). The mark is never removed by deleting references
///   (deleting the last reference makes entries garbage, it does not
///   exempt the namespace from collection).
/// - With a `pin` proof (fleet stores), `set_checked` takes the entry's
///   fleet key lock shared inside its transaction and commits only if the
///   entry is not fenced for deletion and the proof's pin row on it —
///   `pin.owner`'s row **with generation `pin.generation`** — is still
///   unexpired by the database's clock. A row that expired never keeps its
///   generation, so this proves the set's own pin held continuously: a set
///   delayed past the pin TTL can never commit a reference to an entry a
///   sweep deleted meanwhile, even when a retry or another put of the node
///   has pinned the key again since (ADR-045 §7, ADR-054; a `TimedOut`
///   error then; nothing written). Engines that cannot hold a fleet's GC
///   state (mem, sqlite) are never given a proof and ignore it.
/// - **Owners** (issue 39, ADR-052): each row stores the name of the
///   [`Author`] that created it. `set` and `delete` check
///   [`Author::check`] against the row's digest and owner in the same
///   transaction (or under the same lock) as the precondition, after it: a
///   refused change writes nothing and returns [`Error::NotOwner`]. A set
///   to the digest the row holds keeps the row's owner.
/// - Every method is cancel-safe: dropped before it returns, a `set` or
///   `delete` either committed whole or not at all.
#[async_trait]
pub trait RefStore: Send + Sync + 'static {
    /// Points `name` at `digest` if `expect` holds and `author` may change
    /// the row; returns the previous digest. `pin`: see the contract
    /// (fleet guard).
    async fn set_checked(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
        author: Author<'_>,
        pin: Option<PinProof<'_>>,
    ) -> Result<Option<Digest>>;

    /// [`RefStore::set_checked`] by the embedding application
    /// ([`Author::LIBRARY`]), without the fleet guard.
    async fn set(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
    ) -> Result<Option<Digest>> {
        self.set_checked(ns, name, digest, expect, Author::LIBRARY, None)
            .await
    }

    /// The digest `name` points at.
    async fn get(&self, ns: &Namespace, name: &RefName) -> Result<Option<Digest>>;

    /// Removes `name` if `expect` holds and `author` may remove it; returns
    /// the digest it held (`None`: there was no such reference and `expect`
    /// allowed that).
    async fn delete(
        &self,
        ns: &Namespace,
        name: &RefName,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>>;

    /// Up to `limit` references of `ns` whose names start with `prefix`
    /// and sort after `after`, in name order (byte order).
    async fn list(
        &self,
        ns: &Namespace,
        prefix: &str,
        after: Option<&RefName>,
        limit: usize,
    ) -> Result<Vec<RefEntry>>;

    /// For each digest, whether any reference of `ns` points at it.
    async fn referenced(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>>;

    /// Namespaces marked as using references.
    async fn ref_namespaces(&self) -> Result<Vec<Namespace>>;

    /// Marks `ns` as using references (durably, as the engine commits);
    /// `true` if it was not marked before. Idempotent.
    async fn mark_uses_refs(&self, ns: &Namespace) -> Result<bool>;

    /// Whether `ns` is marked as using references.
    async fn uses_refs(&self, ns: &Namespace) -> Result<bool> {
        Ok(self.ref_namespaces().await?.contains(ns))
    }

    /// The references as a fleet liveness table (namespace and digest
    /// columns), for engines whose database the fleet shares.
    fn liveness_table(&self) -> Option<LivenessTable> {
        None
    }
}

/// The [`Error::RefConflict`] of a failed precondition.
pub fn ref_conflict(name: &RefName, current: Option<Digest>) -> Error {
    Error::RefConflict {
        name: name.to_string(),
        current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in [
            "a",
            "builds/2026-12-01/app.tar",
            "A_b-c.d",
            "x/y/z",
            ".hidden",
        ] {
            assert!(RefName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a//b",
            "/a",
            "a/",
            "a/../b",
            "..",
            ".",
            "a b",
            "a%2F",
            "ü",
            "a\\b",
            &"x".repeat(256),
        ] {
            assert!(
                matches!(RefName::new(bad), Err(Error::KeyInvalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn preconditions() {
        let d = Digest::of(b"x");
        let e = Digest::of(b"y");
        assert!(RefExpect::Any.holds(None) && RefExpect::Any.holds(Some(d)));
        assert!(RefExpect::Absent.holds(None) && !RefExpect::Absent.holds(Some(d)));
        assert!(RefExpect::Digest(d).holds(Some(d)));
        assert!(!RefExpect::Digest(d).holds(Some(e)) && !RefExpect::Digest(d).holds(None));
    }
}
