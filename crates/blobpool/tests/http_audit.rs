//! The audit and access logs (ADR-023 §8): every delete, sweep and token
//! release names its identity; every request leaves one access line with
//! the route, namespace, status and identity; pin tokens and keys never
//! reach the log. One test per file: it installs the process-wide
//! subscriber.

mod common;

use common::*;
use store_http::HttpConfig;
use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Auth, Grant};

const KEY: &str = "bpk_auditor_secret";

#[tokio::test]
async fn deletes_sweeps_and_releases_are_audited_with_their_identity() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("blobpool::audit=info,blobpool::access=info")
        .with_writer(move || writer.clone())
        .init();
    let auth = Auth::new(
        vec![ApiKey {
            name: "ops-team".into(),
            hash: parse_key_hash(&hash_key(KEY)).unwrap(),
            grants: Grant::parse_all(&["read", "write", "delete", "admin"]).unwrap(),
        }],
        vec![],
        vec![],
    )
    .unwrap();
    let s = start(Opts {
        http: HttpConfig {
            auth,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let resp = s
        .http
        .put(s.url("/v1/blobs/docs"))
        .bearer_auth(KEY)
        .body("audited")
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = resp.json().await.unwrap();
    let token = v["token"].as_str().unwrap().to_string();
    let digest = v["digest"].as_str().unwrap().to_string();
    let send = |m: reqwest::Method, path: String| {
        s.http
            .request(m, s.url(&path))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .send()
    };
    let r = send(reqwest::Method::DELETE, format!("/v1/blobs/docs/{digest}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "pinned");
    let r = send(reqwest::Method::DELETE, format!("/v1/tokens/{token}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = send(reqwest::Method::DELETE, format!("/v1/blobs/docs/{digest}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = send(reqwest::Method::POST, "/v1/sweep".into())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // An anonymous sweep is refused and audited too.
    let r = s
        .http
        .post(s.url("/v1/sweep"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let lines = log.lines();
    let audit: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "blobpool::audit")
        .collect();
    let actions: Vec<(String, String, String)> = audit
        .iter()
        .map(|l| {
            let f = &l["fields"];
            (
                f["identity"].as_str().unwrap().to_string(),
                f["action"].as_str().unwrap().to_string(),
                f["outcome"]
                    .as_str()
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let own = |a: &str, o: &str| ("ops-team".to_string(), a.to_string(), o.to_string());
    assert_eq!(
        actions,
        vec![
            own("delete", "gc_refuse"),
            own("release_token", "ok"),
            own("delete", "ok"),
            own("sweep", "ok"),
            ("anonymous".into(), "sweep".into(), "unauthorized".into()),
        ],
        "{audit:#?}"
    );
    assert_eq!(audit[1]["fields"]["target"], format!("docs/{digest}"));
    // One access line per request, with identity, route and status.
    let access: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "blobpool::access")
        .collect();
    assert_eq!(access.len(), 6, "{access:#?}");
    let put = &access[0]["fields"];
    assert_eq!(put["identity"], "ops-team");
    assert_eq!(put["method"], "PUT");
    assert_eq!(put["route"], "/v1/blobs/{ns}");
    assert_eq!(put["namespace"], "docs");
    assert_eq!(put["status"], 201);
    assert!(put["request_id"].as_str().is_some_and(|id| id.len() == 16));
    // Secrets never reach the log.
    let all = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(!all.contains(&token), "a pin token was logged");
    assert!(!all.contains(KEY), "an API key was logged");
}
