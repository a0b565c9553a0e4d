//! PostgreSQL large-object engine for Blobpool.
//!
//! [`PgLoEngine`] keeps each entry's bytes in a PostgreSQL large object and
//! names it from a companion row. It shares pool, schema, identity and
//! migration plumbing (and the `gc_window` clauses) with the `postgres`
//! engine through [`store_pg::plumbing`]; a `postgres` and a `pg-lo`
//! engine may share one schema (their entry tables differ, `gc_window` is
//! one table).
//!
//! # Layout
//!
//! | object | columns | key |
//! |---|---|---|
//! | `<schema>.lo_entries` | `ns text, digest bytea(32), oid oid, size bigint, created_at bigint` (unix ms) | `(ns, digest)`, unique `oid` |
//! | `<schema>.gc_window` | as in `store-postgres` (created by `ensure_gc_schema`) | `(ns, digest)` |
//! | `<schema>.gc_clock`, `<schema>.gc_now()` | the GC clock, as in `store-postgres`: the window is judged by the database's clock (`gc_clock` is a test hook, empty in production) | |
//! | large objects | database-wide, one per entry | OID |
//!
//! Versions live in `<schema>.schema_version` (component `pglo`).
//!
//! # Transactions
//!
//! - A put is one transaction on a dedicated pooled connection:
//!   [`LargeEngine::stage`](store_types::LargeEngine::stage) begins it, `lo_create` + `lo_open(INV_WRITE)`;
//!   each chunk is one server-side `lowrite` (the blob is never whole in
//!   memory); publish inserts the `lo_entries` row `ON CONFLICT DO NOTHING`
//!   and commits (`Inserted`), or — when the key already exists — rolls
//!   back, which discards the new large object (`AlreadyPresent`). Two
//!   concurrent identical puts: the second insert waits for the first
//!   commit, then finds the row. Abort, drop, a lost connection or a crash
//!   roll the transaction back, so a failed put leaves neither a row nor a
//!   large object, and there are no orphaned stages to clean at open.
//! - Fleet mode (its stages are [`Stage::Joint`](store_types::Stage::Joint)):
//!   `publish_pinned` checks that the pin's GC host is a schema
//!   of this engine's database (else `Error::Config`), then, in the same
//!   staging transaction, takes the key's shared fleet lock
//!   (`pg_advisory_xact_lock_shared(store_pg::plumbing::key_lock(host_schema, key))`),
//!   inserts the companion row `ON CONFLICT DO NOTHING` — on a dedup hit
//!   `lo_unlink`s the stage's large object instead of rolling back —
//!   upserts the pin row into `<host_schema>.gc_pins` and commits: large
//!   object, companion row and pin row are durable together, and a dedup
//!   hit still pins without leaving an orphan large object.
//! - `delete_many` deletes the rows (`RETURNING oid, size`) and
//!   `lo_unlink`s their large objects in one transaction.
//! - Reads of at most [`store_types::CHUNK_SIZE`] bytes (a whole entry that
//!   small, or a range) are one statement: the entry's row joined with
//!   `lo_get(oid, offset, len)`, both read in one snapshot, so a read
//!   racing a delete finds no row rather than another object's bytes.
//!   Larger reads resolve the OID once, then stream `CHUNK_SIZE` pieces
//!   with `lo_get(oid, offset, len)`, each joined to the entry's row
//!   (autocommit, no connection held between pieces): a read racing a
//!   delete fails with an I/O error rather than returning other bytes.
//!
//! # Durability
//!
//! An acknowledged publish is a committed transaction (large object and
//! row together), durable under the server's `synchronous_commit`.
//!
//! # Limits
//!
//! Each open stage holds a pool connection until it publishes or aborts;
//! size the pool ([`PgLoEngine::from_pool`]) for the concurrent large puts
//! expected.

#![warn(missing_docs)]

mod engine;
mod reader;
mod registration;
mod stage;
#[cfg(feature = "testing")]
mod testing;

pub use engine::{PgLoEngine, PGLO_COMPONENT, PGLO_STEPS};
pub use registration::REGISTRATION;
pub use stage::PgLoStage;
