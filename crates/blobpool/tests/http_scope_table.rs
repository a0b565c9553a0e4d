//! docs/SERVER.md's route × scope × owner table (issue 39, ADR-052) is
//! what the server does: for every row, a key holding every scope but the
//! one the row names is refused with `403`, and a key holding that scope
//! (plus `read`) is not refused for want of a scope. The owner rules are
//! checked by `http_write_only.rs`.

mod common;

use common::*;
use store_core::CacheBounds;

const ALL: [&str; 4] = ["read", "write", "delete", "admin"];

/// `(method, route, scope)` of every row of the table.
fn table() -> Vec<(String, String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/SERVER.md"))
        .unwrap();
    let start = doc
        .find("### What each scope may do: route × scope × owner")
        .expect("SERVER.md has the scope table section");
    let section = &doc[start..];
    let section = &section[..section[4..].find("\n### ").map_or(section.len(), |i| i + 4)];
    let cell = |c: &str| c.trim().trim_matches('`').to_string();
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cols: Vec<&str> = l.trim_matches('|').split('|').collect();
            (cell(cols[0]), cell(cols[1]), cell(cols[2]))
        })
        .collect()
}

fn concrete(route: &str) -> String {
    let ns = if route.starts_with("/cache/") {
        "cc"
    } else {
        "docs"
    };
    route
        .replace("{ns}", ns)
        .replace("{digest}", &"ab".repeat(32))
        .replace("{name}", "r")
        .replace("{key}", "k")
        .replace("{token}", "t")
        .replace("{id}", "0")
}

#[tokio::test]
async fn the_scope_table_matches_the_server() {
    let rows = table();
    assert!(rows.len() >= 20, "the table was not found whole: {rows:?}");
    let mut keys = Vec::new();
    for scope in ALL {
        let without: Vec<&str> = ALL.iter().copied().filter(|s| *s != scope).collect();
        let with: Vec<&str> = if scope == "read" {
            vec!["read"]
        } else {
            vec!["read", scope]
        };
        keys.push(api_key(
            &format!("no-{scope}"),
            &format!("bpk_no_{scope}"),
            &without,
        ));
        keys.push(api_key(
            &format!("only-{scope}"),
            &format!("bpk_only_{scope}"),
            &with,
        ));
    }
    let s = start_with_keys(
        keys,
        Opts {
            cache: vec![(
                "cc",
                CacheBounds {
                    max_bytes: None,
                    max_age: None,
                },
            )],
            ..Default::default()
        },
    )
    .await;
    let mut wrong = Vec::new();
    for (method, route, scope) in &rows {
        if scope == "write` or `admin" {
            // Releasing a token: the minter (with `write`) or any `admin`;
            // whose token it is needs the token itself (http_tokens.rs).
            assert_eq!(route, "/v1/tokens/{token}");
            continue;
        }
        assert!(
            ALL.contains(&scope.as_str()),
            "row {method} {route}: scope {scope:?}"
        );
        let path = concrete(route);
        let send = |secret: String| {
            s.http
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    s.url(&path),
                )
                .bearer_auth(secret)
                .header("content-type", "application/json")
                .body("{}")
                .send()
        };
        let refused = send(format!("bpk_no_{scope}")).await.unwrap().status();
        let allowed = send(format!("bpk_only_{scope}")).await.unwrap().status();
        if refused != 403 || allowed == 403 || allowed == 401 {
            wrong.push(format!(
                "{method} {path} ({scope}): without the scope {refused}, with it {allowed}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "SERVER.md's scope table disagrees: {wrong:#?}"
    );
}
