//! A throwaway bucket on a local S3-compatible server, for tests
//! (features `testing` and `s3`).
//!
//! The server must already run (for instance `moto_server -H 127.0.0.1 -p
//! 5000`) at `BLOBPOOL_TEST_S3_ENDPOINT` (default
//! `http://127.0.0.1:5000`). Tests using it fail — they never skip — when
//! it cannot be reached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use object_store::ObjectStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{ObjectEngine, ObjectOptions};

/// The environment variable naming the test server.
pub const S3_ENDPOINT_VAR: &str = "BLOBPOOL_TEST_S3_ENDPOINT";

/// The test server used when [`S3_ENDPOINT_VAR`] is unset.
pub const DEFAULT_S3_ENDPOINT: &str = "http://127.0.0.1:5000";

/// The test server's endpoint.
pub fn s3_endpoint() -> String {
    std::env::var(S3_ENDPOINT_VAR).unwrap_or_else(|_| DEFAULT_S3_ENDPOINT.to_string())
}

/// A fresh bucket on the test server, emptied and removed on drop.
#[derive(Debug)]
pub struct TestBucket {
    /// The server, `http://host:port`.
    pub endpoint: String,
    /// The bucket's name.
    pub name: String,
}

impl TestBucket {
    /// Creates a bucket with a unique name. Panics, naming
    /// [`S3_ENDPOINT_VAR`], when the server cannot be reached.
    pub async fn create() -> TestBucket {
        static N: AtomicU64 = AtomicU64::new(0);
        let endpoint = s3_endpoint();
        let tag = store_types::layout::random_salt() ^ N.fetch_add(1, Ordering::Relaxed);
        let name = format!("bp-test-{tag:016x}-{}", N.load(Ordering::Relaxed));
        match http(&endpoint, "PUT", &name).await {
            Ok((200, _)) => {}
            Ok((status, _)) => panic!(
                "S3 tests: creating bucket {name} at {S3_ENDPOINT_VAR}={endpoint} \
                 answered HTTP {status}"
            ),
            Err(e) => panic!(
                "S3 tests need an S3-compatible server: cannot reach \
                 {S3_ENDPOINT_VAR}={endpoint}: {e}. Start one (`moto_server -H 127.0.0.1 \
                 -p 5000`, see README / .ci/run) or set {S3_ENDPOINT_VAR}."
            ),
        }
        TestBucket { endpoint, name }
    }

    /// `s3://<bucket>/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.name)
    }

    /// object_store configuration for the test server.
    pub fn config(&self) -> Vec<(&'static str, String)> {
        vec![
            ("aws_endpoint", self.endpoint.clone()),
            ("aws_allow_http", "true".to_string()),
            ("aws_access_key_id", "test".to_string()),
            ("aws_secret_access_key", "test".to_string()),
            ("aws_region", "us-east-1".to_string()),
        ]
    }

    /// An engine on `s3://<bucket>/<prefix>`.
    pub async fn engine(&self, prefix: &str, options: ObjectOptions) -> ObjectEngine {
        ObjectEngine::from_url_with(&self.url(prefix), options, self.config())
            .await
            .expect("open object engine on the test bucket")
    }

    /// Keys of the bucket's multipart uploads in progress (started, neither
    /// completed nor aborted), from `ListMultipartUploads`.
    pub async fn incomplete_uploads(&self) -> Vec<String> {
        let (status, body) = http(&self.endpoint, "GET", &format!("{}?uploads", self.name))
            .await
            .expect("listing multipart uploads");
        assert_eq!(status, 200, "listing multipart uploads: {body}");
        body.split("<Upload>")
            .skip(1)
            .filter_map(|u| {
                let k = u.split_once("<Key>")?.1;
                Some(k.split_once("</Key>")?.0.to_string())
            })
            .collect()
    }

    /// A plain store client for the bucket.
    pub fn store(&self) -> std::sync::Arc<dyn ObjectStore> {
        crate::backend_from_url(&self.url(""), self.config())
            .expect("S3 test store")
            .store
    }
}

impl Drop for TestBucket {
    fn drop(&mut self) {
        let store = self.store();
        let endpoint = self.endpoint.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime: use a private one on a thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let locations = store.list(None).filter_map(|m| async move { m.ok() });
                let locations = locations.map(|m| Ok(m.location)).boxed();
                let _ = store.delete_stream(locations).collect::<Vec<_>>().await;
                let _ = http(&endpoint, "DELETE", &name).await;
            })
        })
        .join();
    }
}

/// A bare `METHOD /<bucket>` request (the test server does not check
/// signatures); returns the status code and the body.
async fn http(endpoint: &str, method: &str, bucket: &str) -> std::io::Result<(u16, String)> {
    let authority = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("the test endpoint must be http://host:port"))?
        .trim_end_matches('/');
    let connect = tokio::net::TcpStream::connect(authority);
    let mut conn = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))??;
    let req = format!(
        "{method} /{bucket} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await?;
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut resp))
        .await
        .map_err(|_| std::io::Error::other("no answer"))??;
    let resp = String::from_utf8_lossy(&resp).to_string();
    let head = resp.get(..64).unwrap_or(&resp);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {head:?}")))?;
    let body = resp
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}
