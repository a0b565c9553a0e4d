//! Commands run against a blobpool server over HTTP(S) (reqwest with
//! rustls), streaming both ways.
//!
//! Credentials: `--token` goes in an `Authorization: Bearer` header on
//! every request, and only over `https://` or to a loopback address unless
//! `--allow-insecure-http` says the network is trusted; credentials in the
//! URL (`http://user:pw@host`) are refused. Redirects are not followed.
//!
//! `get` asks for a verified (bao) stream (ADR-033) and writes only bytes
//! that bao-tree's decoder has checked against the digest, chunk group by
//! chunk group; a server that answers with plain bytes (one older than bao
//! streams) is read the old way, hashed whole and checked at the end.
//!
//! `put` of a file of at least [`RESUMABLE_MIN_BYTES`] goes through a
//! resumable upload session and survives dropped connections and server
//! restarts ([`session`]); stdin and smaller files are one streaming `PUT`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use reqwest::header::{
    HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RANGE,
};
use reqwest::{Certificate, Client, Identity, Response, StatusCode, Url};
use store_core::SweepReport;
use store_http::{
    HEADER_BAO_RANGE, HEADER_CREATED_AT, HEADER_DIGEST, HEADER_EXPECT_DIGEST, HEADER_SIZE,
    HEADER_TIER,
};
use store_ops::bao::{BaoDecodeError, BAO_MEDIA_TYPE};
use store_ops::{
    ErrorBody, HaveRequest, HaveResponse, PutResponse, StatResponse, DEFAULT_MAX_HAVE_DIGESTS,
};
use store_types::{Digest, Key, Namespace, Tier};
use tokio_util::io::{ReaderStream, StreamReader};

use crate::output::{missing, CliError, GetResult, HasResult, PutResult};
use crate::progress::{bar, ProgressRead};
use crate::transfer::{Sink, Source};

mod session;

pub use session::RESUMABLE_MIN_BYTES;

/// How to reach and authenticate to the server (the global flags).
#[derive(Clone, Debug, Default)]
pub struct RemoteOpts {
    /// API key sent as `Authorization: Bearer`.
    pub token: Option<String>,
    /// Allow credentials over plain `http://` to a non-loopback host.
    pub allow_insecure_http: bool,
    /// Extra PEM root certificates (added to the system's).
    pub ca_cert: Option<PathBuf>,
    /// Client certificate chain (PEM), for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<PathBuf>,
    /// Connect timeout (`None`: none).
    pub connect_timeout: Option<Duration>,
    /// Per-read (idle) timeout (`None`: none). Not a total deadline, so a
    /// long transfer that keeps moving is never cut.
    pub read_timeout: Option<Duration>,
}

/// A blobpool server.
pub struct Remote {
    /// The base URL, without a trailing `/`.
    pub base: String,
    /// Requests whose answer starts promptly: `--timeout` bounds each
    /// read, including the wait for the response headers.
    http: Client,
    /// Requests whose answer may legitimately take long to start (a put's
    /// answer comes after its whole upload; a sweep's after the sweep):
    /// no reqwest read timeout (it would bound the wait for the headers
    /// from the request's start); puts are watched by [`IdleWatch`].
    http_slow: Client,
    /// `--timeout`.
    read_timeout: Option<Duration>,
    progress: bool,
}

