//! The engine's registry entry (ADR-027): object-store URLs, large tier.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use store_types::registry::{
    parse_count_param, parse_size_param, EngineFactory, EngineUrl, Opened, Options, ParamError,
};
use store_types::{Error, LargeEngine, Result, Sharing, Tier};

use crate::{ObjectEngine, ObjectOptions};

/// `s3://BUCKET/PREFIX` (settings from the `AWS_*` environment and
/// `aws_*` params), `gs://…`, `az://…` (and object_store's other Azure
/// forms), `http(s)://…`, `object+file:///PATH` and `object+memory://`.
///
/// Settings, in [`Options::params`] or the URL's query:
/// `multipart_threshold`, `part_size` (sizes), `upload_concurrency`,
/// `request_concurrency`, `list_min_group` (counts), `staging_grace`
/// (seconds), `probe_conditional`, `direct_expected_puts` (booleans), and
/// object_store configuration keys (`aws_…`, `google_…`, `azure_…`, and
/// the HTTP client's: `allow_http`, `timeout`, …). `object+file://` also
/// takes [`Options::shared_media`].
pub static REGISTRATION: &dyn EngineFactory = &ObjectFactory;

/// The factory behind [`REGISTRATION`].
struct ObjectFactory;

/// The engine's own settings (the rest go to object_store).
const PARAMS: &[&str] = &[
    "multipart_threshold",
    "part_size",
    "upload_concurrency",
    "request_concurrency",
    "list_min_group",
    "staging_grace",
    "probe_conditional",
    "direct_expected_puts",
];

/// object_store's HTTP client settings, valid for every cloud backend.
const CLIENT_PARAMS: &[&str] = &[
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "timeout",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "user_agent",
    "http1_only",
    "http2_only",
];

/// The object_store URL behind an engine URL (`object+` dropped).
fn backend_url(url: &EngineUrl) -> String {
    let scheme = url.scheme().strip_prefix("object+").unwrap_or(url.scheme());
    format!("{scheme}://{}", url.rest())
}

/// The object_store configuration prefix of a URL's backend.
fn config_prefix(url: &EngineUrl) -> Option<&'static str> {
    match url.scheme() {
        "s3" | "s3a" => Some("aws_"),
        "gs" => Some("google_"),
        "az" | "azure" | "abfs" | "abfss" | "adl" => Some("azure_"),
        "http" | "https" => Some(""),
        _ => None,
    }
}

fn parse_bool(v: &str) -> std::result::Result<bool, ParamError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ParamError::NotABool),
    }
}

fn parse_usize_size(v: &str) -> std::result::Result<usize, ParamError> {
    usize::try_from(parse_size_param(v)?).map_err(|_| ParamError::TooLarge(v.to_string()))
}

