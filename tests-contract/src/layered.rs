//! The layered composites: engines wrapped in `store-layers`' shipped
//! layers, so the whole contract suite proves the forwarding base changes
//! nothing an engine promises.

use std::sync::Arc;

use store_layers::{FaultLayer, FaultPlan, LayerStack, MetricsLayer, TraceLayer};
use store_types::{KvEngine, LargeEngine};

/// Wraps both engines in a fault layer with an empty plan (innermost), a
/// metrics layer and a tracing layer (outermost), one stack shared by
/// both tiers.
pub fn wrap(
    kv: Arc<dyn KvEngine>,
    large: Option<Arc<dyn LargeEngine>>,
) -> (Arc<dyn KvEngine>, Option<Arc<dyn LargeEngine>>) {
    let stack = LayerStack::new()
        .layer(FaultLayer::new(FaultPlan::none()))
        .layer(MetricsLayer::new())
        .layer(TraceLayer::new());
    (stack.kv(kv), large.map(|l| stack.large(l)))
}
