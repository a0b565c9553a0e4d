//! `ByteStream.Write` and `QueryWriteStatus`: resumable uploads into a
//! cache namespace's content addresses.
//!
//! A write spools in one of the node's resumable upload sessions (ADR-034:
//! on disk, synced, capped in number and bytes, reaped when idle). The
//! stream's bytes are gathered into segments of [`SEGMENT`] bytes and each
//! segment is appended (and synced) as it fills, so a write holds at most
//! one segment and one message in memory, and an interrupted write keeps
//! every whole segment it sent: `QueryWriteStatus` answers that committed
//! size and a new `Write` with that `write_offset` goes on from there.
//! With `finish_write` the session's bytes go through the cache's verified
//! content-address put ([`store_ops::cache::CacheOps::put_cas`]) and the
//! session ends. A digest mismatch aborts the session (start again at 0).
//!
//! Which session a resource name's write uses is kept here, in memory, by
//! (identity, namespace, upload id, hash, size); an entry goes when its
//! write finishes or its session is found gone, and entries unused for
//! the sessions' idle timeout are dropped (a restart forgets them all: the
//! sessions are reaped and the client starts again at 0).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use store_ops::auth::{Identity, Scope};
use store_ops::cache::CasDigest;
use store_ops::{ErrorCode, OpsError};
use tonic::{Request, Response, Status, Streaming};

use crate::call::{audit, audited_refusal, Call};
use crate::proto::google::bytestream as bs;
use crate::resource::{self, Resource};
use crate::Shared;

const WRITE: &str = "/google.bytestream.ByteStream/Write";
const QUERY: &str = "/google.bytestream.ByteStream/QueryWriteStatus";

/// Bytes gathered before they are appended (and synced) to the session.
pub(crate) const SEGMENT: usize = 1 << 20;

/// Entries are pruned once the table holds this many.
const PRUNE_AT: usize = 64;

/// Which upload session holds a write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct WriteKey {
    identity: String,
    ns: String,
    upload: String,
    hash: String,
    size: u64,
}

/// The writes in progress: upload session ids by [`WriteKey`].
#[derive(Default)]
pub(crate) struct Writes {
    map: Mutex<HashMap<WriteKey, (String, Instant)>>,
}

impl Writes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WriteKey, (String, Instant)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: &WriteKey) -> Option<String> {
        let mut m = self.lock();
        let e = m.get_mut(key)?;
        e.1 = Instant::now();
        Some(e.0.clone())
    }

    fn insert(&self, key: WriteKey, session: String, idle: Duration) {
        let mut m = self.lock();
        if m.len() >= PRUNE_AT {
            m.retain(|_, (_, used)| used.elapsed() < idle);
        }
        m.insert(key, (session, Instant::now()));
    }

    fn remove(&self, key: &WriteKey) {
        self.lock().remove(key);
    }
}

fn key(identity: &Identity, ns: &str, res: &Resource) -> WriteKey {
    WriteKey {
        identity: identity.name().to_string(),
        ns: ns.to_string(),
        upload: res.upload.clone().unwrap_or_default(),
        hash: res.hash.clone(),
        size: res.size,
    }
}

/// Whether the blob `res` names is stored already (`false` for a caller
/// that may not read: it learns nothing).
async fn present(shared: &Shared, identity: &Identity, ns: &str, res: &Resource) -> bool {
    if !identity.allows(Scope::Read, Some(ns)) {
        return false;
    }
    let d = CasDigest {
        function: res.function,
        hash: res.hash.clone(),
        size: res.size,
    };
    let missing = shared.ops.cache().find_missing(identity, ns, &[d]).await;
    missing.is_ok_and(|m| m.is_empty())
}

/// The stream's next message; a broken stream is `incomplete_body`,
/// except a message the server's budget refused (`RESOURCE_EXHAUSTED`,
/// ADR-074), which stays `too_many`.
async fn next(
    stream: &mut Streaming<bs::WriteRequest>,
) -> Result<Option<bs::WriteRequest>, OpsError> {
    stream.message().await.map_err(|s| {
        if s.code() == tonic::Code::ResourceExhausted {
            let m = s.message();
            let m = m.strip_prefix("too_many: ").unwrap_or(m);
            return OpsError::new(ErrorCode::TooMany, m.to_string());
        }
        OpsError::new(
            ErrorCode::IncompleteBody,
            format!("the write stream broke: {}", s.message()),
        )
    })
}

