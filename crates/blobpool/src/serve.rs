//! `blobpool serve`: the HTTP server over the configured store.

use std::io::IsTerminal;

use store_ops::Ops;
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};
use crate::output::CliError;

mod waits;

/// The git commit this binary was built from (`build.rs`), or empty when
/// it was not built from a git checkout.
pub const BUILD_GIT_COMMIT: &str = env!("BUILD_GIT_COMMIT");

/// Opens the store, binds `cfg.listen` and serves until Ctrl-C or SIGTERM,
/// letting in-flight requests finish within the drain deadline. Prints
/// `listening on http://ADDR` (or `https://`) on stderr once bound (the
/// actual port when `:0` was asked for).
///
/// Refuses to start on a non-loopback address without any identity
/// configured, unless `insecure_no_auth` (docs/SERVER.md, Security).
///
/// Not cancel-safe in the graceful sense: dropping the future stops the
/// server at once, without draining in-flight requests (see
/// [`store_http::serve_with`]); the signals are the way to stop it.
pub async fn run(cfg: Config) -> Result<(), CliError> {
    init_logging(cfg.log_format);
    // Checked before the store opens: a refused configuration touches no data.
    let http = cfg
        .sections
        .http_config(&cfg.listen, cfg.insecure_no_auth)
        .map_err(CliError::config)?;
    // Before anything is created: the data dir, its database, its files
    // and the upload spool are private by default (umask 0077).
    // SAFETY: umask only swaps the process's file mode mask.
    let previous = unsafe { libc::umask(cfg.umask as libc::mode_t) };
    tracing::debug!("umask {:04o} (was {previous:04o})", cfg.umask);
    // Take SIGHUP over before anything else: its default action stops the
    // process, and the server's own handler (a TLS reload, or a log line
    // without TLS) is installed only when serving starts. Once registered,
    // tokio keeps the handler for the life of the process.
    #[cfg(unix)]
    let _hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| CliError::io("cannot handle SIGHUP", e))?;
    match store_http::raise_nofile_limit() {
        Ok((soft, hard)) => tracing::info!("open files limit: {soft} (hard {hard})"),
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    // Both tiers observed by store-layers' metrics layer (per-engine,
    // per-operation latency and errors, on `/metrics` beside the server's).
    let engine_metrics = store_layers::MetricsLayer::new();
    let store = cfg.open_node_store_observed(&engine_metrics).await?;
    tracing::info!("{}", cfg.describe());
    let ops = Ops::new(store, cfg.ops_config())?;
    ops.metrics().set_extra(Box::new(move || {
        store_layers::render_prometheus(&engine_metrics.snapshot())
    }));
    // Where the SQLite database's writes and reads waited (ADR-073).
    ops.metrics().set_database_waits(Box::new(waits::sqlite));
    if !BUILD_GIT_COMMIT.is_empty() {
        ops.metrics().set_build_commit(BUILD_GIT_COMMIT);
    }
    let scheduler = match cfg.gc.interval {
        Some(every) => {
            tracing::info!(target: "blobpool::gc", "scheduled sweeps every {}s (±10%)", every.as_secs());
            Some(crate::gc::spawn_scheduler(ops.clone(), every))
        }
        None => {
            tracing::info!(target: "blobpool::gc", "no scheduled sweeps (gc.interval = \"off\"): POST /v1/sweep runs one");
            None
        }
    };
    log_token_policy(&ops);
    log_security(&cfg, &http);
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| CliError::io(&format!("cannot listen on {}", cfg.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::io("cannot read the listen address", e))?;
    let scheme = if http.tls.is_some() { "https" } else { "http" };
    eprintln!("blobpool: listening on {scheme}://{addr}");
    // The accept loop runs on a runtime worker, not on the thread that
    // called `block_on`: a connection task spawned from a worker starts
    // in that worker's own queue instead of waking another thread
    // (ADR-056, fresh connections).
    let serving = tokio::spawn(serve_http_and_grpc(listener, ops, http));
    let served = serving.await.unwrap_or_else(|e| {
        Err(std::io::Error::other(format!(
            "the server task failed: {e}"
        )))
    });
    if let Some(s) = scheduler {
        // A sweep cut here is cancel-safe (ADR-021): it stops between
        // batches' commits.
        s.abort();
    }
    served.map_err(|e| CliError::io("server failed", e))?;
    eprintln!("blobpool: stopped");
    Ok(())
}

/// [`store_http::serve_with`] with the gRPC services (store-grpc, ADR-071)
/// mounted beside the HTTP routes on the same port: a request whose
/// `content-type` is `application/grpc…` goes to gRPC, every other one to
/// HTTP. gRPC authenticates with the same identities (and the client
/// certificate the connection layer verified) and checks the same allowed
/// hosts for callers without credentials.
async fn serve_http_and_grpc(
    listener: tokio::net::TcpListener,
    ops: Ops,
    http: store_http::HttpConfig,
) -> std::io::Result<()> {
    for o in &http.cors_origins {
        store_http::check_cors_origin(o).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("cors_origins {o:?}: {e}"),
            )
        })?;
    }
    let tasks = ops.spawn_tasks();
    let grpc = store_grpc::GrpcConfig {
        auth: http.auth.clone(),
        client_cert: Some(std::sync::Arc::new(|e: &store_grpc::Extensions| {
            e.get::<store_http::PeerInfo>()
                .and_then(|p| p.client_cert.clone())
        })),
        // The HTTP gate's DNS-rebinding check, for gRPC too (ADR-074).
        allowed_hosts: store_ops::hosts::HostCheck::new(&http.allowed_hosts),
        ..Default::default()
    };
    let app = store_grpc::mount(store_http::router_with(ops.clone(), &http), ops, grpc);
    let shutdown = store_http::shutdown_signal();
    let result = store_http::serve_router(listener, app, http.limits, http.tls, shutdown).await;
    tasks.iter().for_each(|t| t.abort());
    result
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// States who may do what, and warns about an open server off loopback,
/// about credentials sent in clear text off loopback, and about a Host
/// check turned off on purpose (`allowed_hosts = ["*"]`).
fn log_security(cfg: &Config, http: &store_http::HttpConfig) {
    for warning in security_warnings(cfg, http) {
        tracing::warn!("{warning}");
    }
    let tls = match &http.tls {
        None => "off".to_string(),
        Some(t) if t.client_ca.is_some() => format!("on, client certificates {:?}", t.client_auth),
        Some(_) => "on".to_string(),
    };
    if http.auth.is_enabled() {
        let anon: Vec<String> = http
            .auth
            .anonymous_grants()
            .iter()
            .map(|g| g.to_string())
            .collect();
        tracing::info!(
            "auth: {} identities; anonymous may {:?}; TLS {tls}; allowed hosts {:?}",
            http.auth.identities(),
            anon,
            http.allowed_hosts
        );
    } else if crate::security::is_loopback(&cfg.listen) {
        tracing::info!(
            "auth: none (loopback listen: everyone on this host may do everything); TLS {tls}; \
             allowed hosts {:?}",
            http.allowed_hosts
        );
    } else {
        tracing::warn!(
            "auth: NONE on {} (insecure_no_auth): anyone who reaches this address may read, \
             write, delete and sweep; TLS {tls}",
            cfg.listen
        );
    }
}

