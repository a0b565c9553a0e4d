//! Shared PostgreSQL plumbing for the `postgres` and `pg-lo` engines, one
//! file per concern (as sqlx's driver files are): `connection.rs` (pool,
//! schema names, statements, instance identity), `migrations.rs` (the
//! migration runner), `clock.rs` (the `gc_window` steps and the GC clock),
//! `fleet.rs` (the per-key lock and the pin upsert), `rows.rs` (row
//! codecs) and `queries.rs` (the shared batch queries), each re-exported
//! here whole: `store_pg::plumbing::…` names every item.
//!
//! Everything here is schema-qualified: the engines never rely on
//! `search_path`, which is per connection and not reliable across a pool.

mod clock;
mod connection;
mod fleet;
mod migrations;
mod queries;
mod rows;

pub use clock::*;
pub use connection::*;
pub use fleet::*;
pub use migrations::*;
pub use queries::*;
pub use rows::*;

pub use crate::error::{db_err, db_err_in};
pub use crate::window::PgWindow;
