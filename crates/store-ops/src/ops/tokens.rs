//! The pin-token handlers: release, the owner check, the cap refusal.

use std::time::{Duration, Instant};

use store_core::Key;

use super::Ops;
use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::tokens::TokenCapReached;

/// At most one "cap reached" warning per this interval.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(60);

impl Ops {
    /// The `too_many_tokens` answer; logs a warning at most once a minute.
    pub(super) fn cap_reached(&self, e: TokenCapReached) -> OpsError {
        let now = Instant::now();
        let mut last = self
            .inner
            .last_cap_warning
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| now.duration_since(t) >= CAP_WARNING_EVERY) {
            *last = Some(now);
            let st = self.inner.tokens.stats();
            tracing::warn!(
                "refusing puts: {e} ({} live tokens, {} puts in flight, {} refusals so far)",
                st.live,
                st.reserved,
                st.refused
            );
        }
        e.into()
    }

    /// Releases a pin token for `identity` (its pin is dropped, its slot
    /// under the caps freed). `missing` if the token is unknown, expired
    /// or was minted by another process. Only the token's owner, or an
    /// identity with [`Scope::Admin`], may release it (`forbidden`
    /// otherwise, nothing released). The owner also needs
    /// [`Scope::Write`] on the token's namespace (a key whose write scope
    /// was withdrawn cannot act on what it minted). Returns the key the
    /// token pinned (for the audit line).
    pub fn release_token(&self, identity: &Identity, token: &str) -> Result<Key, OpsError> {
        let (key, _) = self.check_owner(identity, token)?;
        if !identity.allows(Scope::Admin, None) {
            self.authorize(identity, Scope::Write, Some(key.namespace.as_str()))?;
        }
        if self.inner.tokens.release(token) {
            Ok(key)
        } else {
            Err(OpsError::new(ErrorCode::Missing, "no such token"))
        }
    }

    /// The token's key and owner, if `identity` may act on it: it owns it,
    /// or is an admin. An unknown token is `missing`.
    pub(crate) fn check_owner(
        &self,
        identity: &Identity,
        token: &str,
    ) -> Result<(Key, String), OpsError> {
        let (key, owner) = self
            .inner
            .tokens
            .lookup(token)
            .ok_or_else(|| OpsError::new(ErrorCode::Missing, "no such token"))?;
        if owner != identity.name() && !identity.allows(Scope::Admin, None) {
            return Err(if identity.is_anonymous() {
                OpsError::new(
                    ErrorCode::Unauthorized,
                    "authentication required: this pin token belongs to an identity",
                )
            } else {
                OpsError::new(
                    ErrorCode::Forbidden,
                    "this pin token belongs to another identity",
                )
            });
        }
        Ok((key, owner))
    }
}