/// The committed offset of session `id`, or `not_found` (the entry
/// dropped) when the session is gone.
async fn committed(
    shared: &Shared,
    identity: &Identity,
    ns: &str,
    key: &WriteKey,
    id: &str,
) -> Result<u64, OpsError> {
    match shared.ops.uploads().status(identity, ns, id).await {
        Ok(st) => Ok(st.offset),
        Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Missing) => {
            shared.writes.remove(key);
            Err(OpsError::new(
                ErrorCode::NotFound,
                "the write's upload session is gone (expired or the server restarted): start \
                 again at write_offset 0",
            ))
        }
        Err(e) => Err(e),
    }
}

/// The session a write starting at `offset` goes on in, opened for a
/// new write (which must start at 0; a write of the same resource that
/// starts at 0 again drops the bytes committed before); `None` when the
/// blob is stored already (nothing to send).
async fn session(
    shared: &Shared,
    identity: &Identity,
    ns: &str,
    res: &Resource,
    offset: u64,
) -> Result<Option<(WriteKey, String)>, OpsError> {
    let key = key(identity, ns, res);
    if let Some(id) = shared.writes.get(&key) {
        let at = committed(shared, identity, ns, &key, &id).await?;
        if offset == 0 && at > 0 {
            // A client starting over (one that does not resume): the
            // committed bytes go, the write begins afresh.
            shared.ops.uploads().abort(identity, ns, &id).await?;
            shared.writes.remove(&key);
            return Box::pin(session(shared, identity, ns, res, 0)).await;
        }
        if at != offset {
            return Err(OpsError::new(
                ErrorCode::UploadOffset,
                format!(
                    "write_offset {offset}, but {at} bytes of this write are committed: resume \
                     there (QueryWriteStatus says so)"
                ),
            ));
        }
        return Ok(Some((key, id)));
    }
    if offset == 0 && present(shared, identity, ns, res).await {
        return Ok(None);
    }
    if offset != 0 {
        return Err(OpsError::new(
            ErrorCode::UploadOffset,
            format!(
                "write_offset {offset}, but no write of this resource is in progress: start at 0"
            ),
        ));
    }
    let st = shared.ops.uploads().open(identity, ns).await?;
    let idle = (shared.ops.config().uploads.as_ref())
        .map_or(Duration::from_secs(3600), |u| u.idle_timeout);
    shared.writes.insert(key.clone(), st.id.clone(), idle);
    Ok(Some((key, st.id)))
}

/// One write: the first message's resource, checks, then the segments.
async fn write_blob(
    call: &Call<'_>,
    shared: &Shared,
    req: Request<Streaming<bs::WriteRequest>>,
) -> Result<u64, OpsError> {
    let identity = call.identity(&req)?;
    let mut stream = req.into_inner();
    let first = (next(&mut stream).await?)
        .ok_or_else(|| OpsError::bad_request("a Write with no message"))?;
    let res = resource::write(&first.resource_name)?;
    let ns = call.namespace(&res.instance)?;
    if let Err(e) = shared.ops.authorize(&identity, Scope::Write, Some(&ns)) {
        audit(
            &identity,
            "grpc_write",
            &format!("{ns}/cas/{}", res.hash),
            e.code.as_str(),
        );
        return Err(e);
    }
    let max = shared.ops.config().max_blob_size;
    if res.size > max {
        return Err(OpsError::new(
            ErrorCode::TooLarge,
            format!(
                "the blob has {} bytes; this server stores at most {max}",
                res.size
            ),
        ));
    }
    let offset = u64::try_from(first.write_offset).map_err(|_| {
        OpsError::bad_request(format!("write_offset {} is negative", first.write_offset))
    })?;
    let Some((key, id)) = session(shared, &identity, &ns, &res, offset).await? else {
        return Ok(res.size);
    };
    let w = Spooling {
        shared,
        identity: &identity,
        ns: &ns,
        id: &id,
        res: &res,
        name: &first.resource_name,
    };
    let r = w.run(offset, first.clone(), &mut stream).await;
    match &r {
        Ok(_) => shared.writes.remove(&key),
        Err(e) if matches!(e.code, ErrorCode::Verification | ErrorCode::LengthMismatch) => {
            // The spooled bytes are not the blob: start again at 0.
            let _ = shared.ops.uploads().abort(&identity, &ns, &id).await;
            shared.writes.remove(&key);
        }
        Err(e) if audited_refusal(e) => audit(
            &identity,
            "grpc_write",
            &format!("{ns}/cas/{}", res.hash),
            e.code.as_str(),
        ),
        Err(_) => {}
    }
    r
}

/// A write going into session `id`.
struct Spooling<'a> {
    shared: &'a Shared,
    identity: &'a Identity,
    ns: &'a str,
    id: &'a str,
    res: &'a Resource,
    name: &'a str,
}

