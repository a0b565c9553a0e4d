//! Resumable uploads over HTTP (issue 15, ADR-034): sessions opened,
//! appended at their committed offset, resumed after a client dies part-way
//! and after a server restart, finished with the digest; wrong offsets,
//! wrong digests, idle expiry, caps, concurrent sessions of one content and
//! sessions of another node.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{assert_error, bytes_of, start, Opts, Server};
use reqwest::StatusCode;

const NS: &str = "up";

/// Opens a session; returns its location.
async fn open(s: &Server) -> String {
    let resp = s
        .http
        .post(s.url(&format!("/v1/uploads/{NS}")))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()["upload-offset"], "0");
    let location = resp.headers()["location"].to_str().unwrap().to_string();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["offset"], 0);
    assert_eq!(body["location"], location.as_str());
    assert!(location.starts_with(&format!("/v1/uploads/{NS}/")));
    location
}

/// `PATCH` of `chunk` at `start`.
async fn patch(s: &Server, location: &str, start: u64, chunk: &[u8]) -> reqwest::Response {
    let end = (start + chunk.len() as u64).max(1) - 1;
    s.http
        .patch(s.url(location))
        .header("content-range", format!("bytes {start}-{end}/*"))
        .body(chunk.to_vec())
        .send()
        .await
        .unwrap()
}

