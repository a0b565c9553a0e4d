//! Reference sets are audited with or without a token, and the switch of
//! a namespace's policy by its first reference is audited too (issue 30,
//! ADR-045). One test per file: it installs the process-wide subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::json;
use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Auth, Grant};
use store_ops::http::HttpConfig;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const WRITER: &str = "bpk_audit_refs_writer";
const OWNER: &str = "bpk_audit_refs_owner";

fn key(name: &str, secret: &str, scopes: &[&str]) -> ApiKey {
    ApiKey {
        name: name.into(),
        hash: parse_key_hash(&hash_key(secret)).unwrap(),
        grants: Grant::parse_all(scopes).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ref_sets_and_policy_switches_are_audited() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("blobpool::audit=info")
        .with_writer(move || writer.clone())
        .init();
    let s = start(Opts {
        http: HttpConfig {
            auth: Auth::new(
                vec![
                    key("writer", WRITER, &["read", "write"]),
                    key("owner", OWNER, &["read", "write", "delete"]),
                ],
                vec![],
                vec![],
            )
            .unwrap(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let put = |secret: &'static str, body: &'static str| {
        let s = &s;
        async move {
            let v: serde_json::Value = s
                .http
                .put(s.url("/v1/blobs/docs"))
                .bearer_auth(secret)
                .body(body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["digest"].as_str().unwrap().to_string()
        }
    };
    let set = |secret: &'static str, name: &'static str, digest: String| {
        let s = &s;
        async move {
            s.http
                .put(s.url(&format!("/v1/refs/docs/{name}")))
                .bearer_auth(secret)
                .header("content-type", "application/json")
                .body(json!({ "digest": digest }).to_string())
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    let a = put(WRITER, "a").await;
    let b = put(OWNER, "b").await;
    assert_eq!(set(WRITER, "a", a).await, 201);
    assert_eq!(set(OWNER, "b", b).await, 201);

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<(String, String, String, String)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["target"] == "blobpool::audit")
        .map(|l| {
            let f = &l["fields"];
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("identity"), s("action"), s("target"), s("outcome"))
        })
        .collect();
    let t = |i: &str, a: &str, tg: &str, o: &str| (i.into(), a.into(), tg.into(), o.into());
    assert!(
        lines.contains(&t("writer", "set_ref", "docs/a", "ok")),
        "{lines:?}"
    );
    assert!(
        lines.contains(&t(
            "owner",
            "set_ref",
            "docs/b",
            "ok; gc policy keep -> refs"
        )),
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.1 == "gc_policy").count(),
        1,
        "one switch, audited once by the store: {lines:?}"
    );
}
