//! `has_many` strategies over the S3 test server (moto at
//! `BLOBPOOL_TEST_S3_ENDPOINT`): one HEAD at a time, concurrent HEADs,
//! fan-out listings, and the engine's default mix.
//!
//! `cargo run --release -p tests-contract --example object_s3_has_many`

use std::time::{Duration, Instant};

use futures::StreamExt;
use store_object::object_store::ObjectStoreExt;
use store_object::s3_testing::TestBucket;
use store_object::ObjectOptions;
use store_types::{Digest, Engine, Key, Namespace};

fn digest(i: u64) -> Digest {
    Digest::of(&i.to_le_bytes())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let ns = Namespace::new("bench").unwrap();
    for (entries, asked) in [(2_000u64, 100usize), (2_000, 1_000), (10_000, 5_000)] {
        let bucket = TestBucket::create().await;
        let filler = bucket.engine("p", ObjectOptions::default()).await;
        let store = bucket.store();
        futures::stream::iter(0..entries)
            .map(|i| {
                let path = filler.content_path(&Key::new(ns.clone(), digest(i)));
                let store = store.clone();
                async move { store.put(&path, "x".into()).await.unwrap() }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
        // Half of the asked digests are present.
        let ask: Vec<Digest> = (0..asked as u64)
            .map(|i| {
                if i % 2 == 0 {
                    digest(i)
                } else {
                    digest(1 << 40 | i)
                }
            })
            .collect();
        println!("{entries} entries, {asked} digests asked:");
        for (name, concurrency, min_group) in [
            ("sequential HEADs", 1, usize::MAX),
            ("concurrent HEADs (16)", 16, usize::MAX),
            ("fan-out listings", 16, 2),
            ("default (list when >= 16 share a fan)", 16, 16),
        ] {
            let e = bucket
                .engine(
                    "p",
                    ObjectOptions {
                        request_concurrency: concurrency,
                        list_min_group: min_group,
                        ..ObjectOptions::default()
                    },
                )
                .await;
            let mut best = Duration::MAX;
            for _ in 0..3 {
                let s = Instant::now();
                let got = e.has_many(&ns, &ask).await.unwrap();
                best = best.min(s.elapsed());
                assert!(got
                    .iter()
                    .enumerate()
                    .all(|(i, p)| *p == (i % 2 == 0 && (i as u64) < entries)));
            }
            println!("  {name:<40} {best:>10.1?}");
        }
    }
}
