//! The `[gc]` section: per-namespace policies, fleet liveness tables and
//! scheduled sweeps (ADR-024, docs/SERVER.md "Garbage collection").
//!
//! ```toml
//! [gc]
//! interval = "10m"                    # scheduled sweeps (±10% jitter); default 15m; "off": on demand only
//! unreferenced_namespaces = ["tmp"]   # shorthand for policy = "unreferenced"
//! [gc.namespaces.logs]
//! max_age = "7d"                      # unreferenced entries older than this are garbage
//! [gc.namespaces.archive]
//! policy = "keep"                     # refs | unreferenced | keep | cache
//! [gc.namespaces.ccache]              # a build cache (ADR-048): puts take no pin token,
//! policy = "cache"                    #   clients use /cache/ccache/KEY (docs/SERVER.md)
//! max_bytes = "50GiB"                 # least recently used keys go first beyond this
//! max_age = "30d"                     # keys not read or written for this long go
//! # http_path = "/ccache"             # also serve the cache under this base path
//! # immutable = true                  # write-once keys: replaced only by `delete` (ADR-052)
//! [[gc.liveness_tables]]              # fleet: an application table naming live digests
//! namespace = "app"
//! schema = "app"
//! table = "attachments"
//! digest_column = "digest"
//! namespace_column = "ns"             # optional
//! ```
//!
//! A namespace with no policy is `keep` until a reference is first set in
//! it, `refs` from then on.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use store_core::{CacheBounds, GcPolicy, LivenessTable, Namespace, Store};
use store_types::Error;

use crate::error::{ConfigError, Invalid};

/// Default `gc.interval`: a sweep every 15 minutes. Safe by default: only
/// namespaces with a policy, or that use references, are swept
/// (ADR-024), and garbage waits out the delete window first.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// `[gc.namespaces.NAME]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NamespacePolicyEntry {
    policy: Option<String>,
    max_age: Option<String>,
    max_bytes: Option<SizeField>,
    http_path: Option<String>,
    immutable: Option<bool>,
}

/// A size in the file: bytes, or a `bytesize` string (`"50GiB"`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
enum SizeField {
    Bytes(u64),
    Text(String),
}

impl SizeField {
    fn bytes(&self) -> Result<u64, Invalid> {
        match self {
            SizeField::Bytes(n) => Ok(*n),
            SizeField::Text(s) => crate::config::parse_size(s),
        }
    }
}

/// `[[gc.liveness_tables]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LivenessTableEntry {
    namespace: String,
    schema: String,
    table: String,
    digest_column: String,
    namespace_column: Option<String>,
}

/// `[gc]` as read from the file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GcSection {
    pub(crate) unreferenced_namespaces: Option<Vec<String>>,
    interval: Option<String>,
    #[serde(default)]
    namespaces: BTreeMap<String, NamespacePolicyEntry>,
    #[serde(default)]
    liveness_tables: Vec<LivenessTableEntry>,
}

/// The resolved GC settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcSettings {
    /// Explicit policies, in namespace order.
    pub policies: Vec<(Namespace, GcPolicy)>,
    /// Fleet liveness tables.
    pub tables: Vec<(Namespace, LivenessTable)>,
    /// Scheduled sweep interval.
    pub interval: Option<Duration>,
    /// Cache namespaces' own base paths (`http_path`), path → namespace.
    pub cache_paths: Vec<(String, Namespace)>,
    /// Write-once cache namespaces (`immutable = true`, ADR-052).
    pub immutable: Vec<Namespace>,
}

