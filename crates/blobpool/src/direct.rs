//! Commands run directly on a store opened from the configuration.

use store_core::{Store, SweepOptions, SweepReport};
use store_ops::StatResponse;
use store_types::{Digest, Key, Namespace};

use crate::output::{missing, CliError, GetResult, HasResult, PutResult};
use crate::progress::{bar, ProgressRead};
use crate::transfer::{Sink, Source};

/// The CLI error of a failed direct open. When another non-fleet instance
/// holds the data (typically `blobpool serve` on the same configuration),
/// the message names the holder and suggests talking to that server with
/// `--server` at the configured `listen` address.
pub fn open_error(e: store_types::Error, listen: &str) -> CliError {
    match &e {
        store_types::Error::InstanceLocked { .. } => CliError::new(
            "locked",
            format!(
                "{e}; if that is `blobpool serve`, run this command through it with \
                 --server {} (or stop it first)",
                server_url(listen)
            ),
        ),
        _ => e.into(),
    }
}

/// The URL a client uses for a server listening on `listen`: a wildcard
/// address is reached through loopback.
fn server_url(listen: &str) -> String {
    let addr = match listen.rsplit_once(':') {
        Some(("0.0.0.0", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => listen.to_string(),
    };
    format!("http://{addr}")
}

/// A store opened in this process.
pub struct Direct {
    store: Store,
    progress: bool,
}

impl Direct {
    /// Wraps an opened store.
    pub fn new(store: Store, progress: bool) -> Self {
        Direct { store, progress }
    }

    /// The opened store (`ls`, `du`, `verify`).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Stores `src` in `ns`. The put's pin ends with this process: in a
    /// namespace that a liveness source governs, the entry is garbage for
    /// the next sweeps unless something references it.
    pub async fn put(
        &self,
        ns: &Namespace,
        src: &Source,
        expect: Option<Digest>,
    ) -> Result<PutResult, CliError> {
        let (reader, len) = src.open().await?;
        let pb = bar(self.progress, len, "put");
        let reader = ProgressRead::new(reader, pb.clone());
        let r = self
            .store
            .put_opts(ns, reader, store_core::PutOptions { len, expect })
            .await;
        pb.finish_and_clear();
        let receipt = r?;
        Ok(PutResult {
            namespace: ns.to_string(),
            digest: receipt.digest.to_hex(),
            size: Some(receipt.size),
            tier: Some(receipt.tier),
            deduplicated: Some(receipt.deduplicated),
            token: None,
            released: None,
        })
    }

    /// Writes the verified content of `key` to `sink`. A failed read
    /// (including a verification failure, which the store reports at the
    /// end of the content) discards a file sink; a closed stdout is
    /// [`CliError::stdout_closed`].
    pub async fn get(&self, key: &Key, sink: Sink) -> Result<GetResult, CliError> {
        self.get_maybe_range(key, None, sink).await
    }

    /// `range` of the entry into `sink`, verified by chunk group before any
    /// of its bytes is written ([`store_core::Store::read_range`], ADR-032).
    /// Cancel-safe as [`Direct::get`].
    pub async fn get_range(
        &self,
        key: &Key,
        range: std::ops::Range<u64>,
        sink: Sink,
    ) -> Result<GetResult, CliError> {
        self.get_maybe_range(key, Some(range), sink).await
    }

    async fn get_maybe_range(
        &self,
        key: &Key,
        range: Option<std::ops::Range<u64>>,
        mut sink: Sink,
    ) -> Result<GetResult, CliError> {
        let got = match range {
            None => self.store.get(key).await,
            Some(r) => match self.store.read_range(key, r).await {
                Ok(b) => Ok(Some(b)),
                Err(store_types::Error::Missing) => Ok(None),
                Err(e) => Err(e),
            },
        };
        let blob = match got {
            Ok(Some(b)) => b,
            Ok(None) => {
                sink.abort().await;
                return Err(missing(key));
            }
            Err(e) => {
                sink.abort().await;
                return Err(e.into());
            }
        };
        let len = blob.len();
        let pb = bar(self.progress, Some(len), "get");
        let mut blob = blob;
        let copied = async {
            let mut n: u64 = 0;
            // The engine's own read-ahead chunks where it has them, with no
            // copy (TUNING.md §response-chunks); verified as they pass, the call after the last
            // one failing on a bad digest (the file sink is then discarded).
            while let Some(chunk) = blob
                .next_chunk()
                .await
                .map_err(|e| CliError::from(store_types::Error::from(e)))?
            {
                sink.write_all(&chunk).await?;
                pb.inc(chunk.len() as u64);
                n += chunk.len() as u64;
            }
            Ok::<u64, CliError>(n)
        }
        .await;
        pb.finish_and_clear();
        match copied {
            Ok(n) => {
                let path = sink.path().map(|p| p.display().to_string());
                sink.commit().await?;
                Ok(GetResult {
                    namespace: key.namespace.to_string(),
                    digest: key.digest.to_hex(),
                    size: n,
                    path,
                })
            }
            Err(e) => {
                sink.abort().await;
                Err(e)
            }
        }
    }

    /// Size, tier and creation time.
    pub async fn stat(&self, key: &Key) -> Result<StatResponse, CliError> {
        let s = self.store.stat(key).await?.ok_or_else(|| missing(key))?;
        Ok(StatResponse {
            namespace: key.namespace.to_string(),
            digest: key.digest.to_hex(),
            size: s.size,
            tier: s.tier,
            created_at: s.created_at.0,
        })
    }

    /// Presence of each digest.
    pub async fn has(&self, ns: &Namespace, digests: &[Digest]) -> Result<HasResult, CliError> {
        let present = self.store.has_many(ns, digests).await?;
        Ok(HasResult {
            namespace: ns.to_string(),
            digests: digests.iter().map(Digest::to_hex).collect(),
            present,
        })
    }

    /// Direct delete (refused while protected).
    pub async fn rm(&self, key: &Key) -> Result<(), CliError> {
        Ok(self.store.delete(key).await?)
    }

    /// One sweep.
    pub async fn sweep(&self) -> Result<SweepReport, CliError> {
        Ok(self.store.gc().sweep(SweepOptions::default()).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_store_suggests_the_configured_server() {
        let e = store_types::Error::InstanceLocked {
            resource: "the SQLite database /d/kv.sqlite".into(),
            holder: "pid 42 on host h since 2026-12-01T20:05:03Z".into(),
        };
        let c = open_error(e.clone(), "0.0.0.0:7070");
        assert_eq!(c.code, "locked");
        assert!(c.message.contains("(pid 42 on host h since"), "{c}");
        assert!(c.message.contains("--server http://127.0.0.1:7070"), "{c}");
        let c = open_error(e, "[::]:80");
        assert!(c.message.contains("--server http://[::1]:80"), "{c}");
        assert_eq!(server_url("10.0.0.5:7070"), "http://10.0.0.5:7070");
        let c = open_error(store_types::Error::Config("bad".into()), "x");
        assert_eq!(c.code, "config");
    }
}
