//! 64 MiB put/get over the S3 test server (moto at
//! `BLOBPOOL_TEST_S3_ENDPOINT`): the `object` engine through the facade
//! (hashing, multipart staging, copy-if-not-exists, verified reads; and,
//! with the expected digest supplied, the direct upload to the final name)
//! and the engine alone, against object_store's raw put/get of the same
//! bytes.
//!
//! `cargo run --release -p tests-contract --example object_s3_throughput`

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use store_core::{Mode, Namespace, Store};
use store_mem::MemEngine;
use store_object::object_store::path::Path;
use store_object::object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use store_object::s3_testing::TestBucket;
use store_object::ObjectOptions;
use store_types::EngineExt as _;
use store_types::{Digest, Key, LargeEngine};
use tokio::io::AsyncReadExt;

const LEN: usize = 64 << 20;
const ROUNDS: usize = 3;

fn data(round: usize) -> Bytes {
    let mut v = Vec::with_capacity(LEN);
    let mut i = 0u64;
    while v.len() < LEN {
        v.extend_from_slice(
            Digest::of(&[round as u64, i].map(u64::to_le_bytes).concat()).as_bytes(),
        );
        i += 1;
    }
    Bytes::from(v)
}

fn mib_s(d: Duration) -> f64 {
    (LEN as f64 / (1 << 20) as f64) / d.as_secs_f64()
}

