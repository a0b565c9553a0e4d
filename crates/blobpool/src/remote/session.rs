//! Resumable puts over the server's upload sessions (issue 15, ADR-034):
//! `put --server FILE` of a file of at least [`RESUMABLE_MIN_BYTES`].
//!
//! 1. The file is hashed locally (BLAKE3, on a blocking thread): the
//!    finish names the digest, and an `--expect` digest is checked here,
//!    before anything is sent.
//! 2. `POST /v1/uploads/{ns}` opens a session. A server without sessions
//!    (`404`/`405`: uploads disabled, or a server older than them) or one
//!    at its session cap (`503 too_many_uploads`) gets the plain streaming
//!    put instead, with the digest as its expected digest. A failure to
//!    reach the server here is not retried: nothing is uploaded yet, and
//!    a server that is down at the start fails the command at once, like
//!    every other command.
//! 3. `PATCH` sends [`CHUNK_BYTES`] at a time from the committed offset
//!    (`Content-Range: bytes a-b/*`). A dropped connection, a timeout, a
//!    `502`/`503`/`504` (`unavailable`, `overloaded`), `incomplete_body` or
//!    `upload_busy` (an earlier request of the session, e.g. one whose
//!    connection died, still being processed) is retried after a pause of
//!    [`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`]: first `HEAD` learns
//!    the committed offset, then the upload continues from there (the
//!    progress bar moves back to it). A `416 upload_offset` names the
//!    committed offset in `Upload-Offset`, and the upload continues there.
//!    [`MAX_RETRIES`] failures in a row without the committed offset
//!    moving end the put.
//! 4. `PUT {session}?digest=<hex>` finishes: the server stores the spooled
//!    bytes through its ordinary put and answers like one. A finish whose
//!    answer was lost is retried; if the session is gone by then (the lost
//!    finish did store the content), the file is put the plain way (the
//!    server deduplicates it, but it is sent once more).
//!
//! Any other error (`verification`, `missing`, `forbidden`, `internal`, a
//! local read error …) ends the put: the session is deleted (best effort)
//! and the error returned. A session left behind by a killed CLI expires
//! on the server after its `upload_idle_timeout`.

use std::io::{Read, SeekFrom};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use indicatif::ProgressBar;
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE};
use reqwest::{Response, StatusCode};
use store_http::HEADER_UPLOAD_OFFSET;
use store_ops::uploads::UploadStatus;
use store_ops::PutResponse;
use store_types::{Digest, Namespace};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{fmt_secs, server_error, transport, IdleWatch, Remote};
use crate::output::CliError;
use crate::progress::bar;
use crate::transfer::Source;

/// Files at least this large (8 MiB) are put through a resumable upload
/// session; smaller ones, and stdin, go in one plain `PUT`.
pub const RESUMABLE_MIN_BYTES: u64 = 8 << 20;

/// Bytes per `PATCH` (8 MiB): what an interruption can cost at most, and
/// what the CLI holds in memory at once.
pub const CHUNK_BYTES: u64 = 8 << 20;

/// The first pause before a retry; each further failure in a row doubles
/// it, up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(500);

/// The longest pause between retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(8);

/// Failures in a row (with no committed progress between them) after
/// which a resumable put gives up: about 40 s of pauses at
/// [`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`], enough for a server
/// restart or a short network outage.
pub const MAX_RETRIES: u32 = 8;

/// The slowest rate the finish is allowed to take to re-read the spooled
/// bytes (16 MiB/s): the finish may stay silent for `--timeout` plus the
/// size at this rate before it counts as timed out.
const FINISH_MIN_RATE: f64 = (16 << 20) as f64;

/// Body pieces of a chunk (the progress bar moves by these).
const PIECE: usize = 256 * 1024;

/// What one request on a session came to.
enum Step<T> {
    /// Done: its result.
    Done(T),
    /// The server has a different committed offset (`416`): go on there.
    At(u64),
    /// Worth retrying after a pause (the error, if the retries run out).
    Retry(CliError),
    /// Not worth retrying: the put fails with this.
    Fatal(CliError),
}

/// Counts failures in a row; progress (a larger committed offset) resets
/// the count.
struct Retries {
    failures: u32,
    best: u64,
}

impl Retries {
    fn new() -> Self {
        Retries {
            failures: 0,
            best: 0,
        }
    }

