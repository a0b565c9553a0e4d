//! A release `blobpool serve` child for the benchmarks that drive the
//! binary (`bench-http`, `bench-grpc`): its configuration, its start and
//! the wait until it answers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::fixtures::{err, BenchResult};
use crate::httpload::{self, Req};

/// Fails, naming `build` (the command that builds them), unless every one
/// of `binaries` exists.
pub fn require_built(binaries: &[&Path], build: &str) -> BenchResult<()> {
    match binaries.iter().find(|b| !b.exists()) {
        Some(b) => Err(format!("{} is missing ({build})", b.display())),
        None => Ok(()),
    }
}

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> BenchResult<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    Ok(l.local_addr().map_err(err)?.port())
}

/// Polls `GET path` on `addr` (10 s at most) until it answers 200.
pub async fn wait_for(addr: SocketAddr, path: &str) -> BenchResult<()> {
    for _ in 0..100 {
        if let Ok(mut s) = httpload::connect(addr).await {
            if let Ok((200, _)) = httpload::send(&mut s, addr, &Req::get(path, None)).await {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{addr}{path} never answered 200"))
}

/// A `blobpool serve` child; killed on drop.
pub struct Blobpool {
    /// The process.
    pub child: Child,
    /// Where it listens (loopback).
    pub addr: SocketAddr,
    log: PathBuf,
}

impl Blobpool {
    /// Starts `blobpool --config <dir>/blobpool.toml serve` as `command`
    /// (the binary `blobpool`, or a wrapper such as `taskset` running it)
    /// on a free loopback port, its data in `<dir>/bp-data`, JSON logs at
    /// `warn` in `<dir>/blobpool.log`, and `settings` (TOML) after that.
    /// It may not be listening yet: see [`Blobpool::wait`].
    pub fn start(
        mut command: Command,
        blobpool: &Path,
        dir: &Path,
        settings: &str,
    ) -> BenchResult<Blobpool> {
        let port = free_port()?;
        let config = dir.join("blobpool.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{d}/bp-data\"\nlisten = \"127.0.0.1:{port}\"\n\
                 log_format = \"json\"\n{settings}",
                d = dir.display()
            ),
        )
        .map_err(err)?;
        let log = dir.join("blobpool.log");
        let child = command
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(err)?)
            .spawn()
            .map_err(|e| format!("{}: {e}", blobpool.display()))?;
        Ok(Blobpool {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
        })
    }

    /// Waits (10 s at most) until it answers `/health`; its log if not.
    pub async fn wait(&self) -> BenchResult<()> {
        wait_for(self.addr, "/health").await.map_err(|e| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            format!("blobpool: {e}: {log}")
        })
    }
}

impl Drop for Blobpool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
