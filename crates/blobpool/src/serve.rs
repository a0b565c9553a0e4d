//! `blobpool serve`: the HTTP server over the configured store.

use std::io::IsTerminal;

use store_ops::Ops;
use tracing_subscriber::EnvFilter;

use crate::config::Config;
use crate::output::CliError;

/// Opens the store, binds `cfg.listen` and serves until Ctrl-C or SIGTERM,
/// letting in-flight requests finish. Prints `listening on http://ADDR` on
/// stderr once bound (the actual port when `:0` was asked for).
///
/// Not cancel-safe in the graceful sense: dropping the future stops the
/// server at once, without draining in-flight requests (see
/// [`store_ops::http::serve`]); the signals are the way to stop it.
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
    let ops = Ops::new(store, cfg.ops_config())?;
    log_token_policy(&ops);
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

/// States the pin-token policy at startup; warns when an operator gave
/// non-fleet tokens an idle lifetime (ADR-018: by default they never
/// expire, as ADR-012 §2 says).
fn log_token_policy(ops: &Ops) {
    let c = ops.config();
    let per_owner = match c.max_tokens_per_owner {
        Some(n) => format!(", at most {n} per owner"),
        None => String::new(),
    };
    match (ops.store().is_fleet(), c.token_ttl) {
        (false, Some(ttl)) => tracing::warn!(
            "token_ttl is set ({}s) outside a fleet: a pin token not renewed for that long \
             expires and stops protecting its entry, which a sweep may then delete \
             (by default non-fleet tokens never expire; ADR-018)",
            ttl.as_secs()
        ),
        (false, None) => tracing::info!(
            "pin tokens: no idle expiry (released explicitly); at most {} live{per_owner}",
            c.max_tokens
        ),
        (true, ttl) => tracing::info!(
            "pin tokens: idle expiry {}s (fleet, at most pin_ttl); at most {} live{per_owner}",
            ttl.map_or(0, |t| t.as_secs()),
            c.max_tokens
        ),
    }
}
