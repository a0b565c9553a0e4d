//! The instance lock of a PostgreSQL schema, shared by the `postgres` and
//! `pg-lo` engines (`Engine::lock_instance`).
//!
//! A non-fleet store keeps its GC protection (pins, the delete gate) in
//! process, so a second, undeclared store on the same schema — another
//! process, or a second store in this one — could delete entries the first
//! still pins. A non-fleet store therefore holds a **session-level**
//! advisory lock, `pg_try_advisory_lock(id)` with
//! `id = stable_key(["blobpool", kind, schema])` (`kind` is `"instance"`
//! for `postgres`, `"pglo-instance"` for `pg-lo`, so a kv schema shared by
//! both engines of one store is locked once by each), on a **dedicated
//! connection** opened for the purpose (never a pooled one: a pooled
//! connection is returned, reused and recycled, and the lock would go with
//! it). The connection carries `application_name = "blobpool pid <pid> on
//! host <host>"`, so a refused open names the holder from `pg_locks` and
//! `pg_stat_activity` (pid and host of the holding process, the session's
//! backend pid, client address and start).
//!
//! # Lifetime
//!
//! The lock lives exactly as long as that session. Dropping the guard
//! unlocks and closes the connection (on the current Tokio runtime; a
//! later lock attempt in this process waits for that to finish). If the
//! session dies instead — the holder's process exits or crashes, the
//! connection is cut, the server restarts, `pg_terminate_backend`,
//! `idle_session_timeout` — PostgreSQL releases the lock with it, **and the
//! holder is not told**: it keeps running without the exclusion until it
//! is restarted. Do not set `idle_session_timeout` for the role a non-fleet
//! store uses, and do not connect through a transaction-pooling proxy
//! (PgBouncer in transaction mode), where session-level advisory locks do
//! not hold. Fleet stores are declared and do not take this lock.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Row};
use store_types::{Error, InstanceLock, Result};
use tokio::sync::watch;

use crate::plumbing::{db_err, stable_key, validate_schema};

/// `kind` of the `postgres` kv engine's instance lock.
pub const KV_INSTANCE: &str = "instance";

/// `kind` of the `pg-lo` engine's instance lock.
pub const PGLO_INSTANCE: &str = "pglo-instance";

/// How long a lock attempt waits for this process's own earlier guard on
/// the same id to finish releasing.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// The advisory lock id of `kind`'s instance lock on `schema`.
pub fn instance_lock_id(schema: &str, kind: &str) -> i64 {
    stable_key(&["blobpool", kind, schema])
}

/// Takes the instance lock `kind` of `schema` on a new connection made with
/// `pool`'s connect options, or fails with [`Error::InstanceLocked`]
/// naming the holder (`data` says what is locked, for that message).
pub async fn lock_instance(
    pool: &PgPool,
    schema: &str,
    kind: &str,
    data: &str,
) -> Result<InstanceLock> {
    validate_schema(schema)?;
    let id = instance_lock_id(schema, kind);
    wait_for_own_releases(id).await;
    let app = application_name();
    let options = (*pool.connect_options()).clone().application_name(&app);
    let mut conn = PgConnection::connect_with(&options)
        .await
        .map_err(|e| crate::plumbing::db_err_in("postgres: connect for the instance lock", e))?;
    let mut holder = None;
    // Twice: the holder may end between the refusal and the lookup.
    for _ in 0..2 {
        let row = sqlx::query("SELECT pg_try_advisory_lock($1), pg_backend_pid()")
            .bind(id)
            .fetch_one(&mut conn)
            .await
            .map_err(db_err)?;
        if row.try_get::<bool, _>(0).map_err(db_err)? {
            let backend: i32 = row.try_get(1).map_err(db_err)?;
            return Ok(InstanceLock::new(
                format!(
                    "the PostgreSQL advisory lock {id} ({kind} of schema {schema}) held by \
                     session {backend}"
                ),
                Held {
                    conn: Mutex::new(Some(conn)),
                    id,
                },
            ));
        }
        holder = describe_holder(&mut conn, id).await?;
        if holder.is_some() {
            break;
        }
    }
    let _ = conn.close().await;
    Err(Error::InstanceLocked {
        resource: data.to_string(),
        holder: holder.unwrap_or_else(|| {
            "a session not visible in pg_locks (it may just have ended)".to_string()
        }),
    })
}

