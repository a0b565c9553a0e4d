//! Blobpool's ops layer: transport-neutral handlers over a
//! [`store_core::Store`] with serde payloads. Their HTTP binding is the
//! `store-http` crate, which depends on this one (never the other way).
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
//! - [`auth`] holds identities and scopes (ADR-023); a transport hands
//!   [`auth::Auth::authenticate`] the credentials it saw (an
//!   `Authorization` value, a verified [`auth::ClientCert`]).
//! - Every handler is a plain async method taking and answering values: no
//!   route, status line or header is known here (the only HTTP vocabulary
//!   is [`ErrorCode::http_status`], the status each code maps to, and the
//!   `Range` and ref-precondition header parsers a binding reuses).
//!
//! Architecture invariant: this crate names no engine. It is handed a built
//! `Store` and sees engines only through it.

#![warn(missing_docs)]

mod admin;
pub mod auth;
pub mod bao;
pub mod cache;
mod error;
pub mod hosts;
mod inventory;
mod metrics;
mod ops;
pub mod payload;
pub mod range;
pub mod refs;
mod tokens;
pub mod uploads;

pub use admin::{
    NamespacesResponse, StatsResponse, StatsTotal, VerifyRequest, DEFAULT_VERIFY_CONCURRENCY,
    MAX_VERIFY_CONCURRENCY, MIN_VERIFY_RATE,
};
pub use error::{ErrorCode, OpsError, TOKEN_CAP_RETRY_AFTER, TRANSIENT_RETRY_AFTER};
pub use inventory::INVENTORY_REFRESH;
pub use metrics::{DatabaseWaits, EngineHistogram, Metrics, WaitsSource};
pub use ops::blobs::{BaoResponse, GetResponse, PutOutcome, BAO_MEMORY_MAX};
pub use ops::config::{OpsConfig, DEFAULT_MAX_BLOB_SIZE, DEFAULT_MAX_HAVE_DIGESTS};
pub use ops::uploads::UploadOps;
pub use ops::Ops;
pub use payload::{
    ErrorBody, ErrorDetail, HaveRequest, HaveResponse, HealthResponse, PutResponse, StatResponse,
};
pub use tokens::{TokenCapReached, TokenRegistry, TokenSlot, TokenStats, DEFAULT_MAX_TOKENS};
