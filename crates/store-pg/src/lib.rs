//! PostgreSQL internals shared by Blobpool's two PostgreSQL engines,
//! `postgres` (store-postgres, the kv engine and fleet GC host) and
//! `pg-lo` (store-pglo, the large-object engine). **Not an engine**: it
//! implements no `Engine` and registers nothing; it holds what both
//! engines need, so neither depends on the other.
//!
//! - [`plumbing`]: pool creation, schema-name validation and quoting,
//!   instance identity, the migration runner, the `gc_window` steps and
//!   the GC clock (`gc_now()`), the fleet per-key advisory lock
//!   ([`plumbing::key_lock`]) and pin upsert, row codecs and the shared
//!   batch queries ([`plumbing::present_many`], [`plumbing::named_in`], …);
//!   sqlx errors map onto the shared error family through
//!   [`plumbing::db_err`].
//! - [`PgWindow`]: the durable delete window (`gc_window`) clauses, and
//!   [`PgGcSchema`], the `GcSchema` clause that creates it (plus a host's
//!   own GC tables).
//! - [`fence`]: a fleet put's side of the deletion fences (waiting out a
//!   sweep's fence on a key).
//! - [`instance_lock`]: the session-level advisory lock a non-fleet store
//!   holds on its schema.
//! - [`url`]: an engine URL's driver URL and schema (`?schema=S`).
//! - `testing` (feature `testing`): test support for every crate whose
//!   tests need PostgreSQL (a throwaway schema per test, the GC clock
//!   hooks).
//!
//! Engine-specific tables and clauses (the kv `entries`, the large-object
//! `lo_entries`, the fleet host's pins, sweep lock, fences and policies)
//! stay in their engine crate. Everything here is schema-qualified: the
//! engines never rely on `search_path`.

#![warn(missing_docs)]

mod error;
pub mod fence;
mod gc_schema;
pub mod instance_lock;
pub mod plumbing;
#[cfg(feature = "testing")]
pub mod testing;
pub mod url;
mod window;

pub use gc_schema::{Component, PgGcSchema};
pub use window::PgWindow;
