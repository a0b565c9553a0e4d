//! `blobpool serve`: the HTTP server over the configured store.

use std::io::IsTerminal;

use store_ops::Ops;
use tracing_subscriber::EnvFilter;

use crate::config::Config;
use crate::output::CliError;

/// Opens the store, binds `cfg.listen` and serves until Ctrl-C or SIGTERM,
/// letting in-flight requests finish. Prints `listening on http://ADDR` on
/// stderr once bound (the actual port when `:0` was asked for).
pub async fn run(cfg: Config) -> Result<(), CliError> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    let store = cfg.open_store().await?;
    let unreferenced: Vec<&str> = cfg
        .unreferenced_namespaces
        .iter()
        .map(|n| n.as_str())
        .collect();
    tracing::info!("store: {store:?}; unreferenced namespaces (swept): {unreferenced:?}");
    let ops = Ops::new(store, cfg.ops_config());
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| CliError::io(&format!("cannot listen on {}", cfg.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::io("cannot read the listen address", e))?;
    eprintln!("blobpool: listening on http://{addr}");
    store_ops::http::serve(listener, ops, store_ops::http::shutdown_signal())
        .await
        .map_err(|e| CliError::io("server failed", e))?;
    eprintln!("blobpool: stopped");
    Ok(())
}
