//! `ByteStream.Read`: a blob streamed out of the store (verified as the
//! store verifies reads), from `read_offset`, at most `read_limit` bytes,
//! in responses of at most [`READ_CHUNK`] bytes. The service's writes are
//! in `write.rs`.

use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use store_ops::cache::CasDigest;
use store_ops::range::{ByteRange, RangeRequest};
use store_ops::{ErrorCode, Ops, OpsError};
use tonic::{Request, Response, Status, Streaming};

use crate::capabilities::READ_CHUNK;
use crate::proto::google::bytestream as bs;
use crate::{resource, Shared};

const READ: &str = "/google.bytestream.ByteStream/Read";

/// The bytes a `Read` response gathers from the store's chunks before it
/// is sent (at most [`READ_CHUNK`]): 256 KiB, eight of the store's 32 KiB
/// stream chunks, so a stalled reader holds one such message (ADR-057).
const MESSAGE_BYTES: usize = 256 << 10;

/// The `ByteStream` service.
pub(crate) struct ByteStreamService(pub(crate) Arc<Shared>);

type ReadStream = Pin<Box<dyn Stream<Item = Result<bs::ReadResponse, Status>> + Send>>;

/// What a read streams: the blob and the part of its current chunk not
/// sent yet.
struct Reading {
    blob: Option<store_ops::GetResponse>,
    pending: Bytes,
    ops: Ops,
}

impl Reading {
    /// The next response, `None` at the end: the store's chunks gathered
    /// into one message of up to [`MESSAGE_BYTES`] (fewer, larger messages
    /// cost HTTP/2 fewer hand-offs between the stream and its connection).
    /// A failed read (a verification failure included) ends the stream
    /// with `DATA_LOSS` or `INTERNAL`.
    async fn next(&mut self) -> Option<Result<bs::ReadResponse, Status>> {
        let mut msg = BytesMut::new();
        while msg.len() < MESSAGE_BYTES {
            if self.pending.is_empty() {
                match self.fill().await {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => return Some(Err(e)),
                }
            }
            if msg.is_empty() && self.pending.len() >= MESSAGE_BYTES {
                // A chunk of a message's size or more goes as it is.
                let data = self.pending.split_to(self.pending.len().min(READ_CHUNK));
                return Some(Ok(self.sent(data)));
            }
            let take = self.pending.len().min(MESSAGE_BYTES - msg.len());
            msg.extend_from_slice(&self.pending.split_to(take));
        }
        (!msg.is_empty()).then(|| Ok(self.sent(msg.freeze())))
    }

    /// Reads the blob's next chunk into `pending`: `false` at the end.
    async fn fill(&mut self) -> Result<bool, Status> {
        let Some(got) = self.blob.as_mut() else {
            return Ok(false);
        };
        match got.blob.next_chunk().await {
            Ok(Some(c)) => {
                self.pending = c;
                Ok(true)
            }
            Ok(None) => {
                self.blob = None;
                Ok(false)
            }
            Err(e) => {
                self.blob = None;
                let code = if e.kind() == std::io::ErrorKind::InvalidData {
                    tonic::Code::DataLoss
                } else {
                    tonic::Code::Internal
                };
                self.ops.metrics().error(ErrorCode::Internal);
                tracing::error!("gRPC read: {e}");
                Err(Status::new(code, format!("the read failed: {e}")))
            }
        }
    }

    /// The response carrying `data`, counted.
    fn sent(&self, data: Bytes) -> bs::ReadResponse {
        self.ops.metrics().get_bytes(data.len() as u64);
        bs::ReadResponse { data }
    }
}

fn out_of_range(why: String) -> OpsError {
    OpsError::new(ErrorCode::InvalidRange, why)
}

impl ByteStreamService {
    /// The read `m` asks for, ready to stream.
    async fn open_read(
        &self,
        identity: &store_ops::auth::Identity,
        ns: &str,
        m: &bs::ReadRequest,
    ) -> Result<Reading, OpsError> {
        let res = resource::read(&m.resource_name)?;
        let offset = u64::try_from(m.read_offset)
            .map_err(|_| out_of_range(format!("read_offset {} is negative", m.read_offset)))?;
        let limit = u64::try_from(m.read_limit)
            .map_err(|_| out_of_range(format!("read_limit {} is negative", m.read_limit)))?;
        if offset > res.size {
            return Err(out_of_range(format!(
                "read_offset {offset} is past the blob's {} bytes",
                res.size
            )));
        }
        let mut reading = Reading {
            blob: None,
            pending: Bytes::new(),
            ops: self.0.ops.clone(),
        };
        if offset == res.size {
            // Nothing to send, once the blob is known to be there.
            let d = CasDigest {
                function: res.function,
                hash: res.hash.clone(),
                size: res.size,
            };
            let cache = self.0.ops.cache();
            if !cache.find_missing(identity, ns, &[d]).await?.is_empty() {
                let why = format!("no blob {} in {ns}", res.hash);
                return Err(OpsError::new(ErrorCode::NotFound, why));
            }
            return Ok(reading);
        }
        let range = match (offset, limit) {
            (0, 0) => None,
            (o, 0) => Some(RangeRequest::Single(ByteRange::From(o))),
            (o, l) => Some(RangeRequest::Single(ByteRange::FromTo(
                o,
                o.saturating_add(l - 1),
            ))),
        };
        let got = (self.0.ops.cache())
            .get_cas(identity, ns, Some(res.function), &res.hash, range)
            .await?;
        if got.size != res.size {
            return Err(OpsError::bad_request(format!(
                "blob {} has {} bytes, not the {} the resource name says",
                res.hash, got.size, res.size
            )));
        }
        reading.blob = Some(got);
        Ok(reading)
    }
}

#[tonic::async_trait]
impl bs::byte_stream_server::ByteStream for ByteStreamService {
    type ReadStream = ReadStream;

    /// `{instance}/blobs/[blake3/]{hash}/{size}`; a negative offset or
    /// limit, or an offset past the blob, is `OUT_OF_RANGE`.
    async fn read(
        &self,
        req: Request<bs::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let call = self.0.call(READ);
        let r = async {
            let identity = call.identity(&req)?;
            let res = resource::read(&req.get_ref().resource_name)?;
            let ns = call.namespace(&res.instance)?;
            let reading = self.open_read(&identity, &ns, req.get_ref()).await;
            let missed = matches!(&reading, Err(e) if e.code == ErrorCode::NotFound);
            let found = reading.is_ok();
            (self.0.ops.metrics()).grpc_lookups(READ, found.into(), missed.into());
            let reading = reading?;
            let stream = futures::stream::unfold(reading, |mut r| async move {
                r.next().await.map(|item| (item, r))
            });
            Ok(Box::pin(stream) as ReadStream)
        }
        .await;
        call.done(r).map(Response::new)
    }

    async fn write(
        &self,
        req: Request<Streaming<bs::WriteRequest>>,
    ) -> Result<Response<bs::WriteResponse>, Status> {
        crate::write::write(&self.0, req).await
    }

    async fn query_write_status(
        &self,
        req: Request<bs::QueryWriteStatusRequest>,
    ) -> Result<Response<bs::QueryWriteStatusResponse>, Status> {
        crate::write::query_write_status(&self.0, req).await
    }
}
