//! Per-test PostgreSQL schemas, dropped when the test ends.

use sqlx::Connection;

/// The default server for tests; override with `DATABASE_URL`.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The URL tests connect to.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_string())
}

/// A pair of fresh schemas (kv engine and pg-lo engine) in the test
/// database. Dropping it unlinks the large objects they own and drops both.
pub struct PgSchemas {
    /// Connection URL.
    pub url: String,
    /// Schema of the kv engine.
    pub kv_schema: String,
    /// Schema of the pg-lo engine.
    pub lo_schema: String,
}

impl PgSchemas {
    /// Checks the server is reachable and picks fresh schema names (the
    /// engines create them). Panics naming `DATABASE_URL` when the server
    /// cannot be reached: PostgreSQL tests never pass by skipping.
    pub async fn create() -> Self {
        let url = database_url();
        let conn = sqlx::PgConnection::connect(&url).await;
        if let Err(e) = conn {
            panic!(
                "PostgreSQL tests need a server: cannot connect to DATABASE_URL={url}: {e}. \
                 Start one (see README) or set DATABASE_URL."
            );
        }
        let tag: u64 = rand::random();
        PgSchemas {
            url,
            kv_schema: format!("bp_t{tag:016x}_kv"),
            lo_schema: format!("bp_t{tag:016x}_lo"),
        }
    }
}

impl Drop for PgSchemas {
    fn drop(&mut self) {
        let url = self.url.clone();
        let kv = self.kv_schema.clone();
        let lo = self.lo_schema.clone();
        // Drop runs outside async context guarantees: use a private runtime
        // on a scoped thread.
        let (kv2, lo2) = (kv.clone(), lo.clone());
        let result = std::thread::scope(|s| {
            s.spawn(move || {
                let (kv, lo) = (kv2, lo2);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let mut c = sqlx::PgConnection::connect(&url).await?;
                    let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
                        .bind(format!("{lo}.lo_entries"))
                        .fetch_one(&mut c)
                        .await?;
                    if exists.is_some() {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "SELECT lo_unlink(oid) FROM \"{lo}\".lo_entries"
                        )))
                        .execute(&mut c)
                        .await?;
                    }
                    for s in [&kv, &lo] {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP SCHEMA IF EXISTS \"{s}\" CASCADE"
                        )))
                        .execute(&mut c)
                        .await?;
                    }
                    Ok::<_, sqlx::Error>(())
                })
            })
            .join()
        });
        if let Ok(Err(e)) = result {
            eprintln!("warning: could not drop test schemas {kv}/{lo}: {e}");
        }
    }
}
