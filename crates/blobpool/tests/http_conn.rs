//! The server's connection layer over real sockets (`serve_router`):
//! slowloris and idle connections, body read and write timeouts, the
//! connection cap, the shutdown drain, TLS and mutual TLS.
//!
//! Limits are small so the file runs in seconds; the assertions are only
//! generous upper bounds on when something must have been closed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use store_core::{Mode, Store};
use store_http::{ClientAuth, PeerInfo, ServerLimits, TlsSettings};
use store_local::{LocalEngine, LocalOptions};
use store_ops::{Ops, OpsConfig};
use store_sqlite::{SqliteEngine, SqliteOptions};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Limits small enough for tests.
fn limits() -> ServerLimits {
    ServerLimits {
        header_read_timeout: Duration::from_millis(1000),
        idle_timeout: Duration::from_millis(1500),
        body_read_timeout: Duration::from_millis(1000),
        write_timeout: Duration::from_millis(1000),
        max_connections: 64,
        drain_timeout: Duration::from_millis(1000),
        http2_max_streams: Some(16),
    }
}

/// Slack added to every "closed within" bound: the machine is shared and
/// builds run beside the tests.
const MARGIN: Duration = Duration::from_secs(4);

struct Srv {
    addr: SocketAddr,
    ops: Ops,
    large: LocalEngine,
    kv: SqliteEngine,
    _dir: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
}

impl Srv {
    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn begin_shutdown(&mut self) -> JoinHandle<std::io::Result<()>> {
        let _ = self.shutdown.take().unwrap().send(());
        self.handle.take().unwrap()
    }

    async fn ns_is_empty(&self, ns: &str) -> bool {
        use store_types::{Engine, Namespace};
        let ns = Namespace::new(ns).unwrap();
        self.large.scan(&ns, None, 1).await.unwrap().is_empty()
            && self.kv.scan(&ns, None, 1).await.unwrap().is_empty()
    }

    fn stages(&self) -> usize {
        self.large.stage_file_count().unwrap()
    }
}

/// A store (sqlite kv + local large tier, threshold 1 KiB) served by
/// `serve_router` with `limits` and `tls`; `app` replaces the store's
/// router when given.
async fn start(limits: ServerLimits, tls: Option<TlsSettings>, app: Option<Router>) -> Srv {
    let dir = tempfile::tempdir().unwrap();
    let kv = SqliteEngine::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let large = LocalEngine::open(
        dir.path().join("large"),
        LocalOptions {
            shared_media: false,
            fsync: false,
            ..LocalOptions::default()
        },
    )
    .await
    .unwrap();
    let store = Store::builder()
        .kv(kv.clone())
        .large(large.clone())
        .mode(Mode::DualTier { threshold: 1024 })
        .window(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    let ops = Ops::new(store, OpsConfig::default()).unwrap();
    let app = app.unwrap_or_else(|| store_http::router(ops.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(store_http::serve_router(
        listener,
        app,
        limits,
        tls,
        async move {
            let _ = rx.await;
        },
    ));
    Srv {
        addr,
        ops,
        large,
        kv,
        _dir: dir,
        shutdown: Some(tx),
        handle: Some(handle),
    }
}

/// A router that reports the request's `PeerInfo` and can sleep.
fn peer_router() -> Router {
    Router::new()
        .route(
            "/peer",
            get(|Extension(p): Extension<PeerInfo>| async move {
                let cert = p.client_cert.as_ref();
                serde_json::json!({
                    "remote": p.remote.to_string(),
                    "tls": p.tls,
                    "cn": cert.and_then(|c| c.common_name.clone()),
                    "dns": cert.map(|c| c.dns_names.clone()),
                })
                .to_string()
            }),
        )
        .route(
            "/sleep/{ms}",
            get(
                |axum::extract::Path(ms): axum::extract::Path<u64>| async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    "slept"
                },
            ),
        )
}

/// Deterministic content.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn digest(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// One HTTP/1.1 response: status, lower-cased head, body (by
/// `Content-Length`).
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads one response (headers, then a `Content-Length` body).
async fn read_answer<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Answer> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("EOF in response head: {:?}", String::from_utf8_lossy(&buf)),
            ));
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(Answer { status, head, body })
}

/// Reads until EOF or an error; the bytes read and whether it ended by
/// EOF/error (true) or by the timeout (false).
async fn read_to_close<S: AsyncRead + Unpin>(s: &mut S, within: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let r = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (out, r.is_ok())
}