fn best(v: &[Duration]) -> Duration {
    *v.iter().min().unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let bucket = TestBucket::create().await;
    let raw = bucket.store();
    let options = ObjectOptions::default();
    let (part, conc) = (options.part_size, options.upload_concurrency);
    let mut t: std::collections::BTreeMap<&str, Vec<Duration>> = Default::default();
    let engine = Arc::new(bucket.engine("engine", options.clone()).await);
    let buffering = bucket
        .engine(
            "buffering",
            ObjectOptions {
                multipart_threshold: 2 * LEN,
                ..options.clone()
            },
        )
        .await;
    let store = Store::builder()
        .kv(MemEngine::new())
        .large_shared(engine.clone())
        .mode(Mode::DualTier {
            threshold: 64 << 10,
        })
        .build()
        .await
        .unwrap();
    let ns = Namespace::new("bench").unwrap();
    for round in 0..ROUNDS {
        let body = data(round);
        // Raw: one PUT of the whole body.
        let p = Path::from(format!("raw/single-{round}"));
        let s = Instant::now();
        raw.put(&p, PutPayload::from(body.clone())).await.unwrap();
        t.entry("raw put (single PUT)")
            .or_default()
            .push(s.elapsed());
        // Raw: multipart with the engine's part size and concurrency.
        let p = Path::from(format!("raw/multi-{round}"));
        let s = Instant::now();
        let mut w = WriteMultipart::new_with_chunk_size(raw.put_multipart(&p).await.unwrap(), part);
        for c in body.chunks(256 << 10) {
            w.wait_for_capacity(conc).await.unwrap();
            w.put(body.slice_ref(c));
        }
        w.finish().await.unwrap();
        t.entry("raw put (multipart)")
            .or_default()
            .push(s.elapsed());
        // Raw server-side copies of it (what a staged publish adds).
        let s = Instant::now();
        raw.copy_if_not_exists(&p, &Path::from(format!("raw/copied-{round}")))
            .await
            .unwrap();
        t.entry("raw copy-if-not-exists")
            .or_default()
            .push(s.elapsed());
        let s = Instant::now();
        raw.copy(&p, &Path::from(format!("raw/copied-plain-{round}")))
            .await
            .unwrap();
        t.entry("raw copy (plain)").or_default().push(s.elapsed());
        // Raw get, streamed.
        let s = Instant::now();
        let mut st = raw.get(&p).await.unwrap().into_stream();
        let mut n = 0;
        while let Some(c) = st.next().await {
            n += c.unwrap().len();
        }
        assert_eq!(n, LEN);
        t.entry("raw get").or_default().push(s.elapsed());

        // The engine alone: stage in 256 KiB chunks, publish; read.
        let mut engine_body = body.to_vec();
        engine_body[0] ^= 0xff; // distinct from the facade's bytes
        let engine_body = Bytes::from(engine_body);
        let key = Key::new(ns.clone(), Digest::of(&engine_body));
        let s = Instant::now();
        let mut stage = engine.stage(&ns).await.unwrap();
        for c in engine_body.chunks(256 << 10) {
            stage.write(engine_body.slice_ref(c)).await.unwrap();
        }
        stage.publish(&key).await.unwrap();
        t.entry("engine put (no hashing)")
            .or_default()
            .push(s.elapsed());
        // The engine alone, digest known up front: straight to the final
        // name, no copy.
        let mut direct_body = body.to_vec();
        direct_body[1] ^= 0xff;
        let direct_body = Bytes::from(direct_body);
        let direct_key = Key::new(ns.clone(), Digest::of(&direct_body));
        let s = Instant::now();
        let mut stage = engine
            .stage_expecting(&ns, &direct_key.digest)
            .await
            .unwrap();
        for c in direct_body.chunks(256 << 10) {
            stage.write(direct_body.slice_ref(c)).await.unwrap();
        }
        stage.publish(&direct_key).await.unwrap();
        t.entry("engine put, expected (direct)")
            .or_default()
            .push(s.elapsed());
        let s = Instant::now();
        let mut stage = buffering.stage(&ns).await.unwrap();
        for c in engine_body.chunks(256 << 10) {
            stage.write(engine_body.slice_ref(c)).await.unwrap();
        }
        stage.publish(&key).await.unwrap();
        t.entry("engine put, one buffered PUT")
            .or_default()
            .push(s.elapsed());
        let s = Instant::now();
        let r = engine.read_whole(&key).await.unwrap().unwrap();
        let mut r = r.into_stream().reader;
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0;
        loop {
            let k = r.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            n += k;
        }
        assert_eq!(n, LEN);
        t.entry("engine get (no hashing)")
            .or_default()
            .push(s.elapsed());

        // Through the facade: hashing while streaming, verified reads.
        let s = Instant::now();
        let receipt = store
            .put_opts(
                &ns,
                &body[..],
                store_core::PutOptions {
                    len: Some(LEN as u64),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        t.entry("facade put").or_default().push(s.elapsed());
        assert!(!receipt.deduplicated);
        // Through the facade with the expected digest: hashing while
        // streaming straight to the final name, no copy.
        let mut expected_body = body.to_vec();
        expected_body[2] ^= 0xff;
        let expected = Digest::of(&expected_body);
        let s = Instant::now();
        let expected_receipt = store
            .put_opts(
                &ns,
                &expected_body[..],
                store_core::PutOptions {
                    len: Some(LEN as u64),
                    expect: Some(expected),
                },
            )
            .await
            .unwrap();
        t.entry("facade put, expected digest")
            .or_default()
            .push(s.elapsed());
        assert!(!expected_receipt.deduplicated);
        drop(expected_receipt);
        let s = Instant::now();
        let mut blob = store.get(receipt.key()).await.unwrap().unwrap();
        let mut n = 0;
        loop {
            let k = blob.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            n += k;
        }
        assert_eq!(n, LEN);
        t.entry("facade get (verified)")
            .or_default()
            .push(s.elapsed());
        drop(receipt);
    }
    println!("64 MiB over {} (best of {ROUNDS}):", bucket.endpoint);
    for (name, v) in &t {
        println!(
            "  {name:<30} {:>7.1} MiB/s  ({:?})",
            mib_s(best(v)),
            best(v)
        );
    }
    let r = |a: &str, b: &str| best(&t[b]).as_secs_f64() / best(&t[a]).as_secs_f64();
    println!(
        "ratios (throughput vs raw multipart put / raw get): facade put {:.2}, engine put {:.2}, \
         facade put with expected digest {:.2}, engine direct put {:.2}, \
         facade get {:.2}, engine get {:.2}; raw single PUT vs raw multipart {:.2}",
        r("facade put", "raw put (multipart)"),
        r("engine put (no hashing)", "raw put (multipart)"),
        r("facade put, expected digest", "raw put (multipart)"),
        r("engine put, expected (direct)", "raw put (multipart)"),
        r("facade get (verified)", "raw get"),
        r("engine get (no hashing)", "raw get"),
        r("raw put (single PUT)", "raw put (multipart)"),
    );
    println!(
        "expected-digest put vs plain put (facade): {:.2}x",
        r("facade put, expected digest", "facade put"),
    );
}
