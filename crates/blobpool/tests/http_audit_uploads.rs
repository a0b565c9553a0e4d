//! Upload sessions' finishes and aborts are audited (issue 39): one
//! `blobpool::audit` line each, naming the identity, the session and what
//! became of its bytes (before -> after), or the error that stopped it.
//! One test per file: it installs the process-wide subscriber.

mod common;

use common::*;

const ALICE: &str = "bpk_audit_uploads_alice";
const BOB: &str = "bpk_audit_uploads_bob";
const NS: &str = "up";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_finishes_and_aborts_are_audited() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("blobpool::audit=info")
        .with_writer(move || writer.clone())
        .init();
    let s = start_with_keys(
        vec![
            api_key("alice", ALICE, &["read", "write"]),
            api_key("bob", BOB, &["read", "write"]),
        ],
        Opts::default(),
    )
    .await;
    let open = |who: &'static str| {
        let s = &s;
        async move {
            let resp = s
                .http
                .post(s.url(&format!("/v1/uploads/{NS}")))
                .bearer_auth(who)
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 201);
            resp.headers()["location"].to_str().unwrap().to_string()
        }
    };
    let patch = |who: &'static str, location: String, chunk: &'static [u8]| {
        let s = &s;
        async move {
            let resp = s
                .http
                .patch(s.url(&location))
                .bearer_auth(who)
                .body(chunk)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 204);
        }
    };
    let finish = |who: &'static str, location: String, digest: String| {
        let s = &s;
        async move {
            let resp = s
                .http
                .put(s.url(&format!("{location}?digest={digest}")))
                .bearer_auth(who)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let v: serde_json::Value = resp.json().await.unwrap();
            (status, v)
        }
    };
    let abort = |who: &'static str, location: String| {
        let s = &s;
        async move {
            s.http
                .delete(s.url(&location))
                .bearer_auth(who)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let id_of = |location: &str| location.rsplit('/').next().unwrap().to_string();
    let data: &'static [u8] = b"hello";
    let d = blake3::hash(data).to_hex().to_string();
    let wrong = blake3::hash(b"other").to_hex().to_string();

    // A wrong digest, then the right one; the same content again
    // (deduplicated).
    let a = open(ALICE).await;
    patch(ALICE, a.clone(), data).await;
    assert_eq!(finish(ALICE, a.clone(), wrong).await.0, 422);
    let (status, v) = finish(ALICE, a.clone(), d.clone()).await;
    assert_eq!(status, 201);
    let token = v["token"].as_str().unwrap().to_string();
    let a2 = open(ALICE).await;
    patch(ALICE, a2.clone(), data).await;
    assert_eq!(finish(ALICE, a2.clone(), d.clone()).await.0, 200);
    // Aborted with its bytes; again (gone); another identity's abort.
    let b = open(ALICE).await;
    patch(ALICE, b.clone(), b"abc").await;
    let c = open(ALICE).await;
    assert_eq!(abort(BOB, c.clone()).await, 403);
    assert_eq!(abort(ALICE, b.clone()).await, 204);
    assert_eq!(abort(ALICE, b.clone()).await, 404);
    assert_eq!(abort(ALICE, c.clone()).await, 204);
    // A malformed id is refused and audited without it.
    assert_eq!(
        abort(ALICE, format!("/v1/uploads/{NS}/NOT-AN-ID")).await,
        404
    );

    let lines: Vec<(String, String, String, String)> = log
        .lines()
        .into_iter()
        .filter(|l| l["target"] == "blobpool::audit")
        .map(|l| {
            let f = &l["fields"];
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("identity"), s("action"), s("target"), s("outcome"))
        })
        .collect();
    let t = |i: &str, a: &str, tg: String, o: String| (i.to_string(), a.to_string(), tg, o);
    let (a, a2, b, c) = (id_of(&a), id_of(&a2), id_of(&b), id_of(&c));
    let want = vec![
        t(
            "alice",
            "upload_finish",
            format!("{NS}/{a}"),
            "verification".into(),
        ),
        t(
            "alice",
            "upload_finish",
            format!("{NS}/{a}"),
            format!("ok: 5 bytes -> {d}"),
        ),
        t(
            "alice",
            "upload_finish",
            format!("{NS}/{a2}"),
            format!("ok: 5 bytes -> {d}; deduplicated"),
        ),
        t(
            "bob",
            "upload_abort",
            format!("{NS}/{c}"),
            "forbidden".into(),
        ),
        t(
            "alice",
            "upload_abort",
            format!("{NS}/{b}"),
            "ok: 3 bytes -> none".into(),
        ),
        t(
            "alice",
            "upload_abort",
            format!("{NS}/{b}"),
            "missing".into(),
        ),
        t(
            "alice",
            "upload_abort",
            format!("{NS}/{c}"),
            "ok: 0 bytes -> none".into(),
        ),
        t("alice", "upload_abort", format!("{NS}/-"), "missing".into()),
    ];
    assert_eq!(lines, want, "one line per finish and abort, in order");
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains(&token), "a pin token reached the audit log");
    assert!(
        !text.contains("NOT-AN-ID"),
        "a malformed id reached the log"
    );
}