/// The startup warnings about the network-facing configuration, each one
/// line saying what is exposed and how to fix it.
fn security_warnings(cfg: &Config, http: &store_http::HttpConfig) -> Vec<String> {
    let mut warnings = Vec::new();
    let loopback = crate::security::is_loopback(&cfg.listen);
    if http.auth.is_enabled() && http.tls.is_none() && !loopback {
        warnings.push(format!(
            "auth: API keys over plain HTTP on {}: every request's key (its Authorization \
             header, or the password of Basic credentials), the pin tokens and the blobs cross \
             the network in clear text, so anyone on the path can read them and reuse the keys. \
             Configure [tls] cert and key (BLOBPOOL_TLS_CERT, BLOBPOOL_TLS_KEY), or terminate \
             TLS in a proxy and listen on 127.0.0.1 or a private interface only it reaches",
            cfg.listen
        ));
    }
    if http
        .allowed_hosts
        .iter()
        .any(|h| h.trim() == crate::security::ANY_HOST)
    {
        warnings.push(
            "http.allowed_hosts = [\"*\"]: every Host is answered, so the DNS rebinding check \
             is off and a web page whose name resolves to this server can reach it from a \
             browser; list the names clients use instead (e.g. [\"blobs.example.com\"])"
                .to_string(),
        );
    }
    warnings
}

/// States the pin-token policy at startup; warns when an operator gave
/// non-fleet tokens an idle lifetime (ADR-018: by default they never
/// expire, as ADR-012 §2 says).
fn log_token_policy(ops: &Ops) {
    let c = ops.config();
    let per_owner = match c.max_tokens_per_owner {
        Some(n) => format!(", at most {n} per identity"),
        None => String::new(),
    };
    match (ops.store().gc().is_fleet(), c.token_ttl) {
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

#[cfg(test)]
mod tests {
    /// `build.rs` recorded the checkout's HEAD, or nothing outside one.
    #[test]
    fn the_build_commit_is_head_when_built_from_a_checkout() {
        let head = std::process::Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR")])
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string())
            .unwrap_or_default();
        assert_eq!(super::BUILD_GIT_COMMIT, head);
    }

    /// Issue 39 item 3: keys over plain HTTP off loopback, and a Host check
    /// turned off on purpose, are warned about at startup (each one line
    /// saying what is exposed and how to fix it); nothing else is.
    #[test]
    fn security_warnings_name_what_is_exposed_and_the_fix() {
        let key = format!(
            "[[auth.keys]]\nname = \"ci\"\nhash = \"{}\"\nscopes = [\"read\"]\n",
            store_ops::auth::hash_key("bpk_x")
        );
        let tls = "[tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n";
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("blobpool.toml");
        let warnings = |text: &str| {
            std::fs::write(&file, text).unwrap();
            let cfg = crate::config::Config::load(Some(&file), &|_| None).unwrap();
            let http = cfg
                .sections
                .http_config(&cfg.listen, cfg.insecure_no_auth)
                .unwrap();
            super::security_warnings(&cfg, &http)
        };
        let w = warnings(&format!("listen = \"0.0.0.0:7070\"\n{key}"));
        assert_eq!(w.len(), 1, "{w:?}");
        for part in [
            "plain HTTP on 0.0.0.0:7070",
            "clear text",
            "Authorization",
            "[tls] cert and key",
            "proxy",
        ] {
            assert!(w[0].contains(part), "{part:?} in {}", w[0]);
        }
        for quiet in [
            format!("listen = \"127.0.0.1:7070\"\n{key}"),
            format!("listen = \"0.0.0.0:7070\"\n{key}{tls}"),
            "listen = \"127.0.0.1:7070\"\n".to_string(),
            format!(
                "listen = \"0.0.0.0:7070\"\n{key}{tls}[http]\nallowed_hosts = [\"b.example\"]\n"
            ),
        ] {
            assert_eq!(warnings(&quiet), Vec::<String>::new(), "{quiet}");
        }
        let w = warnings("[http]\nallowed_hosts = [\"*\"]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("DNS rebinding"), "{}", w[0]);
    }
}
