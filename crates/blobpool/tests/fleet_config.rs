//! A fleet `blobpool serve` configured with `[gc]` policies and an
//! application liveness table (issue 13 item 3) sweeps correctly: entries
//! the table names and referenced entries stay, the rest goes; a table that
//! does not exist stops the server at start, naming the setting. Real
//! PostgreSQL, one schema per test.

mod common;

use std::time::Duration;

use common::ServeChild;
use serde_json::json;
use store_pg::testing::TestSchema;

fn kv_url(schema: &TestSchema) -> String {
    let sep = if schema.url.contains('?') { '&' } else { '?' };
    format!("{}{sep}schema={}", schema.url, schema.name)
}

fn config(schema: &TestSchema, table: &str) -> String {
    format!(
        "kv = \"{}\"\nlarge = \"none\"\nfleet = true\nwindow = 0\npin_ttl = 1\n\
         [gc.namespaces.docs]\npolicy = \"refs\"\n\
         [[gc.liveness_tables]]\nnamespace = \"app\"\nschema = \"{}\"\ntable = \"{table}\"\n\
         digest_column = \"digest\"\nnamespace_column = \"ns\"\n",
        kv_url(schema),
        schema.name
    )
}

/// `blobpool serve` in `dir`; `Err`: its stderr when it did not start.
fn serve(dir: &std::path::Path) -> Result<(ServeChild, String), String> {
    let s = common::serve_lines(
        common::blobpool_in(dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn"),
    )?;
    Ok((s.child, s.base))
}

async fn put(http: &reqwest::Client, base: &str, ns: &str, body: &str) -> (String, String) {
    let r = http
        .put(format!("{base}/v1/blobs/{ns}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let v: serde_json::Value = r.json().await.unwrap();
    (
        v["token"].as_str().unwrap().to_string(),
        v["digest"].as_str().unwrap().to_string(),
    )
}

async fn present(http: &reqwest::Client, base: &str, ns: &str, d: &str) -> bool {
    http.head(format!("{base}/v1/blobs/{ns}/{d}"))
        .send()
        .await
        .unwrap()
        .status()
        == 200
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_server_honours_its_liveness_table_and_references() {
    let schema = TestSchema::new();
    let pool = schema.pool().await;
    let q = format!("\"{}\"", schema.name);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {q}; CREATE TABLE {q}.attachments (ns text NOT NULL, digest bytea NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("blobpool.toml"),
        config(&schema, "attachments"),
    )
    .unwrap();
    let (_server, base) = serve(dir.path()).expect("the fleet server starts");
    let http = reqwest::Client::new();

    let (ta, listed) = put(&http, &base, "app", "listed in the app's table").await;
    let (tb, loose_app) = put(&http, &base, "app", "named nowhere").await;
    let (tc, referenced) = put(&http, &base, "docs", "referenced").await;
    let (td, loose_docs) = put(&http, &base, "docs", "unreferenced").await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {q}.attachments (ns, digest) VALUES ('app', decode($1, 'hex'))"
    )))
    .bind(&listed)
    .execute(&pool)
    .await
    .unwrap();
    let r = http
        .put(format!("{base}/v1/refs/docs/keep"))
        .header("content-type", "application/json")
        .body(json!({"digest": referenced, "token": tc}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    for t in [&ta, &tb, &td] {
        let r = http
            .delete(format!("{base}/v1/tokens/{t}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
    // The pin rows (pin_ttl = 1 s) expire by the database's clock.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for _ in 0..2 {
        let r = http
            .post(format!("{base}/v1/sweep"))
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["aborted"], serde_json::Value::Null, "{v}");
    }
    assert!(
        present(&http, &base, "app", &listed).await,
        "the table's entry"
    );
    assert!(
        present(&http, &base, "docs", &referenced).await,
        "the referenced entry"
    );
    assert!(!present(&http, &base, "app", &loose_app).await);
    assert!(!present(&http, &base, "docs", &loose_docs).await);
}

#[test]
fn a_missing_liveness_table_stops_the_server_at_start() {
    let schema = TestSchema::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("blobpool.toml"), config(&schema, "nope")).unwrap();
    let err = match serve(dir.path()) {
        Ok(_) => panic!("a fleet server with a missing liveness table started"),
        Err(e) => e,
    };
    assert!(err.contains("gc.liveness_tables"), "{err}");
    assert!(err.contains("nope"), "{err}");
}
