//! Crash consistency through the facade, on the local engine's crash model
//! (issue 14, ADR-029 "Local files").
//!
//! The store is `sqlite` (kv) + `local` (large); only the local tier is
//! crashed — SQLite runs without its crash model here and keeps all it
//! committed, so the scenario puts only large entries (a kv put after the
//! crash point would still succeed, which a dead process could not do).
//! For every durability point of the puts: crash there, restore the local
//! root from the model's durable image, build a new store over the same
//! files and check that an acknowledged put (new or deduplicated) reads
//! back verified, an unacknowledged one is absent or complete, and no
//! stage file is left. Seeds: `BLOBPOOL_CRASH_SEEDS` (default 2).
//!
//! When SQLite's crash model lands, the same scenario on one shared switch
//! crashes both tiers at one instant.

use std::path::Path;

use store_core::{Mode, Store};
use store_local::crash::CrashModel;
use store_local::{LocalEngine, LocalOptions};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::crash::CrashSwitch;
use store_types::{Digest, Key, Namespace, Tier};
use tokio::io::AsyncReadExt;

/// Entries above this go to the local tier.
const THRESHOLD: u64 = 4 << 10;

fn seeds() -> u64 {
    std::env::var("BLOBPOOL_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

fn ns() -> Namespace {
    Namespace::new("crash").unwrap()
}

/// Large blobs for `seed` (one repeated, for a deduplicated put).
fn blobs(seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out: Vec<Vec<u8>> = (0..3)
        .map(|_| {
            let len = THRESHOLD as usize + 1 + (next() % 300_000) as usize;
            let salt = next();
            (0..len)
                .map(|i| ((i as u64).wrapping_mul(2_654_435_761) ^ salt) as u8)
                .collect()
        })
        .collect();
    out.push(out[0].clone());
    out
}

async fn store(dir: &Path, local: &LocalEngine) -> Store {
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    Store::builder()
        .kv(kv)
        .large(local.clone())
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .build()
        .await
        .unwrap()
}

async fn read(store: &Store, key: &Key) -> Option<Vec<u8>> {
    let mut blob = store.get(key).await.unwrap()?;
    assert_eq!(blob.tier(), Tier::Large);
    let mut out = Vec::new();
    blob.read_to_end(&mut out).await.expect("verified read");
    Some(out)
}

/// One life: the puts (crashing at `crash_at`), the restore, the checks.
/// Returns the durability points seen.
async fn life(seed: u64, crash_at: Option<u64>) -> u64 {
    // On tmpfs where there is one: the model decides what is durable.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let large = dir.path().join("large");
    let switch = CrashSwitch::new();
    let model = CrashModel::with_seed(switch.clone(), seed);
    let blobs = blobs(seed);
    let mut acked = vec![false; blobs.len()];
    if let Some(n) = crash_at {
        switch.arm(n);
    }
    match LocalEngine::open_with_crash_model(&large, LocalOptions::default(), &model).await {
        Ok(local) => {
            let store = store(dir.path(), &local).await;
            for (i, data) in blobs.iter().enumerate() {
                match store
                    .put(&ns(), &data[..], Some(data.len() as u64), None)
                    .await
                {
                    Ok(receipt) => {
                        assert_eq!(receipt.tier, Tier::Large);
                        acked[i] = true;
                    }
                    Err(e) => assert!(switch.crashed(), "put failed without a crash: {e}"),
                }
            }
        }
        Err(e) => assert!(switch.crashed(), "open failed without a crash: {e}"),
    }
    let points = switch.points();
    model.crash_and_restore().unwrap();
    switch.reset();
    let local = LocalEngine::open(&large, LocalOptions::default())
        .await
        .unwrap();
    let store = store(dir.path(), &local).await;
    let context = format!("seed {seed}, crash at {crash_at:?} of {points}");
    assert_eq!(local.stage_file_count().unwrap(), 0, "{context}");
    for (i, data) in blobs.iter().enumerate() {
        let key = Key::new(ns(), Digest::of(data));
        // A repeated blob is acknowledged if any of its puts was.
        let acked = blobs.iter().zip(&acked).any(|(d, a)| *a && d == data);
        let stat = store.stat(&key).await.unwrap();
        match read(&store, &key).await {
            Some(got) => {
                assert!(got == *data, "{context}: blob {i} differs");
                assert_eq!(stat.map(|s| s.size), Some(data.len() as u64), "{context}");
            }
            None => {
                assert!(!acked, "{context}: acknowledged blob {i} is gone");
                assert!(
                    stat.is_none() && !store.has(&key).await.unwrap(),
                    "{context}"
                );
            }
        }
    }
    points
}

#[tokio::test]
async fn acknowledged_large_puts_survive_a_crash_at_every_durability_point() {
    for seed in 0..seeds() {
        let points = life(seed, None).await;
        assert!(points > 0);
        for n in 1..=points {
            life(seed, Some(n)).await;
        }
    }
}
