//! The shared `gc_window` component's steps and the GC clock
//! (`{schema}.gc_now()`), with the helpers that bind durations next to it.

use store_types::Timestamp;

/// Migration component of the shared `gc_window` table.
pub const GC_WINDOW_COMPONENT: &str = "gc_window";

/// Migration steps of the shared `gc_window` component (`{schema}` is
/// replaced by the quoted schema name). Both engines use exactly these
/// steps, so a schema shared by a `postgres` and a `pg-lo` engine holds one
/// table. Every GC host (postgres or pg-lo) runs this component, so every
/// GC host has the GC clock `{schema}.gc_now()` (below).
///
/// 1. the `gc_window` table;
/// 2. the GC clock: the function `{schema}.gc_now()` and its one-row test
///    hook table `{schema}.gc_clock`;
/// 3. `{schema}.gc_now_statement()`: the same clock at the current
///    statement, for times written late in a long transaction (a pg-lo pin
///    row at the end of an upload, a fence after the lock wait).
///
/// # The GC clock
///
/// `{schema}.gc_now()` is unix milliseconds (the unit of [`Timestamp`]) by
/// **the database's** clock. On the SQL hosts every GC expiry and
/// visibility judgement uses it, never a node's clock: pin rows are written
/// (`expires_at = gc_now() + ttl`) and judged (`expires_at > gc_now()`) by
/// it, window rows are due when `visible_after <= gc_now()`, and the
/// collector stages by it (`WindowClauses::now`). Nodes of a fleet may
/// disagree about the time by any amount; the database cannot disagree
/// with itself.
///
/// It reads `now()`, the **transaction start** time (the function is
/// `STABLE`): inside a sweep's locked batch that is when the batch began, a
/// little before it arbitrates, which errs on the safe side (pins look
/// unexpired slightly longer, window rows become due slightly later).
///
/// `{schema}.gc_clock (one, offset_ms, frozen_at_ms)` is a one-row **test
/// hook** and must stay empty in production. With a row, `gc_now()` is
/// `coalesce(frozen_at_ms, now_ms)` plus `offset_ms`: it moves (or stops)
/// *the database's* clock, which every node sees alike — unlike a node's
/// clock skew, it models the passing of the one time (the `testing`
/// feature's `set_db_clock` and `advance_db_clock`).
pub const GC_WINDOW_STEPS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {schema}.gc_window (
        ns text COLLATE \"C\" NOT NULL,
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        size bigint NOT NULL,
        visible_after bigint NOT NULL,
        PRIMARY KEY (ns, digest)
    );
    CREATE INDEX IF NOT EXISTS gc_window_due ON {schema}.gc_window (visible_after)",
    // `gc_clock` is a TEST HOOK and must stay empty in production: a row
    // moves (or stops) the clock every node's GC decisions are judged by.
    "CREATE TABLE IF NOT EXISTS {schema}.gc_clock (
        one boolean PRIMARY KEY DEFAULT true CHECK (one),
        offset_ms bigint NOT NULL DEFAULT 0,
        frozen_at_ms bigint
    );
    COMMENT ON TABLE {schema}.gc_clock IS
        'Blobpool test hook: moves the database clock of gc_now(). Must stay empty in production.';
    CREATE OR REPLACE FUNCTION {schema}.gc_now() RETURNS bigint
        LANGUAGE sql STABLE PARALLEL SAFE
    AS $gc_now$
        SELECT coalesce(
                   (SELECT c.frozen_at_ms FROM {schema}.gc_clock c),
                   pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now()) * 1000)::bigint
               )
               + coalesce((SELECT c.offset_ms FROM {schema}.gc_clock c), 0)
    $gc_now$;
    COMMENT ON FUNCTION {schema}.gc_now() IS
        'Blobpool GC clock: unix milliseconds by the database clock (plus the gc_clock test hook).'",
    // 3. The same clock read at the current *statement* (not the
    // transaction's start), for times written late in a long transaction.
    "CREATE OR REPLACE FUNCTION {schema}.gc_now_statement() RETURNS bigint
        LANGUAGE sql STABLE PARALLEL SAFE
    AS $gc_now_statement$
        SELECT coalesce(
                   (SELECT c.frozen_at_ms FROM {schema}.gc_clock c),
                   pg_catalog.floor(
                       pg_catalog.date_part('epoch', pg_catalog.statement_timestamp()) * 1000
                   )::bigint
               )
               + coalesce((SELECT c.offset_ms FROM {schema}.gc_clock c), 0)
    $gc_now_statement$;
    COMMENT ON FUNCTION {schema}.gc_now_statement() IS
        'Blobpool GC clock at the current statement (gc_now() is at the transaction start).'",
];

/// The database's clock at this *statement* (not at the transaction's
/// start): `gc_now()` moved on by the time the transaction has run so far.
/// For times written late in a long transaction (a fence after the lock
/// wait, a pin row at the end of a pg-lo upload), so they do not start in
/// the past.
pub const GC_NOW_STATEMENT: &str = "{schema}.gc_now_statement()";

/// A duration in milliseconds for binding next to the GC clock
/// (`{schema}.gc_now() + $n`), clamped so the sum cannot overflow `bigint`.
pub fn duration_ms(d: std::time::Duration) -> i64 {
    const MAX: i64 = i64::MAX / 4;
    i64::try_from(d.as_millis()).map_or(MAX, |ms| ms.min(MAX))
}

/// The wall clock in unix milliseconds.
pub fn now_ms() -> i64 {
    Timestamp::now().0
}
