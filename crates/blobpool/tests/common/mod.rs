//! A real HTTP server on an ephemeral loopback port over sqlite + local
//! engines in a temporary directory, plus helpers.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use store_core::{LivenessSource, Mode, Store};
use store_local::{LocalEngine, LocalOptions};
use store_ops::{Ops, OpsConfig};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Key, Namespace};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub mod build_cache;

/// Server settings for a test.
pub struct Opts {
    pub threshold: u64,
    pub window: Duration,
    pub token_ttl: Duration,
    pub max_tokens: usize,
    pub max_blob_size: u64,
    pub unreferenced: Vec<&'static str>,
    /// Per-identity token cap.
    pub max_tokens_per_owner: Option<usize>,
    /// Authentication, Host/CORS policy, limits, TLS (default: open).
    pub http: store_http::HttpConfig,
    /// Resumable uploads (spooled in `<dir>/uploads`): idle expiry.
    pub upload_idle: Duration,
    /// Resumable uploads: sessions per identity.
    pub max_uploads_per_owner: usize,
    /// Resumable uploads: bytes all sessions, and one identity's, may hold.
    pub upload_max_bytes: (u64, u64),
    /// Whether resumable uploads are enabled at all (`false`: the
    /// `/v1/uploads` routes answer 404, as on a server without them).
    pub uploads: bool,
    /// Cache namespaces (ADR-048) and their bounds.
    pub cache: Vec<(&'static str, store_core::CacheBounds)>,
    /// Cache namespaces' own base paths (`http_path`): path, namespace.
    pub cache_paths: Vec<(&'static str, &'static str)>,
    /// Write-once cache namespaces (`immutable = true`, ADR-052).
    pub immutable: Vec<&'static str>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            threshold: 1024,
            window: Duration::from_secs(3600),
            token_ttl: Duration::from_secs(600),
            max_tokens: 10_000,
            max_blob_size: store_ops::DEFAULT_MAX_BLOB_SIZE,
            unreferenced: vec![],
            max_tokens_per_owner: None,
            http: Default::default(),
            upload_idle: store_ops::uploads::DEFAULT_UPLOAD_IDLE_TIMEOUT,
            max_uploads_per_owner: store_ops::uploads::DEFAULT_MAX_UPLOADS_PER_OWNER,
            upload_max_bytes: (
                store_ops::uploads::DEFAULT_MAX_UPLOAD_BYTES,
                store_ops::uploads::DEFAULT_MAX_UPLOAD_BYTES_PER_OWNER,
            ),
            uploads: true,
            cache: vec![],
            cache_paths: vec![],
            immutable: vec![],
        }
    }
}

pub struct Server {
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub ops: Ops,
    pub kv: SqliteEngine,
    pub large: LocalEngine,
    pub http: reqwest::Client,
    pub dir: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
}

struct NothingReferenced;

#[async_trait::async_trait]
impl LivenessSource for NothingReferenced {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
        Ok(vec![false; keys.len()])
    }
}

pub async fn start(opts: Opts) -> Server {
    start_in(tempfile::tempdir().unwrap(), opts).await
}

/// [`start`] on the data (store and upload sessions) left in `dir`.
pub async fn start_in(dir: tempfile::TempDir, opts: Opts) -> Server {
    start_in_at(dir, opts, "127.0.0.1:0".parse().unwrap()).await
}