/// `blobpool pid <pid> on host <host>`, cut to PostgreSQL's 63 bytes.
fn application_name() -> String {
    let mut s = format!("blobpool {}", InstanceLock::this_process());
    s.retain(|c| c.is_ascii() && !c.is_ascii_control());
    s.truncate(63);
    s
}

/// Who holds advisory lock `id` in this database, from `pg_locks` and
/// `pg_stat_activity` (columns the role may not see are left out).
async fn describe_holder(conn: &mut PgConnection, id: i64) -> Result<Option<String>> {
    let row = sqlx::query(
        "SELECT l.pid, a.application_name, host(a.client_addr),
                to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
         FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid::bigint = ($1::bigint >> 32) & 4294967295
           AND l.objid::bigint = $1::bigint & 4294967295
         LIMIT 1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
    .map_err(db_err)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let pid: Option<i32> = row.try_get(0).map_err(db_err)?;
    let app: Option<String> = row.try_get(1).map_err(db_err)?;
    let client: Option<String> = row.try_get(2).map_err(db_err)?;
    let since: Option<String> = row.try_get(3).map_err(db_err)?;
    let mut session = match pid {
        Some(p) => format!("PostgreSQL session {p}"),
        None => "a PostgreSQL session".to_string(),
    };
    if let Some(c) = client {
        session.push_str(&format!(" from {c}"));
    }
    if let Some(t) = since {
        session.push_str(&format!(" since {t}"));
    }
    Ok(Some(match app.filter(|a| !a.is_empty()) {
        Some(a) => format!("{a}; {session}"),
        None => session,
    }))
}

/// The held lock: its session. Dropping it unlocks and closes the session.
struct Held {
    conn: Mutex<Option<PgConnection>>,
    id: i64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let conn = self
            .conn
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(mut conn) = conn else {
            return;
        };
        let id = self.id;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let (done, rx) = watch::channel(false);
                releasing()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(id)
                    .or_default()
                    .push(rx);
                rt.spawn(async move {
                    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
                        .bind(id)
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                    let _ = done.send(true);
                });
            }
            // No runtime: dropping the connection closes its socket, and
            // the server ends the session (and the lock) when it sees that.
            Err(_) => drop(conn),
        }
    }
}

/// Releases in flight in this process, per lock id: a store rebuilt right
/// after the previous one dropped must not see its own old lock.
fn releasing() -> &'static Mutex<HashMap<i64, Vec<watch::Receiver<bool>>>> {
    static RELEASING: OnceLock<Mutex<HashMap<i64, Vec<watch::Receiver<bool>>>>> = OnceLock::new();
    RELEASING.get_or_init(Default::default)
}

/// Waits (at most [`RELEASE_WAIT`]) until this process's earlier guards on
/// `id` have finished unlocking.
async fn wait_for_own_releases(id: i64) {
    let pending: Vec<watch::Receiver<bool>> = {
        let mut map = releasing().lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = map.get_mut(&id) else {
            return;
        };
        // Done, or abandoned (sender dropped: its runtime went away).
        list.retain(|r| !*r.borrow() && r.has_changed().is_ok());
        if list.is_empty() {
            map.remove(&id);
            return;
        }
        list.clone()
    };
    let _ = tokio::time::timeout(RELEASE_WAIT, async {
        for mut r in pending {
            let _ = r.wait_for(|done| *done).await;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_differ_per_kind_and_schema() {
        let a = instance_lock_id("blobpool", KV_INSTANCE);
        assert_eq!(a, instance_lock_id("blobpool", KV_INSTANCE));
        assert_ne!(a, instance_lock_id("blobpool", PGLO_INSTANCE));
        assert_ne!(a, instance_lock_id("other", KV_INSTANCE));
    }

    #[test]
    fn the_application_name_fits_postgresql() {
        let app = application_name();
        assert!(app.len() <= 63, "{app}");
        assert!(app.starts_with(&format!("blobpool pid {}", std::process::id())));
    }
}
