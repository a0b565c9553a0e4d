//! Puts onto a corrupt or quarantined copy (issue 39, ADR-053): a put that
//! brings the right bytes for a key whose stored copy is corrupt is never
//! acknowledged against that copy — it heals the entry (or, where its
//! bytes are already gone, is refused and stores afresh when put again),
//! so a quarantine run while its receipt is held never takes the entry
//! away.

use std::time::Duration;

use store_core::{Error, Key, PutReceipt, QuarantineOutcome, Tier, VerifyOptions};
use tokio::io::AsyncReadExt;

use crate::data::content;
use crate::harness::{ns, Harness, Spec, THRESHOLD};

/// Sizes in each tier a composite has: a kv entry, a large one of at most
/// 1 MiB and a larger one (dual-tier; elsewhere they go to kv or are
/// rejected, and are skipped).
const LENS: [usize; 3] = [200, THRESHOLD as usize + 1000, 2 << 20];

/// The entry's bytes, read whole and verified.
async fn read(h: &Harness, key: &Key) -> Result<Vec<u8>, Error> {
    let blob = h.store.get(key).await?.ok_or(Error::Missing)?;
    Ok(blob.bytes().await?.to_vec())
}

async fn assert_reads(h: &Harness, key: &Key, data: &[u8], when: &str) {
    match read(h, key).await {
        Ok(got) => assert!(
            got == data,
            "{}: {key} {when}: wrong bytes ({} read)",
            h.spec.name,
            got.len()
        ),
        Err(e) => panic!("{}: {key} {when}: {e:?}", h.spec.name),
    }
}

/// A put of `data`; where the put's bytes were gone by the time it found
/// the stored copy corrupt (a large stage already discarded), it may be
/// refused with a transient error — never acknowledged — and the put again
/// must then succeed.
async fn put_good(h: &Harness, data: &[u8]) -> PutReceipt {
    match h.store.put(&ns(), data).await {
        Ok(r) => r,
        Err(e) if e.is_transient() => {
            let r = h
                .store
                .put(&ns(), data)
                .await
                .unwrap_or_else(|e| panic!("{}: put again: {e:?}", h.spec.name));
            assert_eq!(
                r.tier,
                Tier::Large,
                "{}: only large puts are refused",
                h.spec.name
            );
            r
        }
        Err(e) => panic!("{}: put onto a corrupt copy: {e:?}", h.spec.name),
    }
}

/// Reads the whole raw blob a quarantine hands over.
async fn drain(mut blob: store_core::Blob) -> Result<(), Error> {
    let mut sink = Vec::new();
    blob.read_to_end(&mut sink).await?;
    Ok(())
}

/// A stored copy is corrupted; a put of the right bytes must not be
/// acknowledged against it: the entry reads correctly while the receipt is
/// held, a verify finds nothing corrupt, a quarantine finds it sound and
/// removes nothing, and it still reads correctly after the receipt goes.
pub async fn put_heals_a_corrupt_copy(spec: Spec) {
    let h = Harness::open(spec).await;
    for (i, len) in LENS.into_iter().enumerate() {
        let data = content(39 + i as u64, len);
        let Ok(first) = h.store.put(&ns(), &data[..]).await else {
            continue;
        };
        let key = first.key().clone();
        drop(first);
        h.corrupt(&key).await;
        assert!(read(&h, &key).await.is_err(), "{}: corrupted", h.spec.name);

        let receipt = put_good(&h, &data).await;
        assert_eq!(receipt.key(), &key);
        assert_reads(&h, &key, &data, "after the put, receipt held").await;

        let summary = h
            .store
            .verify(&VerifyOptions {
                namespace: Some(ns()),
                ..VerifyOptions::new()
            })
            .await
            .unwrap();
        assert_eq!(
            summary.corrupt, 0,
            "{}: len {len}: {summary:?}",
            h.spec.name
        );
        let outcome = h.store.quarantine(&key, drain).await.unwrap();
        assert!(
            matches!(outcome, QuarantineOutcome::Sound { .. }),
            "{}: len {len}: quarantine {outcome:?}",
            h.spec.name
        );
        assert_reads(&h, &key, &data, "after a quarantine, receipt held").await;
        drop(receipt);
        assert_reads(&h, &key, &data, "after the receipt").await;
    }
}

/// A quarantine has hashed a corrupt, pinned copy and is about to remove
/// it when a put of the right bytes arrives: the put must not be
/// acknowledged against the copy being removed. Once both are done the
/// entry reads correctly while the put's receipt is held.
pub async fn put_during_a_quarantine_is_not_lost(spec: Spec) {
    let h = Harness::open(spec).await;
    for (i, len) in LENS.into_iter().enumerate() {
        let data = content(390 + i as u64, len);
        // Held throughout: the key is pinned, so the quarantine takes a pin
        // of its own rather than the delete gate, which would hold the put.
        let Ok(first) = h.store.put(&ns(), &data[..]).await else {
            continue;
        };
        let key = first.key().clone();
        h.corrupt(&key).await;

        let (hashed_tx, hashed_rx) = tokio::sync::oneshot::channel::<()>();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let quarantine = {
            let store = h.store.clone();
            let key = key.clone();
            tokio::spawn(async move {
                store
                    .quarantine(&key, move |blob| async move {
                        drain(blob).await?;
                        let _ = hashed_tx.send(());
                        let _ = go_rx.await;
                        Ok(())
                    })
                    .await
            })
        };
        hashed_rx.await.expect("the quarantine read the copy");

        let put = {
            let store = h.store.clone();
            let data = data.clone();
            tokio::spawn(async move { store.put(&ns(), &data[..]).await })
        };
        // Give the put time to deduplicate onto the copy being judged (an
        // acknowledged put would be lost by the removal below); a put that
        // waits for the quarantine instead is what must happen.
        let _ = tokio::time::timeout(Duration::from_millis(300), async {
            while !put.is_finished() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        go_tx.send(()).expect("the quarantine waits");
        let outcome = quarantine.await.unwrap().unwrap();
        assert!(
            matches!(outcome, QuarantineOutcome::Removed { .. }),
            "{}: len {len}: quarantine {outcome:?}",
            h.spec.name
        );
        let receipt = match put.await.unwrap() {
            Ok(r) => r,
            Err(e) if e.is_transient() => put_good(&h, &data).await,
            Err(e) => panic!("{}: len {len}: put during a quarantine: {e:?}", h.spec.name),
        };
        assert_eq!(receipt.key(), &key);
        assert_reads(&h, &key, &data, "after the quarantine, receipt held").await;
        drop(first);
        assert_reads(&h, &key, &data, "after the first receipt").await;
        drop(receipt);
        assert_reads(&h, &key, &data, "after the receipts").await;
    }
}
