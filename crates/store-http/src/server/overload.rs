//! Connections beyond the cap: a minimal `503 overloaded` answer
//! (`Retry-After: 1`, `Connection: close`) written by a short-lived task,
//! so the accept loop never waits on it.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use super::conn::Shared;

/// How long the `503 overloaded` answer may take to write, plus how long
/// the rejected connection's request is then read and discarded (so that
/// closing does not reset the connection before the client read the
/// answer).
const REJECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The body of the answer to a connection beyond the cap.
const OVERLOADED_BODY: &str =
    r#"{"error":{"code":"overloaded","message":"too many open connections; retry shortly"}}"#;

/// The whole `503 overloaded` answer.
fn overloaded_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         Retry-After: 1\r\n\
         Connection: close\r\n\
         Content-Type: application/json\r\n\
         Content-Length: {}\r\n\
         \r\n\
         {OVERLOADED_BODY}",
        OVERLOADED_BODY.len()
    )
}

/// Answers a connection beyond the cap with `503 overloaded` and closes
/// it, all within [`REJECT_TIMEOUT`].
pub(super) async fn reject(stream: TcpStream, shared: Arc<Shared>, _permit: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(REJECT_TIMEOUT, async move {
        match &shared.tls {
            None => answer_overloaded(stream).await,
            Some(tls) => {
                let stream = tls.acceptor().accept(stream).await?;
                if stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
                    // The client will speak HTTP/2: an HTTP/1 answer would
                    // be noise. Just close.
                    return Ok(());
                }
                answer_overloaded(stream).await
            }
        }
    })
    .await;
}

async fn answer_overloaded<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
    s.write_all(overloaded_response().as_bytes()).await?;
    s.flush().await?;
    s.shutdown().await?;
    // Read and discard what the client sends until it closes, so that
    // closing with unread data does not reset the connection before the
    // client read the answer.
    let mut buf = [0u8; 4096];
    let mut total = 0usize;
    while total < 64 * 1024 {
        match s.read(&mut buf).await? {
            0 => break,
            n => total += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overloaded_answer_is_well_formed() {
        let r = overloaded_response();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "overloaded");
    }
}
