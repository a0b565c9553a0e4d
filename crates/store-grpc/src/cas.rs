//! `ContentAddressableStorage`: presence, batches and trees.

use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use prost::Message;
use store_ops::auth::Identity;
use store_ops::cache::DigestFunction;
use store_ops::{ErrorCode, OpsError};
use tonic::{Request, Response, Status};

use crate::call::{audit, audited_refusal, status};
use crate::capabilities::MAX_BATCH_TOTAL_SIZE;
use crate::digest::{cas_digest, checked, function_of, requested};
use crate::proto::build::bazel::remote::execution::v2 as re;
use crate::proto::google::rpc;
use crate::Shared;

const FIND: &str = "/build.bazel.remote.execution.v2.ContentAddressableStorage/FindMissingBlobs";
const UPDATE: &str = "/build.bazel.remote.execution.v2.ContentAddressableStorage/BatchUpdateBlobs";
const READ: &str = "/build.bazel.remote.execution.v2.ContentAddressableStorage/BatchReadBlobs";
const TREE: &str = "/build.bazel.remote.execution.v2.ContentAddressableStorage/GetTree";

/// Blobs of one batch stored or read at once.
const BATCH_CONCURRENCY: usize = 8;

/// Directories per `GetTree` response when the client asks for no page
/// size (and the most it may ask for).
const TREE_PAGE: usize = 1000;

/// A `GetTree` response's directories stop growing past this many bytes.
const TREE_PAGE_BYTES: usize = 2 << 20;

/// The `ContentAddressableStorage` service.
pub(crate) struct CasService(pub(crate) Arc<Shared>);

/// A blob's answer in a batch: OK, or the error's status.
fn rpc_status(r: Result<(), &OpsError>) -> Option<rpc::Status> {
    Some(match r {
        Ok(()) => rpc::Status::default(),
        Err(e) => {
            let s = status(e);
            rpc::Status {
                code: s.code() as i32,
                message: s.message().to_string(),
                details: vec![],
            }
        }
    })
}

/// The sum of `sizes`, refused past [`MAX_BATCH_TOTAL_SIZE`].
fn batch_total(sizes: impl Iterator<Item = u64>) -> Result<u64, OpsError> {
    let total = sizes.fold(0u64, u64::saturating_add);
    if total > MAX_BATCH_TOTAL_SIZE {
        return Err(OpsError::new(
            ErrorCode::TooLarge,
            format!(
                "the batch holds {total} bytes of blobs, more than max_batch_total_size_bytes \
                 ({MAX_BATCH_TOTAL_SIZE}): send larger blobs over ByteStream"
            ),
        ));
    }
    Ok(total)
}

impl CasService {
    /// Stores one blob of a batch; a refusal is audited as over HTTP.
    async fn put_one(
        &self,
        identity: &Identity,
        ns: &str,
        function: Option<DigestFunction>,
        r: &re::batch_update_blobs_request::Request,
    ) -> Result<(), OpsError> {
        let (hash, size) = checked(r.digest.as_ref(), "blob")?;
        let function = function_of(function, &hash)?;
        if r.compressor != re::compressor::Value::Identity as i32 {
            return Err(OpsError::bad_request("compressed blobs are not supported"));
        }
        if r.data.len() as u64 != size {
            return Err(OpsError::new(
                ErrorCode::LengthMismatch,
                format!(
                    "blob {hash}: the digest says {size} bytes, the data has {}",
                    r.data.len()
                ),
            ));
        }
        let res = (self.0.ops.cache())
            .put_cas(identity, ns, Some(function), &hash, &r.data[..], Some(size))
            .await;
        if let Err(e) = &res {
            if audited_refusal(e) {
                let target = format!("{ns}/cas/{hash}");
                audit(
                    identity,
                    "grpc_batch_update_blobs",
                    &target,
                    e.code.as_str(),
                );
            }
        }
        res.map(|_| ())
    }

    /// Reads one blob of a batch whole.
    async fn read_one(
        &self,
        identity: &Identity,
        ns: &str,
        function: Option<DigestFunction>,
        d: &re::Digest,
    ) -> Result<bytes::Bytes, OpsError> {
        let cd = cas_digest(function, d)?;
        if cd.size == 0 && cd.hash == cd.function.empty_hex() {
            return Ok(bytes::Bytes::new());
        }
        let got = (self.0.ops.cache())
            .get_cas(identity, ns, Some(cd.function), &cd.hash, None)
            .await?;
        got.blob.bytes().await.map_err(OpsError::from)
    }

    /// A batch update's answer for one blob.
    async fn put_answer(
        &self,
        identity: &Identity,
        ns: &str,
        function: Option<DigestFunction>,
        r: &re::batch_update_blobs_request::Request,
    ) -> re::batch_update_blobs_response::Response {
        let res = self.put_one(identity, ns, function, r).await;
        re::batch_update_blobs_response::Response {
            digest: r.digest.clone(),
            status: rpc_status(res.as_ref().map(|_| ())),
        }
    }