/// Checks `--server URL` against the options and returns the base URL
/// (without a trailing `/`). Usage errors: no `http://`/`https://` scheme;
/// credentials, a query or a fragment in the URL; a token over plain HTTP
/// to a host that is not loopback without `--allow-insecure-http`.
pub fn check_server_url(url: &str, opts: &RemoteOpts) -> Result<String, CliError> {
    let raw = url.trim();
    let lower = raw.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(CliError::usage(format!(
            "--server {raw:?} has no http:// or https:// scheme: write \
             https://{raw} (or http://{raw} for a server without TLS)",
            raw = raw.split_once("://").map_or(raw, |(_, rest)| rest)
        )));
    }
    let parsed = Url::parse(raw)
        .map_err(|e| CliError::usage(format!("--server {raw:?} is not a valid URL: {e}")))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(CliError::usage(
            "--server must not carry credentials (user:password@host): \
             pass an API key with --token or BLOBPOOL_TOKEN instead",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(CliError::usage(format!(
            "--server {raw:?} must not have a query or fragment"
        )));
    }
    let host = parsed.host_str().unwrap_or("");
    if parsed.scheme() == "http"
        && opts.token.is_some()
        && !opts.allow_insecure_http
        && !is_loopback(&parsed)
    {
        return Err(CliError::usage(format!(
            "refusing to send --token over plain http:// to {host}, which is not a \
             loopback address (anyone on the path could read it): use https://, \
             or pass --allow-insecure-http if this network is trusted"
        )));
    }
    Ok(parsed.as_str().trim_end_matches('/').to_string())
}

/// Whether the URL's host is a loopback address or `localhost`.
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => {
            let d = bare.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
    }
}

fn read_pem(path: &Path, flag: &str) -> Result<Vec<u8>, CliError> {
    std::fs::read(path)
        .map_err(|e| CliError::config(format!("{flag} {}: cannot read: {e}", path.display())))
}

/// An error and its sources on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

fn transport(e: reqwest::Error) -> CliError {
    let code = if e.is_timeout() { "timeout" } else { "http" };
    let mut msg = error_chain(&e);
    if msg.contains("UnknownIssuer") || msg.contains("invalid peer certificate") {
        msg.push_str(
            " (a server with a self-signed or private-CA certificate needs --ca-cert FILE \
             or BLOBPOOL_CA_CERT)",
        );
    }
    CliError::new(code, msg)
}

/// The server's structured error, or a generic one.
async fn server_error(resp: Response) -> CliError {
    let status = resp.status();
    match resp.json::<ErrorBody>().await {
        Ok(b) => CliError::new(b.error.code, b.error.message),
        Err(_) => CliError::new("http", format!("server answered {status}")),
    }
}

/// Chunk groups [`Remote::confirm_corrupt`] asks about after a cut bao
/// stream (1 MiB at 16 KiB groups: more than a server keeps in flight).
const CONFIRM_GROUPS: u64 = 64;

/// Whether a response is a bao stream (its `Content-Type`).
fn is_bao(h: &HeaderMap) -> bool {
    h.get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(BAO_MEDIA_TYPE))
}

/// A client with the options' TLS, credentials and connect timeout, and
/// `read_timeout` per read.
fn client(opts: &RemoteOpts, read_timeout: Option<Duration>) -> Result<Client, CliError> {
    let mut b = Client::builder()
        // The server never redirects; following one could carry the
        // token elsewhere (or a streamed body nowhere).
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("blobpool/", env!("CARGO_PKG_VERSION")));
    if let Some(t) = opts.connect_timeout {
        b = b.connect_timeout(t);
    }
    if let Some(t) = read_timeout {
        b = b.read_timeout(t);
    }
    if let Some(token) = &opts.token {
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| CliError::usage("--token must be printable ASCII without spaces"))?;
        v.set_sensitive(true);
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, v);
        b = b.default_headers(h);
    }
    if let Some(ca) = &opts.ca_cert {
        let pem = read_pem(ca, "--ca-cert")?;
        let certs = Certificate::from_pem_bundle(&pem).map_err(|e| {
            CliError::config(format!(
                "--ca-cert {}: not a PEM certificate bundle: {e}",
                ca.display()
            ))
        })?;
        if certs.is_empty() {
            return Err(CliError::config(format!(
                "--ca-cert {}: no certificate in the file",
                ca.display()
            )));
        }
        b = b.tls_certs_merge(certs);
    }
    match (&opts.client_cert, &opts.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read_pem(cert, "--client-cert")?;
            pem.push(b'\n');
            pem.extend(read_pem(key, "--client-key")?);
            let id = Identity::from_pem(&pem).map_err(|e| {
                CliError::config(format!(
                    "--client-cert {} / --client-key {}: {}",
                    cert.display(),
                    key.display(),
                    error_chain(&e)
                ))
            })?;
            b = b.identity(id);
        }
        (None, None) => {}
        _ => {
            return Err(CliError::usage(
                "--client-cert and --client-key go together",
            ))
        }
    }
    b.build().map_err(|e| CliError::new("tls", error_chain(&e)))
}

