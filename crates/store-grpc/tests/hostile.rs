//! Hostile gRPC clients (ADR-074, ADR-077): a DNS-rebinding page's calls
//! (a host that is not allowed, without credentials) are refused as over
//! HTTP, over HTTP/2 and HTTP/1.1 alike; the bytes of messages the server
//! holds at once are bounded by `GrpcConfig::message_memory`, taken
//! before a message is read and refused (`RESOURCE_EXHAUSTED`) rather
//! than waited for; callers the server answers nothing are refused from
//! their headers, before they can take any of it; and the anonymous
//! callers it does answer share a quarter of it (ADR-079).

mod common;

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use common::*;
use http_body::{Body as _, Frame};
use store_grpc::proto::build::bazel::remote::execution::v2 as re;
use store_grpc::proto::google::bytestream as bs;
use store_ops::auth::{Auth, Grant};
use store_ops::hosts::HostCheck;
use tokio::sync::oneshot::error::TryRecvError;
use tonic::Code;

const SHA256: i32 = re::digest_function::Value::Sha256 as i32;
const KIB: usize = 1 << 10;
const CAPS: &str = "/build.bazel.remote.execution.v2.Capabilities/GetCapabilities";
const UPDATE: &str = "/build.bazel.remote.execution.v2.ContentAddressableStorage/BatchUpdateBlobs";

fn caps_req() -> re::GetCapabilitiesRequest {
    re::GetCapabilitiesRequest {
        instance_name: "cc".into(),
    }
}

fn find_req() -> re::FindMissingBlobsRequest {
    re::FindMissingBlobsRequest {
        instance_name: "cc".into(),
        blob_digests: vec![digest(&sha256(b"a"), 1)],
        digest_function: SHA256,
    }
}

fn update_req(blobs: &[&[u8]]) -> re::BatchUpdateBlobsRequest {
    re::BatchUpdateBlobsRequest {
        instance_name: "cc".into(),
        requests: (blobs.iter())
            .map(|b| re::batch_update_blobs_request::Request {
                digest: Some(digest(&sha256(b), b.len())),
                data: b.to_vec().into(),
                compressor: 0,
            })
            .collect(),
        digest_function: SHA256,
    }
}

fn read_req(blobs: &[&[u8]]) -> re::BatchReadBlobsRequest {
    re::BatchReadBlobsRequest {
        instance_name: "cc".into(),
        digests: blobs.iter().map(|b| digest(&sha256(b), b.len())).collect(),
        acceptable_compressors: vec![],
        digest_function: SHA256,
    }
}

/// A server that answers callers without credentials for `localhost`
/// only; anonymous callers may read.
async fn checked(open: bool) -> Server {
    start_with(|g| {
        g.allowed_hosts = HostCheck::new(&["localhost"]);
        if !open {
            g.auth = Auth::new(keys(), vec![], Grant::parse_all(&["read"]).unwrap()).unwrap();
        } else {
            g.auth = Auth::open();
        }
    })
    .await
}

fn assert_host_refused(r: Result<impl std::fmt::Debug, tonic::Status>) {
    let e = r.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().starts_with("host_not_allowed"), "{e:?}");
    assert!(e.message().contains("evil.example"), "{e:?}");
}

#[tokio::test]
async fn anonymous_calls_naming_a_host_not_allowed_are_permission_denied() {
    let s = checked(false).await;
    let evil = s.channel_naming("evil.example:80").await;
    let mut c = s.clients_on(evil.clone(), None);
    assert_host_refused(c.caps.get_capabilities(caps_req()).await);
    assert_host_refused(c.cas.find_missing_blobs(find_req()).await);
    let read = bs::ReadRequest {
        resource_name: format!("cc/blobs/{}/1", sha256(b"a")),
        read_offset: 0,
        read_limit: 0,
    };
    assert_host_refused(c.bs.read(read).await);
    // Invalid credentials count as none: the host is the answer.
    let mut w = s.clients_on(evil.clone(), Some("bpk_wrong"));
    assert_host_refused(w.caps.get_capabilities(caps_req()).await);
    assert_host_refused(w.cas.find_missing_blobs(find_req()).await);
}