    /// Records a failure with `offset` committed; the pause before the
    /// next try, or `None` when the retries are spent.
    fn failed(&mut self, offset: u64) -> Option<Duration> {
        if offset > self.best {
            self.best = offset;
            self.failures = 0;
        }
        self.failures += 1;
        (self.failures <= MAX_RETRIES).then(|| backoff(self.failures))
    }
}

/// The pause before retry `n` (1-based).
fn backoff(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(16);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

/// An open session.
struct Session {
    /// Its id.
    id: String,
    /// Its URL (under the `--server` base, whatever `Location` says, so a
    /// path prefix of a reverse proxy is kept).
    url: String,
}

/// Whether a session id can go into a URL path as it is.
fn url_safe(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// The `Upload-Offset` header of `resp`.
fn upload_offset(resp: &Response) -> Option<u64> {
    resp.headers()
        .get(HEADER_UPLOAD_OFFSET)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Whether a failed answer with `status` and error `code` is worth
/// retrying: the server (or a proxy in front of it) is briefly unable, or
/// the session is still busy with an earlier request.
fn retryable(status: StatusCode, code: &str) -> bool {
    matches!(
        code,
        "unavailable" | "overloaded" | "upload_busy" | "incomplete_body"
    ) || matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// A local read failure of `path`.
fn read_error(path: &Path, e: std::io::Error) -> CliError {
    CliError::io(&format!("cannot read {}", path.display()), e)
}

/// Hashes `file` (`len` bytes) on a blocking thread, on a "hash" bar;
/// returns it (at an unspecified position) with its digest.
async fn hash_file(
    file: tokio::fs::File,
    path: &Path,
    len: u64,
    progress: bool,
) -> Result<(tokio::fs::File, Digest), CliError> {
    let mut f = file.into_std().await;
    let pb = bar(progress, Some(len), "hash");
    let bar_ = pb.clone();
    let hashed = tokio::task::spawn_blocking(move || {
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut n: u64 = 0;
        loop {
            let got = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            h.update(&buf[..got]);
            n += got as u64;
            bar_.inc(got as u64);
        }
        Ok((f, Digest::from(h.finalize()), n))
    })
    .await;
    pb.finish_and_clear();
    let (f, digest, n) = hashed
        .map_err(|e| CliError::new("internal", format!("the hashing task failed: {e}")))?
        .map_err(|e| read_error(path, e))?;
    if n != len {
        return Err(changed(path));
    }
    Ok((tokio::fs::File::from_std(f), digest))
}

/// The error of a file that changed while it was put.
fn changed(path: &Path) -> CliError {
    CliError::new(
        "io",
        format!(
            "{} changed while it was being put (its length or content differs from \
             when it was hashed)",
            path.display()
        ),
    )
}

/// `n` bytes of `file` from `offset`.
async fn read_chunk(
    file: &mut tokio::fs::File,
    path: &Path,
    offset: u64,
    n: u64,
) -> Result<Bytes, CliError> {
    let len = usize::try_from(n).map_err(|_| CliError::new("internal", "chunk too large"))?;
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(offset))
        .await
        .map_err(|e| read_error(path, e))?;
    match file.read_exact(&mut buf).await {
        Ok(_) => Ok(Bytes::from(buf)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(changed(path)),
        Err(e) => Err(read_error(path, e)),
    }
}

impl Remote {
    /// A put of the regular file `path` (open as `file`, `len` bytes)
    /// through a resumable upload session, or a plain put when the server
    /// offers none; see the [module docs](self).
    ///
    /// Cancel-safe in that nothing is published partially: dropping the
    /// future leaves the session on the server until it expires.
    pub(super) async fn put_resumable(
        &self,
        ns: &Namespace,
        path: &Path,
        file: tokio::fs::File,
        len: u64,
        expect: Option<Digest>,
    ) -> Result<PutResponse, CliError> {
        let (file, digest) = hash_file(file, path, len, self.progress).await?;
        if let Some(expected) = expect {
            if expected != digest {
                return Err(CliError::from(store_types::Error::Verification {
                    expected,
                    actual: digest,
                }));
            }
        }
        let plain = Source::File(path.to_path_buf());
        let Some((session, offset)) = self.open_session(ns).await? else {
            return self.put_plain(ns, &plain, Some(digest)).await;
        };
        let pb = bar(self.progress, Some(len), "put");
        let sent = self
            .upload(&session, file, path, len, offset, digest, &pb)
            .await;
        pb.finish_and_clear();
        match sent {
            Ok(Some(body)) => Ok(body),
            // The session ended with a finish whose answer was lost.
            Ok(None) => self.put_plain(ns, &plain, Some(digest)).await,
            Err(e) => {
                self.abort_session(&session).await;
                Err(e)
            }
        }
    }

    /// `POST /v1/uploads/{ns}`: the new session and its offset, or `None`
    /// when the server has no sessions to offer (see the module docs).
    async fn open_session(&self, ns: &Namespace) -> Result<Option<(Session, u64)>, CliError> {
        let resp = self
            .http
            .post(format!("{}/v1/uploads/{ns}", self.base))
            // Required like every POST (a browser cannot send it
            // cross-site without a preflight).
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .send()
            .await
            .map_err(transport)?;
        match resp.status() {
            StatusCode::CREATED => {}
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => return Ok(None),
            _ => {
                let e = self.within(server_error(resp)).await?;
                if e.code == "too_many_uploads" {
                    return Ok(None);
                }
                return Err(e);
            }
        }
        let st: UploadStatus = self.within(resp.json()).await?.map_err(transport)?;
        if !url_safe(&st.id) {
            return Err(CliError::new(
                "http",
                format!("the server named an upload session {:?}", st.id),
            ));
        }
        let url = format!("{}/v1/uploads/{ns}/{}", self.base, st.id);
        Ok(Some((Session { id: st.id, url }, st.offset)))
    }

    /// Sends the file from `offset` on and finishes the session; `None`
    /// when the session is gone after a finish whose answer was lost.
    #[allow(clippy::too_many_arguments)]
    async fn upload(
        &self,
        session: &Session,
        mut file: tokio::fs::File,
        path: &Path,
        len: u64,
        mut offset: u64,
        digest: Digest,
        pb: &ProgressBar,
    ) -> Result<Option<PutResponse>, CliError> {
        let mut retries = Retries::new();
        retries.best = offset;
        // Whether the committed offset must be asked for (after a failure).
        let mut resync = false;
        // Whether a finish was sent (its answer may have been lost).
        let mut finish_sent = false;
        loop {
            if resync {
                match self
                    .resync(session, &mut retries, offset, finish_sent, pb)
                    .await?
                {
                    Some(o) => {
                        offset = o;
                        resync = false;
                    }
                    None => return Ok(None),
                }
            }
            if offset > len {
                return Err(CliError::new(
                    "http",
                    format!(
                        "upload session {} holds {offset} bytes, more than the {len} of {}",
                        session.id,
                        path.display()
                    ),
                ));
            }
            pb.set_position(offset);
            let step = if offset == len {
                finish_sent = true;
                match self.finish(session, digest, len, path).await {
                    Step::Done(body) => return Ok(Some(body)),
                    Step::At(o) => Step::At(o),
                    Step::Retry(e) => Step::Retry(e),
                    Step::Fatal(e) => Step::Fatal(e),
                }
            } else {
                let n = CHUNK_BYTES.min(len - offset);
                let chunk = read_chunk(&mut file, path, offset, n).await?;
                self.append(session, offset, chunk, pb).await
            };
            match step {
                Step::Done(o) => offset = o,
                Step::At(o) if o != offset => offset = o,
                Step::At(o) => {
                    let e = CliError::new(
                        "upload_offset",
                        format!("the server refused a chunk at its own offset {o}"),
                    );
                    self.pause(&mut retries, offset, e, pb).await?;
                    resync = true;
                }
                Step::Retry(e) => {
                    self.pause(&mut retries, offset, e, pb).await?;
                    resync = true;
                }
                Step::Fatal(e) => return Err(e),
            }
        }
    }

    /// After a failure, the committed offset (`HEAD`, retried after
    /// pauses); `None` when the session is gone after a finish was sent
    /// (the finish stored the content, its answer was lost).
    async fn resync(
        &self,
        session: &Session,
        retries: &mut Retries,
        offset: u64,
        finish_sent: bool,
        pb: &ProgressBar,
    ) -> Result<Option<u64>, CliError> {
        loop {
            match self.session_offset(session).await {
                Step::Done(o) | Step::At(o) => return Ok(Some(o)),
                Step::Retry(e) => self.pause(retries, offset, e, pb).await?,
                Step::Fatal(e) if finish_sent && e.code == "missing" => return Ok(None),
                Step::Fatal(e) => return Err(e),
            }
        }
    }

    /// [`Remote::finish_session`], a `verification` failure saying that
    /// the file may have changed during the put.
    async fn finish(
        &self,
        session: &Session,
        digest: Digest,
        len: u64,
        path: &Path,
    ) -> Step<PutResponse> {
        match self.finish_session(session, digest, len).await {
            Step::Fatal(e) if e.code == "verification" => Step::Fatal(CliError::new(
                e.code,
                format!(
                    "{} (did {} change during the put?)",
                    e.message,
                    path.display()
                ),
            )),
            step => step,
        }
    }

    /// Waits before a retry, saying so on stderr (unless `--quiet`); `e`
    /// (saying the retries ran out) when they did.
    async fn pause(
        &self,
        retries: &mut Retries,
        offset: u64,
        e: CliError,
        pb: &ProgressBar,
    ) -> Result<(), CliError> {
        match retries.failed(offset) {
            Some(wait) => {
                if self.progress {
                    pb.suspend(|| {
                        eprintln!(
                            "blobpool: upload interrupted with {offset} bytes committed ({e}); \
                             resuming in {}",
                            fmt_secs(wait)
                        )
                    });
                }
                tokio::time::sleep(wait).await;
                Ok(())
            }
            None => Err(CliError {
                message: format!(
                    "{} (gave up after {MAX_RETRIES} retries in a row)",
                    e.message
                ),
                ..e
            }),
        }
    }

    /// The failure a non-success answer `resp` stands for.
    async fn failed_step<T>(&self, resp: Response) -> Step<T> {
        let status = resp.status();
        if status == StatusCode::RANGE_NOT_SATISFIABLE {
            if let Some(o) = upload_offset(&resp) {
                return Step::At(o);
            }
        }
        let e = match self.within(server_error(resp)).await {
            Ok(e) | Err(e) => e,
        };
        if retryable(status, &e.code) {
            Step::Retry(e)
        } else {
            Step::Fatal(e)
        }
    }

    /// `PATCH` of `chunk` at `offset`: the new committed offset.
    async fn append(
        &self,
        session: &Session,
        offset: u64,
        chunk: Bytes,
        pb: &ProgressBar,
    ) -> Step<u64> {
        let n = chunk.len();
        let pieces: Vec<Bytes> = (0..n)
            .step_by(PIECE)
            .map(|i| chunk.slice(i..(i + PIECE).min(n)))
            .collect();
        let bar_ = pb.clone();
        let stream = futures::stream::iter(pieces).map(move |b| {
            bar_.inc(b.len() as u64);
            Ok::<_, std::io::Error>(b)
        });
        let watch = IdleWatch::new();
        let last = offset + n as u64 - 1;
        let req = self
            .http_slow
            .patch(&session.url)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, n)
            .header(CONTENT_RANGE, format!("bytes {offset}-{last}/*"))
            .body(reqwest::Body::wrap_stream(watch.watch(stream)));
        let resp = match watch.run(self.read_timeout, req.send()).await {
            Ok(r) => r,
            Err(e) => return Step::Retry(e),
        };
        if !resp.status().is_success() {
            return self.failed_step(resp).await;
        }
        match upload_offset(&resp) {
            Some(o) => Step::Done(o),
            None => Step::Fatal(CliError::new(
                "http",
                format!("the server answered a chunk with no {HEADER_UPLOAD_OFFSET} header"),
            )),
        }
    }

    /// `HEAD` of the session: its committed offset. (Its errors have no
    /// body: the code is the status's.)
    async fn session_offset(&self, session: &Session) -> Step<u64> {
        let resp = match self.http.head(&session.url).send().await {
            Ok(r) => r,
            Err(e) => return Step::Retry(transport(e)),
        };
        let status = resp.status();
        if status.is_success() {
            return match upload_offset(&resp) {
                Some(o) => Step::Done(o),
                None => Step::Fatal(CliError::new(
                    "http",
                    format!("the server sent no {HEADER_UPLOAD_OFFSET} header"),
                )),
            };
        }
        let (code, what) = match status {
            StatusCode::NOT_FOUND => (
                "missing",
                "is gone (finished, aborted, or expired after the server's upload_idle_timeout)",
            ),
            StatusCode::CONFLICT => (
                "upload_elsewhere",
                "is on another node (a load balancer sent this request elsewhere)",
            ),
            StatusCode::UNAUTHORIZED => ("unauthorized", "is refused: no or a wrong API key"),
            StatusCode::FORBIDDEN => ("forbidden", "belongs to another identity"),
            _ => ("http", "could not be asked about"),
        };
        let e = CliError::new(
            code,
            format!(
                "upload session {} {what} (server answered {status})",
                session.id
            ),
        );
        if retryable(status, code) {
            Step::Retry(e)
        } else {
            Step::Fatal(e)
        }
    }

    /// `PUT {session}?digest=`: the put's answer.
    async fn finish_session(
        &self,
        session: &Session,
        digest: Digest,
        len: u64,
    ) -> Step<PutResponse> {
        let req = self
            .http_slow
            .put(format!("{}?digest={}", session.url, digest.to_hex()))
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(Vec::new());
        let wait = self
            .read_timeout
            .map(|t| t + Duration::from_secs_f64(len as f64 / FINISH_MIN_RATE));
        let sent = match wait {
            None => req.send().await.map_err(transport),
            Some(w) => match tokio::time::timeout(w, req.send()).await {
                Ok(r) => r.map_err(transport),
                Err(_) => Err(CliError::new(
                    "timeout",
                    format!(
                        "no answer to finishing upload session {} for {}",
                        session.id,
                        fmt_secs(w)
                    ),
                )),
            },
        };
        let resp = match sent {
            Ok(r) => r,
            Err(e) => return Step::Retry(e),
        };
        if !resp.status().is_success() {
            return self.failed_step(resp).await;
        }
        match self.within(resp.json::<PutResponse>()).await {
            Ok(Ok(body)) => Step::Done(body),
            Ok(Err(e)) => Step::Retry(transport(e)),
            Err(e) => Step::Retry(e),
        }
    }

    /// `DELETE` of the session, best effort (a failure is only logged: the
    /// server reaps it when it idles out).
    async fn abort_session(&self, session: &Session) {
        let r = self
            .within(self.http.delete(&session.url).send())
            .await
            .and_then(|r| r.map_err(transport));
        match r {
            Ok(resp) if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND => {}
            Ok(resp) => tracing::debug!(
                "deleting upload session {}: server answered {}",
                session.id,
                resp.status()
            ),
            Err(e) => tracing::debug!("deleting upload session {}: {e}", session.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let waits: Vec<_> = (1..=7).map(backoff).collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 8000, 8000].map(Duration::from_millis)
        );
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn retries_run_out_unless_the_offset_moves() {
        let mut r = Retries::new();
        for _ in 0..MAX_RETRIES {
            assert!(r.failed(0).is_some());
        }
        assert_eq!(r.failed(0), None, "spent");
        // Progress starts the count again, at the first pause.
        assert_eq!(r.failed(1), Some(BACKOFF_FIRST));
    }

    #[test]
    fn only_brief_failures_are_retried() {
        for (status, code) in [
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            (StatusCode::CONFLICT, "upload_busy"),
            (StatusCode::BAD_REQUEST, "incomplete_body"),
            (StatusCode::BAD_GATEWAY, "http"),
            (StatusCode::GATEWAY_TIMEOUT, "http"),
        ] {
            assert!(retryable(status, code), "{status} {code}");
        }
        for (status, code) in [
            (StatusCode::CONFLICT, "upload_elsewhere"),
            (StatusCode::NOT_FOUND, "missing"),
            (StatusCode::UNPROCESSABLE_ENTITY, "verification"),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            (StatusCode::FORBIDDEN, "forbidden"),
            (StatusCode::BAD_REQUEST, "http"),
        ] {
            assert!(!retryable(status, code), "{status} {code}");
        }
    }

    #[test]
    fn session_ids_must_be_url_safe() {
        assert!(url_safe("a1b2-00ff"));
        for bad in ["", "a/b", "a?b", "../x", "a b"] {
            assert!(!url_safe(bad), "{bad}");
        }
    }
}
