//! A fleet put's side of the deletion fences (ADR-021), shared by the
//! `postgres` and `pg-lo` engines.
//!
//! A sweep's execute batch writes a fence row per doomed key into the GC
//! host's `<host_schema>.gc_deleting`, inside its locked transaction, and
//! clears it once the key's media are deleted. Every fleet put, pin and
//! joint publish takes the key's shared lock
//! ([`key_lock`](crate::plumbing::key_lock)) and then checks the fence: a
//! fenced key is waited out ([`wait_unfenced`]), never deduplicated onto.
//!
//! The table, its migration and the sweeper's side (writing, clearing and
//! finishing stale fences) belong to the GC host, the `postgres` engine
//! (its `fence` module, which also explains why fences exist).

use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use store_types::{Error, Key, Result};

use crate::plumbing::{db_err, sql};

/// How long a fleet put waits for a fence to clear before it gives up with
/// a transient error (the sweeper normally clears it within one batch's
/// media deletes; a crashed sweeper's fence lasts until the next sweep
/// after the grace).
pub const FENCE_WAIT: Duration = Duration::from_secs(30);

/// Whether `key` is fenced, on `conn` (a fresh statement: under
/// `READ COMMITTED` it sees every fence committed before it).
pub async fn is_fenced(conn: &mut PgConnection, host_schema: &str, key: &Key) -> Result<bool> {
    let hit: Option<i32> = sqlx::query_scalar(sql(
        host_schema,
        "SELECT 1 FROM {schema}.gc_deleting WHERE ns = $1 AND digest = $2",
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .fetch_optional(conn)
    .await
    .map_err(db_err)?;
    Ok(hit.is_some())
}

/// The error of a put that waited [`FENCE_WAIT`] for a fence.
pub fn fence_timeout(key: &Key) -> Error {
    Error::backend(
        store_types::ErrorKind::TimedOut,
        "postgres: wait for deletion fence",
    )
    .with_key(key)
    .with_source(format!(
        "the key is being deleted by a sweep (fence held for more than {}s); retry the put",
        FENCE_WAIT.as_secs()
    ))
}

/// The pause between two looks at a fence: 2 ms doubling to 100 ms.
pub fn fence_backoff(attempt: u32) -> Duration {
    Duration::from_millis((2u64 << attempt.min(6)).min(100))
}

/// Waits, on `conn` (inside the caller's transaction, which already holds
/// the key's shared lock), until `key` is not fenced; [`fence_timeout`]
/// after [`FENCE_WAIT`]. Used where the transaction cannot be given up
/// (pg-lo's joint publish holds the staged large object); other callers
/// roll back and retry so a waiting put holds no connection.
///
/// Cancel-safe: dropping the future leaves the caller's transaction as it
/// was (the caller's drop rolls it back).
pub async fn wait_unfenced(conn: &mut PgConnection, host_schema: &str, key: &Key) -> Result<()> {
    let started = Instant::now();
    let mut attempt = 0;
    while is_fenced(conn, host_schema, key).await? {
        if started.elapsed() >= FENCE_WAIT {
            return Err(fence_timeout(key));
        }
        tokio::time::sleep(fence_backoff(attempt)).await;
        attempt += 1;
    }
    Ok(())
}
