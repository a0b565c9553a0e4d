//! The measurement behind ADR-074: how much memory a flood of large,
//! stalled gRPC messages makes the server hold.
//!
//! ```text
//! grpc_flood serve BUDGET_MIB        # 0: no budget (as before ADR-074)
//! grpc_flood flood ADDR STREAMS MIB  # STREAMS messages of MIB MiB each
//! ```
//!
//! `serve` prints `ADDR PID` and serves the tests' server (a store in a
//! temporary directory, no authentication) until killed. `flood` opens
//! `STREAMS` `BatchUpdateBlobs` calls over 4 connections, each sending
//! all of a message of `MIB` MiB but its last 16 bytes and then
//! stalling, so the server buffers what it accepts; it prints how many
//! calls were refused, and keeps the others open until killed. Compare
//! the server's `VmHWM` (`/proc/PID/status`) before and after.

#[path = "../tests/common/mod.rs"]
mod common;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tower_service::Service;

const UPDATE: &str = "/build.bazel.remote.execution.v2.ContentAddressableStorage/BatchUpdateBlobs";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(args[2].parse().expect("BUDGET_MIB")).await,
        Some("flood") => {
            let streams = args[3].parse().expect("STREAMS");
            flood(&args[2], streams, args[4].parse().expect("MIB")).await
        }
        _ => eprintln!("usage: grpc_flood serve BUDGET_MIB | flood ADDR STREAMS MIB"),
    }
}

async fn serve(budget_mib: usize) {
    let s = common::start_with(|g| {
        g.auth = store_ops::auth::Auth::open();
        g.message_memory = match budget_mib {
            0 => usize::MAX,
            n => n << 20,
        };
    })
    .await;
    println!("{} {}", s.addr, std::process::id());
    std::future::pending::<()>().await;
}

/// A request body: `first`, then nothing, ever.
struct Stall(Option<Bytes>);

impl http_body::Body for Stall {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
            None => Poll::Pending,
        }
    }
}

async fn flood(addr: &str, streams: usize, mib: usize) {
    let len = mib << 20;
    let mut msg = vec![0u8];
    msg.extend_from_slice(&(len as u32).to_be_bytes());
    msg.resize(5 + len - 16, 0x41);
    let msg = Bytes::from(msg);
    let mut channels = Vec::new();
    for _ in 0..4 {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        channels.push(ch);
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..streams {
        let mut ch = channels[i % channels.len()].clone();
        let body = tonic::body::Body::new(Stall(Some(msg.clone())));
        let req = axum::http::Request::post(UPDATE)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(body)
            .unwrap();
        let tx = tx.clone();
        tokio::spawn(async move {
            std::future::poll_fn(|cx| ch.poll_ready(cx)).await.unwrap();
            let r = ch.call(req).await;
            let status = r.map(|r| {
                let h = r.headers();
                h.get("grpc-status")
                    .map(|v| v.to_str().unwrap_or("?").to_string())
            });
            let _ = tx.send(format!("{status:?}"));
            std::future::pending::<()>().await;
        });
    }
    drop(tx);
    let mut answered = 0;
    while let Ok(Some(s)) = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await
    {
        answered += 1;
        if answered <= 3 {
            eprintln!("answer: {s}");
        }
    }
    println!("{streams} calls of {mib} MiB: {answered} answered (refused), the rest held open");
    std::future::pending::<()>().await;
}