/// Watches a streamed upload for a server that stops taking data:
/// `--timeout` is the longest time the request may go with its body
/// neither wanted by the connection nor finished, not counting time spent
/// waiting for the source (a slow stdin is not the server's fault), nor
/// a long upload that keeps moving. After the body ends it bounds the wait
/// for the answer. (reqwest's own read timeout runs from the request's
/// start until the headers, so it would cut any upload longer than it.)
#[derive(Clone)]
struct IdleWatch(Arc<Mutex<IdleState>>);

struct IdleState {
    /// When the body was last polled for, or handed, a chunk.
    last: Instant,
    /// Whether the body is waiting on its source.
    in_source: bool,
}

impl IdleWatch {
    fn new() -> Self {
        IdleWatch(Arc::new(Mutex::new(IdleState {
            last: Instant::now(),
            in_source: false,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, IdleState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `stream`, reporting to this watch.
    fn watch<S: Stream + Unpin>(&self, stream: S) -> Watched<S> {
        Watched {
            inner: stream,
            watch: self.clone(),
        }
    }

    /// Runs `send` until it answers, or fails with code `timeout` once the
    /// upload has been idle for `limit` (`None`: never).
    async fn run(
        &self,
        limit: Option<Duration>,
        send: impl std::future::Future<Output = reqwest::Result<Response>>,
    ) -> Result<Response, CliError> {
        let Some(limit) = limit else {
            return send.await.map_err(transport);
        };
        tokio::pin!(send);
        loop {
            let wake = {
                let s = self.state();
                if s.in_source {
                    Instant::now() + limit
                } else if s.last.elapsed() >= limit {
                    return Err(CliError::new(
                        "timeout",
                        format!(
                            "the server took no data and sent no answer for {} (--timeout)",
                            fmt_secs(limit)
                        ),
                    ));
                } else {
                    s.last + limit
                }
            };
            tokio::select! {
                r = &mut send => return r.map_err(transport),
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }
}

fn fmt_secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// A body stream reporting its polls to an [`IdleWatch`].
struct Watched<S> {
    inner: S,
    watch: IdleWatch,
}

impl<S: Stream + Unpin> Stream for Watched<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let r = Pin::new(&mut self.inner).poll_next(cx);
        let mut s = self.watch.state();
        s.in_source = r.is_pending();
        s.last = Instant::now();
        r
    }
}

impl Remote {
    /// `fut` within `--timeout` (code `timeout` past it).
    async fn within<T>(&self, fut: impl std::future::Future<Output = T>) -> Result<T, CliError> {
        match self.read_timeout {
            None => Ok(fut.await),
            Some(t) => tokio::time::timeout(t, fut).await.map_err(|_| {
                CliError::new(
                    "timeout",
                    format!("no answer from the server for {} (--timeout)", fmt_secs(t)),
                )
            }),
        }
    }

    /// A client of the server at `url` (`http[s]://host[:port][/prefix]`),
    /// after the checks of [`check_server_url`].
    pub fn new(url: &str, opts: &RemoteOpts, progress: bool) -> Result<Self, CliError> {
        let base = check_server_url(url, opts)?;
        Ok(Remote {
            base,
            http: client(opts, opts.read_timeout)?,
            http_slow: client(opts, None)?,
            read_timeout: opts.read_timeout,
            progress,
        })
    }

    fn blob_url(&self, key: &Key) -> String {
        format!("{}/v1/blobs/{}/{}", self.base, key.namespace, key.digest)
    }

    /// Stores `src` in `ns` and returns the server's answer. With
    /// `release`, the pin token is released right after.
    ///
    /// A regular file of at least [`RESUMABLE_MIN_BYTES`] goes through a
    /// resumable upload session (see [`session`]): hashed locally first,
    /// then sent in chunks that survive a dropped connection or a server
    /// restart; a server without upload sessions gets the plain put.
    /// Everything else (stdin, smaller files) is one streaming
    /// `PUT /v1/blobs/{ns}` (with `Content-Length` when the length is
    /// known, chunked otherwise).
    ///
    /// Cancel-safe in that nothing is ever published partially: dropping
    /// the future drops the connection; an open upload session is left on
    /// the server until it expires (`upload_idle_timeout`), and a put the
    /// server had already stored keeps its pin until the token's TTL.
    pub async fn put(
        &self,
        ns: &Namespace,
        src: &Source,
        expect: Option<Digest>,
        release: bool,
    ) -> Result<PutResult, CliError> {
        let body = match src {
            Source::File(path) => {
                let (file, len) = crate::transfer::open_file(path).await?;
                if len >= RESUMABLE_MIN_BYTES {
                    self.put_resumable(ns, path, file, len, expect).await?
                } else {
                    drop(file);
                    self.put_plain(ns, src, expect).await?
                }
            }
            Source::Stdin => self.put_plain(ns, src, expect).await?,
        };
        self.after_put(ns, body, release).await
    }

    /// One streaming `PUT /v1/blobs/{ns}` of `src`.
    async fn put_plain(
        &self,
        ns: &Namespace,
        src: &Source,
        expect: Option<Digest>,
    ) -> Result<PutResponse, CliError> {
        let (reader, len) = src.open().await?;
        let pb = bar(self.progress, len, "put");
        let stream = ReaderStream::with_capacity(ProgressRead::new(reader, pb.clone()), 256 * 1024);
        let watch = IdleWatch::new();
        let mut req = self
            .http_slow
            .put(format!("{}/v1/blobs/{ns}", self.base))
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(watch.watch(stream)));
        if let Some(n) = len {
            req = req.header(CONTENT_LENGTH, n);
        }
        if let Some(d) = expect {
            req = req.header(HEADER_EXPECT_DIGEST, d.to_hex());
        }
        let sent = watch.run(self.read_timeout, req.send()).await;
        pb.finish_and_clear();
        let resp = sent?;
        if !resp.status().is_success() {
            return Err(self.within(server_error(resp)).await?);
        }
        self.within(resp.json()).await?.map_err(transport)
    }

    /// The result of a put the server answered with `body`, its token
    /// released first with `release`.
    async fn after_put(
        &self,
        ns: &Namespace,
        body: PutResponse,
        release: bool,
    ) -> Result<PutResult, CliError> {
        let (token, released) = match body.token {
            // A cache namespace issues no token (ADR-048): its cache key
            // protects the entry.
            None => (None, None),
            Some(token) if release => {
                if let Err(e) = self.release(&token).await {
                    return Err(CliError::new(
                        e.code,
                        format!(
                            "stored {} but releasing its pin token failed ({}); the token {} \
                             still holds the entry: release it with \
                             `blobpool --server {} release {}`",
                            body.digest, e.message, token, self.base, token
                        ),
                    ));
                }
                (None, Some(true))
            }
            Some(token) => (Some(token), None),
        };
        Ok(PutResult {
            namespace: ns.to_string(),
            digest: body.digest,
            size: None,
            tier: None,
            deduplicated: None,
            token,
            released,
        })
    }

    /// `DELETE /v1/tokens/{token}`.
    pub async fn release(&self, token: &str) -> Result<(), CliError> {
        if token.is_empty()
            || !token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        {
            return Err(CliError::usage(format!("{token:?} is not a pin token")));
        }
        let resp = self
            .http
            .delete(format!("{}/v1/tokens/{token}", self.base))
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        Ok(())
    }

    /// `GET /v1/blobs/{ns}/{digest}`, streamed into `sink`, verified as it
    /// arrives.
    ///
    /// The request asks for a bao stream (`Accept: application/x-bao`):
    /// each 16 KiB chunk group is checked against the digest by bao-tree's
    /// decoder before it reaches `sink`, so a corrupt byte stops the output
    /// before it is written (memory: one group). A server that answers
    /// with plain bytes is hashed as it streams and checked at the end (a
    /// file sink is then discarded; stdout has had the bytes). A server
    /// that found the entry corrupt aborts the stream; the error is then
    /// `verification` once the server confirms it (see
    /// [`Remote::confirm_corrupt`]), `http` for a plain cut.
    ///
    /// Cancel-safe: dropping the future drops the sink (a file sink's
    /// temporary file is removed with it; stdout keeps the verified bytes
    /// written so far) and the connection.
    pub async fn get(&self, key: &Key, mut sink: Sink) -> Result<GetResult, CliError> {
        let sent = self
            .http
            .get(self.blob_url(key))
            .header(
                ACCEPT,
                format!("{BAO_MEDIA_TYPE}, application/octet-stream;q=0.5"),
            )
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                sink.abort().await;
                return Err(transport(e));
            }
        };
        if !resp.status().is_success() {
            sink.abort().await;
            return Err(server_error(resp).await);
        }
        if is_bao(resp.headers()) {
            return self.get_bao(key, resp, sink).await;
        }
        let len = resp.content_length();
        let pb = bar(self.progress, len, "get");
        let mut hasher = blake3::Hasher::new();
        let mut n: u64 = 0;
        let mut stream = resp.bytes_stream();
        let copied: Result<(), CliError> = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(transport)?;
                hasher.update(&chunk);
                n += chunk.len() as u64;
                pb.inc(chunk.len() as u64);
                sink.write_all(&chunk).await?;
            }
            Ok(())
        }
        .await;
        pb.finish_and_clear();
        let checked = copied.and_then(|()| {
            let actual = Digest::from(hasher.finalize());
            if actual != key.digest || len.is_some_and(|l| l != n) {
                return Err(CliError::from(store_types::Error::Verification {
                    expected: key.digest,
                    actual,
                }));
            }
            Ok(())
        });
        if let Err(e) = checked {
            sink.abort().await;
            return Err(e);
        }
        let path = sink.path().map(|p| p.display().to_string());
        sink.commit().await?;
        Ok(GetResult {
            namespace: key.namespace.to_string(),
            digest: key.digest.to_hex(),
            size: n,
            path,
        })
    }

