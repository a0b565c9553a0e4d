//! Puts with an expected digest (`LargeEngine::stage_expecting`): large
//! bodies upload straight to the final name, complete at publish, and are
//! never visible, nor leave anything behind, before that.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use store_types::{Digest, Engine, Error, Key, LargeEngine, PublishOutcome};

use super::fault::{FaultStore, Op, Rule};
use super::{content, ns, put, put_expecting, read, small_options, Backend};
use crate::{ObjectEngine, ObjectOptions};

/// Every object the store lists (memory), or every file on disk (file
/// system: including the `<name>#<n>` files of multipart uploads in
/// progress, which the store does not list), as paths relative to the root.
async fn leftovers(b: &Backend, store: &Arc<dyn ObjectStore>) -> Vec<String> {
    let Backend::Fs(dir) = b else {
        return store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
    };
    let mut out = Vec::new();
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir.path()).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// Asserts that `left` holds only published entries (no upload files, no
/// stage objects), and returns how many.
fn only_entries(left: &[String]) -> usize {
    for p in left {
        let parts: Vec<&str> = p.split('/').collect();
        assert!(
            parts.len() == 4
                && parts[0] == "pool"
                && !parts[1].starts_with('.')
                && Digest::parse(parts[3]).is_ok(),
            "not an entry: {p} (in {left:?})"
        );
    }
    left.len()
}

/// An engine over a fault-counting wrapper of `b`'s store.
async fn counted(b: &Backend, options: ObjectOptions) -> (FaultStore, ObjectEngine) {
    let f = FaultStore::new(b.store());
    let e = b
        .engine_over(Arc::new(f.clone()) as Arc<dyn ObjectStore>, options)
        .await;
    (f, e)
}

#[tokio::test]
async fn direct_puts_round_trip_without_staging_or_copying() {
    for b in Backend::all() {
        let (f, e) = counted(&b, small_options()).await;
        for (i, len) in [0usize, 1000, 64 << 10, (64 << 10) + 1, 300_000]
            .into_iter()
            .enumerate()
        {
            let data = content(len, 300 + i as u64);
            f.disarm();
            let (key, outcome) = put_expecting(&e, "ns", &data, 7 << 10, Digest::of(&data))
                .await
                .unwrap();
            assert_eq!(outcome, PublishOutcome::Inserted, "len {len}");
            assert_eq!(f.count(Op::Copy), 0, "len {len}: no publishing copy");
            assert_eq!(f.count(Op::Delete), 0, "len {len}: no stage object");
            if len > 64 << 10 {
                assert_eq!(f.count(Op::CreateUpload), 1, "len {len}");
                assert_eq!(f.count(Op::Complete), 1, "len {len}");
            } else {
                assert_eq!(f.count(Op::CreateUpload), 0, "len {len}: buffered");
            }
            assert_eq!(e.meta(&key).await.unwrap().unwrap().size, len as u64);
            assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
            let (s, t) = (len as u64 / 3, len as u64 / 2);
            assert_eq!(
                read(&e, &key, Some((s, t))).await.unwrap().unwrap(),
                &data[s as usize..t as usize]
            );
            assert_eq!(e.stage_object_count().await.unwrap(), 0);
        }
        // Switched off, a stage expecting a digest stages and copies.
        let (f, off) = counted(
            &b,
            ObjectOptions {
                direct_expected_puts: false,
                ..small_options()
            },
        )
        .await;
        let data = content(300_000, 399);
        f.disarm();
        let (key, outcome) = put_expecting(&off, "ns", &data, 7 << 10, Digest::of(&data))
            .await
            .unwrap();
        assert_eq!(outcome, PublishOutcome::Inserted);
        assert_eq!(f.count(Op::Copy), 1);
        assert_eq!(read(&off, &key, None).await.unwrap().unwrap(), data);
        assert_eq!(off.stage_object_count().await.unwrap(), 0);
    }
}