fn parse_policy(ns: &str, e: &NamespacePolicyEntry) -> Result<GcPolicy, ConfigError> {
    let age = e
        .max_age
        .as_deref()
        .map(|a| {
            crate::security::parse_duration(a).map_err(|m| {
                ConfigError::setting(
                    format!("gc.namespaces.{ns}.max_age"),
                    format!("gc.namespaces.{ns}.max_age: {m}"),
                )
            })
        })
        .transpose()?;
    if e.policy.as_deref().map(str::trim) == Some("cache") {
        if age.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::setting(
                format!("gc.namespaces.{ns}.max_age"),
                format!("gc.namespaces.{ns}.max_age must be greater than zero"),
            ));
        }
        let max_bytes = e
            .max_bytes
            .as_ref()
            .map(|v| {
                v.bytes().map_err(|m| {
                    ConfigError::setting(
                        format!("gc.namespaces.{ns}.max_bytes"),
                        format!("gc.namespaces.{ns}.max_bytes: {m}"),
                    )
                })
            })
            .transpose()?;
        return Ok(GcPolicy::Cache(CacheBounds {
            max_bytes,
            max_age: age,
        }));
    }
    if e.max_bytes.is_some() {
        return Err(ConfigError::setting(format!("gc.namespaces.{ns}.max_bytes"), format!(
            "gc.namespaces.{ns}: max_bytes goes with policy = \"cache\" (a size-bounded build cache)"
        )));
    }
    match (e.policy.as_deref().map(str::trim), age) {
        (None | Some("max_age"), Some(d)) if !d.is_zero() => Ok(GcPolicy::MaxAge(d)),
        (_, Some(_)) if e.policy.as_deref().is_some_and(|p| p != "max_age") => Err(ConfigError::setting(format!("gc.namespaces.{ns}.max_age"), format!(
            "gc.namespaces.{ns}: max_age goes with no policy (or policy = \"max_age\"), not with policy = {:?}",
            e.policy.as_deref().unwrap_or_default()
        ))),
        (_, Some(_)) => Err(ConfigError::setting(format!("gc.namespaces.{ns}.max_age"), format!("gc.namespaces.{ns}.max_age must be greater than zero"))),
        (Some("refs"), None) => Ok(GcPolicy::Refs),
        (Some("unreferenced"), None) => Ok(GcPolicy::Unreferenced),
        (Some("keep"), None) => Ok(GcPolicy::Keep),
        (Some("max_age"), None) => Err(ConfigError::setting(format!("gc.namespaces.{ns}.max_age"), format!("gc.namespaces.{ns}: policy = \"max_age\" needs max_age = \"…\""))),
        (Some(other), None) => Err(ConfigError::setting(format!("gc.namespaces.{ns}.policy"), format!(
            "gc.namespaces.{ns}.policy = {other:?}: expected refs, unreferenced, keep, cache (or max_age = \"7d\")"
        ))),
        (None, None) => Err(ConfigError::setting(format!("gc.namespaces.{ns}.policy"), format!("gc.namespaces.{ns}: set policy or max_age"))),
    }
}

/// Resolves `[gc]` (`unreferenced` comes from the file or the environment,
/// already split).
pub fn resolve(
    section: Option<GcSection>,
    unreferenced: Vec<String>,
    interval_env: Option<String>,
    fleet: bool,
) -> Result<GcSettings, ConfigError> {
    let section = section.unwrap_or_default();
    let mut policies: BTreeMap<Namespace, GcPolicy> = BTreeMap::new();
    for n in unreferenced {
        let ns = Namespace::new(n.clone()).map_err(|e| {
            ConfigError::setting(
                "gc.unreferenced_namespaces",
                format!("gc.unreferenced_namespaces: {n:?}: {e}"),
            )
        })?;
        policies.insert(ns, GcPolicy::Unreferenced);
    }
    let mut cache_paths = Vec::new();
    let mut immutable = Vec::new();
    for (n, e) in &section.namespaces {
        let ns = Namespace::new(n.clone()).map_err(|e| {
            ConfigError::setting(
                format!("gc.namespaces.{n}"),
                format!("gc.namespaces.{n}: {e}"),
            )
        })?;
        let p = parse_policy(n, e)?;
        if let Some(path) = &e.http_path {
            check_http_path(n, &ns, path, p, &mut cache_paths)?;
        }
        if e.immutable == Some(true) {
            if !matches!(p, GcPolicy::Cache(_)) {
                return Err(ConfigError::setting(
                    format!("gc.namespaces.{n}.immutable"),
                    format!(
                        "gc.namespaces.{n}.immutable goes with policy = \"cache\" (write-once \
                         cache keys)"
                    ),
                ));
            }
            immutable.push(ns.clone());
        }
        if let Some(prev) = policies.insert(ns, p) {
            if prev != p {
                return Err(ConfigError::setting(format!("gc.namespaces.{n}"), format!(
                    "namespace {n}: listed in gc.unreferenced_namespaces and given policy {p} in gc.namespaces"
                )));
            }
        }
        if fleet && matches!(p, GcPolicy::MaxAge(_)) {
            return Err(ConfigError::setting(
                format!("gc.namespaces.{n}.max_age"),
                format!(
                    "gc.namespaces.{n}: max_age is not available in a fleet (the age check is an \
                 in-process probe other nodes could not consult)"
                ),
            ));
        }
    }
    let tables = liveness_tables(&section.liveness_tables, fleet)?;
    let interval = interval(interval_env.or(section.interval))?;
    Ok(GcSettings {
        policies: policies.into_iter().collect(),
        tables,
        interval,
        cache_paths,
        immutable,
    })
}

