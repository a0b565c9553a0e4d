//! Group commit for kv puts.
//!
//! Every `put` is queued to a small set of writer tasks. A writer takes
//! everything queued (up to [`MAX_BATCH`] puts / [`MAX_BATCH_BYTES`]
//! bytes), writes it with **one** multi-row `INSERT … SELECT FROM UNNEST(…)
//! ON CONFLICT DO NOTHING RETURNING ns, digest` statement — one statement
//! in autocommit mode is one atomic transaction and one WAL flush — and
//! only then answers each waiter. A lone putter is written at once (no
//! timer), so its latency is one round trip plus a channel hop; under
//! concurrency the puts that queue while a commit is in flight share the
//! next commit.
//!
//! Rows are sorted and de-duplicated by key before the insert: two
//! writers (or two processes) inserting overlapping batches take row locks
//! in the same order and cannot deadlock, and duplicates inside one batch
//! are answered `Inserted` once (first waiter) and `AlreadyPresent` for the
//! rest.
//!
//! A put whose future is dropped after it was queued may still be written
//! (like any statement already sent); it is never half-written.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use sqlx::postgres::PgPool;
use sqlx::SqlStr;
use store_pg::plumbing::{db_err, digest_col, has_sqlstate, namespace_col, sql, to_i64};
use store_types::{Digest, Error, Key, Namespace, PublishOutcome, Result};
use tokio::sync::{mpsc, oneshot, Mutex};

/// Most puts committed together.
pub const MAX_BATCH: usize = 500;
/// Most content bytes committed together (a single larger put still goes
/// alone).
pub const MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;
/// Writer tasks per engine: two, so one batch can be assembled and sent
/// while the previous one waits for its WAL flush.
pub const WRITERS: usize = 2;
/// Queue depth before putters wait for room.
const QUEUE_DEPTH: usize = 4096;
/// Attempts for a batch that hits a deadlock or serialization failure.
const ATTEMPTS: usize = 3;

/// Group-commit counters of one engine (monotonic since connect).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutStats {
    /// Puts answered (either outcome or an error).
    pub puts: u64,
    /// Insert statements (commits) issued for them.
    pub batches: u64,
    /// The most puts one commit carried.
    pub largest_batch: u64,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    batches: AtomicU64,
    largest: AtomicU64,
}

struct PutRequest {
    key: Key,
    bytes: Bytes,
    created_at: i64,
    reply: oneshot::Sender<Result<PublishOutcome>>,
}

/// The putters' side of the group-commit queue.
pub(crate) struct GroupCommit {
    queue: mpsc::Sender<PutRequest>,
    counters: Arc<Counters>,
}

impl GroupCommit {
    /// Spawns the writer tasks (needs a Tokio runtime). They stop once the
    /// last `GroupCommit` handle is dropped and the queue is drained.
    pub(crate) fn spawn(pool: PgPool, schema: &str) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE_DEPTH);
        let rx = Arc::new(Mutex::new(rx));
        let counters = Arc::new(Counters::default());
        let insert = sql(
            schema,
            "INSERT INTO {schema}.entries (ns, digest, size, created_at, content)
             SELECT * FROM UNNEST($1::text[], $2::bytea[], $3::int8[], $4::int8[], $5::bytea[])
             ON CONFLICT (ns, digest) DO NOTHING
             RETURNING ns, digest",
        );
        for _ in 0..WRITERS {
            tokio::spawn(writer(
                pool.clone(),
                insert.clone(),
                rx.clone(),
                counters.clone(),
            ));
        }
        GroupCommit { queue, counters }
    }

    /// Queues one put and waits until its batch has committed.
    pub(crate) async fn put(
        &self,
        key: &Key,
        bytes: Bytes,
        created_at: i64,
    ) -> Result<PublishOutcome> {
        let (reply, answer) = oneshot::channel();
        let req = PutRequest {
            key: key.clone(),
            bytes,
            created_at,
            reply,
        };
        self.queue.send(req).await.map_err(|_| {
            Error::backend(store_types::ErrorKind::Other, "postgres: queue put")
                .with_source("the group-commit writer has stopped")
        })?;
        answer.await.map_err(|_| {
            Error::backend(store_types::ErrorKind::Other, "postgres: await put")
                .with_source("the group-commit writer dropped the put")
        })?
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> PutStats {
        PutStats {
            puts: self.counters.puts.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
            largest_batch: self.counters.largest.load(Ordering::Relaxed),
        }
    }
}

async fn writer(
    pool: PgPool,
    insert: SqlStr,
    rx: Arc<Mutex<mpsc::Receiver<PutRequest>>>,
    counters: Arc<Counters>,
) {
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut bytes = first.bytes.len();
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                match rx.try_recv() {
                    Ok(req) => {
                        bytes += req.bytes.len();
                        batch.push(req);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        let n = batch.len() as u64;
        let outcome = commit_with_retry(&pool, &insert, &batch).await;
        counters.batches.fetch_add(1, Ordering::Relaxed);
        counters.puts.fetch_add(n, Ordering::Relaxed);
        counters.largest.fetch_max(n, Ordering::Relaxed);
        match outcome {
            Ok(inserted) => {
                let mut inserted = inserted;
                for req in batch {
                    // The first waiter of an inserted key takes `Inserted`.
                    let out = if inserted.remove(&req.key) {
                        PublishOutcome::Inserted
                    } else {
                        PublishOutcome::AlreadyPresent
                    };
                    let _ = req.reply.send(Ok(out));
                }
            }
            Err(e) => {
                for req in batch {
                    let _ = req.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

async fn commit_with_retry(
    pool: &PgPool,
    insert: &SqlStr,
    batch: &[PutRequest],
) -> Result<HashSet<Key>> {
    // Sorted, de-duplicated rows: a consistent lock order across writers.
    let mut rows: BTreeMap<(&Namespace, &Digest), &PutRequest> = BTreeMap::new();
    for req in batch {
        rows.entry((&req.key.namespace, &req.key.digest))
            .or_insert(req);
    }
    let mut ns = Vec::with_capacity(rows.len());
    let mut digests = Vec::with_capacity(rows.len());
    let mut sizes = Vec::with_capacity(rows.len());
    let mut created = Vec::with_capacity(rows.len());
    let mut contents = Vec::with_capacity(rows.len());
    for req in rows.values() {
        ns.push(req.key.namespace.as_str());
        digests.push(&req.key.digest.as_bytes()[..]);
        sizes.push(to_i64(req.bytes.len() as u64)?);
        created.push(req.created_at);
        contents.push(&req.bytes[..]);
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        let res = sqlx::query(insert.clone())
            .bind(&ns)
            .bind(&digests)
            .bind(&sizes)
            .bind(&created)
            .bind(&contents)
            .fetch_all(pool)
            .await;
        match res {
            Ok(returned) => {
                return returned
                    .iter()
                    .map(|r| Ok(Key::new(namespace_col(r, 0)?, digest_col(r, 1)?)))
                    .collect();
            }
            Err(e)
                if attempt < ATTEMPTS
                    && (has_sqlstate(&e, "40P01") || has_sqlstate(&e, "40001")) =>
            {
                tracing::debug!("retrying a put batch after {e}");
            }
            Err(e) => return Err(db_err(e)),
        }
    }
}
