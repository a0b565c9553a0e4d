//! gRPC on the server's own port through the real connection layer
//! (ADR-071): `store_grpc::mount` beside the HTTP router, served by
//! `store_http::serve_router` under TLS with ALPN `h2`, and a tonic client
//! over a rustls connection; the client certificate is the caller's
//! identity (mutual TLS), as over HTTP.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use store_core::{CacheBounds, GcPolicy, Mode, Store};
use store_grpc::proto::build::bazel::remote::execution::v2 as re;
use store_http::{ClientAuth, PeerInfo, ServerLimits, TlsSettings};
use store_local::{LocalEngine, LocalOptions};
use store_ops::auth::{Auth, CertIdentity, Grant};
use store_ops::{Ops, OpsConfig};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::Namespace;
use tokio::net::TcpStream;

/// A CA, a server certificate for localhost and a client certificate with
/// the common name `alice`, and the rustls client config trusting the CA.
struct Pki {
    dir: tempfile::TempDir,
    client: Arc<rustls::ClientConfig>,
}

fn pki(with_client_cert: bool) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    use rustls_pki_types::pem::PemObject;
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "grpc test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let ckey = KeyPair::generate().unwrap();
    let mut cparams = CertificateParams::new(vec!["alice.clients.example".to_string()]).unwrap();
    cparams.distinguished_name.push(DnType::CommonName, "alice");
    let ccert = cparams.signed_by(&ckey, &issuer).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = if with_client_cert {
        let k = rustls_pki_types::PrivateKeyDer::from_pem_slice(ckey.serialize_pem().as_bytes());
        let chain = vec![ccert.der().clone()];
        builder.with_client_auth_cert(chain, k.unwrap()).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Pki {
        dir,
        client: Arc::new(cfg),
    }
}

/// The binary's mount: the HTTP router and gRPC beside it, the client
/// certificate read from the connection layer's `PeerInfo`.
async fn serve(pki: &Pki, data: &std::path::Path) -> std::net::SocketAddr {
    let kv = SqliteEngine::open(data.join("kv.sqlite"), SqliteOptions::default());
    let local = LocalOptions {
        shared_media: false,
        fsync: false,
        ..LocalOptions::default()
    };
    let large = LocalEngine::open(data.join("large"), local).await.unwrap();
    let store = Store::builder()
        .kv(kv.await.unwrap())
        .large(large)
        .mode(Mode::DualTier { threshold: 1024 })
        .build()
        .await
        .unwrap();
    let ns = Namespace::new("cc").unwrap();
    let bounds = CacheBounds {
        max_bytes: None,
        max_age: None,
    };
    store
        .set_gc_policy(ns.clone(), GcPolicy::Cache(bounds))
        .await
        .unwrap();
    let cfg = OpsConfig {
        cache_namespaces: [ns].into_iter().collect(),
        ..Default::default()
    };
    let ops = Ops::new(store, cfg).unwrap();
    let alice = CertIdentity {
        name: "alice".into(),
        subject: "alice".into(),
        grants: Grant::parse_all(&["read:cc"]).unwrap(),
    };
    let auth = Auth::new(vec![], vec![alice], vec![]).unwrap();
    let http = store_http::HttpConfig {
        auth: auth.clone(),
        ..Default::default()
    };
    let grpc = store_grpc::GrpcConfig {
        auth,
        client_cert: Some(Arc::new(|e: &store_grpc::Extensions| {
            e.get::<PeerInfo>().and_then(|p| p.client_cert.clone())
        })),
        ..Default::default()
    };
    let app = store_grpc::mount(store_http::router_with(ops.clone(), &http), ops, grpc);
    let tls = TlsSettings {
        cert: pki.dir.path().join("cert.pem"),
        key: pki.dir.path().join("key.pem"),
        client_ca: Some(pki.dir.path().join("ca.pem")),
        client_auth: ClientAuth::Optional,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = ServerLimits::default();
    tokio::spawn(store_http::serve_router(
        listener,
        app,
        limits,
        Some(tls),
        std::future::pending(),
    ));
    addr
}

/// tonic's connector: a TLS connection (ALPN `h2`) to the server.
#[derive(Clone)]
struct TlsConnector {
    addr: std::net::SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

type Io = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;

impl tower_service::Service<axum::http::Uri> for TlsConnector {
    type Response = Io;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Io>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: axum::http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(this.addr).await?;
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let s = this.tls.connect(name, tcp).await?;
            assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            Ok(hyper_util::rt::TokioIo::new(s))
        })
    }
}

async fn capabilities(cert: bool) -> Result<re::ServerCapabilities, tonic::Status> {
    let pki = pki(cert);
    let data = tempfile::tempdir().unwrap();
    let addr = serve(&pki, data.path()).await;
    let connector = TlsConnector {
        addr,
        tls: tokio_rustls::TlsConnector::from(pki.client.clone()),
    };
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .unwrap();
    let mut caps = re::capabilities_client::CapabilitiesClient::new(channel.clone());
    let mut cas =
        re::content_addressable_storage_client::ContentAddressableStorageClient::new(channel);
    let find = re::FindMissingBlobsRequest {
        instance_name: "cc".into(),
        blob_digests: vec![re::Digest {
            hash: "0".repeat(64),
            size_bytes: 1,
        }],
        digest_function: 0,
    };
    cas.find_missing_blobs(find).await?;
    let req = re::GetCapabilitiesRequest {
        instance_name: "cc".into(),
    };
    caps.get_capabilities(req).await.map(|r| r.into_inner())
}

#[tokio::test]
async fn grpc_over_tls_h2_on_the_servers_port_knows_the_client_certificate() {
    let caps = capabilities(true).await.unwrap();
    let cache = caps.cache_capabilities.unwrap();
    // alice may read, not write: told so.
    let update = cache.action_cache_update_capabilities.unwrap();
    assert!(!update.update_enabled);
}

#[tokio::test]
async fn grpc_over_tls_without_a_certificate_is_unauthenticated() {
    let e = capabilities(false).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
}
