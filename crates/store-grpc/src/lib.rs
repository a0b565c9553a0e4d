//! Blobpool's gRPC binding of the build-cache API: the Remote Execution
//! API v2 (bazelbuild/remote-apis) cache services and Google's ByteStream,
//! over tonic (issue 42 item 3, ADR-071).
//!
//! - `Capabilities`: SHA-256 and BLAKE3, action-cache updates for callers
//!   that may write, the batch limit ([`MAX_BATCH_TOTAL_SIZE`]);
//! - `ActionCache`: `GetActionResult` (served only while every output is
//!   present: [`store_ops::cache::CacheOps::get_action_result`]) and
//!   `UpdateActionResult`;
//! - `ContentAddressableStorage`: `FindMissingBlobs`, `BatchUpdateBlobs`,
//!   `BatchReadBlobs`, `GetTree` (`SplitBlob`/`SpliceBlob`: unimplemented);
//! - `ByteStream`: `Read` (offsets and limits, streamed), `Write`
//!   (resumable: the bytes spool in the node's upload sessions, ADR-034)
//!   and `QueryWriteStatus`.
//!
//! An instance name is a cache namespace's name; the empty one names the
//! server's only cache namespace, when it has exactly one. A digest's
//! function is the request's `digest_function` when set, else the
//! resource name's (`blobs/blake3/…`), else SHA-256 for 64 hex digits.
//!
//! Every method authenticates the `authorization` metadata (`Bearer
//! <key>`, or a verified client certificate) with the same
//! [`store_ops::auth::Auth`] as HTTP and needs the same scopes (`read` to
//! read, `write` to store); errors map to gRPC codes ([`status`]).
//!
//! Seams: below, a built [`store_ops::Ops`]; above, [`routes`] (tonic's
//! routes) or [`mount()`], which puts them beside an HTTP router on one
//! port: requests whose `content-type` starts with `application/grpc` go
//! to gRPC, all others to HTTP.
//!
//! Architecture invariant: this crate names no engine and not the HTTP
//! binding (`store-http`); it sees the store only through `store-ops`
//! (`cargo xtask tidy` checks its dependencies).

#![warn(missing_docs)]

mod action_cache;
mod call;
mod capabilities;
mod cas;
mod digest;
mod mount;
pub mod proto;
mod read;
mod resource;
mod write;

use std::sync::Arc;

use store_ops::auth::{Auth, ClientCert};
use store_ops::Ops;

pub use call::status;
pub use capabilities::{MAX_BATCH_TOTAL_SIZE, MAX_MESSAGE_SIZE, READ_CHUNK};
pub use mount::mount;
/// Request extensions (the `http` crate's), as [`CertLookup`] reads them.
pub use tonic::Extensions;

/// How a request's verified client certificate is found in its
/// extensions (the connection layer's business: the binary reads its
/// `PeerInfo`).
pub type CertLookup = Arc<dyn Fn(&Extensions) -> Option<ClientCert> + Send + Sync>;

/// What the gRPC binding needs beyond the [`Ops`].
#[derive(Clone)]
pub struct GrpcConfig {
    /// Identities and scopes (the HTTP server's).
    pub auth: Auth,
    /// Finds a request's verified client certificate (mutual TLS), if
    /// any; `None`: certificates are not looked for.
    pub client_cert: Option<CertLookup>,
}

impl std::fmt::Debug for GrpcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcConfig")
            .field("auth", &self.auth)
            .field("client_cert", &self.client_cert.is_some())
            .finish()
    }
}

impl Default for GrpcConfig {
    /// Open (everyone may do everything), no certificates.
    fn default() -> Self {
        GrpcConfig {
            auth: Auth::open(),
            client_cert: None,
        }
    }
}

/// The state every service shares.
pub(crate) struct Shared {
    pub(crate) ops: Ops,
    pub(crate) cfg: GrpcConfig,
    pub(crate) writes: write::Writes,
}

/// tonic's routes of the four services over `ops` (the execution and
/// operations services are not served: tonic answers `UNIMPLEMENTED`).
pub fn routes(ops: Ops, cfg: GrpcConfig) -> tonic::service::Routes {
    use proto::build::bazel::remote::execution::v2 as re;
    use proto::google::bytestream::byte_stream_server::ByteStreamServer;
    let shared = Arc::new(Shared {
        ops,
        cfg,
        writes: write::Writes::default(),
    });
    let limit = MAX_MESSAGE_SIZE;
    let caps = capabilities::CapabilitiesService(shared.clone());
    let ac = action_cache::ActionCacheService(shared.clone());
    let cas = cas::CasService(shared.clone());
    let bs = read::ByteStreamService(shared);
    tonic::service::Routes::new(re::capabilities_server::CapabilitiesServer::new(caps))
        .add_service(
            re::action_cache_server::ActionCacheServer::new(ac).max_decoding_message_size(limit),
        )
        .add_service(
            re::content_addressable_storage_server::ContentAddressableStorageServer::new(cas)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
        .add_service(ByteStreamServer::new(bs).max_decoding_message_size(limit))
}
