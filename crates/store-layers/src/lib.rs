//! Engine layers: a public way to wrap any Blobpool engine.
//!
//! A **layer** ([`EngineLayer`]) sees every operation of an engine — and
//! of the stages it opens — as a [`Call`] plus the rest of the call
//! ([`Next`]), and decides how that runs: observe it, time it, delay it,
//! fail it, or wrap what it answers (a stage, a reader). The **forwarding
//! base** ([`Layered`]) does the rest: it implements [`Engine`],
//! [`KvEngine`] and [`LargeEngine`] (and [`StagedWrite`] for its stages)
//! for any wrapped engine, forwarding every method — the default-bodied
//! ones too, checked by `#[deny(clippy::missing_trait_methods)]` — so a
//! wrapped engine keeps its GC seam, references, instance lock, direct
//! stages and joint pin publish. [`reader::wrap_reader`] is the same base
//! for a read's byte stream.
//!
//! Layers compose by nesting; [`LayerStack`] is the builder:
//!
//! ```
//! # use std::sync::Arc;
//! # use store_types::KvEngine;
//! use store_layers::{FaultLayer, FaultPlan, LayerStack, MetricsLayer, TraceLayer};
//!
//! # fn wrap(kv: Arc<dyn KvEngine>) -> Arc<dyn KvEngine> {
//! let metrics = MetricsLayer::new();
//! let stack = LayerStack::new()
//!     .layer(FaultLayer::new(FaultPlan::none())) // innermost
//!     .layer(metrics.clone())
//!     .layer(TraceLayer::new()); // outermost: sees each call first
//! stack.kv(kv)
//! # }
//! ```
//!
//! Shipped layers: [`TraceLayer`] (a span per operation), [`MetricsLayer`]
//! (latency histograms and error counts per engine and operation, a
//! snapshot and Prometheus text), [`FaultLayer`] (a seeded [`FaultPlan`]
//! of per-operation and per-byte-offset faults and delays), [`RetryLayer`]
//! (repeats the operations that may be repeated after a transient
//! failure, with [`RetryPolicy`]'s backoff).
//!
//! Architecture invariant: this crate depends on `store-types` only among
//! the workspace's crates, and names no engine.
//!
//! [`Engine`]: store_types::Engine
//! [`KvEngine`]: store_types::KvEngine
//! [`LargeEngine`]: store_types::LargeEngine
//! [`StagedWrite`]: store_types::StagedWrite

pub mod fault;
mod layer;
mod layered;
pub mod metrics;
pub mod reader;
pub mod retry;
mod trace;

pub use fault::{Fault, FaultLayer, FaultPlan, Injection, Rule, When};
pub use layer::{BoxFuture, Call, EngineLayer, Next, Op, Reply, Rerun};
pub use layered::{LayerStack, Layered};
pub use metrics::{render_prometheus, MetricsLayer, MetricsSnapshot};
pub use retry::RetryLayer;
pub use store_types::RetryPolicy;
pub use trace::TraceLayer;
