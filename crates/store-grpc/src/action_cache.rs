//! `ActionCache`: action results by action digest, served only while every
//! output they name is present (store-ops validates).

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use store_ops::OpsError;
use tonic::{Request, Response, Status};

use crate::call::{audit, audited_refusal};
use crate::digest::{checked, function_of, requested};
use crate::proto::build::bazel::remote::execution::v2 as re;
use crate::Shared;

const GET: &str = "/build.bazel.remote.execution.v2.ActionCache/GetActionResult";
const UPDATE: &str = "/build.bazel.remote.execution.v2.ActionCache/UpdateActionResult";

/// The `ActionCache` service.
pub(crate) struct ActionCacheService(pub(crate) Arc<Shared>);

#[tonic::async_trait]
impl re::action_cache_server::ActionCache for ActionCacheService {
    /// `NOT_FOUND` when the result, or any output it names, is absent.
    /// Outputs are never inlined (REAPI lets a server omit them).
    async fn get_action_result(
        &self,
        req: Request<re::GetActionResultRequest>,
    ) -> Result<Response<re::ActionResult>, Status> {
        let call = self.0.call(GET);
        let r = async {
            let identity = call.identity(&req)?;
            let m = req.get_ref();
            let ns = call.namespace(&m.instance_name)?;
            let (hash, _) = checked(m.action_digest.as_ref(), "action_digest")?;
            function_of(requested(m.digest_function)?, &hash)?;
            let got = (self.0.ops.cache())
                .get_action_result(&identity, &ns, &hash)
                .await;
            let found = got.is_ok();
            let missed = matches!(&got, Err(e) if e.code == store_ops::ErrorCode::NotFound);
            (self.0.ops.metrics()).grpc_lookups(GET, found.into(), missed.into());
            let bytes = got?;
            re::ActionResult::decode(bytes).map_err(|e| {
                OpsError::new(
                    store_ops::ErrorCode::NotFound,
                    format!("the entry ac/{hash} is no ActionResult ({e})"),
                )
            })
        }
        .await;
        call.done(r).map(Response::new)
    }

    /// Stores the result as given (not validated on the way in: a result
    /// whose outputs are missing is withheld when read). Replacing a
    /// result, and a refusal, are audited.
    async fn update_action_result(
        &self,
        req: Request<re::UpdateActionResultRequest>,
    ) -> Result<Response<re::ActionResult>, Status> {
        let call = self.0.call(UPDATE);
        let r = async {
            let identity = call.identity(&req)?;
            let m = req.get_ref();
            let ns = call.namespace(&m.instance_name)?;
            let (hash, _) = checked(m.action_digest.as_ref(), "action_digest")?;
            function_of(requested(m.digest_function)?, &hash)?;
            let result = m.action_result.clone().unwrap_or_default();
            let body = Bytes::from(result.encode_to_vec());
            let r = (self.0.ops.cache())
                .put_action_result(&identity, &ns, &hash, body)
                .await;
            let target = format!("{ns}/ac/{hash}");
            match &r {
                Ok(out) if out.previous.is_some_and(|p| p != out.digest) => audit(
                    &identity,
                    "grpc_update_action_result",
                    &target,
                    &format!(
                        "ok: {} -> {}",
                        out.previous.unwrap_or(out.digest),
                        out.digest
                    ),
                ),
                Err(e) if audited_refusal(e) => audit(
                    &identity,
                    "grpc_update_action_result",
                    &target,
                    e.code.as_str(),
                ),
                _ => {}
            }
            r.map(|_| result)
        }
        .await;
        call.done(r).map(Response::new)
    }
}
