//! `refs/*`: named references over the wire (ADR-024), the ops form of
//! [`store_core::Refs`].

use serde::{Deserialize, Serialize};
use store_core::{Digest, Namespace, RefExpect, RefName, Refs, SetRefOptions};

use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::Ops;

/// Largest page of a reference listing.
pub const MAX_REF_PAGE: usize = 1000;

/// `PUT /v1/refs/{ns}/{name}` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetRefRequest {
    /// The digest the reference points at (the entry must exist).
    pub digest: String,
    /// A pin token of the put that stored the entry: the reference is
    /// committed while its pin holds, then the token is released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// One reference on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefResponse {
    /// The namespace.
    pub namespace: String,
    /// The reference name.
    pub name: String,
    /// The digest it points at.
    pub digest: String,
}

/// The answer of a set: the reference, what it held before, and whether
/// the token was released.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetRefResponse {
    /// The reference now.
    #[serde(flatten)]
    pub reference: RefResponse,
    /// The digest it held before (`null`: it was created).
    pub previous: Option<String>,
    /// Whether the request's pin token was released.
    pub token_released: bool,
    /// Whether this set switched the namespace's GC policy in force from
    /// `keep` to `refs` (its first reference, set by a caller who may
    /// delete in the namespace; ADR-045). Absent from older servers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub policy_adopted: bool,
}

/// A page of a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefPage {
    /// The references, in name order.
    pub refs: Vec<RefResponse>,
    /// The `after` of the next page, `null` at the end.
    pub next: Option<String>,
}

fn digest(s: &str) -> Result<Digest, OpsError> {
    Digest::parse(s.trim()).map_err(OpsError::from)
}

/// Parses a precondition from HTTP-style headers: `If-Match: "<digest>"`
/// (the reference must hold it) or `If-None-Match: *` (it must not exist).
pub fn expect_from_headers(
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Result<RefExpect, OpsError> {
    match (if_match, if_none_match) {
        (Some(_), Some(_)) => Err(OpsError::bad_request(
            "send If-Match or If-None-Match, not both",
        )),
        (Some(m), None) => {
            let m = m.trim().trim_start_matches("W/").trim_matches('"');
            Ok(RefExpect::Digest(digest(m).map_err(|_| {
                OpsError::bad_request("If-Match takes the quoted digest the reference holds now")
            })?))
        }
        (None, Some(n)) if n.trim() == "*" => Ok(RefExpect::Absent),
        (None, Some(_)) => Err(OpsError::bad_request(
            "If-None-Match takes only `*` (create the reference only if it does not exist)",
        )),
        (None, None) => Ok(RefExpect::Any),
    }
}

impl Ops {
    /// The reference handlers.
    pub fn refs(&self) -> RefOps<'_> {
        RefOps(self)
    }
}

/// The reference handlers of an [`Ops`] ([`Ops::refs`]).
#[derive(Clone, Copy, Debug)]
pub struct RefOps<'a>(&'a Ops);