#[tokio::test]
async fn a_mismatch_aborts_the_direct_upload_and_leaves_nothing() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let store = e.store().clone();
        for len in [1000usize, 300_000] {
            let data = content(len, 400 + len as u64);
            let wrong = Digest::of(b"not the content");
            let r = put_expecting(&e, "ns", &data, 16 << 10, wrong).await;
            assert!(
                matches!(r, Err(Error::Verification { expected, actual })
                    if expected == wrong && actual == Digest::of(&data)),
                "len {len}: {r:?}"
            );
            for d in [wrong, Digest::of(&data)] {
                let key = Key::new(ns("ns"), d);
                assert!(e.meta(&key).await.unwrap().is_none(), "len {len}");
                assert!(read(&e, &key, None).await.unwrap().is_none(), "len {len}");
            }
            assert_eq!(e.stage_object_count().await.unwrap(), 0, "len {len}");
            assert_eq!(
                leftovers(&b, &store).await,
                Vec::<String>::new(),
                "len {len}"
            );
            assert!(e.namespaces().await.unwrap().is_empty(), "len {len}");
        }
        // A stage dropped mid-upload (a cancelled put) leaves nothing either.
        let data = content(300_000, 499);
        let mut stage = e
            .stage_expecting(&ns("ns"), &Digest::of(&data))
            .await
            .unwrap();
        stage.write(Bytes::from(data.clone())).await.unwrap();
        drop(stage);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(leftovers(&b, &store).await, Vec::<String>::new());
        // Publishing under another digest breaches the caller's promise:
        // refused, and the upload aborted.
        for len in [1000usize, 300_000] {
            let data = content(len, 500 + len as u64);
            let mut stage = e
                .stage_expecting(&ns("ns"), &Digest::of(&data))
                .await
                .unwrap();
            stage.write(Bytes::from(data.clone())).await.unwrap();
            let other = Key::new(ns("ns"), Digest::of(b"other"));
            assert!(
                matches!(stage.publish(&other).await, Err(Error::KeyInvalid(_))),
                "len {len}"
            );
            assert!(e.meta(&other).await.unwrap().is_none());
            assert_eq!(
                leftovers(&b, &store).await,
                Vec::<String>::new(),
                "len {len}"
            );
        }
    }
}

#[tokio::test]
async fn a_direct_put_onto_an_existing_entry_is_already_present() {
    for b in Backend::all() {
        let (f, e) = counted(&b, small_options()).await;
        for (i, len) in [1000usize, 300_000].into_iter().enumerate() {
            // Onto an entry a staged put published, then onto a direct one.
            let data = content(len, 600 + i as u64);
            let (key, _) = put(&e, "ns", &data).await;
            for round in 0..2 {
                f.disarm();
                let (k, outcome) = put_expecting(&e, "ns", &data, 16 << 10, key.digest)
                    .await
                    .unwrap();
                assert_eq!(k, key);
                assert_eq!(outcome, PublishOutcome::AlreadyPresent, "len {len}");
                if len > 64 << 10 {
                    assert_eq!(f.count(Op::Complete), 0, "len {len}: not completed");
                    assert_eq!(f.count(Op::AbortUpload), 1, "len {len}: aborted");
                }
                assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
                if round == 0 {
                    e.delete_many(&key.namespace, &[key.digest]).await.unwrap();
                    let (_, o) = put_expecting(&e, "ns", &data, 16 << 10, key.digest)
                        .await
                        .unwrap();
                    assert_eq!(o, PublishOutcome::Inserted, "len {len}");
                }
            }
        }
        // Only the two entries: no upload files, no stage objects.
        assert_eq!(only_entries(&leftovers(&b, e.store()).await), 2);
        assert_eq!(e.stage_object_count().await.unwrap(), 0);
    }
}

