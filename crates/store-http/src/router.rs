//! Router assembly: every route of the crate documentation bound to its
//! handler, behind the gate and, when origins are configured, CORS.

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use axum::Router;
use store_ops::Ops;

use crate::{
    admin, cache, gate, handlers, refs, uploads, HttpConfig, HEADER_CREATED_AT,
    HEADER_DEDUPLICATED, HEADER_DIGEST, HEADER_EXPECT_DIGEST, HEADER_REQUEST_ID, HEADER_TIER,
    HEADER_UPLOAD_OFFSET,
};

/// The axum router over `ops` with [`HttpConfig::default`] (open, any
/// `Host`, no CORS).
pub fn router(ops: Ops) -> Router {
    router_with(ops, &HttpConfig::default())
}

/// The axum router over `ops`: the routes behind the gate (request id,
/// `Host` check, authentication, access log) and, when origins are
/// configured, CORS.
pub fn router_with(ops: Ops, cfg: &HttpConfig) -> Router {
    let gate = gate::Gate::new(ops.clone(), cfg);
    let app = routes(ops).layer(axum::middleware::from_fn_with_state(gate, gate::gate));
    if cfg.cors_origins.is_empty() {
        return app;
    }
    app.layer(cors(&cfg.cors_origins))
}

/// CORS for the configured origins only: the methods and headers the API
/// uses, our response headers exposed, credentials (the `Authorization`
/// header) allowed.
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use axum::http::{header, HeaderName, Method};
    let origins: Vec<axum::http::HeaderValue> = origins
        .iter()
        .filter_map(|o| axum::http::HeaderValue::from_str(o.trim()).ok())
        .collect();
    tower_http::cors::CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([
            Method::GET,
            Method::HEAD,
            Method::PUT,
            Method::POST,
            Method::DELETE,
            Method::PATCH,
        ])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::RANGE,
            header::CONTENT_RANGE,
            HeaderName::from_static(HEADER_EXPECT_DIGEST),
        ])
        .expose_headers([
            header::CONTENT_RANGE,
            header::ETAG,
            HeaderName::from_static(HEADER_DIGEST),
            HeaderName::from_static(HEADER_TIER),
            HeaderName::from_static(HEADER_CREATED_AT),
            HeaderName::from_static(HEADER_DEDUPLICATED),
            HeaderName::from_static(HEADER_REQUEST_ID),
            HeaderName::from_static(HEADER_UPLOAD_OFFSET),
            header::LOCATION,
        ])
        .allow_credentials(true)
}

fn routes(ops: Ops) -> Router {
    let mut router = Router::new();
    // Cache namespaces' own base paths (`http_path`), beside /cache/{ns}.
    for (path, ns) in &ops.config().cache_paths {
        let base = path.trim_end_matches('/');
        router = router
            .route(base, cache::alias(ns.to_string(), false))
            .route(&format!("{base}/"), cache::alias(ns.to_string(), false))
            .route(
                &format!("{base}/{{*key}}"),
                cache::alias(ns.to_string(), true),
            );
    }
    router
        .route(
            "/v1/blobs/{ns}",
            // The handler streams the body itself; no default 2 MB limit.
            put(handlers::put_blob).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/blobs/{ns}/{digest}",
            get(handlers::get_blob)
                .head(handlers::head_blob)
                .delete(handlers::delete_blob),
        )
        .route("/v1/uploads/{ns}", post(uploads::open))
        .route(
            "/v1/uploads/{ns}/{id}",
            axum::routing::patch(uploads::append)
                .head(uploads::status)
                .put(uploads::finish)
                .delete(uploads::abort)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/have", post(handlers::have))
        .route("/v1/tokens/{token}", delete(handlers::release_token))
        .route("/v1/sweep", post(handlers::sweep))
        .route("/v1/refs/{ns}", get(refs::list_refs))
        .route(
            "/v1/refs/{ns}/{*name}",
            put(refs::set_ref)
                .get(refs::get_ref)
                .delete(refs::delete_ref),
        )
        .route("/v1/namespaces", get(admin::namespaces))
        .route("/v1/namespaces/{ns}/entries", get(admin::entries))
        .route("/v1/stats", get(admin::stats))
        .route("/v1/verify", post(admin::verify))
        .route(
            "/cache/{ns}",
            axum::routing::any(cache::cache_ns).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/cache/{ns}/",
            axum::routing::any(cache::cache_ns).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/cache/{ns}/{*key}",
            axum::routing::any(cache::cache_key).layer(DefaultBodyLimit::disable()),
        )
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(ops)
}
