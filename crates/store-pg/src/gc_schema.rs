//! [`PgGcSchema`]: the `GcSchema` clause of a PostgreSQL schema.

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use store_types::{GcSchema, Result};

use crate::plumbing::{gc_tables, migrate, GC_WINDOW_COMPONENT, GC_WINDOW_STEPS};

/// A migration component: its name and its steps (see
/// [`migrate`]).
pub type Component = (&'static str, &'static [&'static str]);

/// [`GcSchema`] for a PostgreSQL schema: creates `gc_window` (every GC
/// host has it, so every GC host has the GC clock), then the host's own
/// components in order — the `postgres` engine, the fleet host, adds its
/// pin, fence and policy tables; the `pg-lo` engine adds none.
#[derive(Clone, Debug)]
pub struct PgGcSchema {
    pool: PgPool,
    schema: String,
    host: &'static [Component],
}

impl PgGcSchema {
    /// `gc_window`, then each of `host` in order.
    pub fn with_host(pool: PgPool, schema: impl Into<String>, host: &'static [Component]) -> Self {
        PgGcSchema {
            pool,
            schema: schema.into(),
            host,
        }
    }

    /// The `pg-lo` row: `gc_window` only.
    pub fn window_only(pool: PgPool, schema: impl Into<String>) -> Self {
        Self::with_host(pool, schema, &[])
    }
}

#[async_trait]
impl GcSchema for PgGcSchema {
    async fn ensure_gc_schema(&self) -> Result<()> {
        migrate(
            &self.pool,
            &self.schema,
            GC_WINDOW_COMPONENT,
            GC_WINDOW_STEPS,
        )
        .await?;
        for (component, steps) in self.host {
            migrate(&self.pool, &self.schema, component, steps).await?;
        }
        Ok(())
    }

    async fn gc_tables(&self) -> Result<Vec<String>> {
        gc_tables(&self.pool, &self.schema).await
    }
}
