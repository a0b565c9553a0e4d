//! What every method does around its handler: authenticate the caller,
//! find the instance's namespace, time the call and count its error, map
//! an [`OpsError`] to a gRPC [`Status`], write audit lines.

use std::borrow::Cow;
use std::time::Instant;

use store_ops::auth::Identity;
use store_ops::hosts::HostCheck;
use store_ops::{ErrorCode, OpsError};
use tonic::{Code, Request, Status};

use crate::admit::{Admitted, HeldRef};
use crate::Shared;

/// The gRPC status of an ops error: the code that says the same thing
/// (`unauthorized` → `UNAUTHENTICATED`, `forbidden` → `PERMISSION_DENIED`,
/// `missing`/`not_found` → `NOT_FOUND`, a malformed name, a digest
/// mismatch or a wrong length → `INVALID_ARGUMENT`, `too_large` and the
/// caps → `RESOURCE_EXHAUSTED`, `invalid_range` → `OUT_OF_RANGE`, a
/// transient failure → `UNAVAILABLE`, ...). The message is the error's,
/// except for the codes whose message never reaches clients (`internal`,
/// `insufficient_storage`, `unavailable`): those are logged instead.
pub fn status(e: &OpsError) -> Status {
    let code = match e.code {
        ErrorCode::Unauthorized => Code::Unauthenticated,
        ErrorCode::Forbidden => Code::PermissionDenied,
        ErrorCode::Missing | ErrorCode::NotFound => Code::NotFound,
        ErrorCode::KeyInvalid
        | ErrorCode::Verification
        | ErrorCode::LengthMismatch
        | ErrorCode::BadRequest
        | ErrorCode::IncompleteBody
        | ErrorCode::UploadOffset
        | ErrorCode::UnsupportedMediaType
        | ErrorCode::MethodNotAllowed => Code::InvalidArgument,
        ErrorCode::TooLarge
        | ErrorCode::TooMany
        | ErrorCode::TooManyTokens
        | ErrorCode::TooManyUploads
        | ErrorCode::UploadQuota
        | ErrorCode::InsufficientStorage => Code::ResourceExhausted,
        ErrorCode::InvalidRange => Code::OutOfRange,
        ErrorCode::GcRefuse | ErrorCode::RefConflict | ErrorCode::UploadElsewhere => {
            Code::FailedPrecondition
        }
        ErrorCode::UploadBusy => Code::Aborted,
        ErrorCode::Overloaded | ErrorCode::Unavailable => Code::Unavailable,
        ErrorCode::HostNotAllowed => Code::PermissionDenied,
        _ => Code::Internal,
    };
    if e.code.redacts_message() {
        tracing::error!(code = e.code.as_str(), "gRPC: {}", e.message);
        return Status::new(code, format!("{} (the server log has the cause)", e.code));
    }
    Status::new(code, format!("{}: {}", e.code, e.message))
}

/// One call of `method` (its gRPC path, the latency metric's route label).
pub(crate) struct Call<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) method: &'static str,
    started: Instant,
    /// The caller's name, once authenticated (for the access line).
    who: std::sync::OnceLock<String>,
}

impl Shared {
    /// Who sends the `authorization` header value (`Bearer <key>` or
    /// `Basic`) or the verified client certificate in `extensions`, else
    /// anonymous (`unauthorized` for a key that matches none), naming the
    /// host `authority`. A caller without credentials (anonymous, or
    /// anyone on an open server) whose host is not allowed is refused with
    /// `host_not_allowed`, and so is one with invalid credentials (the
    /// HTTP gate's rule, ADR-067: [`HostCheck::admit`]).
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        extensions: &tonic::Extensions,
        authority: Option<&str>,
    ) -> Result<Identity, OpsError> {
        let cert = (self.cfg.client_cert.as_ref()).and_then(|f| f(extensions));
        let identity = (self.cfg.auth)
            .authenticate(authorization, cert.as_ref())
            .map_err(|e| OpsError::new(ErrorCode::Unauthorized, e.to_string()));
        HostCheck::admit(self.cfg.allowed_hosts.check(authority), identity)
    }

    /// Starts timing a call of `method`.
    pub(crate) fn call(&self, method: &'static str) -> Call<'_> {
        Call {
            shared: self,
            method,
            started: Instant::now(),
            who: std::sync::OnceLock::new(),
        }
    }
}

