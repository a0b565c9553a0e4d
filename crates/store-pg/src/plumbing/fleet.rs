//! The fleet's per-key advisory lock (ADR-012 §4) and the pin-row
//! upsert every fleet pin writer shares.

use sqlx::postgres::PgConnection;
use store_types::{Digest, Key, PinGeneration, PinIntent, Result};

use super::{duration_ms, sql, validate_schema, GC_NOW_STATEMENT};
use crate::error::db_err;

/// A stable 64-bit key (for advisory locks) from text parts: the first
/// eight bytes of the BLAKE3 hash of the NUL-joined parts. Stable across
/// processes, platforms and releases.
pub fn stable_key(parts: &[&str]) -> i64 {
    let joined = parts.join("\0");
    let d = Digest::of(joined.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_bytes()[..8]);
    i64::from_le_bytes(b)
}

/// The fleet per-key lock id of `key` in the GC host `host_schema`
/// (ADR-012 §4): `stable_key(["blobpool/key", host_schema, ns, digest_hex])`.
///
/// Every fleet put takes it shared (`pg_advisory_xact_lock_shared`) in the
/// transaction that commits its pin row; a fleet sweep's execute batch
/// takes it exclusive before re-arbitrating and deleting. Advisory locks
/// are per database, so the id only needs to be unique within the host
/// database; a hash collision between two keys only adds contention.
pub fn key_lock(host_schema: &str, key: &Key) -> i64 {
    stable_key(&[
        "blobpool/key",
        host_schema,
        key.namespace.as_str(),
        &key.digest.to_hex(),
    ])
}

/// Takes `key`'s fleet lock shared for the rest of the transaction on
/// `conn` (see [`key_lock`]).
pub async fn lock_key_shared(conn: &mut PgConnection, host_schema: &str, key: &Key) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(key_lock(host_schema, key))
        .execute(conn)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// Upserts the pin row of `pin` for `key` into `<host_schema>.gc_pins` on
/// `conn`, expiring `pin.ttl` after `<host_schema>.gc_now_statement()` —
/// the database's clock (see [`GC_WINDOW_STEPS`](super::GC_WINDOW_STEPS)); `pin.now`, the putter's
/// clock, is not used. An existing row of the same owner keeps the later
/// expiry. Returns the row's generation (`pin_id`, ADR-054): a fresh one
/// from the host's sequence when the row is new or was already expired by
/// that clock, the row's own when this only extends an unexpired row.
///
/// The caller must hold `key`'s fleet lock shared
/// ([`lock_key_shared`]) on `conn`, taken in an earlier statement: the
/// expiry this statement judges is then read after any sweep batch that
/// deleted the entry has committed, so a row such a batch judged expired
/// never keeps its generation.
pub async fn upsert_pin(
    conn: &mut PgConnection,
    host_schema: &str,
    key: &Key,
    pin: &PinIntent,
) -> Result<PinGeneration> {
    validate_schema(host_schema)?;
    // The row's life starts at this statement, not at the transaction's
    // start: a pg-lo publish commits its pin at the end of a transaction
    // that began when the upload did. `EXCLUDED.pin_id` is the column
    // default the proposed row drew (a fresh `nextval`).
    sqlx::query_scalar(sql(
        host_schema,
        &PIN_UPSERT.replace("{now}", GC_NOW_STATEMENT),
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .bind(&pin.owner)
    .bind(duration_ms(pin.ttl))
    .fetch_one(conn)
    .await
    .map_err(db_err)
}

/// The pin-row upsert every fleet pin writer shares (`{now}`: the clock
/// expression, `{schema}`: the host schema; `$1..$4`: ns, digest, owner,
/// ttl in ms): insert, or extend to the later expiry keeping the row's
/// generation while it is unexpired by `{now}`, taking a fresh one
/// otherwise; returns the generation.
pub const PIN_UPSERT: &str = "INSERT INTO {schema}.gc_pins AS p (ns, digest, owner, expires_at)
     VALUES ($1, $2, $3, {now} + $4)
     ON CONFLICT (ns, digest, owner)
     DO UPDATE SET expires_at = GREATEST(p.expires_at, EXCLUDED.expires_at),
                   pin_id = CASE WHEN p.expires_at > {now} THEN p.pin_id
                                 ELSE EXCLUDED.pin_id END
     RETURNING pin_id";

#[cfg(test)]
mod tests {
    use super::*;
    use store_types::Namespace;

    #[test]
    fn stable_keys_are_stable() {
        assert_eq!(stable_key(&["a", "b"]), stable_key(&["a", "b"]));
        assert_ne!(stable_key(&["a", "b"]), stable_key(&["ab"]));
        // Pinned: the key must never change between releases.
        let d = Digest::of(b"blobpool/sweep-lock\0db\0s");
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.as_bytes()[..8]);
        assert_eq!(
            stable_key(&["blobpool/sweep-lock", "db", "s"]),
            i64::from_le_bytes(b)
        );
    }

    #[test]
    fn key_locks_are_per_host_and_key() {
        let k = Key::new(Namespace::new("a").unwrap(), Digest::of(b"x"));
        let hex = k.digest.to_hex();
        assert_eq!(
            key_lock("s", &k),
            stable_key(&["blobpool/key", "s", "a", &hex])
        );
        assert_ne!(key_lock("s", &k), key_lock("t", &k));
        let other = Key::new(Namespace::new("b").unwrap(), k.digest);
        assert_ne!(key_lock("s", &k), key_lock("s", &other));
    }
}
