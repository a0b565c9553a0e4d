//! `static-server --root DIR --listen ADDR`: a minimal hyper 1 static-file
//! server, the second HTTP anchor of `bench-http` beside nginx. GET of a
//! file under DIR: the file is opened once and `fstat`ed on the runtime's
//! thread (the benchmark's files are in the page cache, as nginx assumes
//! too; no hop to a blocking pool), files up to 1 MiB read whole from that
//! handle, larger ones streamed from it in 256 KiB chunks with a
//! `Content-Length`.
//! HTTP/1.1 keep-alive, tokio's multi-threaded runtime, no cache, no
//! verification, no authentication: it refuses to listen anywhere but on
//! loopback. Prints `listening ADDR` once bound.

use std::convert::Infallible;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

type Body = BoxBody<Bytes, std::io::Error>;

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
    *r.status_mut() = code;
    r
}

fn resolve(root: &Path, uri_path: &str) -> Option<PathBuf> {
    let rel = Path::new(uri_path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

async fn serve(
    root: Arc<PathBuf>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.method() != hyper::Method::GET {
        return Ok(status(StatusCode::METHOD_NOT_ALLOWED));
    }
    let Some(path) = resolve(&root, req.uri().path()) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(_) => return Ok(status(StatusCode::NOT_FOUND)),
    };
    let len = match file.metadata() {
        Ok(m) if m.is_file() => m.len(),
        _ => return Ok(status(StatusCode::NOT_FOUND)),
    };
    let body = if len <= 1 << 20 {
        let mut v = Vec::with_capacity(len as usize);
        match std::io::Read::read_to_end(&mut file, &mut v) {
            Ok(_) => Full::new(Bytes::from(v)).map_err(|e| match e {}).boxed(),
            Err(_) => return Ok(status(StatusCode::INTERNAL_SERVER_ERROR)),
        }
    } else {
        let chunks = futures::stream::unfold(file, |mut f| async move {
            let mut buf = vec![0u8; 256 * 1024];
            match std::io::Read::read(&mut f, &mut buf) {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(Frame::data(Bytes::from(buf))), f))
                }
                Err(e) => Some((Err(e), f)),
            }
        });
        StreamBody::new(chunks).boxed()
    };
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(hyper::header::CONTENT_LENGTH, len.into());
    Ok(r)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut root, mut listen) = (None, "127.0.0.1:0".to_string());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => root = args.next().map(PathBuf::from),
            "--listen" => listen = args.next().ok_or("--listen needs an address")?,
            _ => {
                return Err(
                    format!("usage: static-server --root DIR [--listen ADDR] (got {a:?})").into(),
                )
            }
        }
    }
    let root = Arc::new(root.ok_or("--root is required")?);
    // A benchmark anchor with no authentication: loopback only.
    let addr: std::net::SocketAddr = listen.parse()?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "static-server serves files unauthenticated: {addr} is not a loopback address"
        )
        .into());
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let root = root.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| serve(root.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        let root = Path::new("/srv");
        assert_eq!(
            resolve(root, "/files/a"),
            Some(PathBuf::from("/srv/files/a"))
        );
        assert_eq!(resolve(root, "/../etc/passwd"), None);
        assert_eq!(
            resolve(root, "/files/./a"),
            Some(PathBuf::from("/srv/files/a"))
        );
    }
}
