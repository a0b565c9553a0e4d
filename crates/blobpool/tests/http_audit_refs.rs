//! Reference sets are audited with or without a token, and the switch of
//! a namespace's policy by its first reference is audited too (issue 30,
//! ADR-045). One test per file: it installs the process-wide subscriber.

mod common;

use common::*;
use serde_json::json;

const WRITER: &str = "bpk_audit_refs_writer";
const OWNER: &str = "bpk_audit_refs_owner";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ref_sets_and_policy_switches_are_audited() {
    let log = Captured::audit_log();
    let s = start_with_keys(
        vec![
            api_key("writer", WRITER, &["read", "write"]),
            api_key("owner", OWNER, &["read", "write", "delete"]),
        ],
        Opts::default(),
    )
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
    assert_eq!(set(WRITER, "a", a.clone()).await, 201);
    assert_eq!(set(OWNER, "b", b.clone()).await, 201);

    let lines = log.audit_lines();
    let t = |i: &str, a: &str, tg: &str, o: &str| (i.into(), a.into(), tg.into(), o.into());
    assert!(
        lines.contains(&t(
            "writer",
            "set_ref",
            "docs/a",
            &format!("ok: none -> {a}")
        )),
        "{lines:?}"
    );
    assert!(
        lines.contains(&t(
            "owner",
            "set_ref",
            "docs/b",
            &format!("ok: none -> {b}; gc policy keep -> refs")
        )),
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.1 == "gc_policy").count(),
        1,
        "one switch, audited once by the store: {lines:?}"
    );
}