/// The engine options and object_store configuration of `options`.
fn split(url: &EngineUrl, options: &Options) -> Result<(ObjectOptions, Vec<(String, String)>)> {
    let mut o = ObjectOptions::default();
    let p = |key, parse| options.parsed("object", key, parse);
    if let Some(n) = p("multipart_threshold", parse_usize_size)? {
        o.multipart_threshold = n;
    }
    if let Some(n) = p("part_size", parse_usize_size)? {
        o.part_size = n;
    }
    if let Some(n) = options.parsed("object", "upload_concurrency", parse_count_param)? {
        o.upload_concurrency = n;
    }
    if let Some(n) = options.parsed("object", "request_concurrency", parse_count_param)? {
        o.request_concurrency = n;
    }
    if let Some(n) = options.parsed("object", "list_min_group", parse_count_param)? {
        o.list_min_group = n;
    }
    if let Some(s) = options.parsed("object", "staging_grace", |v| {
        v.trim_end_matches('s')
            .parse::<u64>()
            .map_err(ParamError::NotSeconds)
    })? {
        o.staging_grace = Duration::from_secs(s);
    }
    if let Some(b) = options.parsed("object", "probe_conditional", parse_bool)? {
        o.probe_conditional = b;
    }
    if let Some(b) = options.parsed("object", "direct_expected_puts", parse_bool)? {
        o.direct_expected_puts = b;
    }
    if o.part_size == 0 || o.upload_concurrency == 0 {
        return Err(Error::Config(
            "object option part_size and upload_concurrency must be positive".into(),
        ));
    }
    if url.scheme() == "object+file" && options.shared_media {
        o.sharing = Some(Sharing::DeclaredMedia { shared_media: true });
    }
    let config = options
        .params
        .iter()
        .filter(|(k, _)| !PARAMS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok((o, config))
}

#[async_trait]
impl EngineFactory for ObjectFactory {
    fn name(&self) -> &'static str {
        "object"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &[
            "s3",
            "s3a",
            "gs",
            "az",
            "azure",
            "abfs",
            "abfss",
            "adl",
            "http",
            "https",
            "object+file",
            "object+memory",
        ]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Large]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "s3://BUCKET/PREFIX, gs://…, az://…, http(s)://…, object+file:///PATH, object+memory://"
    }

    fn accepts_param(&self, url: &EngineUrl, key: &str) -> bool {
        PARAMS.contains(&key)
            || config_prefix(url).is_some_and(|prefix| {
                (!prefix.is_empty() && key.starts_with(prefix)) || CLIENT_PARAMS.contains(&key)
            })
    }

    fn param_names(&self) -> &'static [&'static str] {
        PARAMS
    }

    fn query_params(&self) -> bool {
        true
    }

    fn private(&self, url: &EngineUrl) -> bool {
        url.scheme() == "object+memory"
    }

    fn check(&self, url: &EngineUrl, _tier: Tier, options: &Options) -> Result<()> {
        if url.scheme() == "object+file" && !url.rest().starts_with('/') {
            return Err(Error::Config(format!(
                "{url:?} must name an absolute directory: object+file:///path/to/dir"
            )));
        }
        split(url, options).map(drop)
    }

    fn describe(&self, url: &EngineUrl, _tier: Tier, _options: &Options) -> String {
        format!(
            "object {}",
            store_types::registry::redact_url(&backend_url(url))
        )
    }

    async fn open_large(
        &self,
        url: &EngineUrl,
        options: &Options,
    ) -> Result<Opened<dyn LargeEngine>> {
        let (o, config) = split(url, options)?;
        let engine = ObjectEngine::from_url_with(&backend_url(url), o, config).await?;
        Ok(opened(engine))
    }
}

/// `engine` with its test hooks (feature `testing`).
fn opened(engine: ObjectEngine) -> Opened<dyn LargeEngine> {
    #[cfg(feature = "testing")]
    let testing: Option<Arc<dyn store_types::registry::Testing>> =
        Some(Arc::new(hooks::ObjectTesting(engine.clone())));
    #[cfg(not(feature = "testing"))]
    let testing = None;
    Opened {
        engine: Arc::new(engine),
        testing,
    }
}

#[cfg(feature = "testing")]
mod hooks {
    use async_trait::async_trait;
    use store_types::registry::{Opened, Testing};
    use store_types::{Key, LargeEngine, Result, Sharing};

    use crate::ObjectEngine;

    /// The test hooks: corruption in place, stage-object count, and (for
    /// process-local stores: `object+memory://`) reopen over the same
    /// store.
    pub(super) struct ObjectTesting(pub(super) ObjectEngine);

    #[async_trait]
    impl Testing for ObjectTesting {
        async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
            self.0.corrupt_one_byte(key).await
        }

        async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
            self.0.corrupt_byte_at(key, offset).await
        }

        async fn stage_files(&self) -> Result<usize> {
            self.0.stage_object_count().await
        }

        async fn reopen_large(&self) -> Option<Result<Opened<dyn LargeEngine>>> {
            let i = &self.0.inner;
            if i.sharing != Sharing::ProcessLocal {
                return None;
            }
            let engine = ObjectEngine::open(
                i.store.clone(),
                i.options.clone(),
                i.instance.clone(),
                i.sharing,
                i.durable,
                i.ordered,
            )
            .await;
            Some(engine.map(super::opened))
        }
    }
}
