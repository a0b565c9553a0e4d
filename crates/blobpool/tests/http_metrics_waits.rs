//! Issue 40, item 4; ADR-073: `blobpool serve` exports where its SQLite
//! database's writes and reads waited (`SqliteEngine::waits`, ADR-058) on
//! `/metrics`, one histogram family per wait, labelled by database, so a
//! slow request's wait can be told from the scrape.
//!
//! Runs `blobpool serve` as its own process (the default store: SQLite kv
//! tier, local-file large tier), puts small entries (foreground writes of
//! the SQLite writer) and reads them back, then reads the families.

mod common;

/// The value of the sample `line_prefix` (a name with its labels) in `text`.
fn sample(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exports_the_sqlite_waits_per_database() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = common::serve_child(dir.path());
    let http = reqwest::Client::new();
    const PUTS: usize = 5;
    for i in 0..PUTS {
        let resp = http
            .put(format!("{base}/v1/blobs/small"))
            .body(format!("entry {i}"))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        let v: serde_json::Value = resp.json().await.unwrap();
        let got = http
            .get(format!(
                "{base}/v1/blobs/small/{}",
                v["digest"].as_str().unwrap()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(got.text().await.unwrap(), format!("entry {i}"));
    }
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let db = std::fs::canonicalize(dir.path().join("blobpool-data/kv.sqlite")).unwrap();
    let label = format!("{{database=\"{}\"}}", db.display());
    // Every put wrote through the writer: each foreground wait counted once
    // per write (the schema's own writes at open may add more).
    for family in [
        "blobpool_sqlite_write_queued_seconds",
        "blobpool_sqlite_write_behind_bulk_seconds",
        "blobpool_sqlite_write_transaction_seconds",
        "blobpool_sqlite_write_commit_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} histogram\n")),
            "{family} not typed in\n{text}"
        );
        let count = sample(&text, &format!("{family}_count{label}"))
            .unwrap_or_else(|| panic!("no {family}_count{label} in\n{text}"));
        assert!(count >= PUTS as f64, "{family}: {count} writes");
        let inf = format!(
            "{family}_bucket{{database=\"{}\",le=\"+Inf\"}}",
            db.display()
        );
        assert_eq!(sample(&text, &inf), Some(count), "{family}");
    }
    // No sweep ran: no bulk transaction.
    let bulk = format!("blobpool_sqlite_bulk_transaction_seconds_count{label}");
    assert_eq!(sample(&text, &bulk), Some(0.0));
    // The reads by path (the gets may have been answered by the hot-entry
    // cache without a query: only their presence is certain).
    for path in ["inline", "waited"] {
        let l = format!(
            "blobpool_sqlite_reads_total{{database=\"{}\",path=\"{path}\"}}",
            db.display()
        );
        assert!(sample(&text, &l).is_some(), "no {l} in\n{text}");
    }
    for family in [
        "blobpool_sqlite_read_connection_wait_seconds",
        "blobpool_sqlite_point_read_wait_seconds",
        "blobpool_sqlite_slow_writes_total",
        "blobpool_sqlite_point_read_fallbacks_total",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(family) && l.contains(&label[1..label.len() - 1])),
            "no {family} sample for {} in\n{text}",
            db.display()
        );
    }
}
