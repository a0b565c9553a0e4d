//! PostgreSQL kv engine for Blobpool (sqlx).
//!
//! [`PostgresEngine`] stores each entry as one row; it is the fleet host of
//! ADR-012 §4 (`gc_pins`, `gc_window` and the advisory sweep lock live
//! here). What it shares with the `pg-lo` engine (pool, migrations,
//! identity, the `gc_window` clauses, the instance lock, the fleet key
//! lock) lives in the store-pg crate ([`store_pg`]).
//!
//! # Layout
//!
//! Everything lives in one schema (validated `[a-z_][a-z0-9_]{0,62}`,
//! always quoted, every table name schema-qualified — `search_path` is per
//! connection and not trusted across a pool):
//!
//! | table | columns | key |
//! |---|---|---|
//! | `schema_version` | `component text, version integer` | `component` |
//! | `entries` | `ns text, digest bytea(32), size bigint, created_at bigint` (unix ms)`, content bytea` | `(ns, digest)` |
//! | `gc_window` | `ns, digest, size bigint, visible_after bigint` | `(ns, digest)` |
//! | `gc_pins` | `ns, digest, owner text, expires_at bigint, pin_id bigint` (the row's generation, from the sequence `gc_pins_pin_id`, ADR-054) | `(ns, digest, owner)` |
//! | `ref_names` | `namespace text, name text, digest bytea(32), updated_at timestamptz, owner text` (the author that wrote the digest, NULL: the library; issue 39) — named references ([`refs`]) | `(namespace, name)` |
//! | `ref_namespaces` | `namespace text, since timestamptz` | `namespace` |
//! | `cache_keys` | `namespace text, key text, digest bytea(32), size bigint, accessed_at bigint` (unix ms, the database's `statement_timestamp()`)`, owner text` (as in `ref_names`) — cache keys ([`cache_keys`], ADR-048) | `(namespace, key)` |
//! | `gc_clock` | `one boolean, offset_ms bigint, frozen_at_ms bigint` — a **test hook**, empty in production | `one` (one row at most) |
//!
//! `ns` columns use `COLLATE "C"`, so SQL ordering equals [`store_types::Key`]
//! ordering. `entries.content` is `STORAGE EXTERNAL` (out of line,
//! uncompressed): random content does not compress, and uncompressed TOAST
//! lets a range read fetch only the chunks it needs. The GC tables are
//! created by `GcSchema::ensure_gc_schema`, not at connect.
//!
//! # Time
//!
//! Every GC expiry and visibility judgement here uses the database's clock,
//! the function `<schema>.gc_now()` (unix ms; `now()`, the transaction
//! start), never a node's: pin rows are written `gc_now() + ttl` and live
//! while `expires_at > gc_now()`; window rows are due when
//! `visible_after <= gc_now()`; `WindowClauses::now` answers `gc_now()`, so
//! the collector stages by it too. The `now` parameters of the clause traits
//! are not used. `gc_clock` moves that clock in tests (the `testing`
//! feature's `set_db_clock` / `advance_db_clock`); see
//! [`store_pg::plumbing::GC_WINDOW_STEPS`].
//!
//! # Migrations
//!
//! [`store_pg::plumbing::migrate`] keeps one version per component (`kv`, `refs`,
//! `cache`, `gc_window`, `gc_pins`, `gc_policy`, `pglo`) in `schema_version` and applies each
//! missing step in its own transaction under a per-schema advisory lock, so
//! reconnecting is idempotent, concurrent connects are safe and an older
//! schema is upgraded in place (data kept).
//!
//! # Transactions and durability
//!
//! - `put` goes through **group commit** ([`PutStats`]): concurrent puts are
//!   written by one multi-row `INSERT … ON CONFLICT DO NOTHING RETURNING`
//!   statement (one atomic transaction, one WAL flush), and each put is
//!   answered only after that statement committed. A lone put is sent at
//!   once, with no batching delay. A concurrent put of the same key yields
//!   one row and one `Inserted`.
//! - Every other operation is one statement (`has_many`, `delete_many` and
//!   every window/pin clause included), so each is atomic on its own —
//!   except the fleet clauses, which are explicit transactions under the
//!   per-key advisory-lock protocol (`PinRows::put_pinned`, `pin_first`,
//!   `begin_batch`; see [`store_pg::plumbing::key_lock`]): a fleet put is one
//!   transaction of its own (shared key lock, entry insert, pin upsert),
//!   not batched through group commit.
//! - Durability is PostgreSQL's: an acknowledged put is committed, which
//!   survives a crash under the server's default `synchronous_commit`.
//!
//! # Fleet mode (ADR-012 §3, §4)
//!
//! GC safety across a fleet rests on one advisory lock per key in this
//! database, id [`store_pg::plumbing::key_lock`]`(schema, key)`. Fleet puts
//! (`PinRows::put_pinned`, `pin_first`, pg-lo's `publish_pinned`) take
//! it shared in the transaction that commits their pin row; a sweep's
//! execute batch (`BatchClauses::begin_batch`) takes it exclusive for every
//! candidate (ascending id order, one statement, first in its
//! `READ COMMITTED` transaction) and re-arbitrates in a later statement,
//! so it sees every pin committed before it locked, and no pin can commit
//! on its keys until it ends. Arbitration (`arbitrate`, and the batch's
//! `protected`) is one statement per call: an unexpired `gc_pins` row is
//! `Pinned`; else a row in a liveness table bound to the key's namespace
//! (`bind_liveness_table`; read, never created or altered) is `Live`.
//!
//! # Runtime
//!
//! Constructors spawn the group-commit writers on the current Tokio
//! runtime; use the engine on that runtime (sqlx connections are bound to it
//! as well).

#![warn(missing_docs)]

mod batch;
pub mod cache_keys;
mod engine;
pub mod fence;
mod fleet;
pub mod policy;
pub mod refs;
pub mod registration;
mod seam;

pub use batch::{PutStats, MAX_BATCH, MAX_BATCH_BYTES, WRITERS};
pub use cache_keys::{PgCacheKeys, CACHE_COMPONENT, CACHE_STEPS, CACHE_TABLE};
pub use engine::{PostgresEngine, KV_COMPONENT, KV_STEPS};
pub use refs::{PgRefs, REFS_COMPONENT, REFS_STEPS};
pub use registration::REGISTRATION;
pub use seam::{
    host_gc_schema, PgPins, PgSweepLock, GC_HOST_COMPONENTS, GC_PINS_COMPONENT, GC_PINS_STEPS,
};