    /// The bao half of [`Remote::get`]: decodes `resp` into `sink`.
    async fn get_bao(&self, key: &Key, resp: Response, sink: Sink) -> Result<GetResult, CliError> {
        let h = resp.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
        let bad = |what: &str| CliError::new("http", format!("server sent a bad {what} header"));
        let checked = match (
            text(HEADER_SIZE).and_then(|v| v.parse::<u64>().ok()),
            text(HEADER_DIGEST),
        ) {
            (None, _) => Err(bad(HEADER_SIZE)),
            (Some(_), Some(d)) if d != key.digest.to_hex() => Err(bad(HEADER_DIGEST)),
            // No range was asked for: a ranged answer is not this entry.
            _ if h.contains_key(HEADER_BAO_RANGE) => Err(bad(HEADER_BAO_RANGE)),
            (Some(size), _) => Ok(size),
        };
        let size = match checked {
            Ok(size) => size,
            Err(e) => {
                sink.abort().await;
                return Err(e);
            }
        };
        self.decode_into(key, resp, size, None, sink).await
    }

    /// `range` (`start..end`, bytes) of the entry, streamed into `sink`
    /// verified as it arrives: a bao request with `Range`, decoded by
    /// bao-tree's decoder group by group against the digest, so no
    /// unverified byte reaches `sink`. A server that answers a range
    /// without a bao encoding (an older one, whose `206` cannot be checked
    /// here) is refused (`http`), nothing written. An empty range, or one
    /// past the end, is the server's `416` (`invalid_range`).
    ///
    /// Cancel-safe as [`Remote::get`].
    pub async fn get_range(
        &self,
        key: &Key,
        range: std::ops::Range<u64>,
        sink: Sink,
    ) -> Result<GetResult, CliError> {
        if range.start >= range.end {
            sink.abort().await;
            return Err(CliError::new(
                "invalid_range",
                format!("the range {}..{} is empty", range.start, range.end),
            ));
        }
        let sent = self
            .http
            .get(self.blob_url(key))
            .header(ACCEPT, BAO_MEDIA_TYPE)
            .header(RANGE, format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await;
        let resp = match sent {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                sink.abort().await;
                return Err(server_error(r).await);
            }
            Err(e) => {
                sink.abort().await;
                return Err(transport(e));
            }
        };
        let h = resp.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
        let want = format!("{}-{}", range.start, range.end - 1);
        let size = match (
            is_bao(h),
            text(HEADER_SIZE).and_then(|v| v.parse::<u64>().ok()),
            text(HEADER_DIGEST),
            text(HEADER_BAO_RANGE),
        ) {
            (true, Some(size), Some(d), Some(r)) if d == key.digest.to_hex() && r == want => size,
            (false, ..) => {
                sink.abort().await;
                return Err(CliError::new(
                    "http",
                    "the server answered the range without a bao encoding, which cannot be                      verified here; nothing was written",
                ));
            }
            _ => {
                sink.abort().await;
                return Err(CliError::new(
                    "http",
                    "the server's bao answer does not name this entry and range",
                ));
            }
        };
        self.decode_into(key, resp, size, Some(range), sink).await
    }

