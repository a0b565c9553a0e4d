//! Building a store from a URL.

use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use store_types::{Error, Instance, Result, Sharing};

/// A store built from a URL, with what the URL says about it.
#[derive(Clone, Debug)]
pub struct Backend {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The prefix inside the store the URL names.
    pub prefix: Path,
    /// The URL without credentials or query: `s3://bucket/prefix`.
    pub label: String,
    /// Where the data lives.
    pub instance: Instance,
    /// How it is shared between nodes.
    pub sharing: Sharing,
    /// Whether writes survive a crash.
    pub durable: bool,
    /// Whether listings come back in lexicographic order.
    pub ordered_listing: bool,
}

/// Builds a store from `url`:
///
/// - `memory://` — a fresh [`InMemory`] store (process-local, not
///   durable);
/// - `file:///absolute/dir` — a [`LocalFileSystem`] rooted at the
///   directory (created if missing), fsyncing its writes; shared between
///   nodes only if declared (`ObjectOptions::sharing`);
/// - `s3://bucket/prefix` (feature `s3`) — an `AmazonS3` store configured
///   from the `AWS_*` environment variables (`AmazonS3Builder::from_env`:
///   `AWS_ENDPOINT_URL`/`AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `AWS_REGION`,
///   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
///   `AWS_COPY_IF_NOT_EXISTS`, ...), then from `config` (object_store
///   configuration keys such as `aws_endpoint`, `aws_allow_http`).
///   Unless configured otherwise, copy-if-not-exists uses S3's native
///   multipart form (`AWS_COPY_IF_NOT_EXISTS=multipart`: an
///   `UploadPartCopy` completed with `If-None-Match: *`), and conditional
///   puts send `If-None-Match: *`.
///
/// `config` must be empty for `memory://` and `file://`.
pub fn backend_from_url<I, K, V>(url: &str, config: I) -> Result<Backend>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: Into<String>,
{
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Error::Config(format!("object store URL {url:?} has no scheme")))?;
    let config: Vec<(String, String)> = config
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_string(), v.into()))
        .collect();
    let no_config = |what: &str| {
        if config.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "object store configuration keys do not apply to {what} URLs"
            )))
        }
    };
    match scheme {
        "memory" => {
            no_config("memory://")?;
            Ok(Backend {
                store: Arc::new(InMemory::new()),
                prefix: parse_prefix(rest.trim_start_matches('/'))?,
                label: format!("memory://{rest}"),
                instance: Instance::Process,
                sharing: Sharing::ProcessLocal,
                durable: false,
                ordered_listing: true,
            })
        }
        "file" => {
            no_config("file://")?;
            if !rest.starts_with('/') {
                return Err(Error::Config(format!(
                    "file URL {url:?} must name an absolute directory: file:///path/to/dir"
                )));
            }
            let dir = std::path::Path::new(rest);
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::from_io("create directory", e).with_path(dir))?;
            let dir = dir
                .canonicalize()
                .map_err(|e| Error::from_io("resolve directory", e).with_path(dir))?;
            let store = LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| Error::Config(format!("file URL {url:?}: {e}")))?
                .with_fsync(true);
            Ok(Backend {
                store: Arc::new(store),
                prefix: Path::default(),
                label: format!("file://{}", dir.display()),
                instance: Instance::Path(dir),
                sharing: Sharing::DeclaredMedia {
                    shared_media: false,
                },
                durable: true,
                ordered_listing: false,
            })
        }
        "s3" => s3(url, rest, config),
        _ => parsed(url, config),
    }
}

/// Any other scheme object_store knows (`gs://`, `az://`, `abfs://`,
/// `http(s)://`, …) through [`object_store::parse_url_opts`], with
/// `config` as its options (e.g. `google_service_account`). The backend
/// must be compiled in (features `gcs`, `azure`, `http`).
fn parsed(url: &str, config: Vec<(String, String)>) -> Result<Backend> {
    let shown = store_types::registry::redact_url(url);
    let parsed = ::url::Url::parse(url)
        .map_err(|e| Error::Config(format!("object store URL {shown:?}: {e}")))?;
    let ordered_listing = !matches!(parsed.scheme(), "http" | "https");
    let (store, prefix) = object_store::parse_url_opts(&parsed, config).map_err(|e| {
        Error::Config(format!(
            "object store URL {shown:?}: {e} (memory://, file://, s3://, and gs://, az://, \
             http(s):// when built with store-object's gcs, azure, http features)"
        ))
    })?;
    let mut label = parsed.clone();
    let _ = label.set_password(None);
    let _ = label.set_username("");
    label.set_query(None);
    label.set_fragment(None);
    let label = label.to_string().trim_end_matches('/').to_string();
    Ok(Backend {
        store: Arc::from(store),
        prefix,
        instance: Instance::Other(label.clone()),
        label,
        sharing: Sharing::SharedService,
        durable: true,
        ordered_listing,
    })
}

fn parse_prefix(p: &str) -> Result<Path> {
    Path::parse(p.trim_matches('/'))
        .map_err(|e| Error::Config(format!("invalid object store prefix {p:?}: {e}")))
}

#[cfg(feature = "s3")]
fn s3(url: &str, rest: &str, config: Vec<(String, String)>) -> Result<Backend> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3CopyIfNotExists};

    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::Config(format!("S3 URL {url:?} names no bucket")));
    }
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    for (k, v) in config {
        let key: AmazonS3ConfigKey = k
            .to_ascii_lowercase()
            .parse()
            .map_err(|e| Error::Config(format!("S3 configuration key {k:?}: {e}")))?;
        b = b.with_config(key, v);
    }
    if b.get_config_value(&AmazonS3ConfigKey::CopyIfNotExists)
        .is_none()
    {
        b = b.with_copy_if_not_exists(S3CopyIfNotExists::Multipart);
    }
    let store = b
        .build()
        .map_err(|e| Error::Config(format!("S3 URL {url:?}: {e}")))?;
    let prefix = parse_prefix(prefix)?;
    let label = if prefix.is_root() {
        format!("s3://{bucket}")
    } else {
        format!("s3://{bucket}/{prefix}")
    };
    Ok(Backend {
        store: Arc::new(store),
        prefix,
        instance: Instance::Other(label.clone()),
        label,
        sharing: Sharing::SharedService,
        durable: true,
        ordered_listing: true,
    })
}

#[cfg(not(feature = "s3"))]
fn s3(url: &str, _rest: &str, _config: Vec<(String, String)>) -> Result<Backend> {
    Err(Error::Config(format!(
        "{url:?}: this build of store-object has no S3 support (enable its `s3` feature)"
    )))
}