#[tokio::test]
async fn a_caller_with_a_key_is_answered_under_any_host() {
    let s = checked(false).await;
    let evil = s.channel_naming("evil.example:80").await;
    let mut k = s.clients_on(evil, Some(FULL));
    k.caps.get_capabilities(caps_req()).await.unwrap();
    let missing = k.cas.find_missing_blobs(find_req()).await.unwrap();
    assert_eq!(missing.into_inner().missing_blob_digests.len(), 1);
    let stored = k.cas.batch_update_blobs(update_req(&[b"k"])).await.unwrap();
    assert_eq!(
        stored.into_inner().responses[0]
            .status
            .as_ref()
            .unwrap()
            .code,
        0
    );
}

#[tokio::test]
async fn anonymous_calls_naming_an_allowed_host_are_answered() {
    let s = checked(false).await;
    let host = format!("LOCALHOST:{}", s.addr.port());
    let mut c = s.clients_on(s.channel_naming(&host).await, None);
    c.caps.get_capabilities(caps_req()).await.unwrap();
    c.cas.find_missing_blobs(find_req()).await.unwrap();
    // Anonymous callers still may not write here: the host check adds a
    // refusal, it grants nothing.
    let e = c
        .cas
        .batch_update_blobs(update_req(&[b"a"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

#[tokio::test]
async fn an_open_server_checks_the_host_of_every_call() {
    let s = checked(true).await;
    let mut c = s.clients_on(s.channel_naming("evil.example").await, None);
    assert_host_refused(c.caps.get_capabilities(caps_req()).await);
    assert_host_refused(c.cas.batch_update_blobs(update_req(&[b"x"])).await);
    let mut l = s.clients_on(s.channel_naming("localhost").await, None);
    l.caps.get_capabilities(caps_req()).await.unwrap();
    l.cas.batch_update_blobs(update_req(&[b"x"])).await.unwrap();
}

#[tokio::test]
async fn by_default_any_host_is_answered() {
    let s = start_with(|g| g.auth = Auth::open()).await;
    let mut c = s.clients_on(s.channel_naming("evil.example").await, None);
    c.caps.get_capabilities(caps_req()).await.unwrap();
}

/// A gRPC message as it travels: uncompressed flag, length, bytes.
fn frame(msg: &impl prost::Message) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// An HTTP request for gRPC `path` naming `host` in `Host` (HTTP/1.1:
/// no authority in the URI), with `key`, and `body`.
fn grpc_request(
    path: &str,
    host: &str,
    key: Option<&str>,
    body: Body,
) -> axum::http::Request<Body> {
    let mut b = axum::http::Request::post(path)
        .version(axum::http::Version::HTTP_11)
        .header("host", host)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(body).unwrap()
}

/// Sends `req` through `app` (no socket) and returns its gRPC status
/// code and message, from the headers (a trailers-only answer) or the
/// trailers.
async fn oneshot(app: &mut axum::Router, req: axum::http::Request<Body>) -> (i32, String) {
    use tower_service::Service;
    std::future::poll_fn(|cx| Service::<axum::http::Request<Body>>::poll_ready(app, cx))
        .await
        .unwrap();
    let resp = app.call(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let (parts, mut body) = resp.into_parts();
    let mut trailers = parts.headers.clone();
    while let Some(f) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(t) = f.unwrap().into_trailers() {
            trailers.extend(t);
        }
    }
    let code = trailers["grpc-status"].to_str().unwrap().parse().unwrap();
    let message = (trailers.get("grpc-message"))
        .map(|m| percent_decoded(m.to_str().unwrap()))
        .unwrap_or_default();
    (code, message)
}

/// A `grpc-message` value as text (it is percent-encoded).
fn percent_decoded(s: &str) -> String {
    let (b, mut out, mut i) = (s.as_bytes(), Vec::new(), 0);
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn an_http1_grpc_post_from_a_rebinding_page_is_refused() {
    let s = start().await;
    let cfg = store_grpc::GrpcConfig {
        allowed_hosts: HostCheck::new(&["localhost"]),
        ..Default::default()
    };
    let mut app = app(s.ops.clone(), cfg);
    let caps = || Body::from(frame(&caps_req()));
    let (code, msg) = oneshot(
        &mut app,
        grpc_request(CAPS, "evil.example:7070", None, caps()),
    )
    .await;
    assert_eq!(code, Code::PermissionDenied as i32, "{msg}");
    assert!(msg.contains("host_not_allowed"), "{msg}");
    let update = || Body::from(frame(&update_req(&[b"rebound"])));
    let (code, msg) = oneshot(
        &mut app,
        grpc_request(UPDATE, "evil.example", None, update()),
    )
    .await;
    assert_eq!(code, Code::PermissionDenied as i32, "{msg}");
    // The same requests naming the server's name are answered.
    let (code, msg) = oneshot(&mut app, grpc_request(CAPS, "localhost:7070", None, caps())).await;
    assert_eq!(code, 0, "{msg}");
    let (code, msg) = oneshot(&mut app, grpc_request(UPDATE, "localhost", None, update())).await;
    assert_eq!(code, 0, "{msg}");
}

/// A server whose gRPC message budget is 64 KiB.
async fn small_budget() -> Server {
    start_with(|g| g.message_memory = 64 * KIB).await
}

fn assert_exhausted(r: Result<impl std::fmt::Debug, tonic::Status>) {
    let e = r.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("ByteStream"), "{e:?}");
    assert!(e.message().contains("holding"), "{e:?}");
}

#[tokio::test]
async fn a_batch_larger_than_the_budget_is_refused_and_the_budget_comes_back() {
    let s = small_budget().await;
    let mut c = s.clients(Some(FULL)).await;
    let big = bytes(100 * KIB, 1);
    assert_exhausted(c.cas.batch_update_blobs(update_req(&[&big])).await);
    // Two blobs the budget takes one at a time, again and again.
    let (a, b) = (bytes(40 * KIB, 2), bytes(40 * KIB, 3));
    for _ in 0..3 {
        for blob in [&a, &b] {
            let r = c.cas.batch_update_blobs(update_req(&[blob])).await.unwrap();
            assert_eq!(r.into_inner().responses[0].status.as_ref().unwrap().code, 0);
        }
    }
    // A read's answer counts its blobs: both at once are more than the
    // budget, each alone is not.
    assert_exhausted(c.cas.batch_read_blobs(read_req(&[&a, &b])).await);
    for blob in [&a, &b] {
        let r = c.cas.batch_read_blobs(read_req(&[blob])).await.unwrap();
        assert_eq!(&r.into_inner().responses[0].data[..], &blob[..]);
    }
    // Everything given back: a batch of nearly the whole budget passes.
    let most = bytes(60 * KIB, 4);
    c.cas
        .batch_update_blobs(update_req(&[&most]))
        .await
        .unwrap();
    let ac = re::UpdateActionResultRequest {
        instance_name: "cc".into(),
        action_digest: Some(digest(&sha256(b"act"), 3)),
        action_result: Some(re::ActionResult {
            stdout_raw: bytes(100 * KIB, 5).into(),
            ..Default::default()
        }),
        results_cache_policy: None,
        digest_function: SHA256,
    };
    assert_exhausted(c.ac.update_action_result(ac).await);
}

#[tokio::test]
async fn a_bytestream_write_passes_the_budget_from_message_to_message() {
    let s = small_budget().await;
    let mut c = s.clients(Some(FULL)).await;
    let blob = bytes(200 * KIB, 6);
    let name = format!("cc/uploads/u1/blobs/{}/{}", sha256(&blob), blob.len());
    let msgs: Vec<bs::WriteRequest> = (blob.chunks(32 * KIB).enumerate())
        .map(|(i, chunk)| bs::WriteRequest {
            resource_name: name.clone(),
            write_offset: (i * 32 * KIB) as i64,
            finish_write: (i + 1) * 32 * KIB >= blob.len(),
            data: chunk.to_vec().into(),
        })
        .collect();
    let r = c.bs.write(futures::stream::iter(msgs)).await.unwrap();
    assert_eq!(r.into_inner().committed_size as usize, blob.len());
    // One message larger than the budget is not.
    let big = bytes(100 * KIB, 7);
    let name = format!("cc/uploads/u2/blobs/{}/{}", sha256(&big), big.len());
    let one = bs::WriteRequest {
        resource_name: name,
        write_offset: 0,
        finish_write: true,
        data: big.into(),
    };
    assert_exhausted(c.bs.write(futures::stream::iter([one])).await);
}

/// A request body that sends `first` and then nothing, ever, saying
/// when `first` was taken.
struct Stall {
    first: Option<Bytes>,
    taken: Option<tokio::sync::oneshot::Sender<()>>,
}

impl http_body::Body for Stall {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.first.take() {
            Some(b) => {
                if let Some(t) = self.taken.take() {
                    let _ = t.send(());
                }
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            None => Poll::Pending,
        }
    }
}

/// The budget is taken from a message's header, before its bytes are
/// read: a client that declares a large message and stalls holds it,
/// and the server refuses others instead of buffering them.
#[tokio::test]
async fn a_message_is_counted_from_its_header_before_it_is_read() {
    let s = start().await;
    let cfg = store_grpc::GrpcConfig {
        message_memory: 64 * KIB,
        ..Default::default()
    };
    let mut app = app(s.ops.clone(), cfg);
    // 60 KiB declared, 5 bytes of it sent.
    let mut head = vec![0u8];
    head.extend_from_slice(&(60 * KIB as u32).to_be_bytes());
    head.extend_from_slice(b"\x0a\x02cc");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stall = Stall {
        first: Some(Bytes::from(head)),
        taken: Some(tx),
    };
    let stalled = grpc_request(UPDATE, "localhost", None, Body::new(stall));
    let mut held = app.clone();
    let call = tokio::spawn(async move { oneshot(&mut held, stalled).await });
    rx.await.unwrap();
    let small = || Body::from(frame(&update_req(&[&bytes(8 * KIB, 8)])));
    let (code, msg) = oneshot(&mut app, grpc_request(UPDATE, "localhost", None, small())).await;
    assert_eq!(code, Code::ResourceExhausted as i32, "{msg}");
    assert!(msg.contains("holding 0.06 MiB"), "{msg}");
    // The stalled client goes away: its bytes are given back.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    let (code, msg) = oneshot(&mut app, grpc_request(UPDATE, "localhost", None, small())).await;
    assert_eq!(code, 0, "{msg}");
}

/// `f`'s output, which must come within 3 s (a call the server answers
/// only once its body comes never is).
async fn within_3s<T>(f: impl std::future::Future<Output = T>) -> T {
    let limit = std::time::Duration::from_secs(3);
    (tokio::time::timeout(limit, f).await).expect("answered without waiting for the body")
}

/// A gRPC frame header declaring `len` bytes, and the first bytes of a
/// request naming the instance `cc`.
fn stalled_head(len: usize) -> Bytes {
    let mut head = vec![0u8];
    head.extend_from_slice(&(len as u32).to_be_bytes());
    head.extend_from_slice(b"\x0a\x02cc");
    Bytes::from(head)
}

/// Calls gRPC `path` over `ch` (HTTP/2 to the server's socket) with
/// `key`, sending a message declared `len` bytes long of which only
/// [`stalled_head`] comes, and never more. Its status (from a
/// trailers-only answer's headers), or `None` when it is not answered
/// within 3 s (the server waits for the body).
async fn stalled_call(
    mut ch: tonic::transport::Channel,
    path: &str,
    key: Option<&str>,
    len: usize,
) -> Option<(i32, String)> {
    use tower_service::Service;
    let stall = Stall {
        first: Some(stalled_head(len)),
        taken: None,
    };
    let mut b = axum::http::Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    let req = b.body(tonic::body::Body::new(stall)).unwrap();
    std::future::poll_fn(|cx| ch.poll_ready(cx)).await.unwrap();
    let resp = ch.call(req);
    let resp = tokio::time::timeout(std::time::Duration::from_secs(3), resp)
        .await
        .ok()?
        .unwrap();
    let h = resp.headers();
    let code = h.get("grpc-status")?.to_str().unwrap().parse().unwrap();
    let message = (h.get("grpc-message"))
        .map(|m| percent_decoded(m.to_str().unwrap()))
        .unwrap_or_default();
    Some((code, message))
}

/// A caller with a key stores a batch of one blob of `len` bytes.
async fn keyed_batch_passes(s: &Server, len: usize, seed: u8) {
    let mut c = s.clients(Some(FULL)).await;
    let blob = bytes(len, seed);
    let r = c
        .cas
        .batch_update_blobs(update_req(&[&blob]))
        .await
        .unwrap();
    assert_eq!(r.into_inner().responses[0].status.as_ref().unwrap().code, 0);
}

/// On a server that requires keys, callers without one (or with a wrong
/// one) that declare large messages and stall are refused from their
/// headers: the budget stays for the callers with keys.
#[tokio::test]
async fn anonymous_callers_that_stall_cannot_hold_the_budget() {
    let s = small_budget().await;
    // Six callers on their own connections, each declaring 16 KiB of a
    // 64 KiB budget (four would hold it all) and stalling; the last with
    // a key that matches none.
    let mut stalled = Vec::new();
    for i in 0..6 {
        let ch = s.channel().await;
        let key = (i == 5).then_some("bpk_wrong");
        stalled.push(tokio::spawn(stalled_call(ch, UPDATE, key, 16 * KIB)));
    }
    // Until they are answered, or for 1 s (long enough for the server to
    // read their headers, were it to wait for their bodies).
    let waited = std::time::Instant::now();
    while !stalled.iter().all(|c| c.is_finished()) && waited.elapsed().as_secs() < 1 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // A caller with a key stores a batch of most of the budget meanwhile.
    keyed_batch_passes(&s, 48 * KIB, 9).await;
    for (i, call) in stalled.into_iter().enumerate() {
        let answer = call.await.unwrap();
        let (code, msg) = answer.expect("refused without waiting for the body");
        assert_eq!(code, Code::Unauthenticated as i32, "{msg}");
        let want = match i {
            5 => "unauthorized: the API key is not valid",
            _ => "unauthorized: authentication required",
        };
        assert!(msg.starts_with(want), "{msg}");
    }
    let m = s.ops.metrics();
    assert_eq!(m.errors(store_ops::ErrorCode::TooMany), 0);
    assert_eq!(m.errors(store_ops::ErrorCode::Unauthorized), 6);
}

/// On a server that grants anonymous callers something, callers without
/// credentials are admitted, but together they hold at most a quarter of
/// the budget (ADR-079): stalled anonymous messages cannot take what a
/// caller with a key needs.
#[tokio::test]
async fn anonymous_callers_share_a_quarter_of_the_budget() {
    let s = start_with(|g| {
        g.message_memory = 64 * KIB;
        g.auth = Auth::new(keys(), vec![], Grant::parse_all(&["read"]).unwrap()).unwrap();
    })
    .await;
    // Six anonymous callers on their own connections, each declaring a
    // 16 KiB message (the anonymous quarter) and stalling: one holds it,
    // the others are refused from their messages' headers.
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let ch = s.channel().await;
        stalled.push(tokio::spawn(stalled_call(ch, UPDATE, None, 16 * KIB)));
    }
    let waited = std::time::Instant::now();
    let refused = |c: &[tokio::task::JoinHandle<_>]| c.iter().filter(|c| c.is_finished()).count();
    while refused(&stalled) < 5 && waited.elapsed().as_secs() < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // A caller with a key stores a batch of 40 KiB meanwhile: the other
    // three quarters are there.
    keyed_batch_passes(&s, 40 * KIB, 12).await;
    let mut holding = 0;
    for call in stalled {
        match call.await.unwrap() {
            None => holding += 1,
            Some((code, msg)) => {
                assert_eq!(code, Code::ResourceExhausted as i32, "{msg}");
                assert!(msg.contains("anonymous callers"), "{msg}");
            }
        }
    }
    assert_eq!(
        holding, 1,
        "one stalled anonymous message holds the quarter"
    );
    assert_eq!(s.ops.metrics().errors(store_ops::ErrorCode::TooMany), 5);
}

/// An anonymous caller's `BatchReadBlobs` answer is held from the
/// anonymous quarter too (ADR-079): an answer larger than the quarter is
/// refused to it, and given to a caller with a key.
#[tokio::test]
async fn an_anonymous_batch_read_answer_is_held_from_the_quarter() {
    let s = start_with(|g| {
        g.message_memory = 64 * KIB;
        g.auth = Auth::new(keys(), vec![], Grant::parse_all(&["read"]).unwrap()).unwrap();
    })
    .await;
    keyed_batch_passes(&s, 24 * KIB, 13).await;
    let blob = bytes(24 * KIB, 13);
    let mut anonymous = s.clients(None).await;
    let e = (anonymous.cas.batch_read_blobs(read_req(&[&blob])).await).unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("anonymous callers"), "{e:?}");
    let mut keyed = s.clients(Some(FULL)).await;
    let r = (keyed.cas.batch_read_blobs(read_req(&[&blob])).await)
        .unwrap()
        .into_inner();
    assert_eq!(r.responses[0].status.as_ref().unwrap().code, 0);
    assert_eq!(r.responses[0].data, blob);
}

/// A call without credentials is refused before a byte of its body is
/// read, and takes nothing; a key that matches none too, and under a
/// host that is not allowed the host is the answer, as in the handlers.
#[tokio::test]
async fn an_anonymous_call_is_refused_before_its_body_is_read() {
    let s = start().await;
    let cfg = store_grpc::GrpcConfig {
        auth: Auth::new(keys(), vec![], vec![]).unwrap(),
        allowed_hosts: HostCheck::new(&["localhost"]),
        message_memory: 64 * KIB,
        ..Default::default()
    };
    let mut app = app(s.ops.clone(), cfg);
    let cases = [
        (
            "localhost",
            None,
            Code::Unauthenticated,
            "unauthorized: authentication",
        ),
        (
            "localhost",
            Some("bpk_wrong"),
            Code::Unauthenticated,
            "unauthorized: the API",
        ),
        (
            "evil.example",
            None,
            Code::PermissionDenied,
            "host_not_allowed",
        ),
        (
            "evil.example",
            Some("bpk_wrong"),
            Code::PermissionDenied,
            "host_not_allowed",
        ),
    ];
    for (host, key, want, prefix) in cases {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let stall = Stall {
            first: Some(stalled_head(60 * KIB)),
            taken: Some(tx),
        };
        let req = grpc_request(UPDATE, host, key, Body::new(stall));
        let (code, msg) = within_3s(oneshot(&mut app, req)).await;
        assert_eq!(code, want as i32, "{host} {key:?}: {msg}");
        assert!(msg.starts_with(prefix), "{host} {key:?}: {msg}");
        // The body was dropped unread: not even its first bytes were taken.
        let unread = matches!(rx.try_recv(), Err(TryRecvError::Closed));
        assert!(unread, "{host} {key:?}: its body was read");
    }
    // Nothing was taken: a message of nearly the whole budget passes.
    let most = || Body::from(frame(&update_req(&[&bytes(60 * KIB, 10)])));
    let req = grpc_request(UPDATE, "evil.example", Some(FULL), most());
    let (code, msg) = oneshot(&mut app, req).await;
    assert_eq!(code, 0, "{msg}");
    assert_eq!(s.ops.metrics().errors(store_ops::ErrorCode::TooMany), 0);
}

/// Capabilities are answered without credentials on any server, so their
/// messages (a few bytes) take no budget: a stalled one holds none of it.
#[tokio::test]
async fn a_stalled_capabilities_call_takes_no_budget() {
    let s = start().await;
    let cfg = store_grpc::GrpcConfig {
        auth: Auth::new(keys(), vec![], vec![]).unwrap(),
        message_memory: 64 * KIB,
        ..Default::default()
    };
    let mut app = app(s.ops.clone(), cfg);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stall = Stall {
        first: Some(stalled_head(3 * KIB)),
        taken: Some(tx),
    };
    let stalled = grpc_request(CAPS, "localhost", None, Body::new(stall));
    let mut held = app.clone();
    let call = tokio::spawn(async move { oneshot(&mut held, stalled).await });
    rx.await.unwrap();
    let most = || Body::from(frame(&update_req(&[&bytes(62 * KIB, 11)])));
    let req = grpc_request(UPDATE, "localhost", Some(FULL), most());
    let (code, msg) = oneshot(&mut app, req).await;
    assert_eq!(code, 0, "{msg}");
    assert!(!call.is_finished());
    call.abort();
    // Longer than a capabilities request can be: refused from its header.
    let big = Stall {
        first: Some(stalled_head(8 * KIB)),
        taken: None,
    };
    let req = grpc_request(CAPS, "localhost", None, Body::new(big));
    let (code, msg) = within_3s(oneshot(&mut app, req)).await;
    assert_ne!(code, 0, "{msg}");
    assert!(msg.contains("too large"), "{msg}");
}

/// A client certificate (in the request's extensions, where the
/// connection layer leaves it) is an identity at the admission too: its
/// call is answered, the same call without it is refused from its
/// headers.
#[tokio::test]
async fn a_client_certificate_is_admitted_from_the_request_extensions() {
    use store_ops::auth::{CertIdentity, ClientCert};
    let s = start().await;
    let cert = CertIdentity {
        name: "ci".into(),
        subject: "ci.example".into(),
        grants: Grant::parse_all(&["read", "write"]).unwrap(),
    };
    let cfg = store_grpc::GrpcConfig {
        auth: Auth::new(keys(), vec![cert], vec![]).unwrap(),
        client_cert: Some(std::sync::Arc::new(|e: &store_grpc::Extensions| {
            e.get::<ClientCert>().cloned()
        })),
        ..Default::default()
    };
    let mut app = app(s.ops.clone(), cfg);
    let update = || Body::from(frame(&update_req(&[b"by certificate"])));
    let mut req = grpc_request(UPDATE, "localhost", None, update());
    req.extensions_mut().insert(ClientCert {
        common_name: Some("ci.example".into()),
        dns_names: vec![],
    });
    let (code, msg) = oneshot(&mut app, req).await;
    assert_eq!(code, 0, "{msg}");
    let req = grpc_request(UPDATE, "localhost", None, update());
    let (code, msg) = oneshot(&mut app, req).await;
    assert_eq!(code, Code::Unauthenticated as i32, "{msg}");
}
