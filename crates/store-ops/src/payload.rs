//! Wire payloads (JSON via serde).
//!
//! [`PutResponse`], [`HaveRequest`] and [`HaveResponse`] are pinned by
//! ADR-012 §2: their field sets are exact and tested byte for byte. The
//! other shapes are this crate's own (ADR-017).

use serde::{Deserialize, Serialize};
use store_types::{ProtectReason, Tier};

/// `blobs/put`'s answer: `{"token": "...", "digest": "<64 hex>"}`, both
/// always present, for known- and unknown-length puts alike (ADR-012 §2).
/// In a cache namespace (ADR-048) no token is issued:
/// `{"token": null, "digest": "…", "cache": true}` — the entry's cache key
/// `cas/<digest>` protects it instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutResponse {
    /// The opaque pin token (see ADR-018 for its lifetime); `None` in a
    /// cache namespace.
    pub token: Option<String>,
    /// The stored entry's canonical digest (64 lowercase hex characters).
    pub digest: String,
    /// `true` when the namespace is a cache namespace (no token; the field
    /// is absent otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache: bool,
}

/// `blobs/have`'s request: `{"namespace", "digests": [...], "token"?}`.
///
/// Fields are kept as text so that a malformed digest is reported as
/// `key_invalid` (with its index) rather than as a JSON error. Unknown
/// fields are rejected (`bad_request`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaveRequest {
    /// The namespace probed.
    pub namespace: String,
    /// The digests probed (at most [`crate::DEFAULT_MAX_HAVE_DIGESTS`] by
    /// default; exactly one with a token).
    pub digests: Vec<String>,
    /// A pin token: turns the request into a renewal probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `blobs/have`'s answer: `{"present": [bool...]}`, index-aligned with the
/// request's `digests`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaveResponse {
    /// Whether each digest is present (for a renewal probe: whether the
    /// token's pin is alive and was renewed).
    pub present: Vec<bool>,
}

/// Entry metadata (the HTTP binding sends it as `HEAD` headers; the CLI
/// prints it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatResponse {
    /// The namespace.
    pub namespace: String,
    /// The canonical digest.
    pub digest: String,
    /// Content length in bytes.
    pub size: u64,
    /// The tier holding the entry.
    pub tier: Tier,
    /// Publication time, milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// `GET /health`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthResponse {
    /// `"ok"`, or `"unavailable"` when a tier did not answer.
    pub status: String,
    /// The store's dispatch mode: `mem-only`, `kv-only` or `dual-tier`.
    pub mode: String,
    /// Whether the store was built with `fleet: true`.
    pub fleet: bool,
    /// Live pin tokens held by this process.
    pub tokens: u64,
    /// Why the store is unavailable (absent when `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The structured error body: `{"error": {"code", "message", "reason"?}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable code ([`crate::ErrorCode::as_str`]).
    pub code: String,
    /// A human-readable, one-line message.
    pub message: String,
    /// What protects the key (`gc_refuse` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ProtectReason>,
}