impl RefOps<'_> {
    fn refs(&self) -> Result<Refs, OpsError> {
        self.0.store().refs().ok_or_else(|| {
            OpsError::new(
                ErrorCode::NotFound,
                "this server's kv engine holds no references",
            )
        })
    }

    /// Sets a reference for `identity` (scope `write` on the namespace,
    /// checked here). With a token, the token must be the identity's (or
    /// the identity an admin) and pin this very entry; it is released once
    /// the reference is committed.
    ///
    /// With only `write`, the identity creates references and re-sets one
    /// to the digest it holds; moving a reference another identity set to
    /// another digest needs `delete` on the namespace (`forbidden`,
    /// ADR-052). The reference remembers the identity that created it.
    ///
    /// A namespace's first reference makes a `keep`-by-default namespace a
    /// `refs` namespace, which turns its unreferenced entries into garbage:
    /// only an identity with `delete` on the namespace may cause that
    /// (ADR-045). A `write`-only identity's reference is committed and
    /// protects its entry, but the namespace's policy stays as it is.
    ///
    /// Cancel-safe: [`Refs::set_with`] runs to its outcome whether or not
    /// this future is dropped; the token is released only after the commit
    /// (dropped in between, it stays and its owner releases it as usual).
    pub async fn set(
        &self,
        identity: &Identity,
        ns: &str,
        ref_name: &str,
        req: SetRefRequest,
        expect: RefExpect,
    ) -> Result<SetRefResponse, OpsError> {
        self.0.authorize(identity, Scope::Write, Some(ns))?;
        let n = Namespace::new(ns)?;
        let nm = RefName::new(ref_name)?;
        let d = digest(&req.digest)?;
        let refs = self.refs()?;
        if let Some(token) = &req.token {
            let (key, _) = self.0.check_owner(identity, token)?;
            if key.namespace != n || key.digest != d {
                return Err(OpsError::bad_request(
                    "the token pins another entry than the one the reference names",
                ));
            }
        }
        let adopt_policy = identity.allows(Scope::Delete, Some(ns));
        let author = self.0.author(identity, &n);
        let opts = SetRefOptions {
            adopt_policy,
            owner: author.name.map(str::to_string),
            may: author.may,
        };
        let out = refs.set_with(&n, &nm, d, expect, opts).await?;
        let token_released = match &req.token {
            Some(t) => self.0.release_token(identity, t).is_ok(),
            None => false,
        };
        Ok(SetRefResponse {
            reference: RefResponse {
                namespace: n.to_string(),
                name: nm.to_string(),
                digest: d.to_hex(),
            },
            previous: out.previous.map(|p| p.to_hex()),
            token_released,
            policy_adopted: out.adopted,
        })
    }

    /// The reference (scope `read`). `missing` when absent.
    pub async fn get(
        &self,
        identity: &Identity,
        ns: &str,
        ref_name: &str,
    ) -> Result<RefResponse, OpsError> {
        self.0.authorize(identity, Scope::Read, Some(ns))?;
        let n = Namespace::new(ns)?;
        let nm = RefName::new(ref_name)?;
        let d = self
            .refs()?
            .get(&n, &nm)
            .await?
            .ok_or_else(|| OpsError::new(ErrorCode::Missing, "no such reference"))?;
        Ok(RefResponse {
            namespace: n.to_string(),
            name: nm.to_string(),
            digest: d.to_hex(),
        })
    }

    /// Deletes a reference (scope `write`). Returns the digest it held;
    /// `missing` when absent (unless the precondition is `Absent`, which is
    /// a conflict when it exists). With only `write`, an identity deletes
    /// only references it set; another identity's needs `delete` on the
    /// namespace (`forbidden`, ADR-052).
    pub async fn delete(
        &self,
        identity: &Identity,
        ns: &str,
        ref_name: &str,
        expect: RefExpect,
    ) -> Result<String, OpsError> {
        self.0.authorize(identity, Scope::Write, Some(ns))?;
        let n = Namespace::new(ns)?;
        let nm = RefName::new(ref_name)?;
        let author = self.0.author(identity, &n);
        match self.refs()?.delete_by(&n, &nm, expect, author).await? {
            Some(d) => Ok(d.to_hex()),
            None => Err(OpsError::new(ErrorCode::Missing, "no such reference")),
        }
    }

    /// A page of references (scope `read`): names starting with `prefix`,
    /// after `after`, at most `limit` (≤ [`MAX_REF_PAGE`]).
    pub async fn list(
        &self,
        identity: &Identity,
        ns: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<RefPage, OpsError> {
        self.0.authorize(identity, Scope::Read, Some(ns))?;
        let n = Namespace::new(ns)?;
        if limit == 0 || limit > MAX_REF_PAGE {
            return Err(OpsError::bad_request(format!(
                "limit must be between 1 and {MAX_REF_PAGE}"
            )));
        }
        let after = after.map(RefName::new).transpose()?;
        let mut page = self
            .refs()?
            .list(&n, prefix, after.as_ref(), limit + 1)
            .await?;
        let more = page.len() > limit;
        page.truncate(limit);
        let next = if more {
            page.last().map(|r| r.name.to_string())
        } else {
            None
        };
        Ok(RefPage {
            refs: page
                .into_iter()
                .map(|r| RefResponse {
                    namespace: n.to_string(),
                    name: r.name.to_string(),
                    digest: r.digest.to_hex(),
                })
                .collect(),
            next,
        })
    }
}
