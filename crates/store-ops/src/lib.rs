//! Blobpool's ops layer: transport-neutral handlers over a
//! [`store_core::Store`] with serde payloads, and their HTTP binding.
//!
//! - [`Ops`] is the handler set: `blobs/put`, `blobs/have` (existence probe
//!   and pin-token renewal), get (whole or ranged), stat, delete, token
//!   release, sweep, health and metrics; [`Ops::get_bao`] serves verified
//!   (bao) streams, encoded by [`bao`] (ADR-033). Every handler answers either a
//!   payload or an [`OpsError`] with a stable [`ErrorCode`].
//! - [`payload`] holds the wire shapes. The two pinned by ADR-012 §2 are
//!   [`PutResponse`] (`{"token", "digest"}`) and [`HaveRequest`] /
//!   [`HaveResponse`] (`{"namespace", "digests", "token"?}` →
//!   `{"present"}`); the rest are recorded in ADR-017.
//! - [`TokenRegistry`] maps opaque pin tokens to the pins they hold, with
//!   the lifetime rules of ADR-018 (explicit release; caps checked before a
//!   put stores anything, never evicting; an idle TTL renewed by probes in
//!   fleet mode or when an operator sets one).
//! - [`http`] binds the handlers to HTTP with axum (routes in
//!   `docs/SERVER.md`).
//!
//! Architecture invariant: this crate names no engine. It is handed a built
//! `Store` and sees engines only through it.

#![warn(missing_docs)]

mod admin;
pub mod auth;
pub mod bao;
pub mod cache;
mod error;
pub mod http;
mod metrics;
mod ops;
pub mod payload;
pub mod range;
pub mod refs;
mod tokens;
pub mod uploads;

pub use admin::{
    NamespacesResponse, StatsResponse, StatsTotal, VerifyRequest, DEFAULT_VERIFY_CONCURRENCY,
    INVENTORY_REFRESH, MAX_VERIFY_CONCURRENCY,
};
pub use error::{ErrorCode, OpsError, TOKEN_CAP_RETRY_AFTER, TRANSIENT_RETRY_AFTER};
pub use metrics::Metrics;
pub use ops::{
    BaoResponse, GetResponse, Ops, OpsConfig, PutOutcome, BAO_MEMORY_MAX, DEFAULT_MAX_BLOB_SIZE,
    DEFAULT_MAX_HAVE_DIGESTS,
};
pub use payload::{
    ErrorBody, ErrorDetail, HaveRequest, HaveResponse, HealthResponse, PutResponse, StatResponse,
};
pub use tokens::{TokenCapReached, TokenRegistry, TokenSlot, TokenStats, DEFAULT_MAX_TOKENS};
