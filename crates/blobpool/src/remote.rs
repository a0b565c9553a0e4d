//! Commands run against a blobpool server over HTTP (reqwest), streaming
//! both ways.

use futures::StreamExt;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::{Client, Response, StatusCode};
use store_core::SweepReport;
use store_ops::http::{HEADER_CREATED_AT, HEADER_EXPECT_DIGEST, HEADER_TIER};
use store_ops::{
    ErrorBody, HaveRequest, HaveResponse, PutResponse, StatResponse, DEFAULT_MAX_HAVE_DIGESTS,
};
use store_types::{Digest, Key, Namespace, Tier};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use crate::output::{missing, CliError, GetResult, HasResult, PutResult};
use crate::progress::{bar, ProgressRead};
use crate::transfer::{Sink, Source};

/// A blobpool server.
pub struct Remote {
    base: String,
    http: Client,
    progress: bool,
}

fn transport(e: reqwest::Error) -> CliError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    CliError::new("http", msg)
}

/// The server's structured error, or a generic one.
async fn server_error(resp: Response) -> CliError {
    let status = resp.status();
    match resp.json::<ErrorBody>().await {
        Ok(b) => CliError::new(b.error.code, b.error.message),
        Err(_) => CliError::new("http", format!("server answered {status}")),
    }
}

impl Remote {
    /// A client of the server at `base` (`http://host:port`).
    pub fn new(base: &str, progress: bool) -> Result<Self, CliError> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(CliError::new(
                "usage",
                format!("--server must be an http:// URL, got {base:?}"),
            ));
        }
        let http = Client::builder()
            .build()
            .map_err(|e| CliError::new("http", e.to_string()))?;
        Ok(Remote {
            base,
            http,
            progress,
        })
    }

    fn blob_url(&self, key: &Key) -> String {
        format!("{}/v1/blobs/{}/{}", self.base, key.namespace, key.digest)
    }

    /// `PUT /v1/blobs/{ns}`, streaming `src` (with `Content-Length` when its
    /// length is known, chunked otherwise). With `release`, the pin token is
    /// released right after.
    pub async fn put(
        &self,
        ns: &Namespace,
        src: &Source,
        expect: Option<Digest>,
        release: bool,
    ) -> Result<PutResult, CliError> {
        let (reader, len) = src.open().await?;
        let pb = bar(self.progress, len, "put");
        let stream = ReaderStream::with_capacity(ProgressRead::new(reader, pb.clone()), 256 * 1024);
        let mut req = self
            .http
            .put(format!("{}/v1/blobs/{ns}", self.base))
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(stream));
        if let Some(n) = len {
            req = req.header(CONTENT_LENGTH, n);
        }
        if let Some(d) = expect {
            req = req.header(HEADER_EXPECT_DIGEST, d.to_hex());
        }
        let sent = req.send().await;
        pb.finish_and_clear();
        let resp = sent.map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        let body: PutResponse = resp.json().await.map_err(transport)?;
        let token = if release {
            self.release(&body.token).await?;
            None
        } else {
            Some(body.token)
        };
        Ok(PutResult {
            namespace: ns.to_string(),
            digest: body.digest,
            size: None,
            tier: None,
            deduplicated: None,
            token,
        })
    }

    /// `DELETE /v1/tokens/{token}`.
    pub async fn release(&self, token: &str) -> Result<(), CliError> {
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

    /// `GET /v1/blobs/{ns}/{digest}`, streamed into `sink` and checked
    /// against the digest here as well (a server-side verification failure
    /// arrives as an aborted response).
    pub async fn get(&self, key: &Key, mut sink: Sink) -> Result<GetResult, CliError> {
        let resp = match self.http.get(self.blob_url(key)).send().await {
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
                sink.writer()
                    .write_all(&chunk)
                    .await
                    .map_err(|e| CliError::io("writing the output", e))?;
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

    /// `POST /v1/sweep`.
    pub async fn sweep(&self) -> Result<SweepReport, CliError> {
        let resp = self
            .http
            .post(format!("{}/v1/sweep", self.base))
            .send()
            .await
            .map_err(transport)?;
        if !resp.status().is_success() {
            return Err(server_error(resp).await);
        }
        resp.json().await.map_err(transport)
    }
}
