//! The composite fleet-validity predicate (ADR-012 §3, §4), judged from
//! engines' capability answers alone.

use std::sync::Arc;
use std::time::Duration;

use store_types::{Capabilities, Error, PinClauses, Result, Sharing, SweepLockClause};

use crate::Mode;

/// What a valid fleet configuration hands the store: the one GC-state host.
#[derive(Clone)]
pub(crate) struct FleetState {
    pub pins: Arc<dyn PinClauses>,
    pub lock: Arc<dyn SweepLockClause>,
    pub ttl: Duration,
}

pub(crate) fn validate(
    mode: Mode,
    kv: &Capabilities,
    large: Option<&Capabilities>,
    ttl: Duration,
) -> Result<FleetState> {
    if mode == Mode::MemOnly || kv.sharing == Sharing::ProcessLocal {
        return Err(Error::Config(format!(
            "fleet: true cannot use the in-memory engine `{}` as the kv tier: its data lives in one process and no other instance can see it",
            kv.kind
        )));
    }
    if let Some(l) = large {
        if l.sharing == Sharing::ProcessLocal {
            return Err(Error::Config(format!(
                "fleet: true cannot use the in-memory engine `{}` as the large tier: its data lives in one process and no other instance can see it",
                l.kind
            )));
        }
    }
    let host = kv.seam.as_ref().and_then(|s| {
        Some(FleetState {
            pins: s.pins.clone()?,
            lock: s.sweep_lock.clone()?,
            ttl,
        })
    });
    let Some(host) = host else {
        return Err(Error::Config(format!(
            "fleet: true requires a kv engine that hosts fleet GC state (pin rows and a shared sweep lock, i.e. postgres); kv engine `{}` does not",
            kv.kind
        )));
    };
    if let Some(l) = large {
        match l.sharing {
            Sharing::DeclaredMedia { shared_media: true } | Sharing::SharedService => {}
            Sharing::DatabaseServer if l.instance.same_database(&kv.instance) => {}
            Sharing::DeclaredMedia { shared_media: false } => {
                return Err(Error::Config(format!(
                    "fleet: true requires the large engine `{}` to be declared on shared media (every node must see the same files); set shared_media only if that is true",
                    l.kind
                )))
            }
            Sharing::DatabaseServer => {
                return Err(Error::Config(format!(
                    "fleet: true requires the large engine `{}` to live on the same PostgreSQL instance and database as the kv engine (large: {:?}, kv: {:?}); use fleet: false for cross-instance setups",
                    l.kind, l.instance, kv.instance
                )))
            }
            _ => {
                return Err(Error::Config(format!(
                    "fleet: true cannot use the large engine `{}`: its data is not shared between nodes",
                    l.kind
                )))
            }
        }
    }
    Ok(host)
}

/// A random owner name for fleet pin rows: host-independent, unique per
/// instance with overwhelming probability.
pub(crate) fn random_owner() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(&store_types::Timestamp::now().0.to_le_bytes());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    h.update(&nanos.to_le_bytes());
    format!("store-{}", &h.finalize().to_hex()[..16])
}