    /// Decodes the bao body of `resp` (the entry `key` of `size` bytes, or
    /// `range` of it) into `sink`, which gets only verified bytes and is
    /// committed once the stream decoded to its end (aborted otherwise).
    /// Cancel-safe as [`Remote::get`].
    async fn decode_into(
        &self,
        key: &Key,
        resp: Response,
        size: u64,
        range: Option<std::ops::Range<u64>>,
        mut sink: Sink,
    ) -> Result<GetResult, CliError> {
        let start = range.as_ref().map_or(0, |r| r.start);
        let want = range.as_ref().map_or(size, |r| r.end - r.start);
        let pb = bar(self.progress, Some(want), "get");
        let body = StreamReader::new(resp.bytes_stream().map_err(std::io::Error::other));
        let decoded = store_ops::bao::decode(key.digest, size, range, body);
        futures::pin_mut!(decoded);
        let mut n: u64 = 0;
        let copied: Result<(), CliError> = async {
            while let Some(chunk) = decoded.next().await {
                match chunk {
                    Ok(c) => {
                        n += c.len() as u64;
                        pb.inc(c.len() as u64);
                        sink.write_all(&c).await?;
                    }
                    Err(e) => return Err(self.bao_failure(key, e, start + n).await),
                }
            }
            Ok(())
        }
        .await;
        pb.finish_and_clear();
        if let Err(e) = copied {
            sink.abort().await;
            return Err(e);
        }
        let path = sink.path().map(|p| p.display().to_string());
        sink.commit().await?;
        Ok(GetResult {
            namespace: key.namespace.to_string(),
            digest: key.digest.to_hex(),
            size: n,
            path,
        })
    }

