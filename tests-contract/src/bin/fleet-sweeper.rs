//! A fleet node in its own OS process, for the two-process sweep-lock test:
//! `fleet-sweeper <database url> <kv schema> <hold ms>` opens a kv-only
//! `fleet: true` store on the schema, registers `<schema>.refs`, sweeps with
//! a protect callback that holds the sweep for `hold ms`, and prints
//! `aborted=<cause>` or `aborted=none`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use store_core::{LivenessTable, Mode, Namespace, ProtectCallback, Store, SweepOptions};
use store_postgres::PostgresEngine;
use store_types::Key;

struct Hold(Duration);

#[async_trait]
impl ProtectCallback for Hold {
    async fn protected_keys(&self) -> Result<Vec<Key>, store_types::Error> {
        tokio::time::sleep(self.0).await;
        Ok(Vec::new())
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, schema, hold] = &args[..] else {
        eprintln!("usage: fleet-sweeper <database url> <kv schema> <hold ms>");
        std::process::exit(2);
    };
    let hold = Duration::from_millis(hold.parse().expect("hold ms"));
    let kv = PostgresEngine::connect(url, schema).await.expect("connect");
    let store = Store::builder()
        .kv(kv)
        .mode(Mode::KvOnly { threshold: 4096 })
        .fleet(true)
        .build()
        .await
        .expect("build");
    store
        .gc()
        .register_liveness_source(
            Namespace::new("fleet").unwrap(),
            LivenessTable::new(schema, "refs", "digest").with_namespace_column("ns"),
        )
        .await
        .expect("register");
    store.gc().set_protect(Some(Arc::new(Hold(hold))));
    println!("ready");
    let report = store
        .gc()
        .sweep(SweepOptions::default())
        .await
        .expect("sweep");
    match report.aborted {
        Some(cause) => println!("aborted={}", serde_name(cause)),
        None => println!("aborted=none"),
    }
}

fn serde_name(cause: store_core::GcAbortCause) -> String {
    format!("{cause:?}")
}