/// A cache namespace's `http_path`: only with policy `cache`, a valid
/// route, neither another namespace's path nor under it nor above it (a
/// request there would be attributed to one of the two); recorded into
/// `cache_paths`.
fn check_http_path(
    n: &str,
    ns: &Namespace,
    path: &str,
    p: GcPolicy,
    cache_paths: &mut Vec<(String, Namespace)>,
) -> Result<(), ConfigError> {
    if !matches!(p, GcPolicy::Cache(_)) {
        return Err(ConfigError::setting(
            format!("gc.namespaces.{n}.http_path"),
            format!(
                "gc.namespaces.{n}.http_path goes with policy = \"cache\" (the build-cache routes)"
            ),
        ));
    }
    store_ops::cache::check_cache_path(path).map_err(|e| {
        ConfigError::setting(
            format!("gc.namespaces.{n}.http_path"),
            format!(
                "gc.namespaces.{n}.{}",
                e.to_string().trim_start_matches("configuration error: ")
            ),
        )
    })?;
    let base = path.trim_end_matches('/');
    if let Some((other_path, other)) = cache_paths
        .iter()
        .find(|(p, _): &&(String, Namespace)| overlaps(p, base))
    {
        let how = if other_path == base {
            "is the same path as"
        } else if base.len() > other_path.len() {
            "is under"
        } else {
            "contains"
        };
        return Err(ConfigError::setting(
            format!("gc.namespaces.{n}.http_path"),
            format!(
                "gc.namespaces.{n}.http_path {path:?} {how} gc.namespaces.{other}.http_path \
                 {other_path:?}: requests there would be served from one cache while the other's \
                 clients address them; give namespaces {other} and {n} paths neither of which is \
                 under the other"
            ),
        ));
    }
    cache_paths.push((base.to_string(), ns.clone()));
    Ok(())
}

/// Whether two base paths (without a trailing `/`) are the same or one is
/// under the other, segment by segment (`/bazel` and `/bazel/x` overlap,
/// `/bazel` and `/bazelisk` do not).
fn overlaps(a: &str, b: &str) -> bool {
    let under = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    under(a, b) || under(b, a)
}

/// `[[gc.liveness_tables]]` (fleet only), their names plain SQL
/// identifiers.
fn liveness_tables(
    entries: &[LivenessTableEntry],
    fleet: bool,
) -> Result<Vec<(Namespace, LivenessTable)>, ConfigError> {
    let mut tables = Vec::new();
    for t in entries {
        if !fleet {
            return Err(ConfigError::setting(
                "gc.liveness_tables",
                "gc.liveness_tables are the fleet form of liveness (fleet = true); a single \
                 server uses references or the library's in-process sources",
            ));
        }
        let ns = Namespace::new(t.namespace.clone()).map_err(|e| {
            ConfigError::setting(
                "gc.liveness_tables",
                format!("gc.liveness_tables: namespace {:?}: {e}", t.namespace),
            )
        })?;
        for (what, v) in [
            ("schema", &t.schema),
            ("table", &t.table),
            ("digest_column", &t.digest_column),
        ] {
            if !is_identifier(v) {
                return Err(ConfigError::setting(
                    "gc.liveness_tables",
                    format!(
                        "gc.liveness_tables ({}): {what} {v:?} is not a plain SQL identifier",
                        t.namespace
                    ),
                ));
            }
        }
        let mut table = LivenessTable::new(&t.schema, &t.table, &t.digest_column);
        if let Some(c) = &t.namespace_column {
            if !is_identifier(c) {
                return Err(ConfigError::setting(
                    "gc.liveness_tables",
                    format!(
                    "gc.liveness_tables ({}): namespace_column {c:?} is not a plain SQL identifier",
                    t.namespace
                ),
                ));
            }
            table = table.with_namespace_column(c);
        }
        tables.push((ns, table));
    }
    Ok(tables)
}