    /// The error of a bao stream that did not decode after `verified`
    /// good bytes: `verification` when the stream proved the bytes wrong,
    /// or when it was cut and the server confirms the entry is corrupt
    /// there; `http` (with the decoder's account as the cause) otherwise.
    async fn bao_failure(&self, key: &Key, e: BaoDecodeError, verified: u64) -> CliError {
        if e.is_mismatch() {
            return CliError::new("verification", e.to_string()).caused_by(&e);
        }
        if let Some(confirmed) = self.confirm_corrupt(key, verified).await {
            return CliError::new(
                "verification",
                format!(
                    "{key}: the server stopped the stream after {verified} verified bytes: {}",
                    confirmed.message
                ),
            );
        }
        let msg = match &e {
            BaoDecodeError::Incomplete { .. } => {
                format!("{key}: the stream ended after {verified} verified bytes")
            }
            other => other.to_string(),
        };
        CliError::new("http", msg).caused_by(&e)
    }

    /// Asks the server whether the entry is corrupt where a bao stream was
    /// cut, `at` bytes in: a bao request for one byte reads that byte's
    /// chunk group before answering, so a corrupt group is answered `422
    /// verification` (the error returned here) rather than with a cut
    /// stream. The groups from `at` on are asked about one by one, up to
    /// [`CONFIRM_GROUPS`] of them (the server may have read a few groups
    /// past what reached this client before it found the bad one). `None`
    /// when none is refused (the cut was the network's) or on any other
    /// answer.
    async fn confirm_corrupt(&self, key: &Key, at: u64) -> Option<CliError> {
        let group = store_types::outboard::GROUP_SIZE as u64;
        let first = at / group * group;
        for i in 0..CONFIRM_GROUPS {
            let off = first + i * group;
            let resp = self
                .http
                .get(self.blob_url(key))
                .header(ACCEPT, BAO_MEDIA_TYPE)
                .header(RANGE, format!("bytes={off}-{off}"))
                .send()
                .await
                .ok()?;
            match resp.status() {
                StatusCode::UNPROCESSABLE_ENTITY => {
                    let e = self.within(server_error(resp)).await.ok()?;
                    return (e.code == "verification").then_some(e);
                }
                // Sound here (the body is dropped unread); the next group.
                s if s.is_success() => continue,
                // Past the end (416), or anything else: nothing to confirm.
                _ => return None,
            }
        }
        None
    }

