//! Blobpool's garbage-collection protocol (ADR-005 as ruled by ADR-012).
//!
//! The invariant everything here serves: **a visible pool entry is never
//! deleted while it is protected** — pinned, observed live through a
//! registered liveness source, or named by the protect callback.
//!
//! - [`PinRegistry`] / [`Pin`]: in-process pins, and the delete gate that
//!   makes "check protection, then delete" atomic against new pins.
//! - [`LivenessSource`] / [`ProtectCallback`]: the embedder's hooks.
//! - [`InProcessWindow`]: the delete window for instances without a
//!   SQL-backed engine (ADR-012 §5); SQL engines implement
//!   [`store_types::WindowClauses`] durably.
//! - [`Collector`]: the sweep and the direct-delete arbitration over a list
//!   of tiers, producing exact [`SweepReport`]s.
//!
//! This crate depends on the vocabulary crate only; it sees engines as
//! `dyn Engine` and never names one.

mod clock;
mod collector;
mod liveness;
mod pins;
mod report;
mod window;

pub use clock::{Clock, ManualClock, SystemClock};
pub use collector::{Collector, GcConfig, SweepOptions, FENCE_GRACE};
pub use liveness::{LivenessSource, ProtectCallback, SourceId};
pub use pins::{DeleteGate, GateState, Pin, PinRegistry};
pub use report::{GcAbortCause, NamespaceCounts, ProtectedCounts, SweepReport};
pub use window::InProcessWindow;
