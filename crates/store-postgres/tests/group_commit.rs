//! Group commit: concurrent puts share commits, each acknowledged only
//! after its commit.

mod common;

use std::time::Instant;

use common::{blob, key_of, OpenEngine, TestSchema};
use store_types::{Engine, KvEngine, PublishOutcome};

const PUTTERS: usize = 16;
const PER_PUTTER: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_are_batched() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let before = e.stats();
    let start = Instant::now();
    let tasks: Vec<_> = (0..PUTTERS)
        .map(|p| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut keys = Vec::new();
                for i in 0..PER_PUTTER {
                    let data = blob((p * 1000 + i) as u64, 4096);
                    let k = key_of("gc", &data);
                    assert_eq!(e.put(&k, data).await.unwrap(), PublishOutcome::Inserted);
                    if i % 8 == 0 {
                        // Acknowledged means committed: visible to a new read.
                        assert_eq!(e.has_many(&k.namespace, &[k.digest]).await.unwrap(), [true]);
                    }
                    keys.push(k);
                }
                keys
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let grouped = start.elapsed();
    let st = e.stats();
    let puts = st.puts - before.puts;
    let batches = st.batches - before.batches;
    assert_eq!(puts, (PUTTERS * PER_PUTTER) as u64);
    assert!(
        batches < puts,
        "no batching: {batches} commits for {puts} puts"
    );
    assert!(st.largest_batch > 1);
    let digests: Vec<_> = all.iter().map(|k| k.digest).collect();
    assert!(e
        .has_many(&all[0].namespace, &digests)
        .await
        .unwrap()
        .iter()
        .all(|b| *b));

    // The raw reference: one INSERT per transaction, one connection.
    let pool = s.pool().await;
    let insert = sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".entries VALUES ('raw', $1, 4096, 0, $2)",
        s.name
    ));
    let n = PUTTERS * PER_PUTTER / 2;
    let start = Instant::now();
    for i in 0..n {
        let data = blob(1_000_000 + i as u64, 4096);
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(insert.0.clone()))
            .bind(&store_types::Digest::of(&data).as_bytes()[..])
            .bind(&data[..])
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let raw_rate = n as f64 / start.elapsed().as_secs_f64();
    let grouped_rate = puts as f64 / grouped.as_secs_f64();
    eprintln!(
        "group commit: {grouped_rate:.0} puts/s ({batches} commits, largest {}), raw 1-tx inserts: \
         {raw_rate:.0}/s, ratio {:.2}",
        st.largest_batch,
        grouped_rate / raw_rate
    );
}

#[tokio::test]
async fn a_lone_putter_is_not_delayed() {
    let s = TestSchema::new();
    let e = s.engine().await;
    for i in 0..20u64 {
        let data = blob(i, 1024);
        e.put(&key_of("solo", &data), data).await.unwrap();
    }
    let st = e.stats();
    assert_eq!((st.puts, st.batches, st.largest_batch), (20, 20, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_inside_one_batch_insert_once() {
    let s = TestSchema::new();
    let e = s.engine().await;
    // Many distinct keys, each put by 4 tasks at once.
    let datas: Vec<_> = (0..50u64).map(|i| blob(i, 512)).collect();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        for d in &datas {
            let (e, d) = (e.clone(), d.clone());
            tasks.push(tokio::spawn(async move {
                e.put(&key_of("dup", &d), d).await.unwrap()
            }));
        }
    }
    let mut inserted = 0;
    for t in tasks {
        if t.await.unwrap() == PublishOutcome::Inserted {
            inserted += 1;
        }
    }
    assert_eq!(inserted, datas.len());
    assert!(e.stats().largest_batch > 1);
    let page = e.scan(&common::ns("dup"), None, 1000).await.unwrap();
    assert_eq!(page.len(), datas.len());
}