    /// A batch read's answer for one blob.
    async fn read_answer(
        &self,
        identity: &Identity,
        ns: &str,
        function: Option<DigestFunction>,
        d: &re::Digest,
    ) -> re::batch_read_blobs_response::Response {
        let res = self.read_one(identity, ns, function, d).await;
        let status = rpc_status(res.as_ref().map(|_| ()));
        re::batch_read_blobs_response::Response {
            digest: Some(d.clone()),
            data: res.unwrap_or_default(),
            compressor: re::compressor::Value::Identity as i32,
            status,
        }
    }

    /// One directory of a tree (`None`: absent).
    async fn directory(
        &self,
        identity: &Identity,
        ns: &str,
        function: DigestFunction,
        hash: &str,
    ) -> Result<Option<re::Directory>, OpsError> {
        let cache = self.0.ops.cache();
        let got = match cache
            .get_cas(identity, ns, Some(function), hash, None)
            .await
        {
            Ok(g) => g,
            Err(e) if e.code == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = got.blob.bytes().await.map_err(OpsError::from)?;
        re::Directory::decode(bytes).map(Some).map_err(|e| {
            OpsError::bad_request(format!("blob {hash} in {ns} is no Directory ({e})"))
        })
    }
}

type TreeStream = Pin<Box<dyn Stream<Item = Result<re::GetTreeResponse, Status>> + Send>>;

/// Where a `GetTree` walk stands.
struct Walk {
    svc: CasService,
    identity: Identity,
    ns: String,
    function: DigestFunction,
    queue: VecDeque<String>,
    seen: HashSet<String>,
    page: usize,
}

impl Walk {
    /// The next page: up to `page` directories, breadth first, each
    /// present one's children queued once; absent ones are left out (as
    /// REAPI says). `None` once the queue is empty.
    async fn next_page(&mut self) -> Option<Result<re::GetTreeResponse, Status>> {
        if self.queue.is_empty() {
            return None;
        }
        let (mut dirs, mut bytes) = (Vec::new(), 0usize);
        while dirs.len() < self.page && bytes < TREE_PAGE_BYTES {
            let Some(hash) = self.queue.pop_front() else {
                break;
            };
            let got = (self.svc).directory(&self.identity, &self.ns, self.function, &hash);
            let dir = match got.await {
                Ok(Some(d)) => d,
                Ok(None) => continue,
                Err(e) => return Some(Err(status(&e))),
            };
            for child in &dir.directories {
                if let Some(d) = &child.digest {
                    if self.seen.insert(d.hash.clone()) {
                        self.queue.push_back(d.hash.clone());
                    }
                }
            }
            bytes += dir.encoded_len();
            dirs.push(dir);
        }
        Some(Ok(re::GetTreeResponse {
            directories: dirs,
            next_page_token: String::new(),
        }))
    }
}

#[tonic::async_trait]
impl re::content_addressable_storage_server::ContentAddressableStorage for CasService {
    async fn find_missing_blobs(
        &self,
        req: Request<re::FindMissingBlobsRequest>,
    ) -> Result<Response<re::FindMissingBlobsResponse>, Status> {
        let call = self.0.call(FIND);
        let r = async {
            let identity = call.identity(&req)?;
            let m = req.get_ref();
            let ns = call.namespace(&m.instance_name)?;
            let function = requested(m.digest_function)?;
            let asked = (m.blob_digests.iter())
                .map(|d| cas_digest(function, d))
                .collect::<Result<Vec<_>, _>>()?;
            let missing = (self.0.ops.cache())
                .find_missing(&identity, &ns, &asked)
                .await?;
            let (n, gone) = (asked.len() as u64, missing.len() as u64);
            self.0.ops.metrics().grpc_lookups(FIND, n - gone, gone);
            Ok(re::FindMissingBlobsResponse {
                missing_blob_digests: missing
                    .into_iter()
                    .map(|i| m.blob_digests[i].clone())
                    .collect(),
            })
        }
        .await;
        call.done(r).map(Response::new)
    }

    /// Each blob is verified against its digest (a mismatch is that
    /// blob's `INVALID_ARGUMENT`); the batch's total is capped at
    /// [`MAX_BATCH_TOTAL_SIZE`].
    async fn batch_update_blobs(
        &self,
        req: Request<re::BatchUpdateBlobsRequest>,
    ) -> Result<Response<re::BatchUpdateBlobsResponse>, Status> {
        let call = self.0.call(UPDATE);
        let r = async {
            let identity = call.identity(&req)?;
            let m = req.get_ref();
            let ns = call.namespace(&m.instance_name)?;
            let function = requested(m.digest_function)?;
            batch_total(m.requests.iter().map(|r| r.data.len() as u64))?;
            // A caller that may not write learns it once, not per blob.
            let may = (self.0.ops).authorize(&identity, store_ops::auth::Scope::Write, Some(&ns));
            if let Err(e) = may {
                audit(
                    &identity,
                    "grpc_batch_update_blobs",
                    &format!("{ns}/cas"),
                    e.code.as_str(),
                );
                return Err(e);
            }
            let puts: Vec<_> = (m.requests.iter())
                .map(|r| self.put_answer(&identity, &ns, function, r))
                .collect();
            let responses = (futures::stream::iter(puts))
                .buffered(BATCH_CONCURRENCY)
                .collect()
                .await;
            Ok(re::BatchUpdateBlobsResponse { responses })
        }
        .await;
        call.done(r).map(Response::new)
    }

