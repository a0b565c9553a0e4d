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
//! Every call is authenticated from its `authorization` metadata
//! (`Bearer <key>`, or a verified client certificate) with the same
//! [`store_ops::auth::Auth`] as HTTP, and every method needs the same
//! scopes (`read` to read, `write` to store); errors map to gRPC codes
//! ([`status`]).
//!
//! Before tonic decodes a request, its caller, its host and its size are
//! admitted (ADR-074, ADR-077), in this order: the caller is
//! authenticated from the request's headers, before any byte of its body
//! is read; a caller without credentials must name a host of
//! [`GrpcConfig::allowed_hosts`] (the HTTP gate's DNS-rebinding rule,
//! `PERMISSION_DENIED` otherwise); a key that matches none, and on a
//! server that grants anonymous callers nothing a call without
//! credentials (but `GetCapabilities`), is answered `UNAUTHENTICATED`
//! there and then; only then are the message's bytes taken from a
//! server-wide budget ([`GrpcConfig::message_memory`],
//! [`DEFAULT_MESSAGE_MEMORY`]) without waiting (`RESOURCE_EXHAUSTED` when
//! it is spent). So callers the server answers nothing cannot hold the
//! budget.
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
mod admit;
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
use store_ops::hosts::HostCheck;
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
    /// The hosts a caller without credentials may name (HTTP/2's
    /// `:authority`, HTTP/1.1's `Host`): the HTTP server's
    /// `http.allowed_hosts`. [`HostCheck::any`] (the default): any.
    pub allowed_hosts: HostCheck,
    /// The most bytes of gRPC messages the server holds at once, across
    /// all calls ([`DEFAULT_MESSAGE_MEMORY`]): each request message's
    /// length is taken from it before the message is read (once its
    /// caller is admitted: a refused caller takes nothing), and a
    /// `BatchReadBlobs` answer's blobs before they are; a call the budget
    /// cannot take at once is refused with `RESOURCE_EXHAUSTED`.
    pub message_memory: usize,
}

/// The default of [`GrpcConfig::message_memory`]: 256 MiB, 32 messages
/// at [`MAX_MESSAGE_SIZE`] or about 64 full batches
/// ([`MAX_BATCH_TOTAL_SIZE`]), well beyond what a build client keeps in
/// flight, while a flood of large messages (4096 connections of 100
/// streams could otherwise make the server hold over 3 TiB) stays a few
/// hundred MiB of resident memory (ADR-074 has the measurements).
pub const DEFAULT_MESSAGE_MEMORY: usize = 256 << 20;

impl std::fmt::Debug for GrpcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcConfig")
            .field("auth", &self.auth)
            .field("client_cert", &self.client_cert.is_some())
            .field("allowed_hosts", &self.allowed_hosts.allowed())
            .field("message_memory", &self.message_memory)
            .finish()
    }
}

impl Default for GrpcConfig {
    /// Open (everyone may do everything), no certificates, any host,
    /// [`DEFAULT_MESSAGE_MEMORY`].
    fn default() -> Self {
        GrpcConfig {
            auth: Auth::open(),
            client_cert: None,
            allowed_hosts: HostCheck::any(),
            message_memory: DEFAULT_MESSAGE_MEMORY,
        }
    }
}

/// The state every service shares.
pub(crate) struct Shared {
    pub(crate) ops: Ops,
    pub(crate) cfg: GrpcConfig,
    pub(crate) writes: write::Writes,
    /// The bytes of messages held at once ([`GrpcConfig::message_memory`]).
    pub(crate) budget: admit::Budget,
}

/// tonic's routes of the four services over `ops` (the execution and
/// operations services are not served: tonic answers `UNIMPLEMENTED`),
/// each behind the caller's admission and the message budget (see the
/// crate docs).
pub fn routes(ops: Ops, cfg: GrpcConfig) -> tonic::service::Routes {
    use proto::build::bazel::remote::execution::v2 as re;
    use proto::google::bytestream::byte_stream_server::ByteStreamServer;
    let shared = Arc::new(Shared {
        ops,
        budget: admit::Budget::new(cfg.message_memory),
        cfg,
        writes: write::Writes::default(),
    });
    let limit = MAX_MESSAGE_SIZE;
    let caps = capabilities::CapabilitiesService(shared.clone());
    let ac = action_cache::ActionCacheService(shared.clone());
    let cas = cas::CasService(shared.clone());
    let bs = read::ByteStreamService(shared.clone());
    let caps = re::capabilities_server::CapabilitiesServer::new(caps)
        .max_decoding_message_size(admit::SMALL_MESSAGE);
    let ac = re::action_cache_server::ActionCacheServer::new(ac).max_decoding_message_size(limit);
    let cas = re::content_addressable_storage_server::ContentAddressableStorageServer::new(cas)
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let bs = ByteStreamServer::new(bs).max_decoding_message_size(limit);
    tonic::service::Routes::new(admit::Admit::anyone(caps, shared.clone()))
        .add_service(admit::Admit::new(ac, shared.clone(), limit))
        .add_service(admit::Admit::new(cas, shared.clone(), limit))
        .add_service(admit::Admit::new(bs, shared, limit))
}
