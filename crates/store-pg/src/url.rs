//! The URLs of both PostgreSQL engines (`postgres://…[?schema=S]`,
//! `pglo://…[?schema=S]`, ADR-027): the driver URL and the schema.

use store_types::registry::{EngineUrl, Options};

/// Splits `schema=` out of a PostgreSQL URL's query string: the URL for
/// the driver and the schema, if given.
pub fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|p| {
            if let Some(v) = p.strip_prefix("schema=") {
                schema = Some(v.to_string());
                false
            } else {
                !p.is_empty()
            }
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, schema)
}

/// The driver URL (`postgres://`, without `schema=`) and the schema of a
/// URL, the default schema from `options`.
pub fn target(url: &EngineUrl, options: &Options) -> (String, String) {
    let (driver, schema) = split_schema(&format!("postgres://{}", url.rest()));
    (driver, schema.unwrap_or_else(|| options.schema.clone()))
}
