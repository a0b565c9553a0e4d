//! TLS reload on SIGHUP (Unix): new connections use the re-read files,
//! existing ones are untouched, a failed reload keeps the previous
//! configuration.

use std::sync::Arc;

use crate::tls::TlsReloader;

/// A task that reloads `tls` on SIGHUP (without TLS it only logs that
/// there is nothing to reload: the signal's default action would stop the
/// process); aborted when dropped.
pub(super) fn spawn_sighup_reloader(tls: Option<Arc<TlsReloader>>) -> AbortOnDrop {
    #[cfg(unix)]
    let task = {
        use tokio::signal::unix::{signal, SignalKind};
        // Registered here, before the accept loop starts, so a SIGHUP sent
        // once the server answers is always seen by the loop below.
        let hup = signal(SignalKind::hangup());
        tokio::spawn(async move {
            let mut hup = match hup {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot listen for SIGHUP (TLS reload disabled): {e}");
                    return;
                }
            };
            while hup.recv().await.is_some() {
                let Some(tls) = &tls else {
                    tracing::info!("SIGHUP: nothing to reload (no [tls]); still serving");
                    continue;
                };
                match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CA reloaded"),
                    Err(e) => tracing::error!(
                        "SIGHUP: TLS reload failed, keeping the previous configuration: {e}"
                    ),
                }
            }
        })
    };
    #[cfg(not(unix))]
    let task = tokio::spawn(async move {
        let _ = tls;
    });
    AbortOnDrop(task)
}

/// A task aborted when this is dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
