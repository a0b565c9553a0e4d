//! A real server for the gRPC tests: a store over the sqlite and local
//! engines in a temporary directory with the cache namespace `cc`, upload
//! sessions, two API keys, and the gRPC routes mounted beside an HTTP
//! router, served by hyper (HTTP/1 and HTTP/2) on an ephemeral loopback
//! port. Clients are tonic's, generated from the same protos.
#![allow(dead_code)]

use std::sync::Arc;

use store_core::{CacheBounds, GcPolicy, Mode, Store};
use store_grpc::proto::build::bazel::remote::execution::v2 as re;
use store_grpc::proto::google::bytestream as bs;
use store_local::{LocalEngine, LocalOptions};
use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Auth, Grant};
use store_ops::{Ops, OpsConfig};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::Namespace;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A key that may read and write every namespace.
pub const FULL: &str = "bpk_full_secret";
/// A key that may only read.
pub const READ_ONLY: &str = "bpk_read_only_secret";

pub struct Server {
    pub addr: std::net::SocketAddr,
    pub ops: Ops,
    pub dir: tempfile::TempDir,
}

fn key(name: &str, secret: &str, scopes: &[&str]) -> ApiKey {
    ApiKey {
        name: name.into(),
        hash: parse_key_hash(&hash_key(secret)).unwrap(),
        grants: Grant::parse_all(scopes).unwrap(),
    }
}

async fn store(dir: &std::path::Path) -> Store {
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let local = LocalOptions {
        shared_media: false,
        fsync: false,
        ..LocalOptions::default()
    };
    let large = LocalEngine::open(dir.join("large"), local).await.unwrap();
    let store = Store::builder()
        .kv(kv)
        .large(large)
        .mode(Mode::DualTier { threshold: 4096 })
        .build()
        .await
        .unwrap();
    let bounds = CacheBounds {
        max_bytes: None,
        max_age: None,
    };
    let ns = Namespace::new("cc").unwrap();
    store
        .set_gc_policy(ns, GcPolicy::Cache(bounds))
        .await
        .unwrap();
    store
}

/// Starts the server (it runs until the test's runtime ends).
pub async fn start() -> Server {
    start_with(|_| {}).await
}

/// The two API keys ([`FULL`], [`READ_ONLY`]).
pub fn keys() -> Vec<ApiKey> {
    vec![
        key("full", FULL, &["read", "write"]),
        key("reader", READ_ONLY, &["read"]),
    ]
}

/// The app [`start_with`] serves: the gRPC routes over `ops` with
/// `grpc`, mounted beside an HTTP router answering `/health`.
pub fn app(ops: Ops, grpc: store_grpc::GrpcConfig) -> axum::Router {
    let http = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
    store_grpc::mount(http, ops, grpc)
}

/// Starts the server with the gRPC configuration `tweak` leaves (from
/// the two keys' authentication and the defaults).
pub async fn start_with(tweak: impl FnOnce(&mut store_grpc::GrpcConfig)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    let cfg = OpsConfig {
        cache_namespaces: [Namespace::new("cc").unwrap()].into_iter().collect(),
        uploads: Some(store_ops::uploads::UploadConfig {
            fsync: false,
            ..store_ops::uploads::UploadConfig::new(dir.path().join("uploads"))
        }),
        ..Default::default()
    };
    let ops = Ops::new(store, cfg).unwrap();
    let mut grpc = store_grpc::GrpcConfig {
        auth: Auth::new(keys(), vec![], vec![]).unwrap(),
        ..Default::default()
    };
    tweak(&mut grpc);
    let app = app(ops.clone(), grpc);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let svc = hyper_util::service::TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(tcp);
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                let _ = builder.serve_connection(io, svc).await;
            });
        }
    });
    Server { addr, ops, dir }
}

/// Adds `authorization: Bearer <key>` to every request (none for `None`).
#[derive(Clone)]
pub struct Bearer(pub Option<Arc<str>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(k) = &self.0 {
            let v = format!("Bearer {k}").parse().unwrap();
            req.metadata_mut().insert("authorization", v);
        }
        Ok(req)
    }
}

type Chan = InterceptedService<Channel, Bearer>;

/// The four clients, with one key.
pub struct Clients {
    pub caps: re::capabilities_client::CapabilitiesClient<Chan>,
    pub ac: re::action_cache_client::ActionCacheClient<Chan>,
    pub cas: re::content_addressable_storage_client::ContentAddressableStorageClient<Chan>,
    pub bs: bs::byte_stream_client::ByteStreamClient<Chan>,
}

impl Server {
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// A channel whose calls name `host` (`:authority`) while they go to
    /// the server's address (as after a DNS rebinding).
    pub async fn channel_naming(&self, host: &str) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .origin(format!("http://{host}").parse().unwrap())
            .connect()
            .await
            .unwrap()
    }

    /// Clients over `ch` sending `key` (`None`: no credentials).
    pub fn clients_on(&self, ch: Channel, key: Option<&str>) -> Clients {
        let b = Bearer(key.map(Arc::from));
        let limit = 16 << 20;
        Clients {
            caps: re::capabilities_client::CapabilitiesClient::with_interceptor(ch.clone(), b.clone()),
            ac: re::action_cache_client::ActionCacheClient::with_interceptor(ch.clone(), b.clone()),
            cas: re::content_addressable_storage_client::ContentAddressableStorageClient::with_interceptor(
                ch.clone(),
                b.clone(),
            )
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit),
            bs: bs::byte_stream_client::ByteStreamClient::with_interceptor(ch, b)
                .max_decoding_message_size(limit),
        }
    }

    /// Clients sending `key` (`None`: no credentials).
    pub async fn clients(&self, key: Option<&str>) -> Clients {
        let ch = self.channel().await;
        self.clients_on(ch, key)
    }
}

/// SHA-256 of `data`, hex.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(data))
}

/// BLAKE3 of `data`, hex.
pub fn blake3(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A REAPI digest.
pub fn digest(hash: &str, len: usize) -> re::Digest {
    re::Digest {
        hash: hash.to_string(),
        size_bytes: len as i64,
    }
}

/// `n` bytes of a repeatable pattern that differs per `seed`.
pub fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}