/// `gc.interval` (or its variable): a duration of at least 1s, `off`, or
/// unset for the default.
fn interval(value: Option<String>) -> Result<Option<Duration>, ConfigError> {
    Ok(match value {
        None => Some(DEFAULT_INTERVAL),
        Some(s) if matches!(s.trim(), "off" | "none" | "never") => None,
        Some(s) => {
            let d = crate::security::parse_duration(&s)
                .map_err(|e| ConfigError::setting("gc.interval", format!("gc.interval: {e}")))?;
            if d < Duration::from_secs(1) {
                return Err(ConfigError::setting(
                    "gc.interval",
                    "gc.interval must be at least 1s",
                ));
            }
            Some(d)
        }
    })
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl GcSettings {
    /// Applies the policies, adopts the namespaces that use references,
    /// and registers the liveness tables. Returns one human line per
    /// namespace with a policy.
    ///
    /// In a fleet the policies are rows of the node in the shared database
    /// (ADR-045): only `node` (the server itself) writes them and removes
    /// its rows for namespaces no longer configured; a one-off CLI command
    /// (`node = false`) reads the fleet's policies and writes none.
    pub async fn apply(&self, store: &Store, node: bool) -> Result<Vec<String>, Error> {
        let policies: &[(Namespace, GcPolicy)] = if store.gc().is_fleet() && !node {
            &[]
        } else {
            &self.policies
        };
        for (ns, p) in policies {
            store
                .set_gc_policy(ns.clone(), *p)
                .await
                .map_err(|e| in_ns(ns, e))?;
        }
        for (ns, t) in &self.tables {
            store
                .gc()
                .register_liveness_source(ns.clone(), t.clone())
                .await
                .map_err(|e| match e {
                    Error::Config(m) => Error::Config(format!(
                        "gc.liveness_tables ({ns}: {}.{}): {m}",
                        t.schema, t.table
                    )),
                    other => other,
                })?;
        }
        // Fleet: this node's rows for namespaces its configuration no
        // longer names go (ADR-045); other nodes' rows are theirs.
        if node {
            let configured: Vec<Namespace> = self.policies.iter().map(|(n, _)| n.clone()).collect();
            for ns in store.retain_gc_policies(&configured).await? {
                tracing::info!(target: "blobpool::gc", "namespace {ns}: this node's policy row removed (no longer configured)");
            }
        }
        store.adopt_ref_namespaces().await?;
        let mut lines = Vec::new();
        let mut seen: Vec<Namespace> = self.policies.iter().map(|(n, _)| n.clone()).collect();
        for ns in store.namespaces().await? {
            if !seen.contains(&ns) {
                seen.push(ns);
            }
        }
        seen.sort();
        for ns in seen {
            let p = store.effective_gc_policy(&ns).await?;
            let extra = if self.tables.iter().any(|(n, _)| *n == ns) {
                " + liveness table"
            } else {
                ""
            };
            lines.push(format!("{ns}: {p}{extra}"));
        }
        Ok(lines)
    }
}

fn in_ns(ns: &Namespace, e: Error) -> Error {
    match e {
        Error::Config(m) if !m.contains(ns.as_str()) => {
            Error::Config(format!("namespace {ns}: {m}"))
        }
        other => other,
    }
}

/// Runs sweeps every `interval` (±10% jitter) until the returned handle
/// is aborted ([`store_ops::Ops::spawn_sweep_scheduler`]).
pub fn spawn_scheduler(ops: store_ops::Ops, interval: Duration) -> tokio::task::JoinHandle<()> {
    ops.spawn_sweep_scheduler(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> Option<GcSection> {
        #[derive(Deserialize)]
        struct F {
            gc: Option<GcSection>,
        }
        toml::from_str::<F>(text).unwrap().gc
    }

    #[test]
    fn policies_parse() {
        let s = resolve(
            section(
                "[gc]\ninterval = \"10m\"\nunreferenced_namespaces = [\"tmp\"]\n\
                 [gc.namespaces.logs]\nmax_age = \"7d\"\n[gc.namespaces.archive]\npolicy = \"keep\"\n\
                 [gc.namespaces.docs]\npolicy = \"refs\"",
            ),
            vec!["scratch".into()],
            None,
            false,
        )
        .unwrap();
        let p: Vec<(String, GcPolicy)> = s
            .policies
            .iter()
            .map(|(n, p)| (n.to_string(), *p))
            .collect();
        assert_eq!(
            p,
            [
                ("archive".to_string(), GcPolicy::Keep),
                ("docs".to_string(), GcPolicy::Refs),
                (
                    "logs".to_string(),
                    GcPolicy::MaxAge(Duration::from_secs(7 * 86400))
                ),
                ("scratch".to_string(), GcPolicy::Unreferenced),
            ]
        );
        assert_eq!(s.interval, Some(Duration::from_secs(600)));
        let d = resolve(None, vec![], None, false).unwrap();
        assert_eq!(d.interval, Some(DEFAULT_INTERVAL));
        let off = resolve(section("[gc]\ninterval = \"off\""), vec![], None, false).unwrap();
        assert_eq!(off.interval, None);
        let env_off = resolve(None, vec![], Some("off".into()), false).unwrap();
        assert_eq!(env_off.interval, None);
    }

    #[test]
    fn bad_gc_sections_are_refused() {
        for (text, fleet, want) in [
            ("[gc.namespaces.a]\npolicy = \"sometimes\"", false, "expected refs"),
            ("[gc.namespaces.a]\npolicy = \"keep\"\nmax_age = \"1d\"", false, "max_age goes with"),
            ("[gc.namespaces.a]\nmax_age = \"soon\"", false, "max_age"),
            ("[gc.namespaces.a]\nmax_age = \"1d\"", true, "not available in a fleet"),
            ("[gc.namespaces.A]\npolicy = \"keep\"", false, "gc.namespaces.A"),
            ("[gc]\ninterval = \"0s\"", false, "at least 1s"),
            (
                "[[gc.liveness_tables]]\nnamespace = \"a\"\nschema = \"s\"\ntable = \"t\"\ndigest_column = \"d\"",
                false,
                "fleet form",
            ),
            (
                "[[gc.liveness_tables]]\nnamespace = \"a\"\nschema = \"s; drop\"\ntable = \"t\"\ndigest_column = \"d\"",
                true,
                "identifier",
            ),
        ] {
            let e = resolve(section(text), vec![], None, fleet).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let e = resolve(
            section("[gc.namespaces.tmp]\npolicy = \"keep\""),
            vec!["tmp".into()],
            None,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unreferenced_namespaces"), "{e}");
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    /// The example configuration shipped in deploy/ loads; without keys
    /// its non-loopback listen is refused, with one it is served.
    #[test]
    fn the_deploy_example_config_loads() {
        let text = include_str!("../../../deploy/blobpool.toml");
        let c = crate::config::Config::from_toml(text).unwrap();
        let caches = c.ops_config().cache_namespaces;
        assert_eq!(
            caches.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["ccache", "sccache"]
        );
        let e = c
            .sections
            .http_config(&c.listen, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("insecure_no_auth") || e.contains("key"), "{e}");
        let with_key = text.replace(
            "# [[auth.keys]]\n# name = \"ci\"\n# hash = \"blake3:…\"\n# scopes = [\"read\", \"write\"]",
            &format!(
                "[[auth.keys]]\nname = \"ci\"\nhash = \"{}\"\nscopes = [\"read\", \"write\"]",
                store_ops::auth::hash_key("bpk_example")
            ),
        );
        assert_ne!(with_key, text, "the example's commented key block changed");
        let c = crate::config::Config::from_toml(&with_key).unwrap();
        c.sections.http_config(&c.listen, false).unwrap();
    }

    #[test]
    fn cache_policies_parse_with_their_bounds() {
        let section: GcSection = toml::from_str(
            "[namespaces.cc]\npolicy = \"cache\"\nmax_bytes = \"50GiB\"\nmax_age = \"30d\"\n\
             [namespaces.open]\npolicy = \"cache\"\n\
             [namespaces.n]\npolicy = \"cache\"\nmax_bytes = 1000\n",
        )
        .unwrap();
        let s = resolve(Some(section), vec![], None, true).unwrap();
        let get = |n: &str| {
            s.policies
                .iter()
                .find(|(ns, _)| ns.as_str() == n)
                .map(|(_, p)| *p)
                .unwrap()
        };
        assert_eq!(
            get("cc"),
            GcPolicy::Cache(CacheBounds {
                max_bytes: Some(50 << 30),
                max_age: Some(Duration::from_secs(30 * 86400)),
            })
        );
        assert_eq!(get("open"), GcPolicy::Cache(CacheBounds::default()));
        assert_eq!(get("n").to_string(), "cache max_bytes 1000");
        let paths: GcSection =
            toml::from_str("[namespaces.bz]\npolicy = \"cache\"\nhttp_path = \"/bazel/\"\n")
                .unwrap();
        let s = resolve(Some(paths), vec![], None, false).unwrap();
        assert_eq!(s.cache_paths.len(), 1);
        assert_eq!(s.cache_paths[0].0, "/bazel");
        for (text, want) in [
            (
                "[namespaces.a]\npolicy = \"refs\"\nhttp_path = \"/a\"",
                "goes with policy",
            ),
            (
                "[namespaces.a]\npolicy = \"cache\"\nhttp_path = \"/v1/a\"",
                "server's own routes",
            ),
            (
                "[namespaces.a]\npolicy = \"cache\"\nhttp_path = \"a\"",
                "must start with /",
            ),
        ] {
            let section: GcSection = toml::from_str(text).unwrap();
            let e = resolve(Some(section), vec![], None, false)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        for (text, want) in [
            (
                "[namespaces.a]\npolicy = \"refs\"\nmax_bytes = \"1GiB\"",
                "max_bytes goes with",
            ),
            (
                "[namespaces.a]\npolicy = \"cache\"\nmax_bytes = \"lots\"",
                "max_bytes",
            ),
            (
                "[namespaces.a]\npolicy = \"cache\"\nmax_age = \"0s\"",
                "greater than zero",
            ),
        ] {
            let section: GcSection = toml::from_str(text).unwrap();
            let e = resolve(Some(section), vec![], None, false)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// Issue 39 item 3: two caches whose `http_path`s are the same or one
    /// under the other would share requests (`/bazel/x/k` is key `x/k` of
    /// the first and key `k` of the second): refused, naming both.
    #[test]
    fn immutable_marks_write_once_cache_namespaces_only() {
        let section: GcSection = toml::from_str(
            "[namespaces.ac]\npolicy = \"cache\"\nimmutable = true\n\
             [namespaces.cas]\npolicy = \"cache\"\nimmutable = false\n",
        )
        .unwrap();
        let s = resolve(Some(section), vec![], None, false).unwrap();
        assert_eq!(s.immutable, vec![Namespace::new("ac").unwrap()]);
        let section: GcSection =
            toml::from_str("[namespaces.docs]\npolicy = \"refs\"\nimmutable = true\n").unwrap();
        let e = resolve(Some(section), vec![], None, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gc.namespaces.docs.immutable goes with policy = \"cache\""),
            "{e}"
        );
    }

    #[test]
    fn overlapping_http_paths_are_refused_naming_both_namespaces() {
        let cache = |n: &str, path: &str| {
            format!("[namespaces.{n}]\npolicy = \"cache\"\nhttp_path = \"{path}\"\n")
        };
        for (a, b, how) in [
            ("/bazel", "/bazel/x", "is under"),
            ("/bazel/x", "/bazel", "contains"),
            ("/bazel", "/bazel", "is the same path as"),
            ("/bazel/", "/bazel", "is the same path as"),
            ("/a/b/c", "/a", "contains"),
        ] {
            let text = cache("one", a) + &cache("two", b);
            let section: GcSection = toml::from_str(&text).unwrap();
            let e = resolve(Some(section), vec![], None, false).unwrap_err();
            assert_eq!(e.key(), Some("gc.namespaces.two.http_path"), "{a} {b}: {e}");
            let m = e.to_string();
            assert!(
                m.contains(&format!(
                    "gc.namespaces.two.http_path {b:?} {how} gc.namespaces.one.http_path"
                )) && m.contains("namespaces one and two"),
                "{a} {b}: {m}"
            );
        }
        // Sharing a prefix of characters is not sharing a path.
        for (a, b) in [("/bazel", "/bazelisk"), ("/a/b", "/a/c"), ("/x", "/y/x")] {
            let section: GcSection = toml::from_str(&(cache("one", a) + &cache("two", b))).unwrap();
            let s = resolve(Some(section), vec![], None, false).unwrap();
            assert_eq!(s.cache_paths.len(), 2, "{a} {b}");
        }
    }
}