    /// An absent blob is that blob's `NOT_FOUND`; the sizes asked for are
    /// capped at [`MAX_BATCH_TOTAL_SIZE`] in all.
    async fn batch_read_blobs(
        &self,
        req: Request<re::BatchReadBlobsRequest>,
    ) -> Result<Response<re::BatchReadBlobsResponse>, Status> {
        let call = self.0.call(READ);
        let r = async {
            let identity = call.identity(&req)?;
            let m = req.get_ref();
            let ns = call.namespace(&m.instance_name)?;
            let function = requested(m.digest_function)?;
            let total = batch_total(m.digests.iter().map(|d| d.size_bytes.max(0) as u64))?;
            (self.0.ops).authorize(&identity, store_ops::auth::Scope::Read, Some(&ns))?;
            // The answer's blobs are held until it is sent (ADR-074).
            call.hold(&req, total)?;
            let reads: Vec<_> = (m.digests.iter())
                .map(|d| self.read_answer(&identity, &ns, function, d))
                .collect();
            let responses: Vec<re::batch_read_blobs_response::Response> =
                (futures::stream::iter(reads))
                    .buffered(BATCH_CONCURRENCY)
                    .collect()
                    .await;
            let code =
                |r: &re::batch_read_blobs_response::Response| r.status.as_ref().map(|s| s.code);
            let hits = responses.iter().filter(|r| code(r) == Some(0)).count() as u64;
            let not_found = Some(tonic::Code::NotFound as i32);
            let misses = responses.iter().filter(|r| code(r) == not_found).count() as u64;
            self.0.ops.metrics().grpc_lookups(READ, hits, misses);
            Ok(re::BatchReadBlobsResponse { responses })
        }
        .await;
        call.done(r).map(Response::new)
    }

    type GetTreeStream = TreeStream;

    /// The tree under the root directory, breadth first, in pages of
    /// `page_size` directories (default and most: 1,000; at most 2 MiB
    /// each), all in one stream (`next_page_token` stays empty); absent
    /// subdirectories are left out. An absent root is `NOT_FOUND`.
    async fn get_tree(
        &self,
        req: Request<re::GetTreeRequest>,
    ) -> Result<Response<Self::GetTreeStream>, Status> {
        let call = self.0.call(TREE);
        let r = async {
            let identity = call.identity(&req)?;
            let m = req.get_ref();
            let ns = call.namespace(&m.instance_name)?;
            if !m.page_token.is_empty() {
                return Err(OpsError::bad_request(
                    "page_token: this server sends the whole tree in one stream and issues no tokens",
                ));
            }
            let (hash, _) = checked(m.root_digest.as_ref(), "root_digest")?;
            let function = function_of(requested(m.digest_function)?, &hash)?;
            let svc = CasService(self.0.clone());
            if svc.directory(&identity, &ns, function, &hash).await?.is_none() {
                return Err(OpsError::new(
                    ErrorCode::NotFound,
                    format!("no root directory {hash} in {ns}"),
                ));
            }
            let page = match usize::try_from(m.page_size) {
                Ok(n) if n > 0 => n.min(TREE_PAGE),
                _ => TREE_PAGE,
            };
            let walk = Walk {
                svc,
                identity,
                ns,
                function,
                queue: VecDeque::from([hash.clone()]),
                seen: HashSet::from([hash]),
                page,
            };
            let stream = futures::stream::unfold(walk, |mut w| async move {
                w.next_page().await.map(|p| (p, w))
            });
            Ok(Box::pin(stream) as TreeStream)
        }
        .await;
        call.done(r).map(Response::new)
    }

    async fn split_blob(
        &self,
        _req: Request<re::SplitBlobRequest>,
    ) -> Result<Response<re::SplitBlobResponse>, Status> {
        Err(Status::unimplemented(
            "SplitBlob is not supported (split_blob_support = false)",
        ))
    }

    async fn splice_blob(
        &self,
        _req: Request<re::SpliceBlobRequest>,
    ) -> Result<Response<re::SpliceBlobResponse>, Status> {
        Err(Status::unimplemented(
            "SpliceBlob is not supported (splice_blob_support = false)",
        ))
    }
}
