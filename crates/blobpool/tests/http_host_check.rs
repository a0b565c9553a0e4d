//! The Host check (DNS rebinding) guards requests without credentials
//! only (ADR-067): a request with a valid key is answered under the
//! server's real host name even when `allowed_hosts` does not list it;
//! anonymous, open-server and wrongly-keyed requests are still refused
//! with `421 host_not_allowed`, whose message names the Host.

mod common;

use common::*;
use store_http::HttpConfig;
use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Auth, Grant};

const KEY: &str = "bpk_ci";

fn keyed() -> Auth {
    Auth::new(
        vec![ApiKey {
            name: "ci".into(),
            hash: parse_key_hash(&hash_key(KEY)).unwrap(),
            grants: Grant::parse_all(&["read", "write"]).unwrap(),
        }],
        vec![],
        Grant::parse_all(&["read:public"]).unwrap(),
    )
    .unwrap()
}

fn hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

#[tokio::test]
async fn authenticated_requests_pass_any_host_and_anonymous_ones_do_not() {
    let s = start(Opts {
        http: HttpConfig {
            auth: keyed(),
            allowed_hosts: hosts(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let host = "blobs.internal:7070";
    let put = s
        .http
        .put(s.url("/v1/blobs/docs"))
        .header("host", host)
        .bearer_auth(KEY)
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let digest = put.json::<serde_json::Value>().await.unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let get = s
        .http
        .get(s.url(&format!("/v1/blobs/docs/{digest}")))
        .header("host", host)
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.text().await.unwrap(), "hello");
    // Without credentials (a rebinding page's request, an anonymous read
    // it would be granted, /health) the Host is checked as before.
    let public = format!("/v1/blobs/public/{digest}");
    for path in ["/health", public.as_str()] {
        let resp = s
            .http
            .get(s.url(path))
            .header("host", host)
            .send()
            .await
            .unwrap();
        let v = assert_error(resp, 421, "host_not_allowed").await;
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("\"blobs.internal\"") && msg.contains("allowed_hosts"),
            "{msg}"
        );
    }
    // A wrong key is no credential: the Host answer, as before.
    let wrong = s
        .http
        .get(s.url("/health"))
        .header("host", host)
        .bearer_auth("bpk_wrong")
        .send()
        .await
        .unwrap();
    assert_error(wrong, 421, "host_not_allowed").await;
    // Allowed names answer anonymous callers.
    let ok = s
        .http
        .get(s.url("/health"))
        .header("host", "localhost")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn an_open_server_checks_every_host() {
    let s = start(Opts {
        http: HttpConfig {
            allowed_hosts: hosts(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let resp = s
        .http
        .put(s.url("/v1/blobs/docs"))
        .header("host", "rebind.example")
        .bearer_auth(KEY)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(resp, 421, "host_not_allowed").await;
    assert!(s.ns_is_empty("docs").await);
}