fn get_req(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn slowloris_headers_and_silent_connections_are_closed() {
    let s = start(limits(), None, None).await;
    let header = limits().header_read_timeout;

    // One header byte every 100 ms: cut within the header read timeout.
    let c = TcpStream::connect(s.addr).await.unwrap();
    let (mut rd, mut wr) = c.into_split();
    let t0 = Instant::now();
    let trickle = tokio::spawn(async move {
        let _ = wr.write_all(b"GET /health HTTP/1.1\r\nX-Slow: ").await;
        loop {
            if wr.write_all(b"a").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if t0.elapsed() > Duration::from_secs(30) {
                return;
            }
        }
    });
    let (got, closed) = read_to_close(&mut rd, header + MARGIN).await;
    assert!(closed, "a slowloris client was not closed");
    assert!(
        !String::from_utf8_lossy(&got).contains(" 200 "),
        "an unfinished request got an answer"
    );
    trickle.abort();

    // Connect and send nothing: closed within the header timeout too.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let (got, closed) = read_to_close(&mut c, header + MARGIN).await;
    assert!(closed, "a silent connection was not closed");
    assert!(got.is_empty());

    // An HTTP/2 preface trickled byte by byte is no way around it.
    let c = TcpStream::connect(s.addr).await.unwrap();
    let (mut rd, mut wr) = c.into_split();
    let trickle = tokio::spawn(async move {
        for b in b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".iter().cycle().take(300) {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (_, closed) = read_to_close(&mut rd, header + MARGIN).await;
    assert!(closed, "a trickled preface was not closed");
    trickle.abort();

    // The server still answers.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/health").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut c).await.unwrap().status, 200);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_long_upload_is_not() {
    let s = start(limits(), None, Some(peer_router())).await;
    let l = limits();

    // Idle after one request: closed within the idle timeout.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/peer").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut c).await.unwrap().status, 200);
    // Still usable shortly after (keep-alive).
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.write_all(get_req("/peer").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut c).await.unwrap().status, 200);
    let (got, closed) = read_to_close(&mut c, l.idle_timeout + MARGIN).await;
    assert!(closed, "an idle keep-alive connection was not closed");
    assert!(got.is_empty());

    // A handler running longer than the idle (and header) timeout.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/sleep/3000").as_bytes())
        .await
        .unwrap();
    let a = read_answer(&mut c).await.unwrap();
    assert_eq!((a.status, a.body.as_slice()), (200, b"slept".as_slice()));
    drop(s);

    // An upload trickling for longer than the idle timeout, each gap
    // shorter than the body read timeout: stored.
    let s = start(limits(), None, None).await;
    let data = content(2048, 7);
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        format!(
            "PUT /v1/blobs/slow HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            data.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    for chunk in data.chunks(128) {
        c.write_all(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(t0.elapsed() > l.idle_timeout * 2);
    let a = read_answer(&mut c).await.unwrap();
    assert!(
        (200..300).contains(&a.status),
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["digest"], digest(&data));
}

#[tokio::test]
async fn a_stalled_upload_fails_within_the_body_read_timeout_and_publishes_nothing() {
    let s = start(limits(), None, None).await;
    let data = content(4 << 20, 11);
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        format!(
            "PUT /v1/blobs/stalled HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            data.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    c.write_all(&data[..256 * 1024]).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || async { s.stages() == 1 }).await);
    // Then nothing: the put fails and the connection ends.
    let (got, closed) = read_to_close(&mut c, limits().body_read_timeout + MARGIN).await;
    assert!(closed, "a stalled upload was not ended");
    let text = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || text.contains("incomplete_body"),
        "unexpected answer: {text}"
    );
    assert!(eventually(Duration::from_secs(10), || async { s.stages() == 0 }).await);
    assert!(s.ns_is_empty("stalled").await);
    let head = reqwest::Client::new()
        .head(format!("{}/v1/blobs/stalled/{}", s.base(), digest(&data)))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 404);
}

#[tokio::test]
async fn a_stalled_reader_is_cut_within_the_write_timeout_and_others_are_served() {
    let s = start(limits(), None, None).await;
    let len = 16usize << 20;
    let data = content(len, 13);
    let http = reqwest::Client::new();
    let put = http
        .put(format!("{}/v1/blobs/big", s.base()))
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    let d = digest(&data);

    // A reader with a small receive window that never reads.
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut c = sock.connect(s.addr).await.unwrap();
    c.write_all(get_req(&format!("/v1/blobs/big/{d}")).as_bytes())
        .await
        .unwrap();
    // Others are served meanwhile.
    let t0 = Instant::now();
    while t0.elapsed() < limits().write_timeout + Duration::from_millis(1500) {
        let r = http
            .get(format!("{}/health", s.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The server gave up on the stalled response: reading now ends early
    // (EOF or reset) instead of delivering the whole blob.
    let (got, closed) = read_to_close(&mut c, Duration::from_secs(30)).await;
    assert!(closed);
    assert!(
        got.len() < len,
        "the whole blob ({} bytes) was delivered to a reader stalled past the write timeout",
        got.len()
    );
    // A reader that reads gets it all.
    let r = http
        .get(format!("{}/v1/blobs/big/{d}", s.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().len(), len);
    let _ = &s.ops;
}

#[tokio::test]
async fn the_connection_cap_answers_503_overloaded_and_recovers() {
    let l = ServerLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
        ..limits()
    };
    let s = start(l, None, None).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(get_req("/health").as_bytes()).await.unwrap();
        assert_eq!(read_answer(&mut c).await.unwrap().status, 200);
        held.push(c);
    }
    // The third: 503 overloaded, then closed.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/health").as_bytes()).await.unwrap();
    let a = read_answer(&mut c).await.unwrap();
    assert_eq!(a.status, 503);
    assert!(a.head.contains("retry-after: 1\r\n"), "{}", a.head);
    assert!(a.head.contains("connection: close\r\n"), "{}", a.head);
    assert!(
        a.head.contains("content-type: application/json\r\n"),
        "{}",
        a.head
    );
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["error"]["code"], "overloaded");
    assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    let (_, closed) = read_to_close(&mut c, MARGIN).await;
    assert!(closed);

    // The held ones still work; after one closes, newcomers are served.
    held[0]
        .write_all(get_req("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut held[0]).await.unwrap().status, 200);
    drop(held.remove(1));
    let served = eventually(Duration::from_secs(10), || async {
        let Ok(mut c) = TcpStream::connect(s.addr).await else {
            return false;
        };
        if c.write_all(get_req("/health").as_bytes()).await.is_err() {
            return false;
        }
        matches!(read_answer(&mut c).await, Ok(a) if a.status == 200)
    })
    .await;
    assert!(served, "no connection was served after one closed");
}

#[tokio::test]
async fn shutdown_lets_a_short_request_finish_and_aborts_a_stalled_upload() {
    // A request finishing within the drain timeout is answered.
    let mut s = start(
        ServerLimits {
            drain_timeout: Duration::from_secs(10),
            ..limits()
        },
        None,
        Some(peer_router()),
    )
    .await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/sleep/500").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let serve = s.begin_shutdown();
    let a = read_answer(&mut c).await.unwrap();
    assert_eq!((a.status, a.body.as_slice()), (200, b"slept".as_slice()));
    // No keep-alive after it, no new connections.
    let (_, closed) = read_to_close(&mut c, MARGIN).await;
    assert!(closed);
    tokio::time::timeout(MARGIN, serve)
        .await
        .expect("the drain did not end")
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(s.addr).await.is_err());

    // An upload stalled (long body timeout) when shutdown comes: the
    // drain ends within its timeout, the put is cancelled.
    let l = ServerLimits {
        body_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        ..limits()
    };
    let mut s = start(l.clone(), None, None).await;
    let data = content(4 << 20, 17);
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        format!(
            "PUT /v1/blobs/drain HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            data.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    c.write_all(&data[..256 * 1024]).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || async { s.stages() == 1 }).await);
    let t0 = Instant::now();
    let serve = s.begin_shutdown();
    tokio::time::timeout(l.drain_timeout + MARGIN, serve)
        .await
        .expect("the drain did not end within its timeout")
        .unwrap()
        .unwrap();
    assert!(t0.elapsed() >= l.drain_timeout);
    // serve_router returned after the aborted handlers ran their drops.
    assert!(eventually(Duration::from_secs(5), || async { s.stages() == 0 }).await);
    assert!(s.ns_is_empty("drain").await);
    let (_, closed) = read_to_close(&mut c, MARGIN).await;
    assert!(closed);
}

// ---------------------------------------------------------------- TLS

/// A CA, a server certificate for localhost / 127.0.0.1 and a client
/// certificate (CN `alice`), as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    ca_der: rustls_pki_types::CertificateDer<'static>,
    client_chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    client_key_pem: String,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "blobpool test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();

        let ckey = KeyPair::generate().unwrap();
        let mut cparams =
            CertificateParams::new(vec!["alice.clients.example".to_string()]).unwrap();
        cparams.distinguished_name.push(DnType::CommonName, "alice");
        let ccert = cparams.signed_by(&ckey, &issuer).unwrap();

        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        Pki {
            dir,
            ca_der: ca.der().clone(),
            client_chain: vec![ccert.der().clone()],
            client_key_pem: ckey.serialize_pem(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn settings(&self, client_auth: Option<ClientAuth>) -> TlsSettings {
        TlsSettings {
            cert: self.path("cert.pem"),
            key: self.path("key.pem"),
            client_ca: client_auth.map(|_| self.path("ca.pem")),
            client_auth: client_auth.unwrap_or(ClientAuth::Optional),
        }
    }

    /// A client trusting the CA, with the client certificate when `cert`.
    fn connector(&self, cert: bool, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let mut cfg = if cert {
            let key =
                rustls_pki_types::PrivateKeyDer::from_pem_slice(self.client_key_pem.as_bytes())
                    .unwrap();
            builder
                .with_client_auth_cert(self.client_chain.clone(), key)
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
    }
}

async fn tls_connect(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await
}

/// `GET path` over a fresh TLS connection.
async fn tls_get(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    path: &str,
) -> std::io::Result<Answer> {
    let mut c = tls_connect(addr, connector).await?;
    c.write_all(get_req(path).as_bytes()).await?;
    read_answer(&mut c).await
}

#[tokio::test]
async fn tls_round_trip_and_plain_http_to_the_tls_port_fails() {
    let pki = Pki::new();
    let s = start(limits(), Some(pki.settings(None)), None).await;
    let connector = pki.connector(false, &[b"http/1.1"]);

    // PUT then GET over HTTPS on one keep-alive connection.
    let data = content(4096, 3);
    let mut c = tls_connect(s.addr, &connector).await.unwrap();
    c.write_all(
        format!(
            "PUT /v1/blobs/tls HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            data.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    c.write_all(&data).await.unwrap();
    let a = read_answer(&mut c).await.unwrap();
    assert!(
        (200..300).contains(&a.status),
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let d = digest(&data);
    c.write_all(get_req(&format!("/v1/blobs/tls/{d}")).as_bytes())
        .await
        .unwrap();
    let a = read_answer(&mut c).await.unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(a.body, data);

    // ALPN: h2 is offered when HTTP/2 is on.
    let h2 = pki.connector(false, &[b"h2", b"http/1.1"]);
    let c = tls_connect(s.addr, &h2).await.unwrap();
    assert_eq!(c.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));

    // Plain HTTP to the TLS port: no HTTP answer, the connection ends.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/health").as_bytes()).await.unwrap();
    let (got, closed) = read_to_close(&mut c, MARGIN).await;
    assert!(closed);
    assert!(
        !got.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );

    // A TCP connection that never sends a ClientHello is closed within
    // the header read timeout.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let (got, closed) = read_to_close(&mut c, limits().header_read_timeout + MARGIN).await;
    assert!(closed, "a silent TLS connection was not closed");
    assert!(got.is_empty());

    // Without HTTP/2, ALPN settles on http/1.1.
    let l = ServerLimits {
        http2_max_streams: None,
        ..limits()
    };
    let s2 = start(l, Some(pki.settings(None)), None).await;
    let c = tls_connect(s2.addr, &h2).await.unwrap();
    assert_eq!(c.get_ref().1.alpn_protocol(), Some(b"http/1.1".as_slice()));
}

#[tokio::test]
async fn tls_startup_with_a_bad_file_is_an_error_naming_it() {
    let pki = Pki::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut settings = pki.settings(None);
    settings.cert = pki.path("nope.pem");
    let e = store_http::serve_router(
        listener,
        peer_router(),
        limits(),
        Some(settings),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().starts_with("TLS certificate file: "), "{e}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    std::fs::write(pki.path("bad-ca.pem"), "junk\n").unwrap();
    let mut settings = pki.settings(Some(ClientAuth::Required));
    settings.client_ca = Some(pki.path("bad-ca.pem"));
    let e = store_http::serve_router(
        listener,
        peer_router(),
        limits(),
        Some(settings),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().starts_with("TLS client CA file: "), "{e}");
}

#[tokio::test]
async fn mutual_tls_required_refuses_anonymous_clients_and_names_the_certificate() {
    let pki = Pki::new();
    let s = start(
        limits(),
        Some(pki.settings(Some(ClientAuth::Required))),
        Some(peer_router()),
    )
    .await;

    // With a CA-signed certificate: served, the handler sees its names.
    let a = tls_get(s.addr, &pki.connector(true, &[]), "/peer")
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["tls"], true);
    assert_eq!(v["cn"], "alice");
    assert_eq!(v["dns"], serde_json::json!(["alice.clients.example"]));

    // Without one: refused in the handshake (TLS 1.3 reports it to the
    // client on its first read), never answered.
    let r = tls_get(s.addr, &pki.connector(false, &[]), "/peer").await;
    assert!(r.is_err(), "an anonymous client was served");
}

#[tokio::test]
async fn mutual_tls_optional_serves_anonymous_clients_without_names() {
    let pki = Pki::new();
    let s = start(
        limits(),
        Some(pki.settings(Some(ClientAuth::Optional))),
        Some(peer_router()),
    )
    .await;
    let a = tls_get(s.addr, &pki.connector(false, &[]), "/peer")
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["tls"], true);
    assert_eq!(v["cn"], serde_json::Value::Null);
    let a = tls_get(s.addr, &pki.connector(true, &[]), "/peer")
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["cn"], "alice");

    // Plain server: PeerInfo says so.
    let s = start(limits(), None, Some(peer_router())).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get_req("/peer").as_bytes()).await.unwrap();
    let a = read_answer(&mut c).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["tls"], false);
    assert_eq!(v["remote"], c.local_addr().unwrap().to_string());
}

// ------------------------------------------------------------- HTTP/2

/// An HTTP/2 client connection (prior knowledge) over `io`; the sender and
/// the connection task (which ends when the server closes).
async fn h2_client<I>(
    io: I,
) -> (
    hyper::client::conn::http2::SendRequest<axum::body::Body>,
    JoinHandle<()>,
)
where
    I: AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(io),
    )
    .await
    .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<axum::body::Body>,
    path: &str,
) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
    let req =
        hyper::Request::get(format!("http://localhost{path}")).body(axum::body::Body::empty())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), 1 << 20).await?;
    Ok((status, body.to_vec()))
}

#[tokio::test]
async fn http2_cleartext_is_served_and_idles_out_and_can_be_turned_off() {
    let s = start(limits(), None, Some(peer_router())).await;
    let (mut sender, task) = h2_client(TcpStream::connect(s.addr).await.unwrap()).await;
    // Concurrent streams on one connection, one outliving the idle timeout.
    let mut slow = sender.clone();
    let long = tokio::spawn(async move { h2_get(&mut slow, "/sleep/2500").await });
    let (status, body) = h2_get(&mut sender, "/peer").await.unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["tls"], false);
    let (status, body) = long.await.unwrap().unwrap();
    assert_eq!((status, body.as_slice()), (200, b"slept".as_slice()));
    // Then idle: the server ends the connection.
    tokio::time::timeout(limits().idle_timeout + MARGIN, task)
        .await
        .expect("an idle HTTP/2 connection was not closed")
        .unwrap();

    // HTTP/2 off: the prior-knowledge preface gets no HTTP/2 answer.
    let l = ServerLimits {
        http2_max_streams: None,
        ..limits()
    };
    let s = start(l, None, Some(peer_router())).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let (got, closed) = read_to_close(&mut c, MARGIN).await;
    assert!(closed);
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

#[tokio::test]
async fn http2_over_mutual_tls_names_the_client() {
    let pki = Pki::new();
    let s = start(
        limits(),
        Some(pki.settings(Some(ClientAuth::Required))),
        Some(peer_router()),
    )
    .await;
    let tls = tls_connect(s.addr, &pki.connector(true, &[b"h2"]))
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
    let (mut sender, _task) = h2_client(tls).await;
    let (status, body) = h2_get(&mut sender, "/peer").await.unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (v["tls"].clone(), v["cn"].clone()),
        (true.into(), "alice".into())
    );
}

#[tokio::test]
async fn a_stalled_http2_reader_is_cut_within_the_write_timeout() {
    let s = start(limits(), None, None).await;
    let len = 4usize << 20;
    let data = content(len, 19);
    let put = reqwest::Client::new()
        .put(format!("{}/v1/blobs/big2", s.base()))
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    let (mut sender, task) = h2_client(TcpStream::connect(s.addr).await.unwrap()).await;
    // The response head arrives; the body is never read, so the stream's
    // flow-control window is never reopened.
    let req = hyper::Request::get(format!("http://localhost/v1/blobs/big2/{}", digest(&data)))
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    tokio::time::timeout(limits().write_timeout + MARGIN, task)
        .await
        .expect("a stalled HTTP/2 reader was not cut")
        .unwrap();
    drop(resp);
}