/// While a direct upload is in flight, readers and listings see nothing
/// under the final name; after publish they see the whole entry — never a
/// part of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_a_direct_upload_in_flight() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let data = Arc::new(content(600_000, 700));
        let key = Key::new(ns("ns"), Digest::of(&data));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (e, data, key, stop) = (e.clone(), data.clone(), key.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut absent, mut whole) = (0usize, 0usize);
                while !stop.load(Ordering::Relaxed) {
                    match read(&e, &key, None).await.unwrap() {
                        None => absent += 1,
                        Some(got) => {
                            assert_eq!(got.len(), data.len(), "a partial object was visible");
                            assert!(got == *data, "wrong bytes were visible");
                            whole += 1;
                        }
                    }
                    for m in e.store().list(None).try_collect::<Vec<_>>().await.unwrap() {
                        assert_eq!(m.location, e.content_path(&key), "only the entry");
                        assert_eq!(m.size, data.len() as u64, "listed partial");
                    }
                    tokio::task::yield_now().await;
                }
                (absent, whole)
            })
        };
        let mut stage = e
            .stage_expecting(&key.namespace, &key.digest)
            .await
            .unwrap();
        for c in data.chunks(16 << 10) {
            stage.write(Bytes::copy_from_slice(c)).await.unwrap();
            // Let part uploads run, then look.
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert!(e.meta(&key).await.unwrap().is_none());
            assert!(read(&e, &key, None).await.unwrap().is_none());
            assert_eq!(
                e.has_many(&key.namespace, &[key.digest]).await.unwrap(),
                vec![false]
            );
            assert!(e.scan(&key.namespace, None, 10).await.unwrap().is_empty());
            assert!(e.namespaces().await.unwrap().is_empty());
            let listed: Vec<Path> = e
                .store()
                .list(None)
                .map_ok(|m| m.location)
                .try_collect()
                .await
                .unwrap();
            assert_eq!(listed, Vec::<Path>::new(), "nothing listed mid-upload");
        }
        if let Backend::Fs(_) = b {
            // The upload really is in flight at the final name: its
            // `<name>#<n>` file (which the store neither lists nor reads).
            let upload_file = format!("{}#1", e.content_path(&key));
            assert!(leftovers(&b, e.store()).await.contains(&upload_file));
        }
        assert_eq!(stage.publish(&key).await.unwrap(), PublishOutcome::Inserted);
        tokio::time::sleep(Duration::from_millis(20)).await;
        stop.store(true, Ordering::Relaxed);
        let (absent, whole) = poller.await.unwrap();
        assert!(
            absent > 0 && whole > 0,
            "polled {absent} absent, {whole} whole"
        );
        assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), *data);
        assert_eq!(e.scan(&key.namespace, None, 10).await.unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_direct_publishes_leave_one_whole_entry() {
    for b in Backend::all() {
        let engines = [
            b.engine(small_options()).await,
            b.engine(small_options()).await,
        ];
        for (round, len) in [200_000usize, 100, 200_000].into_iter().enumerate() {
            let data = Arc::new(content(len, 800 + round as u64));
            let d = Digest::of(&data);
            // One instance: its per-key lock makes exactly one insert.
            let tasks: Vec<_> = (0..6)
                .map(|i| {
                    let e = engines[0].clone();
                    let data = data.clone();
                    tokio::spawn(async move {
                        if i % 3 == 0 {
                            super::put_with(&e, "one", &data, 16 << 10).await
                        } else {
                            put_expecting(&e, "one", &data, 16 << 10, d).await
                        }
                    })
                })
                .collect();
            let mut inserted = 0;
            for t in tasks {
                inserted += usize::from(t.await.unwrap().unwrap().1 == PublishOutcome::Inserted);
            }
            assert_eq!(inserted, 1, "len {len}: one instance inserts once");
            // Two instances: the completion is unconditional, so both may
            // insert; every put succeeds and one whole entry remains.
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let e = engines[i % 2].clone();
                    let data = data.clone();
                    tokio::spawn(async move { put_expecting(&e, "two", &data, 16 << 10, d).await })
                })
                .collect();
            let mut inserted = 0;
            for t in tasks {
                inserted += usize::from(t.await.unwrap().unwrap().1 == PublishOutcome::Inserted);
            }
            assert!((1..=2).contains(&inserted), "len {len}: {inserted}");
            let key = Key::new(ns("two"), d);
            assert_eq!(read(&engines[1], &key, None).await.unwrap().unwrap(), *data);
            assert_eq!(engines[0].stage_object_count().await.unwrap(), 0);
        }
        assert_eq!(only_entries(&leftovers(&b, engines[0].store()).await), 6);
    }
}

#[tokio::test]
async fn failed_direct_publishes_show_nothing_or_the_whole_entry() {
    for b in Backend::all() {
        let (f, e) = counted(
            &b,
            ObjectOptions {
                retry: crate::RetryPolicy {
                    attempts: 3,
                    initial_backoff: Duration::from_millis(1),
                    max_backoff: Duration::from_millis(5),
                },
                ..small_options()
            },
        )
        .await;
        let store = e.store().clone();
        for (i, (rule, visible)) in [
            // The completion fails: the upload is aborted, nothing shows.
            (Rule::fail(Op::Complete, 1), false),
            // A part upload fails mid-stream.
            (Rule::fail(Op::Part, 2), false),
            // The look before completing fails: aborted.
            (Rule::fail(Op::Get, 1), false),
            // The completion happens but its answer is lost: the put
            // fails, and the object it made is the whole, right entry.
            (Rule::fail(Op::Complete, 1).after(), true),
        ]
        .into_iter()
        .enumerate()
        {
            let data = content(300_000, 900 + i as u64);
            let key = Key::new(ns("ns"), Digest::of(&data));
            f.arm(rule);
            let r = put_expecting(&e, "ns", &data, 16 << 10, key.digest).await;
            let fired = f.fired();
            f.disarm();
            assert_eq!(fired, 1, "{rule:?}");
            assert!(r.is_err(), "{rule:?}: {r:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            match read(&e, &key, None).await.unwrap() {
                None => assert!(!visible, "{rule:?}"),
                Some(got) => {
                    assert!(visible, "{rule:?}");
                    assert!(got == data, "{rule:?}: a visible entry is whole");
                }
            }
            let n = only_entries(&leftovers(&b, &store).await);
            assert_eq!(n, i + usize::from(visible), "{rule:?}");
            assert_eq!(e.stage_object_count().await.unwrap(), 0, "{rule:?}");
            // Whatever happened, the bytes can be put again.
            let (_, o) = put_expecting(&e, "ns", &data, 16 << 10, key.digest)
                .await
                .unwrap();
            assert_eq!(
                o,
                if visible {
                    PublishOutcome::AlreadyPresent
                } else {
                    PublishOutcome::Inserted
                },
                "{rule:?}"
            );
            assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
        }
        // No upload files or other leftovers beside the entries.
        assert_eq!(only_entries(&leftovers(&b, &store).await), 4);
    }
}
