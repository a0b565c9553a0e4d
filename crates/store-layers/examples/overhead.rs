//! What the layers cost per call: `meta` and `put` on a `store-mem`
//! engine, raw and inside fault(no rules) + metrics + tracing (no
//! subscriber). Run with `cargo run --release -p store-layers --example
//! overhead`.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use store_layers::{FaultLayer, FaultPlan, LayerStack, MetricsLayer, TraceLayer};
use store_mem::MemEngine;
use store_types::{Digest, Key, KvEngine, Namespace};

const N: u64 = 200_000;

async fn time(label: &str, kv: &dyn KvEngine, keys: &[Key]) {
    let start = Instant::now();
    for k in keys {
        kv.put(k, Bytes::from_static(b"x")).await.unwrap();
    }
    let put = start.elapsed();
    let start = Instant::now();
    for k in keys {
        assert!(kv.meta(k).await.unwrap().is_some());
    }
    let meta = start.elapsed();
    println!(
        "{label:>8}: put {:>6.0} ns/call, meta {:>6.0} ns/call",
        put.as_nanos() as f64 / N as f64,
        meta.as_nanos() as f64 / N as f64
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let ns = Namespace::new("bench").unwrap();
    let keys: Vec<Key> = (0..N)
        .map(|i| Key::new(ns.clone(), Digest::of(&i.to_le_bytes())))
        .collect();
    let raw: Arc<dyn KvEngine> = Arc::new(MemEngine::new());
    time("raw", &*raw, &keys).await;
    let stack = LayerStack::new()
        .layer(FaultLayer::new(FaultPlan::none()))
        .layer(MetricsLayer::new())
        .layer(TraceLayer::new());
    let layered = stack.kv(Arc::new(MemEngine::new()));
    time("layered", &*layered, &keys).await;
}
