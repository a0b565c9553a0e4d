//! Deterministic tests of the writer's group commit and failure isolation.
//!
//! Each test first parks the writer thread inside a "blocker" job, queues
//! the jobs under test (waiting until the writer's submission counter shows
//! them all in the channel), then releases the blocker. The writer then
//! finds every queued job at once, so the batch composition is exact rather
//! than a matter of timing.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use bytes::Bytes;
use store_types::{Digest, Engine, Error, Key, KvEngine, Namespace, PublishOutcome};
use tokio::sync::oneshot;

use crate::{SqliteEngine, SqliteOptions};

async fn engine() -> (tempfile::TempDir, SqliteEngine) {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteEngine::open(dir.path().join("db.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    (dir, engine)
}

fn key(data: &[u8]) -> Key {
    Key::new(Namespace::new("ns").unwrap(), Digest::of(data))
}

/// Parks the writer; returns the blocker's completion and its release.
async fn park_writer(
    engine: &SqliteEngine,
) -> (
    impl std::future::Future<Output = store_types::Result<()>>,
    std_mpsc::Sender<()>,
) {
    let (started_tx, started_rx) = oneshot::channel();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let mut started_tx = Some(started_tx);
    let done = engine.inner.writer.submit(0, false, move |_conn, _now| {
        if let Some(tx) = started_tx.take() {
            let _ = tx.send(());
        }
        let _ = release_rx.recv();
        Ok(())
    });
    started_rx.await.unwrap();
    (done, release_tx)
}

/// Waits until `n` write commands in total have entered the channel.
async fn wait_submitted(engine: &SqliteEngine, n: u64) {
    for _ in 0..10_000 {
        if engine.stats().writes_submitted >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "only {} of {n} writes submitted",
        engine.stats().writes_submitted
    );
}

fn spawn_put(
    engine: &SqliteEngine,
    data: &'static [u8],
) -> tokio::task::JoinHandle<store_types::Result<PublishOutcome>> {
    let engine = engine.clone();
    tokio::spawn(async move { engine.put(&key(data), Bytes::from_static(data)).await })
}

#[tokio::test]
async fn queued_puts_share_one_commit() {
    const N: usize = 200;
    let (_dir, engine) = engine().await;
    let before = engine.stats();
    let (blocker, release) = park_writer(&engine).await;
    let data: Vec<&'static [u8]> = (0..N)
        .map(|i| &*Box::leak(format!("blob {i}").into_bytes().into_boxed_slice()))
        .collect();
    let puts: Vec<_> = data.iter().map(|d| spawn_put(&engine, d)).collect();
    wait_submitted(&engine, before.writes_submitted + 1 + N as u64).await;
    release.send(()).unwrap();
    blocker.await.unwrap();
    for p in puts {
        assert_eq!(p.await.unwrap().unwrap(), PublishOutcome::Inserted);
    }
    let after = engine.stats();
    // One commit for the blocker, one for all N puts.
    assert_eq!(after.commits - before.commits, 2);
    assert_eq!(after.largest_batch, N as u64);
    assert_eq!(
        after.writes_committed - before.writes_committed,
        N as u64 + 1
    );
    let digests: Vec<Digest> = data.iter().map(|d| Digest::of(d)).collect();
    let present = engine
        .has_many(&Namespace::new("ns").unwrap(), &digests)
        .await
        .unwrap();
    assert!(present.iter().all(|p| *p));
}

#[tokio::test]
async fn a_failing_job_does_not_fail_its_batch() {
    let (_dir, engine) = engine().await;
    let ns = Namespace::new("ns").unwrap();
    engine
        .put(&key(b"old"), Bytes::from_static(b"old"))
        .await
        .unwrap();
    let before = engine.stats();
    let (blocker, release) = park_writer(&engine).await;

    let a1 = spawn_put(&engine, b"a");
    let a2 = spawn_put(&engine, b"a");
    let b = spawn_put(&engine, b"b");
    // Writes a row, then fails: its savepoint must undo the row.
    let failing = engine.inner.writer.submit(0, true, |conn, now| {
        conn.execute(
            "INSERT INTO entries (ns, digest, size, created_at, content)
             VALUES ('ns', ?1, 1, ?2, x'00')",
            (&Digest::of(b"ghost").as_bytes()[..], now.0),
        )
        .map_err(crate::error::sql_err)?;
        Err::<(), _>(Error::backend(
            store_types::ErrorKind::Other,
            "injected failure",
        ))
    });
    let del = {
        let engine = engine.clone();
        let ns = ns.clone();
        tokio::spawn(async move { engine.delete_many(&ns, &[Digest::of(b"old")]).await })
    };
    wait_submitted(&engine, before.writes_submitted + 6).await;
    release.send(()).unwrap();
    blocker.await.unwrap();

    assert_eq!(
        failing.await,
        Err(Error::backend(
            store_types::ErrorKind::Other,
            "injected failure"
        ))
    );
    let mut outcomes = [a1.await.unwrap().unwrap(), a2.await.unwrap().unwrap()];
    outcomes.sort_by_key(|o| *o == PublishOutcome::AlreadyPresent);
    assert_eq!(
        outcomes,
        [PublishOutcome::Inserted, PublishOutcome::AlreadyPresent]
    );
    assert_eq!(b.await.unwrap().unwrap(), PublishOutcome::Inserted);
    assert_eq!(del.await.unwrap().unwrap(), vec![Some(3)]);

    let after = engine.stats();
    assert_eq!(
        after.commits - before.commits,
        2,
        "one batch after the blocker"
    );
    assert_eq!(after.writes_failed - before.writes_failed, 1);
    let present = engine
        .has_many(
            &ns,
            &[
                Digest::of(b"a"),
                Digest::of(b"b"),
                Digest::of(b"ghost"),
                Digest::of(b"old"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(present, vec![true, true, false, false]);
}

#[tokio::test]
async fn a_lost_transaction_is_redone_without_the_culprit() {
    let (_dir, engine) = engine().await;
    let ns = Namespace::new("ns").unwrap();
    let before = engine.stats();
    let (blocker, release) = park_writer(&engine).await;

    let a = spawn_put(&engine, b"a");
    wait_submitted(&engine, before.writes_submitted + 2).await;
    // Kills the whole transaction, as SQLite does on I/O or full-disk errors.
    let culprit = engine.inner.writer.submit(0, false, |conn, _now| {
        conn.execute_batch("ROLLBACK")
            .map_err(crate::error::sql_err)?;
        Err::<(), _>(Error::io(
            store_types::ErrorKind::NoSpace,
            "injected disk failure",
        ))
    });
    let b = spawn_put(&engine, b"b");
    wait_submitted(&engine, before.writes_submitted + 4).await;
    release.send(()).unwrap();
    blocker.await.unwrap();

    assert_eq!(
        culprit.await,
        Err(Error::io(
            store_types::ErrorKind::NoSpace,
            "injected disk failure"
        ))
    );
    assert_eq!(a.await.unwrap().unwrap(), PublishOutcome::Inserted);
    assert_eq!(b.await.unwrap().unwrap(), PublishOutcome::Inserted);
    let after = engine.stats();
    assert_eq!(after.lost_transactions - before.lost_transactions, 1);
    assert_eq!(after.commits - before.commits, 2);
    let present = engine
        .has_many(&ns, &[Digest::of(b"a"), Digest::of(b"b")])
        .await
        .unwrap();
    assert_eq!(present, vec![true, true]);
}

#[tokio::test]
async fn a_full_database_is_no_space_and_the_engine_recovers() {
    let (_dir, engine) = engine().await;
    // Caps the file at its current size: the next page allocation fails
    // with SQLITE_FULL, exactly as on a full disk.
    engine
        .inner
        .writer
        .submit(0, false, |conn, _now| {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(crate::error::sql_err)?;
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(crate::error::sql_err)?;
            Ok(())
        })
        .await
        .unwrap();
    let data = vec![7u8; 256 * 1024];
    let err = engine
        .put(&key(&data), Bytes::from(data.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err:?}");
    assert_eq!(err.kind(), store_types::ErrorKind::NoSpace, "{err:?}");
    assert!(!err.is_transient());
    let report = format!("{:#}", store_types::Report::new(&err));
    assert!(report.contains("\ncaused by: "), "{report}");
    assert_eq!(engine.meta(&key(&data)).await.unwrap(), None);

    engine
        .inner
        .writer
        .submit(0, false, |conn, _now| {
            conn.pragma_update(None, "max_page_count", 1_000_000_000_i64)
                .map_err(crate::error::sql_err)?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(
        engine
            .put(&key(&data), Bytes::from(data.clone()))
            .await
            .unwrap(),
        PublishOutcome::Inserted
    );
}

/// ADR-082: this workspace builds SQLite with a page cache per connection
/// (`LIBSQLITE3_FLAGS` in `.cargo/config.toml`); fails if that line is
/// lost or stops reaching libsqlite3-sys's build.
#[test]
fn this_build_gives_each_connection_its_own_page_cache() {
    assert!(!crate::page_cache_shared());
}

/// ADR-084: what a request reads through the engine (`read`, `meta`) tells
/// the writer's bulk lane to rest; what a sweep asks (`has_many`) does not.
#[tokio::test]
async fn reads_mark_the_store_serving_and_a_sweeps_queries_do_not() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_dir, engine) = engine().await;
    let data = b"served";
    engine
        .put(&key(data), Bytes::from_static(data))
        .await
        .unwrap();
    let served = || engine.inner.writer.counters().served.swap(false, Relaxed);
    served();
    let ns = Namespace::new("ns").unwrap();
    engine.has_many(&ns, &[Digest::of(data)]).await.unwrap();
    assert!(!served(), "a sweep's has_many counted as a request");
    engine.meta(&key(data)).await.unwrap().unwrap();
    assert!(served(), "meta");
    let read = engine
        .read(&key(data), &store_types::ReadOptions::whole())
        .await
        .unwrap();
    assert!(read.is_some());
    assert!(served(), "read");
    // A miss is a request too.
    engine
        .read(&key(b"absent"), &store_types::ReadOptions::whole())
        .await
        .unwrap();
    assert!(served(), "a read of an absent key");
}