    /// `HEAD /v1/blobs/{ns}/{digest}`.
    pub async fn stat(&self, key: &Key) -> Result<StatResponse, CliError> {
        let resp = self
            .http
            .head(self.blob_url(key))
            .send()
            .await
            .map_err(transport)?;
        match resp.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Err(missing(key)),
            s => return Err(CliError::new("http", format!("server answered {s}"))),
        }
        let h = resp.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        let bad = |what: &str| CliError::new("http", format!("server sent a bad {what} header"));
        let size = text(CONTENT_LENGTH.as_str())
            .parse()
            .map_err(|_| bad("Content-Length"))?;
        let tier = match text(HEADER_TIER) {
            "kv" => Tier::Kv,
            "large" => Tier::Large,
            _ => return Err(bad(HEADER_TIER)),
        };
        let created_at = text(HEADER_CREATED_AT)
            .parse()
            .map_err(|_| bad(HEADER_CREATED_AT))?;
        Ok(StatResponse {
            namespace: key.namespace.to_string(),
            digest: key.digest.to_hex(),
            size,
            tier,
            created_at,
        })
    }

    /// `POST /v1/have`, in batches of the server's default limit.
    pub async fn has(&self, ns: &Namespace, digests: &[Digest]) -> Result<HasResult, CliError> {
        let mut present = Vec::with_capacity(digests.len());
        for batch in digests.chunks(DEFAULT_MAX_HAVE_DIGESTS) {
            let req = HaveRequest {
                namespace: ns.to_string(),
                digests: batch.iter().map(Digest::to_hex).collect(),
                token: None,
            };
            let resp = self
                .http
                .post(format!("{}/v1/have", self.base))
                // Required by the server (a CSRF defence); `.json` sets it
                // too, but the contract is explicit here.
                .header(CONTENT_TYPE, "application/json")
                .json(&req)
                .send()
                .await
                .map_err(transport)?;
            if !resp.status().is_success() {
                return Err(server_error(resp).await);
            }
            let r: HaveResponse = resp.json().await.map_err(transport)?;
            if r.present.len() != batch.len() {
                return Err(CliError::new(
                    "http",
                    "the server's have answer is not index-aligned",
                ));
            }
            present.extend(r.present);
        }
        Ok(HasResult {
            namespace: ns.to_string(),
            digests: digests.iter().map(Digest::to_hex).collect(),
            present,
        })
    }

    /// `DELETE /v1/blobs/{ns}/{digest}`.
    pub async fn rm(&self, key: &Key) -> Result<(), CliError> {
        let resp = self
            .http
            .delete(self.blob_url(key))
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        Ok(())
    }

    /// `GET {path}` (an admin route: `ls`, `du`), decoded from JSON.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, CliError> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        resp.json().await.map_err(transport)
    }

    /// `POST {path}` with a JSON body, waiting however long the answer
    /// takes to start (`verify`), decoded from JSON.
    pub async fn post_json_slow<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CliError> {
        let resp = self
            .http_slow
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        resp.json().await.map_err(transport)
    }

    /// A JSON request to `path` (the reference routes): `body` sent as
    /// `application/json`, `headers` added; the answer's JSON, or `None`
    /// for an empty (`204`) answer.
    pub async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        headers: &[(&'static str, String)],
    ) -> Result<Option<serde_json::Value>, CliError> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req
                .header(CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let resp = req.send().await.map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        resp.json().await.map(Some).map_err(transport)
    }

    /// `POST /v1/sweep`.
    pub async fn sweep(&self) -> Result<SweepReport, CliError> {
        // A sweep answers when it is done, however long that takes.
        let resp = self
            .http_slow
            .post(format!("{}/v1/sweep", self.base))
            .header(CONTENT_TYPE, "application/json")
            .body("{}")
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        resp.json().await.map_err(transport)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, token: bool, insecure: bool) -> Result<String, CliError> {
        let opts = RemoteOpts {
            token: token.then(|| "bpk_t".to_string()),
            allow_insecure_http: insecure,
            ..Default::default()
        };
        check_server_url(url, &opts)
    }

    #[test]
    fn server_urls_need_a_scheme_and_no_userinfo() {
        assert_eq!(
            check("http://127.0.0.1:7070/", false, false).unwrap(),
            "http://127.0.0.1:7070"
        );
        assert_eq!(
            check("https://h.example/pool/", true, false).unwrap(),
            "https://h.example/pool"
        );
        for bad in [
            "127.0.0.1:7070",
            "localhost:7070",
            "h.example",
            "ftp://h",
            "http://u:p@h:1",
            "https://u@h:1",
            "http://h:1/?a=b",
            "http://",
        ] {
            let e = check(bad, false, false).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
        }
    }

    #[test]
    fn tokens_go_over_plain_http_only_to_loopback() {
        for ok in [
            "http://127.0.0.1:1",
            "http://127.8.9.1:1",
            "http://[::1]:1",
            "http://localhost:1",
            "http://LOCALHOST.:1",
            "https://192.0.2.1:1",
        ] {
            check(ok, true, false).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for remote in [
            "http://192.0.2.1:1",
            "http://example.com",
            "http://[2001:db8::1]:1",
        ] {
            let e = check(remote, true, false).unwrap_err();
            assert!(
                e.is_usage() && e.message.contains("--allow-insecure-http"),
                "{e}"
            );
            check(remote, true, true).unwrap();
            check(remote, false, false).unwrap();
        }
    }
}