impl Call<'_> {
    /// The caller of `req`: the identity its admission authenticated from
    /// its headers and host ([`Admitted`], ADR-077). A request that did not
    /// pass the admission is authenticated here
    /// ([`Shared::authenticate`]), as naming no host.
    pub(crate) fn identity<T>(&self, req: &Request<T>) -> Result<Identity, OpsError> {
        let identity = match req.extensions().get::<Admitted>() {
            Some(a) => a.0.clone(),
            None => {
                let authorization = req.metadata().get("authorization").map(|v| v.as_bytes());
                (self.shared).authenticate(authorization, req.extensions(), None)?
            }
        };
        let _ = self.who.set(identity.name().to_string());
        Ok(identity)
    }

    /// Takes `bytes` of the server's message budget for `req`'s answer,
    /// held until the answer is sent, or refuses at once (`too_many`,
    /// `RESOURCE_EXHAUSTED`: ADR-074).
    pub(crate) fn hold<T>(&self, req: &Request<T>, bytes: u64) -> Result<(), OpsError> {
        match req.extensions().get::<HeldRef>() {
            Some(held) => held.0.hold(self.shared, bytes),
            None => Ok(()),
        }
    }

    /// The cache namespace `instance` names: itself, or for the empty
    /// name the server's only cache namespace (`invalid argument`
    /// otherwise, naming them). Not a cache namespace: `not_found`.
    pub(crate) fn namespace(&self, instance: &str) -> Result<String, OpsError> {
        let ops = &self.shared.ops;
        let ns = if instance.is_empty() {
            let all = &ops.config().cache_namespaces;
            match (all.len(), all.iter().next()) {
                (1, Some(ns)) => ns.to_string(),
                _ => {
                    let names: Vec<&str> = all.iter().map(|n| n.as_str()).collect();
                    return Err(OpsError::bad_request(format!(
                        "the instance name is empty and this server has {} cache namespaces \
                         ({names:?}): name one as the instance (Bazel: \
                         --remote_instance_name=NAMESPACE)",
                        names.len()
                    )));
                }
            }
        } else {
            instance.to_string()
        };
        ops.cache().check(&ns)?;
        Ok(ns)
    }

    /// Records the call's latency (to its answer or its response
    /// stream's start), counts its error, writes its access line (the
    /// HTTP gate's `blobpool::access` target, `protocol = "grpc"`), and
    /// maps the error.
    pub(crate) fn done<T>(self, r: Result<T, OpsError>) -> Result<T, Status> {
        let metrics = self.shared.ops.metrics();
        let secs = self.started.elapsed().as_secs_f64();
        metrics.request(Cow::Borrowed(self.method), "POST", secs);
        let r = r.map_err(|e| {
            metrics.error(e.code);
            status(&e)
        });
        let identity = self.who.get().map_or("-", |w| w.as_str());
        let code = r.as_ref().err().map_or(0, |s| s.code() as i32);
        access(identity, self.method, code, secs);
        r
    }
}

/// One access line (the HTTP gate's `blobpool::access` target,
/// `protocol = "grpc"`): who called `route`, its gRPC status `code`, in
/// `secs`.
pub(crate) fn access(identity: &str, route: &str, code: i32, secs: f64) {
    tracing::info!(
        target: "blobpool::access",
        protocol = "grpc",
        identity,
        route,
        code,
        duration_ms = secs * 1000.0,
        "request"
    );
}

/// One audit line (the HTTP binding's shape): who did what to which key,
/// and how it ended.
pub(crate) fn audit(identity: &Identity, action: &str, target: &str, outcome: &str) {
    tracing::info!(
        target: "blobpool::audit",
        protocol = "grpc",
        identity = identity.name(),
        action,
        target,
        outcome,
        "audit"
    );
}

/// Whether a write's refusal is one the audit log records (as over HTTP:
/// a scope or ownership refusal).
pub(crate) fn audited_refusal(e: &OpsError) -> bool {
    matches!(
        e.code,
        ErrorCode::Unauthorized | ErrorCode::Forbidden | ErrorCode::RefConflict
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_errors_map_to_the_grpc_codes_the_docs_name() {
        let cases = [
            (ErrorCode::Unauthorized, Code::Unauthenticated),
            (ErrorCode::Forbidden, Code::PermissionDenied),
            (ErrorCode::NotFound, Code::NotFound),
            (ErrorCode::Missing, Code::NotFound),
            (ErrorCode::Verification, Code::InvalidArgument),
            (ErrorCode::KeyInvalid, Code::InvalidArgument),
            (ErrorCode::UploadOffset, Code::InvalidArgument),
            (ErrorCode::TooLarge, Code::ResourceExhausted),
            (ErrorCode::UploadQuota, Code::ResourceExhausted),
            (ErrorCode::InvalidRange, Code::OutOfRange),
            (ErrorCode::Unavailable, Code::Unavailable),
            (ErrorCode::UploadBusy, Code::Aborted),
            (ErrorCode::Internal, Code::Internal),
        ];
        for (code, want) in cases {
            let s = status(&OpsError::new(code, "the cause /var/lib/x"));
            assert_eq!(s.code(), want, "{code}");
            // Media and backend failures never show their cause.
            assert_eq!(
                s.message().contains("/var/lib/x"),
                !code.redacts_message(),
                "{code}"
            );
            assert!(s.message().starts_with(code.as_str()), "{}", s.message());
        }
    }
}
