//! Connections and schema names: the pool, schema-name validation and
//! quoting, schema-qualified statements, SQLSTATE tests and the
//! engine's instance identity.

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, SqlStr};
use store_types::{Error, Instance, Result};

use crate::error::{db_err, db_err_in};

/// Default pool size of [`connect_pool`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;

/// Opens a connection pool (at most [`DEFAULT_MAX_CONNECTIONS`]).
///
/// Use the engines' `from_pool` constructors for other pool settings.
pub async fn connect_pool(url: &str) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(DEFAULT_MAX_CONNECTIONS)
        .connect(url)
        .await
        .map_err(|e| db_err_in("postgres: connect", e))
}

/// Checks a schema name against `[a-z_][a-z0-9_]{0,62}` (and rejects the
/// reserved `pg_` prefix); anything else is [`Error::Config`].
pub fn validate_schema(schema: &str) -> Result<()> {
    let b = schema.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_');
    if !ok {
        return Err(Error::Config(format!(
            "invalid PostgreSQL schema name {schema:?}: expected [a-z_][a-z0-9_]{{0,62}}"
        )));
    }
    if schema.starts_with("pg_") {
        return Err(Error::Config(format!(
            "invalid PostgreSQL schema name {schema:?}: the pg_ prefix is reserved"
        )));
    }
    Ok(())
}

/// The schema name as a quoted identifier (call [`validate_schema`] first).
pub fn quote_schema(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Builds a statement from `template`, replacing `{schema}` by the quoted
/// schema name. The schema is validated, so the result is injection-free.
pub fn sql(schema: &str, template: &str) -> SqlStr {
    use sqlx::SqlSafeStr;
    let text: std::sync::Arc<str> = template.replace("{schema}", &quote_schema(schema)).into();
    AssertSqlSafe(text).into_sql_str()
}

/// Whether `e` is a database error with SQLSTATE `code`.
pub fn has_sqlstate(e: &sqlx::Error, code: &str) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == code)
}

/// The engine's [`Instance`]: the cluster's `system_identifier`, the
/// database and the schema.
///
/// When `pg_control_system()` is not permitted for the role, the cluster is
/// identified by `inet_server_addr():inet_server_port()` instead (`local:`
/// and the port for Unix-socket connections). That fallback identifies the
/// server by the address the client reached it on, so two clients reaching
/// one server through different addresses see different identities (a
/// false "different instance", never a false "same instance" on one host).
pub async fn instance_identity(pool: &PgPool, schema: &str) -> Result<Instance> {
    let database: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .map_err(db_err)?;
    let sysid: std::result::Result<String, sqlx::Error> =
        sqlx::query_scalar("SELECT system_identifier::text FROM pg_control_system()")
            .fetch_one(pool)
            .await;
    let system_identifier = match sysid {
        Ok(id) => id,
        Err(e) => {
            tracing::debug!("pg_control_system() unavailable ({e}); using the server address");
            sqlx::query_scalar(
                "SELECT coalesce(host(inet_server_addr()), 'local') || ':' \
                 || coalesce(inet_server_port()::text, current_setting('port'))",
            )
            .fetch_one(pool)
            .await
            .map_err(db_err)?
        }
    };
    Ok(Instance::Postgres {
        system_identifier,
        database,
        schema: schema.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for ok in ["a", "_", "blob_pool_1", &"x".repeat(63)] {
            validate_schema(ok).unwrap();
        }
        for bad in ["", "A", "1a", "a-b", "a b", "a\"b", "pg_x", &"x".repeat(64)] {
            assert!(
                matches!(validate_schema(bad), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
    }
}