impl Spooling<'_> {
    /// Appends `buf` at `pos`; the new committed offset.
    async fn append(&self, pos: u64, buf: &mut BytesMut) -> Result<u64, OpsError> {
        let st = (self.shared.ops.uploads())
            .append(self.identity, self.ns, self.id, Some(pos), &buf[..])
            .await?;
        buf.clear();
        Ok(st.offset)
    }

    /// Gathers messages from `first` on into segments, appending each as
    /// it fills; at `finish_write`, stores the blob. A stream that ends
    /// or breaks first commits what arrived and is `incomplete_body`.
    async fn run(
        &self,
        mut pos: u64,
        first: bs::WriteRequest,
        stream: &mut Streaming<bs::WriteRequest>,
    ) -> Result<u64, OpsError> {
        let mut buf = BytesMut::new();
        let mut msg = Some(first);
        loop {
            let m = match msg.take() {
                Some(m) => m,
                None => match next(stream).await {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(_) => {
                        let at = self.append(pos, &mut buf).await?;
                        return Err(OpsError::new(
                            ErrorCode::IncompleteBody,
                            format!("the write stream ended without finish_write; {at} bytes are committed"),
                        ));
                    }
                },
            };
            self.check(&m, pos + buf.len() as u64)?;
            buf.extend_from_slice(&m.data);
            if m.finish_write {
                return self.finish(pos, buf).await;
            }
            if buf.len() >= SEGMENT {
                pos = self.append(pos, &mut buf).await?;
            }
        }
    }

    /// A message's offset is where the write stands, its name (if given)
    /// the first one's, and the bytes do not pass the blob's size.
    fn check(&self, m: &bs::WriteRequest, at: u64) -> Result<(), OpsError> {
        if !m.resource_name.is_empty() && m.resource_name != self.name {
            return Err(OpsError::bad_request(
                "a Write names one resource in all its messages",
            ));
        }
        if u64::try_from(m.write_offset).ok() != Some(at) {
            return Err(OpsError::new(
                ErrorCode::UploadOffset,
                format!(
                    "write_offset {} where the write stands at {at}",
                    m.write_offset
                ),
            ));
        }
        if at + m.data.len() as u64 > self.res.size {
            return Err(OpsError::new(
                ErrorCode::LengthMismatch,
                format!(
                    "more bytes than the {} the resource name says",
                    self.res.size
                ),
            ));
        }
        Ok(())
    }

    /// Appends the last segment and stores the session's bytes as the
    /// blob (verified against its name).
    async fn finish(&self, pos: u64, buf: BytesMut) -> Result<u64, OpsError> {
        let total = pos + buf.len() as u64;
        if total != self.res.size {
            return Err(OpsError::new(
                ErrorCode::LengthMismatch,
                format!(
                    "finish_write after {total} bytes; the resource name says {}",
                    self.res.size
                ),
            ));
        }
        (self.shared.ops.uploads())
            .finish_cas(
                self.identity,
                self.ns,
                self.id,
                Some(pos),
                &buf[..],
                Some(self.res.function),
                &self.res.hash,
            )
            .await?;
        Ok(total)
    }
}

/// `Write`: see the module docs. A blob stored already is answered at
/// once (its full size committed) when a write starts at 0.
pub(crate) async fn write(
    shared: &Arc<Shared>,
    req: Request<Streaming<bs::WriteRequest>>,
) -> Result<Response<bs::WriteResponse>, Status> {
    let call = shared.call(WRITE);
    let r = write_blob(&call, shared, req).await;
    call.done(r).map(|n| {
        Response::new(bs::WriteResponse {
            committed_size: n as i64,
        })
    })
}

/// `QueryWriteStatus`: the committed size of a write in progress; a blob
/// stored already is complete; anything else is `NOT_FOUND`.
pub(crate) async fn query_write_status(
    shared: &Arc<Shared>,
    req: Request<bs::QueryWriteStatusRequest>,
) -> Result<Response<bs::QueryWriteStatusResponse>, Status> {
    let call = shared.call(QUERY);
    let r = async {
        let identity = call.identity(&req)?;
        let res = resource::write(&req.get_ref().resource_name)?;
        let ns = call.namespace(&res.instance)?;
        shared.ops.authorize(&identity, Scope::Write, Some(&ns))?;
        let key = key(&identity, &ns, &res);
        if let Some(id) = shared.writes.get(&key) {
            if let Ok(at) = committed(shared, &identity, &ns, &key, &id).await {
                return Ok((at, false));
            }
        }
        if present(shared, &identity, &ns, &res).await {
            return Ok((res.size, true));
        }
        Err(OpsError::new(
            ErrorCode::NotFound,
            format!("no write of {} is in progress", req.get_ref().resource_name),
        ))
    }
    .await;
    call.done(r).map(|(at, complete)| {
        Response::new(bs::QueryWriteStatusResponse {
            committed_size: at as i64,
            complete,
        })
    })
}