/// [`start_in`] listening on `addr` (port 0: an ephemeral one).
pub async fn start_in_at(dir: tempfile::TempDir, opts: Opts, addr: std::net::SocketAddr) -> Server {
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
        .mode(Mode::DualTier {
            threshold: opts.threshold,
        })
        .window(opts.window)
        .build()
        .await
        .unwrap();
    for ns in &opts.unreferenced {
        store
            .gc()
            .register_liveness_source(Namespace::new(*ns).unwrap(), Arc::new(NothingReferenced))
            .await
            .unwrap();
    }
    for (ns, bounds) in &opts.cache {
        store
            .set_gc_policy(
                Namespace::new(*ns).unwrap(),
                store_core::GcPolicy::Cache(*bounds),
            )
            .await
            .unwrap();
    }
    let ops = Ops::new(
        store,
        OpsConfig {
            cache_namespaces: opts
                .cache
                .iter()
                .map(|(ns, _)| Namespace::new(*ns).unwrap())
                .collect(),
            cache_paths: opts
                .cache_paths
                .iter()
                .map(|(p, ns)| (p.to_string(), Namespace::new(*ns).unwrap()))
                .collect(),
            immutable_caches: opts
                .immutable
                .iter()
                .map(|ns| Namespace::new(*ns).unwrap())
                .collect(),
            max_blob_size: opts.max_blob_size,
            token_ttl: Some(opts.token_ttl),
            max_tokens: opts.max_tokens,
            max_tokens_per_owner: opts.max_tokens_per_owner,
            uploads: opts.uploads.then(|| store_ops::uploads::UploadConfig {
                idle_timeout: opts.upload_idle,
                max_sessions_per_owner: opts.max_uploads_per_owner,
                max_bytes: opts.upload_max_bytes.0,
                max_bytes_per_owner: opts.upload_max_bytes.1,
                ..store_ops::uploads::UploadConfig::new(dir.path().join("uploads"))
            }),
            ..Default::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(store_http::serve_with(
        listener,
        ops.clone(),
        opts.http,
        async move {
            let _ = rx.await;
        },
    ));
    Server {
        base: format!("http://{addr}"),
        addr,
        ops,
        kv,
        large,
        http: reqwest::Client::new(),
        dir,
        shutdown: Some(tx),
        handle: Some(handle),
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn store(&self) -> &Store {
        self.ops.store()
    }

    /// Stops the server (as a process exit would: the store and its
    /// instance locks go) and starts a new one on the same data.
    pub async fn restart(mut self, opts: Opts) -> Server {
        let handle = self.begin_shutdown();
        handle.await.unwrap().unwrap();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        drop(self);
        start_in(dir, opts).await
    }

    /// [`Server::restart`] on the same address, so clients reconnect to
    /// the new server. Requests still open when the old one's
    /// `drain_timeout` runs out are cut: start it with a drain timeout of
    /// a millisecond to cut them as a crash would.
    pub async fn restart_at_same_addr(mut self, opts: Opts) -> Server {
        let handle = self.begin_shutdown();
        handle.await.unwrap().unwrap();
        let addr = self.addr;
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        drop(self);
        start_in_at(dir, opts, addr).await
    }

    /// Triggers graceful shutdown; returns the serve task.
    pub fn begin_shutdown(&mut self) -> JoinHandle<std::io::Result<()>> {
        let _ = self.shutdown.take().unwrap().send(());
        self.handle.take().unwrap()
    }

    /// `PUT /v1/blobs/{ns}` with an in-memory body (Content-Length known).
    pub async fn put(&self, ns: &str, body: impl Into<Bytes>) -> reqwest::Response {
        self.http
            .put(self.url(&format!("/v1/blobs/{ns}")))
            .body(body.into())
            .send()
            .await
            .unwrap()
    }

    /// Puts and returns (token, digest), asserting success.
    pub async fn put_ok(&self, ns: &str, body: impl Into<Bytes>) -> (String, String) {
        let resp = self.put(ns, body).await;
        assert!(resp.status().is_success(), "put failed: {}", resp.status());
        let v: serde_json::Value = resp.json().await.unwrap();
        (
            v["token"].as_str().unwrap().to_string(),
            v["digest"].as_str().unwrap().to_string(),
        )
    }

    pub async fn post_json(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn have(&self, body: serde_json::Value) -> reqwest::Response {
        self.post_json("/v1/have", body.to_string()).await
    }

    /// `POST /v1/have`, expecting 200; the `present` list.
    pub async fn have_ok(&self, body: serde_json::Value) -> Vec<bool> {
        let resp = self.have(body).await;
        assert_eq!(resp.status(), 200);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(keys(&v), set(&["present"]));
        v["present"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_bool().unwrap())
            .collect()
    }

    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.http.delete(self.url(path)).send().await.unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.unwrap()
    }

    /// Whether no entry exists in `ns` on either tier.
    pub async fn ns_is_empty(&self, ns: &str) -> bool {
        use store_types::Engine;
        let ns = Namespace::new(ns).unwrap();
        self.large.scan(&ns, None, 1).await.unwrap().is_empty()
            && self.kv.scan(&ns, None, 1).await.unwrap().is_empty()
    }

    /// Whether no entry exists anywhere.
    pub async fn store_is_empty(&self) -> bool {
        use store_types::Engine;
        for ns in self.large.namespaces().await.unwrap() {
            if !self.large.scan(&ns, None, 1).await.unwrap().is_empty() {
                return false;
            }
        }
        for ns in self.kv.namespaces().await.unwrap() {
            if !self.kv.scan(&ns, None, 1).await.unwrap().is_empty() {
                return false;
            }
        }
        true
    }
}

/// The key set of a JSON object.
pub fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object()
        .expect("a JSON object")
        .keys()
        .cloned()
        .collect()
}

pub fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Asserts a structured error answer: status, exact shape, code.
pub async fn assert_error(resp: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(resp.status().as_u16(), status, "status");
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(ct.as_deref(), Some("application/json"));
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(keys(&v), set(&["error"]), "{v}");
    let e = &v["error"];
    let expected = if code == "gc_refuse" {
        set(&["code", "message", "reason"])
    } else {
        set(&["code", "message"])
    };
    assert_eq!(keys(e), expected, "{v}");
    assert_eq!(e["code"], code, "{v}");
    assert!(!e["message"].as_str().unwrap().is_empty());
    v
}

/// Deterministic pseudo-random content, generated in chunks.
pub fn content(len: u64, seed: u64) -> impl Iterator<Item = Bytes> {
    const CHUNK: u64 = 1 << 20;
    let mut off = 0u64;
    std::iter::from_fn(move || {
        if off >= len {
            return None;
        }
        let n = CHUNK.min(len - off);
        let mut v = Vec::with_capacity(n as usize);
        let mut x = seed ^ off.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push((x >> 24) as u8);
        }
        off += n;
        Some(Bytes::from(v))
    })
}

pub fn digest_of(len: u64, seed: u64) -> String {
    let mut h = blake3::Hasher::new();
    for c in content(len, seed) {
        h.update(&c);
    }
    h.finalize().to_hex().to_string()
}

pub fn bytes_of(len: u64, seed: u64) -> Vec<u8> {
    content(len, seed).flat_map(|b| b.to_vec()).collect()
}

/// A streaming request body of generated content.
pub fn stream_body(len: u64, seed: u64) -> reqwest::Body {
    reqwest::Body::wrap_stream(futures::stream::iter(
        content(len, seed).map(Ok::<_, std::io::Error>),
    ))
}

/// Hashes a response body as it streams; (digest, length).
pub async fn hash_body(resp: reqwest::Response) -> Result<(String, u64), reqwest::Error> {
    use futures::StreamExt;
    let mut h = blake3::Hasher::new();
    let mut n = 0u64;
    let mut s = resp.bytes_stream();
    while let Some(c) = s.next().await {
        let c = c?;
        n += c.len() as u64;
        h.update(&c);
    }
    Ok((h.finalize().to_hex().to_string(), n))
}

/// Polls `f` until it holds or `secs` pass.
pub async fn eventually<F, Fut>(secs: u64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An API key named `name` for `secret` with `scopes` (`read`,
/// `write:ns-*`, …).
pub fn api_key(name: &str, secret: &str, scopes: &[&str]) -> store_ops::auth::ApiKey {
    use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Grant};
    ApiKey {
        name: name.into(),
        hash: parse_key_hash(&hash_key(secret)).unwrap(),
        grants: Grant::parse_all(scopes).unwrap(),
    }
}

/// A server with `keys` and nothing for anonymous callers.
pub async fn start_with_keys(keys: Vec<store_ops::auth::ApiKey>, opts: Opts) -> Server {
    start(Opts {
        http: store_http::HttpConfig {
            auth: store_ops::auth::Auth::new(keys, vec![], vec![]).unwrap(),
            ..Default::default()
        },
        ..opts
    })
    .await
}

/// A log sink for a process-wide JSON subscriber (one test per file).
#[derive(Clone, Default)]
pub struct Captured(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Installs the process-wide JSON subscriber for `blobpool::audit`
    /// lines (once per test binary: one such test per file) and answers
    /// its sink.
    pub fn audit_log() -> Captured {
        let log = Captured::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .json()
            .with_env_filter("blobpool::audit=info")
            .with_writer(move || writer.clone())
            .init();
        log
    }

    /// The audit lines captured: (identity, action, target, outcome).
    pub fn audit_lines(&self) -> Vec<(String, String, String, String)> {
        self.lines()
            .into_iter()
            .filter(|l| l["target"] == "blobpool::audit")
            .map(|l| {
                let f = &l["fields"];
                let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
                (s("identity"), s("action"), s("target"), s("outcome"))
            })
            .collect()
    }

    /// Every line captured, parsed as JSON.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The `blobpool` binary, run in `dir` with none of the test process's
/// `BLOBPOOL_*` variables and no stdin.
pub fn blobpool_in(dir: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_blobpool"));
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBPOOL_") {
            c.env_remove(k);
        }
    }
    c.stdin(std::process::Stdio::null());
    c
}

/// A `blobpool serve` child process, killed when dropped (if still running).
pub struct ServeChild(pub std::process::Child);

impl Drop for ServeChild {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `blobpool serve --listen 127.0.0.1:0` in `dir` (warnings only on
/// stderr); the child and its base URL, as [`serve_command`].
pub fn serve_child(dir: &std::path::Path) -> (ServeChild, String) {
    serve_command(
        blobpool_in(dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn"),
    )
}

/// Starts `blobpool --config <dir>/blobpool.toml serve` in `dir` (warnings
/// only on stderr) with `config` written to that file; the child and its
/// base URL, as [`serve_command`].
pub fn serve_child_with_config(dir: &std::path::Path, config: &str) -> (ServeChild, String) {
    let path = dir.join("blobpool.toml");
    std::fs::write(&path, config).unwrap();
    serve_command(
        blobpool_in(dir)
            .arg("--config")
            .arg(&path)
            .arg("serve")
            .env("RUST_LOG", "warn"),
    )
}

/// Spawns `c` (a `blobpool serve` command) with its stderr piped, waits for
/// the address it prints and drains the rest of stderr so the server never
/// blocks on it; the child and its base URL (`http://127.0.0.1:PORT`).
pub fn serve_command(c: &mut std::process::Command) -> (ServeChild, String) {
    let s = serve_lines(c).unwrap_or_else(|seen| panic!("serve prints its address:\n{seen}"));
    (s.child, s.base)
}

/// A `blobpool serve` child that printed its address ([`serve_lines`]).
pub struct Serving {
    pub child: ServeChild,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub base: String,
    /// The stderr lines printed before the address.
    pub startup: Vec<String>,
    /// The stderr lines after it, as they come (stderr is read to its end
    /// whether they are taken or not).
    pub lines: std::sync::mpsc::Receiver<String>,
}

/// [`serve_command`] keeping stderr: the lines before the address and a
/// channel of those after it. `Err`: the stderr lines printed when the
/// child ended (or printed no address for 60 s) without listening.
pub fn serve_lines(c: &mut std::process::Command) -> Result<Serving, String> {
    use std::io::BufRead as _;
    let mut child = c.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let child = ServeChild(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut startup = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) {
        if let Some(rest) = line.strip_prefix("blobpool: listening on ") {
            let base = rest.trim().to_string();
            return Ok(Serving {
                child,
                base,
                startup,
                lines,
            });
        }
        startup.push(line);
    }
    Err(startup.iter().map(|l| format!("{l}\n")).collect())
}

/// `GET path` over a plain connection to `base`, with `bearer` as the
/// token if any; the whole answer (status line, headers, body).
pub fn plain_get(base: &str, path: &str, bearer: Option<&str>) -> String {
    use std::io::{Read as _, Write as _};
    let addr = base.trim_start_matches("http://");
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}
