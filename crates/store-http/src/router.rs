//! Router assembly: the route table ([`routes::ROUTES`]) and the cache
//! namespaces' own base paths, behind the gate and, when origins are
//! configured, CORS.

use axum::Router;
use store_ops::Ops;

use crate::{
    cache, gate, handlers, routes, HttpConfig, HEADER_CREATED_AT, HEADER_DEDUPLICATED,
    HEADER_DIGEST, HEADER_EXPECT_DIGEST, HEADER_REQUEST_ID, HEADER_TIER, HEADER_UPLOAD_OFFSET,
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
    routes::mount(router)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(ops)
}
