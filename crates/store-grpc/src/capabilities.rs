//! `Capabilities.GetCapabilities`: what this cache serves.

use std::sync::Arc;

use store_ops::auth::Scope;
use tonic::{Request, Response, Status};

use crate::proto::build::bazel::remote::execution::v2 as re;
use crate::proto::build::bazel::semver::SemVer;
use crate::Shared;

/// The largest request message a method decodes (8 MiB): a batch at
/// [`MAX_BATCH_TOTAL_SIZE`] plus its digests fits.
pub const MAX_MESSAGE_SIZE: usize = 8 << 20;

/// The batch methods' limit on the blobs' total size, as advertised
/// (`max_batch_total_size_bytes`): 4 MiB less 64 KiB, so a
/// `BatchReadBlobs` answer with its digests stays under the 4 MiB that
/// gRPC clients accept by default. Larger blobs go over ByteStream.
pub const MAX_BATCH_TOTAL_SIZE: u64 = (4 << 20) - (64 << 10);

/// The most bytes one `ByteStream.Read` response carries (1 MiB).
pub const READ_CHUNK: usize = 1 << 20;

const GET_CAPABILITIES: &str = "/build.bazel.remote.execution.v2.Capabilities/GetCapabilities";

/// The `Capabilities` service.
pub(crate) struct CapabilitiesService(pub(crate) Arc<Shared>);

fn version(major: i32, minor: i32) -> Option<SemVer> {
    Some(SemVer {
        major,
        minor,
        patch: 0,
        prerelease: String::new(),
    })
}

/// The capabilities of instance `ns` for a caller that may (`update`) or
/// may not write action results.
fn capabilities(update: bool) -> re::ServerCapabilities {
    use re::{compressor, digest_function, symlink_absolute_path_strategy};
    re::ServerCapabilities {
        cache_capabilities: Some(re::CacheCapabilities {
            digest_functions: vec![
                digest_function::Value::Sha256 as i32,
                digest_function::Value::Blake3 as i32,
            ],
            action_cache_update_capabilities: Some(re::ActionCacheUpdateCapabilities {
                update_enabled: update,
            }),
            max_batch_total_size_bytes: MAX_BATCH_TOTAL_SIZE as i64,
            // A cache stores what it is given; symlinks are the client's.
            symlink_absolute_path_strategy: symlink_absolute_path_strategy::Value::Allowed as i32,
            supported_compressors: vec![compressor::Value::Identity as i32],
            ..Default::default()
        }),
        // No remote execution: a cache only.
        execution_capabilities: None,
        deprecated_api_version: None,
        low_api_version: version(2, 0),
        high_api_version: version(2, 3),
    }
}

#[tonic::async_trait]
impl re::capabilities_server::Capabilities for CapabilitiesService {
    /// Answered without credentials too: capabilities are protocol
    /// parameters, and Bazel (2.1 at least) sends its `authorization`
    /// header with every call but this one. A caller with a key (or a
    /// client certificate) is answered for itself: `update_enabled` says
    /// whether it may write the instance (a read-only key's client then
    /// never tries). A caller without credentials is told
    /// `update_enabled = true`: each real call is authorized on its own
    /// (and answers `UNAUTHENTICATED` without a key where anonymous
    /// callers may not write). A key that matches none is
    /// `UNAUTHENTICATED`, as everywhere; an instance that is no cache
    /// namespace `NOT_FOUND`.
    async fn get_capabilities(
        &self,
        req: Request<re::GetCapabilitiesRequest>,
    ) -> Result<Response<re::ServerCapabilities>, Status> {
        let call = self.0.call(GET_CAPABILITIES);
        let r = (|| {
            let identity = call.identity(&req)?;
            let ns = call.namespace(&req.get_ref().instance_name)?;
            let update = identity.is_anonymous() || identity.allows(Scope::Write, Some(&ns));
            Ok(capabilities(update))
        })();
        call.done(r).map(Response::new)
    }
}