/// The committed offset `HEAD` reports.
async fn offset(s: &Server, location: &str) -> u64 {
    let resp = s.http.head(s.url(location)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT, "{location}");
    resp.headers()["upload-offset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `PUT ?digest=` with an empty body.
async fn finish(s: &Server, location: &str, digest: &str) -> reqwest::Response {
    s.http
        .put(s.url(&format!("{location}?digest={digest}")))
        .send()
        .await
        .unwrap()
}

fn digest(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

async fn get_bytes(s: &Server, digest: &str) -> Option<Vec<u8>> {
    let resp = s.get(&format!("/v1/blobs/{NS}/{digest}")).await;
    if resp.status() == StatusCode::NOT_FOUND {
        return None;
    }
    assert_eq!(resp.status(), StatusCode::OK);
    Some(resp.bytes().await.unwrap().to_vec())
}

/// Files in the server's upload directory besides its node id.
fn spool_files(s: &Server) -> usize {
    std::fs::read_dir(s.dir.path().join("uploads"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count()
}

#[tokio::test]
async fn an_upload_in_chunks_is_stored_like_a_put() {
    let s = start(Opts::default()).await;
    let data = bytes_of(3 * 1024 * 1024 + 777, 1);
    let location = open(&s).await;
    let mut at = 0u64;
    for chunk in data.chunks(1024 * 1024) {
        let resp = patch(&s, &location, at, chunk).await;
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        at += chunk.len() as u64;
        assert_eq!(resp.headers()["upload-offset"], at.to_string().as_str());
        assert_eq!(offset(&s, &location).await, at);
    }
    let d = digest(&data);
    let resp = finish(&s, &location, &d).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["digest"], d.as_str());
    assert!(body["token"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(get_bytes(&s, &d).await.unwrap(), data);
    // The session is over, and its files are gone.
    let resp = s.http.head(s.url(&location)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(spool_files(&s), 0);
}

#[tokio::test]
async fn a_chunk_at_a_wrong_offset_gets_416_with_the_committed_offset() {
    let s = start(Opts::default()).await;
    let location = open(&s).await;
    assert_eq!(
        patch(&s, &location, 0, b"hello ").await.status(),
        StatusCode::NO_CONTENT
    );
    for wrong in [0, 5, 7, 1000] {
        let resp = patch(&s, &location, wrong, b"world").await;
        assert_eq!(resp.headers()["upload-offset"], "6");
        assert_error(resp, 416, "upload_offset").await;
    }
    assert_eq!(offset(&s, &location).await, 6);
    // Without Content-Range the chunk goes at the committed offset.
    let resp = s
        .http
        .patch(s.url(&location))
        .body("world")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = finish(&s, &location, &digest(b"hello world")).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_wrong_final_digest_gets_422_and_publishes_nothing() {
    let s = start(Opts::default()).await;
    let data = bytes_of(200_000, 2);
    let location = open(&s).await;
    assert_eq!(
        patch(&s, &location, 0, &data).await.status(),
        StatusCode::NO_CONTENT
    );
    let other = digest(b"something else");
    assert_error(finish(&s, &location, &other).await, 422, "verification").await;
    assert_eq!(get_bytes(&s, &other).await, None);
    assert_eq!(
        get_bytes(&s, &digest(&data)).await,
        None,
        "nothing published"
    );
    assert!(s.store_is_empty().await);
    // The session stays: the right digest finishes it.
    assert_eq!(offset(&s, &location).await, data.len() as u64);
    assert_eq!(
        finish(&s, &location, &digest(&data)).await.status(),
        StatusCode::CREATED
    );
    // A malformed digest is a key error.
    let location = open(&s).await;
    assert_error(finish(&s, &location, "xyz").await, 400, "key_invalid").await;
    let resp = s.http.put(s.url(&location)).send().await.unwrap();
    assert_error(resp, 400, "bad_request").await;
}

/// A body that sends `n` bytes of `data[start..]` and then breaks off (the
/// client dies mid-request).
fn dying_body(data: &[u8], start: usize, n: usize) -> reqwest::Body {
    let sent = Bytes::copy_from_slice(&data[start..start + n]);
    let stream = futures::stream::iter(vec![
        Ok::<_, std::io::Error>(sent),
        Err(std::io::Error::other("the client died")),
    ]);
    reqwest::Body::wrap_stream(stream)
}

#[tokio::test]
async fn a_client_killed_at_random_offsets_resumes_from_the_committed_offset() {
    let s = start(Opts::default()).await;
    let data = bytes_of(5 * 1024 * 1024 + 12_345, 3);
    let location = open(&s).await;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut deaths = 0;
    loop {
        // Resume wherever the server says.
        let at = offset(&s, &location).await as usize;
        assert!(at <= data.len());
        if at == data.len() {
            break;
        }
        let left = data.len() - at;
        if deaths < 6 && left > 1 {
            // Die after a random part of the rest.
            let n = 1 + (next() as usize % (left - 1).min(2 * 1024 * 1024));
            let end = at + left - 1;
            let _ = s
                .http
                .patch(s.url(&location))
                .header("content-range", format!("bytes {at}-{end}/*"))
                .body(dying_body(&data, at, n))
                .send()
                .await;
            deaths += 1;
            // The server may still be reading the dead request: an empty
            // chunk at the committed offset goes through once it is done
            // (`upload_busy` until then).
            loop {
                let at_now = offset(&s, &location).await;
                let resp = patch(&s, &location, at_now, b"").await;
                match resp.status() {
                    StatusCode::NO_CONTENT => break,
                    StatusCode::CONFLICT => {
                        assert_error(resp, 409, "upload_busy").await;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    // The dead request committed more meanwhile.
                    StatusCode::RANGE_NOT_SATISFIABLE => {}
                    other => panic!("{other}"),
                }
            }
            // Whatever was committed is a prefix of what was sent.
            let now = offset(&s, &location).await as usize;
            assert!(now >= at && now <= at + n, "{at} + {n} -> {now}");
        } else {
            let resp = patch(&s, &location, at as u64, &data[at..]).await;
            assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        }
    }
    let resp = finish(&s, &location, &digest(&data)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(get_bytes(&s, &digest(&data)).await.unwrap(), data);
}

#[tokio::test]
async fn an_upload_survives_a_server_restart_between_chunks() {
    let s = start(Opts::default()).await;
    let data = bytes_of(2 * 1024 * 1024 + 99, 4);
    let location = open(&s).await;
    let half = data.len() / 2;
    assert_eq!(
        patch(&s, &location, 0, &data[..half]).await.status(),
        StatusCode::NO_CONTENT
    );
    let s = s.restart(Opts::default()).await;
    assert_eq!(offset(&s, &location).await, half as u64);
    assert_eq!(
        patch(&s, &location, half as u64, &data[half..])
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let resp = finish(&s, &location, &digest(&data)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(get_bytes(&s, &digest(&data)).await.unwrap(), data);
}

#[tokio::test]
async fn unacknowledged_bytes_are_cut_back_at_restart() {
    let s = start(Opts::default()).await;
    let location = open(&s).await;
    assert_eq!(
        patch(&s, &location, 0, b"acknowledged").await.status(),
        StatusCode::NO_CONTENT
    );
    // Bytes a crashed request wrote past the committed offset.
    let id = location.rsplit('/').next().unwrap();
    let data_file = s.dir.path().join("uploads").join(format!("{id}.data"));
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&data_file)
        .unwrap()
        .write_all(b" and garbage")
        .unwrap();
    let s = s.restart(Opts::default()).await;
    assert_eq!(offset(&s, &location).await, 12);
    assert_eq!(std::fs::metadata(&data_file).unwrap().len(), 12);
    let resp = finish(&s, &location, &digest(b"acknowledged")).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn idle_sessions_are_reaped_with_their_files() {
    let s = start(Opts {
        upload_idle: Duration::from_secs(2),
        ..Opts::default()
    })
    .await;
    let location = open(&s).await;
    assert_eq!(
        patch(&s, &location, 0, b"soon gone").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(spool_files(&s), 3);
    // Status probes do not keep a session alive.
    let gone = common::eventually(10, || async {
        s.http.head(s.url(&location)).send().await.unwrap().status() == StatusCode::NOT_FOUND
    })
    .await;
    assert!(gone, "the idle session was reaped");
    assert_eq!(spool_files(&s), 0, "no files left behind");
    assert_error(patch(&s, &location, 9, b"late").await, 404, "missing").await;
    assert_eq!(s.ops.uploads().sessions(), 0);
}

#[tokio::test]
async fn sessions_count_against_the_client_cap_and_abort_frees_one() {
    let s = start(Opts {
        max_uploads_per_owner: 2,
        ..Opts::default()
    })
    .await;
    let a = open(&s).await;
    let _b = open(&s).await;
    let resp = s
        .http
        .post(s.url(&format!("/v1/uploads/{NS}")))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert!(resp.headers().contains_key("retry-after"));
    assert_error(resp, 503, "too_many_uploads").await;
    let resp = s.http.delete(s.url(&a)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let _c = open(&s).await;
    assert_error(patch(&s, &a, 0, b"x").await, 404, "missing").await;
}

#[tokio::test]
async fn two_sessions_of_one_content_both_succeed_and_store_it_once() {
    let s = start(Opts::default()).await;
    let data = bytes_of(1024 * 1024 + 5, 5);
    let (a, b) = (open(&s).await, open(&s).await);
    let d = digest(&data);
    let up = |location: String| {
        let (s, data, d) = (&s, &data, &d);
        async move {
            for (i, chunk) in data.chunks(256 * 1024).enumerate() {
                let resp = patch(s, &location, (i * 256 * 1024) as u64, chunk).await;
                assert_eq!(resp.status(), StatusCode::NO_CONTENT);
            }
            let resp = finish(s, &location, d).await;
            assert!(resp.status().is_success(), "{}", resp.status());
            let body: serde_json::Value = resp.json().await.unwrap();
            body["token"].as_str().unwrap().to_string()
        }
    };
    let (ta, tb) = tokio::join!(up(a), up(b));
    assert_ne!(ta, tb, "each finish has its own token");
    let page = s
        .store()
        .list(&store_types::Namespace::new(NS).unwrap(), None, 10)
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 1, "stored once");
    assert_eq!(get_bytes(&s, &d).await.unwrap(), data);
}

#[tokio::test]
async fn a_session_of_another_node_is_refused_clearly() {
    let (a, b) = (start(Opts::default()).await, start(Opts::default()).await);
    let location = open(&a).await;
    let resp = patch(&b, &location, 0, b"x").await;
    let body = assert_error(resp, 409, "upload_elsewhere").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("opened on node"), "{message}");
    // The session is untouched on its own node.
    assert_eq!(offset(&a, &location).await, 0);
}

/// Issue 30: a finish with a wrong digest is answered from the session's
/// running hash, without reading the spool again (it used to re-read and
/// re-hash the whole session per request); after a restart the first
/// finish reads it once.
#[tokio::test]
async fn wrong_digest_finishes_do_not_reread_the_session() {
    let s = start(Opts::default()).await;
    let data = bytes_of(3 * 1024 * 1024 + 7, 6);
    let location = open(&s).await;
    let half = data.len() / 2;
    for (start, chunk) in [(0, &data[..half]), (half, &data[half..])] {
        assert_eq!(
            patch(&s, &location, start as u64, chunk).await.status(),
            StatusCode::NO_CONTENT
        );
    }
    let wrong = digest(b"not it");
    for _ in 0..5 {
        assert_error(finish(&s, &location, &wrong).await, 422, "verification").await;
    }
    assert_eq!(
        s.ops.uploads().spool_reads(),
        0,
        "a wrong digest read the spool"
    );
    // After a restart the hash is rebuilt once, by the first finish.
    let s = s.restart(Opts::default()).await;
    for _ in 0..3 {
        assert_error(finish(&s, &location, &wrong).await, 422, "verification").await;
    }
    assert_eq!(s.ops.uploads().spool_reads(), 1);
    let resp = finish(&s, &location, &digest(&data)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(s.ops.uploads().spool_reads(), 2, "the put reads it once");
    assert_eq!(get_bytes(&s, &digest(&data)).await.unwrap(), data);
}

/// Issue 30: an empty chunk (or a failed finish) does not keep a session
/// alive: only committed bytes do. It used to extend the idle timeout on
/// every request.
#[tokio::test]
async fn empty_chunks_do_not_keep_a_session_alive() {
    let s = start(Opts {
        upload_idle: Duration::from_secs(2),
        ..Opts::default()
    })
    .await;
    let location = open(&s).await;
    assert_eq!(
        patch(&s, &location, 0, b"some").await.status(),
        StatusCode::NO_CONTENT
    );
    let wrong = digest(b"not it");
    let gone = common::eventually(10, || async {
        // An empty PATCH and a wrong finish every poll.
        let r = s
            .http
            .patch(s.url(&location))
            .body(Vec::new())
            .send()
            .await
            .unwrap()
            .status();
        let _ = finish(&s, &location, &wrong).await;
        r == StatusCode::NOT_FOUND
    })
    .await;
    assert!(gone, "empty chunks kept the idle session alive");
    assert_eq!(spool_files(&s), 0);
}

/// Issue 30: the bytes open sessions hold are capped per identity and in
/// all; at a cap an append commits what fit and answers `507
/// upload_quota`; finishing or aborting a session frees its bytes.
#[tokio::test]
async fn session_bytes_are_capped_per_identity_and_in_all() {
    let s = start(Opts {
        upload_max_bytes: (5 << 20, 3 << 20),
        ..Opts::default()
    })
    .await;
    let a = open(&s).await;
    let b = open(&s).await;
    let two = bytes_of(2 << 20, 7);
    assert_eq!(
        patch(&s, &a, 0, &two).await.status(),
        StatusCode::NO_CONTENT
    );
    // 2 MiB held by this identity; 2 more would pass its 3 MiB.
    assert_error(patch(&s, &b, 0, &two).await, 507, "upload_quota").await;
    assert!(
        offset(&s, &b).await <= 1 << 20,
        "nothing past the cap committed"
    );
    // Aborting `a` frees its bytes.
    let resp = s.http.delete(s.url(&a)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let at = offset(&s, &b).await;
    let rest = bytes_of(2 << 20, 8);
    assert_eq!(
        patch(&s, &b, at, &rest).await.status(),
        StatusCode::NO_CONTENT
    );
}

/// Issue 30: opening a session is refused cross-site like every other POST
/// (it needs `Content-Type: application/json`), and a malformed session id
/// is `404 missing` without being echoed.
#[tokio::test]
async fn cross_site_opens_and_malformed_ids_are_refused() {
    let s = start(Opts::default()).await;
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut r = s.http.post(s.url(&format!("/v1/uploads/{NS}")));
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        assert_error(r.send().await.unwrap(), 415, "unsupported_media_type").await;
    }
    assert_eq!(s.ops.uploads().sessions(), 0);
    let evil = "ZZ%0a%1b[31mforged";
    let resp = s
        .http
        .head(s.url(&format!("/v1/uploads/{NS}/{evil}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = patch(&s, &format!("/v1/uploads/{NS}/{evil}"), 0, b"x").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body = resp.text().await.unwrap();
    assert!(!body.contains("forged"), "{body}");
}
